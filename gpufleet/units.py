"""Durations, the one parser every config file and command line uses.

A duration is a number of seconds (``10``, ``2.5``, ``"1e3"``) or one or more number+unit parts
(``"500ms"``, ``"10s"``, ``"5m"``, ``"1h30m"``, ``"2d"``, ``"1w"``; units ``ms s m min h d w``,
spaces and case ignored). Negative, non-finite and garbled values raise ``error`` (a
:class:`~gpufleet.errors.GpufleetError` subclass) with one line naming ``what`` (the key or flag).
"""

from __future__ import annotations

import math
import re

from gpufleet.errors import GpufleetError

UNITS = {"ms": 0.001, "s": 1.0, "m": 60.0, "min": 60.0, "h": 3600.0, "d": 86400.0, "w": 604800.0}
_PART = re.compile(r"(\d+(?:\.\d*)?|\.\d+)(ms|min|s|m|h|d|w)?")
EXAMPLES = "e.g. 10, 30s, 5m, 1h30m, 2d"


def format_duration(seconds: float) -> str:
    """A duration as the config writes it: the largest whole unit (``"10s"``, ``"5m"``, ``"6h"``,
    ``"2d"``), else seconds (``"90s"``, ``"0.5s"``)."""
    for unit, n in (("d", 86400), ("h", 3600), ("m", 60), ("s", 1)):
        if seconds >= n and seconds % n == 0:
            return f"{int(seconds // n)}{unit}"
    return f"{seconds:g}s"


def parse_duration(value, what: str = "duration", error: type[GpufleetError] = GpufleetError) -> float:
    """``'6h'``, ``'10s'``, ``'1h30m'``, ``'2d'``, ``'500ms'``, ``3600`` -> seconds (float)."""
    if isinstance(value, int | float) and not isinstance(value, bool):
        seconds = float(value)
    elif isinstance(value, str):
        seconds = _parse_text(value.replace(" ", "").replace("\t", "").lower())
    else:
        seconds = math.nan
    if not (math.isfinite(seconds) and seconds >= 0):
        raise error(f"{what}: bad duration {value!r} ({EXAMPLES}; not negative)")
    return seconds


def _parse_text(text: str) -> float:
    pos, total = 0, 0.0
    while pos < len(text):
        m = _PART.match(text, pos)
        if not m:
            break
        total += float(m.group(1)) * UNITS[m.group(2) or "s"]
        pos = m.end()
    if text and pos == len(text):
        return total
    try:  # plain seconds in any float spelling ("1e3", "+5")
        return float(text)
    except ValueError:
        return math.nan


_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(B|KiB|MiB|GiB|KB|MB|GB)?\s*$", re.IGNORECASE)
SIZE_UNITS = {"b": 1, "kib": 2**10, "mib": 2**20, "gib": 2**30, "kb": 10**3, "mb": 10**6, "gb": 10**9}


def parse_size(value, what: str = "size", error: type[GpufleetError] = GpufleetError,
               minimum: int = 0) -> int:
    """Bytes of a size: an integer or ``"512MiB"``, ``"64 KB"`` (units B KiB MiB GiB KB MB GB, any
    case). Garbled values and sizes below ``minimum`` raise ``error`` with one line naming ``what``."""
    if isinstance(value, int) and not isinstance(value, bool):
        n = value
    elif isinstance(value, str) and (m := _SIZE.match(value)):
        n = int(float(m.group(1)) * SIZE_UNITS[(m.group(2) or "b").lower()])
    else:
        n = minimum - 1
    if n < minimum:
        raise error(f"{what}: expected a size like 536870912 or \"512MiB\", got {value!r}")
    return n
