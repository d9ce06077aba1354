"""The detectors on the profiling-grade signals: GPM SM activity (straggler) and thermal margin
(cooling): the new evidence changes decisions, and without it the detectors decide as before."""

from __future__ import annotations

import numpy as np
import pytest
from gpufleet.analyzer.config import Config
from gpufleet.analyzer.pipeline import Analyzer

from gpufleet.lineprotocol import encode

T0 = 1_790_000_000
STEP = 10


def analyse(data: bytes):
    an = Analyzer(Config())
    an.feed_bytes(data)
    an.finish()
    return an.incidents()


def job_fleet(case: str, gpm: bool, nodes=4, gpus=8, steps=540, seed=5) -> bytes:
    """Four nodes, one job each, at the power cap. On node1 from step 120 on:

    - ``"straggler"``: GPU 3 is a gray failure (clock 13 % below its peers, power down, no reason
      bit); the job meets at every collective, so its peers wait ~13 % of the time (SM ~0.84 of its);
    - ``"wait"``: the collective-wait nuisance: GPU 3 computes at the power cap while its 7 peers
      spin in a collective (utilization 100 %, ~270 W, clocks up, SM ~3 %).
    ``gpm``: the rows carry ``sm_active_ratio`` (else: a fleet without GPM).
    """
    rng = np.random.default_rng(seed)
    out = []
    for s in range(steps):
        t = (T0 + s * STEP) * 10**9
        for n in range(nodes):
            for g in range(gpus):
                on = n == 1 and s >= 120
                p, clock, sm, reasons = 690 + rng.normal(0, 2), 1500 + 15 * rng.integers(-1, 2), 0.96, 0x4
                if on and case == "straggler":
                    if g == 3:
                        p, clock, reasons = 600 + rng.normal(0, 2), 1305, 0x0
                    else:
                        sm = 0.96 * 0.87 + 0.03 * 0.13
                elif on and case == "wait" and g != 3:
                    p, clock, sm, reasons = 270 + rng.normal(0, 2), 1980, 0.03, 0x0
                f = {
                    "utilization_gpu_ratio": 1.0,
                    "power_watts": round(p, 2),
                    "temperature_gpu_celsius": int(round(25 + 0.04 * p + rng.normal(0, 0.3))),
                    "temperature_slowdown_celsius": 89,
                    "clock_sm_mhz": int(clock),
                    "clock_event_reasons": reasons,
                    "up": 1,
                    "health_code": 0,
                    "job_id": f"job{n}",
                }
                if gpm:
                    f["sm_active_ratio"] = round(sm + rng.normal(0, 0.004), 4)
                tags = {"host": f"node{n}", "gpu": str(g), "model": "NVIDIA H200", "rack": f"r{n // 2}"}
                out.append(encode("gpu", tags, f, t))
    return ("\n".join(out) + "\n").encode()


def stragglers(data: bytes):
    return [(i.host, i.gpu, i.evidence) for i in analyse(data) if i.kind == "straggler"]


@pytest.mark.slow
def test_collective_wait_is_no_straggler_with_gpm_or_without():
    """The one GPU computing while its peers wait runs a slower clock than theirs; GPM shows its
    peers waiting the whole interval, and without GPM its power (690 W against their 270 W) shows
    it doing more work than they do, not the same work slower: not a straggler either way."""
    assert stragglers(job_fleet("wait", gpm=False)) == []
    assert stragglers(job_fleet("wait", gpm=True)) == []


@pytest.mark.slow
def test_a_real_straggler_is_found_with_gpm_and_its_peers_waiting_in_the_evidence():
    got = stragglers(job_fleet("straggler", gpm=True))
    assert [(h, g) for h, g, _ in got] == [("node1", 3)]
    ev = got[0][2]["first"]  # the first hit's evidence
    assert "sm_active_ratio" in ev["signals"] and 1.05 < ev["sm_active_vs_peers"] < 1.3
    assert [(h, g) for h, g, _ in stragglers(job_fleet("straggler", gpm=False))] == [("node1", 3)]


@pytest.mark.slow
def test_a_gpu_waiting_on_its_peers_is_not_a_straggler():
    """Slow clock and power against its peers, but its SM activity far below theirs: it waits."""
    data = job_fleet("straggler", gpm=True).decode()
    # node1 GPU 3 idles in the collective instead: SM activity 0.03 while the peers compute
    lines = []
    for ln in data.splitlines():
        if ",gpu=3," in ln and "host=node1" in ln and "sm_active_ratio=0.9" in ln:
            ts = int(ln.rsplit(" ", 1)[1])
            if ts >= (T0 + 120 * STEP) * 10**9:
                ln = ln.replace("sm_active_ratio=0.9", "sm_active_ratio=0.0")
        lines.append(ln)
    assert stragglers(("\n".join(lines) + "\n").encode()) == []


def cooling_fleet(ramp_c_per_min: float, margin: bool, nodes=4, gpus=8, steps=600, seed=3) -> bytes:
    """Steady load; node1 GPU 2's cooling degrades from step 200, its temperature climbing
    ``ramp_c_per_min`` at the same power. ``margin``: rows carry the thermal margin (88 - T)."""
    rng = np.random.default_rng(seed)
    offset = rng.normal(0, 1.0, (nodes, gpus))
    out = []
    for s in range(steps):
        t = (T0 + s * STEP) * 10**9
        for n in range(nodes):
            for g in range(gpus):
                p = 690 + rng.normal(0, 2)
                temp = 25 + offset[n, g] + 0.04 * p + rng.normal(0, 0.3)
                if n == 1 and g == 2 and s >= 200:
                    temp += min(ramp_c_per_min * (s - 200) * STEP / 60, 30.0)
                temp = int(round(min(temp, 87)))
                f = {
                    "utilization_gpu_ratio": 1.0,
                    "power_watts": round(p, 2),
                    "power_limit_watts": 700.0,
                    "temperature_gpu_celsius": temp,
                    "clock_sm_mhz": 1500,
                    "temperature_slowdown_celsius": 89,
                    "clock_event_reasons": 0x4,
                }
                if margin:
                    f["temperature_margin_celsius"] = 88 - temp
                out.append(encode("gpu", {"host": f"node{n}", "gpu": str(g), "rack": f"r{n // 2}"}, f, t))
    return ("\n".join(out) + "\n").encode()


def cooling(data: bytes):
    return [i for i in analyse(data) if i.kind == "cooling_degradation"]


@pytest.mark.parametrize("margin", [False, True])
@pytest.mark.slow
def test_fast_cooling_loss_is_critical_when_the_margin_says_throttling_is_near(margin):
    (inc,) = cooling(cooling_fleet(1.0, margin))  # 1 °C/min: ~30 °C of margin gone in half an hour
    assert (inc.host, inc.gpu) == ("node1", 2)
    if margin:
        assert inc.severity == "critical"  # raised once fewer than 30 min were left
        ev = inc.evidence["first"]  # the first hit's evidence
        assert "temperature_margin_celsius" in ev["signals"] and 0 < ev["minutes_to_throttling"] < 60
    else:
        assert inc.severity == "warning"  # no margin: no time to throttling, the decision as before


@pytest.mark.slow
def test_slow_cooling_drift_with_a_wide_margin_stays_a_warning():
    (inc,) = cooling(cooling_fleet(0.15, True))  # hours from throttling
    assert inc.severity == "warning" and inc.evidence["first"]["minutes_to_throttling"] > 30
