"""Where telemetry comes from: line-protocol files, or InfluxDB through InfluxQL over ``/query``.

InfluxQL is the one query language InfluxDB 1.x, 2.x (DBRP mapping) and 3.x all answer.
Queries ask for ``epoch=ns`` and ``chunked=true``; each series' columns are turned straight
into the analyzer's :class:`~gpufleet.analyzer.parse.Rows`.
"""

from __future__ import annotations

import json
import time
import zlib
from collections.abc import Iterator
from pathlib import Path

import numpy as np
from gpufleet.analyzer.parse import Rows, SeriesIndex

from gpufleet.errors import GpufleetError

try:  # ISA-L's inflate: zlib's stream API, about 2.5x faster on line protocol
    from isal import isal_zlib as inflate
except ImportError:  # pragma: no cover - the [analyzer] extra installs it
    inflate = zlib

CHUNK = 4 << 20


def lp_files(path: str | Path) -> list[Path]:
    p = Path(path)
    if p.is_dir():
        files = sorted(
            f for f in p.rglob("*") if f.is_file() and (f.name.endswith(".lp") or f.name.endswith(".lp.gz"))
        )
        if not files:
            raise GpufleetError(f"{p}: no .lp or .lp.gz files in this directory")
        return files
    if p.is_file():
        return [p]
    raise GpufleetError(f"{p}: no such file or directory")


def read_chunks(path: str | Path, chunk: int = CHUNK) -> Iterator[bytes]:
    """Bytes of every line-protocol file under ``path``, in chunks that end at a line end.

    One file is read front to back. Several files (a store written by several agents: one
    segment file per host, possibly several per host) are merged by time, as the fleet wrote
    them: see :func:`merged_chunks`.
    """
    files = lp_files(path)
    if len(files) == 1:
        yield from _file_chunks(files[0], chunk)
    else:
        yield from merged_chunks(files, chunk)


def _file_chunks(f: Path, chunk: int = CHUNK) -> Iterator[bytes]:
    try:
        blocks = _gz_blocks(f, chunk) if f.name.endswith(".gz") else _raw_blocks(f, chunk)
        rest = b""
        while True:
            try:
                block = next(blocks, b"")
            except (EOFError, OSError, zlib.error, inflate.error) as exc:
                # a truncated gzip (a file still being written): what was readable has been
                # analysed; the line the cut went through is dropped (a cut timestamp or value
                # would be a wrong point, not a missing one)
                raise GpufleetError(f"{f}: unreadable ({exc})") from None
            if not block:
                break
            cut = block.rfind(b"\n")
            if cut < 0:
                rest += block
                continue
            if rest:  # one copy (rest + block[: cut + 1] would copy the block twice)
                yield b"".join((rest, memoryview(block)[: cut + 1]))
            else:
                yield block if cut == len(block) - 1 else block[: cut + 1]
            rest = block[cut + 1 :]
        if rest:
            yield rest + b"\n"
    except PermissionError as exc:
        raise GpufleetError(f"{f}: {exc.strerror}") from None


def _raw_blocks(f: Path, chunk: int) -> Iterator[bytes]:
    """Blocks of about ``chunk`` bytes, each read to end at a line end where one is in its last
    64 kB (looked at first): cut where it was read, not by a copy."""
    probe = min(chunk, 1 << 16)
    with open(f, "rb") as fh:
        while True:
            start = fh.tell()
            fh.seek(start + chunk - probe)
            cut = fh.read(probe).rfind(b"\n")
            fh.seek(start)
            block = fh.read(chunk if cut < 0 else chunk - probe + cut + 1)
            if not block:
                return
            yield block


