"""The synthetic fleet: determinism, schema, bad input, and each fault's signature (and nowhere else)."""

from __future__ import annotations

import gzip
import json
from collections import defaultdict
from pathlib import Path

import numpy as np
import pytest

from gpufleet import catalogue
from gpufleet.cli import main
from gpufleet.errors import GpufleetError
from gpufleet.lineprotocol import Point, encode, parse_line
from gpufleet.records import read as read_records
from gpufleet.sim import scenario as scen
from gpufleet.sim.engine import generate
from gpufleet.sim.fleet import Fleet


def run_sim(tmp: Path, name: str, nodes=4, duration=3 * 3600.0, step=10.0, seed=7) -> Path:
    sc = scen.load(name)
    out = tmp / f"{Path(name).stem}-{seed}"
    generate(
        Fleet(sc, seed=seed, duration=duration, step=step, nodes=nodes, gpus_per_node=8), out, progress=False
    )
    return out


def lines(out: Path) -> list[str]:
    with gzip.open(out / "telemetry.lp.gz", "rt") as f:
        return f.read().splitlines()


def fast_parse(line: str):
    """parse_line for the simulator's own lines whose fields hold no spaces (checked against parse_line)."""
    rest, ts = line.rsplit(" ", 1)
    head, flds = rest.rsplit(" ", 1)
    if "\\" in flds or flds.count('"') > 2 or line.startswith("gpu_event"):
        return parse_line(line)
    parts = head.split(",")
    tags = dict(t.replace("\\ ", " ").split("=", 1) for t in parts[1:])
    fields = {}
    for kv in flds.split(","):
        k, v = kv.split("=", 1)
        fields[k] = int(v[:-1]) if v[-1] == "i" else v[1:-1] if v[0] == '"' else float(v)
    return Point(parts[0], tags, fields, int(ts))


class Parsed:
    """The telemetry of one run, grouped by measurement: lists of (tags, fields, time)."""

    def __init__(self, out: Path):
        self.by = defaultdict(list)
        for line in lines(out):
            p = fast_parse(line)
            self.by[p.measurement].append(p)
        self.truth = read_records(out / "truth.jsonl")
        self.manifest = json.loads((out / "manifest.json").read_text())

    def gpus_with(self, measurement: str, pred) -> set[tuple[str, int]]:
        return {(p.tags["host"], int(p.tags["gpu"])) for p in self.by[measurement] if pred(p)}

    def truth_gpus(self, *kinds) -> set[tuple[str, int]]:
        """GPUs the truth names; a node-scope record (gpu null) names every GPU of its host."""
        host_gpus = defaultdict(set)
        for p in self.by["gpu"]:
            host_gpus[p.tags["host"]].add(int(p.tags["gpu"]))
        out = set()
        for r in self.truth:
            if r.kind in kinds and r.host is not None:
                out |= {(r.host, r.gpu)} if r.gpu is not None else {(r.host, g) for g in host_gpus[r.host]}
        return out


@pytest.fixture(scope="module")
def mixed(tmp_path_factory):
    return Parsed(run_sim(tmp_path_factory.mktemp("mixed"), "mixed", nodes=6, duration=4 * 3600.0))


@pytest.fixture(scope="module")
def memory(tmp_path_factory):
    return Parsed(run_sim(tmp_path_factory.mktemp("memory"), "memory", nodes=3, duration=2 * 3600.0))


@pytest.mark.slow
def test_same_seed_same_bytes_other_seed_differs(tmp_path):
    a = run_sim(tmp_path / "a", "chaos", nodes=4, duration=1800.0)
    b = run_sim(tmp_path / "b", "chaos", nodes=4, duration=1800.0)
    c = run_sim(tmp_path / "c", "chaos", nodes=4, duration=1800.0, seed=8)
    for name in ("telemetry.lp.gz", "truth.jsonl", "manifest.json"):
        assert (a / name).read_bytes() == (b / name).read_bytes(), name
    assert (a / "telemetry.lp.gz").read_bytes() != (c / "telemetry.lp.gz").read_bytes()
    assert not list(tmp_path.rglob(".*tmp-*"))  # no temp directory left behind


