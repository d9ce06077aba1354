"""Print pip constraints pinning every dependency of pyproject.toml to its floor (``>=X`` -> ``==X``).

Used by ``.ci/floors``; ``tests/test_packaging_locks.py`` checks that every requirement has a floor.
Extras that name other extras (``gpufleet[agent,otlp]``) are skipped; a requirement named in
several extras must give the same floor everywhere.
"""

from __future__ import annotations

import re
import sys
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
REQ = re.compile(r"^\s*([A-Za-z0-9][A-Za-z0-9._-]*)\s*(\[[^\]]*\])?\s*(.*)$")


def requirements(pyproject: Path = ROOT / "pyproject.toml") -> list[str]:
    doc = tomllib.loads(pyproject.read_text())
    proj = doc["project"]
    reqs = list(proj.get("dependencies", []))
    for extra in proj.get("optional-dependencies", {}).values():
        reqs.extend(r for r in extra if not r.startswith(proj["name"] + "["))
    return reqs


def floors(reqs: list[str]) -> dict[str, str]:
    """name -> floor version; ValueError for a requirement without ``>=`` or two floors."""
    out: dict[str, str] = {}
    for r in reqs:
        m = REQ.match(r.split(";")[0])
        name = m.group(1).lower().replace("_", "-") if m else r
        spec = m.group(3) if m else ""
        lo = re.search(r">=\s*([0-9][0-9A-Za-z.]*)", spec)
        if not lo:
            raise ValueError(f"{r!r}: no floor (>=)")
        if name in out and out[name] != lo.group(1):
            raise ValueError(f"{name}: floors {out[name]} and {lo.group(1)} in different extras")
        out[name] = lo.group(1)
    return out


if __name__ == "__main__":
    try:
        for name, v in sorted(floors(requirements()).items()):
            print(f"{name}=={v}")
    except ValueError as exc:
        print(f"floors: {exc}", file=sys.stderr)
        sys.exit(2)
