"""Durations in scenario files and on the command line (times: :mod:`gpufleet.times`)."""

from __future__ import annotations

from gpufleet import units


def parse_duration(value, what: str = "duration") -> float:
    """Seconds of a duration: :func:`gpufleet.units.parse_duration` (GpufleetError when bad)."""
    return units.parse_duration(value, what)
