"""Generated files: one command rewrites them (``python -m gpufleet.regen``), one test keeps them current."""

from __future__ import annotations

import shutil
import subprocess
import sys

import pytest

from gpufleet import regen
from tests.conftest import ROOT


def test_every_generated_file_is_current():
    assert regen.stale() == [], "stale generated files: run python -m gpufleet.regen"


@pytest.mark.slow
def test_regen_finds_each_stale_file_and_rewrites_it(tmp_path):
    made = regen.targets()
    assert {"docs/schema.md", "docs/scale.md", "dashboards/grafana/gpu.json"} <= set(made)
    for rel in made:
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(ROOT / rel, tmp_path / rel)
    assert regen.stale(tmp_path) == []
    # a field renamed in the schema page, a number edited inside scale.md's generated block, one
    # dashboard missing, and a dashboard no builder makes
    schema = tmp_path / "docs/schema.md"
    schema.write_text(schema.read_text().replace("power_watts", "power_w", 1))
    scale = tmp_path / "docs/scale.md"
    text = scale.read_text()
    cut = text.index(regen._scale_arithmetic(ROOT).BEGIN)
    head, block = text[:cut], text[cut:]
    digit = next(i for i, c in enumerate(block) if c.isdigit())
    scale.write_text(head + block[:digit] + str((int(block[digit]) + 1) % 10) + block[digit + 1:])
    (tmp_path / "dashboards/grafana/gpu.json").unlink()
    (tmp_path / "dashboards/grafana/old.json").write_text("{}\n")
    assert regen.stale(tmp_path) == [
        "docs/schema.md", "docs/scale.md", "dashboards/grafana/gpu.json", "dashboards/grafana/old.json"]
    # text outside scale.md's generated block is the author's and stays
    scale.write_text("# edited by hand\n" + scale.read_text())
    assert sorted(regen.write(tmp_path)) == sorted([
        "docs/schema.md", "docs/scale.md", "dashboards/grafana/gpu.json", "dashboards/grafana/old.json"])
    assert regen.stale(tmp_path) == []
    assert scale.read_text() == "# edited by hand\n" + (ROOT / "docs/scale.md").read_text()
    for rel in set(made) - {"docs/scale.md"}:
        assert (tmp_path / rel).read_text() == (ROOT / rel).read_text(), rel
    assert not (tmp_path / "dashboards/grafana/old.json").exists()


@pytest.mark.slow
def test_check_answers_0_on_a_current_checkout():
    r = subprocess.run([sys.executable, "-m", "gpufleet.regen", "--check"], capture_output=True, text=True,
                       timeout=120)
    assert (r.returncode, r.stdout.strip(), r.stderr) == (0, "generated files are current", "")