def _gz_blocks(f: Path, chunk: int) -> Iterator[bytes]:
    """Decompressed blocks of about ``chunk`` bytes, each as a rule the output of one inflate call
    (no join of pieces, no copy): the call is handed the compressed bytes that should fill a block
    (at the ratio seen so far, and a quarter more) and stops at ``chunk``. Where one call falls
    short (a gzip member ends, the guess was low), the next calls fill the block up and the pieces
    are joined. Members are concatenated and zero padding between or after them is skipped, as
    ``gzip`` reads them; a truncated file raises EOFError after its readable part."""
    with open(f, "rb") as fh:
        d = inflate.decompressobj(wbits=31)
        buf, pos = b"", 0  # compressed bytes read, and how far inflate has taken them
        n_in = n_out = 0
        # once a member has ended, a call is handed about four members' worth (grown while calls
        # use all they get): inflate copies what follows a member's end, and a file of many small
        # members (a flush each) must not copy a block's worth per member
        member, limit = 0, None
        out: list[bytes] = []
        size = 0
        at_end = started = False
        while True:
            want = int(1.25 * chunk * (n_in + (1 << 16)) / (n_out + (1 << 18))) + 4096
            if limit is not None:
                want = min(want, limit)
            if len(buf) - pos < want and not at_end:
                more = fh.read(max(want, min(1 << 20, 4 * want)))  # a file's head: a little
                at_end = not more
                buf, pos = buf[pos:] + more, 0  # copies only the compressed bytes left over
            if pos == len(buf):
                break
            if d.eof:  # another gzip member follows, or zero padding
                if buf[pos] == 0:
                    rest = len(buf[pos:].lstrip(b"\0"))
                    pos = len(buf) - rest
                    if not rest:
                        continue  # padding so far: read on
                d = inflate.decompressobj(wbits=31)
            started = True
            view = memoryview(buf)[pos : pos + want]
            block = d.decompress(view, chunk - size)
            used = len(view) - len(d.unused_data if d.eof else d.unconsumed_tail)
            pos += used
            n_in += used
            n_out += len(block)
            member += used
            if d.eof:
                limit, member = max(1 << 14, 4 * member), 0
            elif limit is not None and used == len(view):
                limit *= 2
            if len(block) == chunk:
                yield block
            elif block:
                out.append(block)
                size += len(block)
                if size >= chunk:
                    yield b"".join(out)
                    out, size = [], 0
        tail = d.flush()
        if tail:
            out.append(tail)
        if out:
            yield b"".join(out)
        if started and not d.eof:
            raise EOFError("Compressed file ended before the end-of-stream marker was reached")


def _line_time(block: bytes, pos: int) -> int | None:
    """Timestamp of the line that starts at byte ``pos`` of ``block`` (or of the next line that has
    one, a few lines on)."""
    for _ in range(8):
        if pos >= len(block):
            return None
        end = block.find(b"\n", pos)
        if end < 0:
            end = len(block)
        line = block[pos:end].rstrip(b"\r")
        sp = line.rfind(b" ")
        if sp >= 0:
            try:
                return int(line[sp + 1 :])
            except ValueError:
                pass
        pos = end + 1
    return None


def _pieces(f: Path, chunk: int, span_ns: int) -> Iterator[tuple[int | None, memoryview]]:
    """A file's lines in pieces of at most ``span_ns`` of time each, with each piece's first time:
    views of the block read (the merge copies them once, into its chunk).

    A file is written in time order (the agent's segments, the simulator's output); a piece is
    cut where a line's time reaches the piece's first time + span (binary search on the block's
    bytes: a few timestamps per piece are read, the lines between are never looked at).
    Out-of-order lines only make pieces uneven.
    """
    for block in _file_chunks(f, chunk):
        n = len(block)  # a block ends at a line end
        view = memoryview(block)
        i = 0
        while i < n:
            t0 = _line_time(block, i)
            if t0 is None:
                yield None, view[i:]
                break
            lim = t0 + span_ns
            lo, hi = i + 1, n  # the cut: the first line start at or after lo whose time reaches lim
            while lo < hi:
                mid = (lo + hi) // 2
                start = block.find(b"\n", mid - 1) + 1  # the first line start at or after mid
                tm = _line_time(block, start) if start < n else lim
                if tm is None or tm < lim:
                    lo = start + 1
                else:
                    hi = mid
            cut = block.find(b"\n", lo - 1) + 1 if lo < n else n
            yield t0, view[i:cut]
            i = cut


def _first_time(f: Path) -> int:
    for t, _piece in _pieces_head(f):
        return t if t is not None else -(2**62)
    return 2**62


def _pieces_head(f: Path) -> Iterator[tuple[int | None, memoryview]]:
    it = _pieces(f, 1 << 16, 1)
    try:
        yield next(it)
    except StopIteration:
        return
    finally:
        it.close()


