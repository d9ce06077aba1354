"""Which job was hit: incidents carry the job ids on their GPUs during the incident."""

from __future__ import annotations

import gzip
import re

import numpy as np
import pytest
from gpufleet.analyzer.alerting import write_pages
from gpufleet.analyzer.jobs import JobLog

from gpufleet import records
from gpufleet.cli import main
from gpufleet.records import Record


def rec(host="n1", gpu=0, start=1000.0, end=None, kind="sdc"):
    return Record(kind=kind, host=host, gpu=gpu, link=None, start=start, end=end, severity="critical")


def test_joblog_spans_overlap_node_and_rack_scope():
    log = JobLog(slack_seconds=30)
    obj = lambda *xs: np.array(xs, dtype=object)  # noqa: E731
    # GPU 0: job 7 until t=500, then job 8 from t=600; GPU 1: job 9; GPU 2: no job (None)
    log.add(np.array([0, 0, 0, 0, 1, 1, 2]), np.array([100., 500, 600, 2000, 100, 2000, 100]),
            obj("7", "7", "8", "8", "9", "9", None))
    host, idx = ["n1", "n1", "n1"], [0, 1, 2]
    a, b, c, d = rec(start=1000, end=1200), rec(start=300, end=450), rec(gpu=None, start=1000), \
        rec(host=None, gpu=None)
    e = rec(gpu=2, start=1000)
    log.annotate([a, b, c, d, e], host, idx)
    assert a.jobs == ["8"] and b.jobs == ["7"]
    assert c.jobs == ["9", "8"]  # the node's GPUs, in first-seen order; job 7 ended before
    assert d.jobs == [] and e.jobs == []
    # a job seen last at 500 still counts 30 s later (sampled field), not 31 s later
    assert log.jobs([0], 530, 540) == ["7"] and log.jobs([0], 531, 540) == []
    # bounded: old spans are dropped, at most per_gpu jobs per GPU
    small = JobLog(keep_seconds=100, per_gpu=2)
    for i in range(5):
        small.add(np.array([0]), np.array([i * 10.0]), obj(str(i)))
    assert list(small.spans[0]) == ["3", "4"]
    small.add(np.array([1]), np.array([5000.0]), obj("x"))
    assert 0 not in small.spans and small.spans[1] == {"x": [5000.0, 5000.0]}


@pytest.mark.slow
def test_analyzer_incidents_name_the_jobs_the_telemetry_shows(tmp_path, capsys):
    out = tmp_path / "sim"
    assert main(["sim", "--nodes", "4", "--duration", "3h", "--step", "10s", "--seed", "7",
                 "--scenario", "mixed", "--out", str(out)]) == 0
    inc = tmp_path / "inc.jsonl"
    assert main(["analyze", "--input", str(out / "telemetry.lp.gz"), "--out", str(inc)]) == 0
    capsys.readouterr()
    # the truth from the raw lines: (host, gpu) -> [(t, job)]
    seen: dict = {}
    with gzip.open(out / "telemetry.lp.gz", "rt") as f:
        for line in f:
            job = re.search(r'[ ,]job_id="([^"]+)"', line)
            if line.startswith("gpu,") and job:
                tags = line.split(" ", 1)[0]
                host, gpu = re.search(r",host=([^,]+)", tags)[1], int(re.search(r",gpu=(\d+)", tags)[1])
                seen.setdefault((host, gpu), []).append((int(line.rsplit(" ", 1)[1]) / 1e9, job[1]))
    incs = records.read(inc)
    with_jobs = 0
    for r in incs:
        if r.host is None:
            assert r.jobs == []
            continue
        end = r.end if r.end is not None else np.inf
        want = {j for (h, g), pts in seen.items() if h == r.host and (r.gpu is None or g == r.gpu)
                for t, j in pts if r.start - 90 <= t <= end + 90}
        assert set(r.jobs) == want, (r.kind, r.host, r.gpu)
        with_jobs += bool(r.jobs)
    assert with_jobs >= 3  # the scenario puts faults on busy GPUs
    assert any(not r.jobs for r in incs)  # and on idle ones: no job is named there
    # the pages of these incidents name the job (or say none ran) and stay small
    some = [r for r in incs if r.jobs][:1] + [r for r in incs if not r.jobs and r.host][:1]
    assert len(some) == 2
    written = write_pages(some, out / "telemetry.lp.gz", tmp_path / "pages")
    for r in some:
        (page,) = [p for p in written if p.name.startswith(f"incident-{r.id}-")]
        html = page.read_text()
        assert page.stat().st_size <= 500_000
        if r.jobs:
            assert f"<tr><th>Job</th><td>{', '.join(r.jobs)}</td></tr>" in html
        else:
            assert "no job\nrecorded on the affected GPUs" in html
