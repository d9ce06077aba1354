"""Straggler detection with and without GPM evidence, on the ``straggler`` scenario (stragglers
beside the collective-wait nuisance), fresh seeds, scored one-to-one: each injected straggler
claims its earliest matching incident; every other straggler incident counts false (a duplicate
page included).

Each seed's fleet is simulated once and analysed twice: as written, and with the GPM fields
(``sm_active_ratio`` and the rest of the activity set) stripped from the line protocol, i.e. as a
fleet without GPM (before Hopper, or GPM off) would report it.
"""

from __future__ import annotations

import gzip
import re
import secrets
import tempfile
from pathlib import Path

from gpufleet.sim.activity import FIELDS as GPM_FIELDS

_STRIP = re.compile(r",(?:" + "|".join(re.escape(f) for f in GPM_FIELDS) + r")=[^, ]+")


def one_to_one(truth, incidents, kind: str) -> tuple[int, int, int]:
    """(true incidents, incidents, truths) of ``kind``: each truth takes its earliest matching
    incident not yet taken."""
    from gpufleet.analyzer.evaluate import matches

    truths = [t for t in truth if t.kind == kind]
    incs = sorted((i for i in incidents if i.kind == kind), key=lambda i: i.start)
    taken: set[int] = set()
    for t in truths:
        for n, i in enumerate(incs):
            if n not in taken and matches(i, t):
                taken.add(n)
                break
    return len(taken), len(incs), len(truths)


def strip_gpm(src: Path, dst: Path) -> None:
    """The line protocol with every GPM activity field removed from the gpu rows."""
    with gzip.open(src, "rt") as fin, gzip.open(dst, "wt", compresslevel=1) as fout:
        for line in fin:
            fout.write(_STRIP.sub("", line) if line.startswith("gpu,") else line)


def run_seed(seed: int, tmp: Path, nodes: int = 8, duration: str = "3h") -> dict[str, tuple[int, int, int]]:
    """{"gpm": (tp, incidents, truths), "no_gpm": ...} for one simulated fleet."""
    import contextlib
    import io

    from gpufleet import records
    from gpufleet.cli import main

    out = tmp / f"sim{seed}"
    with contextlib.redirect_stdout(io.StringIO()):
        assert main(["sim", "--nodes", str(nodes), "--duration", duration, "--step", "10s",
                     "--seed", str(seed), "--scenario", "straggler", "--out", str(out)]) == 0
    truth = records.read(out / "truth.jsonl")
    lp = out / "telemetry.lp.gz"
    bare = out / "no_gpm.lp.gz"
    strip_gpm(lp, bare)
    res = {}
    for key, src in (("gpm", lp), ("no_gpm", bare)):
        inc = out / f"incidents_{key}.jsonl"
        with contextlib.redirect_stdout(io.StringIO()):
            assert main(["analyze", "--input", str(src), "--out", str(inc)]) == 0
        res[key] = one_to_one(truth, records.read(inc), "straggler")
    return res


def run(quick: bool) -> list[dict]:
    seeds = [secrets.randbelow(2**31) for _ in range(3 if quick else 10)]
    nodes, duration = (8, "3h") if quick else (16, "4h")
    tot = {"gpm": [0, 0, 0], "no_gpm": [0, 0, 0]}
    with tempfile.TemporaryDirectory() as d:
        for seed in seeds:
            for key, vals in run_seed(seed, Path(d), nodes, duration).items():
                tot[key] = [a + b for a, b in zip(tot[key], vals, strict=True)]
    rows = []
    for key, label in (("gpm", "with GPM"), ("no_gpm", "without GPM (fields stripped)")):
        tp, n_inc, n_truth = tot[key]
        note = (f"{len(seeds)} fresh seeds, {nodes} nodes x {duration}, one-to-one; "
                f"{n_truth} stragglers, {n_inc} incidents")
        rows.append({"benchmark": "straggler", "metric": f"precision, {label}",
                     "value": tp / n_inc if n_inc else 1.0, "unit": "ratio",
                     "target": ">= 0.97" if key == "gpm" else "", "note": note})
        rows.append({"benchmark": "straggler", "metric": f"recall, {label}",
                     "value": tp / n_truth if n_truth else 1.0, "unit": "ratio",
                     "target": ">= 0.97" if key == "gpm" else "", "note": ""})
    return rows


if __name__ == "__main__":
    for r in run(quick=True):
        print(f"{r['metric']:<45} {r['value']:>7.3f}  {r['note']}")
