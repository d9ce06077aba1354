"""``gpufleet analyze --listen HOST:PORT``: the InfluxDB write protocol, received and analysed.

Accepts what InfluxDB 1.x subscriptions, the agent's ``influx`` exporter (``api = "v1"`` or
``"v2"``), Telegraf's ``outputs.influxdb``/``influxdb_v2`` and an OpenTelemetry Collector's
``influxdb`` exporter send:

- ``POST /write`` (v1: ``db``, ``rp``, ``precision``, ``u``/``p``) and ``POST /api/v2/write``
  (v2: ``org``, ``bucket``, ``precision``); bodies plain or ``Content-Encoding: gzip``;
- ``GET /ping`` (204) and ``GET /health`` (200), which clients use to probe;
- ``GET /metrics``: the counters (accepted, refused by reason, connections, queue) in Prometheus
  text format.

Bodies are parsed in a worker thread with the analyzer's own tokenizer (analyzer/parse.py)
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

The server holds against writers that are broken or hostile (docs/operations.md, "--listen
limits"). One thread waits on every connection at once (``selectors``: epoll) and reads request
heads; only a complete head reaches one of ``workers`` threads. So an idle or trickling
connection costs a descriptor and a few hundred bytes, never a thread:

- a request head must arrive whole within ``read_timeout`` of the connection, or of its first
  byte on a kept-alive one, else the connection is closed (counted in ``timeouts``); a kept-alive
  connection with no byte of a next request is closed after ``KEEP_ALIVE`` seconds. A writer that
  keeps its connections (an InfluxDB subscription, the agent) never waits so long between writes
  as a rule, and one that starts a request as the server closes the connection loses it (a POST is
  not retried; a subscription drops the write): so a connection whose next request has arrived
  when its time is up is read, not closed;
- a body read waits at most ``read_timeout`` for each piece and ``read_timeout`` plus one second
  per 64 KiB in all;
- at most ``max_connections`` connections (default: 10,000, and always ``RESERVE`` descriptors
  below the process's ``RLIMIT_NOFILE``, so the checkpoint and the sinks keep theirs). A new
  connection beyond the cap closes the one that has waited longest for its head (``evicted``):
  a flood of idle sockets cannot lock out a writer that sends its request;
- the token and ``Content-Length`` are checked on the head, before any byte of the body is read:
  a refused body is never read into memory (the answer is sent, then the rest of the upload is
  discarded for up to ``LINGER`` seconds so the client reads the answer instead of a reset);
- a gzip body is inflated member by member in linear time (each call is handed a bounded slice,
  so a member's end never copies the rest of the body), and more than ``MAX_MEMBERS`` members
  are refused (400);
- the accept backlog is ``backlog`` (1024; the kernel caps it at ``net.core.somaxconn``);
- the counters are updated under a lock.

Why not ``http.server.ThreadingHTTPServer``: it gives each connection a thread that blocks on
the head with no timeout, reads the body before a handler can look at the token, and exposes no
connection cap; bounding it would replace most of it. The one ``selectors`` loop is the shape of
nginx's and of asyncio's servers, with no dependency added.
"""

from __future__ import annotations

import base64
import ctypes
import errno
import hmac
import json
import platform
import queue
import resource
import selectors
import socket
import sys
import threading
import time
import zlib
from collections import OrderedDict, deque
from email.utils import formatdate
from http import HTTPStatus
from http.client import HTTPException, parse_headers
from io import BytesIO
from urllib.parse import parse_qs, urlsplit

from gpufleet.analyzer.parse import Parser
from gpufleet.analyzer.sources import CHUNK, inflate

from gpufleet.errors import ConfigError
from gpufleet.hosts import shown
from gpufleet.logs import escape

PRECISION = {"ns": 1, "n": 1, "us": 10**3, "u": 10**3, "ms": 10**6, "s": 10**9, "m": 60 * 10**9,
             "h": 3600 * 10**9}
