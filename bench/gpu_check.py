"""The GPU check: what the agent and its canary do to a real GPU, in one run, as ONE JSON object.

Run it with ``bench/gpu_check.sh`` (which installs carried wheels and sets PYTHONPATH); the
result goes to stdout and, when ``$OUT`` is set, to ``$OUT/gpu_check.json``. Read-only toward
the GPU: NVML getters, ``nvidia-smi -q -x`` and the canary's compute work only; it never sets a
clock, a limit or a mode, and never resets anything. This process never imports torch or cupy
(the canary's children do), so the idle readings are the GPU's own.

Stages (each one's failure is recorded in its entry; the rest still run):

- ``agent_once``: ``gpufleet agent once --backend nvml --format json`` -- exit code, GPU rows,
  every field declared in the catalogue with its type;
- ``poll_cost``: CPU per GPU of one collector poll (``GpuCollector``) next to a bare-NVML poll
  of 12 getters and to ``nvidia-smi -q -x``, in the same child process;
- ``daemon_plain`` / ``daemon_canary``: ``gpufleet agent run`` (1 s ticks) without and with the
  canary collector (``interval = 30s``): the daemon's CPU per tick and resident memory (its own
  process; the canary's children apart), canary checks run vs scheduled over the window, each
  check's wall time and the child's start-up cost;
- ``idle_after_check``: idle power, SM clock, clock-event reasons and P-state for 5 s before one
  ``gpufleet canary`` check on GPU 0 and from 10 s after it, and that check's timings.

``--backend sim`` runs the same plumbing on the simulated node (no GPU: the canary on the CPU).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import signal
import subprocess
import sys
import tempfile
import time
import traceback
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PY = sys.executable
T_START = time.monotonic()


def gpufleet(*args: str) -> list[str]:
    return [PY, "-m", "gpufleet", *args]


def env() -> dict:
    e = dict(os.environ)
    e["PYTHONPATH"] = str(ROOT) + (os.pathsep + e["PYTHONPATH"] if e.get("PYTHONPATH") else "")
    return e


def stage(fn):
    """Run one stage; its exception becomes ``{"error": ...}`` in its entry."""

    def run(*a, **kw):
        t0 = time.monotonic()
        try:
            out = fn(*a, **kw)
        except Exception as exc:  # noqa: BLE001 - one stage's failure never stops the others
            out = {"error": f"{type(exc).__name__}: {exc}", "trace": traceback.format_exc().splitlines()[-3:]}
        out["stage_seconds"] = round(time.monotonic() - t0, 2)
        return out

    return run


# ---------------------------------------------------------------------------------- NVML
class Nvml:
    """The few NVML getters this script reads itself (pynvml, or the simulated backend)."""

    def __init__(self, backend: str):
        if backend == "sim":
            from gpufleet.agent.backends import get_backend

            self.n = get_backend("sim")
        else:
            import pynvml

            self.n = pynvml
        self.n.nvmlInit()
        self.count = int(self.n.nvmlDeviceGetCount())
        self.handles = [self.n.nvmlDeviceGetHandleByIndex(i) for i in range(self.count)]

    def _s(self, v):
        return v.decode() if isinstance(v, bytes) else str(v)

    def info(self) -> dict:
        n = self.n
        out = {"driver": self._s(n.nvmlSystemGetDriverVersion()), "gpus": []}
        for h in self.handles:
            g = {"name": self._s(n.nvmlDeviceGetName(h))}
            for k, f in (
                ("compute_mode", "nvmlDeviceGetComputeMode"),
                ("persistence", "nvmlDeviceGetPersistenceMode"),
                ("power_limit_w", "nvmlDeviceGetEnforcedPowerLimit"),
            ):
                try:
                    v = getattr(n, f)(h)
                    g[k] = v / 1000 if k == "power_limit_w" else int(v)
                except Exception:  # noqa: BLE001 - not supported: absent
                    pass
            out["gpus"].append(g)
        return out

    def sample(self, i: int) -> dict:
        n, h = self.n, self.handles[i]
        s = {"t": time.time()}
        for k, f, a in (
            ("power_w", "nvmlDeviceGetPowerUsage", ()),
            ("sm_mhz", "nvmlDeviceGetClockInfo", (1,)),
            ("reasons", "nvmlDeviceGetCurrentClocksEventReasons", ()),
            ("pstate", "nvmlDeviceGetPerformanceState", ()),
            ("util", "nvmlDeviceGetUtilizationRates", ()),
        ):
            try:
                v = getattr(n, f)(h, *a)
                s[k] = v / 1000 if k == "power_w" else (v.gpu if k == "util" else int(v))
            except Exception:  # noqa: BLE001 - absent
                pass
        try:
            s["procs"] = len(n.nvmlDeviceGetComputeRunningProcesses(h) or [])
        except Exception:  # noqa: BLE001
            pass
        return s

    def compute_pids(self) -> list[int]:
        out = []
        for h in self.handles:
            try:
                out += [
                    int(getattr(x, "pid", None) or x["pid"])
                    for x in self.n.nvmlDeviceGetComputeRunningProcesses(h)
                ]
            except Exception:  # noqa: BLE001 - unknown
                pass
        return out

    def window(self, i: int, seconds: float, hz: float = 5.0) -> dict:
        rows = []
        end = time.monotonic() + seconds
        while time.monotonic() < end:
            rows.append(self.sample(i))
            time.sleep(1 / hz)

        def mean(k):
            v = [r[k] for r in rows if k in r]
            return round(sum(v) / len(v), 2) if v else None

        reasons = sorted({r["reasons"] for r in rows if "reasons" in r})
        return {
            "samples": len(rows),
            "power_w": mean("power_w"),
            "sm_mhz": mean("sm_mhz"),
            "util": mean("util"),
            "reasons": [hex(r) for r in reasons],
            "pstates": sorted({r["pstate"] for r in rows if "pstate" in r}),
            "max_procs": max((r.get("procs", 0) for r in rows), default=None),
        }


# ------------------------------------------------------------------------------- stages
@stage
def agent_once(backend: str, n_gpus: int) -> dict:
    from gpufleet import catalogue

    t0 = time.monotonic()
    r = subprocess.run(
        gpufleet("agent", "once", "--backend", backend, "--format", "json"),
        capture_output=True,
        text=True,
        env=env(),
        timeout=120,
        cwd=ROOT,
    )
    out = {
        "rc": r.returncode,
        "wall_s": round(time.monotonic() - t0, 3),
        "stderr": r.stderr.strip().splitlines()[-5:],
    }
    rows = json.loads(r.stdout) if r.returncode == 0 else []
    declared = {(m.measurement, m.field): m.python_type for m in catalogue.load()}
    undeclared, mistyped = set(), set()
    for s in rows:
        for k, v in s["fields"].items():
            t = declared.get((s["measurement"], k))
            if t is None:
                undeclared.add(f"{s['measurement']}.{k}")
            elif not (type(v) is t or (t is float and type(v) is int)):
                mistyped.add(f"{s['measurement']}.{k}:{type(v).__name__}")
    gpu = [s for s in rows if s["measurement"] == "gpu"]
    per_gpu = {s["tags"]["gpu"]: len(s["fields"]) for s in gpu}
    ok_col = {
        s["tags"].get("collector"): s["fields"].get("success")
        for s in rows
        if s["measurement"] == "gpufleet_collector"
    }
    out.update(
        gpu_rows=len(gpu),
        fields_per_gpu=per_gpu,
        measurements=sorted({s["measurement"] for s in rows}),
        undeclared=sorted(undeclared),
        mistyped=sorted(mistyped),
        collectors_ok=ok_col,
        valid=r.returncode == 0
        and len(gpu) == n_gpus
        and not undeclared
        and not mistyped
        and all(v == 1 for v in ok_col.values()),
    )
    return out


_POLL = r"""
import json, resource, subprocess, sys, time
backend, polls = sys.argv[1], int(sys.argv[2])
from gpufleet.agent.backends import get_backend
from gpufleet.agent.collectors.gpu import GpuCollector
b = get_backend(backend)
b.nvmlInit()
n = int(b.nvmlDeviceGetCount())
col = GpuCollector(b, nvlink=True)
def cost(fn, k):
    fn(); fn()
    c0, w0 = time.process_time(), time.perf_counter()
    for _ in range(k):
        fn()
    return (time.process_time() - c0) / k, (time.perf_counter() - w0) / k
