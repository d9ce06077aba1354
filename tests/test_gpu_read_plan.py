"""The GPU collector's reads come from the catalogue: each gpu / gpu_nvlink entry names its NVML
call (or field id, flag, or named reader) and its tier, and the collector does what it says."""

from __future__ import annotations

import dataclasses

import pytest
from gpufleet.agent.backends.sim import SimBackend, TinyNode
from gpufleet.agent.collectors import gpu as gpu_mod
from gpufleet.agent.collectors.gpu import PLAN, POLL_READERS, ROW_READERS, GpuCollector

from gpufleet import catalogue


def _planned() -> dict[str, str]:
    """catalogue field -> the tier the plan reads it in (calls, field batches, fallbacks)."""
    out = {}
    for tier, p in PLAN.items():
        for c in p["calls"]:
            for name, _, _, slow_only, bits in c.outs:
                out[name] = "slow" if slow_only else tier
                out.update({flag: out[name] for flag, _ in bits})
        out.update({name: tier for name in p["fields"].values()})
    return out


def test_every_gpu_entry_is_read_as_the_catalogue_says():
    planned = _planned()
    for m in catalogue.fields("gpu"):
        if m.reader in ("call", "field", "bit"):
            assert planned.get(m.field) == m.tier, m.field
        else:
            assert m.reader in POLL_READERS + ROW_READERS, m.field
            if m.reader in ROW_READERS:
                assert m.reader in PLAN[m.tier]["readers"]
                assert callable(getattr(GpuCollector, f"_read_{m.reader}"))
    for m in catalogue.fields("gpu_nvlink"):  # the link rows: their own reader and cadence
        assert m.reader == "nvlink" and m.tier == "nvlink"
    assert set(gpu_mod.NVLINK_THROUGHPUT) | {n for n, _ in gpu_mod.NVLINK_COUNTERS} | {"up"} == \
        {m.field for m in catalogue.fields("gpu_nvlink")}


def test_the_catalogue_tier_is_the_cadence():
    """On the simulated node: slow-tier fields on the first poll and each slow poll only; every
    field of an in-between poll is a fast-tier one."""
    tier = {m.field: m.tier for m in catalogue.fields("gpu")}
    t0 = 1_700_000_000.0
    clock = [t0]
    c = GpuCollector(SimBackend(TinyNode(t0=t0 - 3600)), slow_interval_s=60, clock=lambda: clock[0])
    polls = []
    for dt in (0.0, 1.0, 61.0):
        clock[0] = t0 + dt
        polls.append([s.fields for s in c.collect(int(clock[0] * 1e9)) if s.measurement == "gpu"])
    c.close()
    for first, between, slow in zip(*polls, strict=True):
        slow_fields = {f for f in first if tier[f] == "slow"}
        assert slow_fields and slow_fields <= set(slow)
        assert {tier[f] for f in between} == {"fast"}
        assert {f for f in first if tier[f] == "fast"} <= set(between) | set(gpu_mod.GPM_METRICS.values())


def _metric(name: str, **change):
    return dataclasses.replace(catalogue.by_key()[("gpu", name)], **change)


def test_a_changed_entry_changes_the_plan():
    metrics = [m if m.field != "clock_sm_max_mhz" else _metric("clock_sm_max_mhz", tier="fast")
               for m in catalogue.fields("gpu")]
    plan = gpu_mod._plan(metrics)
    fast = {c.key for c in plan["fast"]["calls"]}
    assert "nvmlDeviceGetMaxClockInfo(NVML_CLOCK_SM)" in fast
    assert "nvmlDeviceGetMaxClockInfo(NVML_CLOCK_SM)" not in {c.key for c in plan["slow"]["calls"]}


@pytest.mark.parametrize("change, says", [
    ({"args": ("NVML_NO_SUCH_CONSTANT",)}, "not an NVML constant"),
    ({"call": "", "read": "telepathy"}, "no reader 'telepathy'"),
    ({"tier": "event"}, "not one the GPU collector reads"),
])
def test_a_catalogue_entry_the_collector_cannot_read_is_an_error(change, says):
    with pytest.raises(catalogue.CatalogueError, match=says):
        gpu_mod._plan([_metric("clock_sm_mhz", **change)])


def test_a_gpu_entry_must_say_how_it_is_read():
    raw = {"measurement": "gpu", "field": "x_celsius", "otel": "x", "kind": "gauge", "unit": "Cel",
           "type": "float", "tier": "fast", "description": "x"}
    with pytest.raises(catalogue.CatalogueError, match="neither call, field_id, bit_of nor read"):
        catalogue.parse({"metric": [raw]})
    assert catalogue.parse({"metric": [dict(raw, call="nvmlDeviceGetX")]})[0].reader == "call"
