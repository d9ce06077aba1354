"""Detectors: the shared scikit-learn-style contract, and each fault on hand-made telemetry."""

from __future__ import annotations

import re

import numpy as np
import pytest
from gpufleet.analyzer.config import Config
from gpufleet.analyzer.detectors import REGISTRY, build
from gpufleet.analyzer.pipeline import Analyzer

from gpufleet.lineprotocol import encode
from tests.fleets import STEP, T0, analyse, fleet


def analyse_windows(data: bytes):
    """Analyse ``data`` and return the analyzer with every window it built, in order."""
    from gpufleet.analyzer import pipeline

    made, window = [], pipeline.Window

    def record(*a, **kw):
        made.append(window(*a, **kw))
        return made[-1]

    pipeline.Window = record
    try:
        an = analyse(data)
    finally:
        pipeline.Window = window
    return an, made


@pytest.fixture(scope="module")
def healthy_windows():
    return analyse_windows(fleet())


@pytest.fixture(scope="module")
def healthy(healthy_windows):
    return healthy_windows[0]


@pytest.mark.slow
def test_healthy_fleet_has_no_incidents(healthy):
    assert healthy.incidents() == []
    assert healthy.parser.stats.bad_lines == 0


FAULTS = [
    ("thermal_throttle", 1, 2, 100),
    ("cooling_degradation", 2, 1, 250),
    ("power_brake", 0, 3, 100),
    ("nvlink_degradation", 3, 0, 100),
    ("pcie_degradation", 1, 0, 100),
    ("memory_errors", 2, 3, 100),
    ("sdc", 0, 1, 95),  # a canary runs at that step
    ("gpu_lost", 3, 2, 100),
    ("straggler", 1, 1, 100),
]


TABLE = {"gpu": "gpu", "gpu_nvlink": "nvlink", "gpu_event": "event", "gpu_canary": "canary"}


def replay(cls, params, windows) -> list[np.ndarray]:
    """One detector through the windows as the pipeline drives it (fit, then score): its scores."""
    det, out = cls(**params), []
    for w in windows:
        rows = len(getattr(w, TABLE[cls.tables[0]]))
        assert det.fit(w) is det
        s = det.score(w)
        # one float per row of the detector's first table, finite or NaN
        assert isinstance(s, np.ndarray) and s.dtype.kind == "f" and s.shape == (rows,)
        assert not np.isinf(s).any()
        if rows:
            out.append(s)
    return out


@pytest.mark.parametrize("kind", sorted(REGISTRY))
@pytest.mark.slow
def test_contract(kind, healthy_windows):
    cls = REGISTRY[kind]
    params = Config().detectors[kind]
    det = cls(**params)
    # __init__ only stores parameters
    assert {k: getattr(det, k) for k in params} == params
    assert not [a for a in vars(det) if a.endswith("_")]
    # the class declares its parameters; an unknown one is refused
    assert set(params) == set(cls.params)
    with pytest.raises(TypeError, match="unknown parameter"):
        cls(**params, no_such_threshold=1)
    assert det.get_params().keys() >= params.keys()
    # fit returns self; score is one finite-or-NaN number per row of every window
    quiet = replay(cls, params, healthy_windows[1])
    assert quiet, f"{kind}: no window of the healthy fleet had rows for it"
    # the empty window: fit and score still answer, with no rows
    from gpufleet.analyzer.frame import Table, Window

    empty = Table.empty()
    empty.new = np.zeros(0, bool)
    an = healthy_windows[0]
    w = Window(T0, T0 + 300, an.reg, empty, empty, empty, empty, empty, empty, *an.reg.arrays(), an.last_seen)
    fresh = cls(**params)
    assert fresh.fit(w) is fresh and fresh.score(w).shape == (0,)
    # higher = more abnormal: the fleet with this detector's fault scores above every healthy row
    fault = next((f for f in FAULTS if f[0] == kind), None)
    if fault is None:
        return  # canary_unchecked: its fault takes twice max_age (12 h) to show; tests/test_sdc_detector.py
    _, windows = analyse_windows(fleet(fault=fault))
    loud = replay(cls, params, windows)
    top_quiet = max(np.nanmax(s, initial=-np.inf) for s in quiet)
    top_loud = max(np.nanmax(s, initial=-np.inf) for s in loud)
    assert top_loud > top_quiet, (kind, top_loud, top_quiet)


def test_a_window_s_features_are_never_another_detector_s():
    """What a window derived for one detector (``Window.once``) is that detector's alone: the
    window holds it, so a detector made after it is gone cannot get its id and its features (the
    contract test replays one fleet's windows through a new detector per kind: PCIe was once
    handed what a detector of another kind had cached under the same id)."""
    import gc
    import weakref

    from gpufleet.analyzer.frame import Registry, Table, Window

    empty = Table.empty()
    empty.new = np.zeros(0, bool)
    reg = Registry()
    w = Window(T0, T0 + 300, reg, empty, empty, empty, empty, empty, empty, *reg.arrays(), np.zeros(0))
    first = REGISTRY["pcie_degradation"](**Config().detectors["pcie_degradation"])
    assert w.once(first, "parts", lambda: "first's") == "first's"
    gone = weakref.ref(first)
    del first
    gc.collect()
    assert gone() is not None  # still the window's: its id is not free for another detector
    later = REGISTRY["pcie_degradation"](**Config().detectors["pcie_degradation"])
    assert w.once(later, "parts", lambda: "later's") == "later's"