def merged_chunks(
    files: list[Path], chunk: int = CHUNK, span_s: float = 60.0, piece_chunk: int = 1 << 20
) -> Iterator[bytes]:
    """Lines of several files merged in time order (a k-way merge), in chunks of about ``chunk``.

    Every file is read in pieces of at most ``span_s`` of time; the piece with the earliest first
    time goes next, so hosts whose files are read side by side are seen side by side, never
    hours apart (the analyzer would drop a late host's data). A file is opened when the merge
    reaches its first timestamp and closed at its end: memory holds one block per open file
    (the hosts writing at the same time; two while the chunk being gathered still holds a piece
    of a file's previous block), not the history. Pieces are joined into chunks of about
    ``chunk`` bytes for the parser.
    """
    import heapq

    span_ns = int(span_s * 1e9)
    heap: list[tuple[int, int, Iterator | Path, bytes | None]] = []
    for seq, f in enumerate(files):
        heap.append((_first_time(f), seq, f, None))
    heapq.heapify(heap)
    out: list[bytes] = []
    size = 0
    while heap:
        t, seq, src, piece = heapq.heappop(heap)
        if piece is None:  # not opened yet
            src = _pieces(src, piece_chunk, span_ns)
        else:
            out.append(piece)
            size += len(piece)
            if size >= chunk:
                yield b"".join(out)
                out, size = [], 0
        nxt = next(src, None)
        if nxt is not None:
            nt, np_ = nxt
            heapq.heappush(heap, (t if nt is None else nt, seq, src, np_))
    if out:
        yield b"".join(out)


# ---------------------------------------------------------------------------- InfluxDB
MEASUREMENTS = ("gpu", "gpu_nvlink", "gpu_event", "gpu_canary", "bmc_sensor", "host")
TYPES_TTL = 60.0  # seconds a measurement's field list is trusted (a new field shows up after that)
BATCH_ROWS = 200_000  # rows one pull request aims at: large enough that per-query cost vanishes


