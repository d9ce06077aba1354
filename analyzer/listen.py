"""``gpufleet analyze --listen HOST:PORT``: the InfluxDB write protocol, received and analysed.

Accepts what InfluxDB 1.x subscriptions, the agent's ``influx`` exporter (``api = "v1"`` or
``"v2"``), Telegraf's ``outputs.influxdb``/``influxdb_v2`` and an OpenTelemetry Collector's
``influxdb`` exporter send:

- ``POST /write`` (v1: ``db``, ``rp``, ``precision``, ``u``/``p``) and ``POST /api/v2/write``
  (v2: ``org``, ``bucket``, ``precision``); bodies plain or ``Content-Encoding: gzip``;
- ``GET /ping`` (204) and ``GET /health`` (200), which clients use to probe;
- ``GET /metrics``: the counters (accepted, refused by reason, queue) in Prometheus text format.

Bodies are parsed in the receiving thread with the analyzer's own tokenizer (analyzer/parse.py)
and queued as rows for the analysis loop, which takes them every poll, or as soon as a file
chunk's worth (``sources.CHUNK``, at most half the queue) waits: a backlog is analysed at
batch speed instead of being refused while the loop sleeps.
Answers, as InfluxDB gives them:

- 204: every line taken; 400: lines that are not line protocol (the valid ones of the body are
  kept, the message says how many were refused), a bad gzip stream or an unknown precision;
- 401: a token is configured and the request does not carry it (``Authorization: Token T``
  or ``Bearer T``, basic auth with password T, or ``p=T``); the token is never logged;
- 403: a writers file is given (``--listen-writers``, analyzer/writers.py) and the body carries a
  row whose host the request's token may not write; the whole body is refused and counted;
- 413: the body (compressed or inflated) is larger than ``max_body``;
- 429 with ``Retry-After``: the queue holds ``max_queue`` bytes not yet analysed (the agent's
  spool and Telegraf retry; an InfluxDB subscription drops the write, which the analyzer then
  reads back from InfluxDB: see ``Online``). A gzip body whose compressed size does not fit
  is refused before it is inflated.
"""

from __future__ import annotations

import base64
import hmac
import json
import threading
import time
import zlib
from collections import deque
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, urlsplit

from gpufleet.analyzer.parse import Parser
from gpufleet.analyzer.sources import CHUNK, inflate

from gpufleet.errors import ConfigError
from gpufleet.hosts import shown

PRECISION = {"ns": 1, "n": 1, "us": 10**3, "u": 10**3, "ms": 10**6, "s": 10**9, "m": 60 * 10**9,
             "h": 3600 * 10**9}
WRITE_PATHS = ("/write", "/api/v2/write")
REFUSED = ("auth", "too_large", "busy", "bad_body", "bad_lines", "not_found", "forbidden")


def parse_address(value: str) -> tuple[str, int]:
    host, sep, port = value.rpartition(":")
    if not sep or not port.isdigit() or not 0 <= int(port) <= 65535:
        raise ConfigError(f"--listen {value!r}: expected HOST:PORT, e.g. 0.0.0.0:8186")
    return host.strip("[]") or "0.0.0.0", int(port)


