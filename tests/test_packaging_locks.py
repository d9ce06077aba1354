"""Dependency floors and the hashed lock files the .deb is built from."""

from __future__ import annotations

import re
import subprocess
import sys
import tomllib

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

from tests.conftest import ROOT

sys.path.insert(0, str(ROOT / ".ci"))
import floors  # noqa: E402 (.ci/floors.py: the floors job's constraints)

LOCKS = ROOT / "packaging" / "locks"
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())


def lock_sets() -> list[str]:
    """The extras sets packaging/lock.sh locks (the one place they are listed)."""
    m = re.search(r'^SETS="([^"]+)"', (ROOT / "packaging" / "lock.sh").read_text(), re.M)
    return m.group(1).split()


def parse_lock(path) -> tuple[str, dict[str, tuple[str, set[str]]]]:
    """-> (python version in the header, {name: (version, {sha256, ...})})."""
    text = path.read_text()
    py = re.search(r"^#.*\(python ([0-9.]+),", text, re.M).group(1)
    pins: dict[str, tuple[str, set[str]]] = {}
    name = None
    for line in text.splitlines():
        m = re.match(r"^([A-Za-z0-9._-]+)==([^ ;\\]+)", line)
        if m:
            name = canonicalize_name(m.group(1))
            pins[name] = (m.group(2), set())
        elif name and (h := re.search(r"--hash=sha256:([0-9a-f]{64})", line)):
            pins[name][1].add(h.group(1))
    return py, pins


def extra_requirements(extras: str) -> list[Requirement]:
    """The requirements of ``gpufleet[extras]``, nested extras (``all``) expanded."""
    opt = PYPROJECT["project"]["optional-dependencies"]
    out = [Requirement(r) for r in PYPROJECT["project"]["dependencies"]]
    todo = extras.split(",")
    while todo:
        for r in map(Requirement, opt[todo.pop()]):
            if canonicalize_name(r.name) == "gpufleet":
                todo.extend(r.extras)
            else:
                out.append(r)
    return out


def test_every_dependency_has_a_floor():
    got = floors.floors(floors.requirements())
    names = {canonicalize_name(Requirement(r).name) for r in floors.requirements()}
    assert set(got) == names
    assert got["opentelemetry-sdk"] >= "1.28"  # AlwaysOffExemplarFilter, ExemplarReservoir
    assert all(Requirement(f"{n}>={v}").specifier.contains(v) for n, v in got.items())
    with pytest.raises(ValueError, match="no floor"):
        floors.floors(["numpy"])


def test_otlp_extra_is_http_only():
    opt = PYPROJECT["project"]["optional-dependencies"]
    assert [Requirement(r).name for r in opt["otlp"]] == ["opentelemetry-exporter-otlp-proto-http"]
    assert [Requirement(r).name for r in opt["otlp-grpc"]] == ["opentelemetry-exporter-otlp-proto-grpc"]


@pytest.mark.parametrize("extras", lock_sets())
def test_lock_pins_and_hashes_every_package_of_its_extras(extras):
    path = LOCKS / f"{'+'.join(sorted(extras.split(',')))}.txt"
    assert path.is_file(), f"{path.name} missing: run packaging/lock.sh"
    py, pins = parse_lock(path)
    assert py == "3.11"  # Debian 12's python3, which the .deb depends on
    assert all(hashes for _, hashes in pins.values()), [n for n, (_, h) in pins.items() if not h]
    for req in extra_requirements(extras):
        name = canonicalize_name(req.name)
        assert name in pins, f"{path.name} lacks {name}: run packaging/lock.sh"
        assert req.specifier.contains(pins[name][0]), f"{path.name}: {name}=={pins[name][0]} vs {req}"
    if "otlp-grpc" not in extras and extras != "all":
        assert "grpcio" not in pins  # the HTTP exporter needs no gRPC
    if "analyzer" not in extras and extras != "all":
        assert not {"scikit-learn", "matplotlib", "scipy"} & set(pins)


def test_build_refuses_extras_without_a_lock(tmp_path):
    proc = subprocess.run([str(ROOT / "packaging" / "build-deb.sh"), "--extras", "agent,analyzer",
                           "--out", str(tmp_path)], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2 and "no lock file for extras agent,analyzer" in proc.stderr
    assert proc.stderr.count("\n") == 1 and not list(tmp_path.iterdir())


@pytest.mark.slow
def test_two_builds_of_one_commit_carry_the_same_wheels(tmp_path):
    """What build-deb.sh installs (--wheels: the locked set, hash-checked), twice: the same files,
    each one a file the lock names by hash."""
    runs = []
    for n in (1, 2):
        proc = subprocess.run([str(ROOT / "packaging" / "build-deb.sh"), "--extras", "agent", "--wheels",
                               str(tmp_path / f"w{n}")], capture_output=True, text=True, timeout=600)
        assert proc.returncode == 0, proc.stderr[-2000:]
        runs.append([tuple(line.split(None, 1)) for line in proc.stdout.splitlines()])
    assert runs[0] == runs[1] and runs[0]
    _, pins = parse_lock(LOCKS / "agent.txt")
    got = {}
    for sha, fname in runs[0]:
        name = canonicalize_name(re.split(r"-(?=\d)", fname, maxsplit=1)[0])
        assert sha in pins[name][1], f"{fname}: sha256 {sha} not in the lock"
        got[name] = fname
    expected = {n for n in pins if n != "colorama"}  # colorama: Windows only
    assert set(got) == expected
