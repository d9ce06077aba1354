"""The canary out of the agent's process: children that import the engine, a deadline and a
memory bound that kill them, the agent never importing a CUDA library nor counting its own
processes as GPU users, rechecks before a failure is reported, the bounded-age status rows, and
the drop directory ``gpufleet canary`` writes into."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import pytest
from gpufleet.agent.backends.recorded import RecordedBackend
from gpufleet.agent.canary_drop import drop_sample, write_drop
from gpufleet.agent.collectors.canary import CanaryCollector

from tests.conftest import FIXTURES, ROOT

H200 = FIXTURES / "recordings" / "h200"
_PROC_CALLS = ("nvmlDeviceGetComputeRunningProcesses", "nvmlDeviceGetComputeRunningProcesses_v2",
               "nvmlDeviceGetComputeRunningProcesses_v3")


def canary_rows(samples):
    return [s for s in samples if s.measurement == "gpu_canary"]


def status(samples):
    return {s.tags.get("gpu", ""): s.fields for s in samples if s.measurement == "gpufleet_canary"}


def idle_h200_with_process(tmp_path, pid):
    """The real H200 8 s after its load stopped (utilization 0) with the compute process the busy
    H200 listed (pid 415, Slurm job 4242), its pid replaced by ``pid``: what NVML shows while a
    process holds a CUDA context on an otherwise idle GPU."""
    after = json.loads((H200 / "nvml_dump_after.json").read_text())
    busy = json.loads((H200 / "nvml_dump_busy.json").read_text())
    procs = [dict(p, pid=pid) for p in busy["calls"]["nvmlDeviceGetComputeRunningProcesses"]["value"]]
    for name in _PROC_CALLS:
        after["calls"][name] = {"ok": True, "value": procs}
    path = tmp_path / f"h200_pid{pid}.json"
    path.write_text(json.dumps(after))
    return RecordedBackend(path)


@pytest.mark.slow
def test_agent_process_never_imports_a_cuda_library(tmp_path):
    """An agent process with an NVML GPU and engine auto: the check's child tries torch/cupy (and
    says it found none here); the agent process itself never even attempts the import."""
    script = f"""