res = {"gpus": n}
c, w = cost(lambda: col.collect(time.time_ns()), polls)
res["collector"] = {"cpu_ms_per_poll": c * 1e3, "cpu_ms_per_gpu": c * 1e3 / n, "wall_ms_per_poll": w * 1e3}
col.close()
hs = [b.nvmlDeviceGetHandleByIndex(i) for i in range(n)]
calls = [("nvmlDeviceGetUtilizationRates", ()), ("nvmlDeviceGetMemoryInfo", ()),
         ("nvmlDeviceGetTemperature", (0,)), ("nvmlDeviceGetPowerUsage", ()),
         ("nvmlDeviceGetClockInfo", (1,)),
         ("nvmlDeviceGetClockInfo", (2,)), ("nvmlDeviceGetTotalEnergyConsumption", ()),
         ("nvmlDeviceGetCurrentClocksEventReasons", ()), ("nvmlDeviceGetPerformanceState", ()),
         ("nvmlDeviceGetFanSpeed", ()), ("nvmlDeviceGetEnforcedPowerLimit", ()),
         ("nvmlDeviceGetComputeRunningProcesses", ())]
def bare():
    for h in hs:
        for f, a in calls:
            try:
                getattr(b, f)(h, *a)
            except Exception:
                pass
c, w = cost(bare, polls)
res["bare_nvml_12_getters"] = {"cpu_ms_per_poll": c * 1e3, "cpu_ms_per_gpu": c * 1e3 / n,
                               "wall_ms_per_poll": w * 1e3}
