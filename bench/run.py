"""One runner for every benchmark: ``python -m bench.run [--only NAME] [--quick] [--md docs/benchmarks.md]``.

Each ``bench/bench_*.py`` exposes ``run(quick: bool) -> list[dict]``; a row has ``benchmark``,
``metric``, ``value``, ``unit``, and optionally ``target`` and ``note``. The runner prints
one table and, with ``--md``, writes it with the machine it ran on.
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import platform
import subprocess
import sys
import time
import traceback
from pathlib import Path

HERE = Path(__file__).resolve().parent


def machine() -> str:
    cpu = platform.processor() or ""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    mem = ""
    try:
        kb = int(Path("/proc/meminfo").read_text().split()[1])
        mem = f", {kb / 2**20:.0f} GiB RAM"
    except (OSError, ValueError, IndexError):
        pass
    return f"{cpu}, {os.cpu_count()} cores{mem}, Python {platform.python_version()}, {platform.system()}"


def fmt(v) -> str:
    if isinstance(v, float):
        return f"{v:,.3g}" if abs(v) < 1000 else f"{v:,.0f}"
    return str(v)


def table(rows: list[dict]) -> str:
    cols = ["benchmark", "metric", "value", "unit", "target", "note"]
    lines = ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    for r in rows:
        lines.append("| " + " | ".join(fmt(r.get(c, "")) for c in cols) + " |")
    return "\n".join(lines)


def _run_isolated(name: str, quick: bool) -> list[dict] | None:
    """Run one benchmark in a fresh interpreter, so that the peak memory of the processes it
    starts (read from RUSAGE_CHILDREN) is its own and not another benchmark's."""
    code = ("import json, sys; from bench.run import _one; "
            f"print('\\n' + json.dumps(_one({name!r}, {quick!r})))")
    r = subprocess.run([sys.executable, "-c", code], cwd=HERE.parent, stdout=subprocess.PIPE, text=True)
    if r.returncode != 0:
        return None
    return json.loads(r.stdout.strip().splitlines()[-1])


def _one(name: str, quick: bool) -> list[dict]:
    try:
        return importlib.import_module(f"bench.bench_{name}").run(quick=quick)
    except Exception:
        traceback.print_exc()
        raise SystemExit(1) from None


GPU_SECTION = "## On real GPUs: bench/gpu_check.sh"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--only", action="append", help="run only these benchmarks (module suffix)")
    ap.add_argument("--quick", action="store_true", help="small sizes, for a smoke run")
    ap.add_argument("--md", help="write the table with the machine to this Markdown file")
    args = ap.parse_args(argv)
    names = sorted(p.stem[len("bench_"):] for p in HERE.glob("bench_*.py"))
    if args.only:
        names = [n for n in names if n in args.only]
    rows: list[dict] = []
    failed = 0
    for name in names:
        t0 = time.perf_counter()
        got = _run_isolated(name, args.quick)
        if got is None:  # a broken benchmark is reported, the others still run
            got = [{"benchmark": name, "metric": "error", "value": "failed", "unit": ""}]
            failed += 1
        rows.extend(got)
        print(f"# {name}: {time.perf_counter() - t0:.1f} s", file=sys.stderr)
    out = table(rows)
    print(out)
    if args.md:
        when = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
        md = Path(args.md)
        # runs recorded by hand on real GPUs (bench/gpu_check.sh) are kept below the table
        old = md.read_text() if md.is_file() else ""
        kept = old[old.index(GPU_SECTION):] if GPU_SECTION in old else ""
        md.write_text(
            "# Benchmarks\n\nProduced by `python -m bench.run --md docs/benchmarks.md`; "
            "numbers are from one run on one machine, compare ratios within a run.\n\n"
            f"Machine: {machine()}. Run: {when}.\n\n{out}\n" + ("\n" + kept if kept else "")
        )
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
