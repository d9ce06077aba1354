"""What the collectors emit matches the catalogue exactly: every field declared with its type,
and every declared gpu/gpu_nvlink/host/self field emitted by some recording or the simulator."""

from __future__ import annotations

import pytest

from agent.backends import get_backend
from agent.backends.recorded import RecordedBackend
from agent.backends.sim import TinyNode
from agent.cli import poll_once
from agent.collectors.gpu import GpuCollector
from agent.collectors.host import HostCollector
from gpufleet import catalogue
from tests.conftest import FIXTURES, ROOT

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
        c.close()
        assert problems == [], name
        seen |= check(samples)
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


def test_schema_doc_is_up_to_date():
    from gpufleet.schema_doc import render

    committed = (ROOT / "docs" / "schema.md").read_text()
    assert committed == render(), "stale: python -m gpufleet.schema_doc --write docs/schema.md"


def test_schema_doc_covers_every_field_and_the_incident_measurement():
    from gpufleet.schema_doc import render

    text = render()
    for m in catalogue.load():
        assert f"| `{m.field}` | {m.type} | `{m.unit}` |" in text
    assert "## incident" in text and "| `state` | string |" in text and "| `end_ns` | int | `ns` |" in text
