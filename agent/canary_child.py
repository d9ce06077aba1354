"""The SDC canary's child processes: how a check is started out of the agent's process, bounded
and read back, and which GPU processes are the agent's own.

Each check is a short-lived child, ``python -P .../agent/canary_worker.py``, that imports the
engine (torch or cupy on the GPU; numpy on the CPU), runs the seeded GEMM and the memory pattern
on ONE GPU (``CUDA_VISIBLE_DEVICES=<uuid>``), prints one JSON line and exits, so its CUDA context
(the clocks it pins, ~0.8 GB of host memory torch takes) dies with it. This module never imports
torch, cupy or any CUDA library. The child runs in its own session with a hard deadline
(``timeout``; then SIGKILL to its process group) and a memory bound (``max_rss``: its resident
set, read from ``/proc`` at every poll and while waiting, kills it beyond the bound; the CPU
engine also gets ``RLIMIT_AS``, which a CUDA process cannot have: CUDA reserves tens of GB of
address space). A child that hangs, crashes or is killed is an answer with ``ok: false`` and a
``reason``, never an exception.
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
import time
from pathlib import Path

CHILD_ENGINES = ("auto", "torch", "cupy", "numpy")
NO_ENGINE_HINT = ("a GPU check needs torch or cupy: set canary.python (gpufleet canary --python) to an "
                  "interpreter that has one, e.g. /opt/gpufleet-canary/bin/python (docs/sources.md)")

# The child runs this file as a script: it imports only the standard library, numpy and the
# engine, so any interpreter with those can run it (``canary.python``: one with torch or cupy).
WORKER = str(Path(__file__).resolve().parent / "canary_worker.py")


def canary_engines(python: str = "") -> list[str]:
    """The CUDA engines (torch, cupy) the canary's child interpreter can import, looked up in a
    child: the agent itself never imports them or asks its import system for them."""
    import subprocess

    probe = "import importlib.util as u; print(' '.join(m for m in ('torch', 'cupy') if u.find_spec(m)))"
    try:
        r = subprocess.run([python or sys.executable, "-P", "-c", probe], capture_output=True, text=True,
                           timeout=30, stdin=subprocess.DEVNULL)
    except (OSError, subprocess.TimeoutExpired):
        return []
    return r.stdout.split() if r.returncode == 0 else []


def _resident_bytes(pid: int) -> int | None:
    try:
        with open(f"/proc/{pid}/status", "rb") as f:
            for line in f:
                if line.startswith(b"VmRSS:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        return None
    return None


def _parent_pid(pid: int) -> int | None:
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read()
        return int(stat[stat.rindex(b")") + 2:].split()[1])
    except (OSError, ValueError, IndexError):
        return None


def is_own_process(pid: int | None, own: int | None = None, depth: int = 16) -> bool:
    """``pid`` is this process or one of its descendants (``/proc`` parent chain)."""
    own = os.getpid() if own is None else own
    for _ in range(depth):
        if pid == own:
            return True
        if pid is None or pid <= 1:
            return False
        pid = _parent_pid(pid)
    return False


def _record_pid(p) -> int | None:
    """The pid of one NVML compute-process record (an object or a recording's dict); None when absent."""
    v = p.get("pid") if isinstance(p, dict) else getattr(p, "pid", None)
    if v is None:
        return None
    try:
        return int(v)
    except (TypeError, ValueError):
        return None


def foreign_processes(procs, children: set[int]) -> list:
    """The NVML compute-process records that are not ours: neither one of ``children`` (pids) nor
    this process or a descendant of it. A record without a pid counts as foreign."""
    out = []
    for p in procs:
        pid = _record_pid(p)
        if pid is None or not (pid in children or is_own_process(pid)):
            out.append(p)
    return out


class Child:
    """One running ``gpufleet.agent.canary_worker`` process: its own session, output in temp files."""

    def __init__(self, argv: list[str], env: dict, timeout: float, max_rss: int, cpu_only: bool):
        import subprocess

        self.out = tempfile.TemporaryFile()
        self.err = tempfile.TemporaryFile()
        self.t0 = time.monotonic()
        self.deadline = self.t0 + timeout
        self.timeout, self.max_rss = timeout, max_rss
        self.proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=self.out, stderr=self.err,
                                     env=env, start_new_session=True, close_fds=True)
        self.peak_rss = 0
        self.killed: str | None = None
        self.result: dict | None = None  # once done: what poll() returns from then on
        if cpu_only and max_rss > 0:
            try:
                import resource

                resource.prlimit(self.proc.pid, resource.RLIMIT_AS, (max_rss, max_rss))
            except (OSError, ValueError, AttributeError):
                pass  # the RSS watch still bounds it

    @property
    def pid(self) -> int:
        return self.proc.pid

    def poll(self) -> dict | None:
        """The child's result once it is done (or killed), else None. Enforces deadline and RSS."""
        if self.result is not None:
            return self.result
        rc = self.proc.poll()
        if rc is None:
            rss = _resident_bytes(self.proc.pid) or 0
            self.peak_rss = max(self.peak_rss, rss)
            if self.max_rss > 0 and rss > self.max_rss:
                self.kill(f"resident memory {rss >> 20} MiB over the {self.max_rss >> 20} MiB bound")
            elif time.monotonic() > self.deadline:
                self.kill(f"no answer within the {self.timeout:g} s deadline")
            else:
                return None
            rc = self.proc.returncode
        self.result = self._result(rc)
        return self.result

    def wait(self, seconds: float) -> dict | None:
        end = time.monotonic() + seconds
        while True:
            res = self.poll()
            if res is not None or time.monotonic() >= end:
                return res
            time.sleep(min(0.02, max(0.0, end - time.monotonic())))

    def kill(self, why: str) -> None:
        import signal

        self.killed = why
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
        try:
            self.proc.wait(10)
        except Exception:  # noqa: BLE001 - an unkillable child (D state): reported as killed
            pass

    def _result(self, rc) -> dict:
        wall = time.monotonic() - self.t0
        self.out.seek(0)
        self.err.seek(0)
        out = self.out.read().decode(errors="replace")
        err = self.err.read().decode(errors="replace").strip()
        self.out.close()
        self.err.close()
        if self.killed:
            return {"ok": False, "reason": "killed", "error": f"killed: {self.killed}", "wall_s": wall}
        res = None
        for line in reversed(out.splitlines()):
            if line.startswith("{"):
                try:
                    res = json.loads(line)
                    break
                except ValueError:
                    continue
        if not isinstance(res, dict):
            tail = err.splitlines()[-1] if err else "no output"
            how = f"killed by signal {-rc}" if isinstance(rc, int) and rc < 0 else f"exit {rc}"
            res = {"ok": False, "reason": "crashed", "error": f"child {how}: {tail[:300]}"}
        res["wall_s"] = wall
        res["peak_rss_bytes"] = self.peak_rss
        return res


