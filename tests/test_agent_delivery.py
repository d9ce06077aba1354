"""Nothing accepted is lost: outages, 5xx/429, a 400, and SIGKILL, against a real InfluxDB 1.6.7."""

from __future__ import annotations

import http.server
import random
import signal
import threading
import time
from collections import Counter

import pytest
import requests
from gpufleet.agent.spool import Spool

from tests.agent_support import (
    compare,
    influx_agent_config,
    read_lp_dir,
    start_agent,
    stop_agent,
    wait_for,
)
from tests.servers import free_port, skip_unless

pytestmark = skip_unless("influxd")


def _config(tmp_path, url: str) -> str:
    return influx_agent_config(tmp_path, url, backoff_max="2s")


def _gpu_count(server) -> int:
    try:
        res = server.query('SELECT count(power_watts) FROM gpu', db="fleet")
        return res["results"][0]["series"][0]["values"][0][1]
    except (KeyError, IndexError, requests.RequestException, RuntimeError):
        return 0


def _check_exactly_once(tmp_path, server) -> None:
    points = read_lp_dir(tmp_path / "lp")
    gpu = [p for p in points if p.measurement == "gpu"]
    per_gpu = Counter(p.tags["gpu"] for p in gpu)
    assert len(per_gpu) == 8 and len(set(per_gpu.values())) == 1
    assert _gpu_count(server) == len(gpu)  # every poll of every GPU, once per timestamp
    assert compare(points, server, "fleet") == len(points)


@pytest.mark.slow
@skip_unless("influxd")
def test_outage_of_30s_with_a_batch_in_flight(tmp_path, influxdb):
    influxdb.create_db("fleet")
    proc = start_agent(tmp_path, "--config", _config(tmp_path, influxdb.url))
    try:
        assert wait_for(lambda: _gpu_count(influxdb) >= 16, 15)
        t_out = time.monotonic()
        influxdb.proc.send_signal(signal.SIGSTOP)  # the next batch hangs in flight
        time.sleep(2.5)
        influxdb.stop(kill=True)
        time.sleep(max(0.0, 30.0 - (time.monotonic() - t_out)))
        influxdb.start()
        expected = lambda: len([p for p in read_lp_dir(tmp_path / "lp") if p.measurement == "gpu"])  # noqa: E731
        assert wait_for(lambda: _gpu_count(influxdb) >= expected(), 20, 0.5)
    finally:
        rc = stop_agent(proc)
    assert rc == 0
    _check_exactly_once(tmp_path, influxdb)
    assert "retrying with backoff" in (tmp_path / "agent.log").read_text()


class _FaultProxy(http.server.ThreadingHTTPServer):
    """Forwards to the real InfluxDB, but answers 500 until ``ok_at``, then one 429 with Retry-After."""

    def __init__(self, target: str, fail_for: float):
        self.target = target
        self.ok_at = time.monotonic() + fail_for
        self.sent_429 = False
        self.answers = Counter()
        port = free_port()
        self.url = f"http://127.0.0.1:{port}"
        proxy = self

        class H(http.server.BaseHTTPRequestHandler):
            def log_message(self, *a):
                pass

            def do_POST(self):
                body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
                if time.monotonic() < proxy.ok_at:
                    return self._answer(500, b'{"error":"timeout"}')
                if not proxy.sent_429:
                    proxy.sent_429 = True
                    return self._answer(429, b'{"error":"slow down"}', {"Retry-After": "1"})
                hdrs = {k: v for k, v in self.headers.items()
                        if k.lower() in ("content-encoding", "content-type")}
                r = requests.post(proxy.target + self.path, data=body, headers=hdrs, timeout=10)
                self._answer(r.status_code, r.content)

            def _answer(self, code, body, headers=None):
                proxy.answers[code] += 1
                self.send_response(code)
                for k, v in (headers or {}).items():
                    self.send_header(k, v)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

        super().__init__(("127.0.0.1", port), H)
        threading.Thread(target=self.serve_forever, daemon=True).start()


@pytest.mark.slow
def test_500s_then_429_then_a_400_batch_moved_aside(tmp_path, influxdb):
    influxdb.create_db("fleet")
    # one malformed batch already waiting in the spool, oldest of all
    sp = Spool(tmp_path / "spool")
    sp.append(["this is not line protocol"])
    sp.close()
    proxy = _FaultProxy(influxdb.url, fail_for=3.0)
    proc = start_agent(tmp_path, "--config", _config(tmp_path, proxy.url))
    try:
        time.sleep(5.0)
        expected = lambda: len([p for p in read_lp_dir(tmp_path / "lp") if p.measurement == "gpu"])  # noqa: E731
        assert wait_for(lambda: _gpu_count(influxdb) >= expected(), 15, 0.5)
        time.sleep(2.5)  # a tick after the refusal reports it in gpufleet_agent
    finally:
        rc = stop_agent(proc)
        proxy.shutdown()
    assert rc == 0
    assert proxy.answers[500] >= 2 and proxy.answers[429] == 1 and proxy.answers[400] == 1
    rejected = list((tmp_path / "spool" / "rejected").glob("*.lp"))
    # the whole batch is moved aside; InfluxDB kept its valid lines (a "partial write")
    assert len(rejected) == 1 and rejected[0].read_text().startswith("this is not line protocol\n")
    assert "400" in rejected[0].with_suffix(".reason").read_text()
    assert "refused a batch" in (tmp_path / "agent.log").read_text()
    _check_exactly_once(tmp_path, influxdb)
    dropped = influxdb.query("SELECT max(dropped_points_total) FROM gpufleet_agent", db="fleet")
    assert dropped["results"][0]["series"][0]["values"][0][1] == len(rejected[0].read_text().splitlines())


@pytest.mark.slow
def test_sigkill_at_random_moments_loses_nothing(tmp_path, influxdb):
    influxdb.create_db("fleet")
    influxdb.stop()  # down while the agent is being killed: everything waits in the spool
    rnd = random.Random(7)
    for i in range(4):
        proc = start_agent(tmp_path, "--config", _config(tmp_path, influxdb.url), log=f"agent{i}.log")
        wait_for(lambda: list((tmp_path / "lp").glob("*.lp*")), 10)
        time.sleep(rnd.uniform(1.0, 2.5))
        proc.send_signal(signal.SIGKILL)
        proc.wait(5)
        sp = Spool(tmp_path / "spool")  # readable after every kill
        assert sp.points > 0
        sp.close()
    influxdb.start()
    proc = start_agent(tmp_path, "--config", _config(tmp_path, influxdb.url))
    try:
        time.sleep(1.5)
        expected = lambda: len([p for p in read_lp_dir(tmp_path / "lp") if p.measurement == "gpu"])  # noqa: E731
        assert wait_for(lambda: _gpu_count(influxdb) >= expected(), 20, 0.5)
    finally:
        assert stop_agent(proc) == 0
    _check_exactly_once(tmp_path, influxdb)
