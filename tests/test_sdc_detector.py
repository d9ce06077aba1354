"""The sdc detector's confirmation rules, the canary's memory pattern as a memory fault, and the
warning for a GPU the canary has not checked for twice its max_age."""

from __future__ import annotations

import pytest
from gpufleet.analyzer.config import Config
from gpufleet.analyzer.pipeline import Analyzer

from gpufleet.lineprotocol import encode

T0 = 1_795_000_000


def gpu_rows(n_gpus: int, steps: int, step: int) -> list[str]:
    out = []
    for s in range(steps):
        for g in range(n_gpus):
            f = {"utilization_gpu_ratio": 0.0, "power_watts": 80.0, "temperature_gpu_celsius": 30,
                 "clock_sm_mhz": 345, "clock_event_reasons": 1, "temperature_slowdown_celsius": 89,
                 "pcie_link_gen": 5, "pcie_link_gen_max": 5, "pcie_link_width": 16, "pcie_link_width_max": 16,
                 "up": 1, "health_code": 0, "ecc_corrected_volatile_total": 0,
                 "ecc_uncorrected_volatile_total": 0}
            out.append(encode("gpu", tags(g), f, (T0 + s * step) * 10**9))
    return out


def tags(g: int) -> dict:
    return {"host": "node0", "gpu": str(g), "model": "NVIDIA H200", "cluster": "c1", "rack": "r0"}


def canary(g: int, t: float, **fields) -> str:
    base = {"passed": 1, "mismatches": 0, "memory_mismatches": 0, "checks": 1, "checks_failed": 0,
            "duration_seconds": 0.2, "digest": "a" * 64}
    return encode("gpu_canary", tags(g), {**base, **fields}, int(t * 1e9))


def analyse(lines: list[str]):
    an = Analyzer(Config())
    an.feed_bytes(("\n".join(lines) + "\n").encode())
    an.finish()
    return an.incidents()


def test_confirmed_unconfirmed_reference_only_and_memory():
    lines = gpu_rows(5, 60, 10)
    t = T0 + 100
    lines += [canary(g, t - 300) for g in range(5)]  # first answers, all good
    lines += [
        canary(0, t, passed=0, mismatches=17, checks=3, checks_failed=3),  # confirmed: critical
        canary(1, t, passed=0, mismatches=4, checks=2, checks_failed=1),  # recheck passed: warning
        canary(2, t, passed=0, reference_match=0),  # fleet reference only: warning, named cause
        canary(3, t, passed=0, memory_mismatches=5, checks=3, checks_failed=3),  # memory, not SDC
    ]
    incs = {(i.kind, i.gpu): i for i in analyse(lines)}
    assert set(incs) == {("sdc", 0), ("sdc", 1), ("sdc", 2), ("memory_errors", 3)}
    crit = incs[("sdc", 0)]
    assert crit.severity == "critical" and crit.evidence["peak"]["failed_of"] == "3 of 3 checks failed"
    assert "3 of 3 checks failed" in crit.summary
    assert abs(crit.start - t) < 1
    warn = incs[("sdc", 1)]
    assert warn.severity == "warning" and warn.evidence["peak"]["failed_of"] == "1 of 2 checks failed"
    assert not warn.evidence["peak"]["confirmed"]
    ref = incs[("sdc", 2)]
    assert ref.severity == "warning" and "driver/engine" in ref.evidence["peak"]["cause"]
    mem = incs[("memory_errors", 3)]
    assert mem.severity == "critical" and mem.evidence["peak"]["memory_mismatches"] == 5


def test_two_unconfirmed_failures_on_one_gpu_are_confirmed():
    lines = gpu_rows(1, 120, 10)
    lines += [canary(0, T0 + 100, passed=0, mismatches=2, checks=2, checks_failed=1),
              canary(0, T0 + 700, passed=0, mismatches=3, checks=2, checks_failed=1)]
    (inc,) = analyse(lines)
    assert inc.kind == "sdc" and inc.severity == "critical"


@pytest.mark.slow
def test_a_gpu_unchecked_for_twice_max_age_is_a_warning():
    step = 120
    steps = int(13 * 3600 / step)  # 13 h of idle telemetry
    lines = gpu_rows(3, steps, step)
    lines += [canary(0, T0 + h * 3600 + 30) for h in range(13)]  # GPU 0: every hour
    lines.append(canary(1, T0 + 30))  # GPU 1: once, at the start; GPU 2: never
    incs = [i for i in analyse(lines) if i.kind == "canary_unchecked"]
    by_gpu = {i.gpu: i for i in incs}
    assert set(by_gpu) == {1, 2} and all(i.severity == "warning" for i in incs)
    assert by_gpu[1].start >= T0 + 12 * 3600 and by_gpu[1].evidence["first"]["never_checked"] is False
    assert by_gpu[2].evidence["first"]["never_checked"] is True
    # a fleet without any canary is not warned about
    assert [i for i in analyse(gpu_rows(2, steps, step)) if i.kind == "canary_unchecked"] == []
