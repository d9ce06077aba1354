"""Durations and times in scenario files and on the command line."""

from __future__ import annotations

from datetime import UTC, datetime

from gpufleet import units
from gpufleet.errors import GpufleetError


def parse_duration(value, what: str = "duration") -> float:
    """Seconds of a duration: :func:`gpufleet.units.parse_duration` (GpufleetError when bad)."""
    return units.parse_duration(value, what)


def parse_time(value, what: str = "time") -> float:
    """RFC 3339 ('2026-01-01T00:00:00Z') or epoch seconds -> epoch seconds."""
    if isinstance(value, datetime):
        return (value if value.tzinfo else value.replace(tzinfo=UTC)).timestamp()
    if isinstance(value, int | float) and not isinstance(value, bool):
        return float(value)
    if isinstance(value, str):
        try:
            dt = datetime.fromisoformat(value.strip().replace("Z", "+00:00"))
        except ValueError:
            raise GpufleetError(f"bad {what}: {value!r} (expected RFC 3339)") from None
        return (dt if dt.tzinfo else dt.replace(tzinfo=UTC)).timestamp()
    raise GpufleetError(f"bad {what}: {value!r}")
