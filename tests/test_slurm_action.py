"""Against a real single-node Slurm (tests/slurm.py): a job started with srun is attributed by
the agent from its real process, an incident drains the node through the shipped action-sink
example (reason in ``sinfo -R``), the resolve resumes it, and the rate limit holds; an unknown
node and a missing scontrol fail cleanly while the incident still pages."""

from __future__ import annotations

import copy
import dataclasses
import json
import logging
import subprocess
import time
import tomllib
from pathlib import Path

import pytest
from gpufleet.agent import jobs
from gpufleet.agent.backends.recorded import RecordedBackend
from gpufleet.agent.collectors.gpu import GpuCollector
from gpufleet.analyzer.alerting import Notifier, load_sinks

from tests.alerting_receiver import T0, Receiver, fast, incident
from tests.slurm import Slurm, skip_unless_slurm

pytestmark = skip_unless_slurm()
ROOT = Path(__file__).resolve().parent.parent
EXAMPLE = ROOT / "packaging" / "examples" / "action-slurm-drain.toml"
BUSY = ROOT / "tests" / "fixtures" / "recordings" / "h200" / "nvml_dump_busy.json"


@pytest.fixture(scope="module")
def slurm(tmp_path_factory):
    with Slurm(tmp_path_factory.mktemp("slurm")) as s:
        yield s


@pytest.fixture
def slurm_env(slurm, monkeypatch):
    """The analyzer's environment: scontrol finds this cluster; the node starts idle."""
    monkeypatch.setenv("SLURM_CONF", str(slurm.conf))
    yield slurm
    slurm.run(["scontrol", "update", f"NodeName={slurm.node}", "State=RESUME"], check=False)
    slurm.run(["scancel", "--full", "-u", "root"], check=False)


def example_sink(**overrides) -> dict:
    spec = copy.deepcopy(tomllib.loads(EXAMPLE.read_text())["sink"][0])
    del spec["budget_ledger"]  # beside the test's state file, not in /var/lib
    spec.update(overrides)
    return spec


def reasons(slurm) -> str:
    return slurm.run(["sinfo", "-R", "-h", "-o", "%n|%E"], check=False).stdout


class LiveProc(RecordedBackend):
    """The recorded busy H200, its compute process replaced by a live one, read through /proc."""

    proc_root = "/proc"

    def __init__(self, path, pid):
        super().__init__(path)
        self.devices[0].answers["nvmlDeviceGetComputeRunningProcesses"] = [
            {"pid": pid, "usedGpuMemory": 1 << 30, "gpuInstanceId": 0xFFFFFFFF,
             "computeInstanceId": 0xFFFFFFFF}]


