"""The ``influx`` exporter's wire side: the spool in front, a sender thread draining it.

:class:`SpoolSink` is the line-protocol exporter's sink: a tick's lines go to the disk spool
in records of at most ``batch_lines``. :class:`InfluxSender` reads the spool oldest-first in
batches of up to ``batch_lines`` (5000) and writes them:

- ``api = "v1"``: ``POST /write?db=&rp=&precision=`` (InfluxDB 1.x, and 2.x/3.x's v1 API), basic
  auth from ``username`` + the password secret, gzip;
- ``api = "v2"``: influxdb-client's synchronous ``WriteApi`` (url, org, bucket, token), gzip.

Answers: 2xx acknowledges the batch. Only a 400 that says the lines themselves are bad
(InfluxDB's "unable to parse" / "partial write" / "field type conflict") sets them aside: they
are logged with the answer, counted in ``dropped_points_total`` and moved to ``spool/rejected/``
(``gpufleet agent resend-rejected`` sends them again), so they cannot block the queue.
Everything else is fixable and keeps the batch in the spool: connection errors, timeouts, 5xx,
429, and 401/403/404 (a wrong password, a database not created yet) are retried with
exponential backoff and jitter (``backoff_min`` doubling up to ``backoff_max``; a
``Retry-After`` is honoured) and delivered once fixed. A 413 (request too large) splits the
batch into halves until the pieces pass. Loud while failing: one log line per backoff step
(attempts 1, 2, 4, 8, ...: not one per batch), the reason in the unit's STATUS, and
``export_failing_seconds`` / ``retries_total`` in ``gpufleet_agent``.

An agent with several destinations (``[influx]`` and ``[influx.NAME]`` tables) has one spool,
one :class:`SpoolSink` and one :class:`InfluxSender` (its own thread, backoff and counters) per
destination, each named after its exporter (``influx``, ``influx.NAME``): a destination that is
down or slow only fills its own spool.
"""

from __future__ import annotations

import gzip
import logging
import re
import threading
import time
from dataclasses import dataclass

from gpufleet.agent.model import Exporter, register_exporter
from gpufleet.agent.spool import Spool

from gpufleet.net import RETRY_AFTER_MAX, backoff_delay, classify, redact, redact_url, url_secrets
from gpufleet.options import Option

log = logging.getLogger("gpufleet.agent.influx")


class SpoolSink:
    def __init__(self, spool: Spool, batch_lines: int = 5000, wake: threading.Event | None = None,
                 name: str = "influx"):
        self.name = name
        self.spool = spool
        self.batch_lines = batch_lines
        self.wake = wake

    def write(self, lines: list[str]) -> None:
        failed = 0
        for i in range(0, len(lines), self.batch_lines):
            if not self.spool.append(lines[i:i + self.batch_lines]):
                failed += 1
        if self.wake is not None:
            self.wake.set()
        if failed:  # counted as dropped by the spool; the exporter reports a failed export
            raise SpoolWriteError(f"spool cannot write: {self.spool.error}")


class SpoolWriteError(OSError):
    """A tick's lines could not be spooled (they are counted as dropped)."""


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
        self.secrets = [password or "", *url_secrets(url)]  # never in an answer's text
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
        return _classify(r.status_code, redact(r.text, self.secrets), r.headers.get("Retry-After"))

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
        self.secrets = [token or "", *url_secrets(url)]  # never in an answer's text
        self.precision = WritePrecision.NS if precision == "ns" else WritePrecision.S

    def send(self, body: bytes, timeout: float) -> Answer:
        from influxdb_client.rest import ApiException

        try:
            self.api.write(bucket=self.bucket, org=self.org, record=body, write_precision=self.precision)
        except ApiException as exc:
            headers = exc.headers or {}
            return _classify(exc.status or 0, redact(str(exc.body or exc.reason or ""), self.secrets),
                             headers.get("Retry-After"))
        except Exception as exc:  # urllib3 connection errors, timeouts
            return Answer(False, True, None, type(exc).__name__)
        return Answer(True, False, 204, "")

    def close(self) -> None:
        self.client.close()


