"""Where telemetry comes from: line-protocol files, or InfluxDB through InfluxQL over ``/query``.

InfluxQL is the one query language InfluxDB 1.x, 2.x (DBRP mapping) and 3.x all answer.
Queries ask for ``epoch=ns`` and ``chunked=true``; each series' columns are turned straight
into the analyzer's :class:`~analyzer.parse.Rows`.
"""

from __future__ import annotations

import json
import time
import zlib
from collections.abc import Iterator
from pathlib import Path

import numpy as np

from analyzer.parse import Rows, SeriesIndex
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
            if rest:
                yield rest + block[: cut + 1]
            else:
                yield block if cut == len(block) - 1 else block[: cut + 1]
            rest = block[cut + 1 :]
        if rest:
            yield rest + b"\n"
    except PermissionError as exc:
        raise GpufleetError(f"{f}: {exc.strerror}") from None


def _raw_blocks(f: Path, chunk: int) -> Iterator[bytes]:
    with open(f, "rb") as fh:
        while block := fh.read(chunk):
            yield block


def _gz_blocks(f: Path, chunk: int) -> Iterator[bytes]:
    """Decompressed blocks of about ``chunk`` bytes: inflate on large reads (members concatenated,
    as ``gzip`` reads them); a truncated file raises EOFError after its readable part."""
    with open(f, "rb") as fh:
        d = inflate.decompressobj(wbits=31)
        out: list[bytes] = []
        size = 0
        started = False
        while raw := fh.read(1 << 18):
            while raw:
                if d.eof:  # another gzip member follows (or trailing zero padding)
                    if not raw.lstrip(b"\0"):
                        break
                    d = inflate.decompressobj(wbits=31)
                started = True
                piece = d.decompress(raw, chunk - size)
                raw = d.unused_data if d.eof else d.unconsumed_tail
                if piece:
                    out.append(piece)
                    size += len(piece)
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


def _line_time(block: bytes, starts: np.ndarray, ends: np.ndarray, i: int) -> int | None:
    """Timestamp of line ``i`` of ``block`` (or of the next line that has one, a few lines on)."""
    n = len(starts)
    for j in range(i, min(n, i + 8)):
        line = block[starts[j] : ends[j]].rstrip(b"\r")
        sp = line.rfind(b" ")
        if sp < 0:
            continue
        try:
            return int(line[sp + 1 :])
        except ValueError:
            continue
    return None


def _pieces(f: Path, chunk: int, span_ns: int) -> Iterator[tuple[int | None, bytes]]:
    """A file's lines in pieces of at most ``span_ns`` of time each, with each piece's first time.

    A file is written in time order (the agent's segments, the simulator's output); a piece is
    cut where a line's time reaches the piece's first time + span (binary search: a few
    timestamps per piece are read, not every line). Out-of-order lines only make pieces uneven.
    """
    for block in _file_chunks(f, chunk):
        nl = np.flatnonzero(np.frombuffer(block, np.uint8) == 10)
        if not len(nl):
            continue
        ends = nl
        starts = np.empty_like(nl)
        starts[0] = 0
        starts[1:] = nl[:-1] + 1
        n = len(starts)
        i = 0
        while i < n:
            t0 = _line_time(block, starts, ends, i)
            if t0 is None:
                yield None, block[starts[i] :]
                break
            lim = t0 + span_ns
            lo, hi = i + 1, n
            while lo < hi:  # first line at or past the limit
                mid = (lo + hi) // 2
                tm = _line_time(block, starts, ends, mid)
                if tm is None or tm < lim:
                    lo = mid + 1
                else:
                    hi = mid
            yield t0, block[starts[i] : ends[lo - 1] + 1]
            i = lo


def _first_time(f: Path) -> int:
    for t, _piece in _pieces_head(f):
        return t if t is not None else -(2**62)
    return 2**62


