"""A site's life is not a fault: a node of another GPU generation, an operator's power cap and a warmer
rack raise no page, while a real fault on the same node, in the same fleet, is paged once. The cap
and the warm rack are each one informational record (never paged), the other generation none.

Each fleet comes from the simulator (gpufleet.sim) with the site's life placed on the faulty node
(its rack), then goes through ``gpufleet analyze`` and ``gpufleet eval`` as any fleet does."""

from __future__ import annotations

import gzip
import json

import numpy as np
import pytest
from gpufleet.analyzer.evaluate import matches

from gpufleet import records
from gpufleet.cli import main
from gpufleet.sim import scenario as scen
from gpufleet.sim.engine import generate
from gpufleet.sim.fleet import Fleet
from gpufleet.sim.physics import PHASE_CODE
from gpufleet.times import parse_time

HOURS = 3


def _fleet(tmp_path, toml: str, seed: int = 7, life=None, hours: float = HOURS) -> tuple[list, list]:
    """(truth, incidents) of a 4-node fleet from scenario text ``toml``; ``life(fleet)`` places the
    site's life before the fleet runs."""
    path = tmp_path / "site.toml"
    path.write_text(toml)
    fl = Fleet(scen.load(str(path)), seed=seed, duration=hours * 3600.0, step=10.0, nodes=4, gpus_per_node=8)
    if life is not None:
        life(fl)
    out = tmp_path / "sim"
    generate(fl, out, progress=False)
    inc = tmp_path / "incidents.jsonl"
    assert main(["analyze", "--input", str(out / "telemetry.lp.gz"), "--out", str(inc)]) == 0
    return records.read(out / "truth.jsonl"), records.read(inc)


def _heatsink(host: str, gpu: int, onset: str, fleet: str, *more: tuple[str, int, str]) -> str:
    """Scenario text: the ``[fleet]`` line ``fleet``, and ``host`` GPU ``gpu``'s heatsink degrading
    (severity 1.2) from ``onset`` (and each of ``more``: (host, gpu, onset))."""
    return f"[fleet]\n{fleet}\n" + "".join(
        f'[[fault]]\nkind = "cooling_degradation"\nhost = "{h}"\ngpu = {g}\nseverity = 1.2\nonset = "{o}"\n'
        for h, g, o in ((host, gpu, onset), *more)
    )


def _warm_rack(fl) -> None:
    """Rack r001 steps to 7 °C above the room an hour in and stays there."""
    fl.warm = np.zeros(fl.n_racks)
    fl.warm[0] = 7.0
    fl.warm_from = np.full(fl.n_racks, -300.0)
    fl.warm_from[0] = 3600.0


def _jobs(fl, timelines: list[list[tuple[float, str]]], jobs: list[int]) -> None:
    """Node n runs job ``jobs[n]`` (40 GiB) through the phases ``timelines[n]`` ((time, phase), the
    first one idle, before its job starts): the fleet's own jobs replaced."""
    fl.jobs, fl.job_mem = {}, {}
    for job in set(jobs):
        nodes = [n for n, j in enumerate(jobs) if j == job]
        start = min(timelines[n][1][0] for n in nodes)
        fl.jobs[job] = {"nodes": nodes, "start": start, "end": fl.duration + 1, "mem": 40 << 30}
        fl.job_mem[job] = 40 << 30
    fl.seg_t = [np.array([float(t) for t, _ in tl]) for tl in timelines]
    fl.seg_phase = [np.array([PHASE_CODE[p] for _, p in tl], dtype=np.int8) for tl in timelines]
    fl.seg_job = [
        np.array([0] + [j] * (len(tl) - 1), dtype=np.int64) for tl, j in zip(timelines, jobs, strict=True)
    ]


def _one_page_per_fault(truth, incidents, capsys=None, notes_once: bool = True):
    """Every truth record paged by exactly one incident; no other incident but informational ones,
    at most one per node or rack (``notes_once``; a chaos fleet's own life writes more)."""
    assert truth, "the fleet has its fault"
    pages = [r for r in incidents if r.severity != "info"]
    for tr in truth:
        hit = [r for r in pages if matches(r, tr)]
        assert len(hit) == 1, (tr, [r.summary for r in pages])
    extra = [r for r in pages if not any(matches(r, tr) for tr in truth)]
    assert not extra, [r.summary for r in extra]
    info = [(r.host, r.rack) for r in incidents if r.severity == "info"]
    assert len(info) == len(set(info)) or not notes_once


