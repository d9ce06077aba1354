"""``analyze --listen``'s receiver over real HTTP: the InfluxDB write protocol (v1 and v2, gzip,
precision), what it refuses and why (token, size, backpressure, garbage) with counters; and the
pull path's batching against a real InfluxDB 1.6.7."""

from __future__ import annotations

import gzip
import subprocess
import sys
import time

import numpy as np
import pytest
import requests
from gpufleet.analyzer.listen import Listener, parse_address
from gpufleet.analyzer.parse import Parser
from gpufleet.analyzer.pipeline import FIELDS, MEASUREMENTS, Analyzer
from gpufleet.analyzer.sources import Influx, pull

from gpufleet.errors import ConfigError
from tests.agent_support import ROOT
from tests.fleets import T0, fleet
from tests.servers import InfluxDB1, answers_ping, free_port, skip_unless

LINES = b"gpu,host=n1,gpu=0 power_watts=300.5,up=1i 1795000000000000000\n" \
        b"gpu,host=n1,gpu=1 power_watts=301,up=1i 1795000000000000000\n"


@pytest.fixture
def listener():
    ls = Listener(("127.0.0.1", 0), Parser(set(MEASUREMENTS), FIELDS), token="tok3n", max_body=4096,
                  max_queue=8192, retry_after=2.0).start()
    ls.url = f"http://127.0.0.1:{ls.address[1]}"
    yield ls
    ls.stop()


def rows_of(ls):
    return [("gpu", int(t), float(p)) for got in ls.take() if "gpu" in got
            for t, p in zip(got["gpu"].t, got["gpu"].num["power_watts"], strict=True)]


def test_v1_and_v2_writes_gzip_and_precision(listener):
    ls = listener
    r = requests.post(ls.url + "/write", params={"db": "x", "precision": "ns"}, data=LINES,
                      auth=("anyone", "tok3n"))
    assert r.status_code == 204
    r = requests.post(ls.url + "/api/v2/write", params={"org": "o", "bucket": "b", "precision": "s"},
                      data=gzip.compress(b"gpu,host=n2,gpu=0 power_watts=99 1795000001\n"),
                      headers={"Authorization": "Token tok3n", "Content-Encoding": "gzip"})
    assert r.status_code == 204
    r = requests.post(ls.url + "/write", params={"p": "tok3n"}, data=b"bmc,host=n1 x=1 1795000002000000000\n")
    assert r.status_code == 204  # a measurement no detector reads: taken, not queued
    assert rows_of(ls) == [("gpu", 1795000000000000000, 300.5), ("gpu", 1795000000000000000, 301.0),
                           ("gpu", 1795000001000000000, 99.0)]
    assert requests.get(ls.url + "/ping").status_code == 204
    m = requests.get(ls.url + "/metrics").text
    assert "gpufleet_analyzer_listen_accepted_points_total 3" in m


def test_refusals_are_clear_and_counted(listener):
    ls = listener
    # no token, wrong token: 401, and the token never appears in an answer
    for kw in ({}, {"headers": {"Authorization": "Token nope"}}, {"auth": ("u", "nope")}):
        r = requests.post(ls.url + "/write", data=LINES, **kw)
        assert r.status_code == 401 and "tok3n" not in r.text
    ok = {"Authorization": "Bearer tok3n"}
    # garbage: 400 with a message; a partly bad body keeps its good lines
    r = requests.post(ls.url + "/write", data=b"this is not line protocol\n\x00\x01", headers=ok)
    assert r.status_code == 400 and "unable to parse" in r.json()["error"]
    r = requests.post(ls.url + "/write", data=LINES + b"gpu,host=n1 garbage\n", headers=ok)
    assert r.status_code == 400 and "1 of 3 lines" in r.json()["error"]
    assert len(rows_of(ls)) == 2
    gz = {**ok, "Content-Encoding": "gzip"}
    r = requests.post(ls.url + "/write", data=b"\x1f\x8b not gzip", headers=gz)
    assert r.status_code == 400 and "gzip" in r.json()["error"]
    r = requests.post(ls.url + "/write", params={"precision": "fortnight"}, data=LINES, headers=ok)
    assert r.status_code == 400
    # too large, as sent or once inflated (a gzip bomb is cut at the limit)
    r = requests.post(ls.url + "/write", data=LINES * 100, headers=ok)
    assert r.status_code == 413
    bomb = gzip.compress(b"#" * 100_000)
    r = requests.post(ls.url + "/write", data=bomb, headers={**ok, "Content-Encoding": "gzip"})
    assert r.status_code == 413 and len(bomb) < 4096
    # backpressure: the queue holds max_queue bytes; then 429 with Retry-After, and after the
    # analysis took the queue, writes are taken again
    codes = [requests.post(ls.url + "/write", data=LINES * 20, headers=ok).status_code for _ in range(8)]
    assert 204 in codes and codes[-1] == 429
    r = requests.post(ls.url + "/write", data=LINES * 20, headers=ok)
    assert r.status_code == 429 and r.headers["Retry-After"] == "2"
    busy = codes.count(429) + 1
    taken = ls.take()
    assert sum(len(g["gpu"]) for g in taken) == 2 * 20 * codes.count(204)  # nothing accepted was lost
    assert requests.post(ls.url + "/write", data=LINES, headers=ok).status_code == 204
    assert requests.post(ls.url + "/query", data=LINES, headers=ok).status_code == 404
    m = requests.get(ls.url + "/metrics").text
    for reason, n in (("auth", 3), ("bad_lines", 2), ("bad_body", 2), ("too_large", 2), ("busy", busy),
                      ("not_found", 1)):
        assert f'refused_total{{reason="{reason}"}} {n}' in m, (reason, m)


