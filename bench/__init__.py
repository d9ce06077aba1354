"""Benchmarks (``python -m bench.run``): each module's rows, printed as one table."""

from __future__ import annotations

from pathlib import Path


def sim(out: Path, scenario: str, nodes: int, duration: str, seed: int, level: int = 3) -> None:
    """Simulate a fleet into ``out`` (``gpufleet sim``, 10 s steps, gzip ``level``, in this process)."""
    from gpufleet.cli import main

    args = ["sim", "--nodes", str(nodes), "--duration", duration, "--step", "10s", "--seed", str(seed),
            "--compress-level", str(level)]
    if main([*args, "--scenario", str(scenario), "--out", str(out), "--no-progress"]):
        raise RuntimeError(f"gpufleet sim {scenario} failed")