@pytest.mark.slow
def test_a_node_of_another_generation_is_judged_by_its_own_model(tmp_path):
    # gpu0001 is an A100 (400 W, a steeper °C per W) among H200s; one of its GPUs' heatsinks degrades
    toml = _heatsink("gpu0001", 3, "25%", 'generations = [["NVIDIA A100-SXM4-80GB", 0.25]]')

    def life(fl):
        assert fl.model_of(0).name == "NVIDIA A100-SXM4-80GB"
        assert fl.model_of(8).name == "NVIDIA H200"

    truth, incidents = _fleet(tmp_path, toml, life=life)
    _one_page_per_fault(truth, incidents)
    cooling = [r for r in incidents if r.kind == "cooling_degradation"]
    ev = cooling[0].evidence["peak"]
    assert ev["model"] == "NVIDIA A100-SXM4-80GB" and ev["baseline"].startswith("own model")
    # its 400 W limit is its own model's, not a limit below the H200s' 700 W: no note either
    assert not [r for r in incidents if r.severity == "info"], [r.summary for r in incidents]


def test_a_model_learned_while_its_jobs_ran_memory_bound_is_not_hot_once_they_compute(tmp_path):
    # the A100 node's job runs memory-bound (its HBM takes part of the power: the die runs cooler per
    # W) through the windows its model's slope is learned in, with a minute of compute among them,
    # then compute-bound; the H200 nodes compute from the start. A slope fitted to power alone comes
    # out near 0.05 °C/W (the A100's heatsink: 0.08) and the node paged once it computed.
    toml = _heatsink("gpu0001", 3, "50%", 'generations = [["NVIDIA A100-SXM4-80GB", 0.25]]')

    def life(fl):
        assert fl.model_of(0).name == "NVIDIA A100-SXM4-80GB"
        a100 = [(0, "idle"), (350, "setup"), (390, "memory"), (540, "compute"), (600, "memory")]
        a100.append((1500, "compute"))
        h200 = [(0, "idle"), (200, "setup"), (240, "compute")]
        _jobs(fl, [a100] + [h200] * 3, [42000] * 4)

    truth, incidents = _fleet(tmp_path, toml, life=life, hours=1.5)
    # its heatsink fault (half-way) pages once; the node itself, computing, does not
    _one_page_per_fault(truth, incidents)
    (page,) = [r for r in incidents if r.kind == "cooling_degradation"]
    assert page.gpu == 3 and page.evidence["peak"]["model"] == "NVIDIA A100-SXM4-80GB"
    assert 0.07 <= page.evidence["peak"]["slope_c_per_w"] <= 0.09  # the A100's heatsink (r_fast + r_slow)


def test_a_model_s_slope_learned_from_its_first_window_is_refitted_from_its_settled_hours(tmp_path):
    # two A100 nodes among H200s: gpu0002's job alternates compute and memory-bound work in the
    # first minutes (the window its model's slope is first fitted on reads 0.06 °C/W: the die lags
    # the power and the memory-bound minutes run it cooler), gpu0001 idles 40 min (its baselines
    # learned at idle) and then computes at full power for two hours. The slope is refitted on the
    # settled rows of the model's first hours towards its heatsink's (0.08); a heatsink fault on
    # gpu0002 late in the run still pages once, and nothing else does.
    toml = _heatsink("gpu0002", 3, "70%", 'generations = [["NVIDIA A100-SXM4-80GB", 0.5]]')

    def life(fl):
        assert fl.model_of(0).name == fl.model_of(8).name == "NVIDIA A100-SXM4-80GB"
        early = [(0, "idle"), (200, "setup"), (240, "compute"), (400, "memory"), (460, "compute"),
                 (600, "memory"), (640, "compute")]
        late = [(0, "idle"), (2400, "setup"), (2440, "compute")]
        _jobs(fl, [late, early, early, early], [42001, 42000, 42000, 42000])

    truth, incidents = _fleet(tmp_path, toml, life=life)
    _one_page_per_fault(truth, incidents)
    (page,) = [r for r in incidents if r.kind == "cooling_degradation"]
    assert page.evidence["peak"]["model"] == "NVIDIA A100-SXM4-80GB"
    assert 0.07 <= page.evidence["peak"]["slope_c_per_w"] <= 0.09  # not the first window's 0.06


