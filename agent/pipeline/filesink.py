"""The ``file`` exporter: line protocol in segment files, the embedded default.

``DIR/gpufleet-<host>-<UTC start>.lp`` is the open segment: every tick is one ``write`` of whole
lines, flushed. A segment is closed after ``segment_bytes`` or ``segment_age`` and, with
``compress = true``, gzipped to ``.lp.gz`` (the analyzer reads both). On start a torn last line
(a crash mid-write) is cut off, so every file stays parseable. When the directory holds more
than ``keep_bytes`` the oldest closed segments are deleted.
"""

from __future__ import annotations

import gzip
import logging
import os
import re
import shutil
import time
from pathlib import Path

from gpufleet.agent.model import STATE_DIR, Exporter, register_exporter

from gpufleet.errors import ConfigError
from gpufleet.options import Option

log = logging.getLogger("gpufleet.agent.file")

_SAFE = re.compile(r"[^A-Za-z0-9_.-]+")


@register_exporter("file")
class FileSink(Exporter):
    lines = True
    options = (  # the [file] section
        Option("dir", "path", f"{STATE_DIR}/telemetry", "under the unit's `StateDirectory`"),
        Option("segment_bytes", "size", 64 * 2**20, "", 4096, 2**40),
        Option("segment_age", "duration", 3600.0, "", 1.0, 7 * 86400.0),
        Option("compress", "bool", True, "closed segments become .lp.gz"),
        Option("keep_bytes", "size", 4 * 2**30, "oldest closed segments deleted beyond", 0, 2**50),
    )

    @classmethod
    def describe(cls, table: dict) -> str:
        return str(table["dir"])

    @classmethod
    def build(cls, table: dict, agent) -> FileSink:
        return cls(table["dir"], agent.host, table["segment_bytes"], table["segment_age"], table["compress"],
                   table["keep_bytes"])

    def __init__(self, directory: str | Path, host: str = "host", segment_bytes: int = 64 * 2**20,
                 segment_age: float = 3600.0, compress: bool = True, keep_bytes: int = 4 * 2**30):
        self.dir = Path(directory)
        try:
            self.dir.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise ConfigError(f"file.dir {self.dir}: {exc.strerror or exc}") from None
        if not os.access(self.dir, os.W_OK):
            raise ConfigError(f"file.dir {self.dir}: not writable")
        self.host = _SAFE.sub("_", host)[:64] or "host"
        self.segment_bytes = segment_bytes
        self.segment_age = segment_age
        self.compress = compress
        self.keep_bytes = keep_bytes
        self._fh = None
        self._size = 0
        self._opened = 0.0
        self._path: Path | None = None
        # only this host's own segments: agents sharing a directory never touch each other's open files
        self._own = re.compile(rf"gpufleet-{re.escape(self.host)}-\d{{8}}T\d{{6}}Z(?:-\d+)?\.lp(?:\.gz)?")
        for p in self.dir.glob("*.lp"):
            if not self._own.fullmatch(p.name):
                continue
            _cut_torn_tail(p)
            if compress:
                _gzip(p)

    def _open(self) -> None:
        stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
        path = self.dir / f"gpufleet-{self.host}-{stamp}.lp"
        n = 1
        while path.exists() or path.with_suffix(".lp.gz").exists():
            path = self.dir / f"gpufleet-{self.host}-{stamp}-{n}.lp"
            n += 1
        self._path = path
        self._fh = open(path, "ab")
        self._size = 0
        self._opened = time.monotonic()

    def write(self, lines: list[str]) -> None:
        if not lines:
            return
        if self._fh is None:
            self._open()
        data = ("\n".join(lines) + "\n").encode("utf-8")
        self._fh.write(data)
        self._fh.flush()
        self._size += len(data)
        if self._size >= self.segment_bytes or time.monotonic() - self._opened >= self.segment_age:
            self.rotate()

    def rotate(self) -> None:
        if self._fh is None:
            return
        self._fh.close()
        self._fh = None
        if self.compress and self._path is not None:
            _gzip(self._path)
        self._trim()

    def _trim(self) -> None:
        files = sorted((p for p in self.dir.iterdir() if self._own.fullmatch(p.name)),
                       key=lambda p: p.stat().st_mtime)
        total = sum(p.stat().st_size for p in files)
        for p in files:
            if total <= self.keep_bytes or p == self._path:
                break
            total -= p.stat().st_size
            p.unlink(missing_ok=True)

    def close(self) -> None:
        if self._fh is not None:
            self._fh.close()
            self._fh = None


def _cut_torn_tail(path: Path) -> None:
    with open(path, "rb+") as f:
        f.seek(0, os.SEEK_END)
        size = f.tell()
        if size == 0:
            return
        f.seek(size - 1)
        if f.read(1) == b"\n":
            return
        back = min(size, 1 << 20)
        f.seek(size - back)
        tail = f.read(back)
        cut = tail.rfind(b"\n")
        f.truncate(size - back + cut + 1 if cut >= 0 else 0)
        log.warning("%s: cut a torn last line", path.name)


def _gzip(path: Path) -> None:
    if not path.exists() or path.stat().st_size == 0:
        path.unlink(missing_ok=True)
        return
    gz = path.with_suffix(".lp.gz")
    tmp = path.with_suffix(".lp.gz.tmp")
    with open(path, "rb") as src, gzip.open(tmp, "wb", compresslevel=6) as dst:
        shutil.copyfileobj(src, dst)
    os.replace(tmp, gz)
    path.unlink()