class Influx:
    """A minimal InfluxQL client (v1 ``/query`` and ``/write``) with retries."""

    def __init__(
        self,
        url: str,
        db: str,
        username: str | None = None,
        password: str | None = None,
        token: str | None = None,
        timeout: float = 30.0,
    ):
        from urllib.parse import urlsplit, urlunsplit

        import requests

        parts = urlsplit(url.rstrip("/"))
        if parts.username and not username:
            username, password = parts.username, parts.password
        netloc = parts.hostname or ""
        if parts.port:
            netloc += f":{parts.port}"
        # the URL without credentials: the only form that reaches requests' URL or any message
        self.url = urlunsplit((parts.scheme, netloc, parts.path, "", ""))
        self.db = db
        self.s = requests.Session()
        self.timeout = timeout
        self._types: dict[str, tuple[float, dict[str, str]]] = {}
        self.multi = True  # several statements in one request (InfluxQL allows it; a server may not)
        if token:
            self.s.headers["Authorization"] = f"Token {token}"
        elif username:
            self.s.auth = (username, password or "")
        self._secrets = [token or "", password or ""]  # never in a message (gpufleet.net.redact)

    def _answer(self, r) -> str:
        """The start of an error answer, without the credentials (a proxy may echo them)."""
        from gpufleet.net import redact

        return redact(r.text[:1000], self._secrets)[:200].strip()

    def _get(self, q: str, chunked: bool = True):
        import requests

        params = {"q": q, "db": self.db, "epoch": "ns"}
        if chunked:
            params["chunked"] = "true"
            params["chunk_size"] = "50000"
        try:
            if len(q) > 4000:  # a long statement (a shard's host list) goes in a form body, not the URL
                q_params = {k: v for k, v in params.items() if k != "q"}
                r = self.s.post(self.url + "/query", params=q_params, data={"q": q}, timeout=self.timeout,
                                stream=True)
            else:
                r = self.s.get(self.url + "/query", params=params, timeout=self.timeout, stream=True)
        except requests.RequestException as exc:
            raise GpufleetError(f"InfluxDB at {self.url} unreachable: {type(exc).__name__}") from None
        if r.status_code in (401, 403):
            raise GpufleetError(f"InfluxDB at {self.url}: not authorised (HTTP {r.status_code})")
        if r.status_code >= 400:
            raise GpufleetError(f"InfluxDB at {self.url}: HTTP {r.status_code}: {self._answer(r)}")
        return r

    def check(self) -> None:
        """Raise GpufleetError unless the server answers and the database exists."""
        r = self._get("SHOW DATABASES", chunked=False)
        try:
            names = [v[0] for s in r.json()["results"][0].get("series", []) for v in s.get("values", [])]
        except (ValueError, KeyError, IndexError, TypeError):
            raise GpufleetError(f"InfluxDB at {self.url}: unexpected answer to SHOW DATABASES") from None
        self._types.clear()  # a new field may have appeared since
        if self.db not in names:
            raise GpufleetError(f"InfluxDB at {self.url}: database {self.db!r} does not exist")

    def field_types(self, measurement: str, want: set[str] | None = None) -> dict[str, str]:
        """``SHOW FIELD KEYS``: field name -> InfluxDB type (float, integer, string, boolean).

        Kept for a minute while it holds every field in ``want`` (all: any field); asked again on
        every call while a wanted field or the measurement itself is missing, so the first point
        of a new measurement or field is read with the batch it lands in, not a minute later.
        """
        t, have = self._types.get(measurement, (None, None))
        fresh = t is not None and time.monotonic() - t <= TYPES_TTL
        if not fresh or not have or (want is not None and not want <= have.keys()):
            r = self._get(f'SHOW FIELD KEYS FROM "{_ident(measurement)}"', chunked=False)
            out: dict[str, str] = {}
            for res in _results(self, r):
                for s in res.get("series", []):
                    for name, typ in s.get("values", []):
                        out[name] = typ
            self._types[measurement] = (time.monotonic(), out)
        return self._types[measurement][1]

    def tag_values(self, key: str = "host", measurement: str = "gpu") -> list[str]:
        """``SHOW TAG VALUES``: every value of tag ``key`` in ``measurement``."""
        q = f'SHOW TAG VALUES FROM "{_ident(measurement)}" WITH KEY = "{_ident(key)}"'
        r = self._get(q, chunked=False)
        return sorted({v[1] for res in _results(self, r) for s in res.get("series", [])
                       for v in s.get("values", []) if len(v) > 1})

    def query(
        self,
        wanted: dict[str, set[str] | None],
        start_ns: int,
        end_ns: int,
        series: SeriesIndex,
        words: dict[str, tuple[tuple[str, ...], tuple[str, ...]]] | None = None,
        not_hosts: list[str] | None = None,
        host: str | None = None,
    ) -> dict[str, Rows]:
        """Every point of the ``wanted`` measurements in [start, end) as Rows, in one request.

        ``wanted``: measurement -> the fields to read (None: all). One InfluxQL statement per
        measurement, all in one ``/query`` call; ``GROUP BY *`` puts each series' tags once in
        its header instead of on every row, and each series' values are converted column by
        column (numpy), never value by value. ``words``: measurement -> (tags, words): only rows
        where one of those tags contains one of the words (any case) are asked for. ``not_hosts``: hosts
        not asked for (another shard's; a host not listed, e.g. new, is asked for and left to the
        analyzer's own shard filter). ``host``: that host's rows only (a late host's gap read back).
        """
        skip = ""
        if host is not None:
            skip = ' AND "host" = \'' + host.replace("\\", "\\\\").replace("'", "\\'") + "'"
        if not_hosts:
            skip = ' AND "host" !~ /^(' + "|".join(_regex(h) for h in not_hosts) + ")$/"
        stmts, order = [], []
        for m, fields in wanted.items():
            types = self.field_types(m, fields)
            if not types:
                continue
            if fields is None:
                sel = "*"
            else:
                have = sorted(f for f in fields if f in types)
                if not have:
                    continue
                sel = ",".join(f'"{_ident(f)}"' for f in have)
            cond = _where(m, start_ns, end_ns, words) + skip
            stmts.append(f'SELECT {sel} FROM "{_ident(m)}" WHERE {cond} GROUP BY *')
            order.append(m)
        if not stmts:
            return {}
        parts: dict[str, list[Rows]] = {m: [] for m in order}
        if self.multi or len(stmts) == 1:
            try:
                for i, s in self._series(";".join(stmts)):
                    parts[order[i]].append(_series_rows(order[i], s, series, self._types[order[i]][1]))
                return {m: Rows.concat(m, p) for m, p in parts.items() if p}
            except GpufleetError as exc:
                if len(stmts) == 1 or "HTTP 4" not in str(exc):
                    raise
                self.multi = False  # a server that takes one statement per request: ask one at a time
                parts = {m: [] for m in order}
        for m, q in zip(order, stmts, strict=True):
            for _i, s in self._series(q):
                parts[m].append(_series_rows(m, s, series, self._types[m][1]))
        return {m: Rows.concat(m, p) for m, p in parts.items() if p}

    def counts(
        self,
        wanted: dict[str, set[str] | None],
        start_ns: int,
        end_ns: int,
        bucket_s: int,
        words: dict[str, tuple[tuple[str, ...], tuple[str, ...]]] | None = None,
        not_hosts: list[str] | None = None,
    ) -> dict[tuple[str, str, int], int]:
        """Per (measurement, host tag, bucket start ns): how many of the rows :meth:`query` would
        read in [start, end) InfluxDB holds, at least (the largest count of the fields read; a row
        has one of them). One cheap statement per measurement (``count`` by host and
        ``time(bucket)``), all in one request; no row is sent."""
        out: dict[tuple[str, str, int], int] = {}
        for m, fields in wanted.items():
            types = self.field_types(m, fields)
            if not types:
                continue
            have = sorted(types if fields is None else (f for f in fields if f in types))
            if not have:
                continue
            sel = ",".join(f'count("{_ident(f)}")' for f in have)
            cond = _where(m, start_ns, end_ns, words)
            if not_hosts:
                cond += ' AND "host" !~ /^(' + "|".join(_regex(h) for h in not_hosts) + ")$/"
            q = f'SELECT {sel} FROM "{_ident(m)}" WHERE {cond} GROUP BY "host", time({int(bucket_s)}s)'
            for res in _results(self, self._get(q, chunked=False)):
                for s in res.get("series", []):
                    host = (s.get("tags") or {}).get("host")
                    if host is None:
                        continue
                    for v in s.get("values", []):
                        n = max((c for c in v[1:] if isinstance(c, int)), default=0)
                        if n and isinstance(v[0], int):
                            out[(m, host, v[0])] = n
        return out

    def _series(self, q: str) -> Iterator[tuple[int, dict]]:
        r = self._get(q)
        for res in _results(self, r, lines=True):
            for s in res.get("series", []):
                yield res.get("statement_id", 0), s

    def first_time(self, measurements, start_ns: int, end_ns: int) -> int | None:
        """The time of the earliest point of any of ``measurements`` in [start, end), or None:
        where the next data is, found with one cheap query instead of walking empty windows."""
        names = ",".join(f'"{_ident(m)}"' for m in measurements)
        q = f"SELECT * FROM {names} WHERE time >= {int(start_ns)} AND time < {int(end_ns)} LIMIT 1"
        first = None
        for res in _results(self, self._get(q, chunked=False)):
            for s in res.get("series", []):
                for v in s.get("values", [])[:1]:
                    if isinstance(v[0], int) and (first is None or v[0] < first):
                        first = v[0]
        return first

    def write(self, lines: list[str]) -> None:
        import requests

        if not lines:
            return
        try:
            r = self.s.post(
                self.url + "/write",
                params={"db": self.db, "precision": "ns"},
                data="\n".join(lines).encode(),
                timeout=self.timeout,
            )
        except requests.RequestException as exc:
            raise GpufleetError(f"InfluxDB at {self.url} unreachable: {type(exc).__name__}") from None
        if r.status_code != 204:
            raise GpufleetError(f"InfluxDB at {self.url}: write failed: HTTP {r.status_code} "
                                f"{self._answer(r)}")


