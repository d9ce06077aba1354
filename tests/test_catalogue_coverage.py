"""What the collectors emit matches the catalogue exactly: every field declared with its type,
and every declared gpu/gpu_nvlink/host/self field emitted by some recording or the simulator."""

from __future__ import annotations

import pytest
from gpufleet.agent.backends import get_backend
from gpufleet.agent.backends.recorded import RecordedBackend
from gpufleet.agent.backends.sim import TinyNode
from gpufleet.agent.cli import poll_once
from gpufleet.agent.collectors.gpu import GpuCollector
from gpufleet.agent.collectors.host import HostCollector

from gpufleet import catalogue
from tests.conftest import FIXTURES

REC = FIXTURES / "recordings"
RECORDINGS = sorted(REC.rglob("*.json")) + sorted(REC.rglob("*.xml"))
OWN = ("gpu", "gpu_nvlink", "host", "gpufleet_collector")
SUFFIX_UNIT = {"_celsius": "Cel", "_watts": "W", "_bytes": "By", "_mhz": "MHz", "_ratio": "1",
               "_ns_total": "ns", "_joules_total": "J", "_seconds": "s"}


def check(samples):
    """Every sample against the catalogue; returns the (measurement, field) pairs seen."""
    seen = set()
    for s in samples:
        assert s.measurement in catalogue.measurements(), s.measurement
        declared = {m.field: m for m in catalogue.fields(s.measurement)}
        assert set(s.tags) <= set(catalogue.IDENTITY_TAGS[s.measurement]), (s.measurement, s.tags)
        assert all(isinstance(v, str) and v for v in s.tags.values())
        for k, v in s.fields.items():
            assert k in declared, f"{s.measurement}.{k} is not in the catalogue"
            want = declared[k].python_type
            assert type(v) is want, f"{s.measurement}.{k}: {type(v).__name__}, catalogue says {want.__name__}"
            seen.add((s.measurement, k))
    return seen


def sources():
    for path in RECORDINGS:
        yield path.name, RecordedBackend(path)
    yield "sim", get_backend("sim", sim_node=TinyNode(t0=0.0))
    yield "sim-faults", get_backend("sim", sim_node=TinyNode(t0=0.0, lost=[1], stale=[2]))


def test_every_emitted_field_is_declared_and_every_declared_one_emitted():
    seen = set()
    for name, backend in sources():
        c = GpuCollector(backend)
        samples, problems = poll_once([c, HostCollector(first_sample_s=0.06)], now_ns=int(3700e9))
        more, problems2 = poll_once([c], now_ns=int(3701e9))  # GPM: a metric needs two samples
        c.close()
        assert problems == [] and problems2 == [], name
        seen |= check(samples) | check(more)
    for meas in OWN:
        declared = {m.field for m in catalogue.fields(meas)}
        emitted = {f for m, f in seen if m == meas}
        assert emitted == declared, f"{meas}: declared but never emitted: {sorted(declared - emitted)}"


@pytest.mark.parametrize("meas", OWN)
def test_units_named_in_field_names(meas):
    for m in catalogue.fields(meas):
        for suffix, unit in SUFFIX_UNIT.items():
            if m.field.endswith(suffix):
                assert m.unit == unit, f"{meas}.{m.field}: unit {m.unit}, name says {unit}"
        if m.kind == "counter":
            assert m.field.endswith("_total"), m.field


def test_schema_doc_covers_every_field_and_the_incident_measurement():
    from gpufleet.schema_doc import render

    text = render()
    for m in catalogue.load():
        assert f"| `{m.field}` | {m.type} | `{m.unit}` |" in text
    assert "## incident" in text and "| `state` | string |" in text and "| `end_ns` | int | `ns` |" in text


# The profiling-grade signals (GPM, thermal margin, PCIe link errors, perf-policy time) and what in
# a recording carries each: present exactly where the recording has the data, absent elsewhere.
GPM_FIELDS = ("sm_active_ratio", "sm_occupancy_ratio", "tensor_active_ratio",
              "dram_active_ratio", "pcie_tx_bytes_per_second", "pcie_rx_bytes_per_second")
NVLINK_GPM = ("nvlink_tx_bytes_per_second", "nvlink_rx_bytes_per_second")


def _recorded_has(path) -> dict[str, bool]:
    import json

    if path.suffix != ".json":
        return {"gpm": False, "margin": False, "slow_fields": False}
    doc = json.loads(path.read_text())
    if "rows" in doc:  # a GPM probe
        return {"gpm": doc["gpm_supported"] == 1, "margin": False,
                "slow_fields": all(doc["extra_fields"].get(str(f), [1])[0] == 0 for f in (75, 169, 183))}
    fields = {int(e["id"]): e for e in doc["fields"].values()}
    return {"gpm": False, "margin": bool(doc["calls"].get("nvmlDeviceGetMarginTemperature", {}).get("ok")),
            "slow_fields": all(fields.get(f, {}).get("ret") == 0 for f in (75, 169, 183))}


@pytest.mark.parametrize("path", RECORDINGS, ids=lambda p: p.name)
def test_new_signals_present_exactly_where_the_recording_has_them(path):
    from gpufleet.agent.collectors.gpu import SLOW_FIELD_IDS

    has = _recorded_has(path)
    c = GpuCollector(RecordedBackend(path))
    rows = []
    for t in (3700, 3701, 3702):
        samples, problems = poll_once([c], now_ns=int(t * 1e9))
        assert problems == []
        rows.append([s.fields for s in samples if s.measurement == "gpu"])
    c.close()
    first, later = rows[0][0], rows[2][0]
    for f in GPM_FIELDS:
        assert f not in first  # one sample: no interval yet
        assert (f in later) is has["gpm"], f
    for f in NVLINK_GPM:  # no recording here has NVLink links: left out, not 0
        assert f not in later
    assert ("temperature_margin_celsius" in later) is has["margin"]
    for name in SLOW_FIELD_IDS.values():  # slow tier: on the first poll
        assert (name in first) is has["slow_fields"], name
    if has["gpm"]:
        assert 0.0 <= later["sm_active_ratio"] <= 1.0 and later["pcie_rx_bytes_per_second"] > 0