@pytest.mark.parametrize("fault", FAULTS, ids=[f[0] for f in FAULTS])
@pytest.mark.slow
def test_each_fault_found_once_and_nothing_else(fault):
    kind, node, gpu, step = fault
    an = analyse(fleet(fault=fault))
    incs = an.incidents()
    # throttling while power and peers say the GPU should be cool is a cooling fault: one page, the
    # cooling incident, whose impact_at is when throttling began (the throttling is its update)
    expect = {"thermal_throttle": ["cooling_degradation"]}.get(kind, [kind])
    assert sorted(i.kind for i in incs) == expect, [i.to_json()[:200] for i in incs]
    if kind == "thermal_throttle":
        inc = incs[0]
        assert [x["kind"] for x in inc.evidence["impact"]] == ["thermal_throttle"]
        # online, a throttle page sent before the cooling incident opened resolves into it
        folded = [r for r in an.engine.absorbed if r.kind == "thermal_throttle"]
        assert len(folded) == 1 and folded[0].end is not None
        assert inc.impact_at is not None and inc.impact_at - (T0 + step * STEP) <= 2 * STEP
        assert (inc.host, inc.gpu) == (f"node{node}", gpu)
        return
    inc = next(i for i in incs if i.kind == kind)
    assert (inc.host, inc.gpu) == (f"node{node}", gpu)
    assert inc.summary and inc.id and inc.evidence.get("signals")
    assert inc.rack == f"r{node // 2}" and inc.cluster == "c1"
    onset = T0 + step * STEP
    assert onset - 60 <= inc.start <= onset + 1200
    if kind in ("sdc", "gpu_lost", "memory_errors", "thermal_throttle", "power_brake"):
        assert inc.start - onset <= 2 * STEP  # hard faults: within a poll or two of the data
    if kind == "nvlink_degradation":
        assert inc.link == 1


@pytest.mark.slow
def test_node_wide_power_brake_is_one_node_incident():
    # the node's PSU/BMC brakes all four GPUs at once: one page for the node, listing its GPUs
    incs = analyse(fleet(fault=("power_brake", 2, None, 100))).incidents()
    assert [(i.kind, i.host, i.gpu) for i in incs] == [("power_brake", "node2", None)], [
        i.summary for i in incs
    ]
    assert incs[0].evidence["first"]["braked_gpus"] == [0, 1, 2, 3]
    assert abs(incs[0].start - (T0 + 100 * STEP)) <= STEP
    # one GPU braking alone stays a GPU incident
    incs = analyse(fleet(fault=("power_brake", 2, 1, 100))).incidents()
    assert [(i.kind, i.host, i.gpu) for i in incs] == [("power_brake", "node2", 1)]


