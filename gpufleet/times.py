"""The one parser and formatter of points in time, for every file, config and command line.

``parse_time`` accepts RFC 3339 / ISO 8601 (``2026-11-26T03:00:00Z``, ``...+02:00``,
``2026-11-26 03:00:00``), epoch seconds (a number, or a string of digits) and ``datetime``
objects. **A time written without a zone is UTC**, never the local time of the machine reading
it: a truth file, a scenario and a ``--start`` mean the same instant on every host.
``to_rfc3339`` writes UTC with a ``Z``.
"""

from __future__ import annotations

import math
from datetime import UTC, datetime

from gpufleet.errors import GpufleetError


class TimeFormatError(GpufleetError, ValueError):
    """A time that cannot be read (a ValueError too, for readers that catch those)."""


def parse_time(value, what: str = "time") -> float:
    """RFC 3339 / ISO 8601 (no zone: UTC), epoch seconds or a datetime -> epoch seconds."""
    if isinstance(value, datetime):
        return (value if value.tzinfo else value.replace(tzinfo=UTC)).timestamp()
    if isinstance(value, int | float) and not isinstance(value, bool):
        if not math.isfinite(value):
            raise TimeFormatError(f"bad {what}: {value!r}")
        return float(value)
    if isinstance(value, str):
        text = value.strip()
        if text and text.lstrip("-").replace(".", "", 1).isdigit():
            return parse_time(float(text), what)  # a digit string too long for a float is refused
        try:
            return parse_time(datetime.fromisoformat(text.replace("Z", "+00:00").replace("z", "+00:00")))
        except ValueError:
            raise TimeFormatError(f"bad {what}: {value!r} (expected RFC 3339, e.g. "
                                  "2026-11-26T03:00:00Z, or epoch seconds)") from None
    raise TimeFormatError(f"bad {what}: {value!r}")


def to_rfc3339(t: float | None) -> str | None:
    """Seconds since the epoch -> RFC 3339 UTC ('2026-11-26T03:00:00Z'); None stays None."""
    if t is None:
        return None
    dt = datetime.fromtimestamp(t, UTC)
    if dt.microsecond:
        return dt.isoformat(timespec="milliseconds").replace("+00:00", "Z")
    return dt.strftime("%Y-%m-%dT%H:%M:%SZ")