def _pieces_head(f: Path) -> Iterator[tuple[int | None, bytes]]:
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
    (the hosts writing at the same time), not the history. Pieces are joined into chunks of
    about ``chunk`` bytes for the parser.
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
        if token:
            self.s.headers["Authorization"] = f"Token {token}"
        elif username:
            self.s.auth = (username, password or "")

    def _get(self, q: str, chunked: bool = True):
        import requests

        params = {"q": q, "db": self.db, "epoch": "ns"}
        if chunked:
            params["chunked"] = "true"
            params["chunk_size"] = "20000"
        try:
            r = self.s.get(self.url + "/query", params=params, timeout=self.timeout, stream=True)
        except requests.RequestException as exc:
            raise GpufleetError(f"InfluxDB at {self.url} unreachable: {type(exc).__name__}") from None
        if r.status_code in (401, 403):
            raise GpufleetError(f"InfluxDB at {self.url}: not authorised (HTTP {r.status_code})")
        if r.status_code >= 400:
            raise GpufleetError(f"InfluxDB at {self.url}: HTTP {r.status_code}: {r.text[:200].strip()}")
        return r

    def check(self) -> None:
        """Raise GpufleetError unless the server answers and the database exists."""
        r = self._get("SHOW DATABASES", chunked=False)
        try:
            names = [v[0] for s in r.json()["results"][0].get("series", []) for v in s.get("values", [])]
        except (ValueError, KeyError, IndexError, TypeError):
            raise GpufleetError(f"InfluxDB at {self.url}: unexpected answer to SHOW DATABASES") from None
        if self.db not in names:
            raise GpufleetError(f"InfluxDB at {self.url}: database {self.db!r} does not exist")

    def query_rows(self, measurement: str, start_ns: int, end_ns: int, series: SeriesIndex) -> Rows:
        """Every point of ``measurement`` in [start, end) as Rows (tags become the series)."""
        q = f'SELECT * FROM "{measurement}" WHERE time >= {int(start_ns)} AND time < {int(end_ns)} GROUP BY *'
        r = self._get(q)
        parts = []
        for line in r.iter_lines():
            if not line:
                continue
            try:
                doc = json.loads(line)
            except ValueError:
                continue
            for res in doc.get("results", []):
                if "error" in res:
                    err = res["error"]
                    if "database not found" in err:
                        raise GpufleetError(f"InfluxDB at {self.url}: database {self.db!r} does not exist")
                    raise GpufleetError(f"InfluxDB at {self.url}: {err}")
                for s in res.get("series", []):
                    parts.append(_series_rows(measurement, s, series))
        return Rows.concat(measurement, parts)

    def first_time(self, measurements, start_ns: int, end_ns: int) -> int | None:
        """The earliest timestamp in [start, end) over ``measurements`` (None: no data): where a
        batch analysis jumps to instead of querying empty windows one by one."""
        best = None
        for m in measurements:
            q = f'SELECT * FROM "{m}" WHERE time >= {int(start_ns)} AND time < {int(end_ns)} LIMIT 1'
            try:
                res = self._get(q, chunked=False).json()["results"][0]
                t = int(res["series"][0]["values"][0][0])
            except (ValueError, KeyError, IndexError, TypeError):
                continue
            best = t if best is None else min(best, t)
        return best

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
            raise GpufleetError(f"InfluxDB at {self.url}: write failed: HTTP {r.status_code} {r.text[:200]}")


def _series_rows(measurement: str, s: dict, series: SeriesIndex) -> Rows:
    tags = {k: v for k, v in (s.get("tags") or {}).items() if v not in (None, "")}
    sid = series.add(measurement, tags)
    cols = s.get("columns", [])
    vals = s.get("values", [])
    n = len(vals)
    r = Rows(measurement, np.full(n, sid, np.int64), np.zeros(n, np.int64))
    if not n:
        return r
    columns = list(zip(*vals, strict=True))
    for name, col in zip(cols, columns, strict=True):
        if name == "time":
            r.t = np.array(col, np.int64)
            continue
        if name in tags:
            continue
        kinds = {type(v) for v in col if v is not None}
        if kinds and kinds <= {int, float, bool}:
            r.num[name] = np.array([np.nan if v is None else float(v) for v in col])
        elif kinds:
            r.text[name] = np.array([None if v is None else str(v) for v in col], dtype=object)
    return r


def backoff(attempt: int, base: float = 1.0, cap: float = 60.0) -> float:
    return min(cap, base * 2 ** min(attempt, 10))


def sleep(seconds: float) -> None:
    time.sleep(seconds)