# a 400 whose answer says the lines are bad (InfluxDB 1.x/2.x/3.x, VictoriaMetrics): set aside
_MALFORMED = re.compile(r"unable to parse|partial write|field type conflict|cannot parse|invalid field"
                        r"|bad timestamp|points beyond retention", re.I)
# what an operator fixes for the other refusals (the batch waits in the spool meanwhile)
HINTS = {401: "check username and password_file/password_env (or token)",
         403: "the user may not write to this database",
         404: "create the database (or check db/bucket)",
         413: "request too large: splitting batches"}


def _classify(status: int, text: str, retry_after: str | None) -> Answer:
    """Any refusal but a malformed-lines 400 is retried: the batch waits in the spool for a fix."""
    disposition, ra = classify(status, retry_after)
    if disposition == "ok":
        return Answer(True, False, status, "")
    retry = not (status == 400 and _MALFORMED.search(text or ""))
    return Answer(False, retry, status, text.strip()[:500], ra)


def make_client(cfg: dict, secret: str | None):
    """The wire client of the ``[influx]`` section: v1 ``/write`` or v2 ``WriteApi``."""
    if cfg["api"] == "v1":
        return _V1(cfg["url"], cfg["db"], cfg["rp"], cfg["precision"], cfg["username"], secret,
                   cfg["gzip"], cfg["timeout"])
    return _V2(cfg["url"], cfg["org"], cfg["bucket"], secret, cfg["precision"], cfg["gzip"], cfg["timeout"])


def resend_rejected(rejected_dir, cfg: dict, secret: str | None) -> tuple[int, int, list[str]]:
    """Send every batch in ``spool/rejected/`` again, oldest first; a delivered one is deleted.

    Returns ``(files delivered, lines delivered, problems)``. A batch refused as malformed again
    stays (its ``.reason`` updated); a fixable failure (down, 401, 404, ...) stops the run.
    """
    from pathlib import Path

    client = make_client(cfg, secret)
    done = lines_done = 0
    problems: list[str] = []
    try:
        for path in sorted(Path(rejected_dir).glob("rejected-*.lp")):
            try:
                lines = [x for x in path.read_text(encoding="utf-8").split("\n") if x.strip()]
            except (OSError, UnicodeDecodeError) as exc:
                problems.append(f"{path.name}: cannot read ({exc.__class__.__name__})")
                continue
            bad = []
            for i in range(0, len(lines), cfg["batch_lines"]):
                part = lines[i:i + cfg["batch_lines"]]
                ans = client.send(("\n".join(part) + "\n").encode("utf-8"), cfg["timeout"])
                if ans.ok:
                    continue
                why = f"HTTP {ans.status}: {ans.text}" if ans.status else ans.text
                if ans.retry:
                    problems.append(f"{path.name}: {why}; stopped (fix it and run again)")
                    return done, lines_done, problems
                bad.append(why)
            if bad:
                path.with_suffix(".reason").write_text("; ".join(bad) + "\n", encoding="utf-8")
                problems.append(f"{path.name}: refused again: {bad[0]}")
                continue
            path.unlink(missing_ok=True)
            path.with_suffix(".reason").unlink(missing_ok=True)
            done += 1
            lines_done += len(lines)
    finally:
        client.close()
    return done, lines_done, problems