WRITE_PATHS = ("/write", "/api/v2/write")
REFUSED = ("auth", "too_large", "busy", "bad_body", "bad_lines", "not_found", "forbidden")
MAX_HEAD = 64 << 10  # a request line and headers larger than this: 431
MAX_MEMBERS = 10_000  # gzip members in one body (clients send one; a flood of empty ones is refused)
RESERVE = 64  # descriptors left below RLIMIT_NOFILE for everything but connections
LINGER = 2.0  # seconds a refused upload is drained (discarded) so its client reads the answer
KEEP_ALIVE = 75.0  # seconds a kept-alive connection may wait for its next request (nginx's default)
MIN_RATE = 64 << 10  # bytes/second a body must keep up, beyond read_timeout
M_ARENA_MAX = -8  # glibc's mallopt parameter: how many heaps (arenas) its malloc keeps


def one_heap() -> None:
    """glibc: every thread allocates from one heap. The workers parse bodies and the analysis
    loop frees the rows later; with a heap per thread (glibc's default, up to 8 per core) each
    worker's heap keeps its freed memory apart, scattered between rows still held: ``--listen`` on
    a 128-GPU fleet peaked at 185 MiB, 115-130 with one heap, no slower (the parse is serialised
    anyway). Called before the workers start; elsewhere (another C library) nothing is done."""
    if platform.libc_ver()[0] != "glibc":
        return
    try:
        ctypes.CDLL(None).mallopt(M_ARENA_MAX, 1)
    except (OSError, AttributeError):
        pass


def parse_address(value: str) -> tuple[str, int]:
    host, sep, port = value.rpartition(":")
    if not sep or not port.isdigit() or not 0 <= int(port) <= 65535:
        raise ConfigError(f"--listen {value!r}: expected HOST:PORT, e.g. 0.0.0.0:8186")
    return host.strip("[]") or "0.0.0.0", int(port)


def connection_cap(wanted: int | None = None) -> int:
    """At most ``wanted`` connections (default 10,000), always ``RESERVE`` descriptors below the
    process's soft ``RLIMIT_NOFILE``."""
    soft, _hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    room = 1 << 20 if soft == resource.RLIM_INFINITY else soft - RESERVE
    return max(8, min(10_000 if wanted is None else wanted, room))