def test_a_full_queue_refuses_gzip_before_inflating_and_wakes_the_analysis(listener):
    """Backpressure costs the listener no gunzip: a gzip body that does not fit even compressed is
    refused as it is (a broken stream shows it was never inflated); and the analysis loop is
    woken as soon as half the queue (at most a file chunk) waits, not at its next poll."""
    ls = listener
    ok = {"Authorization": "Token tok3n"}
    body = LINES * 20
    assert ls.wake_bytes == 4096 and not ls.ready.is_set()
    assert requests.post(ls.url + "/write", data=body, headers=ok).status_code == 204
    assert not ls.ready.is_set()  # len(body) bytes wait: fewer than wake_bytes
    assert requests.post(ls.url + "/write", data=body, headers=ok).status_code == 204
    assert ls.ready.is_set()
    while requests.post(ls.url + "/write", data=body, headers=ok).status_code == 204:
        pass
    r = requests.post(ls.url + "/write", data=b"\x1f\x8b broken" + bytes(len(body)),
                      headers={**ok, "Content-Encoding": "gzip"})
    assert r.status_code == 429 and r.headers["Retry-After"] == "2"
    assert sum(len(g["gpu"]) for g in ls.take()) == 2 * 20 * (ls.counters["accepted_bytes"] // len(body))
    assert not ls.ready.is_set()
    r = requests.post(ls.url + "/write", data=b"\x1f\x8b broken", headers={**ok, "Content-Encoding": "gzip"})
    assert r.status_code == 400 and "gzip" in r.json()["error"]  # with room, it is inflated (and fails)


def test_gzip_bodies_are_taken_whole_or_refused(listener):
    """Every member of a multi-member gzip body is taken; a stream cut short is refused (400),
    none of its lines kept."""
    ls = listener
    gz = {"Authorization": "Token tok3n", "Content-Encoding": "gzip"}
    a, b = LINES.splitlines(keepends=True)
    r = requests.post(ls.url + "/write", data=gzip.compress(a) + gzip.compress(b), headers=gz)
    assert r.status_code == 204
    assert [x[2] for x in rows_of(ls)] == [300.5, 301.0]
    r = requests.post(ls.url + "/write", data=gzip.compress(LINES * 10)[:-9], headers=gz)
    assert r.status_code == 400 and "gzip" in r.json()["error"]
    assert rows_of(ls) == [] and ls.counters["accepted_bytes"] == len(LINES)


def test_online_windows_follow_the_data_s_pace():
    """Poll-sized windows for data arriving live; batch-size windows for a backlog and for data
    stamped ahead of the wall clock (a replay), whose windows are due as its own time passes."""
    import threading

    from gpufleet.analyzer.config import Config
    from gpufleet.analyzer.online import Checkpoint, Online

    now = int(time.time())
    got = {}
    for name, t0 in (("live", now - 120), ("backlog", now - 4 * 3600), ("ahead", now + 3600)):
        online = Online(Config(), None, None, None, None, Checkpoint(None), poll=10.0, grace=10.0)
        online.feed(online.an.parser.feed(fleet(steps=12, t0=t0)))
        online.deliver(time.time_ns())
        got[name] = online.an.window
    assert got == {"live": 10.0, "backlog": 300.0, "ahead": 300.0}
    # a fleet stamped from a minute ahead, its first 15 min landing at once (a replay's first
    # bodies): cut in batch-size windows from its first rows (10 s ones would be 89 a stream)
    online = Online(Config(), None, None, None, None, Checkpoint(None), poll=10.0, grace=10.0)
    online.feed(online.an.parser.feed(fleet(steps=90, t0=now + 60)))
    assert online.an.window == 300.0
    assert 0 < online.an.windows <= 3 * len(online.an.window_start)
    # the loop sleeps until the next window is due, or until the listener has a backlog for it
    wake = threading.Event()
    wake.set()
    t = time.monotonic()
    Online(Config(), None, None, None, None, Checkpoint(None), poll=60.0, grace=60.0).wait(wake)
    assert time.monotonic() - t < 5


def test_the_agents_v2_exporter_writes_to_the_listener(tmp_path, listener):
    """Wiring 2: the agent's influx exporter (here its v2 client, influxdb-client) pointed at the analyzer."""
    from gpufleet.agent.pipeline.influx import InfluxSender
    from gpufleet.agent.spool import Spool

    spool = Spool(tmp_path / "spool")
    spool.append([line.decode() for line in LINES.splitlines()])
    cfg = {"url": listener.url, "api": "v2", "org": "o", "bucket": "b", "precision": "ns", "gzip": True,
           "timeout": 5.0, "batch_lines": 5000, "backoff_min": 0.1, "backoff_max": 1.0}
    sender = InfluxSender(spool, cfg, "tok3n")
    try:
        assert sender.step() == "sent"
    finally:
        sender.client.close()
    assert [x[2] for x in rows_of(listener)] == [300.5, 301.0]


@pytest.mark.slow
def test_listen_address_and_bad_flags_are_one_line_exit_2(tmp_path):
    assert parse_address("127.0.0.1:8186") == ("127.0.0.1", 8186)
    assert parse_address(":8186") == ("0.0.0.0", 8186)
    with pytest.raises(ConfigError):
        parse_address("8186x")
    at = f"127.0.0.1:{free_port()}"
    for args, needle in ((["--listen", "nowhere"], "HOST:PORT"),
                         (["--listen", at, "--listen-token-file", str(tmp_path / "none")],
                          "--listen-token-file"),
                         (["--listen", at, "--max-body", "lots"], "--max-body"),
                         (["--listen", at, "--follow"], "not both")):
        r = subprocess.run([sys.executable, "-m", "gpufleet", "analyze", *args], capture_output=True,
                           text=True, cwd=ROOT, timeout=60)
        assert r.returncode == 2 and needle in r.stderr and len(r.stderr.strip().splitlines()) == 1, r.stderr


@skip_unless("influxd")
def test_pull_skips_empty_stretches_and_reads_in_few_large_requests(tmp_path):
    data = fleet(fault=("memory_errors", 2, 3, 100), steps=240)  # 40 min, 16 GPUs
    with InfluxDB1(tmp_path / "influx") as db:
        db.create_db("fleet")
        db.write("fleet", data)
        influx = Influx(db.url, "fleet")
        an = Analyzer()
        start = int((T0 - 30 * 86400) * 1e9)  # 30 days before the data
        end = int((T0 + 86400) * 1e9)
        batches = list(pull(influx, an.wanted(), start, end, an.parser.series, step_ns=int(300e9)))
        assert batches[0][0] >= int((T0 - 1) * 1e9)  # the 30 empty days cost no batch
        assert len(batches) <= 6  # 40 minutes of a small fleet: a few requests, growing
        n = sum(len(r["gpu"]) for _a, _b, r in batches if "gpu" in r)
        assert n == 16 * 240
        for _a, _b, rows in batches:
            an.feed_rows(rows)
        an.finish()
        ref = Analyzer()
        ref.feed_bytes(data)
        ref.finish()
        assert [(i.kind, i.host, i.gpu, i.start) for i in an.incidents()] == \
            [(i.kind, i.host, i.gpu, i.start) for i in ref.incidents()]
        # of a node's BMC sensors only the inlet and the fans are asked for (the cooling model's input)
        t = int(T0 * 1e9)
        head = "bmc_sensor,host=n0,sensor="
        db.write("fleet", f"{head}Inlet\\ Temp,sensor_type=Temperature,unit=C value=24 {t}\n"
                          f"{head}FAN1,sensor_type=Fan,unit=RPM value=9000 {t}\n"
                          f"{head}Temp,sensor_type=inlet_air,unit=C value=25 {t}\n"
                          f"{head}CPU\\ Temp,sensor_type=Temperature,unit=C value=61 {t}\n")
        got = influx.query({"bmc_sensor": {"value"}}, t, t + 1, an.parser.series, an.tag_words())
        got = got["bmc_sensor"]
        assert sorted(got.num["value"]) == [24.0, 25.0, 9000.0]
        # a hole in the middle: one query finds where the data goes on
        later = fleet(steps=30, t0=T0 + 10 * 86400)
        db.write("fleet", later)
        end2 = end + int(20 * 86400e9)
        got = [(a, b) for a, b, r in pull(influx, an.wanted(), start, end2, an.parser.series) if r]
        assert got[-1][0] >= int((T0 + 10 * 86400 - 1) * 1e9)
        assert len(got) <= 8
        t = np.concatenate([r["gpu"].t for _a, _b, r in pull(influx, {"gpu": {"power_watts"}}, start, end2,
                                                                 an.parser.series) if r])
        assert len(t) == 16 * 270 and len(np.unique(t)) == 270


def test_metrics_page_and_unknown_get(listener):
    assert requests.get(listener.url + "/health").json() == {"status": "pass"}
    assert requests.get(listener.url + "/nope").status_code == 404
    time.sleep(0)


@pytest.mark.slow
def test_listen_analyses_pushed_writes_with_influxdb_down(tmp_path):
    """Wiring 2 without a store to lean on: the catch-up cannot read InfluxDB (said once), the
    pushed writes are analysed and the incident is written to --out; SIGTERM ends it cleanly."""
    port = free_port()
    now = int(time.time())
    data = fleet(fault=("memory_errors", 1, 2, 50), steps=60, t0=now - 600)
    out = tmp_path / "inc.jsonl"
    p = subprocess.Popen([sys.executable, "-m", "gpufleet", "analyze", "--listen", f"127.0.0.1:{port}",
                          "--influx-url", f"http://127.0.0.1:{free_port()}", "--influx-db", "fleet",
                          "--poll", "1s",
                          "--out", str(out)], cwd=ROOT, stdout=subprocess.DEVNULL,
                         stderr=open(tmp_path / "err", "w"))
    try:
        url = f"http://127.0.0.1:{port}"
        answers_ping(url)
        r = requests.post(url + "/api/v2/write", data=gzip.compress(data),
                          headers={"Content-Encoding": "gzip"})
        assert r.status_code == 204
        deadline = time.monotonic() + 90  # a loaded machine: the window, the imports
        while time.monotonic() < deadline and not (out.exists() and b"memory_errors" in out.read_bytes()):
            time.sleep(0.3)
        got = [line for line in out.read_text().splitlines() if "memory_errors" in line]
        assert got and '"host":"node1"' in got[0].replace(" ", "") and '"gpu":2' in got[0].replace(" ", "")
        m = requests.get(url + "/metrics", timeout=5).text
        assert f"gpufleet_analyzer_gpu_samples_total {16 * 60}" in m
    finally:
        p.terminate()
        assert p.wait(20) == 0
    err = (tmp_path / "err").read_text()
    assert "catch-up: InfluxDB at" in err and "unreachable" in err and "Traceback" not in err


@skip_unless("influxd")
def test_a_shard_asks_influxdb_for_its_own_hosts_only(tmp_path):
    from gpufleet.analyzer.pipeline import shard_of
    from gpufleet.analyzer.store import pull as _pull

    data = fleet(nodes=6, fault=("gpu_lost", 4, 1, 120), steps=240)
    full = Analyzer()
    full.feed_bytes(data)
    full.finish()
    want = sorted((i.kind, i.host, i.gpu, i.start) for i in full.incidents())
    with InfluxDB1(tmp_path / "influx") as db:
        db.create_db("fleet")
        db.write("fleet", data)
        got = []
        for i in range(3):
            an = Analyzer(shard=(i, 3))
            _pull(an, Influx(db.url, "fleet"), int((T0 - 60) * 1e9), int((T0 + 2500) * 1e9))
            an.finish()
            got += [(r.kind, r.host, r.gpu, r.start) for r in an.incidents()]
            # the other shards' rows never arrived: their series are not even known
            read = {t.get("host") for t in an.parser.series.tags}
            assert read and all(shard_of(h, 3) == i for h in read), (i, read)
        assert sorted(got) == want and want
