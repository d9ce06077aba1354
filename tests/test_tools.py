"""Tools that read files see the installed layout: ``gpufleet.agent`` etc. resolve from a checkout.

The folders ``agent/``, ``analyzer/`` and ``dashboards/`` install as ``gpufleet.agent`` ... (setup.py's
``package_dir``); the links ``gpufleet/agent -> ../agent`` show that layout to the type checker and
to editors. CI runs ``mypy`` over the packages (.ci/run, pyproject.toml's ``[tool.mypy]``).
"""

from __future__ import annotations

import subprocess
import sys

import pytest

from tests.conftest import ROOT

FOLDERS = ("agent", "analyzer", "dashboards")


@pytest.mark.parametrize("folder", FOLDERS)
def test_each_folder_is_linked_where_it_installs(folder):
    link = ROOT / "gpufleet" / folder
    assert link.is_symlink() and link.resolve() == (ROOT / folder).resolve()


@pytest.mark.slow
def test_the_type_checker_resolves_every_module_of_the_folders():
    names = sorted(
        ".".join(("gpufleet", *p.relative_to(ROOT).with_suffix("").parts)).removesuffix(".__init__")
        for folder in FOLDERS for p in (ROOT / folder).rglob("*.py"))
    assert "gpufleet.agent.model" in names and "gpufleet.analyzer.detectors.base" in names
    program = "\n".join(f"import {n}" for n in names)
    r = subprocess.run(
        [sys.executable, "-m", "mypy", "--config-file=", "--cache-dir=/dev/null", "--follow-imports=skip",
         "-c", program], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
