"""Several InfluxDB-protocol destinations from one agent (``[influx]`` and ``[influx.NAME]``).

The config rules (each destination its own spool, one line and exit 2 for a bad one), and wiring
2 of the online analyzer end to end with real parts: one agent process (sim backend, wall clock,
1 s polls) writes to a real InfluxDB 1.6.7 and to a real ``gpufleet analyze --listen``, which
pages through a real Alertmanager. The analyzer is SIGKILLed for a while: InfluxDB keeps
receiving every poll, the analyzer's destination spools, and once the analyzer is back its
spool is delivered: a GPU lost while it was down is paged from the spooled rows
alone (the analyzer has no InfluxDB to catch up from), nothing dropped.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import requests
from gpufleet.agent import config

from gpufleet.errors import ConfigError
from tests.agent_support import ROOT, NotifySocket, agent_cmd, start_agent, stop_agent, wait_for
from tests.alerting_receiver import Receiver
from tests.servers import Alertmanager, InfluxDB1, free_port, skip_unless

TWO = """
[agent]
exporters = ["influx", "influx.analyzer"]
[influx]
url = "http://influx:8086"
[influx.analyzer]
url = "http://analyzer:8186"
api = "v2"
bucket = "-"
"""


def test_named_destinations_each_get_their_own_spool_and_keys():
    cfg = config.parse_text(TWO + '[spool]\ndir = "/srv/spool/"\n')
    d = config.influx_destinations(cfg)
    assert [x.name for x in d] == ["influx", "influx.analyzer"]
    assert [x.spool_dir for x in d] == ["/srv/spool/", "/srv/spool-analyzer"]
    assert d[1].cfg["url"] == "http://analyzer:8186" and d[1].cfg["api"] == "v2"
    assert d[1].cfg["backoff_max"] == 60.0 and d[1].cfg["token_file"] == ""  # [influx]'s defaults
    assert d[0].cfg["url"] == "http://influx:8086" and "analyzer" not in d[0].cfg
    # a command-line override moves the derived spool too, and the named table survives re-validation
    cfg2 = config.apply_overrides(cfg, spool_dir="/x/sp", influx_url="http://other:8086")
    assert [x.spool_dir for x in config.influx_destinations(cfg2)] == ["/x/sp", "/x/sp-analyzer"]
    assert config.influx_destinations(cfg2)[1].cfg["url"] == "http://analyzer:8186"
    # only the listed ones are active; one may go without [influx]
    only = config.apply_overrides(cfg, exporters=("file,influx.analyzer",))
    assert [x.name for x in config.influx_destinations(only)] == ["influx.analyzer"]
    assert config.influx_destinations(config.apply_overrides(cfg, exporters=("file",))) == []
    # an unlisted table is still checked (its URL only when listed)
    config.parse_text('[influx.spare]\nurl = "not checked while unlisted"\n')
    with pytest.raises(ConfigError, match="'influx.spare.backoff_min'"):
        config.parse_text('[influx.spare]\nbackoff_min = "2m"\nbackoff_max = "1m"\n')


@pytest.mark.parametrize("extra, key", [
    ('spool_dir = "/var/lib/gpufleet-agent/spool/"', "influx.analyzer.spool_dir"),  # [influx]'s spool
    ('precision = "s"', "influx.analyzer.precision"),
    ('bogus = 1', "influx.analyzer.bogus"),
    ('token_file = "/t"\ntoken_env = "T"', "influx.analyzer.token_file"),
])
def test_bad_named_destinations_name_the_key(extra, key):
    with pytest.raises(ConfigError, match=f"'{key}'"):
        config.parse_text(TWO + extra + "\n")


@pytest.mark.parametrize("text, key", [
    ('[agent]\nexporters = ["influx.nope"]', "agent.exporters"),
    ('[agent]\nexporters = ["kafka"]', "agent.exporters"),
    ('[influx."bad name"]\nurl = "http://h:1"', "influx.bad name"),
    ('[agent]\nexporters = ["influx.a"]\n[influx.a]\nurl = "http//h:1"', "influx.a.url"),
    ('[agent]\nexporters = ["influx.a"]\n[influx.a]\nurl = "http://h:1"\ndb = ""', "influx.a.db"),
    ('[agent]\nexporters = ["influx.a", "influx.b"]\n[influx.a]\nurl = "http://h:1"\nspool_dir = "/s"\n'
     '[influx.b]\nurl = "http://h:2"\nspool_dir = "/s"', "influx.b.spool_dir"),
])
def test_bad_exporter_lists_name_the_key(text, key):
    with pytest.raises(ConfigError, match=f"'{key}'"):
        config.parse_text(text)


@pytest.mark.slow
def test_config_errors_through_the_real_cli_are_one_line_exit_2(tmp_path):
    spool = tmp_path / "spool"
    cases = {  # two destinations sharing a spool; a bad URL in the second; a secret file missing
        "shared": f'[agent]\nexporters = ["influx", "influx.analyzer"]\n[influx]\nurl = "http://127.0.0.1:1"\n'
                  f'[spool]\ndir = "{spool}"\n[influx.analyzer]\nurl = "http://127.0.0.1:2"\n'
                  f'spool_dir = "{spool}"\n',
        "url": f'[agent]\nexporters = ["influx", "influx.analyzer"]\n[influx]\nurl = "http://127.0.0.1:1"\n'
               f'[spool]\ndir = "{spool}"\n[influx.analyzer]\nurl = "http://127.0.0.1:99999"\n',
        "secret": f'[agent]\nexporters = ["influx.analyzer"]\n[spool]\ndir = "{spool}"\n[influx.analyzer]\n'
                  f'url = "http://127.0.0.1:2"\napi = "v2"\nbucket = "-"\ntoken_file = "{tmp_path}/none"\n',
    }
    needles = {"shared": "influx.analyzer.spool_dir", "url": "influx.analyzer.url",
               "secret": "influx.analyzer.token_file"}
    for name, text in cases.items():
        p = tmp_path / f"{name}.toml"
        p.write_text(text)
        r = subprocess.run(agent_cmd("--config", str(p), "--backend", "sim"), capture_output=True, text=True,
                           timeout=60, cwd=ROOT)
        assert r.returncode == 2, (name, r.stderr)
        assert r.stderr.startswith("gpufleet: error:") and needles[name] in r.stderr, r.stderr
        assert len(r.stderr.strip().splitlines()) == 1 and "Traceback" not in r.stderr
    assert not list(spool.glob("seg-*"))  # refused before anything was spooled


SCENARIO = """name = "two-destinations"
[fleet]
nodes = 1
gpus_per_node = 2
[workload]
busy = 1.0
[nuisances]
background_sbe_per_gpu_day = 0
[[fault]]
kind = "memory_errors"
mode = "dbe"
host = "gpu0001"
gpu = 0
onset = "{first}s"
growth = "1s"
[[fault]]
kind = "gpu_lost"
mode = "xid79"
host = "gpu0001"
gpu = 1
onset = "{second}s"
"""


def _analyzer(tmp: Path, port: int, am_url: str, env: dict) -> subprocess.Popen:
    cmd = [sys.executable, "-m", "gpufleet", "analyze", "--listen", f"127.0.0.1:{port}", "--poll", "1s",
           "--grace", "1s", "--sink", f"alertmanager={am_url}", "--state", str(tmp / "an.db"),
           "--out", str(tmp / "an.jsonl")]
    return subprocess.Popen(cmd, stdout=open(tmp / "an.out", "ab"), stderr=subprocess.STDOUT, cwd=ROOT,
                            env=env, start_new_session=True)


def _firing(rx, kind, host, gpu):
    return [a for r in rx.requests for a in (r["json"] or {}).get("alerts", [])
            if a["status"] == "firing" and a["labels"].get("alertname") == kind
            and a["labels"].get("host") == host and a["labels"].get("gpu") == gpu]


def _metrics(port: int) -> str:
    try:
        return requests.get(f"http://127.0.0.1:{port}/metrics", timeout=5).text
    except requests.RequestException as exc:
        return repr(exc)


def _gauge(port: int, name: str) -> float:
    for line in _metrics(port).splitlines():
        if line.split(" ")[0] == name:
            return float(line.split()[-1])
    return -1.0


def _agent_rows(db, exporter: str, since_ns: int = 0) -> list[dict]:
    q = (f"SELECT spool_points, dropped_points_total, retries_total, export_failing_seconds "
         f"FROM gpufleet_agent WHERE exporter = '{exporter}' AND time >= {since_ns}")
    res = db.query(q, db="fleet")["results"][0]
    if not res.get("series"):
        return []
    cols = res["series"][0]["columns"]
    return [dict(zip(cols, v, strict=True)) for v in res["series"][0]["values"]]


@pytest.mark.slow
@skip_unless("influxd")
@skip_unless("prometheus-alertmanager")
def test_one_agent_feeds_influxdb_and_the_listening_analyzer_and_a_dead_analyzer_loses_nothing(tmp_path):
    token = "an4lyzer-t0ken"
    (tmp_path / "token").write_text(token + "\n")
    port = free_port()
    first, second = 8, 45  # seconds after the fleet's start: the second lands while the analyzer is down
    (tmp_path / "s.toml").write_text(SCENARIO.format(first=first, second=second))
    t0 = time.time() + 4
    sim_env = {"GPUFLEET_SIM_SCENARIO": str(tmp_path / "s.toml"), "GPUFLEET_SIM_T0": f"{t0:.3f}",
               "GPUFLEET_SIM_STEP": "1s", "GPUFLEET_SIM_DURATION": "10m", "GPUFLEET_SIM_SEED": "5"}
    env = dict(os.environ, GPUFLEET_LISTEN_TOKEN=token)
    host = "gpu0001"
    # two kinds: the notifier pages one group per kind and node, so a second fault of the first's
    # kind on this node would only join its group (an update, not a page)
    a, b = ("memory_errors", host, "0"), ("gpu_lost", host, "1")
    with InfluxDB1(tmp_path / "influx") as db, Receiver() as rx, \
            Alertmanager(tmp_path / "am", rx.url + "/hook") as am:
        db.create_db("fleet")
        cfg = tmp_path / "agent.toml"
        cfg.write_text(f"""
