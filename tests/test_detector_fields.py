"""A detector reads what it names: every column a detector asks of a table is parsed.

The parser converts only the fields in ``gpufleet.analyzer.pipeline.FIELDS`` (the rest of a wide gpu row is
tokenized, never converted); a column missing from that list reads as all-NaN and the rule using it
silently does nothing (``power_limit_watts`` was missing, so thermal_throttle's ``load_share`` had no
effect). Every column any detector reads while analysing a simulated fleet that writes every field
the agent writes must be a column of the table it read it from.
"""

from __future__ import annotations

import numpy as np
import pytest
from gpufleet.analyzer.frame import Table
from gpufleet.analyzer.pipeline import Analyzer
from gpufleet.analyzer.sources import read_chunks

from gpufleet import catalogue
from gpufleet.cli import main
from gpufleet.lineprotocol import parse_line


@pytest.mark.slow
def test_every_field_a_detector_reads_is_parsed(tmp_path, monkeypatch, capsys):
    out = tmp_path / "sim"
    assert (
        main(
            [
                "sim",
                "--nodes",
                "2",
                "--duration",
                "40m",
                "--step",
                "10s",
                "--seed",
                "5",
                "--scenario",
                "mixed",
                "--out",
                str(out),
            ]
        )
        == 0
    )
    capsys.readouterr()
    written: dict[str, set[str]] = {}
    for chunk in read_chunks(out / "telemetry.lp.gz"):
        for line in chunk.decode().splitlines()[:2000]:
            p = parse_line(line)
            written.setdefault(p.measurement, set()).update(p.fields)
    read_missing: set[str] = set()
    read_all: set[str] = set()
    col, text = Table.col, Table.ffill_codes

    def spy_col(self, name):
        if len(self.t):
            read_all.add(name)
            if name not in self.cols:
                read_missing.add(name)
        return col(self, name)

    def spy_text(self, name):
        if len(self.t):
            read_all.add(name)
            if name not in self.text:
                read_missing.add(name)
        return text(self, name)

    monkeypatch.setattr(Table, "col", spy_col)
    monkeypatch.setattr(Table, "ffill_codes", spy_text)
    an = Analyzer()
    for chunk in read_chunks(out / "telemetry.lp.gz"):
        an.feed_bytes(chunk)
    an.finish()
    # fields some measurement of the catalogue has and the simulator wrote, read but not parsed
    known = {
        m.field for meas in ("gpu", "gpu_nvlink", "gpu_event", "gpu_canary") for m in catalogue.fields(meas)
    }
    sim_wrote = set().union(*written.values())
    unparsed = sorted(n for n in read_missing if n in known and n in sim_wrote)
    assert not unparsed, (
        f"detectors read fields the parser drops (add them to gpufleet.analyzer.pipeline.FIELDS): {unparsed}"
    )
    assert {"power_limit_watts", "temperature_gpu_celsius", "job_id"} <= read_all
    assert np.isfinite(an.reg.arrays()[0]).all()
