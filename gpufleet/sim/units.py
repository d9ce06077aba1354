"""Durations in scenario files and on the command line (times: :mod:`gpufleet.times`)."""

from __future__ import annotations

import re

from gpufleet.errors import GpufleetError

_UNITS = {"ms": 0.001, "s": 1.0, "m": 60.0, "min": 60.0, "h": 3600.0, "d": 86400.0, "w": 604800.0}
_PART = re.compile(r"(\d+(?:\.\d+)?)(ms|min|s|m|h|d|w)?")


def parse_duration(value, what: str = "duration") -> float:
    """'6h', '10s', '1h30m', '500ms', 3600 -> seconds (float). Negative or garbled -> GpufleetError."""
    if isinstance(value, bool):
        raise GpufleetError(f"bad {what}: {value!r}")
    if isinstance(value, int | float):
        if not value >= 0:
            raise GpufleetError(f"bad {what}: {value!r} (must be >= 0)")
        return float(value)
    if not isinstance(value, str):
        raise GpufleetError(f"bad {what}: {value!r}")
    text = value.replace(" ", "").lower()
    pos, total = 0, 0.0
    while pos < len(text):
        m = _PART.match(text, pos)
        if not m or m.end() == pos:
            break
        total += float(m.group(1)) * _UNITS[m.group(2) or "s"]
        pos = m.end()
    if not text or pos != len(text):
        raise GpufleetError(f"bad {what}: {value!r} (expected e.g. 10s, 30m, 6h, 1d)")
    return total
