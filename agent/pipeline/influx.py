"""The ``influx`` exporter's wire side: the spool in front, a sender thread draining it.

:class:`SpoolSink` is the line-protocol exporter's sink: a tick's lines go to the disk spool
in records of at most ``batch_lines``. :class:`InfluxSender` reads the spool oldest-first in
batches of up to ``batch_lines`` (5000) and writes them:

- ``api = "v1"``: ``POST /write?db=&rp=&precision=`` (InfluxDB 1.x, and 2.x/3.x's v1 API), basic
  auth from ``username`` + the password secret, gzip;
- ``api = "v2"``: influxdb-client's synchronous ``WriteApi`` (url, org, bucket, token), gzip.

Answers: 2xx acknowledges the batch. Connection errors, timeouts, 5xx and 429 are retried
with exponential backoff and jitter (``backoff_min`` doubling up to ``backoff_max``; a
``Retry-After`` is honoured). Any other 4xx refuses the batch for good: it is logged with the
answer, counted in ``dropped_points_total`` and moved to ``spool/rejected/``, so it cannot block
the queue.
"""

from __future__ import annotations

import gzip
import logging
import random
import threading
import time
from dataclasses import dataclass

from agent.config import redact_url
from agent.spool import Spool

log = logging.getLogger("gpufleet.agent.influx")


class SpoolSink:
    name = "influx"

    def __init__(self, spool: Spool, batch_lines: int = 5000, wake: threading.Event | None = None):
        self.spool = spool
        self.batch_lines = batch_lines
        self.wake = wake

    def write(self, lines: list[str]) -> None:
        for i in range(0, len(lines), self.batch_lines):
            self.spool.append(lines[i:i + self.batch_lines])
        if self.wake is not None:
            self.wake.set()


@dataclass
class Answer:
    ok: bool
    retry: bool
    status: int | None
    text: str
    retry_after: float | None = None


class _V1:
    def __init__(self, url: str, db: str, rp: str, precision: str, username: str, password: str | None,
                 use_gzip: bool, timeout: float):
        import requests

        self.requests = requests
        self.session = requests.Session()
        self.url = url.rstrip("/") + "/write"
        self.params = {"db": db, "precision": precision}
        if rp:
            self.params["rp"] = rp
        if username:
            self.session.auth = (username, password or "")
        self.gzip = use_gzip
        self.timeout = timeout

    def send(self, body: bytes, timeout: float) -> Answer:
        headers = {"Content-Type": "text/plain; charset=utf-8"}
        if self.gzip:
            body = gzip.compress(body, compresslevel=1)
            headers["Content-Encoding"] = "gzip"
        try:
            r = self.session.post(self.url, params=self.params, data=body, headers=headers,
                                  timeout=min(timeout, self.timeout))
        except self.requests.RequestException as exc:
            return Answer(False, True, None, f"{type(exc).__name__}")
        return _classify(r.status_code, r.text, r.headers.get("Retry-After"))

    def close(self) -> None:
        self.session.close()


class _V2:
    def __init__(self, url: str, org: str, bucket: str, token: str | None, precision: str, use_gzip: bool,
                 timeout: float):
        from influxdb_client import InfluxDBClient, WritePrecision
        from influxdb_client.client.write_api import SYNCHRONOUS

        self.client = InfluxDBClient(url=url, token=token or "", org=org or "-", timeout=int(timeout * 1000),
                                     enable_gzip=use_gzip)
        self.api = self.client.write_api(write_options=SYNCHRONOUS)
        self.bucket, self.org = bucket, org or "-"
        self.precision = WritePrecision.NS if precision == "ns" else WritePrecision.S

    def send(self, body: bytes, timeout: float) -> Answer:
        from influxdb_client.rest import ApiException

        try:
            self.api.write(bucket=self.bucket, org=self.org, record=body, write_precision=self.precision)
        except ApiException as exc:
            headers = exc.headers or {}
            return _classify(exc.status or 0, str(exc.body or exc.reason or ""), headers.get("Retry-After"))
        except Exception as exc:  # urllib3 connection errors, timeouts
            return Answer(False, True, None, type(exc).__name__)
        return Answer(True, False, 204, "")

    def close(self) -> None:
        self.client.close()


def _classify(status: int, text: str, retry_after: str | None) -> Answer:
    if 200 <= status < 300:
        return Answer(True, False, status, "")
    ra = None
    if retry_after:
        try:
            ra = max(0.0, float(retry_after))
        except ValueError:
            ra = None
    retry = status == 429 or status >= 500 or status == 0
    return Answer(False, retry, status, text.strip()[:500], ra)


