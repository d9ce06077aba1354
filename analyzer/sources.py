"""Where telemetry comes from: line-protocol files, or InfluxDB through InfluxQL over ``/query``.

InfluxQL is the one query language InfluxDB 1.x, 2.x (DBRP mapping) and 3.x all answer.
Queries ask for ``epoch=ns`` and ``chunked=true``; each series' columns are turned straight
into the analyzer's :class:`~analyzer.parse.Rows`.
"""

from __future__ import annotations

import gzip
import json
import time
import zlib
from collections.abc import Iterator
from pathlib import Path

import numpy as np

from analyzer.parse import Rows, SeriesIndex
from gpufleet.errors import GpufleetError

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
    """Bytes of every line-protocol file under ``path``, in chunks that end at a line end."""
    for f in lp_files(path):
        try:
            opener = gzip.open if f.name.endswith(".gz") else open
            with opener(f, "rb") as fh:
                rest = b""
                while True:
                    try:
                        block = fh.read(chunk)
                    except (EOFError, OSError, zlib.error) as exc:
                        # a truncated gzip (a file still being written): keep what was readable
                        if rest:
                            yield rest
                        raise GpufleetError(f"{f}: unreadable ({exc})") from None
                    if not block:
                        break
                    block = rest + block
                    cut = block.rfind(b"\n")
                    if cut < 0:
                        rest = block
                        continue
                    rest = block[cut + 1 :]
                    yield block[: cut + 1]
                if rest:
                    yield rest
        except PermissionError as exc:
            raise GpufleetError(f"{f}: {exc.strerror}") from None


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
