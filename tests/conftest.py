from __future__ import annotations

import os
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
# a detector that raises fails the test (and every analyzer process it starts), not a gap record
os.environ.setdefault("GPUFLEET_STRICT", "1")
FIXTURES = ROOT / "tests" / "fixtures"
_RUN_TMP = pytest.StashKey[str]()


@pytest.fixture
def influxdb(tmp_path):
    from tests.servers import InfluxDB1

    with InfluxDB1(tmp_path / "influx") as server:
        yield server


@pytest.fixture
def victoria(tmp_path):
    from tests.servers import VictoriaMetrics

    with VictoriaMetrics(tmp_path / "vm") as server:
        yield server


# A test that starts a real server is slow: the fast loop (pytest -m "not slow") leaves it to CI.
# Such a test says what it needs (``needs`` mark: tests.servers.skip_unless, tests.slurm.
# skip_unless_slurm) or takes a server fixture; it is skipped where that is missing, but in CI.
SERVER_FIXTURES = {"influxdb", "victoria"}


def _missing(binary: str) -> bool:
    from tests import servers, slurm

    return not slurm.available() if binary == "slurm" else not servers.have(binary)


@pytest.hookimpl(tryfirst=True)  # before -m deselects
def pytest_collection_modifyitems(config, items):
    for item in items:
        needs = [b for m in item.iter_markers("needs") for b in m.args]
        if needs or SERVER_FIXTURES & set(getattr(item, "fixturenames", ())):
            item.add_marker(pytest.mark.slow)
        missing = [b for b in dict.fromkeys(needs) if _missing(b)]
        if missing and not os.environ.get("CI"):
            item.add_marker(pytest.mark.skip(reason=f"{', '.join(missing)} not installed or not usable "
                                                    "(./run test installs it)"))


# Tests clean up after themselves: the code under test and the processes it starts take their
# temporary folders (tempfile, $TMPDIR) from one folder per run, made here and removed at the end;
# a gpufleet-* folder still in it when the run ends is a leak and fails the run. pytest's own
# tmp_path folders stay in the system temporary directory (PYTEST_DEBUG_TEMPROOT), kept as usual.
# With pytest-xdist the controller makes the folder and its workers inherit it.
def pytest_configure(config):
    if hasattr(config, "workerinput"):
        return
    import tempfile

    os.environ.setdefault("PYTEST_DEBUG_TEMPROOT", tempfile.gettempdir())
    run_tmp = tempfile.mkdtemp(prefix="pytest-run-tmp-")
    config.stash[_RUN_TMP] = run_tmp
    os.environ["TMPDIR"] = run_tmp
    tempfile.tempdir = None  # read $TMPDIR again


def pytest_sessionfinish(session, exitstatus):
    run_tmp = session.config.stash.get(_RUN_TMP, None)
    if run_tmp is None:
        return
    import gc
    import shutil

    gc.collect()  # objects that remove their folder when collected
    left = sorted(n for n in os.listdir(run_tmp) if n.startswith("gpufleet-"))
    shutil.rmtree(run_tmp, ignore_errors=True)
    if left:
        session.config.get_terminal_writer().line(
            f"tests left {len(left)} temporary folder(s) behind: {', '.join(left[:10])}", red=True)
        if exitstatus == pytest.ExitCode.OK:
            session.exitstatus = pytest.ExitCode.TESTS_FAILED
