"""The README's Quick start, as a new user runs it: a fresh clone, its two commands.

The commands' underlying steps run for real in the clone: ``./run demo`` creates its own
virtual environment, installs gpufleet into it and runs the demo; ``./run test`` installs the
test extra and runs pytest (here on one test file; the apt step finds the servers installed).
"""

from __future__ import annotations

import json
import os
import re
import subprocess

import pytest

from tests.conftest import ROOT


def quickstart_commands(readme: str) -> list[str]:
    block = re.search(r"^## Quick start\n.*?```sh\n(.*?)```", readme, re.S | re.M)
    assert block, "README has no Quick start code block"
    return [line.split("#", 1)[0].strip() for line in block.group(1).splitlines() if line.strip()]


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_quickstart_in_a_fresh_clone(tmp_path):
    clone = tmp_path / "gpufleet"
    subprocess.run(["git", "clone", "-q", str(ROOT), str(clone)], check=True, timeout=120)
    cmds = quickstart_commands((clone / "README.md").read_text())
    assert cmds == ["./run demo", "./run test"]

    env = dict(os.environ, VENV=str(tmp_path / "venv"), PIP_DISABLE_PIP_VERSION_CHECK="1")
    demo = subprocess.run(cmds[0].split() + ["--nodes", "1", "--duration", "1h", "--no-progress", "--json",
                                             "--out", str(tmp_path / "demo")],
                          cwd=clone, env=env, capture_output=True, text=True, timeout=600)
    assert demo.returncode == 0, demo.stderr[-3000:]
    scores = json.loads(demo.stdout[demo.stdout.rindex("\n{") + 1:])
    assert scores["overall"]["truths"] > 0 and scores["overall"]["detected"] > 0
    assert (tmp_path / "venv" / "bin" / "gpufleet").exists()
    assert "FIRING" in demo.stderr  # alerts reached the console sink

    tests = subprocess.run(cmds[1].split() + ["tests/test_catalogue.py", "-p", "no:cacheprovider"],
                           cwd=clone, env=env, capture_output=True, text=True, timeout=600)
    assert tests.returncode == 0, (tests.stdout + tests.stderr)[-3000:]
    assert re.search(r"\d+ passed", tests.stdout)


def test_run_rejects_an_unknown_command():
    r = subprocess.run([str(ROOT / "run"), "deploy"], capture_output=True, text=True, timeout=30)
    assert r.returncode == 2 and "usage" in r.stderr
