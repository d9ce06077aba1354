"""Alerting: incident -> first delivery attempt latency, update() cost, delivery throughput.

A local HTTP receiver stands in for the sink (a generic webhook, HMAC-signed); the notifier's
state file is on local disk. Target: incident -> first delivery attempt <= 2 s.
"""

from __future__ import annotations

import statistics
import tempfile
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

T0 = 1_795_000_000.0


class _Rx:
    def __init__(self):
        self.arrivals: dict[str, float] = {}
        outer = self

        class H(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def do_POST(self):
                self.rfile.read(int(self.headers.get("Content-Length") or 0))
                outer.arrivals.setdefault(self.headers.get("X-Gpufleet-Event", ""), time.perf_counter())
                self.send_response(200)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, *a):
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), H)
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/hook"
        threading.Thread(target=self.server.serve_forever, kwargs={"poll_interval": 0.05},
                         daemon=True).start()

    def stop(self):
        self.server.shutdown()
        self.server.server_close()


def _incident(i: int):
    from gpufleet.records import Record

    return Record(kind="thermal_throttle", host=f"node{i:04d}", gpu=i % 8, link=None, start=T0 + i, end=None,
                  severity="critical", id=f"bench-{i}", summary=f"GPU {i % 8} throttling")


def run(quick: bool) -> list[dict]:
    import os

    from gpufleet.analyzer.alerting import Notifier, load_sinks

    n = 20 if quick else 100
    rows = []
    rx = _Rx()
    os.environ["GPUFLEET_BENCH_SECRET"] = "bench-secret"
    try:
        with tempfile.TemporaryDirectory() as d:
            sinks = load_sinks([{"type": "webhook", "url": rx.url, "secret_env": "GPUFLEET_BENCH_SECRET",
                                 "rate_limit": 0}], [])
            notifier = Notifier(sinks, Path(d) / "state.db")
            sent, cost = {}, []
            for i in range(n):  # one new incident per analyzer pass, passes 20 ms apart
                inc = _incident(i)
                t = time.perf_counter()
                notifier.update([inc], now=T0 + i)
                cost.append(time.perf_counter() - t)
                sent[f"bench-{i}:firing"] = t
                time.sleep(0.02)
            notifier.flush(30)
            lat = sorted(rx.arrivals[k] - t for k, t in sent.items() if k in rx.arrivals)
            # burst: everything resolves in one pass
            t = time.perf_counter()
            notifier.update([_resolved(i, n) for i in range(n)], now=T0 + n)
            burst_update = time.perf_counter() - t
            notifier.flush(60)
            burst = max(rx.arrivals.get(f"bench-{i}:resolved", t) for i in range(n)) - t
            notifier.close()
    finally:
        rx.stop()
    p95 = lat[min(len(lat) - 1, int(0.95 * len(lat)))]
    rows.append({"benchmark": "alerting", "metric": "incident -> first delivery attempt, median",
                 "value": statistics.median(lat) * 1000, "unit": "ms", "target": "<= 2000",
                 "note": f"{len(lat)}/{n} incidents, signed webhook to a local receiver"})
    rows.append({"benchmark": "alerting", "metric": "incident -> first delivery attempt, p95",
                 "value": p95 * 1000, "unit": "ms", "target": "<= 2000",
                 "note": f"max {lat[-1] * 1000:.1f} ms"})
    rows.append({"benchmark": "alerting", "metric": "Notifier.update() with one new incident, median",
                 "value": statistics.median(cost) * 1000, "unit": "ms", "target": "",
                 "note": "SQLite state (WAL), commit included"})
    rows.append({"benchmark": "alerting", "metric": f"resolve {n} incidents in one pass: update()",
                 "value": burst_update * 1000, "unit": "ms", "target": "", "note": ""})
    rows.append({"benchmark": "alerting", "metric": f"resolve {n} incidents in one pass: all delivered",
                 "value": n / burst if burst > 0 else float("nan"), "unit": "notifications/s", "target": "",
                 "note": f"{burst:.2f} s, one worker per sink, in order"})
    return rows


def _resolved(i: int, n: int):
    import dataclasses

    return dataclasses.replace(_incident(i), end=T0 + n)
