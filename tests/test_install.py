"""Installed means working: the wheel in a fresh virtual environment outside the checkout.

The other tests run from an editable checkout, where the package's folders are not where an
installed wheel puts them; what only breaks once installed (a child process given the installed
``gpufleet/`` folder as its import path, where ``gpufleet/secrets.py`` shadows the standard
library's ``secrets``) is seen only here. Every command runs from the venv's own ``gpufleet``
console script, in a working directory outside the checkout, without PYTHONPATH.

Two installations: ``full`` (the wheel; its agent and analyzer dependencies from this test
environment's site-packages, as a plain path, so the checkout's editable install stays out) and
``bare`` (the wheel with its base dependencies only, no extra).
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest

from tests.conftest import FIXTURES, ROOT
from tests.test_wheel import wheel  # noqa: F401 - the module-scoped fixture that builds it

pytestmark = pytest.mark.slow
RECORDING = FIXTURES / "recordings" / "h200" / "nvml_dump.json"


def make_venv(where: Path, whl: Path, deps: list[str] | None = None) -> Path:
    """A venv at ``where`` with the wheel installed (no dependencies) and ``deps`` beside it;
    returns its bin folder. Without ``deps`` the test environment's packages are on its path."""
    base = getattr(sys, "_base_executable", sys.executable)
    subprocess.run([base, "-m", "venv", "--without-pip", str(where)], check=True, timeout=120)
    py = where / "bin" / "python"
    pip = [sys.executable, "-m", "pip", "--python", str(py), "install", "-q", "--no-warn-script-location"]
    proc = subprocess.run([*pip, "--no-deps", str(whl)], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    (site,) = (where / "lib").glob("python*/site-packages")
    if deps is None:
        # a path only: the .pth files there (the editable install's finder) are not run
        (site / "zz-test-deps.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    elif deps:
        proc = subprocess.run([*pip, *deps], capture_output=True, text=True, timeout=300)
        assert proc.returncode == 0, proc.stderr[-2000:]
    return where / "bin"


def clean_env(**extra) -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTHON", "VIRTUAL_ENV"))}
    return {**env, **extra}


@pytest.fixture(scope="module")
def full(wheel, tmp_path_factory):  # noqa: F811 - the fixture imported above
    tmp = tmp_path_factory.mktemp("installed")
    return make_venv(tmp / "venv", wheel), tmp


@pytest.fixture(scope="module")
def bare(wheel, tmp_path_factory):  # noqa: F811
    tmp = tmp_path_factory.mktemp("bare")
    return make_venv(tmp / "venv", wheel, ["click>=8.1.0", "tqdm>=4.66.0"]), tmp


def gpufleet(bindir: Path, cwd: Path, *args: str, timeout: int = 300) -> subprocess.CompletedProcess:
    return subprocess.run([str(bindir / "gpufleet"), *args], capture_output=True, text=True, cwd=cwd,
                          env=clean_env(), timeout=timeout)


def no_traceback(p: subprocess.CompletedProcess) -> None:
    for text in (p.stdout, p.stderr):
        assert "Traceback" not in text and "ImportError" not in text, text[-3000:]


def test_the_installed_package_is_the_wheel_not_the_checkout(full):
    bindir, tmp = full
    p = subprocess.run([str(bindir / "python"), "-c", "import gpufleet.agent.collectors.canary as c; "
                        "print(c.__file__)"], capture_output=True, text=True, cwd=tmp, env=clean_env())
    assert p.returncode == 0, p.stderr
    where = Path(p.stdout.strip())
    assert where.is_relative_to(bindir.parent) and not where.is_relative_to(ROOT)


def test_agent_once_reads_a_recording(full):
    bindir, tmp = full
    p = gpufleet(bindir, tmp, "agent", "once", "--backend", f"recorded:{RECORDING}", "--format", "json")
    assert p.returncode == 0, p.stderr
    rows = json.loads(p.stdout)
    (gpu,) = [r for r in rows if r["measurement"] == "gpu"]
    assert gpu["tags"]["model"] == "NVIDIA H200" and gpu["fields"]["up"] == 1


def test_the_cpu_engine_asked_for_checks_and_passes(full):
    bindir, tmp = full
    p = gpufleet(bindir, tmp, "canary", "--engine", "numpy", "--json", "--state-dir", str(tmp / "st"))
    no_traceback(p)
    assert p.returncode == 0, p.stderr
    doc = json.loads(p.stdout)
    assert doc["ok"] is True and doc["checked"] is True and doc["skipped"] == {}
    (res,) = doc["results"]
    assert res["gpu"] == "cpu" and res["engine"] == "numpy"
    assert res["fields"]["passed"] == 1 and res["fields"]["mismatches"] == 0
    assert re.fullmatch(r"[0-9a-f]{64}", res["fields"]["digest"])
    # the second run compares with the first answer kept in the state dir: the same digest
    again = json.loads(gpufleet(bindir, tmp, "canary", "--engine", "numpy", "--json", "--state-dir",
                                str(tmp / "st")).stdout)
    assert again["results"][0]["fields"]["digest"] == res["fields"]["digest"]


def test_the_default_canary_without_a_gpu_is_not_checked_exit_3(full):
    bindir, tmp = full
    p = gpufleet(bindir, tmp, "canary", "--gpu", "all", "--state-dir", str(tmp / "st3"))
    no_traceback(p)
    assert p.returncode == 3, p.stdout + p.stderr
    assert p.stderr.count("\n") == 1 and "not checked" in p.stderr and "--engine numpy" in p.stderr
    p = gpufleet(bindir, tmp, "canary", "--json", "--state-dir", str(tmp / "st3"))
    assert p.returncode == 3
    doc = json.loads(p.stdout)
    assert doc["checked"] is False and doc["ok"] is False and doc["results"] == []
    assert "no NVML" in doc["skipped"]["all"]


def test_simulate_analyze_and_report(full):
    bindir, tmp = full
    sim = tmp / "sim"
    p = gpufleet(bindir, tmp, "sim", "--nodes", "1", "--duration", "2h", "--step", "10s", "--seed", "5",
                 "--scenario", "thermal", "--out", str(sim), "--no-progress")
    assert p.returncode == 0, p.stderr[-2000:]
    inc = tmp / "incidents.jsonl"
    p = gpufleet(bindir, tmp, "analyze", "--input", str(sim / "telemetry.lp.gz"), "--out", str(inc))
    no_traceback(p)
    assert p.returncode == 0, p.stderr[-2000:]
    incidents = [json.loads(ln) for ln in inc.read_text().splitlines() if ln.strip()]
    assert incidents, "the thermal scenario injects a fault: the analyzer finds it"
    p = gpufleet(bindir, tmp, "report", "--incidents", str(inc), "--input", str(sim), "--out",
                 str(tmp / "pages"))
    no_traceback(p)
    assert p.returncode == 0, p.stderr[-2000:]
    pages = [x for x in (tmp / "pages").glob("*.html") if x.name != "index.html"]
    assert len(pages) == len(incidents)


@pytest.mark.parametrize("args, extra", [
    (["canary", "--gpu", "all"], "agent"),
    (["agent", "once"], "agent"),
    (["agent", "run", "--backend", "sim"], "agent"),
    (["analyze", "--input", "x.lp"], "analyzer"),
])
def test_a_missing_extra_is_one_line_naming_it(bare, args, extra):
    bindir, tmp = bare
    p = gpufleet(bindir, tmp, *args, timeout=120)
    no_traceback(p)
    assert p.returncode == 2, p.stdout + p.stderr
    assert p.stderr.count("\n") == 1 and p.stderr.startswith("gpufleet: error: ")
    assert f"needs the {extra} extra" in p.stderr and f"pip install 'gpufleet[{extra}]'" in p.stderr


def test_every_optional_module_names_its_extra():
    """gpufleet/extras.py against pyproject.toml: each optional dependency's module is known."""
    import tomllib

    from gpufleet.extras import MODULE_EXTRA

    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    module = {"nvidia-ml-py": "pynvml", "opentelemetry-sdk": "opentelemetry", "influxdb-client":
              "influxdb_client"}
    for extra in ("agent", "analyzer"):
        for req in extras[extra]:
            name = re.split(r"[\s;<>=!~\[(@]", req, maxsplit=1)[0]
            if name == "gpufleet":
                continue
            mod = module.get(name, name.replace("-", "_"))
            assert mod in MODULE_EXTRA, f"{name} ({extra}) has no entry in gpufleet.extras.MODULE_EXTRA"
            assert MODULE_EXTRA[mod] in (extra, "agent"), (name, extra, MODULE_EXTRA[mod])
