"""docs/scale.md and docs/operations.md stay true to the catalogue and to each other."""

from __future__ import annotations

import importlib.util
import re
import sys
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def _arithmetic():
    spec = importlib.util.spec_from_file_location("scale_arithmetic", ROOT / "docs" / "scale_arithmetic.py")
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod  # dataclasses look their module up there
    spec.loader.exec_module(mod)
    return mod


def test_scale_arithmetic_matches_an_independent_count():
    """Values/s for the GPU rows, counted straight from the TOML, not through gpufleet.catalogue."""
    metrics = tomllib.loads((ROOT / "gpufleet" / "catalogue.toml").read_text())["metric"]
    fast = sum(1 for m in metrics if m["measurement"] == "gpu" and m["tier"] == "fast")
    slow = sum(1 for m in metrics if m["measurement"] == "gpu" and m["tier"] == "slow")
    mod = _arithmetic()
    fleet = mod.Fleet(gpus=100_000, gpus_per_node=8)
    gpu = next(r for r in mod.rows(fleet, 10.0) if r.measurement == "gpu")
    assert (gpu.fast, gpu.slow, gpu.series) == (fast, slow, 100_000)
    gpu_values_s = 100_000 * (fast / 10 + slow / 60)
    one_s = mod.totals(fleet, 1.0)
    ten_s = mod.totals(fleet, 10.0)
    assert ten_s["values_s"] > gpu_values_s  # links, BMC and host come on top
    # 1 s polling multiplies everything but the BMC (read no faster than every 10 s) and NVLink
    # (its own cadence) by ten; with links read at every poll, nearly everything
    assert 3 * ten_s["values_s"] < one_s["values_s"] < 10 * ten_s["values_s"]
    every = mod.Fleet(gpus=100_000, gpus_per_node=8, nvlink_interval_s=0)
    assert 8 * mod.totals(every, 10.0)["values_s"] < mod.totals(every, 1.0)["values_s"]
    assert mod.totals(every, 10.0)["values_s"] > ten_s["values_s"]
    # the GPU line carries every fast field of the reference row, tags and a 19-digit timestamp
    assert gpu.row_bytes > sum(len(m["field"]) + 2 for m in metrics
                               if m["measurement"] == "gpu" and m["tier"] == "fast") + 19
    # a fleet twice the size is twice the data
    double = mod.totals(mod.Fleet(gpus=200_000, gpus_per_node=8), 10.0)
    assert abs(double["values_s"] / ten_s["values_s"] - 2) < 1e-9


def test_doc_links_resolve():
    for name in ("operations.md", "scale.md"):
        text = (ROOT / "docs" / name).read_text()
        for target in re.findall(r"\]\(([^)#]+\.(?:md|py))(?:#[^)]*)?\)", text):
            if target == "benchmarks.md":  # written by the benchmark runner
                continue
            assert (ROOT / "docs" / target).exists(), f"docs/{name} links to missing {target}"
    readme = (ROOT / "README.md").read_text()
    for target in re.findall(r"\]\((docs/[^)#]+)(?:#[^)]*)?\)", readme):
        if target == "docs/benchmarks.md":
            continue
        assert (ROOT / target).exists(), f"README links to missing {target}"
