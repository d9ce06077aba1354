"""gpufleet analyze: files, the real H200 trace, shards, bad input, and a real InfluxDB 1.6.7."""

from __future__ import annotations

import gzip
import json
import re
import subprocess
import sys
import time
import tomllib
from pathlib import Path
from urllib.parse import unquote, urlsplit

import pytest
import requests
from gpufleet.analyzer.h200 import convert
from gpufleet.analyzer.pipeline import Analyzer, shard_of

from gpufleet import records
from gpufleet.cli import main
from tests.fleets import T0, fleet
from tests.servers import InfluxDB1, free_port, skip_unless

FIXTURES = Path(__file__).parent / "fixtures"


@pytest.mark.slow
def test_real_h200_trace_has_no_incidents(tmp_path, capsys):
    lines = convert(FIXTURES / "h200" / "trace.csv")
    assert len(lines) == 1454
    lp = tmp_path / "h200.lp"
    lp.write_text("\n".join(lines) + "\n")
    out = tmp_path / "inc.jsonl"
    assert main(["analyze", "--input", str(lp), "--out", str(out), "--stats"]) == 0
    assert out.read_text() == ""
    stats = json.loads(capsys.readouterr().err.strip().splitlines()[-1])
    assert stats["gpu_samples"] == 1454 and stats["bad_lines"] == 0
    # the trace is pinned at the power cap (0x4) under GEMM: healthy, not throttling
    assert any("clock_event_sw_power_cap=1i" in ln for ln in lines)


@pytest.mark.slow
def test_directory_gzip_and_garbage(tmp_path):
    data = fleet(fault=("sdc", 1, 2, 95), steps=200)
    d = tmp_path / "lp"
    d.mkdir()
    half = data.index(b"\n", len(data) // 2) + 1
    (d / "a.lp").write_bytes(data[:half] + b"this is not line protocol\n")
    with gzip.open(d / "b.lp.gz", "wb") as f:
        f.write(data[half:])
    out = tmp_path / "inc.jsonl"
    assert main(["analyze", "--input", str(d), "--out", str(out)]) == 0
    incs = records.read(out)
    assert [(i.kind, i.host, i.gpu) for i in incs] == [("sdc", "node1", 2)]


@pytest.mark.slow
def test_shards_cover_every_host_once_and_find_the_same(tmp_path):
    data = fleet(nodes=6, fault=("gpu_lost", 4, 1, 120), steps=240)
    full = Analyzer()
    full.feed_bytes(data)
    full.finish()
    want = sorted((i.kind, i.host, i.gpu, i.start) for i in full.incidents())
    hosts = {f"node{n}" for n in range(6)}
    got, seen = [], []
    for i in range(3):
        an = Analyzer(shard=(i, 3))
        an.feed_bytes(data)
        an.finish()
        got += [(r.kind, r.host, r.gpu, r.start) for r in an.incidents()]
        seen += [(h, i) for h in an.reg.hosts]
    assert sorted(h for h, _ in seen) == sorted(hosts)  # every host in exactly one shard
    assert all(shard_of(h, 3) == i for h, i in seen)  # the stable hash decides which
    assert len({i for _, i in seen}) > 1
    assert sorted(got) == want and want


@pytest.mark.parametrize(
    "argv,needle",
    [
        (["analyze", "--input", "/nonexistent/telemetry.lp.gz"], "no such file"),
        (["analyze"], "exactly one of"),
        (["analyze", "--input", "x", "--shard", "3/2"], "--shard"),
        (["analyze", "--influx-url", "http://127.0.0.1:9", "--influx-db", "x", "--since", "1h"],
         "unreachable"),
        (["analyze", "--input", "x", "--config", "/nonexistent.toml"], "no such config"),
    ],
)
def test_bad_input_is_one_line_exit_2(argv, needle, capsys):
    if "--influx-url" in argv:
        argv = [a.replace(":9", f":{free_port()}") for a in argv]
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert needle in err and len(err.splitlines()) == 1


def test_bad_config_values(tmp_path, capsys):
    cfg = tmp_path / "a.toml"
    cfg.write_text("[detectors.thermal_throttle]\nmin_share = 'lots'\n")
    assert main(["analyze", "--input", "x", "--config", str(cfg)]) == 2
    assert "min_share" in capsys.readouterr().err
    cfg.write_text("[detectors.nope]\n")
    assert main(["analyze", "--input", "x", "--config", str(cfg)]) == 2


@skip_unless("influxd")
def test_influxdb_batch_matches_files_and_bad_database(tmp_path, capsys):
    data = fleet(fault=("memory_errors", 2, 3, 100), steps=240)
    with InfluxDB1(tmp_path / "influx") as db:
        db.create_db("fleet")
        db.write("fleet", data)
        out = tmp_path / "inc.jsonl"
        start, end = str(T0 - 10), str(T0 + 240 * 10 + 10)
        assert (
            main(
                [
                    "analyze",
                    "--influx-url",
                    db.url,
                    "--influx-db",
                    "fleet",
                    "--start",
                    start,
                    "--end",
                    end,
                    "--out",
                    str(out),
                ]
            )
            == 0
        )
        got = [(i.kind, i.host, i.gpu, i.start) for i in records.read(out)]
        an = Analyzer()
        an.feed_bytes(data)
        an.finish()
        assert got == [(i.kind, i.host, i.gpu, i.start) for i in an.incidents()] and got
        # one summary line on what was done
        assert re.match(rf"analyze: \d+ rows, 16 GPUs, .* \(0\.\d h\), {len(got)} incident",
                        capsys.readouterr().err)
        assert main(["analyze", "--influx-url", db.url, "--influx-db", "nope", "--since", "1h"]) == 2
        err = capsys.readouterr().err.strip()
        assert "does not exist" in err and len(err.splitlines()) == 1


@pytest.mark.slow
@skip_unless("influxd")
def test_follow_writes_incidents_and_survives_a_restart(tmp_path):
    now = int(time.time())
    t0 = now - 40 * 60
    data = fleet(fault=("sdc", 1, 2, 95), steps=230, t0=t0)
    with InfluxDB1(tmp_path / "influx") as db:
        db.create_db("fleet")
        db.write("fleet", data)
        proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "gpufleet",
                "analyze",
                "--follow",
                "--influx-url",
                db.url,
                "--influx-db",
                "fleet",
                "--since",
                "45m",
                "--poll",
                "1s",
                "--grace",  # the data after the restart is written up to 20 s after its time
                "25s",
            ],
            stdout=subprocess.DEVNULL,
            stderr=open(tmp_path / "err", "w"),
            text=True,
        )
        err = tmp_path / "err"
        try:
            rows = _wait_incident(db, 60)
            assert rows, "no incident written back"
            cols, vals = rows["columns"], rows["values"][0]
            point = dict(zip(cols, vals, strict=True))
            assert point["kind"] == "sdc" and point["host"] == "node1" and point["gpu"] == 2
            assert point["state"] == "firing" and point["severity"] == "critical" and point["id"]
            assert abs(point["time"] / 1e9 - (t0 + 950)) < 60
            # the 40 minutes are read at batch speed, then it follows: InfluxDB goes away meanwhile
            deadline = time.monotonic() + 60
            while "caught up" not in err.read_text() and time.monotonic() < deadline:
                time.sleep(0.2)
            db.stop()  # down until the analyzer has met it down (a busy analysis step can outlast seconds)
            deadline = time.monotonic() + 30
            while "retrying" not in err.read_text() and time.monotonic() < deadline:
                time.sleep(0.2)
            db.start()
            # a GPU lost after the restart is found too: the process kept its state and retried
            t1 = t0 + 230 * 10
            steps = (int(time.time()) - t1) // 10 + 2  # up to now: the data arrives live
            more = fleet(fault=("gpu_lost", 3, 0, steps - 3), steps=steps, t0=t1)
            db.write("fleet", more)
            deadline = time.monotonic() + 40
            kinds = set()
            while time.monotonic() < deadline and "gpu_lost" not in kinds:
                r = _wait_incident(db, 5)
                kinds = {dict(zip(r["columns"], v, strict=True))["kind"] for v in r["values"]} if r else set()
            assert "gpu_lost" in kinds
            assert proc.poll() is None
        finally:
            proc.terminate()
            proc.wait(20)
        assert "retrying" in err.read_text()