class Listener:
    """The HTTP receiver: parse, bound and queue writes; :meth:`take` hands rows to the analysis."""

    def __init__(self, address: tuple[str, int], parser: Parser, token: str | None = None,
                 max_body: int = 32 << 20, max_queue: int = 256 << 20, retry_after: float = 1.0,
                 gauges=None, writers=None, read_timeout: float = 10.0, max_connections: int | None = None,
                 workers: int = 8, backlog: int = 1024):
        self.parser = parser
        self.writers = writers  # analyzer/writers.py: tokens bound to the hosts they may write
        self.gauges = gauges  # () -> {name: number}: the analysis loop's own counters, for /metrics
        self.token = token
        self.max_body = max_body
        self.max_queue = max_queue
        self.retry_after = max(1, int(round(retry_after)))
        if not read_timeout > 0:
            raise ConfigError("--listen-timeout must be positive")
        self.read_timeout = read_timeout
        self.max_connections = connection_cap(max_connections)
        self.lock = threading.Lock()  # the parser (its series index) and the queue
        self.stats_lock = threading.Lock()  # the counters
        self.queue: deque = deque()
        self.queued_bytes = 0
        self.ready = threading.Event()  # set while wake_bytes wait: the analysis takes them now
        self.wake_bytes = min(CHUNK, max_queue // 2)
        self.counters = {"requests": 0, "accepted_bytes": 0, "accepted_points": 0, "errors": 0,
                         "connections": 0, "timeouts": 0, "evicted": 0}
        self.counters.update({f"refused_{k}": 0 for k in REFUSED})
        self.refused_lines = 0
        self.last_write = 0.0
        try:
            self.server = _Server(self, address, workers, backlog)
        except OSError as exc:
            raise ConfigError(f"--listen {address[0]}:{address[1]}: {exc.strerror}") from None
        self.address = self.server.address
        self.thread = threading.Thread(target=self.server.serve, name="listen", daemon=True)

    def start(self) -> Listener:
        one_heap()
        self.server.start_workers()
        self.thread.start()
        return self

    def stop(self) -> None:
        started = self.thread.is_alive()
        self.server.stop()
        if started:
            self.thread.join(5)  # the loop closes every socket on its way out
        else:
            self.server.close()

    def count(self, key: str, n: int = 1) -> None:
        with self.stats_lock:
            self.counters[key] += n

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
        with self.stats_lock:
            counters = dict(self.counters)
            refused_lines = self.refused_lines
        lines = []
        for k, v in counters.items():
            if k.startswith("refused_") or k == "connections":
                continue
            lines.append(f"gpufleet_analyzer_listen_{k}_total {v}")
        for k in REFUSED:
            n = counters["refused_" + k]
            lines.append(f'gpufleet_analyzer_listen_refused_total{{reason="{k}"}} {n}')
        lines.append(f"gpufleet_analyzer_listen_refused_lines_total {refused_lines}")
        lines.append(f"gpufleet_analyzer_listen_connections_total {counters['connections']}")
        lines.append(f"gpufleet_analyzer_listen_open_connections {self.server.open_connections}")
        lines.append(f"gpufleet_analyzer_listen_max_connections {self.max_connections}")
        lines.append(f"gpufleet_analyzer_listen_queue_bytes {self.queued_bytes}")
        for k, v in (self.gauges() if self.gauges else {}).items():
            lines.append(f"gpufleet_analyzer_{k} {v}")
        return "\n".join(lines) + "\n"

    # ------------------------------------------------------------------ one request
    def authorised(self, headers, query: dict):
        """Read from the head only, before any body byte. Falsy: refused; True: the shared token
        (or none is needed); a writers-file entry (analyzer/writers.py): the token of a writer
        bound to its hosts, whose other hosts :meth:`write` refuses."""
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
            self.count("refused_bad_body")
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
                self.count("refused_forbidden")
                with self.stats_lock:
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
            self.last_write = time.time()
        with self.stats_lock:
            self.counters["accepted_bytes"] += len(body)
            self.counters["accepted_points"] += points
            if bad:
                self.counters["refused_bad_lines"] += 1
                self.refused_lines += bad
        if bad:
            if bad >= lines:
                return 400, f"unable to parse: none of the {lines} lines is line protocol with a timestamp"
            return 400, f"partial write: {bad} of {lines} lines are not line protocol (the rest was kept)"
        return 204, ""

    def busy(self) -> tuple[int, str]:
        self.count("refused_busy")
        return 429, "the analyzer is behind; retry later"

    def inflate(self, body: bytes) -> tuple[bytes | None, int, str]:
        """A gzip body inflated (every member, at most ``max_body`` bytes): ``(body, 0, "")``, or
        ``(None, status, error)``. A stream cut short is refused whole, never taken in part.

        Linear in the body: each call is handed a slice about four times the last member's size
        (at least 1 KiB), so what inflate copies after a member's end is bounded by that member;
        more than ``MAX_MEMBERS`` members are refused."""
        out, room = [], self.max_body + 1
        view, pos, members, step = memoryview(body), 0, 0, 1 << 14
        d = None
        try:
            while pos < len(view):
                if d is None:
                    members += 1
                    if members > MAX_MEMBERS:
                        self.count("refused_bad_body")
                        return None, 400, f"more than {MAX_MEMBERS} gzip members in one body"
                    d, member = inflate.decompressobj(wbits=31), 0
                piece = view[pos:pos + step]
                got = d.decompress(piece, room)
                room -= len(got)
                out.append(got)
                if room <= 0:
                    self.count("refused_too_large")
                    return None, 413, f"the inflated body is larger than {self.max_body} bytes"
                left = len(d.unused_data) if d.eof else len(d.unconsumed_tail)
                used = len(piece) - left
                pos += used
                member += used
                if d.eof:
                    d, step = None, max(1 << 10, 4 * member)
                elif used == len(piece):
                    step *= 2  # a large member: larger slices
                elif not used and not got:
                    raise zlib.error("no progress")
            if d is not None:
                raise zlib.error("truncated")
        except (zlib.error, inflate.error):
            self.count("refused_bad_body")
            return None, 400, "the body is not valid gzip"
        return b"".join(out), 0, ""


class _Conn:
    """One client connection: its socket, the bytes of a head not yet complete, its deadline."""

    __slots__ = ("sock", "buf", "scan", "deadline", "linger", "discarded")

    def __init__(self, sock: socket.socket, deadline: float):
        self.sock = sock
        self.buf = bytearray()  # appended in place, searched from where the last search ended:
        self.scan = 0  # a head trickled a byte at a time costs linear time, not quadratic
        self.deadline = deadline
        self.linger = False  # an answer was sent without reading the body: discard what follows
        self.discarded = 0


class _Server:
    """The ``selectors`` loop (accept, read heads, timeouts, the cap) and the worker threads."""

    def __init__(self, listener: Listener, address: tuple[str, int], workers: int, backlog: int):
        self.ls = listener
        family = socket.AF_INET6 if ":" in address[0] else socket.AF_INET
        self.sock = socket.create_server(address, family=family, backlog=backlog)
        self.sock.setblocking(False)
        self.address = self.sock.getsockname()[:2]
        self.sel = selectors.DefaultSelector()
        self.sel.register(self.sock, selectors.EVENT_READ, None)
        self._wake_r, self._wake_w = socket.socketpair()
        self._wake_r.setblocking(False)
        self._wake_w.setblocking(False)
        self.sel.register(self._wake_r, selectors.EVENT_READ, "wake")
        self.waiting: OrderedDict[_Conn, None] = OrderedDict()  # heads being read, oldest deadline first
        self.lingering: OrderedDict[_Conn, None] = OrderedDict()  # refused uploads being drained
        self.idle: OrderedDict[_Conn, None] = OrderedDict()  # kept alive, no byte of a request yet
        self.busy: set[_Conn] = set()  # in a worker
        self.back: deque = deque()  # connections the workers hand back (kept alive or lingering)
        self.work: queue.SimpleQueue = queue.SimpleQueue()
        self.n_workers = max(1, workers)
        self.threads: list[threading.Thread] = []
        self.stopping = False
        self.accept_paused_until = 0.0
        self.guard = threading.Lock()  # busy and back (shared with the workers)

    @property
    def open_connections(self) -> int:
        with self.guard:
            return len(self.waiting) + len(self.lingering) + len(self.idle) + len(self.busy) + len(self.back)

    def start_workers(self) -> None:
        for i in range(self.n_workers):
            t = threading.Thread(target=self._worker, name=f"listen-{i}", daemon=True)
            t.start()
            self.threads.append(t)

    def stop(self) -> None:
        self.stopping = True
        self._wake()
        for _ in self.threads:
            self.work.put(None)
        with self.guard:
            for c in list(self.busy):  # a worker blocked on this connection returns at once
                _shutdown(c.sock)
        for t in self.threads:
            t.join(5)

    def _wake(self) -> None:
        try:
            self._wake_w.send(b"x")
        except OSError:
            pass

    # ------------------------------------------------------------------ the loop
    def serve(self) -> None:
        try:
            while not self.stopping:
                now = time.monotonic()
                timeout = 0.5
                for pool in (self.waiting, self.lingering, self.idle):
                    if pool:
                        timeout = min(timeout, max(0.0, next(iter(pool)).deadline - now))
                if self.accept_paused_until and now >= self.accept_paused_until:
                    self.accept_paused_until = 0.0
                    self.sel.register(self.sock, selectors.EVENT_READ, None)
                for key, _ev in self.sel.select(timeout):
                    try:
                        if key.data is None:
                            self._accept()
                        elif key.data == "wake":
                            self._take_back()
                        else:
                            self._readable(key.data)
                    except Exception as exc:  # a bug: one line, counted; the loop serves on
                        self.ls.count("errors")
                        print(f"gpufleet analyze: listen: {type(exc).__name__}: {escape(str(exc))}",
                              file=sys.stderr, flush=True)
                        if isinstance(key.data, _Conn):
                            self._close(key.data)
                self._expire(time.monotonic())
        finally:
            self.close()

    def close(self) -> None:
        for c in [*self.waiting, *self.lingering, *self.idle]:
            self._close(c)
        with self.guard:
            while self.back:  # handed back by a worker after the last round
                self.back.popleft().sock.close()
        self.sel.close()
        self.sock.close()
        self._wake_r.close()
        self._wake_w.close()

    def _accept(self) -> None:
        for _ in range(512):  # then serve the others: a flood of connects cannot starve them
            try:
                sock, _addr = self.sock.accept()
            except (BlockingIOError, InterruptedError):
                return
            except OSError as exc:
                if exc.errno in (errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM):
                    if not self._evict():  # no descriptor left and none to take back: wait a little
                        self.sel.unregister(self.sock)
                        self.accept_paused_until = time.monotonic() + 0.1
                        return
                    continue
                return  # ECONNABORTED and the like: that client is gone
            self.ls.count("connections")
            if self.open_connections >= self.ls.max_connections and not self._evict():
                _refuse(sock)  # every connection is in a worker: this one waits for none
                continue
            sock.setblocking(False)
            c = _Conn(sock, time.monotonic() + self.ls.read_timeout)
            self.waiting[c] = None
            self.sel.register(sock, selectors.EVENT_READ, c)

    def _evict(self) -> bool:
        """Close a refused upload being drained, else the connection that has waited longest for
        its head, else the kept-alive connection idle longest; False when none waits."""
        pool = self.lingering or self.waiting or self.idle
        if not pool:
            return False
        c = next(iter(pool))
        self.ls.count("evicted")
        self._close(c)
        return True

    def _expire(self, now: float) -> None:
        while self.idle:
            c = next(iter(self.idle))
            if c.deadline > now:
                break
            if _pending(c.sock):  # its next request came as its time ran out: read, not closed
                self._start_head(c, now)
                self._readable(c)
            else:
                self._close(c)
        for pool in (self.waiting, self.lingering):
            while pool:
                c = next(iter(pool))
                if c.deadline > now:
                    break
                if not c.linger:
                    self.ls.count("timeouts")
                self._close(c)

    def _start_head(self, c: _Conn, now: float) -> None:
        """A kept-alive connection's next request begins: ``read_timeout`` for its head from now."""
        del self.idle[c]
        c.deadline = now + self.ls.read_timeout
        self.waiting[c] = None

    def _pool(self, c: _Conn) -> OrderedDict:
        return self.lingering if c.linger else self.idle if c in self.idle else self.waiting

    def _close(self, c: _Conn) -> None:
        self._pool(c).pop(c, None)
        try:
            self.sel.unregister(c.sock)
        except (KeyError, ValueError):
            pass
        c.sock.close()

    def _readable(self, c: _Conn) -> None:
        try:
            data = c.sock.recv(1 << 16)
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            data = b""
        if not data:
            self._close(c)
            return
        if c in self.idle:
            self._start_head(c, time.monotonic())
        if c.linger:  # the rest of a refused upload: read and dropped, within LINGER and max_body
            c.discarded += len(data)
            if c.discarded > self.ls.max_body:
                self._close(c)
            return
        c.buf += data
        self._dispatch_if_complete(c)

    def _dispatch_if_complete(self, c: _Conn) -> None:
        if c.buf[:1] in (b"\r", b"\n"):  # blank lines before a request are allowed (RFC 9112, 2.2)
            del c.buf[:len(c.buf) - len(c.buf.lstrip(b"\r\n"))]
            c.scan = 0
        end = c.buf.find(b"\r\n\r\n", c.scan)
        if end < 0:
            c.scan = max(0, len(c.buf) - 3)
            if len(c.buf) > MAX_HEAD:
                sock = c.sock
                self.waiting.pop(c, None)
                self.sel.unregister(sock)
                _refuse(sock, 431, "Request Header Fields Too Large")
            return
        del self.waiting[c]
        self.sel.unregister(c.sock)
        with self.guard:
            self.busy.add(c)
        head, c.buf, c.scan = bytes(c.buf[:end + 4]), bytes(c.buf[end + 4:]), 0
        self.work.put((c, head))

    def _take_back(self) -> None:
        try:
            while self._wake_r.recv(4096):
                pass
        except (BlockingIOError, InterruptedError):
            pass
        while True:
            with self.guard:
                if not self.back:
                    return
                c = self.back.popleft()
            if self.stopping:
                c.sock.close()
                continue
            c.sock.setblocking(False)
            c.buf, c.scan = bytearray(c.buf), 0
            if c.linger:
                c.deadline, pool = time.monotonic() + LINGER, self.lingering
            elif c.buf:  # a pipelined request already read: its head is under way
                c.deadline, pool = time.monotonic() + self.ls.read_timeout, self.waiting
            else:
                c.deadline, pool = time.monotonic() + KEEP_ALIVE, self.idle
            pool[c] = None
            self.sel.register(c.sock, selectors.EVENT_READ, c)
            if not c.linger and c.buf:
                self._dispatch_if_complete(c)  # a pipelined request already read

    # ------------------------------------------------------------------ the workers
    def _worker(self) -> None:
        while True:
            job = self.work.get()
            if job is None:
                return
            c, head = job
            keep = False
            try:
                c.sock.settimeout(self.ls.read_timeout)
                keep = _Request(self.ls, c, head).run()
            except TimeoutError:
                self.ls.count("timeouts")
            except (ConnectionError, OSError):
                pass
            except Exception as exc:  # a bug: one line, counted, the server goes on
                self.ls.count("errors")
                print(f"gpufleet analyze: listen: a request failed: {type(exc).__name__}: "
                      f"{escape(str(exc))}", file=sys.stderr, flush=True)
            with self.guard:
                self.busy.discard(c)
                if keep and not self.stopping:
                    self.back.append(c)
            if keep and not self.stopping:
                self._wake()
            else:
                c.sock.close()


def _pending(sock: socket.socket) -> bool:
    """Whether bytes wait to be read on ``sock`` (non-blocking; a closed peer's socket: False)."""
    try:
        return bool(sock.recv(1, socket.MSG_PEEK | socket.MSG_DONTWAIT))
    except OSError:  # (BlockingIOError: nothing yet)
        return False


def _shutdown(sock: socket.socket) -> None:
    try:
        sock.shutdown(socket.SHUT_RDWR)
    except OSError:
        pass


def _refuse(sock: socket.socket, code: int = 503, reason: str = "Service Unavailable") -> None:
    """A one-shot answer on a connection that gets no worker, then close (never blocks)."""
    try:
        sock.setblocking(False)
        sock.send(f"HTTP/1.1 {code} {reason}\r\nContent-Length: 0\r\nConnection: close\r\n\r\n".encode())
    except OSError:
        pass
    sock.close()


class _Request:
    """One request on a connection whose head is read: route, check, read the body, answer.

    :meth:`run` returns whether the connection stays open for the next request."""

    def __init__(self, ls: Listener, conn: _Conn, head: bytes):
        self.ls = ls
        self.conn = conn
        self.sock = conn.sock
        self.head = head
        self.close = False
        self.method = ""
        self.answered_head_only = False

    def run(self) -> bool:
        try:
            line, _, rest = self.head.partition(b"\r\n")
            method, target, version = line.decode("latin-1").split(" ")
            if not version.startswith("HTTP/1."):
                raise ValueError(version)
            self.headers = parse_headers(BytesIO(rest))
        except (ValueError, UnicodeDecodeError, HTTPException):
            self.close = True
            self.answer(400, "bad request")
            return False
        self.method = method
        conn_hdr = self.headers.get("Connection", "").lower()
        self.close = conn_hdr == "close" or (version == "HTTP/1.0" and conn_hdr != "keep-alive")
        parts = urlsplit(target)
        if method in ("GET", "HEAD"):
            self.get(parts.path)
        elif method == "POST":
            self.ls.count("requests")
            self.post(parts.path, parse_qs(parts.query))
        else:
            self.close = True
            self.answer(405, f"method {method[:16]!r} not allowed", headers={"Allow": "GET, HEAD, POST"})
        return not self.close

    def get(self, path: str) -> None:
        if self._has_body():  # a GET with a body is not read: the connection cannot be reused
            self._unread()
        if path == "/ping":
            self.answer(204)
        elif path == "/health":
            self.answer(200, body=b'{"status":"pass"}')
        elif path == "/metrics":
            self.answer(200, body=self.ls.metrics().encode(), ctype="text/plain; version=0.0.4")
        else:
            self.ls.count("refused_not_found")
            self.answer(404, "not found")

    def post(self, path: str, query: dict) -> None:
        ls = self.ls
        if path not in WRITE_PATHS:  # refused on the head: the body is never read
            ls.count("refused_not_found")
            self._unread()
            self.answer(404, f"not found: POST {', '.join(WRITE_PATHS)}")
            return
        writer = ls.authorised(self.headers, query)
        if not writer:
            ls.count("refused_auth")
            self._unread()
            self.answer(401, "authorization failed")
            return
        chunked = "chunked" in self.headers.get("Transfer-Encoding", "").lower()
        size = 0
        if not chunked:
            try:
                size = int(self.headers.get("Content-Length", "0"))
            except ValueError:
                size = -1
            if size < 0:
                self._unread()
                self.answer(400, "bad Content-Length")
                return
            if size > ls.max_body:
                ls.count("refused_too_large")
                self._unread()
                self.answer(413, f"the body is larger than {ls.max_body} bytes")
                return
        gzipped = self.headers.get("Content-Encoding", "").lower() == "gzip"
        if not chunked and gzipped and ls.full(size):  # no room even for the compressed body: not read
            self._unread()
            self._answer_busy()
            return
        if self.headers.get("Expect", "").lower() == "100-continue":
            self.sock.sendall(b"HTTP/1.1 100 Continue\r\n\r\n")
        reader = _BodyReader(self.sock, self.conn.buf, ls.read_timeout)
        body = reader.chunked(ls.max_body) if chunked else reader.exact(size)
        self.conn.buf = reader.rest
        if body is None:  # a bad or oversized chunked body
            ls.count("refused_too_large" if reader.too_large else "refused_bad_body")
            self._unread()
            self.answer(413 if reader.too_large else 400, reader.error)
            return
        if gzipped and ls.full(len(body)):
            self._answer_busy()
            return
        if gzipped:
            body, code, err = ls.inflate(body)
            if body is None:
                self.answer(code, err)
                return
        code, err = ls.write(body, query, writer)
        self.answer(code, err, headers={"Retry-After": str(ls.retry_after)} if code == 429 else None)

    def _answer_busy(self) -> None:
        code, err = self.ls.busy()
        self.answer(code, err, headers={"Retry-After": str(self.ls.retry_after)})

    def _has_body(self) -> bool:
        if "chunked" in self.headers.get("Transfer-Encoding", "").lower():
            return True
        return self.headers.get("Content-Length", "0").strip() not in ("", "0")

    def _unread(self) -> None:
        """The body (if any) stays unread: answer, then drain it without keeping it, and close."""
        if self._has_body():
            self.close = True
            self.conn.linger = True

    def answer(self, code: int, error: str = "", body: bytes | None = None, ctype: str = "application/json",
               headers: dict | None = None) -> None:
        if error:
            body = json.dumps({"error": error}).encode()
        body = body or b""
        try:
            reason = HTTPStatus(code).phrase
        except ValueError:
            reason = ""
        out = [f"HTTP/1.1 {code} {reason}", "Server: gpufleet-analyzer", f"Date: {formatdate(usegmt=True)}",
               "X-Influxdb-Version: 1.8-gpufleet", f"Content-Length: {len(body)}"]
        if body:
            out.append(f"Content-Type: {ctype}")
        out += [f"{k}: {v}" for k, v in (headers or {}).items()]
        if self.close:
            out.append("Connection: close")
        data = ("\r\n".join(out) + "\r\n\r\n").encode("latin-1")
        if self.method != "HEAD":
            data += body
        self.sock.sendall(data)
        if self.conn.linger:  # the client may still be sending: it reads this answer, then EOF
            try:
                self.sock.shutdown(socket.SHUT_WR)
            except OSError:
                pass
            self.close = False  # back to the loop, which drains and closes it (LINGER)


class _BodyReader:
    """Reads a body from a blocking socket (``timeout`` per read, and a deadline for the whole
    body: ``timeout`` plus one second per ``MIN_RATE`` bytes), starting with bytes already read."""

    def __init__(self, sock: socket.socket, buf: bytes, timeout: float):
        self.sock = sock
        self.buf = bytearray(buf)
        self.timeout = timeout
        self.start = time.monotonic()
        self.rest = b""
        self.too_large = False
        self.error = ""

    def _fill(self, want: int, expected: int) -> None:
        deadline = self.start + self.timeout + expected / MIN_RATE
        while len(self.buf) < want:
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError("body too slow")
            self.sock.settimeout(min(self.timeout, left))
            data = self.sock.recv(min(1 << 20, max(1 << 16, want - len(self.buf))))
            if not data:
                raise ConnectionResetError("the client closed the connection mid-body")
            self.buf += data

    def exact(self, n: int) -> bytes:
        self._fill(n, n)
        body, self.rest = bytes(self.buf[:n]), bytes(self.buf[n:])
        return body

    def chunked(self, limit: int) -> bytes | None:
        out, size, pos = [], 0, 0
        while True:
            end = self.buf.find(b"\r\n", pos)
            while end < 0:
                if len(self.buf) - pos > 64:
                    self.error = "bad chunked encoding"
                    return None
                self._fill(len(self.buf) + 1, size)
                end = self.buf.find(b"\r\n", pos)
            try:
                n = int(bytes(self.buf[pos:end]).split(b";")[0].strip() or b"0", 16)
            except ValueError:
                self.error = "bad chunked encoding"
                return None
            pos = end + 2
            if n == 0:  # the last chunk, then (no trailers taken) an empty line
                self._fill(pos + 2, size)
                self.rest = bytes(self.buf[pos + 2:])
                return b"".join(out)
            size += n
            if size > limit:
                self.too_large, self.error = True, f"the body is larger than {limit} bytes"
                return None
            self._fill(pos + n + 2, size)
            out.append(bytes(self.buf[pos:pos + n]))
            pos += n + 2
            if pos > 1 << 20:  # keep the buffer small
                del self.buf[:pos]
                pos = 0