@pytest.mark.slow
def test_an_operator_power_cap_is_no_straggler_and_a_slow_gpu_beside_it_is(tmp_path):
    # the operator caps gpu0002 at ~70 % of 700 W for most of the run; GPU 5 of it is a real straggler
    toml = """
[workload]
job_nodes = [2, 4]
[[fault]]
kind = "straggler"
host = "gpu0002"
gpu = 5
onset = "20%"
"""

    def life(fl):
        fl.power_caps = [(1, 0.1 * fl.duration, fl.duration + 1, 0.7)]

    truth, incidents = _fleet(tmp_path, toml, life=life)
    _one_page_per_fault(truth, incidents)
    page = next(r for r in incidents if r.kind == "straggler")
    ev = page.evidence["peak"]
    if "power_limit_watts" in ev:  # (where its job spans an uncapped node)
        assert (ev["power_limit_watts"], ev["peers_power_limit_watts"]) == (500, 700)
    # the cap is in the telemetry as the agent writes it: the limit and the SW power-cap bit
    lines = [ln for ln in _gpu_lines(tmp_path / "sim", "gpu0002") if "power_limit_watts=500.0" in ln]
    assert lines and any("clock_event_sw_power_cap=1i" in ln for ln in lines)
    # worth telling someone: one informational record for the node, from when the cap began
    (note,) = [r for r in incidents if r.severity == "info"]
    assert (note.kind, note.host, note.gpu) == ("power_limit_below_peers", "gpu0002", None)
    assert note.evidence["peak"]["setting"] == "power limit 500 W (peers 700 W)"
    assert note.evidence["peak"]["gpus"] == list(range(8))
    t0 = truth[0].start - 0.2 * HOURS * 3600  # the run's start (the fault's onset at 20 %)
    assert abs(note.start - (t0 + 0.1 * HOURS * 3600)) <= 120  # it begins with the cap


@pytest.mark.slow
def test_a_warm_rack_is_its_own_baseline_and_a_hot_gpu_in_it_still_pages(tmp_path):
    # rack r001 (gpu0001, gpu0002) steps to 7 °C above the room an hour in and stays there (the room's
    # doing, no GPU near its limits); one GPU's heatsink degrades in it
    toml = _heatsink("gpu0001", 6, "25%", "nodes_per_rack = 2")
    truth, incidents = _fleet(tmp_path, toml, life=_warm_rack)
    _one_page_per_fault(truth, incidents)
    # a facility note for the rack, once its inlet is steadily above the other rack's (the room)
    (note,) = [r for r in incidents if r.severity == "info"]
    assert (note.kind, note.host, note.rack) == ("inlet_above_room", None, "r001")
    ev = note.evidence["peak"]
    assert 6.0 <= ev["above_room_celsius"] <= 8.0 and ev["setting"].startswith("rack r001 inlet ")
    t0 = truth[0].start - 0.25 * HOURS * 3600  # the run's start (the fault's onset at 25 %)
    assert note.start >= t0 + 3600 + 1800  # the step an hour in: a note once its inlet no longer rises


def test_gpus_at_their_limits_by_their_own_faults_do_not_make_a_warm_rack_a_page(tmp_path):
    # rack r001 (gpu0001, gpu0002) steps to 7 °C above the room an hour in, and a GPU on each of its
    # two nodes loses its heatsink: both run at their slowdown limit. That is two GPU faults, not
    # the room's heat reaching the rack (which pages a rack incident and takes the GPUs' pages in):
    # each GPU is paged once, the rack only gets its note.
    toml = _heatsink("gpu0001", 6, "40%", "nodes_per_rack = 2", ("gpu0002", 3, "45%"))
    truth, incidents = _fleet(tmp_path, toml, life=_warm_rack)
    _one_page_per_fault(truth, incidents)
    racks = [r.summary for r in incidents if r.severity != "info" and r.host is None]
    assert not racks, racks


def _gpu_lines(out, host: str) -> list[str]:
    import gzip

    with gzip.open(out / "telemetry.lp.gz", "rt") as f:
        return [ln for ln in f if ln.startswith("gpu,") and f"host={host}," in ln]


@pytest.mark.slow
def test_mixed_generations_and_operator_life_in_the_healthy_scenario(tmp_path):
    sc = scen.load("healthy")
    assert sc.fleet["generations"] and sc.nuisances["power_caps"] and sc.nuisances["warm_racks"]
    fl = Fleet(sc, seed=3, duration=3600.0, step=10.0, nodes=8, gpus_per_node=2)
    names = {fl.model_of(g).name for g in range(fl.n)}
    assert names == {"NVIDIA H200", "NVIDIA A100-SXM4-80GB"}
    out = tmp_path / "sim"
    generate(fl, out, progress=False)
    man = json.loads((out / "manifest.json").read_text())
    assert set(man["fleet"]["models"].values()) == {"NVIDIA A100-SXM4-80GB"}
    assert man["nuisances"]["power_caps"] and man["nuisances"]["warm_racks"]


