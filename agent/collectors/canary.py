"""Silent-data-corruption canary: a known-answer test per GPU (``gpu_canary`` rows), run out of
the agent's process, on a schedule that bounds how long any GPU goes unchecked.

**Out of process.** Each check is a short-lived child process (:mod:`gpufleet.agent.canary_child`:
its deadline, memory bound and answer); this module never imports torch, cupy or any CUDA
library. A child that hangs, crashes, is killed or finds no engine is one log line and a count
in ``gpufleet_canary.errors_total``; the loop goes on. The agent does not wait for a child:
``collect`` starts it and a later tick reads its answer (``wait`` > 0: wait that long).

**Comparisons.** The result is compared bit for bit with this GPU's first answer (the child keeps
it in ``state_dir``; ``mismatches`` = elements that differ) and, when the fleet has one, with the
fleet reference digest for the same model, driver, engine, dtype, size and seed (``reference``:
JSON file or http(s) URL mapping key -> sha256; ``reference_match``). ``passed`` is 1 only when
every comparison agrees and the memory pattern read back intact (``memory_mismatches``).

**Confirmation.** A check that fails against the GPU's own answer or the memory pattern starts a
round: the same GPU is rechecked at once, up to ``confirm`` more times; the round is ONE row
(the first failing check's fields) with ``checks`` and ``checks_failed``. A digest that differs
only from the fleet reference is deterministic (driver/engine mismatch): it is not rechecked.

**Policy.** Each GPU is due every ``interval`` (from the previous due time), checked only when
NVML shows it idle: no compute process other than the agent's own pid and children, utilization
<= ``idle_util``, for ``idle_for`` seconds; a busy GPU is looked at again after ``busy_backoff``.
On a busy fleet the idle windows come at job boundaries: ``gpufleet canary`` run by a Slurm
Epilog/Prolog (packaging/slurm) or a Kubernetes hook writes its result into ``drop_dir``
(:mod:`gpufleet.agent.canary_drop`), and the agent turns each file into a ``gpu_canary`` row
like its own, counted for its GPU. ``max_age`` is the bound every GPU must be checked within
(by either path): ``gpufleet_canary`` rows (every ``status_every`` seconds) say when each GPU
was last checked and set ``overdue`` beyond it; the analyzer warns at twice ``max_age``.
``busy_size`` > 0 runs a check of that size on a busy GPU within the duty-cycle budget ``duty``
(off by default: a check needs device memory and a context).

Verdict engines (``backend.canary_engine()``, a simulated node's) answer in process (they touch
no device); ``standin`` runs each NVML GPU's check on the CPU engine (simulated fleets, tests).

Fault injection (tests, drills): :meth:`CanaryCollector.inject_bitflips` flips bits in the output
of the next check, after the GEMM and before the comparison.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import shutil
import tempfile
import time
import urllib.request
import weakref
from dataclasses import dataclass, field
from pathlib import Path

from gpufleet.agent.canary_child import (
    CHILD_ENGINES,
    NO_ENGINE_HINT,
    Child,
    canary_engines,
    foreign_processes,
    worker_argv,
    worker_env,
)
from gpufleet.agent.canary_drop import FIELD_TYPES, DropDir
from gpufleet.agent.canary_worker import reference_key
from gpufleet.agent.model import STATE_DIR, Node, Sample, register

from gpufleet.errors import ConfigError
from gpufleet.options import Option
from gpufleet.units import format_duration

log = logging.getLogger(__name__)

LOST = "GPU lost"
_GPU_IS_LOST = 15  # NVML_ERROR_GPU_IS_LOST


def backend_engine(backend, name: str):
    """The NVML backend's own canary engine (``backend.canary_engine()``, e.g. a simulated node's),
    for ``engine = "auto"`` or ``"backend"``; None when it has none (``"backend"``: an error)."""
    if name not in ("auto", "backend"):
        return None
    maker = getattr(backend, "canary_engine", None) if backend is not None else None
    eng = maker() if callable(maker) else None
    if eng is None and name == "backend":
        raise ConfigError("canary.engine: backend: the NVML backend has no canary engine")
    return eng


def load_reference(where: str, timeout: float = 5.0) -> dict[str, str]:
    """Fleet reference digests: JSON ``{"references": {key: sha256}}`` (or the bare mapping)."""
    if not where:
        return {}
    try:
        if where.startswith(("http://", "https://")):
            with urllib.request.urlopen(where, timeout=timeout) as r:  # noqa: S310 - operator's URL
                doc = json.loads(r.read())
        else:
            doc = json.loads(Path(where).read_text())
    except (OSError, ValueError) as exc:
        raise ConfigError(f"canary.reference: cannot load {where}: {exc}") from None
    refs = doc.get("references", doc) if isinstance(doc, dict) else None
    if not isinstance(refs, dict):
        raise ConfigError(f"canary.reference: {where} is not a JSON object of key -> digest")
    return {str(k): str(v) for k, v in refs.items()}


# ---------------------------------------------------------------------------------- collector
@dataclass
class _Gpu:
    label: str
    index: int | None = None
    uuid: str | None = None
    model: str | None = None
    handle: object = None
    vdev: dict | None = None  # the verdict engine's device
    next_due: float = 0.0  # when the next scheduled check is due (0: at once)
    idle_since: float | None = None
    child: Child | None = None
    round: list = field(default_factory=list)  # results of the current confirmation round
    round_t: int = 0  # ns: when the round's first check started
    round_busy: str | None = None
    last_check: float | None = None  # seconds: when the last completed round ended
    checks: int = 0
    failed: int = 0
    errors: int = 0
    skips: int = 0
    logged: str = ""

    def tags(self) -> dict:
        t = {"gpu": self.label}
        if self.uuid:
            t["uuid"] = self.uuid
        if self.model:
            t["model"] = self.model
        return t


@register("canary")
class CanaryCollector:
    """Known-answer GEMM + memory check per GPU in a child process, on an idle GPU, bounded age."""

    needs_nvml = True
    measurements = ("gpu_canary", "gpufleet_canary")
    options = (  # the [canary] section (docs/sources.md)
        Option("engine", "choice", "auto", "auto: the backend's own > torch (CUDA) > cupy, in a child "
               "process > numpy (CPU) without NVML GPUs",
               choices=("auto", "backend", "torch", "cupy", "numpy")),
        Option("interval", "duration", 3600.0, "between checks of one GPU (from the previous due time)",
               1.0, 30 * 86400.0),
        Option("max_age", "duration", 21600.0, "the bound: every GPU checked within it (idle windows or "
               "job-boundary hooks); gpufleet_canary.overdue past it, the analyzer warns at twice it",
               60.0, 365 * 86400.0),
        Option("size", "int", 0, "GEMM size; 0: 4096 on a GPU, 256 on the CPU; else 16 .. 32768", 0, 32768),
        Option("dtype", "choice", "", "\"\": bfloat16 with torch, float32 otherwise",
               choices=("", "float32", "float16", "bfloat16")),
        Option("seed", "int", 20261126, "the known answer's seed (part of the reference key)", 0, 2**63 - 1),
        Option("memory_bytes", "size", 0, "memory pattern check; 0: 256 MiB on a GPU, 8 MiB on the CPU",
               0, 2**40),
        Option("idle_util", "float", 5.0, "% utilization at or below which a GPU counts as idle", 0.0, 100.0),
        Option("busy_size", "int", 0, ">0: on a busy GPU run a check of this size (16 .. 32768) instead of "
               "skipping", 0, 32768),
        Option("duty", "float", 0.001, "share of wall time all checks together may take", 1e-9, 1.0),
        Option("busy_backoff", "duration", 60.0, "before a GPU found busy is looked at again",
               0.0, 30 * 86400.0),
        Option("idle_for", "duration", 0.0, "a GPU must have been seen idle this long before a check",
               0.0, 86400.0),
        Option("confirm", "int", 2, "rechecks, at once, after a check fails on this GPU's own answer", 0, 10),
        Option("timeout", "duration", 120.0, "a check's child process is killed past this (reported, not "
               "waited on)", 1.0, 3600.0),
        Option("max_rss", "size", 4 << 30, "the child is killed past this resident memory", 0, 2**44),
        Option("parallel", "int", 1, "children at once on the node", 1, 64),
        Option("drop_dir", "path", f"{STATE_DIR}/canary-drop", "results of job-boundary checks "
               "(gpufleet canary in Slurm hooks) picked up at every tick"),
        Option("status_every", "duration", 60.0, "between gpufleet_canary rows", 1.0, 86400.0),
        Option("reference", "str", "", "fleet reference digests: a JSON file or an http(s) URL"),
        Option("reference_refresh", "duration", 3600.0, "how often the reference is read again",
               1.0, 30 * 86400.0),
        Option("state_dir", "path", f"{STATE_DIR}/canary", "first answers kept across restarts"),
        Option("standin", "bool", False, "run each NVML GPU's check on the CPU engine (simulated fleets, "
               "tests)"),
        Option("python", "path", "", "the interpreter that runs each check: one with torch or cupy, "
               "e.g. /opt/gpufleet-canary/bin/python (docs/sources.md); \"\" = gpufleet's own"),
    )

    @classmethod
    def describe(cls, table: dict, node: Node) -> tuple[str, str]:
        hooks = f"results of job-boundary checks (Slurm Epilog/Prolog hooks) from {table['drop_dir']}"
        engine = table["engine"]
        if engine == "numpy":
            own = f"its own check on the CPU (numpy) every {format_duration(table['interval'])}"
        elif not node.gpus:
            own = "no checks of its own (no NVML GPU here)"
        elif engine == "backend":
            own = f"its own checks of {node.gpus} GPU(s) by the backend's engine"
        else:
            wanted = [e for e in canary_engines(table["python"]) if engine in ("auto", e)]
            if wanted:
                own = (f"its own checks of {node.gpus} idle GPU(s) every "
                       f"{format_duration(table['interval'])} with {wanted[0]}")
            else:
                need = "torch or cupy" if engine == "auto" else engine
                py = table["python"] or "gpufleet's interpreter"
                own = (f"no checks of its own: no CUDA engine ({need}) in {py} "
                       "(set canary.python, docs/sources.md)")
        return "on", f"{hooks}; {own}"

    @classmethod
    def slowest_rows(cls, table: dict) -> float | None:
        return float(table["status_every"])

    @staticmethod
    def check_options(table: dict) -> None:
        """What one key's range cannot say (the agent config calls this)."""
        for key in ("size", "busy_size"):
            if 0 < table[key] < 16:
                raise ConfigError(f"config key 'canary.{key}': {table[key]} is outside 16..32768 "
                                  "(0: the default)")

    def __init__(self, backend=None, engine: str = "auto", size: int = 0, dtype: str = "",
                 seed: int = 20261126, memory_bytes: int = 0, interval: float = 3600.0,
                 max_age: float = 21600.0, duty: float = 0.001, idle_util: float = 5.0,
                 idle_for: float = 0.0, busy_size: int = 0, busy_backoff: float = 60.0,
                 confirm: int = 2, timeout: float = 120.0, max_rss: int = 4 << 30, parallel: int = 1,
                 drop_dir: str = "", status_every: float = 60.0, reference: str = "",
                 reference_refresh: float = 3600.0, state_dir: str = "", standin: bool = False,
                 wait: float = 0.0, python: str = "", clock=None):
        self.verdict = backend_engine(backend, engine)
        if self.verdict is None and engine not in CHILD_ENGINES:
            raise ConfigError(f"canary.engine: {engine!r} is not auto, backend, torch, cupy or numpy")
        self.backend = backend
        self.standin = bool(standin)
        self.python = str(python or "")
        if self.python and not (os.path.isfile(self.python) and os.access(self.python, os.X_OK)):
            raise ConfigError(f"canary.python: {self.python} is not an executable file")
        if not 0 < duty <= 1:
            raise ConfigError(f"canary.duty: {duty} is outside (0, 1]")
        for k, v in (("confirm", confirm), ("parallel", parallel)):
            if int(v) < (0 if k == "confirm" else 1):
                raise ConfigError(f"canary.{k}: {v} is too small")
        self.seed, self.interval, self.max_age = int(seed), float(interval), float(max_age)
        self.duty = float(duty)
        self.idle_util, self.idle_for, self.busy_size = float(idle_util), float(idle_for), int(busy_size)
        self.busy_backoff, self.confirm, self.parallel = float(busy_backoff), int(confirm), int(parallel)
        self.timeout, self.max_rss, self.wait = float(timeout), int(max_rss), float(wait)
        self.status_every = float(status_every)
        self._clock = clock
        self._tick = time.time()
        self._t0: float | None = clock() if clock is not None else None
        self._spent = 0.0
        self._cost: dict[int, float] = {}
        self._inject: tuple[int, int] | None = None
        self._status_at = -float("inf")
        self._backlog: list[Sample] = []  # gpu_canary rows waiting for their tick
        self.reference_src, self.reference_refresh = reference, float(reference_refresh)
        self._refs = load_reference(reference)
        self._refs_at = self._now
        self.drop = DropDir(drop_dir, log) if drop_dir else None
        self._tmp_state: str | None = None
        self.state_dir = self._state_dir(state_dir)
        gpus, self.devices_source = self._devices(engine)
        # the engine a child runs: the CPU for "numpy", stand-ins and machines without NVML GPUs
        self.child_engine = "numpy" if self.devices_source in ("cpu", "standin") else engine
        self.cpu_only = self.child_engine == "numpy"
        if self.verdict is not None:
            self.engine_name = self.verdict.name
        else:
            self.engine_name = self.child_engine
        gpu = not self.cpu_only and self.verdict is None
        self.size = int(size) or (4096 if gpu else 256)
        self.dtype = dtype or ("" if gpu else "float32")
        if self.cpu_only and self.verdict is None and self.dtype != "float32":
            raise ConfigError(f"canary.dtype: the numpy engine runs float32, not {self.dtype}")
        if not 16 <= self.size <= 32768:
            raise ConfigError(f"canary.size: {self.size} is outside 16..32768")
        self.memory_bytes = int(memory_bytes) or ((256 << 20) if gpu else (8 << 20))
        self.driver = self._driver()
        self.gpus = gpus
        self.skipped: dict[str, str] = {}  # label -> why the last attempt did not run

    # ------------------------------------------------------------------------ set-up
    def _state_dir(self, state_dir: str) -> str:
        if state_dir:
            try:
                Path(state_dir).mkdir(parents=True, exist_ok=True)
                return state_dir
            except OSError as exc:  # e.g. the packaged default outside the unit, unprivileged
                log.warning("canary.state_dir %s: %s; first answers kept for this run only", state_dir,
                            exc.strerror or exc)
        self._tmp_state = tempfile.mkdtemp(prefix="gpufleet-canary-")
        weakref.finalize(self, shutil.rmtree, self._tmp_state, True)  # also when never closed
        return self._tmp_state

    def _driver(self) -> str:
        if self.backend is not None and not self.cpu_only:
            try:
                v = self.backend.nvmlSystemGetDriverVersion()
                return v.decode() if isinstance(v, bytes) else str(v)
            except Exception:  # noqa: BLE001 - unknown driver: the key says so
                pass
        return "none" if self.cpu_only else "unknown"

    def _nvml_gpus(self) -> list[_Gpu]:
        b = self.backend
        out = []
        for i in range(int(b.nvmlDeviceGetCount())):
            h = b.nvmlDeviceGetHandleByIndex(i)
            g = _Gpu(label=str(i), index=i, handle=h)
            for k, fn in (("uuid", "nvmlDeviceGetUUID"), ("model", "nvmlDeviceGetName")):
                try:
                    v = getattr(b, fn)(h)
                    setattr(g, k, v.decode() if isinstance(v, bytes) else str(v))
                except Exception:  # noqa: BLE001 - absent, not fatal
                    pass
            out.append(g)
        return out

    def _devices(self, engine: str) -> tuple[list[_Gpu], str]:
        nvml: list[_Gpu] = []
        if self.backend is not None and (engine != "numpy" or self.standin or self.verdict is not None):
            try:
                nvml = self._nvml_gpus()
            except Exception as exc:  # noqa: BLE001 - NVML unavailable: no GPUs to gate or name
                log.info("canary: NVML gives no GPUs (%s)", exc)
        if self.verdict is not None:
            by_index = {g.index: g for g in nvml}
            out = []
            for d in self.verdict.devices():
                g = by_index.get(d.get("index")) or _Gpu(label=str(d.get("label", d.get("index"))))
                g.vdev = d
                g.model = g.model or d.get("model")
                out.append(g)
            return out, "verdict"
        if self.standin and nvml:
            return nvml, "standin"
        if engine == "numpy" or not nvml:
            if engine != "numpy":  # a GPU check or none: the CPU is checked only when asked for
                log.info("canary: engine %s, but NVML shows no GPU: no checks of its own", engine)
                return [], "none"
            import platform

            return [_Gpu(label="cpu", model=platform.processor() or platform.machine())], "cpu"
        return nvml, "nvml"

    @property
    def devices(self) -> list[dict]:
        """The devices checked (label, index, uuid, model)."""
        return [{"label": g.label, "index": g.index, "uuid": g.uuid, "model": g.model} for g in self.gpus]

    @property
    def _now(self) -> float:
        return self._clock() if self._clock is not None else self._tick

    def inject_bitflips(self, count: int = 1, bit: int = 3) -> None:
        """Flip ``bit`` in ``count`` output elements of the next check (fault injection)."""
        self._inject = (int(count), int(bit))

    # --------------------------------------------------------------------------- gating
    def _busy(self, g: _Gpu) -> str | None:
        if g.handle is None or self.backend is None:
            return None
        b, h = self.backend, g.handle
        try:
            procs = b.nvmlDeviceGetComputeRunningProcesses(h) or []
            own = {c.pid for c in (x.child for x in self.gpus) if c is not None}
            others = foreign_processes(procs, own)
            if others:
                return f"{len(others)} compute process(es)"
        except Exception as exc:  # noqa: BLE001 - unknown: judge by utilization alone
            if getattr(exc, "value", None) == _GPU_IS_LOST:
                return LOST
        try:
            util = b.nvmlDeviceGetUtilizationRates(h).gpu
            if util > self.idle_util:
                return f"utilization {util}%"
        except Exception as exc:  # noqa: BLE001 - unknown utilization: do not assume idle
            if getattr(exc, "value", None) == _GPU_IS_LOST:
                return LOST
            return "utilization unknown"
        return None

    # ---------------------------------------------------------------------------- checks
    def _start(self, g: _Gpu, size: int, now_ns: int) -> dict | None:
        """Start one check on ``g``: a child (returns None) or a verdict (returns its result)."""
        inject, self._inject = self._inject, None
        if self.verdict is not None:
            t0 = time.perf_counter()
            fields = dict(self.verdict.check(g.vdev, size, now_ns))
            if inject is not None:
                fields["mismatches"] = int(fields.get("mismatches") or 0) + inject[0]
                fields["passed"] = 0
                flipped = f"{fields.get('digest')}:flipped{inject[0]}".encode()
                fields["digest"] = hashlib.sha256(flipped).hexdigest()
            key = reference_key(g.model or "unknown", self.driver, self.verdict.version, self.dtype, size,
                                self.seed)
            return {"ok": True, "verdict": True, "key": key, "size": size, **fields,
                    "wall_s": time.perf_counter() - t0}
        argv = worker_argv(self.child_engine, size, self.dtype, self.seed,
                           self.memory_bytes if size == self.size else 0, self.state_dir, g.label,
                           self.driver, inject, self.python)
        g.child = Child(argv, worker_env(g.uuid, g.index, self.cpu_only), self.timeout, self.max_rss,
                        self.cpu_only)
        return None

    def _fields(self, res: dict) -> dict:
        """gpu_canary fields of one successful check (a child's or a verdict engine's answer)."""
        f: dict[str, object] = {}
        for k in ("digest", "mismatches", "memory_mismatches", "duration_seconds", "passed"):
            if res.get(k) is not None:
                f[k] = FIELD_TYPES[k](res[k])
        if not res.get("verdict"):
            work = float(res.get("duration_seconds", 0.0))
            f["startup_seconds"] = max(0.0, float(res.get("wall_s", 0.0)) - work)
            f["passed"] = int(f.get("mismatches", 1) == 0 and f.get("memory_mismatches", 0) == 0)
        ref = self._reference(res.get("key", ""))
        if ref is not None and "digest" in f:
            f["reference_match"] = int(ref == f["digest"])
            f["passed"] = int(bool(f["passed"]) and ref == f["digest"])
        return f

    def _reference(self, key: str) -> str | None:
        now = self._now
        if self.reference_src and now - self._refs_at > self.reference_refresh:
            try:
                self._refs = load_reference(self.reference_src)
            except ConfigError:
                pass  # keep the last good set
            self._refs_at = now
        return self._refs.get(key)

    def _error(self, g: _Gpu, res: dict) -> None:
        g.errors += 1
        why = " ".join(str(res.get("error") or res.get("reason") or "failed").split())[:300]
        if res.get("reason") == "no_engine":
            why += f"; {NO_ENGINE_HINT}"
        self.skipped[g.label] = f"check failed: {why}"
        if g.logged != res.get("reason"):
            g.logged = str(res.get("reason"))
            log.warning("canary gpu %s: %s", g.label, why)
        # no engine here: try again at the next interval; a crash or a kill: after the backoff
        g.next_due = self._now + (self.interval if res.get("reason") == "no_engine" else self.busy_backoff)
        g.round = []

    def _finish(self, g: _Gpu, res: dict, now_ns: int) -> list[Sample]:
        """Take one check's answer; returns the round's row when the round is complete."""
        if not res.get("ok"):
            done = g.round  # a recheck that gave no answer ends its round with what it has
            self._error(g, res)
            if not done:
                return []
            g.round = done
        else:
            g.logged = ""
            fields = self._fields(res)
            self._spent += float(fields.get("duration_seconds", 0.0))
            self._cost[int(res.get("size", self.size))] = float(fields.get("duration_seconds", 0.0))
            g.round.append((fields, res))
            own_fail = fields.get("mismatches", 0) != 0 or fields.get("memory_mismatches", 0) != 0
            if own_fail and len(g.round) <= self.confirm:
                return []  # a round in progress: the GPU is rechecked at once (see _due)
        rows = [f for f, _ in g.round]
        failed = [f for f in rows if not f.get("passed", 1)]
        out = dict(failed[0] if failed else rows[-1])
        out["checks"], out["checks_failed"] = len(rows), len(failed)
        first_res = g.round[0][1]
        g.checks += len(rows)
        g.failed += len(failed)
        g.last_check = self._now
        if res.get("ok"):
            self.skipped.pop(g.label, None)
        sample = Sample("gpu_canary", g.tags(), out, g.round_t,
                        extra={"size": int(first_res.get("size", self.size)),
                               "engine": first_res.get("engine", self.engine_name),
                               "key": first_res.get("key"), "busy": g.round_busy,
                               "timing": first_res.get("timing"), "wall_s": first_res.get("wall_s")})
        g.round = []
        return [sample]

    def _reap(self, now_ns: int, wait: float = 0.0) -> list[Sample]:
        out = []
        end = time.monotonic() + wait
        for g in self.gpus:
            if g.child is None:
                continue
            res = g.child.wait(max(0.0, end - time.monotonic())) if wait else g.child.poll()
            if res is None:
                continue
            g.child = None
            out += self._finish(g, res, now_ns)
        return out

    def _due(self, g: _Gpu, now: float, now_ns: int) -> tuple[bool, int]:
        """(start a check now, its size); records why not in ``skipped``."""
        if g.round:  # a confirmation round goes on at once, whatever the gating
            return True, int(g.round[0][1].get("size", self.size))
        if now < g.next_due:
            return False, 0
        busy = self._busy(g)
        if busy == LOST:
            self.skipped[g.label] = busy
            g.next_due, g.idle_since = now + self.busy_backoff, None
            return False, 0
        size = self.size
        if busy:
            g.idle_since = None
            if not self.busy_size:
                self.skipped[g.label] = f"busy: {busy}"
                g.skips += 1
                g.next_due = now + self.busy_backoff
                return False, 0
            size = self.busy_size
        else:
            if g.idle_since is None:
                g.idle_since = now
            if now - g.idle_since < self.idle_for:
                self.skipped[g.label] = f"idle for {now - g.idle_since:.0f} s of {self.idle_for:g} s"
                return False, 0
        # the duty share of the time since start (at least of one hour), minus what was spent,
        # must cover what a check of this size cost last time
        budget = self.duty * max(now - self._t0, 3600.0) - self._spent
        if budget <= self._cost.get(size, 0.0):
            self.skipped[g.label] = "duty-cycle budget spent"
            return False, 0
        g.round_busy = busy
        return True, size

    def collect(self, now_ns: int) -> list[Sample]:
        self._tick = now_ns / 1e9
        if self._t0 is None:
            self._t0 = self._refs_at = self._now
        out = self._reap(now_ns)
        out += self._pickup()
        # verdict engines and ``wait``: rounds complete within this call; children without
        # ``wait`` are started here and read at a later tick
        begun: set[str] = set()  # GPUs whose round began in this call: one round per call
        for _ in range((self.confirm + 1) * max(1, len(self.gpus)) + 1):
            progress = False
            for g in self.gpus:
                running = sum(1 for x in self.gpus if x.child is not None)
                if g.child is not None or running >= self.parallel or (g.label in begun and not g.round):
                    continue
                now = self._now
                go, size = self._due(g, now, now_ns)
                if not go:
                    continue
                if not g.round:
                    begun.add(g.label)
                    g.round_t = now_ns
                    # the schedule keeps its cadence: due again one interval after this one was due
                    base = g.next_due if 0 < g.next_due <= now < g.next_due + self.interval else now
                    step = self.busy_backoff if g.round_busy else self.interval
                    g.next_due = base + step
                try:
                    res = self._start(g, size, now_ns)
                except ConfigError:
                    raise
                except Exception as exc:  # noqa: BLE001 - one GPU's failed check never stops the others
                    res = {"ok": False, "reason": "failed", "error": f"{type(exc).__name__}: {exc}"}
                progress = True
                if res is not None:
                    out += self._finish(g, res, now_ns)
            if self.wait > 0 and any(g.child is not None for g in self.gpus):
                out += self._reap(now_ns, self.wait)
                progress = True
            if not progress or (self.wait <= 0 and self.verdict is None):
                break
        return self._one_per_gpu(out) + self._status(now_ns)

    def _one_per_gpu(self, rows: list[Sample]) -> list[Sample]:
        """At most one ``gpu_canary`` row per GPU per tick; the rest wait for the next ticks.

        The export pipeline keeps one value per instrument and attribute set per collection:
        two results for one GPU in one tick (a drop file beside the agent's own check, a Slurm
        prolog's and epilog's) would otherwise lose one."""
        self._backlog.extend(rows)
        out, later, seen = [], [], set()
        for s in self._backlog:
            g = s.tags.get("gpu")
            (later if g in seen else out).append(s)
            seen.add(g)
        self._backlog = later
        return out

    # ----------------------------------------------------------------------- self rows
    def _status(self, now_ns: int) -> list[Sample]:
        now = self._now
        if now - self._status_at < self.status_every:
            return []
        self._status_at = now
        out = []
        for g in self.gpus:
            f: dict[str, object] = {"max_age_seconds": self.max_age, "checks_total": g.checks,
                                    "failed_checks_total": g.failed, "errors_total": g.errors,
                                    "busy_skips_total": g.skips}
            since = g.last_check if g.last_check is not None else self._t0
            if g.last_check is not None:
                f["last_check_seconds"] = float(g.last_check)
                f["age_seconds"] = max(0.0, now - g.last_check)
            f["overdue"] = int(now - since > self.max_age)
            out.append(Sample("gpufleet_canary", g.tags(), f, now_ns))
        if self.drop is not None:
            out.append(Sample("gpufleet_canary", {}, {"drop_files_total": self.drop.files,
                                                      "drop_errors_total": self.drop.errors}, now_ns))
        return out

    # ---------------------------------------------------------------- the drop directory
    def _pickup(self) -> list[Sample]:
        """Results ``gpufleet canary`` (a Slurm epilog, a Kubernetes hook) left in ``drop_dir``,
        each counted as checks of its GPU (by uuid, else label) and given that GPU's tags."""
        if self.drop is None:
            return []
        rows = self.drop.take()
        by_label = {g.label: g for g in self.gpus}
        by_uuid = {g.uuid: g for g in self.gpus if g.uuid}
        for s in rows:
            g = by_uuid.get(s.tags.get("uuid")) or by_label.get(s.tags.get("gpu"))
            if g is not None:
                g.checks += int(s.fields.get("checks", 1))
                g.failed += int(s.fields.get("checks_failed", 1 - int(s.fields.get("passed", 1))))
                t = s.time_ns / 1e9
                g.last_check = t if g.last_check is None else max(g.last_check, t)
                s.tags = {**g.tags(), **s.tags}
        return rows

    def close(self) -> None:
        for g in self.gpus:
            if g.child is not None:
                g.child.kill("agent stopping")
                g.child = None
        if self._tmp_state:
            shutil.rmtree(self._tmp_state, ignore_errors=True)
            self._tmp_state = None

