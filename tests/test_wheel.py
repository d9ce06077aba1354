"""The wheel and its extras: `gpufleet[agent]` must stay free of the analyzer's heavy stack.

A node agent runs on every GPU host; scikit-learn, scipy and matplotlib have no business there
(install size, import time, RSS). Checked three ways: the wheel's declared metadata, the
dependency set pip actually resolves for `gpufleet[agent]`, and what importing every module
under agent/ puts into sys.modules.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
import zipfile
from email.parser import Parser
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
HEAVY = ("scikit-learn", "sklearn", "scipy", "matplotlib")


def copy_tree(dst: Path) -> Path:
    """Copy the checkout (tracked and untracked-but-not-ignored files) so builds never write into it."""
    listed = subprocess.run(
        ["git", "-C", str(ROOT), "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
        capture_output=True, check=True,
    ).stdout.split(b"\0")
    for rel in filter(None, listed):
        src = ROOT / rel.decode()
        if src.is_file():
            out = dst / rel.decode()
            out.parent.mkdir(parents=True, exist_ok=True)
            out.write_bytes(src.read_bytes())
    return dst


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    tmp = tmp_path_factory.mktemp("wheel")
    src = copy_tree(tmp / "src")
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", str(tmp / "dist"), str(src)],
        check=True, capture_output=True, timeout=300,
    )
    (whl,) = (tmp / "dist").glob("gpufleet-*.whl")
    return whl


def _metadata(whl: Path):
    with zipfile.ZipFile(whl) as z:
        (name,) = [n for n in z.namelist() if n.endswith(".dist-info/METADATA")]
        return Parser().parsestr(z.read(name).decode())


def _name(req: str) -> str:
    return re.split(r"[\s;<>=!~\[(@]", req.strip(), maxsplit=1)[0].lower().replace("_", "-")


def extra_requirements(meta, extra: str, seen: frozenset = frozenset()) -> set[str]:
    """Distribution names an extra pulls in directly, following self-references like gpufleet[a,b]."""
    names: set[str] = set()
    for req in meta.get_all("Requires-Dist") or []:
        spec, _, marker = req.partition(";")
        if marker and re.search(r"""extra\s*==\s*["']([^"']+)["']""", marker)[1] != extra:
            continue
        name = _name(spec)
        if name == "gpufleet":
            inner = re.search(r"\[([^\]]*)\]", spec)
            for sub in (inner[1].split(",") if inner else []):
                sub = sub.strip()
                if sub not in seen:
                    names |= extra_requirements(meta, sub, seen | {extra})
        else:
            names.add(name)
    return names


@pytest.mark.slow
def test_wheel_declares_extras_and_entry_point(wheel):
    meta = _metadata(wheel)
    assert meta["Name"] == "gpufleet"
    extras = set(meta.get_all("Provides-Extra"))
    assert {"agent", "analyzer", "all"} <= extras

    agent = extra_requirements(meta, "agent")
    analyzer = extra_requirements(meta, "analyzer")
    assert not agent & set(HEAVY), f"gpufleet[agent] declares {agent & set(HEAVY)}"
    assert {"opentelemetry-sdk", "nvidia-ml-py", "psutil"} <= agent
    assert "numpy" in analyzer and not {"scikit-learn", "scipy"} & analyzer  # the analysis is numpy
    assert agent | analyzer <= extra_requirements(meta, "all")
    base = {_name(r) for r in meta.get_all("Requires-Dist") if ";" not in r}
    assert not base & set(HEAVY), f"the base install declares {base & set(HEAVY)}"

    with zipfile.ZipFile(wheel) as z:
        names = z.namelist()
        (ep,) = [n for n in names if n.endswith(".dist-info/entry_points.txt")]
        assert re.search(r"^gpufleet\s*=\s*gpufleet\.cli:main$", z.read(ep).decode(), re.M)
    assert "gpufleet/catalogue.toml" in names and "gpufleet/xid_catalogue.toml" in names
    assert "gpufleet/agent/model.py" in names and "gpufleet/analyzer/parse.py" in names
    assert "gpufleet/dashboards/generate.py" in names and "gpufleet/dashboards/boards/gpu.py" in names
    # the runbooks alerts and pages link when no --runbook-base-url is set (one per kind)
    assert "gpufleet/analyzer/alerting/runbooks/sdc.md" in names
    assert "gpufleet/analyzer/alerting/runbooks/memory_errors.md" in names
    # nothing under a generic top-level name: agent/, analyzer/, dashboards/ live in gpufleet/
    tops = {n.split("/")[0] for n in names if not n.split("/")[0].endswith((".dist-info", ".data"))}
    assert tops == {"gpufleet"}, tops
    for outsider in ("tests/", "bench/", "packaging/", "docs/"):
        assert not any(n.startswith(outsider) for n in names), f"{outsider} shipped in the wheel"


@pytest.mark.slow
def test_wheel_installs_beside_another_top_level_agent_package(wheel, tmp_path):
    """Another project's top-level ``agent`` package in the same environment: no clash, both import."""
    import sysconfig

    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=120)
    (site,) = (venv / "lib").glob("python*/site-packages")
    (site / "agent").mkdir()
    (site / "agent" / "__init__.py").write_text("WHO = 'someone else'\n")
    proc = subprocess.run([sys.executable, "-m", "pip", "install", "--no-deps", "-q", "--target", str(site),
                           str(wheel)], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "already exists" not in proc.stderr, proc.stderr  # pip would have skipped a clashing folder
    # gpufleet's dependencies from this environment (a path only: its .pth files are not run, so the
    # checkout's editable install stays out)
    (site / "deps.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    probe = ("import json, agent\n"
             "import gpufleet.agent.model, gpufleet.analyzer.parse, gpufleet.dashboards.generate\n"
             "print(json.dumps([agent.WHO, gpufleet.agent.model.__file__,\n"
             "                  gpufleet.analyzer.parse.__file__]))")
    out = subprocess.run([str(venv / "bin" / "python"), "-c", probe], capture_output=True, text=True,
                         cwd=tmp_path, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    who, model, parse = json.loads(out.stdout)
    assert who == "someone else"
    assert Path(model).is_relative_to(site) and Path(parse).is_relative_to(site)


@pytest.mark.slow
def test_agent_extra_resolves_without_heavy_packages(wheel, tmp_path):
    """What pip would really install for gpufleet[agent] (transitive dependencies included)."""
    report = tmp_path / "report.json"
    proc = subprocess.run(
        [sys.executable, "-m", "pip", "install", "--dry-run", "--ignore-installed", "-q",
         "--report", str(report), f"gpufleet[agent] @ {wheel.as_uri()}"],
        capture_output=True, text=True, timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    installed = {item["metadata"]["name"].lower().replace("_", "-")
                 for item in json.loads(report.read_text())["install"]}
    assert {"gpufleet", "opentelemetry-sdk", "psutil", "nvidia-ml-py"} <= installed
    assert not installed & set(HEAVY), f"gpufleet[agent] pulls in {sorted(installed & set(HEAVY))}"


IMPORT_ALL_AGENT = r"""
import importlib, json, pkgutil, sys
import gpufleet.agent
failed = {}
names = ["gpufleet.agent"]
for info in pkgutil.walk_packages(gpufleet.agent.__path__, "gpufleet.agent."):
    names.append(info.name)
for name in names:
    try:
        importlib.import_module(name)
    except Exception as exc:
        failed[name] = f"{type(exc).__name__}: {exc}"
heavy = sorted(m for m in sys.modules if m.split(".")[0] in ("sklearn", "scipy", "matplotlib"))
print(json.dumps({"imported": names, "failed": failed, "heavy": heavy}))
"""


@pytest.mark.slow
def test_agent_modules_import_no_heavy_packages():
    proc = subprocess.run([sys.executable, "-c", IMPORT_ALL_AGENT], capture_output=True, text=True,
                          cwd=ROOT, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    assert "gpufleet.agent.model" in result["imported"]
    assert not result["failed"], f"agent modules that do not import: {result['failed']}"
    assert not result["heavy"], f"importing agent/ loaded {result['heavy'][:10]}"


ANALYSE_THEN_LIST_HEAVY = r"""
import json, sys
from gpufleet.cli import main
rc = main(["analyze", "--input", sys.argv[1], "--out", sys.argv[2]])
heavy = sorted(m for m in sys.modules if m.split(".")[0] in ("sklearn", "scipy"))
print(json.dumps({"rc": rc, "heavy": heavy}))
"""


@pytest.mark.slow
def test_analysing_a_fleet_imports_neither_scikit_learn_nor_scipy(tmp_path):
    # the straggler scenario fits the detector's robust covariance (FastMCD, numpy alone)
    from gpufleet.cli import main

    assert main(["sim", "--nodes", "4", "--duration", "1h", "--step", "10s", "--seed", "3",
                 "--scenario", "straggler", "--out", str(tmp_path / "sim"), "--no-progress"]) == 0
    proc = subprocess.run([sys.executable, "-c", ANALYSE_THEN_LIST_HEAVY,
                           str(tmp_path / "sim" / "telemetry.lp.gz"), str(tmp_path / "inc.jsonl")],
                          capture_output=True, text=True, cwd=ROOT, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    assert result["rc"] == 0 and (tmp_path / "inc.jsonl").read_text().count('"straggler"') >= 1
    assert not result["heavy"], f"analysing loaded {result['heavy'][:10]}"