class InfluxSender:
    """Drains a :class:`Spool` into InfluxDB in its own thread."""

    def __init__(self, spool: Spool, cfg: dict, secret: str | None, wake: threading.Event | None = None):
        self.spool = spool
        self.cfg = cfg
        self.url_for_logs = redact_url(cfg["url"])
        if cfg["api"] == "v1":
            self.client = _V1(cfg["url"], cfg["db"], cfg["rp"], cfg["precision"], cfg["username"], secret,
                              cfg["gzip"], cfg["timeout"])
        else:
            self.client = _V2(cfg["url"], cfg["org"], cfg["bucket"], secret, cfg["precision"], cfg["gzip"],
                              cfg["timeout"])
        self.batch_lines = cfg["batch_lines"]
        self.backoff_min, self.backoff_max = cfg["backoff_min"], cfg["backoff_max"]
        self.wake = wake or threading.Event()
        self.stop_event = threading.Event()
        self.deadline: float | None = None
        self.retries_total = 0
        self.sent_points = 0
        self.last_latency: float | None = None
        self.last_error = ""
        self.failures = 0
        self._thread: threading.Thread | None = None
        self._down_logged = False

    # ------------------------------------------------------------------ one step
    def step(self, timeout: float | None = None) -> str:
        """Send the oldest batch once: 'empty', 'sent', 'rejected' or 'retry'."""
        got = self.spool.read_batch(self.batch_lines)
        if got is None:
            return "empty"
        lines, pos = got
        body = ("\n".join(lines) + "\n").encode("utf-8")
        t0 = time.perf_counter()
        ans = self.client.send(body, timeout if timeout is not None else self.cfg["timeout"])
        if ans.ok:
            self.last_latency = time.perf_counter() - t0
            self.spool.ack(pos, len(lines))
            self.sent_points += len(lines)
            if self.failures:
                log.info("influx %s: delivering again after %d failed attempts", self.url_for_logs,
                         self.failures)
            self.failures = 0
            self._down_logged = False
            return "sent"
        if not ans.retry:
            path = self.spool.reject(lines, pos, f"HTTP {ans.status}: {ans.text}")
            log.error("influx %s refused a batch of %d lines: HTTP %s: %s (moved to %s)", self.url_for_logs,
                      len(lines), ans.status, ans.text, path)
            return "rejected"
        self.failures += 1
        self.retries_total += 1
        self.last_error = f"HTTP {ans.status}" if ans.status else ans.text
        self._retry_after = ans.retry_after
        if not self._down_logged:
            log.warning("influx %s: %s; retrying with backoff (spool holds the data)", self.url_for_logs,
                        self.last_error)
            self._down_logged = True
        return "retry"

    def backoff(self) -> float:
        d = min(self.backoff_max, self.backoff_min * (2 ** min(self.failures - 1, 30)))
        d = d / 2 + random.uniform(0, d / 2)
        ra = getattr(self, "_retry_after", None)
        if ra is not None:
            d = max(d, min(ra, 3600.0))
        return d

    # ------------------------------------------------------------------ thread
    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="influx-sender", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while True:
            if self.deadline is not None:
                left = self.deadline - time.monotonic()
                if left <= 0:
                    return
                r = self.step(timeout=max(0.1, left))
                if r == "empty":
                    return
                if r == "retry":
                    time.sleep(min(left, max(0.05, self.backoff() / 4)))
                continue
            if self.stop_event.is_set():
                return
            try:
                r = self.step()
            except Exception:
                log.exception("influx sender step failed")
                r = "retry"
                self.failures += 1
            if r == "empty":
                self.wake.wait(1.0)
                self.wake.clear()
            elif r == "retry":
                delay = self.backoff()
                if self.stop_event.wait(delay):
                    continue

    def flush(self, timeout: float) -> bool:
        """Drain as far as the backend allows within ``timeout`` seconds; stop the thread."""
        self.deadline = time.monotonic() + timeout
        self.stop_event.set()
        self.wake.set()
        if self._thread is not None:
            self._thread.join(max(0.0, self.deadline - time.monotonic()) + 0.05)
        elif timeout > 0:
            self._run()
        return self.spool.points == 0

    def close(self) -> None:
        try:
            self.client.close()
        except Exception:
            pass