import shutil
if backend == "nvml" and shutil.which("nvidia-smi") is None:
    res["nvidia_smi_q_x"] = {"error": "nvidia-smi not found"}
elif backend == "nvml":
    runs = []
    for _ in range(3):
        r0 = resource.getrusage(resource.RUSAGE_CHILDREN)
        w0 = time.perf_counter()
        p = subprocess.run(["nvidia-smi", "-q", "-x"], capture_output=True, timeout=60)
        r1 = resource.getrusage(resource.RUSAGE_CHILDREN)
        cpu = r1.ru_utime + r1.ru_stime - r0.ru_utime - r0.ru_stime
        runs.append((cpu, time.perf_counter() - w0, p.returncode))
    c = sum(x[0] for x in runs) / 3
    res["nvidia_smi_q_x"] = {"cpu_ms_per_run": c * 1e3, "cpu_ms_per_gpu": c * 1e3 / n,
                             "wall_ms_per_run": sum(x[1] for x in runs) / 3 * 1e3, "rc": runs[-1][2]}
print(json.dumps(res))
"""


@stage
def poll_cost(backend: str, polls: int = 20) -> dict:
    r = subprocess.run(
        [PY, "-c", _POLL, backend, str(polls)],
        capture_output=True,
        text=True,
        env=env(),
        timeout=180,
        cwd=ROOT,
    )
    if r.returncode != 0:
        return {"rc": r.returncode, "error": r.stderr.strip().splitlines()[-3:]}
    out = json.loads(r.stdout.strip().splitlines()[-1])
    for v in out.values():
        if isinstance(v, dict):
            for k in list(v):
                if isinstance(v[k], float):
                    v[k] = round(v[k], 3)
    return out


def _proc_status(pid: int) -> dict:
    out = {}
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            k, _, v = line.partition(":")
            if k in ("VmRSS", "VmHWM"):
                out[k] = int(v.split()[0]) * 1024
    except OSError:
        pass
    return out


def _cpu(pid: int) -> tuple[float, float]:
    """(own user+sys, reaped children's user+sys) seconds of a process, from /proc/PID/stat."""
    stat = Path(f"/proc/{pid}/stat").read_text()
    f = stat[stat.rindex(")") + 2 :].split()
    hz = os.sysconf("SC_CLK_TCK")
    return (int(f[11]) + int(f[12])) / hz, (int(f[13]) + int(f[14])) / hz


def _lp_rows(d: Path, measurement: str) -> list[tuple[dict, dict, int]]:
    out = []
    for p in sorted(d.glob("*.lp")):
        for line in p.read_text().splitlines():
            if not line.startswith(measurement + ","):
                continue
            head, fields, t = line.rsplit(" ", 2) if line.count(" ") >= 2 else (line, "", "0")
            tags = dict(kv.split("=", 1) for kv in head.split(",")[1:] if "=" in kv)
            fv = {}
            for kv in re.split(r",(?=[a-z_]+=)", fields):
                k, _, v = kv.partition("=")
                v = v.rstrip("i")
                try:
                    fv[k] = float(v)
                except ValueError:
                    fv[k] = v.strip('"')
            out.append((tags, fv, int(t)))
    return out


@stage
def daemon(backend: str, seconds: float, canary: bool, nv: Nvml, interval: str = "30s") -> dict:
    n_gpus = nv.count
    tmp = Path(tempfile.mkdtemp(prefix="gpucheck-agent-"))
    out_dir = tmp / "out"
    collectors = '["gpu", "host", "canary"]' if canary else '["gpu", "host"]'
    conf = (
        f'[agent]\ninterval = "1s"\ncollectors = {collectors}\nexporters = ["file"]\nbackend = "{backend}"\n'
        f'host = "gpucheck"\n[file]\ndir = "{out_dir}"\ncompress = false\n'
    )
    if canary:
        engine = "numpy" if backend == "sim" else "auto"
        conf += (
            f'[canary]\nengine = "{engine}"\ninterval = "{interval}"\nstate_dir = "{tmp}/state"\n'
            f'drop_dir = "{tmp}/drop"\nparallel = {max(1, n_gpus)}\nstatus_every = "10s"\n'
            f"standin = {'true' if backend == 'sim' else 'false'}\nduty = 1.0\n"
        )
    (tmp / "agent.toml").write_text(conf)
    log = open(tmp / "agent.log", "wb")
    t_launch = time.time()
    p = subprocess.Popen(
        gpufleet("agent", "run", "--config", str(tmp / "agent.toml")),
        stdout=log,
        stderr=subprocess.STDOUT,
        env=env(),
        cwd=ROOT,
        start_new_session=True,
    )
    res: dict = {"seconds": seconds}
    try:
        time.sleep(3.0)  # start-up (imports, NVML init) is not a tick's cost
        if p.poll() is not None:
            raise RuntimeError(f"agent exited {p.returncode}: {(tmp / 'agent.log').read_text()[-500:]}")
        own0, kids0 = _cpu(p.pid)
        t0 = time.monotonic()
        rss_max = 0
        agent_on_gpu = others_on_gpu = 0  # seconds the agent's own pid / another pid held a context
        while time.monotonic() - t0 < seconds - 3.0:
            time.sleep(1.0)
            rss_max = max(rss_max, _proc_status(p.pid).get("VmRSS", 0))
            for pid in nv.compute_pids():
                if pid == p.pid:
                    agent_on_gpu += 1
                else:
                    others_on_gpu += 1
        own1, kids1 = _cpu(p.pid)
        st = _proc_status(p.pid)
        dt = time.monotonic() - t0
        res.update(
            ticks=round(dt),
            cpu_ms_per_tick=round((own1 - own0) / dt * 1e3, 2),
            cpu_share_of_one_core=round((own1 - own0) / dt, 4),
            children_cpu_s=round(kids1 - kids0, 2),
            rss_mb=round(st.get("VmRSS", 0) / 2**20, 1),
            rss_max_sampled_mb=round(rss_max / 2**20, 1),
            rss_peak_mb=round(st.get("VmHWM", 0) / 2**20, 1),
            agent_pid_on_gpu_s=agent_on_gpu,
            other_pids_on_gpu_s=others_on_gpu,
        )
    finally:
        if p.poll() is None:
            p.send_signal(signal.SIGTERM)
            try:
                p.wait(30)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()
        log.close()
    t_stop = time.time()
    res["exit_code"] = p.returncode
    gpu = _lp_rows(out_dir, "gpu")
    res["gpu_rows"] = len(gpu)
    if canary:
        rows = _lp_rows(out_dir, "gpu_canary")
        status = _lp_rows(out_dir, "gpufleet_canary")
        first = min((t for _, _, t in gpu), default=int(t_launch * 1e9)) / 1e9
        step = float(interval.rstrip("s"))
        margin = 15.0  # a check due later than this before the stop could not finish
        scheduled = int((t_stop - margin - first) // step) + 1 if t_stop - margin > first else 0
        per_gpu = {}
        for tags, f, _t in rows:
            g = per_gpu.setdefault(
                tags.get("gpu", "?"), {"ran": 0, "passed": 0, "wall_s": [], "startup_s": []}
            )
            g["ran"] += 1
            g["passed"] += int(f.get("passed") == 1)
            g["wall_s"].append(round(f.get("duration_seconds", 0) + f.get("startup_seconds", 0), 3))
            g["startup_s"].append(round(f.get("startup_seconds", 0), 3))
        errors = {tags.get("gpu", ""): f.get("errors_total") for tags, f, _ in status if "errors_total" in f}
        busy = {
            tags.get("gpu", ""): f.get("busy_skips_total") for tags, f, _ in status if "busy_skips_total" in f
        }
        res["canary"] = {
            "interval_s": step,
            "scheduled_per_gpu": scheduled,
            "per_gpu": per_gpu,
            "errors_total": errors,
            "busy_skips_total": busy,
            "n_of_n": len(per_gpu) == n_gpus and all(g["ran"] >= scheduled for g in per_gpu.values()),
        }
    res["log_tail"] = (tmp / "agent.log").read_text(errors="replace").strip().splitlines()[-5:]
    return res


@stage
def idle_after_check(nv: Nvml, backend: str) -> dict:
    before = nv.window(0, 5.0)
    tmp = tempfile.mkdtemp(prefix="gpucheck-canary-")
    args = [
        "canary",
        "--gpu",
        "0" if backend != "sim" else "all",
        "--json",
        "--state-dir",
        tmp,
        "--source",
        "gpu_check",
    ]
    if backend == "sim":
        args += ["--engine", "numpy", "--backend", "sim"]
    t0 = time.monotonic()
    r = subprocess.run(gpufleet(*args), capture_output=True, text=True, env=env(), timeout=300, cwd=ROOT)
    wall = time.monotonic() - t0
    t_end = time.monotonic()
    during_after = nv.window(0, 2.0)  # 0-2 s after the check's process exited
    time.sleep(max(0.0, 10.0 - (time.monotonic() - t_end)))
    after = nv.window(0, 3.0)  # from 10 s after
    res = {
        "before": before,
        "first_2s_after": during_after,
        "after_10s": after,
        "cli_rc": r.returncode,
        "cli_wall_s": round(wall, 3),
    }
    try:
        doc = json.loads(r.stdout)
        c = doc["results"][0]
        res["check"] = {
            "passed": c["fields"].get("passed"),
            "engine": c.get("engine"),
            "key": c.get("key"),
            "child_wall_s": round(c["wall_s"], 3),
            "startup_s": round(c["fields"]["startup_seconds"], 3),
            "check_s": round(c["fields"]["duration_seconds"], 3),
            "timing": {k: round(v, 3) for k, v in (c.get("timing") or {}).items()},
        }
    except (ValueError, KeyError, IndexError, TypeError):
        res["cli_output"] = (r.stdout + r.stderr).strip().splitlines()[-5:]
    # the comparison means something only on a GPU nobody else was using
    res["idle_before"] = (before.get("max_procs") or 0) == 0 and (before.get("util") or 0) <= 5
    if before["power_w"] is not None and after["power_w"] is not None:
        res["power_delta_w"] = round(after["power_w"] - before["power_w"], 2)
        res["power_within_5w"] = abs(res["power_delta_w"]) <= 5.0
    if before["sm_mhz"] is not None and after["sm_mhz"] is not None:
        res["sm_clock_back_to_idle"] = after["sm_mhz"] <= before["sm_mhz"] + 1
    return res


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--backend", default="nvml", choices=("nvml", "sim"))
    ap.add_argument(
        "--window",
        type=float,
        default=float(os.environ.get("GPUCHECK_WINDOW", 180)),
        help="seconds of the daemon-with-canary run (checks every 30 s)",
    )
    ap.add_argument("--plain", type=float, default=20.0, help="seconds of the daemon-without-canary run")
    a = ap.parse_args()
    res: dict = {
        "check": "gpufleet gpu_check",
        "backend": a.backend,
        "host": platform.node(),
        "python": platform.python_version(),
        "started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }
    for mod in ("torch", "cupy"):  # looked up, never imported here
        import importlib.util

        res[f"has_{mod}"] = importlib.util.find_spec(mod) is not None
    try:
        nv = Nvml(a.backend)
        res["nvml"] = nv.info()
    except Exception as exc:  # noqa: BLE001 - no driver / no GPU: say so, in the one JSON
        res["ok"] = False
        res["error"] = (
            f"no NVML here ({type(exc).__name__}: {exc}); run on a machine with an NVIDIA GPU "
            "(or --backend sim to check the plumbing)"
        )
        return emit(res, 1)
    res["agent_once"] = agent_once(a.backend, nv.count)
    res["poll_cost"] = poll_cost(a.backend)
    res["daemon_plain"] = daemon(a.backend, a.plain, False, nv)
    res["idle_after_check"] = idle_after_check(nv, a.backend)
    res["daemon_canary"] = daemon(a.backend, a.window, True, nv)
    dc = res["daemon_canary"]
    res["summary"] = {
        "agent_once_valid": res["agent_once"].get("valid"),
        "agent_rss_mb_with_canary": dc.get("rss_peak_mb"),
        "agent_rss_mb_without_canary": res["daemon_plain"].get("rss_peak_mb"),
        "agent_rss_with_canary_le_60mb": (dc.get("rss_peak_mb") or 1e9) <= 60,
        "agent_never_on_gpu": dc.get("agent_pid_on_gpu_s") == 0,
        "gpu_idle_before_check": res["idle_after_check"].get("idle_before"),
        "idle_power_within_5w_10s_after_check": res["idle_after_check"].get("power_within_5w"),
        "sm_clock_back_to_idle": res["idle_after_check"].get("sm_clock_back_to_idle"),
        "canary_n_of_n": (dc.get("canary") or {}).get("n_of_n"),
    }
    res["ok"] = not any("error" in v for v in res.values() if isinstance(v, dict))
    return emit(res, 0 if res["ok"] else 1)


def emit(res: dict, rc: int) -> int:
    res["total_seconds"] = round(time.monotonic() - T_START, 1)
    text = json.dumps(res, indent=1, default=str)
    print(text)
    if os.environ.get("OUT"):
        try:
            Path(os.environ["OUT"]).mkdir(parents=True, exist_ok=True)
            (Path(os.environ["OUT"]) / "gpu_check.json").write_text(text + "\n")
        except OSError as exc:
            print(f"gpu_check: cannot write $OUT: {exc}", file=sys.stderr)
    return rc


if __name__ == "__main__":
    sys.exit(main())