import importlib.abc, json, sys
tried = []
class Guard(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        top = name.split(".")[0]
        if top in ("torch", "cupy", "cupy_backends", "pycuda", "cuda", "triton") or "cudart" in name:
            tried.append(name)
        return None
sys.meta_path.insert(0, Guard())
from gpufleet.agent.backends.recorded import RecordedBackend
from gpufleet.agent.collectors.canary import CanaryCollector
import gpufleet.agent.daemon, gpufleet.agent.cli, gpufleet.agent.canary_cli
b = RecordedBackend({str(H200 / "nvml_dump_after.json")!r})
c = CanaryCollector(backend=b, engine="auto", wait=60, state_dir={str(tmp_path)!r})
rows = c.collect(1_000_000_000)
c.close()
cuda = sorted(m for m in sys.modules if m.split(".")[0] in ("torch", "cupy", "pycuda", "cuda"))
print(json.dumps({{"tried": tried, "modules": cuda, "skipped": c.skipped,
                  "status": [s.fields for s in rows if s.measurement == "gpufleet_canary"]}}))
"""
    r = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout.strip().splitlines()[-1])
    assert out["tried"] == [] and out["modules"] == []
    try:
        import torch  # noqa: F401
        has_cuda_engine = True
    except ImportError:
        has_cuda_engine = False
    if not has_cuda_engine:  # the child looked for torch and cupy and said so: one error, counted
        assert "no CUDA engine" in out["skipped"]["0"] and "torch" in out["skipped"]["0"]
        assert out["status"][0]["errors_total"] == 1 and out["status"][0]["checks_total"] == 0


def test_own_pid_and_children_never_make_a_gpu_busy(tmp_path):
    sleeper = subprocess.Popen(["sleep", "30"])
    try:
        for pid in (os.getpid(), sleeper.pid):  # the agent itself, and a child of it
            b = idle_h200_with_process(tmp_path, pid)
            col = CanaryCollector(backend=b, engine="numpy", standin=True, size=64, wait=60)
            assert col._busy(col.gpus[0]) is None
            rows = canary_rows(col.collect(1))
            assert [r.tags["gpu"] for r in rows] == ["0"] and rows[0].fields["passed"] == 1
            col.close()
    finally:
        sleeper.kill()
        sleeper.wait()
    # the recorded process as it was (pid 415, not ours): busy, nothing runs
    b = idle_h200_with_process(tmp_path, 415)
    col = CanaryCollector(backend=b, engine="numpy", standin=True, size=64, wait=60)
    if not col._busy(col.gpus[0]):
        pytest.skip("pid 415 is a descendant of this test here")
    assert canary_rows(col.collect(1)) == [] and col.skipped["0"] == "busy: 1 compute process(es)"
    # the real busy H200 (GEMM running): busy
    col = CanaryCollector(backend=RecordedBackend(H200 / "nvml_dump_busy.json"), engine="numpy", standin=True,
                          size=64, wait=60)
    assert canary_rows(col.collect(1)) == [] and col.skipped["0"].startswith("busy:")
    assert status(col.collect(int(120e9)))["0"]["busy_skips_total"] == 2  # looked at again after 60 s


def test_hung_and_crashing_children_are_killed_and_reported():
    # a child that does not answer within the deadline: killed (its whole process group), one error
    col = CanaryCollector(engine="numpy", size=2048, memory_bytes=256 << 20, interval=0, timeout=0.3,
                          status_every=0)
    t0 = time.monotonic()
    assert canary_rows(col.collect(1)) == []  # started, not waited on: the loop goes on
    assert time.monotonic() - t0 < 0.3
    child = col.gpus[0].child
    assert child is not None
    time.sleep(0.5)
    got = col.collect(2)
    assert canary_rows(got) == [] and col.gpus[0].child is None
    assert "deadline" in col.skipped["cpu"] and status(got)["cpu"]["errors_total"] == 1
    assert child.proc.returncode is not None
    with pytest.raises(ProcessLookupError):
        os.kill(child.pid, 0)
    # a child over its memory bound (the CPU engine: RLIMIT_AS) fails; reported, one log line
    col = CanaryCollector(engine="numpy", size=64, interval=0, wait=30, max_rss=64 << 20, status_every=0)
    got = col.collect(1)
    assert canary_rows(got) == [] and col.skipped["cpu"].startswith("check failed:")
    assert "\n" not in col.skipped["cpu"] and status(got)["cpu"]["errors_total"] == 1
    # the next check of a sane collector runs normally
    col = CanaryCollector(engine="numpy", size=64, interval=0, wait=30)
    assert canary_rows(col.collect(1))[0].fields["passed"] == 1


@pytest.mark.slow
def test_a_failed_check_is_rechecked_before_it_is_reported():
    col = CanaryCollector(engine="numpy", size=64, interval=0, wait=60, confirm=2)
    canary_rows(col.collect(1))
    col.inject_bitflips(count=4, bit=5)  # transient: the recheck passes
    (row,) = canary_rows(col.collect(2))
    assert row.fields["checks"] == 2 and row.fields["checks_failed"] == 1
    assert row.fields["passed"] == 0 and row.fields["mismatches"] == 4  # the failing check's fields

    from gpufleet.agent.backends.sim import SimBackend

    from tests.test_agent_integration import T0, FleetNode, ns

    b = SimBackend(FleetNode())
    b.nvmlInit()
    col = CanaryCollector(backend=b, interval=300, confirm=2, busy_size=256)
    b.begin_poll(ns(T0 + 310))  # GPU 1's canary fails for good from T0+300
    rows = {r.tags["gpu"]: r.fields for r in canary_rows(col.collect(ns(T0 + 310)))}
    assert rows["1"]["checks"] == 3 and rows["1"]["checks_failed"] == 3 and rows["1"]["mismatches"] == 17
    assert rows["0"]["checks"] == 1 and rows["0"]["checks_failed"] == 0


def test_status_rows_say_when_each_gpu_was_last_checked():
    from gpufleet.agent.backends.sim import SimBackend, TinyNode

    t = [100.0]  # TinyNode: both GPUs busy at t=100 (busy 420 s of every 600 s)
    backend = SimBackend(TinyNode(n_gpus=2, t0=0.0))
    backend.begin_poll(int(t[0] * 1e9))
    col = CanaryCollector(backend=backend, engine="numpy", standin=True, size=64, clock=lambda: t[0], wait=60,
                          interval=3600, max_age=300, busy_backoff=30, status_every=60)
    st = status(col.collect(int(t[0] * 1e9)))
    assert st["0"]["overdue"] == 0 and "last_check_seconds" not in st["0"]
    assert st["0"]["max_age_seconds"] == 300
    t[0] = 401.0  # still busy, max_age passed: overdue
    backend.begin_poll(int(t[0] * 1e9))
    st = status(col.collect(int(t[0] * 1e9)))
    assert st["0"]["overdue"] == 1 and st["0"]["busy_skips_total"] >= 2
    t[0] = 500.0  # idle: checked
    backend.begin_poll(int(t[0] * 1e9))
    got = col.collect(int(t[0] * 1e9))
    st = status(got)
    assert len(canary_rows(got)) == 2
    assert st["0"]["overdue"] == 0 and st["0"]["last_check_seconds"] == 500.0 and st["0"]["age_seconds"] == 0
    assert st["0"]["checks_total"] == 1


def test_drop_directory_results_become_rows(tmp_path, caplog):
    drop = tmp_path / "drop"
    probe = CanaryCollector(engine="numpy", size=64, interval=0, wait=60)
    row = canary_rows(probe.collect(1_700_000_000_000_000_000))[0]
    path = write_drop(drop, row, "slurm-epilog")
    assert json.loads(path.read_text())["source"] == "slurm-epilog"
    (drop / "0-garbled.json").write_text("{not json")
    (drop / "1-wrong.json").write_text(json.dumps({"version": 1, "time_ns": 5, "tags": {"gpu": "0"},
                                                   "fields": {"passed": "yes"}}))
    agent = CanaryCollector(engine="numpy", size=64, interval=3600, wait=60, drop_dir=str(drop))
    got = agent.collect(1_700_000_100_000_000_000)
    rows = canary_rows(got)
    picked = [r for r in rows if r.extra.get("source") == "slurm-epilog"]
    assert len(picked) == 1 and picked[0].fields == row.fields and picked[0].time_ns == row.time_ns
    st = status(got)
    assert st[""] == {"drop_files_total": 1, "drop_errors_total": 2}
    assert sorted(p.name for p in drop.iterdir()) == ["0-garbled.json.bad", "1-wrong.json.bad"]
    assert sum("malformed" in r.getMessage() for r in caplog.records) == 2
    assert st["cpu"]["checks_total"] == 2  # its own check and the dropped one
    # a full drop directory refuses the write (the CLI reports it), nothing half-written
    for _ in range(3):
        write_drop(drop, row, "x", max_files=3)
    with pytest.raises(OSError, match="full"):
        write_drop(drop, row, "x", max_files=3)
    assert not [p for p in drop.iterdir() if p.name.endswith(".tmp")]
    with pytest.raises((ValueError, TypeError, KeyError)):
        drop_sample({"version": 1, "tags": {"gpu": "0"}, "fields": {"bogus": 1}, "time_ns": 1})


@pytest.mark.slow
def test_canary_cli_json_and_drop(tmp_path):
    drop = tmp_path / "drop"
    r = subprocess.run([sys.executable, "-m", "gpufleet", "canary", "--gpu", "all", "--engine", "numpy",
                        "--json", "--drop-dir", str(drop), "--state-dir", str(tmp_path / "st"),
                        "--source", "test"],
                       capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    assert out["ok"] and out["results"][0]["gpu"] == "cpu" and out["results"][0]["fields"]["passed"] == 1
    assert out["results"][0]["wall_s"] > out["results"][0]["fields"]["duration_seconds"]
    assert [os.path.basename(p) for p in out["drop_files"]] == [p.name for p in drop.iterdir()]
    # a full drop directory: the result is still printed, one line says why it was not handed over
    r = subprocess.run([sys.executable, "-m", "gpufleet", "canary", "--engine", "numpy", "--json",
                        "--drop-dir", str(drop), "--max-files", "1", "--state-dir", str(tmp_path / "st")],
                       capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert r.returncode == 1 and json.loads(r.stdout)["results"][0]["fields"]["passed"] == 1
    assert r.stderr.count("\n") == 1 and "drop directory full" in r.stderr
    assert len(list(drop.iterdir())) == 1
    r = subprocess.run([sys.executable, "-m", "gpufleet", "canary", "--gpu", "7", "--engine", "numpy"],
                       capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert r.returncode == 2 and r.stderr.count("\n") == 1 and "no such device" in r.stderr


def test_a_gpu_childs_resident_memory_is_bounded():
    """A CUDA child cannot have RLIMIT_AS: its resident set is watched and it is killed past the bound."""
    from gpufleet.agent.canary_child import Child

    grow = "import time; b = bytearray(300 << 20); b[::4096] = b'x' * len(b[::4096]); time.sleep(60)"
    c = Child([sys.executable, "-c", grow], dict(os.environ), timeout=60, max_rss=100 << 20, cpu_only=False)
    res = c.wait(30)
    assert res is not None and res["ok"] is False and res["reason"] == "killed"
    assert "resident memory" in res["error"] and c.proc.returncode is not None


def test_gpu_check_without_a_gpu_is_one_json_saying_so(tmp_path):
    env = {**os.environ, "PYTHON": sys.executable, "OUT": str(tmp_path)}
    r = subprocess.run([str(ROOT / "bench" / "gpu_check.sh")], capture_output=True, text=True, env=env,
                       timeout=120, cwd=tmp_path)
    if r.returncode == 0:
        pytest.skip("this machine has a GPU: bench/gpu_check.sh ran for real")
    doc = json.loads(r.stdout)
    assert r.returncode == 1 and doc["ok"] is False and doc["error"].startswith("no NVML here")
    assert json.loads((tmp_path / "gpu_check.json").read_text()) == doc


@pytest.mark.slow
def test_one_row_per_gpu_per_tick_so_the_pipeline_loses_none(tmp_path):
    drop = tmp_path / "drop"
    probe = CanaryCollector(engine="numpy", size=64, interval=0, wait=60)
    rows = [canary_rows(probe.collect(t))[0] for t in (10**18, 10**18 + 1)]
    for r, src in zip(rows, ("slurm-prolog", "slurm-epilog"), strict=True):
        write_drop(drop, r, src)
    agent = CanaryCollector(engine="numpy", size=64, interval=3600, wait=60, drop_dir=str(drop))
    ticks = [canary_rows(agent.collect(10**18 + k * 10**9)) for k in range(1, 5)]
    assert [len(t) for t in ticks] == [1, 1, 1, 0]  # its own check and the two drops, one per tick
    assert sorted(r.extra.get("source", "own") for t in ticks for r in t) == ["own", "slurm-epilog",
                                                                             "slurm-prolog"]


def test_a_recheck_that_crashes_ends_the_round_with_the_failure_it_has():
    col = CanaryCollector(engine="numpy", size=64, interval=3600, status_every=0)
    col.collect(1)
    col.gpus[0].child.wait(30)  # the first answer
    assert canary_rows(col.collect(2))[0].fields["passed"] == 1
    col.inject_bitflips(count=3, bit=4)
    col.gpus[0].next_due = 0  # due again now
    col.collect(3)  # started, with the flipped bits
    col.gpus[0].child.wait(30)
    col.max_rss = 1 << 20  # the recheck's child cannot even start (RLIMIT_AS 1 MiB)
    assert canary_rows(col.collect(4)) == [] and col.gpus[0].child is not None  # recheck running
    col.gpus[0].child.wait(30)
    got = col.collect(5)
    (row,) = canary_rows(got)
    assert row.fields["checks"] == 1 and row.fields["checks_failed"] == 1 and row.fields["mismatches"] == 3
    assert status(got)["cpu"]["errors_total"] == 1 and col.skipped["cpu"].startswith("check failed")


@pytest.mark.slow
def test_cli_on_a_gpu_without_a_cuda_engine_is_not_checked_exit_3(tmp_path):
    """NVML shows a GPU (a recording), the interpreter has neither torch nor cupy: no verdict,
    exit 3, the JSON says checked: false and how to get an engine; one line on stderr."""
    import importlib.util

    if importlib.util.find_spec("torch") or importlib.util.find_spec("cupy"):
        pytest.skip("this interpreter has a CUDA engine")
    rec = f"recorded:{H200 / 'nvml_dump_after.json'}"
    r = subprocess.run([sys.executable, "-m", "gpufleet", "canary", "--backend", rec, "--force", "--json",
                        "--state-dir", str(tmp_path)],
                       capture_output=True, text=True, cwd=tmp_path, timeout=120)
    assert r.returncode == 3, r.stderr
    doc = json.loads(r.stdout)
    assert doc["checked"] is False and doc["ok"] is False and doc["results"] == []
    assert "no CUDA engine" in doc["skipped"]["0"] and "canary.python" in doc["skipped"]["0"]
    assert r.stderr.count("\n") == 1 and r.stderr.startswith("gpufleet: error: gpu 0: not checked")
    # another interpreter, named: it runs the check (this one has numpy: the CPU engine there)
    r = subprocess.run([sys.executable, "-m", "gpufleet", "canary", "--engine", "numpy", "--json",
                        "--python", sys.executable, "--state-dir", str(tmp_path)],
                       capture_output=True, text=True, cwd=tmp_path, timeout=120)
    assert r.returncode == 0 and json.loads(r.stdout)["checked"] is True, r.stderr
    r = subprocess.run([sys.executable, "-m", "gpufleet", "canary", "--python", str(tmp_path / "nope")],
                       capture_output=True, text=True, cwd=tmp_path, timeout=120)
    assert r.returncode == 2 and r.stderr.count("\n") == 1 and "canary.python" in r.stderr


@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="needs two CPUs to run a check on one of them")
def test_the_cpu_check_gets_the_same_bits_wherever_it_runs(tmp_path):
    """The numpy engine's first answer, stored by a check on every CPU, is what a check confined to
    one CPU computes, and one in a bare environment (a Slurm job step's: no OPENBLAS_CORETYPE, so
    the BLAS picks its own kernel): no corruption where there is none."""
    worker = ROOT / "agent" / "canary_worker.py"
    args = [sys.executable, "-P", str(worker), "--engine", "numpy", "--state-dir", str(tmp_path),
            "--label", "cpu", "--memory-bytes", "0"]
    bare = {"PATH": os.environ.get("PATH", "/usr/bin:/bin")}

    def run(env, cpus=None):
        r = subprocess.run(args, capture_output=True, text=True, timeout=120, env=env,
                           preexec_fn=(lambda: os.sched_setaffinity(0, cpus)) if cpus else None)
        assert r.returncode == 0, r.stderr
        return json.loads(r.stdout)

    first = run({**bare, "OPENBLAS_CORETYPE": "Haswell"})
    assert first["first"] == "created" and first["mismatches"] == 0
    for env, cpus in ((bare, None), (bare, {min(os.sched_getaffinity(0))}), ({**os.environ}, None)):
        got = run(env, cpus)
        want = ("compared", 0, first["digest"])
        assert (got["first"], got["mismatches"], got["digest"]) == want, (env, cpus)
