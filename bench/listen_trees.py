"""``--listen`` in two or more checkouts, alternated on the same bodies (docs/benchmarks.md,
"``--listen`` before and after this session's event-time work").

    python -m bench.listen_trees rate NODES DURATION PASSES NAME=TREE [NAME=TREE ...]
    python -m bench.listen_trees memory COPIES:LATE_S [...] NAME=TREE [NAME=TREE ...]

``rate``: the agent-shaped fleet of :func:`bench.bench_online.bench_listen` (NODES x 8 GPUs,
stamped from a minute ahead), POSTed by :func:`bench.bench_online._listen_path` to each tree's
``gpufleet analyze --listen`` in turn, PASSES times: GPU samples per second of the listener's
CPU and its peak RSS. ``memory``: :func:`bench.bench_online.bench_memory`'s runs (the 64-GPU fleet
copied COPIES times, rack r001 of the first copy LATE_S late), each tree in turn.

Every run gets the bodies restamped by the time since the fleet was made, so each one sees its
data start a minute ahead of the clock as the first does (a later pass would otherwise find the
data nearer the clock and cut other windows). A TREE is a checkout whose ``gpufleet`` imports
from its root (``python -m`` runs there): a ``git worktree add --detach`` of an older commit
needs the links ``gpufleet/{agent,analyzer,dashboards}`` to its folders and the compiled
``analyzer/_lpscan*.so`` copied in; this venv's Python runs every tree.
"""

from __future__ import annotations

import os
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from bench import bench_online as bo  # noqa: E402 - after the path line


def _shifted(t: int, line: bytes, d: int) -> bytes:
    return line.rpartition(b" ")[0] + b" " + str(t + d).encode() + b"\n"


def _use(root: str) -> None:
    bo.ROOT = Path(root)
    bo.GPUFLEET = [sys.executable, "-m", "gpufleet"]


def rate(nodes: int, dur: str, passes: int, trees: dict[str, str], tmp: Path) -> None:
    ahead = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(time.time() + 60))
    man = bo._agent_shaped(tmp / "fleet", nodes, dur, start=ahead)
    made = time.time()
    base = bo._timed(tmp / "fleet")
    n_all = man["telemetry"]["lines"].get("gpu", 0)
    print(f"{man['fleet']['gpus']} GPUs x {dur}: {n_all:,} GPU rows, {len(base):,} lines; "
          f"load {os.getloadavg()[0]:.2f}", flush=True)
    for rep in range(passes):
        for name, root in trees.items():
            d = int((time.time() - made) * 1e9)
            body = [_shifted(t, x, d) for t, x in base]
            _use(root)
            n, cpu, took, refused, got, rss, _nb = bo._listen_path(tmp, body, n_all, f"{name}{rep}")
            print(f"{name:10s} pass {rep}: {n / cpu:,.0f} GPU-samples/s per core ({cpu:.2f} s CPU, "
                  f"{took:.1f} s wall), peak RSS {rss:.0f} MiB, windows "
                  f"{got.get('gpufleet_analyzer_windows_total', 0):.0f}, {refused} answered 429; "
                  f"load {os.getloadavg()[0]:.2f}", flush=True)


def memory(runs: list[tuple[int, float]], trees: dict[str, str], tmp: Path) -> None:
    ahead = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(time.time() + 60))
    man = bo._agent_shaped(tmp / "fleet-mem", 8, "90m", start=ahead)
    made = time.time()
    base = bo._timed(tmp / "fleet-mem")
    n_base = man["telemetry"]["lines"].get("gpu", 0)
    for copies, late in runs:
        for name, root in trees.items():
            d = int((time.time() - made) * 1e9)
            shifted = [(t + d, _shifted(t, x, d)) for t, x in base]
            _use(root)
            n, cpu, _took, refused, got, rss, _nb = bo._listen_path(
                tmp, bo._replicated(shifted, copies, late), n_base * copies, f"{name}-mem")
            (tmp / f"{name}-mem.jsonl").unlink(missing_ok=True)
            print(f"{name:10s} {64 * copies:,} GPUs, late {late:.0f} s: peak RSS {rss:.0f} MiB, "
                  f"{n / cpu:,.0f} GPU-samples/s per core, rows analysed late "
                  f"{got.get('gpufleet_analyzer_late_rows_analysed_total', 0):,.0f}, dropped "
                  f"{got.get('gpufleet_analyzer_gap_rows_dropped_total', 0):.0f}, late points "
                  f"{got.get('gpufleet_analyzer_late_points_total', 0):.0f}, {refused} answered 429; "
                  f"load {os.getloadavg()[0]:.2f}", flush=True)


def main(argv: list[str]) -> int:
    trees = dict(a.split("=", 1) for a in argv[1:] if "=" in a)
    rest = [a for a in argv[1:] if "=" not in a]
    bad = [p for p in trees.values() if not (Path(p) / "gpufleet" / "__init__.py").is_file()]
    if not argv or argv[0] not in ("rate", "memory") or not trees or bad:
        print(__doc__.split("\n\n")[1] + (f"\nnot a checkout: {bad[0]}" if bad else ""), file=sys.stderr)
        return 2
    tmp = Path(tempfile.mkdtemp(prefix="listen-trees-"))
    try:
        if argv[0] == "rate":
            if len(rest) != 3 or not rest[0].isdigit() or not rest[2].isdigit():
                print("rate NODES DURATION PASSES NAME=TREE ...", file=sys.stderr)
                return 2
            rate(int(rest[0]), rest[1], int(rest[2]), trees, tmp)
        else:
            try:
                runs = [(int(c), float(s)) for c, _, s in (a.partition(":") for a in rest)]
            except ValueError:
                runs = []
            if not runs:
                print("memory COPIES:LATE_S ... NAME=TREE ...", file=sys.stderr)
                return 2
            memory(runs, trees, tmp)
    finally:
        for f in tmp.rglob("*"):
            if f.is_file():
                f.unlink()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