@pytest.mark.slow
def test_no_baseline_is_learned_from_a_raw_level_most_of_the_fleet_is_not_in(tmp_path):
    """The healthy fleet of seed 162735600 (32 nodes, its first 80 min): rack r002 of A100s runs
    5 °C warm all day, among H200s (three quarters of the fleet). In the fleet's first window only
    the A100s' slope is learned (the H200s' power has not moved yet), so that window's raw level is
    the A100s' own; gpu0007, idle then, learned its idle baseline from it, then was judged in the
    fleet's frame: a false node page, 6 °C "hot" at 58 W, when it went idle again. Nothing but
    informational records. (The chaos fleet of the next test has its A100s, a quarter, wait 70 min
    for their slope: the others learn meanwhile, or its sudden heatsink loss is found an hour late.)"""
    out = tmp_path / "sim"
    assert main(["sim", "--scenario", "healthy", "--nodes", "32", "--duration", "6h", "--step", "10s",
                 "--seed", "162735600", "--compress-level", "1", "--out", str(out), "--no-progress"]) == 0
    man = json.loads((out / "manifest.json").read_text())
    assert man["fleet"]["models"]["gpu0007"] == "NVIDIA A100-SXM4-80GB"
    assert "r002" in man["nuisances"]["warm_racks"]
    end = int(parse_time(man["start"]) + 80 * 60) * 10**9
    with gzip.open(out / "telemetry.lp.gz", "rb") as f:
        head = [line for line in f if int(line.rsplit(b" ", 1)[1]) < end]
    (tmp_path / "head.lp").write_bytes(b"".join(head))
    inc = tmp_path / "incidents.jsonl"
    assert main(["analyze", "--input", str(tmp_path / "head.lp"), "--out", str(inc)]) == 0
    got = records.read(inc)
    assert not [r.summary for r in got if r.severity != "info"]
    info = [(r.host, r.rack) for r in got if r.severity == "info"]
    assert info and len(info) == len(set(info))


@pytest.mark.slow
def test_a_model_s_high_power_baseline_learned_after_its_first_one_is_in_the_same_frame(tmp_path):
    """The chaos fleet of seed 1760211093 (16 nodes x 6 h): rack r004 is its only rack of H100s,
    among H200s and A100s, warm all day, with a true node fan failure on gpu0013. The H100s' first
    baselines are learned in the fleet's first minutes from the model's raw level (their frame:
    the H100s' level above the fleet's, 5.6 °C); their high-power baselines later, while they are
    judged against those. Taken in no frame, that level came back as excess once they froze: three
    false node pages in r004 (gpu0014, gpu0015, gpu0016). Every fault is paged once and nothing
    else (the chaos' own informational records aside)."""
    out = tmp_path / "sim"
    assert main(["sim", "--scenario", "chaos", "--nodes", "16", "--duration", "6h", "--step", "10s",
                 "--seed", "1760211093", "--compress-level", "1", "--out", str(out), "--no-progress"]) == 0
    inc = tmp_path / "incidents.jsonl"
    assert main(["analyze", "--input", str(out / "telemetry.lp.gz"), "--out", str(inc)]) == 0
    models = json.loads((out / "manifest.json").read_text())["fleet"]["models"]
    assert {models[f"gpu00{n}"] for n in range(13, 17)} == {"NVIDIA H100 80GB HBM3"}
    _one_page_per_fault(records.read(out / "truth.jsonl"), records.read(inc), notes_once=False)


@pytest.mark.slow
def test_an_idle_baseline_is_learned_against_idle_peers_judged_by_their_own_idle_baselines(tmp_path):
    """The chaos fleet of seed 103 (16 nodes x 6 h): H100s in a warm rack (r001), A100s (r004) and
    H200s. An idle GPU judged against its all-load baseline, learned under load, reads its model's
    idle level off the line its slope draws (an A100 idle 6 °C above it); the idle band's common
    mode over a mix of such GPUs and GPUs with idle baselines moves with who is idle. gpu0012's idle
    baselines were learned where the idle band was mostly the former, and it was paged at 02:12,
    idle and 5.5 °C "hot", once the band was of the latter; so was gpu0004 at 02:42. With idle
    baselines learned only against peers judged by theirs, gpu0013 (A100s gone idle for the first
    time at 02:42, no idle baselines yet) read 6-8 °C "hot" until its model's gap between its idle
    and load baselines was taken from the A100s holding both. Every fault is paged once and nothing
    else (the chaos' own informational records aside)."""
    out = tmp_path / "sim"
    assert main(["sim", "--scenario", "chaos", "--nodes", "16", "--duration", "6h", "--step", "10s",
                 "--seed", "103", "--compress-level", "1", "--out", str(out), "--no-progress"]) == 0
    man = json.loads((out / "manifest.json").read_text())
    assert man["fleet"]["models"]["gpu0013"] == "NVIDIA A100-SXM4-80GB"
    assert "gpu0012" not in man["fleet"]["models"]  # (the fleet's own model, the H200)
    assert "r001" in man["nuisances"]["warm_racks"]
    inc = tmp_path / "incidents.jsonl"
    assert main(["analyze", "--input", str(out / "telemetry.lp.gz"), "--out", str(inc)]) == 0
    _one_page_per_fault(records.read(out / "truth.jsonl"), records.read(inc), notes_once=False)