@register_exporter("influx")
class InfluxExporter(Exporter):
    """The ``[influx]`` section (and each ``[influx.NAME]`` table, with ``destination_options``):
    the agent builds one :class:`SpoolSink` and :class:`InfluxSender` per destination."""

    lines = True
    spooled = True
    options = (
        Option("url", "str", "", "`http(s)://HOST:PORT`; setting it switches the `influx` exporter on"),
        Option("api", "choice", "v1", "v1: POST /write (InfluxDB 1.x); v2: influxdb-client WriteApi",
               choices=("v1", "v2")),
        Option("db", "str", "gpufleet", "v1 database"),
        Option("rp", "str", "", "v1 retention policy; empty = the database default"),
        Option("username", "str", "", "v1 basic auth user"),
        Option("password", "secret", help="v1 password"),
        Option("bucket", "str", "", "v2 bucket"),
        Option("org", "str", "", "v2 organisation"),
        Option("token", "secret", help="v2 token"),
        Option("precision", "choice", "ns", choices=("ns", "s")),
        Option("gzip", "bool", True),
        Option("batch_lines", "int", 5000, "lines per write", 1, 5000),
        Option("timeout", "duration", 10.0, "per request", 0.1, 300.0),
        Option("backoff_min", "duration", 1.0, "the retry delay doubles from here ...", 0.01, 3600.0),
        Option("backoff_max", "duration", 60.0, "... up to here, with jitter; Retry-After is honoured",
               0.01, 3600.0),
    )
    # the keys an [influx.NAME] table has beyond [influx]'s (its other keys: [influx]'s, same defaults)
    destination_options = (
        Option("spool_dir", "path", "", "its own spool, shared with no other destination; empty: "
               "`spool.dir` + `-NAME`"),
    )


