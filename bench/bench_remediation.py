"""Remediation: incident -> drain command completed, through the action sink, on a real Slurm.

A single-node Slurm (munged + slurmctld + slurmd, tests/slurm.py) in a temp dir; the shipped
example (packaging/examples/action-slurm-drain.toml) with dry_run = false and resume = true.
Each round: one incident fires (the node drains), then resolves (the node resumes). The time is
from ``Notifier.update()`` to the drain command having returned 0 (recorded in the notifier's
action log), and the drain is checked in ``sinfo``. Target: <= 2 s.
"""

from __future__ import annotations

import dataclasses
import os
import statistics
import tempfile
import time
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
T0 = 1_795_000_000.0


def _wait(cond, timeout: float) -> bool:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if cond():
            return True
        time.sleep(0.005)
    return cond()


def _ok(notifier, count: int) -> bool:
    return sum(r["status"] == "ok" for r in notifier.actions()) >= count


def run(quick: bool) -> list[dict]:
    from gpufleet.analyzer.alerting import Notifier, load_sinks

    from gpufleet.records import Record
    from tests.slurm import Slurm, available

    if not available():
        return [{"benchmark": "remediation", "metric": "incident -> drain command completed",
                 "value": "skipped", "unit": "", "note": "slurm-wlm + munge not installed or not root"}]
    rounds = 3 if quick else 10
    spec = tomllib.loads((ROOT / "packaging" / "examples" / "action-slurm-drain.toml").read_text())["sink"][0]
    spec.update(dry_run=False, resume=True, max_per_hour=rounds + 1)
    del spec["budget_ledger"]  # beside the temporary state file
    drain, resume = [], []
    with tempfile.TemporaryDirectory() as d, Slurm(Path(d) / "slurm") as slurm:
        os.environ["SLURM_CONF"] = str(slurm.conf)
        with Notifier(load_sinks([spec], []), Path(d) / "state.db") as n:
            for i in range(rounds):
                inc = Record(kind="sdc", host=slurm.node, gpu=i % 8, link=None, start=T0 + 100 * i, end=None,
                             severity="critical", id=f"bench-{i}")
                t = time.time()
                n.update([inc], now=inc.start)
                if not _wait(lambda i=i: _ok(n, 2 * i + 1), 30):
                    raise RuntimeError(f"drain {i} did not complete: {n.actions()[-1:]}")
                drain.append(n.actions()[-1]["at"] - t)
                if "drain" not in slurm.node_state():
                    raise RuntimeError(f"node not drained: {slurm.node_state()}")
                t = time.time()
                n.update([dataclasses.replace(inc, end=inc.start + 60)], now=inc.start + 60)
                if not _wait(lambda i=i: _ok(n, 2 * i + 2), 30):
                    raise RuntimeError(f"resume {i} did not complete")
                resume.append(n.actions()[-1]["at"] - t)
                _wait(lambda: slurm.node_state() == "idle", 10)
            cmd = statistics.median(r["seconds"] for r in n.actions())
    return [
        {"benchmark": "remediation", "metric": "incident -> drain command completed, median",
         "value": statistics.median(drain) * 1000, "unit": "ms", "target": "<= 2000",
         "note": f"{rounds} rounds, real Slurm 1 node, scontrol show node (verify) + update State=DRAIN"},
        {"benchmark": "remediation", "metric": "incident -> drain command completed, max",
         "value": max(drain) * 1000, "unit": "ms", "target": "<= 2000",
         "note": f"scontrol itself: median {cmd * 1000:.0f} ms"},
        {"benchmark": "remediation", "metric": "resolve -> resume command completed, median",
         "value": statistics.median(resume) * 1000, "unit": "ms", "target": "", "note": "State=RESUME"},
    ]