def worker_argv(engine: str, size: int, dtype: str, seed: int, memory_bytes: int, state_dir: str,
                label: str, driver: str, inject: tuple[int, int] | None = None,
                python: str = "") -> list[str]:
    """The child's command line. ``-P``: the script's folder (gpufleet's agent modules, ``config.py``
    among them) does not come first on the child's import path, and the child's import path is
    the interpreter's own (no PYTHONPATH of ours): nothing of gpufleet (``gpufleet/secrets.py``)
    shadows the standard library or numpy."""
    argv = [python or sys.executable, "-P", WORKER, "--engine", engine, "--size", str(size),
            "--seed", str(seed), "--memory-bytes", str(memory_bytes), "--state-dir", state_dir,
            "--label", label, "--driver", driver]
    if dtype:
        argv += ["--dtype", dtype]
    if inject is not None:
        argv += ["--inject", f"{inject[0]}:{inject[1]}"]
    return argv


def worker_env(uuid: str | None, index: int | None, cpu_only: bool) -> dict:
    """The child's environment: one visible GPU, quiet BLAS threads, the import path unchanged."""
    env = dict(os.environ)
    env["CUDA_DEVICE_ORDER"] = "PCI_BUS_ID"
    if cpu_only:
        env["CUDA_VISIBLE_DEVICES"] = ""
        for k in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
            env.setdefault(k, "1")
    elif uuid:
        env["CUDA_VISIBLE_DEVICES"] = uuid
    elif index is not None:
        env["CUDA_VISIBLE_DEVICES"] = str(index)
    return env