@pytest.mark.slow
def test_pcie_width_down_on_an_idle_gpu_is_found():
    # node3 GPU 0's link trains to x8 while the whole fleet idles: width does not drop at idle, so
    # it is a fault at any load; a generation drop at idle is power management, no incident
    lines = []
    for ln in fleet(steps=480).decode().splitlines():
        if ln.startswith("gpu,"):
            ln = re.sub(r"utilization_gpu_ratio=[0-9.]+", "utilization_gpu_ratio=0.0", ln)
            ln = re.sub(r"power_watts=[0-9.]+", "power_watts=80.0", ln)
            ln = ln.replace("pcie_link_gen=5i", "pcie_link_gen=1i")  # every idle link: gen 1
            s = (int(ln.rsplit(" ", 1)[1]) // 10**9 - T0) // STEP
            if ",host=node3," in ln and ",gpu=0," in ln and s >= 200:
                ln = ln.replace("pcie_link_width=16i", "pcie_link_width=8i")
        lines.append(ln)
    incs = analyse(("\n".join(lines) + "\n").encode()).incidents()
    assert [(i.kind, i.host, i.gpu) for i in incs] == [("pcie_degradation", "node3", 0)], [
        i.summary for i in incs
    ]
    assert abs(incs[0].start - (T0 + 200 * STEP)) <= 90


def test_a_replay_burst_in_a_gpu_s_first_seconds_is_no_replay_rate():
    # node1 GPU 2's link replays twice between its first two polls, then never again: over the
    # minute a rate is judged on that is 2 replays, not 0.2/s over the 10 s its data covers (a
    # healthy fleet's false page); node3 GPU 0's replay storm still pages
    lines = []
    for ln in fleet(steps=120, fault=("pcie_degradation", 3, 0, 60)).decode().splitlines():
        s = (int(ln.rsplit(" ", 1)[1]) // 10**9 - T0) // STEP
        if ln.startswith("gpu,") and ",host=node1," in ln and ",gpu=2," in ln and s >= 1:
            ln = re.sub(r"pcie_replay_total=(\d+)i", lambda m: f"pcie_replay_total={int(m[1]) + 2}i", ln)
        lines.append(ln)
    incs = analyse(("\n".join(lines) + "\n").encode()).incidents()
    assert [(i.kind, i.host, i.gpu) for i in incs] == [("pcie_degradation", "node3", 0)], [
        i.summary for i in incs
    ]


def _stale(lines, node, gpu, steps):
    out = []
    for ln in lines:
        if ln.startswith("gpu,") and f",host=node{node}," in ln and f",gpu={gpu}," in ln:
            head, _, ts = ln.rsplit(" ", 2)
            if (int(ts) // 10**9 - T0) // STEP in steps:
                ln = f"{head} up=0i,health_code=1i {ts}"
        out.append(ln)
    return out


@pytest.mark.slow
def test_gpu_stale_longer_than_the_bound_is_a_warning():
    lines = fleet(steps=480).decode().splitlines()
    lines = _stale(lines, 1, 3, range(200, 260))  # 10 min stale: a warning, dated to its start
    lines = _stale(lines, 2, 0, range(300, 312))  # 2 min stale, then back: nothing
    incs = analyse(("\n".join(lines) + "\n").encode()).incidents()
    assert [(i.kind, i.host, i.gpu, i.severity) for i in incs] == [("gpu_lost", "node1", 3, "warning")], [
        i.summary for i in incs
    ]
    assert abs(incs[0].start - (T0 + 200 * STEP)) <= STEP


@pytest.mark.slow
def test_healthy_link_background_errors_stay_quiet():
    # a healthy link's background: 5 CRC flit errors within 2 min and, later, one replay (the link
    # correcting an error) -- far below DCGM's 100/s and below a degrading link's sustained rate
    crc_at = {200: 1, 202: 2, 205: 3, 208: 4, 210: 5}
    lines, n = [], 0
    for ln in fleet(steps=480).decode().splitlines():
        if ln.startswith("gpu_nvlink,") and ",host=node1," in ln and ",gpu=2," in ln and ",link=0," in ln:
            s = (int(ln.rsplit(" ", 1)[1]) // 10**9 - T0) // STEP
            n = max([v for k, v in crc_at.items() if k <= s], default=0)
            ln = ln.replace("crc_flit_errors_total=0i", f"crc_flit_errors_total={n}i")
            ln = ln.replace("replay_errors_total=0i", f"replay_errors_total={int(s >= 300)}i")
        lines.append(ln)
    assert n == 5
    incs = analyse(("\n".join(lines) + "\n").encode()).incidents()
    assert incs == [], [i.summary for i in incs]


@pytest.mark.slow
def test_node_losing_all_its_gpus_is_one_node_incident():
    # every GPU of node2 falls off the bus at once (NVML lost, then silence): the node's PCIe switch
    # or power, one critical page for the node listing its GPUs
    incs = analyse(fleet(fault=("gpu_lost", 2, None, 100))).incidents()
    assert [(i.kind, i.host, i.gpu, i.severity) for i in incs] == [("gpu_lost", "node2", None, "critical")], [
        i.summary for i in incs
    ]
    assert incs[0].evidence["first"]["gpus"] == [0, 1, 2, 3]


def test_power_cap_and_idle_are_not_throttling(healthy):
    # the healthy fleet sits at 690 W with reason 0x4 half the time and idles with 0x1: no incident
    assert not [i for i in healthy.incidents() if i.kind in ("thermal_throttle", "power_brake")]


@pytest.mark.slow
def test_node_scope_cooling_is_one_incident():
    base = fleet(steps=480)
    lines = base.decode().splitlines()
    out = []
    for ln in lines:
        if ln.startswith("gpu,") and ",host=node2," in ln:
            ts = int(ln.rsplit(" ", 1)[1]) // 10**9
            s = (ts - T0) // STEP
            if s >= 250:
                m = re.search(r"temperature_gpu_celsius=(\d+)i", ln)
                new = int(m.group(1)) + min(12, int((s - 250) * 0.1))
                ln = ln[: m.start()] + f"temperature_gpu_celsius={new}i" + ln[m.end() :]
        out.append(ln)
    an = analyse(("\n".join(out) + "\n").encode())
    incs = an.incidents()
    assert len(incs) == 1, [i.to_json()[:200] for i in incs]
    assert incs[0].kind == "cooling_degradation" and incs[0].host == "node2" and incs[0].gpu is None


def test_build_uses_config_thresholds():
    cfg = Config()
    cfg.detectors["thermal_throttle"]["min_share"] = 0.5
    dets = {d.kind: d for d in build(cfg.detectors)}
    assert dets["thermal_throttle"].min_share == 0.5


@pytest.mark.parametrize("kind", sorted(REGISTRY))
def test_defaults_match_config(kind):
    got = REGISTRY[kind]().get_params()
    got.pop("poll_seconds", None)
    want = {k: (tuple(v) if isinstance(v, list) else v) for k, v in Config().detectors[kind].items()}
    got = {k: (tuple(v) if isinstance(v, list) else v) for k, v in got.items()}
    assert got == want


def _with_inlet(data: bytes, hot_rack: str | None, rise_c: float = 10.0, from_step: int = 200, nodes=4):
    """``data`` plus each host's BMC inlet reading every 30 s (24 °C and a slow room-wide swing); the
    inlet of ``hot_rack``'s hosts ramps up by ``rise_c`` over 40 min from ``from_step``, their GPUs
    warming with it."""
    rng = np.random.default_rng(5)
    out = []
    rise_at = {}
    for s in range(0, 480, 3):
        t = T0 + s * STEP
        room = 24 + 1.5 * np.sin(s / 480 * np.pi)
        for n in range(nodes):
            rack = f"r{n // 2}"
            rise = rise_c * min(1.0, max(0.0, (s - from_step) / 240)) if rack == hot_rack else 0.0
            rise_at[(n, s // 3)] = rise
            tags = {
                "host": f"node{n}",
                "sensor": "Inlet Temp",
                "sensor_type": "Temperature",
                "unit": "C",
                "cluster": "c1",
                "rack": rack,
            }
            value = round(float(room + rise + rng.normal(0, 0.2)), 1)
            out.append(encode("bmc_sensor", tags, {"value": value}, t * 10**9))
    lines = []
    for ln in data.decode().splitlines():
        if ln.startswith("gpu,"):
            n = int(re.search(r",host=node(\d+)", ln).group(1))
            s = (int(ln.rsplit(" ", 1)[1]) // 10**9 - T0) // STEP
            add = rise_at.get((n, s // 3), 0.0)
            if add:
                m = re.search(r"temperature_gpu_celsius=(\d+)i", ln)
                new = int(m.group(1)) + round(add)
                ln = ln[: m.start()] + f"temperature_gpu_celsius={new}i" + ln[m.end() :]
        lines.append(ln)
    # as an agent writes them: in time order
    lines = sorted(lines + out, key=lambda ln: int(ln.rsplit(" ", 1)[1]))
    return ("\n".join(lines) + "\n").encode()


@pytest.mark.slow
def test_rack_inlet_rise_in_a_two_rack_fleet_is_one_rack_incident():
    # 4 nodes, racks r0 and r1: the room swings both, only r1's inlet (and its GPUs) rises
    incs = analyse(_with_inlet(fleet(steps=480), "r1")).incidents()
    cool = [i for i in incs if i.kind == "cooling_degradation"]
    assert [(i.host, i.gpu, i.rack) for i in cool] == [(None, None, "r1")], [i.to_json()[:300] for i in incs]
    assert cool[0].start > T0 + 200 * STEP
    assert cool[0].evidence["first"]["scope"] == "rack"


@pytest.mark.slow
def test_inlet_swinging_with_the_room_is_no_incident():
    assert not [i for i in analyse(_with_inlet(fleet(steps=480), None)).incidents()]


# ---------------------------------------------------------------- the fast paths give the plain results


def test_table_build_sorts_and_dedups_like_a_lexsort():
    from gpufleet.analyzer.frame import Table

    rng = np.random.default_rng(3)
    for shuffled in (False, True):
        n = 400
        ent = rng.integers(0, 7, n)
        t_ns = np.sort(rng.integers(0, 50, n)) * 10**9  # duplicates of (entity, time) on purpose
        if shuffled:
            p = rng.permutation(n)
            ent, t_ns = ent[p], t_ns[p]
        v = np.arange(n, dtype=float)
        tab = Table.build(ent, t_ns, {"v": v})
        order = np.lexsort((np.arange(n), t_ns, ent))
        e, t = ent[order], t_ns[order]
        last = np.ones(n, bool)
        last[:-1] = (e[1:] != e[:-1]) | (t[1:] != t[:-1])  # the last copy of a point wins
        assert np.array_equal(tab.ent, e[last]) and np.array_equal(tab.t, t[last] / 1e9)
        assert np.array_equal(tab.cols["v"], v[order][last])


def test_table_derived_arrays_are_computed_once_and_read_only():
    from gpufleet.analyzer.frame import Table

    tab = Table.build(np.array([0, 0, 1, 1]), np.array([1, 2, 1, 2]) * 10**9, {"c": np.array([1.0, 3, 5, 4])})
    d = tab.delta("c")
    assert d is tab.delta("c") and not d.flags.writeable
    assert np.array_equal(d, [np.nan, 2, np.nan, np.nan], equal_nan=True)  # a reset is NaN, not negative
    with pytest.raises(ValueError):
        d[0] = 1.0
    assert np.array_equal(tab.rolling_count(np.array([True, True, False, True]), 5.0), [1, 2, 0, 1])


def test_group_median_buckets_and_lookup_match_the_sorting_versions():
    from gpufleet.analyzer.detectors.rack_inlet import leave_one_out_median as _leave_one_out_median
    from gpufleet.analyzer.groupby import buckets, group_median, lookup

    rng = np.random.default_rng(4)
    for trial in range(40):
        n = int(rng.integers(1, 300))
        inv = rng.integers(0, 9, n)
        v = rng.normal(0, 3, n).round(1 if trial % 2 else 12)  # ties, and values a rounding apart
        v[rng.random(n) < 0.1] = np.nan
        med, cnt = group_median(inv, v, 9)
        for g in range(9):
            x = v[(inv == g) & np.isfinite(v)]
            assert cnt[g] == len(x)
            assert (np.isnan(med[g]) and not len(x)) or med[g] == np.median(x)
        t = rng.uniform(0, 900, n)
        extra = rng.integers(0, 40, n) + (10**6 if trial % 3 == 0 else 0)
        key = np.floor(t / 60).astype(np.int64) * 1_000_003 + extra
        u, want = np.unique(key, return_inverse=True)
        got, ng = buckets(t, 60.0, extra)
        assert ng == len(u) and np.array_equal(got, want)
        mapping = {int(k): float(k) / 2 for k in rng.integers(0, 60, 12)}
        assert np.array_equal(
            lookup(mapping, extra), [mapping.get(k, np.nan) for k in extra.tolist()], equal_nan=True
        )
        g, x = rng.integers(0, 4, n), rng.normal(0, 1, n).round(1)
        want = np.zeros(n)
        for k in range(4):
            idx = np.flatnonzero(g == k)
            for j, i in enumerate(idx.tolist()):
                want[i] = np.median(np.delete(x[idx], j)) if len(idx) > 1 else 0.0
        assert np.array_equal(_leave_one_out_median(g, x), want)


@pytest.mark.slow
def test_straggler_robust_covariance_is_scikit_learns_fastmcd_with_starts_stacked():
    from gpufleet.analyzer.detectors.straggler import _mcd

    sk = pytest.importorskip("sklearn.covariance._robust_covariance")
    rng = np.random.default_rng(5)
    # the three paths of FastMCD: all rows at once (<= 500), subsets then one merged set (< 1500),
    # subsets, merged set, then all rows
    for n in (300, 928, 1600):
        X = rng.normal(0, [0.02, 0.05, 0.01], (n, 3))
        X[: n // 20] += [0.15, -0.3, 0.05]  # 5 % outliers, far out on every feature
        loc, cov = _mcd(X, support_fraction=0.9)
        # robust: the outliers move neither the location nor the spread (the plain mean and
        # covariance they do move, by ~0.0075 and ~2x)
        assert np.abs(loc).max() < 0.003, (n, loc)
        assert np.allclose(np.sqrt(np.diag(cov)), [0.02, 0.05, 0.01], rtol=0.15), (n, cov)
        assert abs(X[:, 0].mean()) > 0.006 and np.cov(X.T, bias=True)[0, 0] > 2 * 0.02**2
        if hasattr(sk, "_consistency_factor"):  # a scikit-learn with Pison's consistency factors
            a = sk.MinCovDet(random_state=0, support_fraction=0.9).fit(X)
            assert np.allclose(a.location_, loc, rtol=1e-9, atol=0), n
            assert np.allclose(a.covariance_, cov, rtol=1e-9, atol=0), n


def test_straggler_chi_square_is_scipys():
    from gpufleet.analyzer.detectors.straggler import _chi2_cdf, _chi2_ppf

    special = pytest.importorskip("scipy.special")
    for k in (1, 2, 3, 4, 5, 7):
        for x in (1e-6, 0.01, 0.5, 2.37, 9.35, 20.0, 40.0):
            assert _chi2_cdf(x, k) == pytest.approx(special.chdtr(k, x), rel=1e-13, abs=0)
        for q in (1e-4, 0.5, 0.9, 0.975, 0.999):
            assert _chi2_ppf(q, k) == pytest.approx(special.chdtri(k, 1 - q), rel=1e-12, abs=0)
    with pytest.raises(ValueError):
        _chi2_ppf(1.0, 3)


def test_group_median_of_uneven_groups_matches_numpy():
    from gpufleet.analyzer.groupby import group_median

    rng = np.random.default_rng(7)
    # one wide group among many small ones (no padded layout), and many groups of a few rows
    for sizes in ([5000] + [1] * 300, [3, 17, 18, 18, 0, 2] * 50):
        inv = np.repeat(np.arange(len(sizes)), sizes)
        rng.shuffle(inv)
        v = rng.normal(0, 1, len(inv)).round(2)
        v[rng.random(len(v)) < 0.05] = np.nan
        v[rng.random(len(v)) < 0.01] = np.inf  # not finite: ignored as NaN is
        med, cnt = group_median(inv, v, len(sizes))
        for g in range(len(sizes)):
            x = v[(inv == g) & np.isfinite(v)]
            assert cnt[g] == len(x)
            assert (np.isnan(med[g]) and not len(x)) or med[g] == np.median(x)


def test_table_since_is_the_exact_trailing_span():
    from gpufleet.analyzer.frame import Table

    rng = np.random.default_rng(8)
    for trial in range(20):
        n = int(rng.integers(1, 400))
        ent = rng.integers(0, 5, n) + (10**5 if trial % 2 else 0)
        # far entities (a rounded float key in _span) and steps 30 µs either side of 10 s
        steps = rng.choice([10**9, 10**10 - 30_000, 10**10, 10**10 + 30_000], n)
        t_ns = 1_800_000_000 * 10**9 + np.cumsum(steps)
        tab = Table.build(ent, t_ns, {})
        for seconds in (0.0, 10.0, 30.0, 60.0):
            got = tab.since(seconds)
            for i in range(len(tab)):
                j = i
                while j > 0 and tab.ent[j - 1] == tab.ent[i] and tab.t[i] - tab.t[j - 1] <= seconds:
                    j -= 1
                assert got[i] == j


def test_pcie_slow_counter_delta_is_the_forward_filled_difference():
    from gpufleet.analyzer.detectors.pcie_degradation import _slow_delta
    from gpufleet.analyzer.frame import Table

    rng = np.random.default_rng(9)
    for _ in range(20):
        n = int(rng.integers(1, 300))
        ent = rng.integers(0, 6, n)
        t_ns = np.cumsum(rng.integers(1, 20, n)) * 10**9
        v = np.cumsum(rng.integers(0, 3, n)).astype(float)
        v[rng.random(n) < 0.1] = 0.0  # resets
        v[rng.random(n) < 0.6] = np.nan  # a slow-tier field: absent from most rows
        tab = Table.build(ent, t_ns, {"c": v})
        ff = tab.ffill("c")
        want = ff - tab.prev(ff)
        want[~(want > 0)] = 0.0
        # an increase between readings with a gap (frame.Table.gap) between them is no span's rate
        gap, last = tab.over_gap(), {}
        for i in range(n):
            e = int(tab.ent[i])
            if not np.isnan(tab.cols["c"][i]):
                if e in last and gap[last[e] + 1: i + 1].any():
                    want[i] = 0.0
                last[e] = i
        assert np.array_equal(_slow_delta(tab, "c"), want)
        assert np.array_equal(_slow_delta(tab, "absent"), np.zeros(len(tab)))


def test_nvlink_fleet_rate_quantile_matches_numpy():
    from gpufleet.analyzer.detectors.nvlink_degradation import _p90

    rng = np.random.default_rng(10)
    for _ in range(500):
        n = int(rng.integers(21, 120))
        r = np.zeros(n)
        k = min(n, int(rng.integers(0, n // 4 + 2)))  # a few links erring, up to a quarter
        r[rng.choice(n, k, replace=False)] = rng.exponential(1.0, k)
        want = float(np.quantile(r, 0.9))
        assert _p90(r) == want and np.signbit(_p90(r)) == np.signbit(want)


def test_cooling_recent_max_is_the_trailing_maximum():
    from gpufleet.analyzer.detectors.cooling_degradation import _recent_max
    from gpufleet.analyzer.frame import Table

    rng = np.random.default_rng(11)
    for _ in range(30):
        n = int(rng.integers(1, 200))
        tab = Table.build(rng.integers(0, 4, n), np.cumsum(rng.integers(1, 25, n)) * 10**9, {})
        v = rng.normal(300, 100, len(tab)).round()
        v[rng.random(len(v)) < 0.1] = np.nan
        rows = np.flatnonzero(rng.random(len(v)) < 0.3)
        got = _recent_max(tab, v, 60.0, rows)
        for j, i in enumerate(rows.tolist()):
            back = range(max(i - 8, 0), i + 1)  # up to 8 rows back, of its entity, within 60 s
            span = [v[k] for k in back if tab.ent[k] == tab.ent[i] and tab.t[i] - tab.t[k] <= 60]
            want = np.nan if np.isnan(span).all() else np.nanmax(span)
            assert got[j] == want or (np.isnan(got[j]) and np.isnan(want))


def test_table_increase_is_the_delta_with_unknowns_zero():
    from gpufleet.analyzer.frame import Table, nan_to_zero

    rng = np.random.default_rng(12)
    for _ in range(100):
        n = int(rng.integers(1, 60))
        v = np.cumsum(rng.integers(0, 5, n)).astype(float)
        v[rng.random(n) < 0.1] = 0.0  # resets
        v[rng.random(n) < 0.15] = np.nan
        v[rng.random(n) < 0.03] = np.inf
        tab = Table.build(rng.integers(0, 3, n), np.cumsum(rng.integers(1, 9, n)) * 10**9, {"c": v})
        with np.errstate(invalid="ignore"):
            got, want = tab.increase("c"), nan_to_zero(tab.delta("c"))
        assert np.array_equal(got, want) and not got.flags.writeable


def test_table_ffill_codes_number_strings_by_first_appearance():
    from gpufleet.analyzer.frame import Table

    rng = np.random.default_rng(13)
    words = np.array(["a", "b", "job-7", "x", None], dtype=object)
    for _ in range(100):
        n = int(rng.integers(0, 80))
        tab = Table.build(rng.integers(0, 3, n), np.cumsum(rng.integers(1, 9, n)) * 10**9, {},
                          {"job": words[rng.integers(0, 5, n)]})
        got, v = tab.ffill_codes("job"), tab.text["job"]
        order = list(dict.fromkeys(x for x in v.tolist() if x is not None))
        for i in range(n):
            j = i  # the entity's latest row with a value, at or before i
            while j >= 0 and tab.ent[j] == tab.ent[i] and v[j] is None:
                j -= 1
            ok = j >= 0 and tab.ent[j] == tab.ent[i]
            assert got[i] == (order.index(v[j]) if ok else -1)


@pytest.mark.slow
def test_straggler_fits_its_model_only_once_a_gpu_is_slow():
    healthy = analyse(fleet(steps=200))
    st = next(d for d in healthy.detectors if d.kind == "straggler")
    assert hasattr(st, "fit_sample_") and not hasattr(st, "location_")
    slow = analyse(fleet(steps=200, fault=("straggler", 1, 1, 100)))
    st = next(d for d in slow.detectors if d.kind == "straggler")
    assert hasattr(st, "location_") and not hasattr(st, "fit_sample_")
    assert [(i.kind, i.host, i.gpu) for i in slow.incidents()] == [("straggler", "node1", 1)]


def test_evidence_is_built_when_read():
    from gpufleet.analyzer.detectors.base import Evidence, Hits, concat

    built = []

    def make(i):
        built.append(i)
        return {"row": i}

    z = np.zeros(2, np.int64)
    a = Hits("k", z, z, z, np.array([1.0, 2.0]), np.ones(2), np.zeros(2, bool), Evidence(make, [7, 9]))
    b = Hits("k", z[:1], z[:1], z[:1], np.array([3.0]), np.ones(1), np.zeros(1, bool), [])
    both = concat("k", [a, b])
    assert built == [] and len(both.evidence) == 3
    assert list(both.evidence) == [{"row": 7}, {"row": 9}, {}] and built == [7, 9]


def _thermal_fleet(
    busy,
    offset,
    extra=None,
    nodes=4,
    gpus=8,
    steps=900,
    seed=3,
    throttling=None,
    step=STEP,
    inlet=None,
    fan=None,
) -> bytes:
    """``gpu`` rows: T = 25 + offset + 0.04 * P (+ ``extra(n, g, s, p)``), load from ``busy(n, s)``;
    ``throttling(n, g, s)``: the GPU throttles (thermal bit, at 87 °C) whenever it works;
    ``inlet(n, s)``: the host's BMC inlet °C (a bmc_sensor row per step), which its GPUs follow."""
    rng = np.random.default_rng(seed)
    out = []
    for s in range(steps):
        t = (T0 + s * step) * 10**9
        for n in range(nodes):
            load = busy(n, s)
            warm = 0.0
            if inlet is not None:
                value = round(float(inlet(n, s)), 1)
                warm = value - inlet(n, 0)
                tags = {"host": f"node{n}", "sensor": "Inlet Temp", "unit": "C", "rack": f"r{n // 2}"}
                out.append(encode("bmc_sensor", tags, {"value": value}, t))
            if fan is not None:
                rpm = float(fan(n, s))
                tags = {
                    "host": f"node{n}",
                    "sensor": "FAN1",
                    "sensor_type": "Fan",
                    "unit": "RPM",
                    "rack": f"r{n // 2}",
                }
                out.append(
                    encode("bmc_sensor", tags, {"value": rpm, "state_code": 0 if rpm > 3000 else 2}, t)
                )
            for g in range(gpus):
                p = 690 + rng.normal(0, 2) if load else 80 + rng.normal(0, 0.5)
                temp = 25 + offset(n, g) + 0.04 * p + rng.normal(0, 0.3) + (extra(n, g, s, p) if extra else 0)
                temp += warm
                hot = load and throttling is not None and throttling(n, g, s)
                f = {
                    "utilization_gpu_ratio": 1.0 if load else 0.0,
                    "power_watts": round(p, 2),
                    "power_limit_watts": 700.0,
                    "temperature_gpu_celsius": 87 if hot else int(round(temp)),
                    "clock_sm_mhz": 1500 if load else 345,
                    "temperature_slowdown_celsius": 89,
                    "clock_event_reasons": (0x4 | (0x40 if hot else 0)) if load else 0x1,
                }
                out.append(encode("gpu", {"host": f"node{n}", "gpu": str(g), "rack": f"r{n // 2}"}, f, t))
    return ("\n".join(out) + "\n").encode()


@pytest.mark.slow
def test_idle_node_cooling_failure_found_with_its_fans():
    # the whole fleet idles; at step 400 node2's fans fail: its GPUs idle 2.5 °C warmer (below the
    # 3.5 °C low-power bar a GPU needs alone) and its BMC reports the fan at 1500 RPM, state 2
    def extra(n, g, s, p):
        return 2.5 if (n == 2 and s >= 400) else 0.0

    def fan(n, s):
        return 1500.0 if (n == 2 and s >= 400) else 9800.0

    idle = dict(busy=lambda n, s: False, offset=lambda n, g: 0.0, extra=extra, steps=900)
    incs = analyse(_thermal_fleet(**idle, fan=fan)).incidents()
    assert [(i.kind, i.host, i.gpu) for i in incs] == [("cooling_degradation", "node2", None)], [
        i.summary for i in incs
    ]
    assert incs[0].evidence["first"]["fan_rpm"] == 1500.0 and incs[0].evidence["first"]["fan_state"] == 2
    assert T0 + 400 * STEP - 60 <= incs[0].start <= T0 + 500 * STEP
    # the same temperatures with healthy fans: no incident (2.5 °C at idle is within a GPU's spread)
    assert analyse(_thermal_fleet(**idle, fan=lambda n, s: 9800.0)).incidents() == []


@pytest.mark.slow
def test_node_going_idle_alone_is_not_hot_against_its_own_median():
    # the whole fleet idles for the first 40 min (baselines learned against every idle GPU), then
    # works; at 100 min node3 -- whose GPUs run 4 °C cooler than the rest -- goes idle alone. The
    # idle band's common mode is then node3's own GPUs: their offsets must not read as excess.
    data = _thermal_fleet(
        busy=lambda n, s: 240 <= s < (600 if n == 3 else 10**9),
        offset=lambda n, g: -4.0 if n == 3 else 0.0,
    )
    incs = [i for i in analyse(data).incidents() if i.kind == "cooling_degradation"]
    assert incs == [], [i.summary for i in incs]


@pytest.mark.slow
def test_failed_cooling_that_goes_idle_stays_one_incident():
    # node1 GPU 2's cooling fails at load (10 min in, +12 °C at 690 W, a few degrees at 80 W); its
    # node then idles for 2 h (longer than resolve_seconds) and goes back to work: one incident,
    # held open while the fault could not show, not a second page at the next job
    def busy(n, s):
        return not (n == 1 and 180 <= s < 900)

    def extra(n, g, s, p):
        return 12.0 * p / 690 if (n == 1 and g == 2 and s >= 60) else 0.0

    data = _thermal_fleet(busy, offset=lambda n, g: 0.0, extra=extra, steps=1200)
    incs = [i for i in analyse(data).incidents() if i.kind == "cooling_degradation"]
    assert [(i.host, i.gpu) for i in incs] == [("node1", 2)], [i.summary for i in incs]
    assert incs[0].end is None  # still open: the fault never went away


@pytest.mark.slow
def test_cooling_incident_resolves_once_judged_healthy_at_load():
    # the same fault, repaired while idle: back at work it runs cool, so the incident resolves
    def busy(n, s):
        return not (n == 1 and 180 <= s < 600)

    def extra(n, g, s, p):
        return 12.0 * p / 690 if (n == 1 and g == 2 and 60 <= s < 400) else 0.0

    data = _thermal_fleet(busy, offset=lambda n, g: 0.0, extra=extra, steps=1500)
    incs = [i for i in analyse(data).incidents() if i.kind == "cooling_degradation"]
    assert [(i.host, i.gpu) for i in incs] == [("node1", 2)], [i.summary for i in incs]
    assert incs[0].end is not None


@pytest.mark.slow
def test_queued_hits_hold_no_window():
    # hits wait in the engine's queue until every stream has caught up (a sparse events stream can
    # hold them for hours): they must not keep their window's arrays alive through lazy evidence
    cfg = Config()
    cfg.engine["fold"] = {}  # the throttling incident itself, not folded into the cooling one
    an = Analyzer(cfg)
    data = fleet(nodes=4, gpus=4, steps=480, fault=("thermal_throttle", 1, 2, 100))
    an.feed_bytes(data[: len(data) * 3 // 4].rsplit(b"\n", 1)[0] + b"\n")
    queued = [x for items in an.engine.pending.values() for x in items]
    assert queued and all(isinstance(x[3], dict) for x in queued)
    an.feed_bytes(data[len(data) * 3 // 4 :].split(b"\n", 1)[1])
    an.finish()
    (inc,) = [i for i in an.incidents() if i.kind == "thermal_throttle"]
    assert inc.evidence["first"] and inc.evidence["peak"]  # what the engine keeps was built


@pytest.mark.slow
def test_throttling_gpu_that_idles_between_jobs_is_one_incident():
    # node1 GPU 2 throttles in its job, idles 2 h (past resolve_seconds), throttles in the next one
    def busy(n, s):
        return not (n == 1 and 300 <= s < 1020)

    data = _thermal_fleet(busy, lambda n, g: 0.0, steps=1200, throttling=lambda n, g, s: (n, g) == (1, 2))
    # (or the cooling fault the model finds in it later, the throttling folded in as its impact:
    # still one incident)
    incs = [i for i in analyse(data).incidents() if i.kind in ("thermal_throttle", "cooling_degradation")]
    assert [(i.host, i.gpu, i.end) for i in incs] == [("node1", 2, None)]
    assert incs[0].kind == "thermal_throttle" or incs[0].impact_at is not None


@pytest.mark.slow
def test_throttling_that_stopped_at_full_load_resolves_and_a_new_episode_pages_again():
    # it throttles, then works 2 h at full load with headroom (fixed), then throttles again
    data = _thermal_fleet(
        lambda n, s: True,
        lambda n, g: 0.0,
        steps=1500,
        throttling=lambda n, g, s: (n, g) == (1, 2) and (s < 120 or s >= 1200),
    )
    # the second episode, throttling where the learned model says the GPU should run cool, pages as
    # the cooling fault it is, with the throttling folded in as its impact
    incs = [i for i in analyse(data).incidents() if i.kind in ("thermal_throttle", "cooling_degradation")]
    assert [(i.host, i.gpu) for i in incs] == [("node1", 2), ("node1", 2)]
    assert incs[0].end is not None and incs[1].end is None
    assert incs[1].kind == "thermal_throttle" or incs[1].impact_at is not None


@pytest.mark.slow
def test_a_stream_that_arrives_after_the_others_is_not_resolved_by_their_progress():
    # an export: every gpu row first, then every gpu_nvlink row, read in chunks. The link's hits
    # reach the engine long after the gpu stream moved its clock on; still one incident
    data = fleet(nodes=4, gpus=4, steps=1500, fault=("nvlink_degradation", 2, 1, 300))
    lines = data.decode().splitlines()
    gpu = [ln for ln in lines if ln.startswith("gpu,")]
    links = [ln for ln in lines if ln.startswith("gpu_nvlink,")]
    an = Analyzer(Config())
    for part in (gpu, *(links[i : i + 2000] for i in range(0, len(links), 2000))):
        an.feed_bytes(("\n".join(part) + "\n").encode())
    an.finish()
    incs = [i for i in an.incidents() if i.kind == "nvlink_degradation"]
    assert [(i.host, i.gpu, i.link, i.end) for i in incs] == [("node2", 1, 1, None)]


@pytest.mark.slow
def test_cooling_found_at_a_60_s_poll():
    # baselines take the same 20 minutes at a 60 s poll (20 samples, not 120): a heatsink failing
    # 40 min in is found, not learned as the GPU's normal
    def extra(n, g, s, p):
        return 12.0 * p / 690 if (n, g) == (2, 5) and s >= 40 else 0.0

    data = _thermal_fleet(lambda n, s: True, lambda n, g: 0.0, extra=extra, steps=180, step=60)
    incs = [i for i in analyse(data).incidents() if i.kind == "cooling_degradation"]
    assert [(i.host, i.gpu) for i in incs] == [("node2", 5)]
    assert incs[0].start <= T0 + 40 * 60  # dated to the last normal poll, not found hours later


@pytest.mark.slow
def test_a_rack_inlet_drifting_over_half_a_day_is_no_incident():
    # rack r1's inlet creeps up 8 °C over 12 h (the room, not a failure); its GPUs follow the inlet
    def inlet(n, s):
        return 24.0 + (8.0 * s / 720 if n >= 2 else 0.0)

    data = _thermal_fleet(lambda n, s: True, lambda n, g: 0.0, steps=720, step=60, inlet=inlet)
    incs = [i for i in analyse(data).incidents() if i.kind == "cooling_degradation"]
    assert incs == [], [i.summary for i in incs]


def test_nvlink_fit_in_a_mixed_fleet_takes_a_window_whose_links_have_no_rate_yet():
    """Two GPU models, and a window whose NVLink rows are each link's first (no rate yet, as when
    a node's backlog starts landing): nothing learned from it, no error (the listener died on it)."""
    t0 = 1_795_100_000
    lines = []
    for s in range(0, 600, 10):
        for host, model in (("a", "NVIDIA H200"), ("b", "NVIDIA A100-SXM4-80GB")):
            m = model.replace(" ", "\\ ")
            lines.append(f"gpu,host={host},gpu=0,model={m} up=1i,power_watts=300 {(t0 + s) * 10**9}")
    lines.append(f"gpu_nvlink,host=a,gpu=0,link=0 up=1i,crc_flit_errors_total=0i {(t0 + 590) * 10**9}")
    an = Analyzer()
    an.feed_bytes(("\n".join(lines) + "\n").encode())
    an.finish()
    det = next(d for d in an.detectors if d.kind == "nvlink_degradation")
    assert det.fleet_crc_rate_ == 0.0 and det.model_crc_rate_ == {}  # fitted, nothing learned
    assert not [r for r in an.incidents() if r.kind == "nvlink_degradation"]


def test_a_detector_failing_on_some_windows_is_one_gap_record_and_the_rest_goes_on(monkeypatch):
    """memory_errors raises on the windows between 10 and 20 minutes: those are one
    ``analysis_gap`` record naming the detector, its windows and the error, said once in the log;
    the other detectors (an XID 79 inside them) and memory_errors' own later windows (a DBE at 30
    minutes) are analysed as ever."""
    monkeypatch.delenv("GPUFLEET_STRICT")
    t0 = 1_795_100_000
    lines = []
    for s in range(0, 2400, 10):
        for g in range(2):
            dbe = int(g == 1 and s >= 1800)
            lines.append(f"gpu,host=a,gpu={g} up=1i,power_watts=300,ecc_uncorrected_volatile_total={dbe}i "
                         f"{(t0 + s) * 10**9}")
    lines.append(f"gpu_event,host=a,gpu=0,type=xid code=79i {(t0 + 900) * 10**9}")
    an = Analyzer()
    det = next(d for d in an.detectors if d.kind == "memory_errors")
    inner = det.detect

    def detect(w):
        if t0 + 600 <= w.start < t0 + 1200:
            raise ValueError("boom")
        return inner(w)

    monkeypatch.setattr(det, "detect", detect)
    an.feed_bytes(("\n".join(lines) + "\n").encode())
    an.finish()
    recs = an.incidents()
    gaps = [r for r in recs if r.kind == "analysis_gap"]
    assert len(gaps) == 1 and gaps[0].host is None, gaps
    ev = gaps[0].evidence
    assert ev["detector"] == "memory_errors" and ev["error"] == "ValueError: boom" and ev["windows"] >= 2
    assert t0 + 600 <= gaps[0].start and gaps[0].end <= t0 + 1200 + an.window
    assert "memory_errors not analysed from" in gaps[0].summary
    assert [line for line in an.said if "memory_errors detector failed" in line] != []
    found = {(r.kind, r.gpu) for r in recs if r.kind != "analysis_gap"}
    assert found == {("gpu_lost", 0), ("memory_errors", 1)}


def test_one_gpu_s_sbe_storm_on_a_node_of_eight_pages_and_sets_no_fleet_rate():
    """The only node of a small fleet: GPU 3's corrected (single-bit) errors storm at one a second
    from the start. The fleet's own rate, its GPUs' 90th percentile, is never taken above the third
    highest: the storm does not become the rate it is judged against (50 times it), and it pages."""
    out = []
    for s in range(360):
        t = (T0 + s * STEP) * 10**9
        for g in range(8):
            sbe = int(s * STEP) if g == 3 else 0
            out.append(encode("gpu", {"host": "node0", "gpu": str(g)},
                              {"up": 1, "power_watts": 300.0, "ecc_corrected_volatile_total": sbe}, t))
    an = analyse(("\n".join(out) + "\n").encode())
    got = [(i.kind, i.host, i.gpu) for i in an.incidents()]
    assert got == [("memory_errors", "node0", 3)], got
    det = next(d for d in an.detectors if d.kind == "memory_errors")
    assert det.fleet_sbe_rate_ == 0.0