[agent]
backend = "sim"
sim_node = "{host}"
host = "{host}"
interval = "1s"
exporters = ["influx", "influx.analyzer"]
[influx]
url = "{db.url}"
db = "fleet"
backoff_min = "0.2s"
backoff_max = "1s"
[influx.analyzer]
url = "http://127.0.0.1:{port}"
api = "v2"
bucket = "-"
token_file = "{tmp_path / 'token'}"
timeout = "2s"
backoff_min = "0.2s"
backoff_max = "1s"
[spool]
dir = "{tmp_path / 'spool'}"
""")
        notify, reading = NotifySocket(tmp_path), threading.Event()

        def read_notify():  # as systemd does: a notify socket left unread would block the agent's sends
            while not reading.is_set():
                notify.drain()

        reader = threading.Thread(target=read_notify, daemon=True)
        reader.start()
        agent = start_agent(tmp_path, "--config", str(cfg), env={**sim_env, "NOTIFY_SOCKET": notify.path})
        an = _analyzer(tmp_path, port, am.url, env)
        try:
            # 1. both destinations receive; the analyzer pages the first DBE
            assert wait_for(lambda: _firing(rx, *a), 60), (tmp_path / "an.out").read_text()[-2000:]
            os.killpg(an.pid, signal.SIGKILL)
            an.wait(10)
            killed_ns = time.time_ns()
            assert killed_ns / 1e9 < t0 + second - 5, "the analyzer outlived the second fault's onset"
            assert not _firing(rx, *b)
            # 2. while it is down: InfluxDB keeps receiving every poll, the analyzer's destination spools
            # the unit's STATUS names each destination: the analyzer's failing, InfluxDB's not
            status = re.compile(r"STATUS=tick \d+: .*; influx: spool \d+ points, \d+ B; "
                                r"influx\.analyzer: spool \d+ points, \d+ B, failing \(")
            assert wait_for(lambda: any(status.search(x) for x in notify.msgs[-5:]), 10), notify.msgs[-3:]
            # the analyzer's spool has its own lock: a second agent on it is refused, one line, exit 2
            other = tmp_path / "other.toml"  # its own [spool], the analyzer destination's spool_dir
            shared = f'spool_dir = "{tmp_path / "spool-analyzer"}"\n[spool]'
            other.write_text(cfg.read_text()
                             .replace(f'dir = "{tmp_path / "spool"}"', f'dir = "{tmp_path / "other"}"')
                             .replace('backoff_max = "1s"\n[spool]', f'backoff_max = "1s"\n{shared}'))
            assert "spool_dir" in other.read_text()
            r = subprocess.run(agent_cmd("--config", str(other)), capture_output=True, text=True, timeout=60,
                               cwd=ROOT, env={**os.environ, **sim_env})
            assert r.returncode == 2 and "spool-analyzer is in use by another agent" in r.stderr, r.stderr
            assert len(r.stderr.strip().splitlines()) == 1
            q = "SELECT first(health_code) FROM gpu WHERE health_code = 2 AND gpu = '1'"
            assert wait_for(lambda: db.query(q, db="fleet")["results"][0].get("series"), 60)
            assert wait_for(lambda: any((r["spool_points"] or 0) > 0 and r["retries_total"] > 0
                                        for r in _agent_rows(db, "influx.analyzer", killed_ns)), 10)
            time.sleep(2)
            restarted_ns = time.time_ns()
            rows = db.query(f"SELECT count(health_code) FROM gpu WHERE time >= {killed_ns} AND "
                            f"time < {restarted_ns} GROUP BY gpu", db="fleet")["results"][0]["series"]
            down_s = (restarted_ns - killed_ns) / 1e9
            assert len(rows) == 2 and all(s["values"][0][1] >= down_s - 2 for s in rows), (down_s, rows)
            down_rows = sum(s["values"][0][1] for s in rows)
            # 3. back: the spool is delivered, the lost GPU is paged from it, the DBE not again
            an = _analyzer(tmp_path, port, am.url, env)
            assert wait_for(lambda: _firing(rx, *b), 60), (
                (tmp_path / "an.out").read_text()[-2000:], _metrics(port), rx.requests[-3:])
            later = time.time_ns()
            assert wait_for(lambda: [r for r in _agent_rows(db, "influx.analyzer", later)
                                     if r["spool_points"] == 0], 20)
            # every gpu row InfluxDB took while the analyzer was down reached the analyzer and was
            # analysed (gpu_samples_total counts the gpu rows taken in; none late: all went into windows)
            assert wait_for(lambda: _gauge(port, "gpufleet_analyzer_gpu_samples_total") >= down_rows, 10), (
                down_rows, _metrics(port))
            assert _gauge(port, "gpufleet_analyzer_late_points_total") == 0, _metrics(port)
            backlog = max(r["spool_points"] or 0 for r in _agent_rows(db, "influx.analyzer", killed_ns))
            print(f"analyzer down {down_s:.0f}s: {down_rows} gpu rows in InfluxDB meanwhile, the analyzer's "
                  f"spool held up to {backlog} lines, the restarted analyzer took in "
                  f"{_gauge(port, 'gpufleet_analyzer_gpu_samples_total'):.0f} gpu rows, none late")
            m = _metrics(port)
            assert 'refused_total{reason="auth"} 0' in m
            time.sleep(3)
            assert len(_firing(rx, *a)) == 1 and len(_firing(rx, *b)) == 1
            # nothing dropped by either destination; InfluxDB's never failed while the analyzer was down
            for name in ("influx", "influx.analyzer"):
                assert all(r["dropped_points_total"] == 0 for r in _agent_rows(db, name)), name
            assert all(r["retries_total"] == 0 and r["export_failing_seconds"] == 0
                       for r in _agent_rows(db, "influx"))
        finally:
            if an.poll() is None:
                an.terminate()
                try:
                    an.wait(15)
                except subprocess.TimeoutExpired:
                    an.kill()
            code = stop_agent(agent)
            reading.set()
            reader.join(5)
            notify.close()
        log = (tmp_path / "agent.log").read_text()
        assert code == 0, log[-2000:]
        assert "influx: the spool is empty" in log and "influx.analyzer:" in log, log[-2000:]
        assert token not in log and "Traceback" not in log


def test_resend_rejected_of_a_named_destination(tmp_path, influxdb):
    """``resend-rejected --destination influx.NAME`` reads that destination's spool and keys."""
    influxdb.create_db("second")
    cfg = tmp_path / "agent.toml"
    cfg.write_text(f'[spool]\ndir = "{tmp_path / "spool"}"\n[influx]\nurl = "http://127.0.0.1:1"\n'
                   f'[influx.copy]\nurl = "{influxdb.url}"\ndb = "second"\n')
    rdir = tmp_path / "spool-copy" / "rejected"  # spool.dir + "-copy"
    rdir.mkdir(parents=True)
    (rdir / "rejected-20261126T000000-0000000000000001-000000000000.lp").write_text("m,host=a v=7 1000\n")
    base = [*agent_cmd()[:-1], "resend-rejected", "--config", str(cfg)]
    r = subprocess.run([*base, "--destination", "influx.copy"], cwd=ROOT, capture_output=True, text=True,
                       timeout=60)
    assert r.returncode == 0 and "re-sent 1 batches (1 lines)" in r.stdout, r.stdout + r.stderr
    res = influxdb.query("SELECT v FROM m", db="second")["results"][0]
    assert res["series"][0]["values"][0][1] == 7
    for args, needle in ((["--destination", "influx.nope"], "influx.nope"),
                         (["--destination", "influx.copy", "--influx-url", influxdb.url],
                          "--destination influx")):
        r = subprocess.run([*base, *args], cwd=ROOT, capture_output=True, text=True, timeout=60)
        assert r.returncode == 2 and needle in r.stderr and len(r.stderr.strip().splitlines()) == 1, r.stderr