def pull(
    influx: Influx,
    wanted: dict[str, set[str] | None],
    start_ns: int,
    end_ns: int,
    series: SeriesIndex,
    step_ns: int = int(300e9),
    target_rows: int = BATCH_ROWS,
    words: dict[str, tuple[tuple[str, ...], tuple[str, ...]]] | None = None,
    not_hosts: list[str] | None = None,
) -> Iterator[tuple[int, int, dict[str, Rows]]]:
    """[start, end) in time order as (batch start, batch end, rows): few, large requests.

    Where data is, is found first (:meth:`Influx.first_time`): a range that begins with days of
    nothing costs one query, and so does a hole in the middle. Each batch asks for all
    measurements at once; its time span adapts so that a batch holds about ``target_rows``
    rows (a small fleet is read hours at a time, a large one seconds at a time).
    """
    names = list(wanted)
    t = int(start_ns)
    step = max(int(1e9), int(step_ns))
    while t < end_ns:
        first = influx.first_time(names, t, end_ns)
        if first is None:
            return
        t = max(t, first - first % int(1e9))  # the second the data begins in
        while t < end_ns:
            b = min(int(end_ns), t + step)
            rows = influx.query(wanted, t, b, series, words, not_hosts)
            n = sum(len(r) for r in rows.values())
            yield t, b, rows
            t = b
            if not n:
                break  # an empty batch: look for where the data goes on
            # the next batch's span: about target_rows at this batch's density
            step = int(min(max(step * target_rows / n, step / 4), step * 4, 86400e9))
            step = max(step, int(1e9))


