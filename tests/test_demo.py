"""``gpufleet demo`` end to end, small: agents play the simulated nodes through the real pipeline
(gpu, xid and canary collectors, OpenTelemetry, the file exporter), the analyzer finds every fault
the fleet injected, as it does on the simulator's own file."""

from __future__ import annotations

import gzip
import json
import re
import subprocess
import sys
from pathlib import Path
from urllib.parse import unquote, urlsplit

import pytest

from tests.agent_support import ROOT


@pytest.mark.slow
def test_demo_finds_every_injected_fault_through_the_agents(tmp_path):
    out = tmp_path / "demo"
    # one agent at a time: the second starts while the first one's segment is still open
    r = subprocess.run([sys.executable, "-m", "gpufleet.cli", "demo", "--nodes", "2", "--duration", "2h",
                        "--parallel", "1", "--no-progress", "--json", "--out", str(out)],
                       capture_output=True, text=True, cwd=ROOT, timeout=600)
    assert r.returncode == 0, r.stderr[-2000:]
    table, _, js = r.stdout.rpartition("\n{")
    scores = json.loads("{" + js)
    truth = [json.loads(line) for line in (out / "fleet" / "truth.jsonl").read_text().splitlines()]
    kinds = {t["kind"] for t in truth}
    # the mixed scenario puts one of each kind in a 2-node, 2-hour fleet (NVLink, SDC, a GPU lost
    # mid-run, memory errors through XIDs, ...)
    assert {"sdc", "gpu_lost", "memory_errors", "nvlink_degradation", "power_brake", "straggler"} <= kinds
    for k in kinds:
        d = scores["per_kind"][k]
        assert d["detected"] == d["truths"], (k, d)
        assert d["false_incidents"] == 0, (k, d)
    assert scores["recall"] == 1.0 and scores["precision"] == 1.0
    for k in kinds:
        assert k in table
    # the signals came from the agents: their rows, with the node's labels, in every node's store file
    store = list((out / "store").glob("gpufleet-*.lp*"))
    assert {p.name.split("-")[1] for p in store} == {"gpu0001", "gpu0002"}
    text = "".join((gzip.open(p, "rt") if p.suffix == ".gz" else open(p)).read() for p in store)
    for m in ("gpu_event,", "gpu_canary,", "gpu_nvlink,", "gpufleet_collector,"):
        assert m in text, m
    assert ",rack=" in text and "source=nvml" in text
    assert text.count("\ngpu,") + text.startswith("gpu,") == 2 * 720 * 8  # every poll of every GPU
    assert "could not start" not in (out / "logs" / "agent-gpu0001.log").read_text()
    # every stage reports what it did and how long it took (a bar on a terminal, a line otherwise)
    for stage in ("fleet:", "agents:", "analyzer:", "pages:"):
        assert re.search(rf"^  {stage} .* in \d+\.\d s$", r.stderr, re.M), (stage, r.stderr[-2000:])
    # every alert it printed links a runbook that exists; every page links the copy beside it
    links = re.findall(r"runbook: (\S+)", r.stdout + r.stderr)
    assert links and all(Path(unquote(urlsplit(u).path)).is_file() for u in links), links
    for page in (out / "pages").glob("incident-*.html"):
        for href in re.findall(r'id="runbook" href="([^"]+)"', page.read_text()):
            assert (page.parent / href).is_file(), href


@pytest.mark.slow
def test_demo_progress_bars_through_every_stage(tmp_path):
    """--progress (a terminal's default) draws a bar for the agents, the analyzer and the pages."""
    r = subprocess.run([sys.executable, "-m", "gpufleet.cli", "demo", "--nodes", "1", "--duration", "30min",
                        "--progress", "--out", str(tmp_path / "demo")],
                       capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert r.returncode == 0, r.stderr[-2000:]
    for bar in ("agents:", "analyzer:", "pages:"):
        assert re.search(rf"{bar} +\d+%?", r.stderr) or f"{bar} " in r.stderr, (bar, r.stderr[-1500:])


@pytest.mark.slow
def test_demo_through_a_real_influxdb(tmp_path, influxdb):
    """With --influx-url the agents write through the spool into InfluxDB 1.6.7 (v1 /write) and the
    analyzer reads the fleet back with InfluxQL."""
    out = tmp_path / "demo"
    r = subprocess.run([sys.executable, "-m", "gpufleet.cli", "demo", "--nodes", "1", "--duration", "1h",
                        "--no-progress", "--json", "--out", str(out), "--influx-url", influxdb.url,
                        "--influx-db", "demo"], capture_output=True, text=True, cwd=ROOT, timeout=180)
    assert r.returncode == 0, r.stderr[-2000:]
    scores = json.loads(r.stdout[r.stdout.rindex("\n{") + 1:])
    assert scores["overall"]["detected"] >= 1 and scores["overall"]["false_incidents"] == 0
    n = influxdb.query('SELECT count("power_watts") FROM "gpu"', db="demo")["results"][0]["series"][0]
    assert n["values"][0][1] == 360 * 8  # every poll of every GPU, through the spool
    assert not list((out / "store").glob("gpufleet-*.lp*"))  # nothing went to the file store
