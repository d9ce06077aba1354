"""Contract tests over the detector registry (``gpufleet.analyzer.detectors.REGISTRY``): every detector,
present and future.

A detector declares its facts on its class (parameters, fields read, summary, severity, page
panels); the config's defaults, the parser's field list, the engine's summaries and the pages derive
them. Here: every field a detector reads is parsed and in the catalogue, every kind has an action
entry and a runbook, the core's ``KINDS`` is the registry's, and a new detector is one module plus
one registry line: a toy one, written as a module the analyzer has never seen, gets its defaults
into the config, its field parsed and its incident out of the engine.
"""

from __future__ import annotations

import importlib
import json
from pathlib import Path

import pytest
from gpufleet.analyzer import pipeline
from gpufleet.analyzer.alerting.actions import catalogue
from gpufleet.analyzer.alerting.pages import kind_panels
from gpufleet.analyzer.config import Config, detector_defaults
from gpufleet.analyzer.detectors import REGISTRY, Detector
from gpufleet.analyzer.engine import kind_severity, kind_summary

from gpufleet import catalogue as metrics
from gpufleet.lineprotocol import encode
from gpufleet.records import KINDS, SEVERITIES

ROOT = Path(__file__).resolve().parent.parent
RUNBOOKS = ROOT / "docs" / "runbooks"


def _catalogued(measurement: str) -> set[str]:
    return {m.field for m in metrics.fields(measurement)}


@pytest.mark.parametrize("kind", list(REGISTRY))
def test_every_field_a_detector_reads_is_parsed_and_in_the_catalogue(kind):
    cls = REGISTRY[kind]
    assert cls.kind == kind and issubclass(cls, Detector)
    parsed = pipeline.Analyzer().fields  # the analyzer's own list, as its parser gets it
    for meas, names in cls.fields.items():
        assert meas in metrics.measurements(), f"{kind} reads measurement {meas!r}, not in the catalogue"
        assert meas in pipeline.MEASUREMENTS, f"{kind} reads {meas!r}, which the pipeline never reads"
        assert isinstance(names, tuple) and names, f"{kind}: fields[{meas!r}] must be a non-empty tuple"
        missing = sorted(set(names) - _catalogued(meas))
        assert not missing, f"{kind} reads {meas} fields not in gpufleet/catalogue.toml: {missing}"
        # absent (None): the measurement is converted whole; else the field must be in its list
        unparsed = sorted(n for n in names if parsed.get(meas) is not None and n not in parsed[meas])
        assert not unparsed, f"{kind} reads {meas} fields the parser drops: {unparsed}"
    # its page plots catalogued signals
    for meas, field, label, mode in cls.panels:
        assert field in _catalogued(meas), (kind, meas, field)
        assert label and mode in ("value", "rate", "share"), (kind, field, mode)


def test_the_parser_reads_exactly_what_the_detectors_and_the_pipeline_read():
    want: dict[str, set] = {m: set(pipeline.OWN_FIELDS.get(m, ())) for m in pipeline.SELECTIVE}
    for cls in REGISTRY.values():
        for meas, names in cls.fields.items():
            if meas in want:
                want[meas] |= set(names)
    assert pipeline.FIELDS == want == pipeline.fields() == pipeline.Analyzer().fields
    # the wide gpu row: only what is read (the catalogue has far more fields)
    gpu = pipeline.FIELDS["gpu"]
    assert "power_limit_watts" in gpu and "job_id" in gpu and "energy_joules_total" not in gpu


@pytest.mark.parametrize("kind", list(REGISTRY))
def test_every_kind_has_a_summary_an_action_entry_and_a_runbook(kind):
    cls = REGISTRY[kind]
    assert cls.summary and kind_summary(kind) == cls.summary
    assert cls.severity in SEVERITIES and kind_severity(kind) == cls.severity
    assert kind_panels(kind) == cls.panels and cls.panels
    entry = catalogue()["kind"].get(kind)
    assert entry is not None, f"analyzer/alerting/actions.toml has no [kind.{kind}]"
    assert entry["runbook"] == f"{kind}.md"
    book = RUNBOOKS / f"{kind}.md"
    assert book.is_file(), f"no runbook docs/runbooks/{kind}.md"
    assert book.read_text().startswith(f"# {kind}")


def test_core_kinds_are_the_registrys():
    """``gpufleet.records.KINDS`` stays in the core (which never imports the analyzer); it must
    name the registry's kinds, in its order (there are no kinds without a detector today)."""
    assert tuple(KINDS) == tuple(REGISTRY)