def _wait_incident(db, seconds):
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        try:
            res = db.query("SELECT * FROM incident", db="fleet")["results"][0]
        except requests.RequestException:
            res = {}
        if res.get("series"):
            return res["series"][0]
        time.sleep(0.5)
    return None


@pytest.mark.slow
def test_console_sink_pages_each_incident_once(tmp_path, capsys):
    data = fleet(fault=("sdc", 1, 2, 95), steps=200)
    lp = tmp_path / "a.lp"
    lp.write_bytes(data)
    state = tmp_path / "state.db"
    argv = [
        "analyze",
        "--input",
        str(lp),
        "--out",
        str(tmp_path / "i.jsonl"),
        "--sink",
        "console=",
        "--state",
        str(state),
    ]
    assert main(argv) == 0
    err = capsys.readouterr().err
    assert err.count("FIRING") == 1
    # the alert's runbook link names a file that exists (here the checkout's docs/runbooks/)
    (url,) = re.findall(r"runbook: (\S+)", err)
    assert url.startswith("file://") and Path(unquote(urlsplit(url).path)).is_file(), url
    assert main(argv) == 0  # the notifier's state remembers what it sent, and says why it is quiet
    err = capsys.readouterr().err
    assert "FIRING" not in err
    assert f"1 of 1 incident(s) not paged again: --state {state} records them as already sent" in err
    # without --state, batch mode keeps no state: each run pages, and no file is left behind
    before = set(tmp_path.iterdir())
    for _ in range(2):
        assert main(argv[:-2]) == 0
        assert capsys.readouterr().err.count("FIRING") == 1
    assert set(tmp_path.iterdir()) == before and not list(Path.cwd().glob("*notifier*.db"))
    assert main(["analyze", "--input", str(lp), "--sink", "bogus=http://x"]) == 2
    captured = capsys.readouterr()
    assert captured.out == "" and len(captured.err.strip().splitlines()) == 1


def test_example_config_is_the_defaults():
    from gpufleet.analyzer.config import Config

    root = Path(__file__).resolve().parent.parent
    path = root / "packaging" / "config" / "analyzer.toml"
    cfg = Config.load(path)
    assert cfg.detectors == Config().detectors and cfg.analyzer == Config().analyzer
    # every setting is spelled out in the example, none left to a silent default
    written = tomllib.loads(path.read_text())
    for name, params in Config().detectors.items():
        assert set(written["detectors"][name]) == set(params), name


def test_credentials_never_reach_messages(capsys):
    url = f"http://bob:s3cret@127.0.0.1:{free_port()}"
    assert main(["analyze", "--influx-url", url, "--influx-db", "x", "--since", "1h"]) == 2
    err = capsys.readouterr().err
    assert "unreachable" in err and "s3cret" not in err and "bob" not in err