def ahead(it: Iterator, depth: int = 1) -> Iterator:
    """``it``'s items, produced ``depth`` ahead in a thread: the next batch's query runs (in
    InfluxDB, on another core) while this one is analysed. An error is raised where it would
    have been; closing the result stops the thread after its current item."""
    import queue
    import threading

    q: queue.Queue = queue.Queue(maxsize=depth)
    stop = threading.Event()
    done = object()

    def work():
        try:
            for x in it:
                q.put((x, None))
                if stop.is_set():
                    return
            q.put((done, None))
        except BaseException as exc:  # noqa: BLE001 - handed to the consumer, raised there
            q.put((done, exc))

    th = threading.Thread(target=work, name="pull-ahead", daemon=True)
    th.start()
    try:
        while True:
            x, exc = q.get()
            if exc is not None:
                raise exc
            if x is done:
                return
            yield x
    finally:
        stop.set()
        while th.is_alive():  # unblock a producer waiting on a full queue
            try:
                q.get(timeout=0.1)
            except queue.Empty:
                pass


def _regex(text: str) -> str:
    """``text`` as a literal inside an InfluxQL /regex/ (RE2 accepts any punctuation escaped)."""
    return "".join(c if c.isalnum() or c == "_" else "\\" + c for c in text)


def _ident(name: str) -> str:
    return name.replace("\\", "\\\\").replace('"', '\\"')


def _where(m: str, start_ns: int, end_ns: int, words) -> str:
    """The time range, and the tag words a row of ``m`` must have (see :meth:`Influx.query`)."""
    cond = f"time >= {int(start_ns)} AND time < {int(end_ns)}"
    if words and m in words:
        keys, alternatives = words[m]
        rx = "(" + "|".join(_regex(w) for w in alternatives) + ")"
        cond += " AND (" + " OR ".join(f'"{_ident(k)}" =~ /(?i){rx}/' for k in keys) + ")"
    return cond


def _results(influx: Influx, r, lines: bool = False) -> Iterator[dict]:
    """The ``results`` of a /query answer (each line of a chunked one); errors raise."""
    docs = r.iter_lines(chunk_size=1 << 20) if lines else [r.content]
    for line in docs:
        if not line:
            continue
        try:
            doc = json.loads(line)
        except ValueError:
            raise GpufleetError(f"InfluxDB at {influx.url}: an answer that is not JSON") from None
        if "error" in doc:
            raise GpufleetError(f"InfluxDB at {influx.url}: {doc['error']}")
        for res in doc.get("results", []):
            if "error" in res:
                err = res["error"]
                if "database not found" in err:
                    raise GpufleetError(f"InfluxDB at {influx.url}: database {influx.db!r} does not exist")
                raise GpufleetError(f"InfluxDB at {influx.url}: {err}")
            yield res


def _series_rows(measurement: str, s: dict, series: SeriesIndex, types: dict[str, str] | None = None) -> Rows:
    """One series of a ``GROUP BY *`` answer -> Rows, converted a column at a time."""
    tags = {k: v for k, v in (s.get("tags") or {}).items() if v not in (None, "")}
    sid = series.add(measurement, tags)
    cols = s.get("columns", [])
    vals = s.get("values", [])
    n = len(vals)
    r = Rows(measurement, np.full(n, sid, np.int64), np.zeros(n, np.int64))
    if not n:
        return r
    a = np.array(vals, dtype=object)
    if a.ndim != 2 or a.shape[1] != len(cols):  # ragged rows: not an answer InfluxDB gives
        raise GpufleetError(f"{measurement}: malformed query answer (rows of unequal length)")
    types = types or {}
    for j, name in enumerate(cols):
        col = a[:, j]
        if name == "time":
            r.t = col.astype(np.int64)
            continue
        if name in tags:
            continue
        absent = np.equal(col, None)
        if absent.all():
            continue
        if types.get(name) != "string":
            try:
                r.num[name] = (np.where(absent, np.nan, col) if absent.any() else col).astype(np.float64)
                continue
            except (ValueError, TypeError):
                pass  # a string where the schema said number (a field type conflict): keep it as text
        r.text[name] = np.array([None if v is None else str(v) for v in col.tolist()], dtype=object)
    return r


def backoff(attempt: int, base: float = 1.0, cap: float = 60.0) -> float:
    return min(cap, base * 2 ** min(attempt, 10))


def sleep(seconds: float) -> None:
    time.sleep(seconds)
