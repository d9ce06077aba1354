"""Helpers of the action-sink tests: a recording command (``recorder``: its argument list and
the file each call is appended to, ``calls`` reads them back), an action sink table
(``action``), and a small fleet's line protocol with chosen host names (``fleet_lp``)."""

from __future__ import annotations

import json
import re
import sys

from gpufleet.lineprotocol import escape_key
from tests.alerting_receiver import T0
from tests.fleets import STEP, fleet

RECORDER = """
import json, os, sys
with open(sys.argv[1], "a") as f:
    f.write(json.dumps({"argv": sys.argv[2:], "env": {k: v for k, v in os.environ.items()
                                                    if k.startswith("GPUFLEET_")}}) + "\\n")
"""


def action(rules, **kw) -> dict:
    d = {"type": "action", "dry_run": False, "rule": rules}
    d.update(kw)
    return d


def recorder(tmp_path):
    script = tmp_path / "rec.py"
    script.write_text(RECORDER)
    out = tmp_path / "calls.jsonl"
    return [sys.executable, str(script), str(out)], out


def calls(out):
    return [json.loads(x) for x in out.read_text().splitlines()] if out.exists() else []


def fleet_lp(names: list[str], dbe: set[int]) -> bytes:
    """A small fleet's line protocol, node i's host tag written as ``names[i]`` (escaped as line
    protocol needs), with an uncorrectable ECC error on GPU 1 of the nodes in ``dbe``."""
    data = fleet(nodes=len(names), gpus=2, steps=150, links=0)
    cut = int((T0 + 100 * STEP) * 1e9)
    out = []
    for line in data.split(b"\n"):
        m = re.search(rb"host=node(\d+)(?=[, ])", line)
        if m:
            n = int(m.group(1))
            if n in dbe and b",gpu=1," in line and int(line.rsplit(b" ", 1)[1]) >= cut:
                line = line.replace(b"uncorrected_volatile_total=0i", b"uncorrected_volatile_total=1i")
            line = line[:m.start()] + b"host=" + escape_key(names[n]).encode() + line[m.end():]
        out.append(line)
    return b"\n".join(out)