class InfluxSender:
    """Drains a :class:`Spool` into InfluxDB in its own thread."""

    def __init__(self, spool: Spool, cfg: dict, secret: str | None, wake: threading.Event | None = None,
                 name: str = "influx"):
        self.name = name  # the exporter: "influx" or "influx.NAME"
        self.spool = spool
        self.cfg = cfg
        self.url_for_logs = redact_url(cfg["url"])
        self.client = make_client(cfg, secret)
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
        self.failing_since: float | None = None  # monotonic time of the first failure of this run
        self.chunk_lines = self.batch_lines  # lines per request; halved on each 413
        self._thread: threading.Thread | None = None

    # ------------------------------------------------------------------ one step
    def step(self, timeout: float | None = None) -> str:
        """Send the oldest batch once: 'empty', 'sent', 'rejected' or 'retry'."""
        got = self.spool.read_batch(self.batch_lines)
        if got is None:
            return "empty"
        lines, pos = got
        t0 = time.perf_counter()
        ans, bad = self._send(lines, timeout if timeout is not None else self.cfg["timeout"])
        if ans.ok:
            if bad:
                bad_lines = [x for part, _ in bad for x in part]
                reason = "; ".join(f"HTTP {a.status}: {a.text}" for _, a in bad)
                path = self.spool.reject(bad_lines, pos, reason, len(lines))
                log.error("%s %s refused a batch: %d of %d lines malformed: %s (moved to %s; "
                          "'gpufleet agent resend-rejected' sends them again)", self.name, self.url_for_logs,
                          len(bad_lines), len(lines), reason, path)
                self.sent_points += len(lines) - len(bad_lines)
            else:
                self.spool.ack(pos, len(lines))
                self.sent_points += len(lines)
            self.last_latency = time.perf_counter() - t0
            if self.failures:
                log.warning("%s %s: delivering again after %d failed attempts (%s)", self.name,
                            self.url_for_logs, self.failures, self.last_error)
            self.failures = 0
            self.failing_since = None
            self.last_error = ""
            return "rejected" if bad else "sent"
        self._failed(ans)
        return "retry"

    def _send(self, lines: list[str], timeout: float) -> tuple[Answer, list]:
        """Send ``lines`` in requests of at most ``chunk_lines``, halving on 413.

        Returns the first fixable failure, or success with the pieces refused as malformed
        (``[(lines, answer)]``). A piece sent before a failure is sent again with the batch
        later: same lines, same timestamps, so InfluxDB stores it once.
        """
        bad: list = []
        i = 0
        while i < len(lines):
            part = lines[i:i + self.chunk_lines]
            ans = self.client.send(("\n".join(part) + "\n").encode("utf-8"), timeout)
            if ans.status == 413 and len(part) > 1:
                self.chunk_lines = max(1, len(part) // 2)
                log.warning("%s %s: HTTP 413 for %d lines: sending at most %d lines per request",
                            self.name, self.url_for_logs, len(part), self.chunk_lines)
                continue
            if not ans.ok and (ans.retry and ans.status != 413):
                return ans, bad
            if not ans.ok:  # malformed, or one line larger than the server takes: set aside
                bad.append((part, ans))
            i += len(part)
        return Answer(True, False, 204, ""), bad

    def _failed(self, ans: Answer) -> None:
        self.failures += 1
        self.retries_total += 1
        if self.failing_since is None:
            self.failing_since = time.monotonic()
        err = f"HTTP {ans.status}" if ans.status else ans.text
        if ans.status and ans.text:
            err += f": {ans.text[:200]}"
        if ans.status in HINTS:
            err += f" ({HINTS[ans.status]})"
        self.last_error = err
        self._retry_after = ans.retry_after
        if self.failures & (self.failures - 1) == 0:  # attempts 1, 2, 4, 8, ...: one line per backoff step
            log.warning("%s %s: %s; attempt %d failed, retrying with backoff (the spool keeps the "
                        "data: %d points)", self.name, self.url_for_logs, err, self.failures,
                        self.spool.points)

    @property
    def failing_seconds(self) -> float:
        return 0.0 if self.failing_since is None else time.monotonic() - self.failing_since

    def backoff(self) -> float:
        d = backoff_delay(self.failures, self.backoff_min, self.backoff_max)
        ra = getattr(self, "_retry_after", None)
        if ra is not None:
            d = max(d, min(ra, RETRY_AFTER_MAX))
        return d

    # ------------------------------------------------------------------ thread
    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name=f"{self.name}-sender", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while True:
            if self.deadline is not None:
                left = self.deadline - time.monotonic()
                if left <= 0:
                    return
                try:
                    r = self.step(timeout=max(0.1, left))
                except Exception as exc:  # noqa: BLE001 - e.g. the spool directory gone
                    log.debug("influx sender step failed: %s", exc)
                    return
                if r == "empty":
                    return
                if r == "retry":
                    time.sleep(min(left, max(0.05, self.backoff() / 4)))
                continue
            if self.stop_event.is_set():
                return
            try:
                r = self.step()
            except Exception as exc:  # noqa: BLE001 - the sender thread never dies
                log.debug("influx sender step failed", exc_info=True)
                why = redact(f"{type(exc).__name__}: {exc}", getattr(self.client, "secrets", ()))
                self._failed(Answer(False, True, None, why))
                r = "retry"
            if r == "empty":
                self.wake.wait(1.0)
                self.wake.clear()
            elif r == "retry":
                delay = self.backoff()
                if self.stop_event.wait(delay):
                    continue

    def flush(self, timeout: float) -> bool:
        """Drain as far as the backend allows within ``timeout`` seconds; stop the thread."""
        self.begin_flush(time.monotonic() + timeout)
        return self.end_flush()

    def begin_flush(self, deadline: float) -> None:
        """Last drain until ``deadline`` (monotonic), then stop: several senders drain at once."""
        self.deadline = deadline
        self.stop_event.set()
        self.wake.set()

    def end_flush(self) -> bool:
        """Wait for the drain :meth:`begin_flush` started; True when the spool is empty."""
        if self._thread is not None:
            self._thread.join(max(0.0, self.deadline - time.monotonic()) + 0.05)
        elif self.deadline > time.monotonic():
            self._run()
        return self.spool.points == 0

    def close(self) -> None:
        try:
            self.client.close()
        except Exception:
            pass