@pytest.mark.slow
def test_lines_are_the_catalogue_schema_and_encode_identically(mixed):
    cat = {m.key: m for m in catalogue.load()}
    checked = 0
    for meas, pts in mixed.by.items():
        assert set(pts[0].tags) >= set(catalogue.IDENTITY_TAGS[meas]), meas
        for p in pts[:: max(1, len(pts) // 400)]:
            assert set(p.tags) <= set(catalogue.tags(meas)), (meas, p.tags)
            for k, v in p.fields.items():
                m = cat[(meas, k)]
                assert isinstance(v, m.python_type), (meas, k, v)
            # byte-identical to the project's encoder with fields in catalogue order
            order = [m.field for m in catalogue.fields(meas) if m.field in p.fields]
            assert list(p.fields) == order
            assert p.time % 1_000_000 == 0 and p.time > 1.7e18
            checked += 1
    assert checked > 1000


@pytest.mark.slow
def test_encode_round_trip_is_byte_identical(tmp_path):
    out = run_sim(tmp_path, "mixed", nodes=2, duration=1800.0)
    for line in lines(out)[:3000]:
        p = parse_line(line)
        assert encode(p.measurement, p.tags, p.fields, p.time) == line
        assert fast_parse(line) == p


@pytest.mark.slow
def test_h200_values_realistic_and_absent_fields_absent(mixed):
    gpu = mixed.by["gpu"]
    busy = [p for p in gpu if p.fields.get("clock_event_reasons") == 4]
    assert len(busy) > 1000
    pw = np.array([p.fields["power_watts"] for p in busy])
    clk = np.array([p.fields["clock_sm_mhz"] for p in busy])
    assert 685 < np.median(pw) < 697 and pw.max() <= 700
    assert 1440 <= np.percentile(clk, 5) and np.percentile(clk, 95) <= 1545
    idle = [p for p in gpu if p.fields.get("clock_event_reasons") == 1]
    assert 78 < np.median([p.fields["power_watts"] for p in idle]) < 82
    for p in gpu[:500]:
        for absent in ("fan_speed_ratio", "retired_pages_sbe", "retired_pages_pending"):
            assert absent not in p.fields
    slow = [p for p in gpu if "memory_total_bytes" in p.fields]
    assert 0.1 < len(slow) / len(gpu) < 0.25
    assert all(
        p.fields["temperature_slowdown_celsius"] == 89
        and p.fields["temperature_shutdown_celsius"] == 95
        and p.fields["temperature_max_operating_celsius"] == 87
        for p in slow
    )
    # energy integrates power: over a healthy GPU's run, mean power x time matches the counter
    key = next(iter({(p.tags["host"], p.tags["gpu"]) for p in gpu}))
    rows = [p for p in gpu if (p.tags["host"], p.tags["gpu"]) == key and "energy_joules_total" in p.fields]
    de = rows[-1].fields["energy_joules_total"] - rows[0].fields["energy_joules_total"]
    dt = (rows[-1].time - rows[0].time) / 1e9
    mean_p = np.mean([p.fields["power_watts"] for p in rows[1:]])
    assert abs(de / dt - mean_p) / mean_p < 0.03


@pytest.mark.slow
def test_truth_records_shape(mixed):
    kinds = {r.kind for r in mixed.truth}
    assert {
        "cooling_degradation",
        "power_brake",
        "nvlink_degradation",
        "pcie_degradation",
        "memory_errors",
        "sdc",
        "gpu_lost",
        "straggler",
    } <= kinds
    # throttling a cooling fault caused is that fault's impact (one record), not a second record
    cooling = [r for r in mixed.truth if r.kind == "cooling_degradation"]
    assert any(r.impact_at is not None for r in cooling)
    for r in mixed.truth:
        if r.kind == "thermal_throttle":
            assert not any(c.host == r.host and c.gpu in (None, r.gpu) for c in cooling)
    start = mixed.manifest["start"]
    for r in mixed.truth:
        assert r.host and r.rack and r.cluster and r.severity in ("critical", "warning")
        assert (r.link is not None) == (r.kind == "nvlink_degradation")
        assert r.start >= Record_time(start)
        if r.impact_at is not None:
            assert r.impact_at >= r.start - 1e-6


def Record_time(s):
    from gpufleet.records import from_rfc3339

    return from_rfc3339(s)


@pytest.mark.slow
def test_thermal_signature_only_on_thermal_faults(mixed):
    throttled = mixed.gpus_with(
        "gpu",
        lambda p: (
            p.fields.get("clock_event_reasons", 0) & 0x60 or p.fields.get("clock_event_sw_thermal") == 1
        ),
    )
    assert throttled and throttled <= mixed.truth_gpus("thermal_throttle", "cooling_degradation")
    # the truth of throttling is the physics' (die at its limit, clock cut), not the reason bits the
    # detector reads (a bit can show at a cut of half a watt): the two agree within a minute; a
    # cooling fault's impact_at is when its throttling began
    first_bit: dict = {}
    for p in mixed.by["gpu"]:
        r = p.fields.get("clock_event_reasons", 0)
        if r & 0x60:
            key = (p.tags["host"], int(p.tags["gpu"]))
            first_bit[key] = min(first_bit.get(key, p.time / 1e9), p.time / 1e9)
    checked = 0
    for r in mixed.truth:
        if r.kind in ("cooling_degradation", "thermal_throttle") and (r.host, r.gpu) in first_bit:
            assert r.impact_at is not None and abs(r.impact_at - first_bit[(r.host, r.gpu)]) <= 60.0
            checked += 1
    assert checked


@pytest.mark.slow
def test_power_brake_signature(mixed):
    braked = mixed.gpus_with("gpu", lambda p: p.fields.get("clock_event_reasons", 0) & 0x80)
    assert braked == mixed.truth_gpus("power_brake")
    counter = mixed.gpus_with("gpu", lambda p: p.fields.get("throttle_hw_power_brake_ns_total", 0) > 0)
    assert counter == braked


@pytest.mark.slow
def test_nvlink_signature_on_one_link(mixed):
    # every link every 30 s (the agent's gpu.nvlink_interval); healthy links carry a background of
    # sporadic CRC errors and rare replays, far below a degrading link's; only that one goes down
    # or recovers
    times = sorted({p.time for p in mixed.by["gpu_nvlink"]})
    assert {b - a for a, b in zip(times, times[1:], strict=False)} == {30 * 10**9}
    last = {}
    for p in sorted(mixed.by["gpu_nvlink"], key=lambda p: p.time):
        last[(p.tags["host"], int(p.tags["gpu"]), int(p.tags["link"]))] = p.fields
    want = {(r.host, r.gpu, r.link) for r in mixed.truth if r.kind == "nvlink_degradation"}
    healthy = [f for k, f in last.items() if k not in want]
    assert sum(f["crc_flit_errors_total"] > 0 for f in healthy) > len(healthy) / 3  # the background
    assert max(f["crc_flit_errors_total"] for f in healthy) < 40
    assert all(f["up"] == 1 and f["recovery_errors_total"] == 0 for f in healthy)
    assert max(f["replay_errors_total"] for f in healthy) <= 2
    host, gpu, link = next(iter(want))
    rows = sorted(
        (
            p
            for p in mixed.by["gpu_nvlink"]
            if (p.tags["host"], int(p.tags["gpu"]), int(p.tags["link"])) == (host, gpu, link)
        ),
        key=lambda p: p.time,
    )
    crc = [p.fields["crc_flit_errors_total"] for p in rows]
    assert crc == sorted(crc) and crc[-1] > 100
    assert rows[-1].fields["replay_errors_total"] > 0 and rows[-1].fields["recovery_errors_total"] > 0
    assert rows[-1].fields["up"] == 0  # severity 1 ends in link down
    # healthy links appear in periodic full rows: 18 links per GPU
    links = {int(p.tags["link"]) for p in mixed.by["gpu_nvlink"]}
    assert links == set(range(18))


@pytest.mark.slow
def test_pcie_signature(mixed):
    # healthy GPUs replay a few times an hour (the background); the faulty one storms
    last = {}
    for p in mixed.by["gpu"]:
        if "pcie_replay_total" in p.fields:
            last[(p.tags["host"], int(p.tags["gpu"]))] = p.fields["pcie_replay_total"]
    storm = {k for k, v in last.items() if v > 100}
    assert storm == mixed.truth_gpus("pcie_degradation")
    assert sum(v > 0 for k, v in last.items() if k not in storm) > len(last) / 2


@pytest.mark.slow
def test_sdc_only_canary(mixed):
    failed = mixed.gpus_with("gpu_canary", lambda p: p.fields["passed"] == 0)
    assert failed == mixed.truth_gpus("sdc")
    bad = [p for p in mixed.by["gpu_canary"] if p.fields["passed"] == 0]
    assert all(p.fields["mismatches"] > 0 for p in bad)
    good_digests = {p.fields["digest"] for p in mixed.by["gpu_canary"] if p.fields["passed"] == 1}
    assert len(good_digests) == 1
    # the SDC GPU looks healthy everywhere else: no reason bits beyond idle/power cap, no errors
    ((host, gpu),) = mixed.truth_gpus("sdc")
    rows = [p for p in mixed.by["gpu"] if (p.tags["host"], int(p.tags["gpu"])) == (host, gpu)]
    assert all(p.fields["clock_event_reasons"] in (0, 1, 4) and p.fields["up"] == 1 for p in rows)
    assert not [e for e in mixed.by["gpu_event"] if (e.tags["host"], int(e.tags["gpu"])) == (host, gpu)]


@pytest.mark.slow
def test_gpu_lost_signature(mixed):
    ((host, gpu),) = mixed.truth_gpus("gpu_lost")
    lost_rows = mixed.gpus_with("gpu", lambda p: p.fields.get("health_code") == 2)
    assert lost_rows == {(host, gpu)}
    xid79 = [e for e in mixed.by["gpu_event"] if e.fields.get("code") == 79]
    assert {(e.tags["host"], int(e.tags["gpu"])) for e in xid79} == {(host, gpu)}
    t79 = xid79[0].time
    after = [
        p for p in mixed.by["gpu"] if (p.tags["host"], int(p.tags["gpu"])) == (host, gpu) and p.time > t79
    ]
    assert after and all(set(p.fields) == {"up", "health_code"} and p.fields["up"] == 0 for p in after)
    assert not [
        p
        for p in mixed.by["gpu_nvlink"]
        if (p.tags["host"], int(p.tags["gpu"])) == (host, gpu) and p.time > t79
    ]


@pytest.mark.slow
def test_straggler_slower_than_peers_without_reason(mixed):
    ((host, gpu),) = mixed.truth_gpus("straggler")
    r = next(r for r in mixed.truth if r.kind == "straggler")
    t0 = int(r.start * 1e9)
    by_t = defaultdict(dict)
    for p in mixed.by["gpu"]:
        if p.tags["host"] == host and p.time > t0 and "clock_sm_mhz" in p.fields:
            by_t[p.time][int(p.tags["gpu"])] = p.fields
    ratios = []
    for row in by_t.values():
        if (
            gpu in row
            and len(row) >= 4
            and all(f["utilization_gpu_ratio"] > 0.95 for g, f in row.items() if g != gpu)
        ):
            peers = np.median([f["clock_sm_mhz"] for g, f in row.items() if g != gpu])
            ratios.append(row[gpu]["clock_sm_mhz"] / peers)
            assert row[gpu]["clock_event_reasons"] == 0
    assert len(ratios) > 20 and np.median(ratios) < 0.92


@pytest.mark.slow
def test_memory_signatures(memory):
    mem_gpus = memory.truth_gpus("memory_errors")
    assert len(mem_gpus) == 6
    xid_gpus = {
        (e.tags["host"], int(e.tags["gpu"]))
        for e in memory.by["gpu_event"]
        if e.fields.get("code") in (48, 63, 64, 92, 94, 95)
    }
    assert xid_gpus == mem_gpus
    codes = {e.fields.get("code") for e in memory.by["gpu_event"]}
    assert {48, 63, 64, 79, 92, 94, 95} <= codes
    # every XID twice, as the agent reports it: the kernel log line, then the NVML event
    kmsg = [e for e in memory.by["gpu_event"] if e.tags["source"] == "kmsg"]
    nvml = [e for e in memory.by["gpu_event"] if e.tags["source"] == "nvml" and e.tags["type"] == "xid"]
    assert kmsg and all(e.tags["type"] == "xid" and e.fields["message"] for e in kmsg)
    assert not nvml  # the agent folds the NVML event of an XID into its kernel-log row: one row
    assert all(e.fields["pci_bus_id"] == e.fields["pci_bus_id"].lower() for e in kmsg)
    assert all(e.fields["severity"] in ("critical", "warning", "info") for e in kmsg)
    dbe_events = {
        (e.tags["host"], int(e.tags["gpu"])) for e in memory.by["gpu_event"] if e.tags["type"] == "ecc_dbe"
    }
    assert dbe_events == {(e.tags["host"], int(e.tags["gpu"])) for e in kmsg if e.fields["code"] == 48}
    dbe = memory.gpus_with("gpu", lambda p: p.fields.get("ecc_uncorrected_volatile_total", 0) > 0)
    modes = {(r.host, r.gpu): r.detail for r in memory.truth if r.kind == "memory_errors"}
    assert dbe == {k for k, d in modes.items() if "double-bit" in d}
    failed = memory.gpus_with("gpu", lambda p: p.fields.get("remapped_rows_failure") == 1)
    assert failed == {k for k, d in modes.items() if "failed row remap" in d}
    pending = memory.gpus_with("gpu", lambda p: p.fields.get("remapped_rows_pending") == 1)
    assert pending == {k for k, d in modes.items() if "pending" in d}
    assert {k for k, d in modes.items() if "double-bit" in d} <= pending
    storm = memory.gpus_with("gpu", lambda p: p.fields.get("ecc_corrected_volatile_total", 0) > 20)
    assert storm and storm <= mem_gpus
    for r in memory.truth:
        if r.kind == "memory_errors":
            hard = "double-bit" in r.detail or "failed" in r.detail
            assert r.severity == ("critical" if hard else "warning"), r.detail


@pytest.mark.slow
def test_healthy_fleet_at_full_load_never_thermal_throttles(tmp_path):
    f = tmp_path / "hot.toml"
    f.write_text(
        'name = "hot"\n[workload]\nbusy = 1.0\njob_hours = [2.0, 6.0]\n'
        "[nuisances]\ninlet_c = 30.0\ninlet_diurnal_c = 2.0\n"
    )
    p = Parsed(run_sim(tmp_path, str(f), nodes=4, duration=3 * 3600.0))
    gpu = p.by["gpu"]
    capped = [x for x in gpu if x.fields.get("clock_event_sw_power_cap") == 1]
    assert len(capped) > len(gpu) * 0.4  # heavy load: most samples pinned at the power cap
    for x in gpu:
        assert x.fields["clock_event_reasons"] & 0xE8 == 0
        assert x.fields["throttle_sw_thermal_ns_total"] == 0 and x.fields["throttle_hw_thermal_ns_total"] == 0
        assert x.fields["temperature_gpu_celsius"] < 87
    assert p.truth == []
    assert not p.by["gpu_event"]
    assert all(c.fields["passed"] == 1 for c in p.by["gpu_canary"])


@pytest.mark.slow
def test_chaos_nuisances_are_visible_but_not_in_truth(tmp_path):
    p = Parsed(run_sim(tmp_path, "chaos", nodes=16, duration=3 * 3600.0))
    nu = p.manifest["nuisances"]
    assert nu["driver_reloads"] and nu["agent_restarts"] and nu["late_batches"] and nu["node_churn"]
    # counter resets at driver reload: some healthy GPU's energy counter goes down
    energy = defaultdict(list)
    for x in p.by["gpu"]:
        if "energy_joules_total" in x.fields:
            energy[(x.tags["host"], x.tags["gpu"])].append((x.time, x.fields["energy_joules_total"]))
    resets = set()
    for k, v in energy.items():
        v.sort()
        if any(b[1] < a[1] for a, b in zip(v, v[1:], strict=False)):
            resets.add(k)
    reload_hosts = {e["host"] for e in nu["driver_reloads"]}
    assert resets and {h for h, _ in resets} <= reload_hosts
    # late data: timestamps go backwards somewhere in the file
    times = [x.time for x in p.by["host"]]
    assert any(b < a - 600e9 for a, b in zip(times, times[1:], strict=False))
    # nuisances land on faulty nodes too (as in a real fleet), node churn excepted (a node that is
    # not there has no fault to find); a cooling fault's throttling is its impact, not a record
    churn_hosts = {e["host"] for e in nu["node_churn"]}
    assert not {r.host for r in p.truth} & churn_hosts
    assert not [r for r in p.truth if r.kind == "thermal_throttle" and "no injected" not in r.detail]
    # no two points share a series and a timestamp (a database would keep only one)
    keys = [(m, tuple(sorted(x.tags.items())), x.time) for m, pts in p.by.items() for x in pts]
    assert len(keys) == len(set(keys))


@pytest.mark.parametrize(
    "args,msg",
    [
        (["--nodes", "0"], "nodes"),
        (["--duration", "5x"], "duration"),
        (["--duration", "0s"], "duration"),
        (["--step", "-1s"], "step"),
        (["--scenario", "nope"], "unknown scenario"),
    ],
)
@pytest.mark.slow
def test_bad_input_is_one_line_exit_2(tmp_path, capsys, args, msg):
    out = tmp_path / "o"
    assert main(["sim", "--out", str(out), *args]) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and msg in err
    assert not out.exists()


@pytest.mark.slow
def test_malformed_and_invalid_scenario_files(tmp_path, capsys):
    cases = {
        "x = [": "malformed",
        "[fleet]\nnodez = 3\n": "unknown key",
        '[[fault]]\nkind = "meteor"\n': "kind",
        '[[fault]]\nkind = "memory_errors"\nmode = "weird"\n': "mode",
        '[[fault]]\nkind = "sdc"\nonset = "soon"\n': "bad",
    }
    for i, (text, msg) in enumerate(cases.items()):
        f = tmp_path / f"s{i}.toml"
        f.write_text(text)
        assert main(["sim", "--scenario", str(f), "--out", str(tmp_path / f"o{i}"), "--duration", "10m"]) == 2
        err = capsys.readouterr().err
        assert msg in err, (text, err)
        assert not (tmp_path / f"o{i}").exists()


def test_unwritable_out_dir(tmp_path, capsys):
    blocker = tmp_path / "file"
    blocker.write_text("x")
    assert main(["sim", "--out", str(blocker / "sub"), "--duration", "10m"]) == 2
    other = tmp_path / "notsim"
    other.mkdir()
    (other / "precious.txt").write_text("keep")
    assert main(["sim", "--out", str(other), "--duration", "10m"]) == 2
    assert (other / "precious.txt").read_text() == "keep"


def test_cli_writes_all_files(tmp_path, capsys):
    out = tmp_path / "run"
    assert (
        main(
            [
                "sim",
                "--nodes",
                "2",
                "--gpus-per-node",
                "4",
                "--duration",
                "20m",
                "--seed",
                "3",
                "--scenario",
                "sdc",
                "--out",
                str(out),
            ]
        )
        == 0
    )
    m = json.loads((out / "manifest.json").read_text())
    assert m["fleet"]["gpus"] == 8 and m["seed"] == 3 and m["scenario"]["name"] == "sdc"
    assert m["steps"] == 120
    assert (out / "truth.jsonl").exists()


def test_every_builtin_scenario_loads():
    for name in scen.BUILTIN:
        sc = scen.load(name)
        Fleet(sc, seed=1, duration=3600.0, step=10.0, nodes=16)


def test_scenario_target_errors():
    sc = scen.load("healthy")
    sc.faults.append(scen.FaultSpec(kind="sdc", host="nosuchhost"))
    with pytest.raises(GpufleetError, match="no host"):
        Fleet(sc, seed=1, duration=3600.0, step=10.0, nodes=2)


@pytest.mark.slow
def test_thermal_scenario_scopes_and_early_signal(tmp_path):
    p = Parsed(run_sim(tmp_path, "thermal", nodes=8, duration=4 * 3600.0))
    cool = [r for r in p.truth if r.kind == "cooling_degradation"]
    node_r = [r for r in cool if r.host and r.gpu is None]
    rack_r = [r for r in cool if r.host is None]
    assert len(node_r) == 1 and len(rack_r) == 1 and rack_r[0].rack
    # node scope: its fan slows down; no other node's fan does
    slow_fans = {
        x.tags["host"] for x in p.by["bmc_sensor"] if x.tags["sensor"] == "FAN1" and x.fields["value"] < 7000
    }
    assert slow_fans == {node_r[0].host}
    # rack scope: the rack's inlet rises well above the others'
    inlet = defaultdict(list)
    for x in p.by["bmc_sensor"]:
        if x.tags["sensor"] == "Inlet Temp":
            inlet[x.tags["rack"]].append(x.fields["value"])
    hot = rack_r[0].rack
    assert max(inlet[hot]) - max(v for r, vals in inlet.items() if r != hot for v in vals) > 6
    # a mild degradation never throttles: impact_at null, no thermal_throttle record for it
    mild = [r for r in cool if r.gpu is not None and r.impact_at is None]
    assert mild and not {(r.host, r.gpu) for r in mild} & p.truth_gpus("thermal_throttle")
    # cooling faults that throttle run hotter than their peers before they throttle (the early signal)
    early = 0
    for r in cool:
        if r.gpu is None or r.impact_at is None or not r.detail.startswith("GPU heatsink"):
            continue
        t_lo, t_hi = int(max(r.impact_at - 1800, r.start) * 1e9), int(r.impact_at * 1e9)
        mine, peers = [], []
        for x in p.by["gpu"]:
            if (
                x.tags["host"] == r.host
                and t_lo <= x.time < t_hi
                and x.fields.get("clock_event_reasons") == 4
            ):
                (mine if int(x.tags["gpu"]) == r.gpu else peers).append(x.fields["temperature_gpu_celsius"])
        if mine and peers:
            assert np.median(mine) - np.median(peers) >= 5
            early += 1
    assert early >= 1


@pytest.mark.slow
def test_link_scenario_modes(tmp_path):
    p = Parsed(run_sim(tmp_path, "link", nodes=2, duration=3 * 3600.0))
    nv = [r for r in p.truth if r.kind == "nvlink_degradation"]
    assert len(nv) == 4 and all(r.link is not None for r in nv)
    last = {}
    for x in sorted(p.by["gpu_nvlink"], key=lambda x: x.time):
        last[(x.tags["host"], int(x.tags["gpu"]), int(x.tags["link"]))] = x.fields
    for r in nv:
        f = last[(r.host, r.gpu, r.link)]
        assert (f["up"] == 0) == (r.severity == "critical") == ("link down" in r.detail)
        assert f["crc_flit_errors_total"] > 0 and r.impact_at is not None
    down = [k for k, f in last.items() if f["up"] == 0]
    assert len(down) == 3
    xid74 = {(e.tags["host"], int(e.tags["gpu"])) for e in p.by["gpu_event"] if e.fields.get("code") == 74}
    assert xid74 == {k[:2] for k in down}
    pcie = {(r.host, r.gpu): r.detail for r in p.truth if r.kind == "pcie_degradation"}
    narrow = p.gpus_with("gpu", lambda x: x.fields.get("pcie_link_width", 16) < 16)
    oldgen = p.gpus_with("gpu", lambda x: x.fields.get("pcie_link_gen", 5) < 5)
    storms = p.gpus_with("gpu", lambda x: x.fields.get("pcie_replay_total", 0) > 100)  # not the background
    assert narrow == {k for k, d in pcie.items() if "width" in d}
    assert oldgen == {k for k, d in pcie.items() if "generation" in d}
    assert storms == {k for k, d in pcie.items() if "storm" in d} and len(storms) == 2
    assert all(
        x.fields["pcie_link_width_max"] == 16 for x in p.by["gpu"] if "pcie_link_width_max" in x.fields
    )


@pytest.mark.slow
def test_node_faults_idle_cooling_and_power_brake(tmp_path):
    """A node cooling failure on an idle node and a node-wide power brake: one node record each."""
    f = tmp_path / "nodes.toml"
    f.write_text(
        'name = "nodes"\n[workload]\nbusy = 0.95\n'
        '[[fault]]\nkind = "cooling_degradation"\nmode = "node_idle"\nonset = "40%"\n'
        '[[fault]]\nkind = "power_brake"\nmode = "node"\nonset = "30%"\n'
    )
    p = Parsed(run_sim(tmp_path, str(f), nodes=4, duration=3 * 3600.0))
    (cool,) = [r for r in p.truth if r.kind == "cooling_degradation"]
    (brake,) = [r for r in p.truth if r.kind == "power_brake"]
    assert cool.gpu is None and brake.gpu is None and cool.host != brake.host
    assert "idle node" in cool.detail and cool.impact_at is None  # an idle GPU does not throttle
    assert not [r for r in p.truth if r.kind == "thermal_throttle"]
    # the cooling node runs no job from 30 min before its onset; its fan falls to a critical state
    t_idle = int((cool.start - 1800) * 1e9)
    rows = [x for x in p.by["gpu"] if x.tags["host"] == cool.host and x.time > t_idle]
    assert rows and all(
        x.fields.get("clock_event_reasons", 1) & 0x1 for x in rows if "clock_event_reasons" in x.fields
    )
    fans = [x for x in p.by["bmc_sensor"] if x.tags["host"] == cool.host and x.tags["sensor"] == "FAN1"]
    assert (
        fans[0].fields["value"] > 9000
        and fans[-1].fields["value"] < 3000
        and fans[-1].fields["state_code"] == 2
    )
    # every GPU of the braked node brakes, and no GPU of another node
    braked = p.gpus_with("gpu", lambda x: x.fields.get("clock_event_reasons", 0) & 0x80)
    assert braked == {(brake.host, g) for g in range(8)}