def test_srun_job_is_attributed_by_the_agent_from_the_real_process(slurm_env, tmp_path):
    slurm = slurm_env
    pidfile = tmp_path / "pid"
    argv = ["srun", "-N1", "-n1", "-J", "train", "bash", "-c", f"echo $$ > {pidfile}; exec sleep 60"]
    job = subprocess.Popen(argv, env=slurm.env(), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        assert slurm.wait_for(lambda: pidfile.exists() and pidfile.read_text().strip(), timeout=30), \
            job.stderr.read1().decode() if job.poll() is not None else slurm.logs()
        pid = int(pidfile.read_text())
        job_id = slurm.run(["squeue", "-h", "-n", "train", "-o", "%i"]).stdout.split()[0]
        info = jobs.job_info([pid])
        assert (info.scheduler, info.job_id, info.partition, info.user) == ("slurm", job_id, "gpu", "root")
        # the GPU collector: NVML's process list -> /proc/<pid>/environ -> the job_id field
        collector = GpuCollector(LiveProc(BUSY, pid))
        try:
            (row,) = [s for s in collector.collect(time.time_ns()) if s.measurement == "gpu"]
        finally:
            collector.close()
        assert row.fields["process_count"] == 1 and row.fields["job_id"] == job_id
    finally:
        job.kill()
        job.wait()
        slurm.run(["scancel", "-n", "train"], check=False)


def test_incident_drains_the_node_and_the_resolve_resumes_it(slurm_env, tmp_path):
    slurm = slurm_env
    sinks = load_sinks([example_sink(dry_run=False, resume=True)], [])
    inc = incident(kind="sdc", id="sdc-real-1", host=slurm.node, gpu=5, jobs=["77"])
    with Notifier(sinks, tmp_path / "s.db") as n:
        t = time.monotonic()
        n.update([inc], now=T0)
        assert slurm.wait_for(lambda: "gpufleet" in reasons(slurm), timeout=10, every=0.02)
        took = time.monotonic() - t
        assert slurm.node_state() in ("drained", "draining", "drain")
        assert f"{slurm.node}|gpufleet: sdc on {slurm.node} GPU 5 (sdc-real-1)" in reasons(slurm)
        assert took <= 2.0, f"incident -> node drained took {took:.2f} s"
        n.update([dataclasses.replace(inc, end=T0 + 60)], now=T0 + 60)
        assert slurm.wait_for(lambda: slurm.node_state() == "idle", timeout=10, every=0.05)
        assert "gpufleet" not in reasons(slurm)
        log = n.actions()
    assert [(r["action"], r["status"], r["rc"]) for r in log] == [("firing", "ok", 0), ("resolved", "ok", 0)]
    assert log[0]["argv"][:4] == ["scontrol", "update", f"NodeName={slurm.node}", "State=DRAIN"]


def test_dry_run_default_leaves_the_node_alone(slurm_env, tmp_path):
    slurm = slurm_env
    with Notifier(load_sinks([example_sink()], []), tmp_path / "s.db") as n:
        n.update([incident(kind="gpu_lost", id="dry-1", host=slurm.node)], now=T0)
        assert n.flush(10)
        assert [r["status"] for r in n.actions()] == ["dry-run"]
    assert slurm.node_state() == "idle" and "gpufleet" not in reasons(slurm)


def test_rate_limit_holds_against_the_real_scheduler(slurm_env, tmp_path, caplog):
    slurm = slurm_env
    sinks = load_sinks([example_sink(dry_run=False, max_per_hour=1)], [])
    with caplog.at_level(logging.INFO, logger="gpufleet.alerting"), Notifier(sinks, tmp_path / "s.db") as n:
        n.update([incident(kind="sdc", id="rl-1", host=slurm.node)], now=T0)
        assert n.flush(10)
        assert "rl-1" in reasons(slurm)
        slurm.run(["scontrol", "update", f"NodeName={slurm.node}", "State=RESUME"])
        assert slurm.wait_for(lambda: slurm.node_state() == "idle", timeout=10)
        # a second fault within the hour: the valve holds, the node stays in service
        n.update([incident(kind="gpu_lost", id="rl-2", host=slurm.node, start=T0 + 900)], now=T0 + 900)
        assert n.flush(10)
        assert slurm.node_state() == "idle" and "rl-2" not in reasons(slurm)
        assert [r["status"] for r in n.actions()] == ["ok", "suppressed"]
    assert any("rl-2" in m and "rate limit reached" in m for m in caplog.messages)


def test_unknown_node_and_missing_scontrol_fail_cleanly_and_still_page(slurm_env, tmp_path, caplog,
                                                                       monkeypatch):
    slurm = slurm_env
    hook = fast({"type": "webhook", "url": "http://127.0.0.1:1/hook"})
    with Receiver() as rx:
        sinks = load_sinks([example_sink(dry_run=False), {**hook, "url": rx.url + "/hook"}], [])
        with caplog.at_level(logging.INFO, logger="gpufleet.alerting"), \
                Notifier(sinks, tmp_path / "s.db") as n:
            n.update([incident(kind="sdc", id="ghost-1", host="no-such-node")], now=T0)
            assert n.flush(15)
            with monkeypatch.context() as m:
                m.setenv("PATH", str(tmp_path))  # scontrol not installed
                n.update([incident(kind="sdc", id="nopath-1", host=slurm.node, start=T0 + 1)], now=T0 + 1)
                assert n.flush(15)
            log = n.actions()
        keys = sorted(r["json"]["key"] for r in rx.requests)
    # paged anyway, and a second page says the drain was refused and why
    assert keys == ["action-refused:ghost-1", "action-refused:nopath-1", "ghost-1", "nopath-1"]
    assert [r["status"] for r in log] == ["refused-verify", "refused-verify"]
    assert "exited 1: Node no-such-node not found" in log[0]["detail"]
    assert "scontrol: command not found" in log[1]["detail"]
    ghost = [m for m in caplog.messages if "ghost-1" in m]
    assert len(ghost) == 1 and "Node no-such-node not found" in ghost[0]
    assert slurm.node_state() == "idle"
    assert json.dumps(log)  # the record is plain data
