"""Telemetry for incident pages: read only what the pages plot from line-protocol files.

A source is a ``.lp``/``.lp.gz`` file, a directory of them (searched recursively) or an
iterable of :class:`gpufleet.lineprotocol.Point`. Lines are filtered on measurement and host
before parsing, so a large fleet file costs little more than reading it. Unparsable lines are
skipped and counted.
"""

from __future__ import annotations

import gzip
import math
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


_SAFE = re.compile(r"[A-Za-z0-9_.,=:/\\ +-]+\n?")
_HEAD = re.compile(r"((?:[^ \\]|\\.)+) ([^ ]+) (\d+)\r?\n?\Z")
_TAG_SEP = re.compile(r"(?<!\\),")
_INT = re.compile(r"-?\d+i")
_FLOAT = re.compile(r"-?(?:\d+\.?\d*|\.\d+)(?:[eE][-+]?\d+)?")
_ANY = re.compile(r"-?\d{1,18}i|-?(?:\d+\.?\d*|\.\d+)(?:[eE][-+]?\d{1,2})?"
                  r"|[tT]|true|True|TRUE|[fF]|false|False|FALSE")


def _plain(line: str, fields: frozenset[str]) -> Point | None:
    """The common line (no quotes, no escapes) read fast, only its ``fields``; None: let the full
    parser judge it (it skips what does not parse)."""
    if len(line) > 4096 or not _SAFE.fullmatch(line):  # (the parser's limits are far above)
        return None
    m = _HEAD.match(line)
    if m is None:
        return None
    head, body, ts = m.groups()
    if "\\" in body or "\\\\" in head or len(ts) > 19 or int(ts) > 9223372036854775806:
        return None
    meas, *tag_parts = _TAG_SEP.split(head)
    if "\\" in meas:
        return None
    tags = {}
    for t in tag_parts:
        k, eq, v = t.partition("=")
        if not eq or not k or not v or "\\" in k or "=" in v or k in tags or k == "time":
            return None
        tags[k] = _UNESC.sub(r"\1", v)
    vals: dict[str, object] = {}
    keys = body.split(",")
    if len(set(keys)) != len(keys):
        return None
    seen = set()
    for kv in keys:
        k, eq, v = kv.partition("=")
        if not eq or not k or not v or k in seen or k == "time":
            return None
        seen.add(k)
        if k not in fields:
            if not _ANY.fullmatch(v):  # a line the parser refuses is skipped, whatever it holds
                return None
            continue
        if v in ("t", "T", "true", "True", "TRUE", "f", "F", "false", "False", "FALSE"):
            vals[k] = v[0] in "tT"
        elif _INT.fullmatch(v) and len(v) < 20:
            vals[k] = int(v[:-1])
        elif _FLOAT.fullmatch(v) and len(v) < 24 and math.isfinite(x := float(v)):
            vals[k] = x
        else:
            return None
    return Point(meas, tags, vals, int(ts))


def load(source, hosts: set[str | None], windows: list[tuple[float, float]],
         wanted: dict[str, set[str | None]] | None = None,
         fields: dict[str, set[str]] | None = None) -> Series:
    """Points of ``MEASUREMENTS`` on ``hosts`` inside any of ``windows`` (seconds); ``wanted``
    narrows it to the hosts each measurement is read for (``{"gpu_nvlink": {"node01"}}``: only
    node01's NVLink rows, by far the most numerous, are parsed) and ``fields`` to the fields each
    is read for (the others are never converted)."""
    fast = {m: frozenset(f) for m, f in (fields or {}).items()}
    out = Series()
    lo = min((w[0] for w in windows), default=0.0) * 1e9
    hi = max((w[1] for w in windows), default=0.0) * 1e9
    wanted = wanted if wanted is not None else {m: hosts for m in MEASUREMENTS}
    prefixes = tuple(m + "," for m in MEASUREMENTS if wanted.get(m))

    def keep(p: Point) -> bool:
        return (p.tags.get("host") in wanted.get(p.measurement, ()) and p.time is not None
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
                        meas = line[:line.index(",")]
                        if not m or _UNESC.sub(r"\1", m.group(1)) not in wanted[meas]:
                            continue
                        try:
                            p = _plain(line, fast[meas]) if meas in fast else None
                            p = p if p is not None else parse_line(line)
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
