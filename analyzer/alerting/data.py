"""Telemetry for incident pages: read only what the pages plot from line-protocol files.

A source is a ``.lp``/``.lp.gz`` file, a directory of them (searched recursively) or an
iterable of :class:`gpufleet.lineprotocol.Point`. Lines are filtered on measurement and host
before parsing, so a large fleet file costs little more than reading it. Unparsable lines are
skipped and counted.
"""

from __future__ import annotations

import gzip
import re
from collections import defaultdict
from collections.abc import Iterable
from pathlib import Path

from gpufleet.errors import GpufleetError
from gpufleet.lineprotocol import ParseError, Point, parse_line

MEASUREMENTS = ("gpu", "gpu_nvlink", "gpu_canary", "gpu_event")
_HOST = re.compile(r",host=((?:[^,\\ ]|\\.)+)")
_UNESC = re.compile(r"\\([ ,=\\])")


class Series:
    """Values per (measurement, host, gpu, link) and field: ``data[key][field] = [(t_s, v), ...]``."""

    def __init__(self):
        self.data: dict[tuple, dict[str, list[tuple[float, object]]]] = defaultdict(lambda: defaultdict(list))
        self.events: list[Point] = []
        self.skipped = 0

    def add(self, p: Point) -> None:
        if p.measurement == "gpu_event":
            self.events.append(p)
            return
        gpu = _int(p.tags.get("gpu"))
        link = _int(p.tags.get("link"))
        key = (p.measurement, p.tags.get("host"), gpu, link)
        t = p.time / 1e9
        for f, v in p.fields.items():
            if isinstance(v, bool):
                v = int(v)
            self.data[key][f].append((t, v))

    def finish(self) -> Series:
        for fields in self.data.values():
            for f in fields:
                fields[f].sort(key=lambda tv: tv[0])
        self.events.sort(key=lambda p: p.time)
        return self

    def keys(self, measurement: str, host: str | None) -> list[tuple]:
        return sorted((k for k in self.data if k[0] == measurement and k[1] == host),
                      key=lambda k: (k[2] if k[2] is not None else -1, k[3] if k[3] is not None else -1))

    def last_time(self, host: str | None) -> float | None:
        ts = [v[-1][0] for k, fs in self.data.items() if k[1] == host for v in fs.values() if v]
        return max(ts) if ts else None


def _int(s: str | None) -> int | None:
    try:
        return int(s) if s is not None else None
    except ValueError:
        return None


def _files(path: Path) -> list[Path]:
    if path.is_file():
        return [path]
    if path.is_dir():
        return sorted(p for p in path.rglob("*") if p.is_file() and (p.name.endswith(".lp")
                                                                       or p.name.endswith(".lp.gz")))
    raise GpufleetError(f"{path}: no such file or directory")


def load(source, hosts: set[str | None], windows: list[tuple[float, float]]) -> Series:
    """Points of ``MEASUREMENTS`` on ``hosts`` inside any of ``windows`` (seconds)."""
    out = Series()
    lo = min((w[0] for w in windows), default=0.0) * 1e9
    hi = max((w[1] for w in windows), default=0.0) * 1e9
    prefixes = tuple(m + "," for m in MEASUREMENTS)

    def keep(p: Point) -> bool:
        return (p.measurement in MEASUREMENTS and p.tags.get("host") in hosts and p.time is not None
                and lo <= p.time <= hi)

    if isinstance(source, (str, Path)):
        files = _files(Path(source))
        if not files:
            raise GpufleetError(f"{source}: no .lp or .lp.gz files")
        for f in files:
            opener = gzip.open if f.name.endswith(".gz") else open
            try:
                with opener(f, "rt", encoding="utf-8", errors="replace") as fh:
                    for line in fh:
                        if not line.startswith(prefixes):
                            continue
                        m = _HOST.search(line)
                        if not m or _UNESC.sub(r"\1", m.group(1)) not in hosts:
                            continue
                        try:
                            p = parse_line(line)
                        except (ParseError, ValueError):
                            out.skipped += 1
                            continue
                        if keep(p):
                            out.add(p)
            except (OSError, EOFError) as exc:
                raise GpufleetError(f"{f}: cannot read: {exc}") from None
    elif isinstance(source, Iterable):
        for p in source:
            if keep(p):
                out.add(p)
    else:
        raise GpufleetError(f"incident pages: unsupported data source {type(source).__name__}")
    return out.finish()
