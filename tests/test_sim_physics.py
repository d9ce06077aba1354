"""The simulator's single-GPU physics against the real H200 trace (tests/fixtures/h200_trace.csv).

Tolerances (also in docs/calibration.md): power RMSE <= 15 W over the whole trace, GPU
temperature RMSE <= 1.5 °C, memory temperature RMSE <= 1.5 °C; power at the cap within 5 W of
the real 691 W with reason 0x4 and SM clock 1470-1530 MHz; memory-bound within 10 W of 566 W
at 1980 MHz; GPU temperature's fast step done within 1 s, slow creep 1-6 °C over the next minute.
"""

from __future__ import annotations

import numpy as np
import pytest

from gpufleet.sim.calibration import errors, load_trace, phases_of, simulate
from gpufleet.sim.physics import (
    H200,
    HW_POWER_BRAKE,
    HW_SLOWDOWN,
    HW_THERMAL,
    IDLE,
    PHASE_CODE,
    SW_POWER_CAP,
    SW_THERMAL,
    Physics,
)
from tests.conftest import FIXTURES

COMPUTE = PHASE_CODE["compute"]


@pytest.fixture(scope="module")
def trace():
    tr = load_trace(FIXTURES / "h200_trace.csv")
    return tr, simulate(tr)


@pytest.mark.slow
def test_fit_errors_within_tolerance(trace):
    tr, sim = trace
    e = errors(tr, sim)
    assert e["power_rmse_w"] <= 15
    assert e["temperature_gpu_rmse_c"] <= 1.5
    assert e["temperature_memory_rmse_c"] <= 1.5
    assert abs(e["gemm_power_w"] - e["gemm_power_real_w"]) <= 5
    assert abs(e["memory_power_w"] - e["memory_power_real_w"]) <= 10
    assert abs(e["gemm_clock_mhz"] - e["gemm_clock_real_mhz"]) <= 30
    assert abs(e["energy_error_share"]) <= 0.02


def test_power_cap_is_reason_0x4_and_healthy(trace):
    tr, sim = trace
    ph = sim["phase"]
    gemm = np.nonzero(ph == COMPUTE)[0][10:]  # settled: after the first second
    assert np.all(sim["reasons"][gemm] == SW_POWER_CAP)
    clk = sim["clock_sm"][gemm]
    assert 1470 <= np.percentile(clk, 5) and np.percentile(clk, 95) <= 1530
    assert np.all(sim["power"][gemm] <= H200.power_limit)
    # the real trace says the same thing
    assert np.all(tr["clk_reasons"][gemm] == SW_POWER_CAP)
    mem = np.nonzero(ph == PHASE_CODE["memory"])[0][10:]
    assert np.all(sim["clock_sm"][mem] == 1980) and np.all(sim["reasons"][mem] == 0)
    idle = np.nonzero(ph == PHASE_CODE["idle"])[0][5:]
    assert np.all(sim["reasons"][idle] == IDLE) and abs(np.median(sim["power"][idle]) - 79.4) < 3
    clocked = np.nonzero(ph == PHASE_CODE["setup"])[0]
    assert abs(np.median(sim["power"][clocked]) - 122) < 3


def test_temperature_time_constants(trace):
    tr, sim = trace
    t = tr["t"]
    start = t[np.argmax(phases_of(tr) == COMPUTE)]
    T = sim["temperature_gpu"]

    def at(x):
        return T[np.searchsorted(t, start + x)]

    jump = at(5) - at(-0.5)
    assert jump >= 15  # 39 -> ~58 °C
    assert at(1.0) - at(-0.5) >= 0.9 * jump  # fast component: <= 1 s
    assert 1 <= at(58) - at(3) <= 6  # slow creep over a minute (real: 58 -> 61)
    # memory temperature: a quick part, then a slow lag (real: 38 -> 46 in 2 s, 50 at 10 s, 52 at 30 s)
    Tm, real = sim["temperature_memory"], tr["mem_temp_c"]
    i0, i2, i10, i50 = (np.searchsorted(t, start + x) for x in (-0.5, 2, 10, 50))
    for series in (Tm, real):
        rise = series[i50] - series[i0]
        assert 0.3 * rise <= series[i2] - series[i0] <= 0.8 * rise
        assert series[i10] - series[i0] <= 0.95 * rise
    assert abs((Tm[i10] - Tm[i0]) - (real[i10] - real[i0])) <= 2


def run_const(g: float, step: float, seconds: float, phase=COMPUTE, brake=False, inlet=25.0):
    p = Physics(1, H200, inlet)
    rng = np.random.default_rng(0)
    one = np.ones(1)
    outs = []
    for _ in range(int(round(seconds / step))):
        outs.append(
            p.step(
                step, np.array([phase]), one, np.array([g]), np.array([inlet]), np.array([brake]), one, rng
            )
        )
    return p, outs


@pytest.mark.slow
def test_long_steps_match_short_steps():
    """Sub-step dynamics are solved exactly: 10 s steps land where 0.1 s steps do."""
    p10, o10 = run_const(1.0, 10.0, 300)
    p01, o01 = run_const(1.0, 0.1, 300)
    assert abs(p10.temp[0] - p01.temp[0]) < 0.3
    assert abs(p10.energy_j[0] - p01.energy_j[0]) / p01.energy_j[0] < 0.01
    assert abs(p10.t_cap[0] - p01.t_cap[0]) < 11


@pytest.mark.slow
def test_thermal_throttle_only_when_cooling_cannot_hold_the_power():
    # healthy cooling at a hot inlet: capped, never thermal
    p, outs = run_const(1.0, 10.0, 1800, inlet=32.0)
    assert all(o["reasons"][0] == SW_POWER_CAP for o in outs[1:])
    assert p.t_swth[0] == 0 and p.t_hwth[0] == 0
    # degraded cooling: SW thermal holds ~87 °C, clocks drop, the counter integrates the throttled time
    p10, outs10 = run_const(2.3, 10.0, 1800)
    late = outs10[-30:]
    assert all(o["reasons"][0] & SW_THERMAL and not o["reasons"][0] & SW_POWER_CAP for o in late)
    assert all(85.5 <= o["temperature_gpu"][0] <= 88.5 for o in late)
    assert np.mean([o["clock_sm"][0] for o in late]) < 1450
    assert np.mean([o["power"][0] for o in late]) < 680
    p1, _ = run_const(2.3, 1.0, 1800)
    assert abs(p10.t_swth[0] - p1.t_swth[0]) / p1.t_swth[0] < 0.15
    assert p10.t_swth[0] > 1200
    # a cooling collapse the SW controller cannot hold: HW slowdown
    _, outs = run_const(9.0, 10.0, 600)
    assert any(o["reasons"][0] & (HW_THERMAL | HW_SLOWDOWN) == HW_THERMAL | HW_SLOWDOWN for o in outs)


def test_power_brake_bits_and_clocks():
    p, outs = run_const(1.0, 10.0, 120, brake=True)
    o = outs[-1]
    assert o["reasons"][0] & (HW_POWER_BRAKE | HW_SLOWDOWN) == HW_POWER_BRAKE | HW_SLOWDOWN
    assert o["clock_sm"][0] <= 450 and o["power"][0] < 200
    assert abs(p.t_brake[0] - 120) < 1e-6