@pytest.mark.parametrize("kind", list(REGISTRY))
def test_parameters_are_declared_once_and_pass_the_config_checks(kind):
    cls = REGISTRY[kind]
    defaults = detector_defaults()[kind]
    assert defaults == cls.params and defaults is not cls.params  # a copy: a config never edits a class
    assert set(cls.params).isdisjoint(cls.context)
    # every detector has the engine's timing keys
    assert {"dwell_seconds", "gap_seconds", "resolve_seconds"} <= set(cls.params)
    # the defaults pass the config's own checks (types and ranges), as if written in analyzer.toml
    cfg = Config()
    cfg.update({"detectors": {kind: json.loads(json.dumps(defaults))}}, "test")
    assert cfg.detectors[kind] == defaults
    # a detector built without arguments has them; the config's values override them
    det = cls()
    assert {k: getattr(det, k) for k in defaults} == defaults
    assert det.get_params().keys() == set(cls.params) | set(cls.context)


TOY = '''
"""toy_memory_hot: device memory hotter than ``max_celsius`` (a detector the analyzer has never seen)."""

import numpy as np

from gpufleet.analyzer.detectors.base import Detector


class MemoryHot(Detector):
    kind = "toy_memory_hot"
    params = {"max_celsius": 95.0, "dwell_seconds": 0.0, "gap_seconds": 35.0, "resolve_seconds": 600.0}
    fields = {"gpu": ("temperature_memory_celsius",)}
    summary = "device memory too hot"
    panels = (("gpu", "temperature_memory_celsius", "Memory temperature (°C)", "value"),)

    def score(self, window):
        return window.gpu.col("temperature_memory_celsius")

    def detect(self, window):
        tab = window.gpu
        sc = self.score(window)
        with np.errstate(invalid="ignore"):
            hot = sc > self.max_celsius
        return self._gpu_hits(window, tab, hot, sc, False,
                              lambda i: {"temperature_memory_celsius": float(sc[i])})
'''


def test_a_new_detector_is_one_module_and_one_registry_line(tmp_path, monkeypatch):
    """A detector module written here: its one registry line is all it takes for the config to
    accept its parameters, the parser to convert the field it reads (no other detector reads
    temperature_memory_celsius: without the derived field list it would be all-NaN) and the engine
    to open its incident with its summary."""
    (tmp_path / "toy_memory_hot.py").write_text(TOY)
    monkeypatch.syspath_prepend(str(tmp_path))
    cls = importlib.import_module("toy_memory_hot").MemoryHot
    assert cls.kind not in REGISTRY
    assert "temperature_memory_celsius" not in pipeline.fields()["gpu"]
    monkeypatch.setitem(REGISTRY, cls.kind, cls)  # the one registry line

    cfg = Config()
    assert cfg.detectors[cls.kind] == cls.params
    cfg.update({"detectors": {cls.kind: {"max_celsius": 90, "resolve_seconds": "10m"}}}, "test")
    an = pipeline.Analyzer(cfg)
    # converted by the parser, and asked of a store by the pull path
    assert "temperature_memory_celsius" in an.fields["gpu"] & an.wanted()["gpu"]
    t0 = 1_795_000_000
    lines = []
    for s in range(120):
        for g in range(2):
            mem = 92.0 if g == 1 and s >= 60 else 70.0
            tags = {"host": "node0", "gpu": str(g), "model": "NVIDIA H200", "cluster": "c1", "rack": "r0"}
            fields = {"utilization_gpu_ratio": 1.0, "power_watts": 600.0, "temperature_memory_celsius": mem}
            lines.append(encode("gpu", tags, fields, (t0 + 10 * s) * 10**9))
    an.feed_bytes(("\n".join(lines) + "\n").encode())
    an.finish()
    mine = [r for r in an.incidents() if r.kind == cls.kind]
    assert len(mine) == 1, [r.kind for r in an.incidents()]
    (r,) = mine
    assert (r.host, r.gpu, r.start, r.severity) == ("node0", 1, t0 + 600, "warning")
    assert r.summary.startswith("node0 GPU 1: device memory too hot")
    assert r.evidence["peak"]["temperature_memory_celsius"] == 92.0
    assert r.evidence["thresholds"]["max_celsius"] == 90  # the config's value reached the detector
    assert kind_panels(cls.kind) == cls.panels
