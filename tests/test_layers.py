"""Layers do not reach across: no private imports between packages, facts read from the catalogue."""

from __future__ import annotations

import ast
from importlib import resources
from pathlib import Path

import pytest
from gpufleet.analyzer.store import incident_lines

from gpufleet import catalogue
from gpufleet.errors import GpufleetError
from gpufleet.lineprotocol import parse_line
from gpufleet.records import Record

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("agent", "analyzer", "dashboards", "gpufleet")


@pytest.mark.slow
def test_no_module_imports_a_private_name_of_another_package():
    bad = []
    for pkg in PACKAGES:
        for f in (ROOT / pkg).rglob("*.py"):
            for node in ast.walk(ast.parse(f.read_text(), str(f))):
                if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                    parts = node.module.split(".")
                    other = parts[1] if parts[0] == "gpufleet" and len(parts) > 1 else parts[0]
                    if parts[0] == "gpufleet" and other not in PACKAGES:
                        other = "gpufleet"  # the core package itself
                    if other in PACKAGES and other != pkg:
                        bad += [f"{f.relative_to(ROOT)}: {node.module}.{a.name}"
                                for a in node.names if a.name.startswith("_") and not a.name.startswith("__")]
    assert not bad, bad


def test_incident_measurement_is_the_catalogue_one():
    inc = catalogue.incident()
    assert inc.writer == "analyzer" and "incident" not in catalogue.IDENTITY_TAGS
    firing = Record(kind="gpu_lost", start=1.7e9, end=None, host="n1", gpu=3, link=None, severity="critical",
                    id="i1", summary="GPU 3 lost", cluster="c", rack="r1")
    resolved = Record(kind="nvlink_degradation", start=1.7e9, end=1.7e9 + 60, host="n2", gpu=None, link=4,
                      severity="warning", id="i2", summary="link 4 errors")
    lines = incident_lines([firing, resolved])
    assert len(lines) == 2
    names = {n for n, *_ in inc.fields}
    for line in lines:
        p = parse_line(line)
        assert p.measurement == "incident" and p.time == 1_700_000_000_000_000_000
        assert set(p.tags) <= set(inc.tags) and set(p.fields) <= names
    assert "state=\"firing\"" in lines[0] and "cluster=c" in lines[0] and "gpu=3i" in lines[0]
    assert "state=\"resolved\"" in lines[1] and "duration_seconds=60" in lines[1]


def test_identity_tags_come_from_the_catalogue_file():
    import tomllib

    doc = tomllib.loads((ROOT / "gpufleet" / "catalogue.toml").read_text())
    for m in catalogue.measurements():
        assert catalogue.IDENTITY_TAGS[m] == tuple(doc["measurement"][m]["tags"])
        assert catalogue.MEASUREMENTS[m].rows


def test_one_xid_catalogue_loader_in_the_core_and_a_missing_one_is_an_error(monkeypatch, tmp_path):
    from gpufleet.agent.collectors import xid

    from gpufleet.sim import engine

    table = catalogue.xids()
    assert table[79]["severity"] and engine.xid_catalogue() is table  # the simulator: the one loader
    assert not hasattr(xid, "xid_catalogue")  # the agent: no loader of its own
    for path in (ROOT / "gpufleet").rglob("*.py"):  # the core never reads the agent's package files
        assert 'files("agent")' not in path.read_text(), path
    catalogue.xids.cache_clear()
    monkeypatch.setattr(resources, "files", lambda pkg: tmp_path)  # a package folder without the file
    try:
        with pytest.raises(GpufleetError, match="XID catalogue.*installation is incomplete"):
            engine.xid_catalogue()
    finally:
        monkeypatch.undo()
        catalogue.xids.cache_clear()
