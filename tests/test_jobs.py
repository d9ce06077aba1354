"""Job attribution from /proc: a /proc-shaped tree, the recorded H200 process, real processes."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import pytest
from gpufleet.agent import jobs

from gpufleet.errors import ConfigError
from tests.conftest import FIXTURES

POD = "3f1c9a52-7d4e-4b8a-9c1e-0a2b3c4d5e6f"


def make_proc(root, pid, env=None, cgroup="0::/\n", ns_file=None):
    d = root / str(pid)
    d.mkdir(parents=True)
    if env is not None:
        (d / "environ").write_bytes(b"".join(f"{k}={v}".encode() + b"\0" for k, v in env.items()))
    (d / "cgroup").write_text(cgroup)
    if ns_file is not None:
        sa = d / "root" / jobs._SA_NAMESPACE
        sa.parent.mkdir(parents=True)
        sa.write_text(ns_file + "\n")


def test_recorded_h200_process(tmp_path):
    rec = json.loads((FIXTURES / "jobs" / "h200_busy_procs.json").read_text())["procs"][0]
    env = {"PATH": "/usr/bin", **rec["slurm_env"]}
    make_proc(tmp_path, rec["pid"], env=env, cgroup=rec["cgroup"])
    assert jobs.resolve_job([rec["pid"]], str(tmp_path)) == "4242"
    info = jobs.job_info([rec["pid"]], str(tmp_path))
    assert info.scheduler == "slurm" and info.user == "trainer" and info.step == "0"
    # its cgroup path (a VM's process_api group) names no job: without the environment, nothing
    (tmp_path / str(rec["pid"]) / "environ").unlink()
    assert jobs.resolve_job([rec["pid"]], str(tmp_path)) is None


@pytest.mark.parametrize("cgroup,job,step,user", [
    ("12:memory:/slurm/uid_1000/job_77/step_0/task_0\n4:cpu:/\n", "77", "0", "1000"),
    ("0::/system.slice/slurmstepd.scope/job_90210/step_batch/user/task_0\n", "90210", "batch", None),
    ("0::/slurm_node07/uid_500/job_1234567/step_extern\n", "1234567", "extern", "500"),
])
def test_slurm_cgroup_paths(tmp_path, cgroup, job, step, user):
    make_proc(tmp_path, 10, env=None, cgroup=cgroup)  # environ unreadable: cgroup only
    info = jobs.job_info([10], str(tmp_path))
    assert (info.scheduler, info.job_id, info.step, info.user) == ("slurm", job, step, user)


@pytest.mark.parametrize("cgroup,qos", [
    (f"0::/kubepods/burstable/pod{POD}/0123456789abcdef\n", "burstable"),
    (f"11:memory:/kubepods/pod{POD}/0123456789abcdef\n", "guaranteed"),
    ("0::/kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod"
     f"{POD.replace('-', '_')}.slice/cri-containerd-0123abc.scope\n", "besteffort"),
    (f"0::/kubepods.slice/kubepods-pod{POD.replace('-', '_')}.slice/crio-99.scope\n", "guaranteed"),
])
def test_kubernetes_cgroup_paths(tmp_path, cgroup, qos):
    make_proc(tmp_path, 20, env={"HOME": "/"}, cgroup=cgroup)
    info = jobs.job_info([20], str(tmp_path))
    assert (info.scheduler, info.job_id, info.qos, info.namespace) == ("kubernetes", POD, qos, None)


def test_kubernetes_namespace(tmp_path):
    cg = f"0::/kubepods/burstable/pod{POD}/abc\n"
    make_proc(tmp_path, 30, env={"POD_NAMESPACE": "training"}, cgroup=cg)
    make_proc(tmp_path, 31, env={}, cgroup=cg, ns_file="research")
    assert jobs.job_info([30], str(tmp_path)).namespace == "training"
    assert jobs.job_info([31], str(tmp_path)).namespace == "research"
    assert jobs.job_info([31], str(tmp_path)).tags(["scheduler", "namespace"]) == {
        "scheduler": "kubernetes", "job_namespace": "research"}


def test_majority_and_missing(tmp_path):
    make_proc(tmp_path, 5, env={"SLURM_JOB_ID": "1"})
    make_proc(tmp_path, 6, env={"SLURM_JOB_ID": "2"})
    make_proc(tmp_path, 7, env={"SLURM_JOB_ID": "2"})
    make_proc(tmp_path, 8, env={"SLURM_JOB_ID": "not-a-number"})
    assert jobs.resolve_job([5, 6, 7, 999], str(tmp_path)) == "2"
    assert jobs.resolve_job([5, 6], str(tmp_path)) == "1"  # tie: lowest pid
    assert jobs.resolve_job([8], str(tmp_path)) is None
    assert jobs.resolve_job([], str(tmp_path)) is None
    assert jobs.resolve_job([4242], "/nonexistent") is None


def test_tag_option():
    assert jobs.check_tag_keys("scheduler, partition") == ("scheduler", "partition")
    assert jobs.check_tag_keys(None) == ()
    with pytest.raises(ConfigError):
        jobs.check_tag_keys(["job_id"])  # high-cardinality: refused
    info = jobs.JobInfo("slurm", "9", partition="gpu", user="ann")
    assert info.tags(["partition", "user"]) == {"job_partition": "gpu", "job_user": "ann"}
    assert info.tags([]) == {}


def test_real_processes():
    env = {**os.environ, "SLURM_JOB_ID": "31337", "SLURM_JOB_PARTITION": "h200", "SLURM_JOB_USER": "ann"}
    code = "import sys,time; sys.stdout.write('go\\n'); sys.stdout.flush(); time.sleep(30)"
    procs = [subprocess.Popen([sys.executable, "-c", code], env=env, stdout=subprocess.PIPE)
             for _ in range(2)]
    plain = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE,
                             env={k: v for k, v in os.environ.items() if not k.startswith("SLURM")})
    try:
        for p in [*procs, plain]:
            assert p.stdout.readline() == b"go\n"
        pids = [p.pid for p in procs]
        info = jobs.job_info(pids + [plain.pid])
        assert info.job_id == "31337" and info.partition == "h200" and info.user == "ann"
        assert jobs.resolve_job([plain.pid]) is None
        t0 = time.perf_counter()
        for _ in range(100):
            jobs.resolve_job(pids)
        assert (time.perf_counter() - t0) / 100 < 0.01  # cheap enough for every slow poll
    finally:
        for p in [*procs, plain]:
            p.kill()
            p.wait()
    assert jobs.resolve_job(pids) is None  # processes gone: no job, no error


def test_job_tags_helper(tmp_path):
    make_proc(tmp_path, 40, env={"SLURM_JOB_ID": "7", "SLURM_JOB_PARTITION": "h200"})
    assert jobs.job_tags([40], [], str(tmp_path)) == {}  # nothing unless the operator asks
    assert jobs.job_tags([40], "scheduler,partition", str(tmp_path)) == {
        "scheduler": "slurm", "job_partition": "h200"}
    assert jobs.job_tags([41], ["scheduler"], str(tmp_path)) == {}