class Listener:
    """The HTTP receiver: parse, bound and queue writes; :meth:`take` hands rows to the analysis."""

    def __init__(self, address: tuple[str, int], parser: Parser, token: str | None = None,
                 max_body: int = 32 << 20, max_queue: int = 256 << 20, retry_after: float = 1.0,
                 gauges=None, writers=None):
        self.parser = parser
        self.writers = writers  # analyzer/writers.py: tokens bound to the hosts they may write
        self.gauges = gauges  # () -> {name: number}: the analysis loop's own counters, for /metrics
        self.token = token
        self.max_body = max_body
        self.max_queue = max_queue
        self.retry_after = max(1, int(round(retry_after)))
        self.lock = threading.Lock()  # the parser (its series index) and the queue
        self.queue: deque = deque()
        self.queued_bytes = 0
        self.ready = threading.Event()  # set while wake_bytes wait: the analysis takes them now
        self.wake_bytes = min(CHUNK, max_queue // 2)
        self.counters = {"requests": 0, "accepted_bytes": 0, "accepted_points": 0, "errors": 0}
        self.counters.update({f"refused_{k}": 0 for k in REFUSED})
        self.refused_lines = 0
        self.last_write = 0.0
        handler = type("Handler", (_Handler,), {"listener": self})
        try:
            self.server = _Server(address, handler)
        except OSError as exc:
            raise ConfigError(f"--listen {address[0]}:{address[1]}: {exc.strerror}") from None
        self.server.daemon_threads = True
        self.address = self.server.server_address[:2]
        self.thread = threading.Thread(target=self.server.serve_forever, name="listen", daemon=True)

    def start(self) -> Listener:
        self.thread.start()
        return self

    def stop(self) -> None:
        if self.thread.is_alive():  # shutdown() waits for serve_forever: only when it runs
            self.server.shutdown()
        self.server.server_close()

    def take(self) -> list[dict]:
        """Everything queued so far (a list of {measurement: Rows}), oldest first."""
        with self.lock:
            out = list(self.queue)
            self.queue.clear()
            self.queued_bytes = 0
            self.ready.clear()
        return [rows for rows, _n in out]

    def full(self, size: int) -> bool:
        """Whether a body of ``size`` bytes more is refused (429): the queue holds something and
        would grow past ``max_queue``."""
        return bool(self.queue) and self.queued_bytes + size > self.max_queue

    def metrics(self) -> str:
        lines = []
        for k, v in self.counters.items():
            if k.startswith("refused_"):
                continue
            lines.append(f"gpufleet_analyzer_listen_{k}_total {v}")
        for k in REFUSED:
            n = self.counters["refused_" + k]
            lines.append(f'gpufleet_analyzer_listen_refused_total{{reason="{k}"}} {n}')
        lines.append(f"gpufleet_analyzer_listen_refused_lines_total {self.refused_lines}")
        lines.append(f"gpufleet_analyzer_listen_queue_bytes {self.queued_bytes}")
        for k, v in (self.gauges() if self.gauges else {}).items():
            lines.append(f"gpufleet_analyzer_{k} {v}")
        return "\n".join(lines) + "\n"

    # ------------------------------------------------------------------ one request
    def authorised(self, headers, query: dict):
        """Falsy: refused; True: the shared token (or none is needed); a writers-file entry
        (analyzer/writers.py): the token of a writer bound to its hosts."""
        if not self.token and not self.writers:
            return True
        given = []
        auth = headers.get("Authorization", "")
        scheme, _, cred = auth.partition(" ")
        if scheme.lower() in ("token", "bearer"):
            given.append(cred.strip())
        elif scheme.lower() == "basic":
            try:
                given.append(base64.b64decode(cred.strip()).decode().partition(":")[2])
            except (ValueError, UnicodeDecodeError):
                pass
        given += query.get("p", [])
        if self.token and any(hmac.compare_digest(g.encode(), self.token.encode()) for g in given):
            return True
        return self.writers.find(given) if self.writers else False

    def write(self, body: bytes, query: dict, writer=None) -> tuple[int, str]:
        """Parse and queue one body (already inflated): (HTTP status, error message or "").
        ``writer``: the writers-file entry of the request's token, if it has one."""
        prec = (query.get("precision") or ["ns"])[0] or "ns"
        if prec not in PRECISION:
            self.counters["refused_bad_body"] += 1
            return 400, f"unknown precision {prec!r} (one of ns, us, ms, s)"
        with self.lock:
            if self.full(len(body)):
                return self.busy()
            st = self.parser.stats
            lines0, bad0 = st.lines, st.bad_lines + st.no_timestamp
            rows = self.parser.feed(body)
            lines = st.lines - lines0
            bad = st.bad_lines + st.no_timestamp - bad0
            foreign = writer.foreign(rows, self.parser.series) if writer not in (None, True) else []
            if foreign:
                self.counters["refused_forbidden"] += 1
                self.refused_lines += lines
                return 403, (f"this token may not write host {shown(foreign[0])}"
                             f"{f' (and {len(foreign) - 1} more)' if len(foreign) > 1 else ''}; "
                             f"nothing of the body was taken")
            factor = PRECISION[prec]
            if factor != 1:
                for r in rows.values():
                    r.t = r.t * factor
            points = sum(len(r) for r in rows.values())
            if rows:
                self.queue.append((rows, len(body)))
                self.queued_bytes += len(body)
                if self.queued_bytes >= self.wake_bytes:
                    self.ready.set()
            self.counters["accepted_bytes"] += len(body)
            self.counters["accepted_points"] += points
            self.last_write = time.time()
        if bad:
            self.counters["refused_bad_lines"] += 1
            self.refused_lines += bad
            if bad >= lines:
                return 400, f"unable to parse: none of the {lines} lines is line protocol with a timestamp"
            return 400, f"partial write: {bad} of {lines} lines are not line protocol (the rest was kept)"
        return 204, ""

    def busy(self) -> tuple[int, str]:
        self.counters["refused_busy"] += 1
        return 429, "the analyzer is behind; retry later"


class _Server(ThreadingHTTPServer):
    daemon_threads = True

    def handle_error(self, request, client_address):
        """A request that broke (a client gone mid-body, a bug): one line, counted, never a traceback."""
        import sys

        exc = sys.exc_info()[1]
        if isinstance(exc, ConnectionError | TimeoutError):
            return
        self.RequestHandlerClass.listener.counters["errors"] += 1
        print(f"gpufleet analyze: listen: a request failed: {type(exc).__name__}: {exc}", file=sys.stderr)


class _Handler(BaseHTTPRequestHandler):
    listener: Listener
    protocol_version = "HTTP/1.1"
    server_version = "gpufleet-analyzer"

    def log_message(self, format, *args):  # noqa: A002 - the base class's name
        pass  # requests are counted, not logged (a URL may carry p=TOKEN)

    def _answer(self, code: int, error: str = "", body: bytes | None = None, ctype: str = "application/json",
                headers: dict | None = None) -> None:
        if error:
            body = json.dumps({"error": error}).encode()
        body = body or b""
        self.send_response(code)
        for k, v in (headers or {}).items():
            self.send_header(k, v)
        if body:
            self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(body)))
        self.send_header("X-Influxdb-Version", "1.8-gpufleet")
        self.end_headers()
        if body:
            self.wfile.write(body)

    def do_GET(self):  # noqa: N802 - the base class's name
        path = urlsplit(self.path).path
        if path == "/ping":
            self._answer(204)
        elif path == "/health":
            self._answer(200, body=b'{"status":"pass"}')
        elif path == "/metrics":
            self._answer(200, body=self.listener.metrics().encode(), ctype="text/plain; version=0.0.4")
        else:
            self.listener.counters["refused_not_found"] += 1
            self._answer(404, "not found")

    do_HEAD = do_GET

    def do_POST(self):  # noqa: N802 - the base class's name
        ls = self.listener
        ls.counters["requests"] += 1
        parts = urlsplit(self.path)
        query = parse_qs(parts.query)
        body = self._body()
        if body is None:
            return
        if parts.path not in WRITE_PATHS:
            ls.counters["refused_not_found"] += 1
            self._answer(404, f"not found: POST {', '.join(WRITE_PATHS)}")
            return
        writer = ls.authorised(self.headers, query)
        if not writer:
            ls.counters["refused_auth"] += 1
            self._answer(401, "authorization failed")
            return
        gzipped = self.headers.get("Content-Encoding", "").lower() == "gzip"
        if gzipped and ls.full(len(body)):  # no room even for the compressed body: not inflated
            code, err = ls.busy()
        else:
            if gzipped:
                body = self._inflate(body)
                if body is None:
                    return
            code, err = ls.write(body, query, writer)
        headers = {"Retry-After": str(ls.retry_after)} if code == 429 else None
        self._answer(code, err, headers=headers)

    def _inflate(self, body: bytes) -> bytes | None:
        """A gzip body inflated (every member, at most ``max_body`` bytes), or None once the error
        is answered: a stream cut short is refused whole, never taken in part."""
        ls = self.listener
        out, room = [], ls.max_body + 1
        try:
            while body:
                d = inflate.decompressobj(wbits=31)
                out.append(d.decompress(body, room))
                room -= len(out[-1])
                if room <= 0:
                    ls.counters["refused_too_large"] += 1
                    self._answer(413, f"the inflated body is larger than {ls.max_body} bytes")
                    return None
                if not d.eof:
                    raise zlib.error("truncated")
                body = d.unused_data
        except (zlib.error, inflate.error):
            ls.counters["refused_bad_body"] += 1
            self._answer(400, "the body is not valid gzip")
            return None
        return b"".join(out)

    def _body(self) -> bytes | None:
        ls = self.listener
        if self.headers.get("Transfer-Encoding", "").lower() == "chunked":
            out, size = [], 0
            while True:
                line = self.rfile.readline(64)
                try:
                    n = int(line.split(b";")[0].strip() or b"0", 16)
                except ValueError:
                    self.close_connection = True
                    self._answer(400, "bad chunked encoding")
                    return None
                if n == 0:
                    self.rfile.readline(64)
                    return b"".join(out)
                size += n
                if size > ls.max_body:
                    ls.counters["refused_too_large"] += 1
                    self.close_connection = True
                    self._answer(413, f"the body is larger than {ls.max_body} bytes")
                    return None
                out.append(self.rfile.read(n))
                self.rfile.readline(64)
        try:
            n = int(self.headers.get("Content-Length", "0"))
        except ValueError:
            n = -1
        if n < 0:
            self.close_connection = True
            self._answer(400, "bad Content-Length")
            return None
        if n > ls.max_body:
            ls.counters["refused_too_large"] += 1
            self.close_connection = True  # the body is not read: the connection cannot be reused
            self._answer(413, f"the body is larger than {ls.max_body} bytes")
            return None
        return self.rfile.read(n) if n else b""
