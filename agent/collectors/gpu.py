"""The NVML GPU collector: measurements ``gpu`` (one wide row per GPU per poll) and ``gpu_nvlink``
(one row per NVLink link per poll), in catalogue units.

- **One query gate** (:meth:`GpuCollector._q`): every NVML call goes through it. NotSupported,
  NoPermission and FunctionNotFound mean "absent" (never 0): logged once per GPU and call, and
  remembered, so the call is not made again on that GPU. GpuIsLost marks the GPU lost; Unknown
  and Timeout mark it stale. Any other NVML error leaves the value out of this poll only.
- **The read plan comes from the catalogue** (:data:`PLAN`, built at import from
  ``gpufleet/catalogue.toml``): each entry of ``gpu`` and ``gpu_nvlink`` names its NVML call and
  arguments (``call``, ``args``, ``member``, ``count``), its field id (``field_id``: one
  ``nvmlDeviceGetFieldValues`` batch per tier), a flag of another field (``bit_of``, ``mask``) or
  a named reader (``read``: ``health``, ``processes``, ``mig_devices``, ``nvlink``, ``gpm``: code
  a call cannot say), and its tier. Entries sharing a call are one call. An entry the collector
  cannot read (an unknown constant, reader or tier) fails the import with one clear line.
- **Tiers**: the fast set is read every poll, the slow set (limits, thresholds, retired pages,
  remapped rows, processes and job, the PCIe error and perf-policy counters) every
  ``slow_interval_s`` and on the first poll; a slow field of a fast call (the memory size) is
  kept on slow polls only. The ``gpu_nvlink`` rows (tier ``nvlink``) are read on the first poll
  and then every ``nvlink_interval_s``. The slow field batch is costly (21 ids took 6.7 ms on an H200: more
  than the whole fast poll); the thermal margin call (~1-1.5 ms) is fast.
- **GPM** (GPU Performance Monitoring, Hopper and newer): SM, tensor and DRAM activity, PCIe and
  NVLink bandwidth, computed by ``nvmlGpmMetricsGet`` from this poll's sample and the previous
  poll's (at least ``GPM_MIN_INTERVAL_S`` apart; the first poll only takes a sample). Absent on a
  GPU that does not support it (never 0). One GPM call at a time per process (``_GPM_LOCK``);
  the two samples of a GPU are allocated once and reused, and freed on close or when the GPU is
  lost. On a GPU in MIG mode the device-level sample is what NVML gives for the whole GPU (where
  it answers NotSupported there, GPM is left out); per-instance rows are not read.
- **Per-GPU isolation**: each GPU is read by its own worker thread; a poll waits at most
  ``deadline_s`` in all. A GPU that misses the deadline is reported stale (``up=0``,
  ``health_code=1``), one that raises GpuIsLost lost (``health_code=2``); either is quarantined
  and retried after ``retry_s``, and never delays the other GPUs' rows.
- **No driver**: ``collect()`` raises :class:`gpufleet.agent.collectors.CollectorUnavailable` with a
  one-line reason (retried every ``retry_s``); the agent goes on with its other collectors.

Counters are reported cumulative, as NVML gives them; rollover and resets are handled downstream.
"""

from __future__ import annotations

import concurrent.futures as cf
import ctypes
import logging
import queue
import struct
import sys
import threading
import time
from typing import NamedTuple

import pynvml
from gpufleet.agent.collectors import CollectorUnavailable
from gpufleet.agent.jobs import TAG_KEYS, resolve_job
from gpufleet.agent.model import Node, Sample, register

from gpufleet import catalogue
from gpufleet.options import Option
from gpufleet.units import format_duration

log = logging.getLogger(__name__)

E = pynvml
ABSENT = {E.NVML_ERROR_NOT_SUPPORTED, E.NVML_ERROR_NO_PERMISSION, E.NVML_ERROR_FUNCTION_NOT_FOUND}
LOST = {E.NVML_ERROR_GPU_IS_LOST}
STALE = {E.NVML_ERROR_UNKNOWN, E.NVML_ERROR_TIMEOUT}
HEALTH = {"up": 0, "stale": 1, "lost": 2}


# -- the read plan, built from the catalogue ---------------------------------------------------
# Each entry of measurements gpu and gpu_nvlink says how it is read (gpufleet/catalogue.toml):
# ``call`` (+ ``args``, ``member``, ``count``), ``field_id`` (a field value of its tier's batch),
# ``bit_of`` + ``mask`` (a flag of another field), or ``read``: one of the named readers below,
# code that a call and its arguments cannot say.
POLL_READERS = ("health", "nvlink", "gpm")  # the poll itself: up/health_code, the link rows, GPM
ROW_READERS = ("processes", "mig_devices")  # GpuCollector._read_<name>(g, f, extra), in their tier


def _const(name: str, where: str) -> int:
    """A pynvml constant named in the catalogue."""
    value = getattr(E, name, None)
    if not isinstance(value, int):
        raise catalogue.CatalogueError(f"{where}: {name!r} is not an NVML constant of this nvidia-ml-py")
    return value


def _arg(name: str, where: str):
    return name if name == "link" else _const(name, where)


class _Call(NamedTuple):
    """One NVML call of the plan and the fields its answer gives."""

    key: str  # "nvmlDeviceGetClockInfo(NVML_CLOCK_SM)": the query gate's name for it
    fn: str
    args: tuple
    # (field, member (attribute, index or None), count, slow only, ((flag field, mask), ...))
    outs: tuple


_PLAIN = (None, False, False, ())  # an out that is the answer itself: no member, count, tier or flags


def _call_key(m) -> str:
    return f"{m.call}({', '.join(m.args)})"


def _plan(metrics) -> dict:
    """The collector's read plan for the gpu measurement, per tier, in catalogue order."""
    bits: dict[str, list] = {}
    for m in metrics:
        if m.reader == "bit":
            bits.setdefault(m.bit_of, []).append((m.field, int(m.mask)))
    calls: dict[str, dict] = {}  # call key -> {"fn", "args", "outs", "tiers"}
    plan = {t: {"fields": {}, "fallback": [], "readers": []} for t in ("fast", "slow")}
    for m in metrics:
        where = f"catalogue gpu.{m.field}"
        r = m.reader
        if m.tier not in plan:
            raise catalogue.CatalogueError(f"{where}: tier {m.tier!r} is not one the GPU collector reads")
        if r == "call":
            c = calls.setdefault(_call_key(m), {"fn": m.call, "args": tuple(_arg(a, where) for a in m.args),
                                                "outs": [], "tiers": set()})
            c["outs"].append((m.field, m.member, m.count, m.tier == "slow", tuple(bits.get(m.field, ()))))
            c["tiers"].add(m.tier)
        elif r == "field":
            fid = _const(m.field_id, where)
            plan[m.tier]["fields"][fid] = m.field
            if m.call:  # where the field value is not supported: the call
                plan[m.tier]["fallback"].append((fid, m.field, _call_key(m), m.call,
                                                 tuple(_arg(a, where) for a in m.args)))
        elif r in ROW_READERS:
            if r not in plan[m.tier]["readers"]:
                plan[m.tier]["readers"].append(r)
        elif r not in ("bit", *POLL_READERS):
            raise catalogue.CatalogueError(f"{where}: no reader {r!r} in the GPU collector")
    for key, c in calls.items():  # a call with a fast field is made every poll
        tier = "fast" if "fast" in c["tiers"] else "slow"
        plan[tier].setdefault("calls", []).append(_Call(key, c["fn"], c["args"], tuple(c["outs"])))
    for t in plan.values():
        t["calls"] = tuple(t.get("calls", ()))
    return plan


_GPU = catalogue.fields("gpu")
PLAN = _plan(_GPU)
# Batched field values per tier: NVML field id -> catalogue field. The fast batch (throttle time,
# memory temperature, instant power, energy) is cheap; the slow one (PCIe link errors,
# perf-policy time: 21 ids took 6.7 ms on an H200, more than the whole fast poll) is not.
# The PCIe byte counters (197/198) are not read: they are 32-bit and wrap every ~0.07 s at
# PCIe Gen5 x16 line rate, faster than any poll; GPM's PCIe rates replace them.
FIELD_IDS = PLAN["fast"]["fields"]
SLOW_FIELD_IDS = PLAN["slow"]["fields"]
# GPM: NVML metric id -> catalogue field (a share or a rate over the interval between two samples).
GPM_METRICS = {_const(m.gpm_metric, f"catalogue gpu.{m.field}"): m.field for m in _GPU if m.reader == "gpm"}
# NVLink rates only for a GPU with NVLink links (a GPU without answers 0, which is not a reading)
GPM_NEEDS_LINKS = frozenset(m.field for m in _GPU if m.reader == "gpm" and m.needs_nvlink)
GPM_MIN_INTERVAL_S = 0.1  # NVML's floor between the two samples of a metrics call
_GPM_LOCK = threading.Lock()  # one GPM call at a time in this process (concurrent calls are unsafe)
_GPM_IDS = tuple(GPM_METRICS)
MAX_LINKS = 18  # NVLink links per GPU up to Hopper; the first poll probes them
_LINK = {m.field: m for m in catalogue.fields("gpu_nvlink")}
for _m in _LINK.values():  # the link rows are read at their own cadence (nvlink_interval_s)
    if _m.tier != "nvlink" or _m.reader != "nvlink":
        raise catalogue.CatalogueError(f"catalogue gpu_nvlink.{_m.field}: the GPU collector reads it with "
                                       'read = "nvlink", tier = "nvlink"')
# NVLink error counters: catalogue field -> the nvmlDeviceGetNvLinkErrorCounter counter; their
# per-link field ids (``{link}`` in the catalogue's field_id; NVML defines them for links 0..11):
# one nvmlDeviceGetFieldValues call reads them all; links above 11, and any counter the batch
# answers NotSupported for, fall back to nvmlDeviceGetNvLinkErrorCounter.
NVLINK_COUNTERS = tuple((name, _const(m.args[1], f"catalogue gpu_nvlink.{name}"))
                        for name, m in _LINK.items() if "{link}" in m.field_id)
_COUNTER_ENUM = dict(NVLINK_COUNTERS)
NVLINK_COUNTER_FIELDS = {(name, link): getattr(E, _LINK[name].field_id.format(link=link))
                         for name, _ in NVLINK_COUNTERS
                         for link in range(MAX_LINKS) if hasattr(E, _LINK[name].field_id.format(link=link))}
# The link state as a field value, scoped to the link: active (and asleep, a low-power state of a
# trained link) is up; inactive or traffic disabled is down.
NVLINK_STATE_FIELD = _const(_LINK["up"].field_id, "catalogue gpu_nvlink.up")
NVLINK_STATE_UP = {E.NVML_NVLINK_STATE_ACTIVE, E.NVML_NVLINK_STATE_SLEEP}
# Per-link data throughput counters (scoped to the link; KiB, 64-bit: the catalogue's scale),
# read with the link rows; no per-call fallback: a link that answers NotSupported leaves them out.
NVLINK_THROUGHPUT = {name: (_const(m.field_id, f"catalogue gpu_nvlink.{name}"), int(m.scale))
                     for name, m in _LINK.items() if m.field_id and not m.call}
_VALUE_MEMBER = {0: "dVal", 1: "uiVal", 2: "ulVal", 3: "ullVal", 4: "sllVal", 5: "siVal", 6: "usVal"}

# nvmlFieldValue_t read in bulk: pynvml's structure classes answer every attribute through a
# Python-level __getattribute__, so an array of them is unpacked from its memory in one pass
# (fieldId, scopeId, timestamp, latencyUsec, valueType, nvmlReturn, 8-byte value union).
_FV = E.c_nvmlFieldValue_t
_FV_RECORD = struct.Struct("=IIqqIIQ")
_FV_BULK = (sys.byteorder == "little" and ctypes.sizeof(_FV) == _FV_RECORD.size
            and [(n, getattr(_FV, n).offset) for n, _ in _FV._fields_] == [
                ("fieldId", 0), ("scopeId", 4), ("timestamp", 8), ("latencyUsec", 16), ("valueType", 24),
                ("nvmlReturn", 28), ("value", 32)])
_DOUBLE = struct.Struct("=d")
_ULONG_MASK = (1 << (8 * ctypes.sizeof(ctypes.c_ulong))) - 1


def _union_value(vtype: int, raw: int):
    """The 8 bytes of nvmlValue_t (a little-endian unsigned 64-bit integer) read as ``vtype``."""
    if vtype == 3:  # unsigned long long
        return raw
    if vtype == 1:  # unsigned int
        return raw & 0xFFFFFFFF
    if vtype == 0:  # double
        return _DOUBLE.unpack(raw.to_bytes(8, "little"))[0]
    if vtype == 4:  # signed long long
        return raw - (1 << 64) if raw >> 63 else raw
    if vtype == 5:  # signed int
        raw &= 0xFFFFFFFF
        return raw - (1 << 32) if raw >> 31 else raw
    if vtype == 2:  # unsigned long
        return raw & _ULONG_MASK
    if vtype == 6:  # unsigned short
        return raw & 0xFFFF
    return raw


def field_values(arr) -> list[tuple[int, int, object]]:
    """``nvmlDeviceGetFieldValues``' answer -> ``[(fieldId, nvmlReturn, value or None), ...]`` in
    request order."""
    if _FV_BULK and isinstance(arr, ctypes.Array) and arr._type_ is _FV:
        return [(fid, ret, _union_value(vt, raw) if ret == 0 else None)
                for fid, _, _, _, vt, ret, raw in _FV_RECORD.iter_unpack(memoryview(arr).cast("B"))]
    out = []
    for v in arr:
        ret = int(v.nvmlReturn)
        val = getattr(v.value, _VALUE_MEMBER.get(int(v.valueType), "ullVal")) if ret == 0 else None
        out.append((int(v.fieldId), ret, val))
    return out


def _conv():
    """catalogue field -> (divisor or scale, python type), measurement gpu.

    A scale that is 1/n is applied as a division by n, so 689959 mW reads 689.959 W exactly.
    """
    out = {}
    for m in catalogue.fields("gpu"):
        inv = 1.0 / m.scale if m.scale else 0.0
        out[m.field] = ((-round(inv)) if m.scale < 1 and abs(inv - round(inv)) < 1e-9 else m.scale,
                        m.python_type)
    return out


class _Lost(Exception):
    pass


class _Stale(Exception):
    pass


class _Worker:
    """A daemon thread that runs one GPU's reads; a hung NVML call blocks only this GPU."""

    def __init__(self, name: str):
        self._q: queue.SimpleQueue = queue.SimpleQueue()
        self.future: cf.Future | None = None
        threading.Thread(target=self._run, name=name, daemon=True).start()

    @property
    def busy(self) -> bool:
        return self.future is not None and not self.future.done()

    def submit(self, fn, *args) -> cf.Future:
        f: cf.Future = cf.Future()
        self.future = f
        self._q.put((f, fn, args))
        return f

    def _run(self):
        while True:
            item = self._q.get()
            if item is None:
                return
            f, fn, args = item
            if not f.set_running_or_notify_cancel():
                continue
            try:
                f.set_result(fn(*args))
            except BaseException as exc:  # handed to the poll that waits on it
                f.set_exception(exc)

    def close(self):
        self._q.put(None)


class _Gpu:
    """What the collector knows about one GPU between polls."""

    def __init__(self, index: int):
        self.index = index
        self.handle = None
        self.uuid = "unknown"
        self.model = "unknown"
        self.pci_bus_id: str | None = None
        self.absent: set[str] = set()  # calls this GPU does not support (cached after first try)
        self.logged: set[str] = set()
        self.field_ids: list[int] = list(FIELD_IDS)
        self.slow_field_ids: list[int] = list(SLOW_FIELD_IDS)
        self.gpm: bool | None = None  # GPM supported (None: not asked yet)
        self.gpm_prev = None  # (sample, time) of the last GPM sample
        self.gpm_spare = None  # an allocated sample waiting for reuse
        self.gpm_reset = False  # drop gpm_prev before the next sample (time went back, GPU lost)
        self.links: list[int] | None = None  # NVLink links that answer, found on the first poll
        # NVLink batch: field requests, and what each answer is (link, field name; "up" = state)
        self.link_req: list = []
        self.link_what: list[tuple[int, str]] = []
        self.link_calls: list[tuple[int, str]] = []  # read one NVML call each (fallback)
        self.state = "up"
        self.retry_at = 0.0
        self.worker: _Worker | None = None
        self.job_tags: dict[str, str] = {}  # operator-chosen job tags, from the last slow poll

    @property
    def tags(self) -> dict[str, str]:
        return {"gpu": str(self.index), "uuid": self.uuid, "model": self.model}


@register("gpu")
class GpuCollector:
    """NVML collector. ``backend``: a backend object or a spec (``nvml``, ``sim``, ``recorded:PATH``).

    ``slow_interval_s``: cadence of the slow tier; ``deadline_s``: the most a poll waits for any
    GPU; ``retry_s``: how long a lost/stale GPU (or a node without driver) waits before a retry;
    ``nvlink``: read per-link NVLink state and counters; ``nvlink_interval_s``: their cadence (on
    the first poll and then at most this often; 0 = every poll; the counters are cumulative, so
    no error is lost, only resolution); ``jobs``: attribute GPUs to jobs; ``interval``: the agent's
    poll period, when known: the deadline is at most half of it; ``job_tags``: low-cardinality job
    labels to add as tags of the ``gpu`` row (``scheduler``, ``namespace``, ``partition``, ``user``;
    see :func:`gpufleet.agent.jobs.job_tags`; empty: none); ``gpm``: read GPM metrics where
    the GPU supports them. The agent passes its ``[gpu]`` section (``options``) as these keywords.

    Cadences (slow tier, NVLink, retries) follow the tick's time, ``now_ns`` (a node played on a
    simulated fleet's clock keeps them in fleet time; time going backwards restarts them);
    ``clock`` (seconds), when given, is used instead.
    """

    name = "gpu"
    needs_nvml = True
    measurements = ("gpu", "gpu_nvlink")
    options = (  # the [gpu] section
        Option("nvlink_interval", "duration", 30.0, "NVLink rows (gpu_nvlink: link state and the cumulative "
               "CRC/replay/recovery counters) are read this often, and on the first poll; 0 = every poll. "
               "The counters are cumulative, so a longer interval loses no error, only time resolution",
               0.0, 3600.0, arg="nvlink_interval_s"),
        Option("job_tags", "strlist", [], "job labels added as tags of the gpu row (job_id stays a field)",
               choices=TAG_KEYS),
        Option("gpm", "bool", True, "GPM (Hopper and newer): SM/tensor/DRAM activity and PCIe/NVLink "
               "bandwidth; absent on GPUs without GPM. About 0.09 ms + 1-4 ms of driver time per GPU poll "
               "on an H200"),
    )

    @classmethod
    def describe(cls, table: dict, node: Node) -> tuple[str, str]:
        if node.gpus is None:
            return "unavailable", f"NVML: {node.nvml_error}; tried again while the agent runs"
        return "on", f"{node.gpus} GPU(s) through NVML, every {format_duration(node.interval)}"

    @classmethod
    def slowest_rows(cls, table: dict) -> float | None:
        return float(table["nvlink_interval"])

    def __init__(self, backend="nvml", *, slow_interval_s: float = 60.0, deadline_s: float = 2.0,
                 retry_s: float = 30.0, nvlink: bool = True, nvlink_interval_s: float = 30.0,
                 jobs: bool = True, interval: float | None = None, job_tags=(), clock=None,
                 gpm: bool = True):
        if isinstance(backend, str):
            from gpufleet.agent.backends import get_backend

            backend = get_backend(backend)
        self.backend = backend
        self.slow_interval_s = float(slow_interval_s)
        self.deadline_s = float(deadline_s)
        if interval:
            self.deadline_s = min(self.deadline_s, 0.5 * float(interval))
        self.retry_s = float(retry_s)
        self.nvlink = nvlink
        self.nvlink_interval_s = float(nvlink_interval_s)
        self.gpm = bool(gpm)
        self._gpm_req = None  # the nvmlGpmMetricsGet request, built once (used under _GPM_LOCK)
        self._next_links = 0.0
        self.jobs = jobs
        from gpufleet.agent.jobs import check_tag_keys

        self.job_tags = check_tag_keys(job_tags) if jobs else ()
        self._clock = clock
        self._last_now: float | None = None
        self._gpus: list[_Gpu] | None = None
        self._init_error: str | None = None
        self._init_retry_at = 0.0
        self._next_slow = 0.0
        self._conv = _conv()
        # the plan's calls bound to this backend: (gate key, function or None, args, outs, the
        # one field of a call whose answer is the value itself, else None)
        self._calls = {tier: tuple((c.key, getattr(self.backend, c.fn, None), c.args, c.outs,
                                    c.outs[0][0] if len(c.outs) == 1 and c.outs[0][1:] == _PLAIN else None)
                                   for c in p["calls"])
                       for tier, p in PLAN.items()}
        self._resolve_job = resolve_job if jobs else None

    # -- lifecycle ---------------------------------------------------------------------------
    def _ensure_init(self, now: float) -> list[_Gpu]:
        if self._gpus is not None:
            return self._gpus
        if self._init_error and now < self._init_retry_at:
            raise CollectorUnavailable(self._init_error)
        B = self.backend
        try:
            B.nvmlInit()
            count = B.nvmlDeviceGetCount()
        except (E.NVMLError, OSError) as exc:
            self._init_error = (f"NVML is not available ({exc}): no NVIDIA driver or GPU on this node; "
                                "GPU metrics are off")
            self._init_retry_at = now + self.retry_s
            raise CollectorUnavailable(self._init_error) from None
        gpus = []
        for i in range(count):
            g = _Gpu(i)
            try:
                self._identify(g)
            except (_Lost, _Stale) as exc:
                self._mark(g, "lost" if isinstance(exc, _Lost) else "stale", now)
            g.worker = _Worker(f"gpufleet-gpu{i}")
            gpus.append(g)
        self._gpus = gpus
        self._init_error = None
        return gpus

    def _identify(self, g: _Gpu) -> None:
        B = self.backend
        try:
            g.handle = B.nvmlDeviceGetHandleByIndex(g.index)
        except E.NVMLError as exc:
            g.handle = None
            raise _Lost() if exc.value in LOST else _Stale() from None
        name = self._q(g, "name", B.nvmlDeviceGetName)
        uuid = self._q(g, "uuid", B.nvmlDeviceGetUUID)
        pci = self._q(g, "pci", B.nvmlDeviceGetPciInfo)
        g.model = _str(name) or g.model
        g.uuid = _str(uuid) or g.uuid
        g.pci_bus_id = _str(getattr(pci, "busId", None)) if pci is not None else None

    def close(self) -> None:
        for g in self._gpus or ():
            if g.worker:
                g.worker.close()
            self._gpm_release(g)
        if self._gpus is not None:
            try:
                self.backend.nvmlShutdown()
            except E.NVMLError:
                pass
        self._gpus = None

    # -- the query gate ----------------------------------------------------------------------
    def _q(self, g: _Gpu, key: str, fn, *args):
        """Call ``fn(handle, *args)``; None when absent. Raises _Lost/_Stale for the GPU.
        ``fn`` None (a binding without that call) is absent too."""
        if key in g.absent:
            return None
        if fn is None:
            g.absent.add(key)
            return None
        try:
            return fn(g.handle, *args)
        except E.NVMLError as exc:
            code = exc.value
            if code in ABSENT:
                g.absent.add(key)
                if key not in g.logged:
                    g.logged.add(key)
                    lvl = logging.DEBUG if code == E.NVML_ERROR_NOT_SUPPORTED else logging.INFO
                    log.log(lvl, "gpu %d: %s: %s; left out", g.index, key, exc)
                return None
            if code in LOST:
                raise _Lost() from None
            if code in STALE:
                raise _Stale() from None
            if key not in g.logged:
                g.logged.add(key)
                log.debug("gpu %d: %s: %s; left out of this poll", g.index, key, exc)
            return None

    def _put(self, f: dict, name: str, raw) -> None:
        if raw is None:
            return
        scale, typ = self._conv[name]  # a negative scale -n means: divide by n
        if typ is float:
            f[name] = float(raw) / -scale if scale < 0 else float(raw) * scale
        elif typ is int:
            f[name] = int(raw) if scale == 1 else int(raw / -scale if scale < 0 else raw * scale)
        else:
            f[name] = str(raw)

    # -- one GPU -----------------------------------------------------------------------------
    def _read_gpu(self, g: _Gpu, slow: bool, now_ns: int, links: bool = True,
                  now: float | None = None) -> list[Sample]:
        if g.handle is None:
            self._identify(g)
        f: dict[str, object] = {}
        extra = {"pci_bus_id": g.pci_bus_id, "pids": None}
        fast = PLAN["fast"]
        self._read_calls(g, f, self._calls["fast"], slow)
        self._read_fields(g, f)
        self._read_fallback(g, f, fast["fallback"], g.field_ids)
        if slow:
            plan = PLAN["slow"]
            self._read_fields(g, f, slow=True)
            self._read_fallback(g, f, plan["fallback"], g.slow_field_ids)
            self._read_calls(g, f, self._calls["slow"], True)
            for name in plan["readers"]:
                getattr(self, f"_read_{name}")(g, f, extra)
        f["up"] = 1
        f["health_code"] = 0
        tags = {**g.tags, **g.job_tags} if g.job_tags else g.tags
        link_rows = self._read_nvlink(g, now_ns) if self.nvlink and (links or g.links is None) else []
        if self.gpm and g.gpm is not False:
            self._read_gpm(g, f, now_ns / 1e9 if now is None else now)
        out = [Sample("gpu", tags, f, now_ns, extra=extra)]
        out.extend(link_rows)
        return out

    def _read_calls(self, g: _Gpu, f: dict, calls: tuple, slow: bool) -> None:
        """The plan's NVML calls: each answer gives its fields (a member of it, or its length)
        and the flags decoded from them; a slow-tier field of a fast call only on slow polls."""
        q, put = self._q, self._put
        for key, fn, args, outs, only in calls:
            v = q(g, key, fn, *args)
            if v is None:
                continue
            if only is not None:
                put(f, only, v)
                continue
            for name, member, count, slow_only, bits in outs:
                if slow_only and not slow:
                    continue
                x = v
                if member is not None:
                    if isinstance(member, str):
                        x = getattr(v, member)
                    elif member < len(v):
                        x = v[member]
                    else:
                        continue
                if count:
                    x = len(x)
                put(f, name, x)
                if bits:
                    x = int(x)
                    for flag, mask in bits:
                        f[flag] = 1 if x & mask else 0

    def _read_fallback(self, g: _Gpu, f: dict, fallback: list, ids: list[int]) -> None:
        """A field whose field value this GPU does not support (dropped from its batch): the call."""
        for fid, name, key, fn, args in fallback:
            if name not in f and fid not in ids:
                self._put(f, name, self._q(g, key, getattr(self.backend, fn, None), *args))

    def _read_fields(self, g: _Gpu, f: dict, slow: bool = False) -> None:
        """One nvmlDeviceGetFieldValues batch: the fast ids, or (``slow``) the slow-tier ids.
        An id the GPU does not support is dropped from its batch for good."""
        ids, names = (g.slow_field_ids, SLOW_FIELD_IDS) if slow else (g.field_ids, FIELD_IDS)
        if not ids:
            return
        vals = self._q(g, "slow_field_values" if slow else "field_values",
                       self.backend.nvmlDeviceGetFieldValues, ids)
        ids = [] if vals is None else self._field_answers(g, f, vals, names)
        if slow:
            g.slow_field_ids = ids
        else:
            g.field_ids = ids

    def _field_answers(self, g: _Gpu, f: dict, vals, names: dict[int, str]) -> list[int]:
        keep = []
        for fid, ret, value in field_values(vals):
            if ret == E.NVML_SUCCESS:
                name = names.get(fid)
                if name and isinstance(value, float) and self._conv[name][1] is int:
                    # a counter answered as a double: this id means something else to this driver
                    # (nvidia-ml-py 12.575/13.580.65 number the clock-event reasons 251-253, which
                    # an r580 driver answers as power-smoothing settings): absent, never misread
                    key = f"field {fid}"
                    if key not in g.logged:
                        g.logged.add(key)
                        log.warning("gpu %d: %s (%s) answered a double where a counter was expected: "
                                    "the field id does not match this driver; left out", g.index, key, name)
                    continue
                keep.append(fid)
                if name:
                    self._put(f, name, value)
            elif ret in ABSENT:
                key = f"field {fid}"
                if key not in g.logged:
                    g.logged.add(key)
                    log.debug("gpu %d: %s not supported; left out", g.index, key)
            elif ret in LOST:
                raise _Lost()
            else:
                keep.append(fid)  # transient: ask again next poll
        return keep

    # -- named readers (the catalogue's ``read = "..."``) ----------------------------------------
    def _read_mig_devices(self, g: _Gpu, f: dict, extra: dict) -> None:
        """mig_device_count: the MIG devices that answer, where MIG mode is on (0 where off)."""
        if "mig_mode" not in f:
            return
        n = 0
        if f["mig_mode"] == 1:
            B = self.backend
            slots = self._q(g, "mig_max", B.nvmlDeviceGetMaxMigDeviceCount) or 0
            for i in range(int(slots)):
                try:
                    B.nvmlDeviceGetMigDeviceHandleByIndex(g.handle, i)
                    n += 1
                except E.NVMLError as exc:
                    if exc.value in LOST:
                        raise _Lost() from None
        f["mig_device_count"] = n

    def _read_processes(self, g: _Gpu, f: dict, extra: dict) -> None:
        """process_count and job_id from the GPU's compute processes (their pids go to ``extra``),
        and the operator-chosen job tags."""
        B = self.backend
        procs = self._q(g, "processes", B.nvmlDeviceGetComputeRunningProcesses)
        if procs is None:
            return
        pids = sorted({int(p.pid) for p in procs})
        extra["pids"] = pids
        f["process_count"] = len(pids)
        proc_root = getattr(B, "proc_root", None)
        if pids and self._resolve_job is not None and proc_root:
            try:
                job = self._resolve_job(pids, proc_root=proc_root)
            except OSError as exc:
                log.debug("gpu %d: job lookup failed: %s", g.index, exc)
                job = None
            if job:
                f["job_id"] = str(job)
        if self.job_tags:
            g.job_tags = {}
            if pids and proc_root:
                from gpufleet.agent.jobs import job_tags

                try:
                    g.job_tags = job_tags(pids, self.job_tags, proc_root=proc_root)
                except OSError as exc:
                    log.debug("gpu %d: job tags lookup failed: %s", g.index, exc)

    # -- GPM -------------------------------------------------------------------------------
    def _read_gpm(self, g: _Gpu, f: dict, now: float) -> None:
        """This poll's GPM sample; with the previous one (>= GPM_MIN_INTERVAL_S before), the
        metrics over the interval between them. A poll too close to the last sample reads nothing
        (the older sample stays the interval's start)."""
        B = self.backend
        if g.gpm_reset:
            self._gpm_release(g)
        if g.gpm is None:
            sup = self._q(g, "gpm_support", getattr(B, "nvmlGpmQueryDeviceSupport", None))
            g.gpm = bool(sup is not None and int(getattr(sup, "isSupportedDevice", 0)))
            if not g.gpm:
                log.debug("gpu %d: GPM not supported; its metrics are left out", g.index)
                return
        prev = g.gpm_prev
        if prev is not None and now - prev[1] < GPM_MIN_INTERVAL_S:
            return
        got = None
        with _GPM_LOCK:
            try:
                cur = g.gpm_spare if g.gpm_spare is not None else B.nvmlGpmSampleAlloc()
                g.gpm_spare = None
                try:
                    B.nvmlGpmSampleGet(g.handle, cur)
                except E.NVMLError:
                    g.gpm_spare = cur  # not taken: reuse the buffer next time
                    raise
                if prev is not None:
                    got = self._gpm_metrics(prev[0], cur)
            except E.NVMLError as exc:
                self._gpm_error(g, exc)
                return
        if prev is not None:
            g.gpm_spare = prev[0]
        g.gpm_prev = (cur, now)
        if got is None:
            return
        no_links = g.links is not None and not g.links  # probed: this GPU has no NVLink
        for mid, ret, value in got:
            name = GPM_METRICS[mid]
            if ret != E.NVML_SUCCESS or value != value or (no_links and name in GPM_NEEDS_LINKS):
                continue
            self._put(f, name, value)

    def _gpm_metrics(self, s1, s2) -> list[tuple[int, int, float]]:
        """nvmlGpmMetricsGet over (s1, s2): [(metric id, return code, value), ...]. Under _GPM_LOCK."""
        mg = self._gpm_req
        if mg is None:
            mg = E.c_nvmlGpmMetricsGet_t()
            mg.version = E.NVML_GPM_METRICS_GET_VERSION
            mg.numMetrics = len(_GPM_IDS)
            for i, mid in enumerate(_GPM_IDS):
                mg.metrics[i].metricId = mid
            self._gpm_req = mg
        mg.sample1, mg.sample2 = s1, s2
        self.backend.nvmlGpmMetricsGet(mg)
        out = []
        for i, mid in enumerate(_GPM_IDS):
            m = mg.metrics[i]
            out.append((mid, int(m.nvmlReturn), float(m.value)))
        return out

    def _gpm_error(self, g: _Gpu, exc) -> None:
        code = exc.value
        if code in ABSENT:
            log.log(logging.DEBUG if code == E.NVML_ERROR_NOT_SUPPORTED else logging.INFO,
                    "gpu %d: GPM: %s; left out", g.index, exc)
            g.gpm = False
            self._gpm_release(g)
            return
        if code in LOST:
            raise _Lost() from None
        if code in STALE:
            raise _Stale() from None
        log.debug("gpu %d: GPM: %s; left out of this poll", g.index, exc)

    def _gpm_release(self, g: _Gpu) -> None:
        """Free this GPU's GPM samples (close, lost GPU, time going back)."""
        g.gpm_reset = False
        samples = [s for s in (g.gpm_prev[0] if g.gpm_prev else None, g.gpm_spare) if s is not None]
        g.gpm_prev = g.gpm_spare = None
        for smp in samples:
            try:
                with _GPM_LOCK:
                    self.backend.nvmlGpmSampleFree(smp)
            except E.NVMLError as exc:
                log.debug("gpu %d: GPM sample free: %s", g.index, exc)

    def _read_nvlink(self, g: _Gpu, now_ns: int) -> list[Sample]:
        B, q = self.backend, self._q
        if g.links is None:  # first poll: find the links that answer, plan the batch
            vals: dict[int, dict[str, object]] = {}
            for link in range(MAX_LINKS):
                st = q(g, f"nvlink_state {link}", B.nvmlDeviceGetNvLinkState, link)
                if st is not None:
                    vals[link] = {"up": 1 if int(st) == E.NVML_FEATURE_ENABLED else 0}
            g.links = list(vals)
            self._plan_nvlink(g)
            calls = [(link, name) for link in g.links for name, _ in NVLINK_COUNTERS]
            self._read_nvlink_throughput(g, vals)
        else:
            vals = {link: {} for link in g.links}
            self._read_nvlink_fields(g, vals)
            calls = g.link_calls
        for link, name in calls:
            if name == "up":
                st = q(g, f"nvlink_state {link}", B.nvmlDeviceGetNvLinkState, link)
                if st is not None:
                    vals[link]["up"] = 1 if int(st) == E.NVML_FEATURE_ENABLED else 0
                continue
            v = q(g, f"nvlink_err {link} {name}", B.nvmlDeviceGetNvLinkErrorCounter, link,
                  _COUNTER_ENUM[name])
            if v is not None:
                vals[link][name] = int(v)
        tags = g.tags
        return [Sample("gpu_nvlink", {**tags, "link": str(link)}, vals[link], now_ns)
                for link in g.links if vals[link]]

    def _plan_nvlink(self, g: _Gpu) -> None:
        """The batch for this GPU's links: state (scoped to the link) and the counters that have
        per-link field ids; the other counters are read one call each."""
        req, what, calls = [], [], []
        for link in g.links:
            req.append((NVLINK_STATE_FIELD, link))
            what.append((link, "up"))
            for name, _ in NVLINK_COUNTERS:
                fid = NVLINK_COUNTER_FIELDS.get((name, link))
                if fid is None:
                    calls.append((link, name))
                else:
                    req.append(fid)
                    what.append((link, name))
            for name, (fid, _) in NVLINK_THROUGHPUT.items():
                req.append((fid, link))
                what.append((link, name))
        g.link_req, g.link_what, g.link_calls = req, what, calls

    def _read_nvlink_throughput(self, g: _Gpu, vals: dict[int, dict[str, object]]) -> None:
        """The first poll's per-link throughput counters (later polls read them in the batch)."""
        req = [(fid, link) for link in g.links for fid, _ in NVLINK_THROUGHPUT.values()]
        if not req:
            return
        got = self._q(g, "nvlink_throughput", self.backend.nvmlDeviceGetFieldValues, req)
        if got is None:
            return
        names = [(link, name) for link in g.links for name in NVLINK_THROUGHPUT]
        for (link, name), (_, ret, raw) in zip(names, field_values(got), strict=True):
            if ret == E.NVML_SUCCESS:
                vals[link][name] = int(raw) * NVLINK_THROUGHPUT[name][1]

    def _read_nvlink_fields(self, g: _Gpu, vals: dict[int, dict[str, object]]) -> None:
        """One nvmlDeviceGetFieldValues call for the planned link fields. What it does not support
        moves to the per-call fallback for good (read by the caller in this same poll)."""
        if not g.link_req:
            return
        got = self._q(g, "nvlink_fields", self.backend.nvmlDeviceGetFieldValues, g.link_req)
        if got is None:
            g.link_calls = [w for w in g.link_what if w[1] not in NVLINK_THROUGHPUT] + g.link_calls
            g.link_req, g.link_what = [], []
            return
        moved = None
        ok = E.NVML_SUCCESS
        what = g.link_what
        for i, (_, ret, raw) in enumerate(field_values(got)):
            if ret == ok:
                link, name = what[i]
                raw = int(raw)
                if name == "up":
                    vals[link]["up"] = 1 if raw in NVLINK_STATE_UP else 0
                elif name in NVLINK_THROUGHPUT:
                    vals[link][name] = raw * NVLINK_THROUGHPUT[name][1]
                else:
                    vals[link][name] = raw
            elif ret in ABSENT:
                (moved := moved or []).append(i)
            elif ret in LOST:
                raise _Lost()
        if moved:
            log.debug("gpu %d: %d NVLink field values not supported; read one call each", g.index, len(moved))
            g.link_calls = g.link_calls + [what[i] for i in moved if what[i][1] not in NVLINK_THROUGHPUT]
            drop = set(moved)
            g.link_req = [r for i, r in enumerate(g.link_req) if i not in drop]
            g.link_what = [w for i, w in enumerate(what) if i not in drop]

    # -- a poll ------------------------------------------------------------------------------
    def _mark(self, g: _Gpu, state: str, now: float) -> None:
        if g.state != state:
            log.warning("gpu %d (%s): %s; retrying in %.0f s", g.index, g.uuid, state, self.retry_s)
        g.state = state
        g.retry_at = now + self.retry_s
        if state == "lost":
            g.handle = None  # ask for a fresh handle on retry
            g.gpm_reset = True  # samples of the old handle are freed by the next read

    def _down_row(self, g: _Gpu, now_ns: int) -> Sample:
        return Sample("gpu", {**g.tags, **g.job_tags}, {"up": 0, "health_code": HEALTH[g.state]}, now_ns,
                      extra={"pci_bus_id": g.pci_bus_id})

    def collect(self, now_ns: int | None = None) -> list[Sample]:
        if now_ns is None:
            now_ns = time.time_ns()
        now = self._clock() if self._clock is not None else now_ns / 1e9
        if self._last_now is not None and now < self._last_now:  # time went backwards: restart cadences
            self._next_slow = self._next_links = self._init_retry_at = 0.0
            for g in self._gpus or ():
                g.retry_at = min(g.retry_at, now)
                if g.gpm_prev is not None:  # the next sample starts afresh (no interval to measure)
                    g.gpm_reset = True
        self._last_now = now
        begin = getattr(self.backend, "begin_poll", None)
        if begin is not None:  # the snapshot first: GPUs are identified at the tick's time
            begin(now_ns)
        gpus = self._ensure_init(now)
        slow = now >= self._next_slow
        if slow:
            self._next_slow = now + self.slow_interval_s
        links = now >= self._next_links
        if links:
            self._next_links = now + self.nvlink_interval_s
        pending: dict[cf.Future, _Gpu] = {}
        rows: dict[int, list[Sample]] = {}
        for g in gpus:
            if g.worker.busy or (g.state != "up" and now < g.retry_at):
                if g.worker.busy and g.state == "up":
                    self._mark(g, "stale", now)
                rows[g.index] = [self._down_row(g, now_ns)]
                continue
            pending[g.worker.submit(self._read_gpu, g, slow, now_ns, links, now)] = g
        done, not_done = cf.wait(pending, timeout=self.deadline_s)
        for fut in not_done:
            g = pending[fut]
            self._mark(g, "stale", now)
            rows[g.index] = [self._down_row(g, now_ns)]
        for fut in done:
            g = pending[fut]
            try:
                rows[g.index] = fut.result()
                if g.state != "up":
                    log.warning("gpu %d (%s): answering again", g.index, g.uuid)
                g.state = "up"
            except _Lost:
                self._mark(g, "lost", now)
                rows[g.index] = [self._down_row(g, now_ns)]
            except _Stale:
                self._mark(g, "stale", now)
                rows[g.index] = [self._down_row(g, now_ns)]
            except Exception as exc:  # a backend that fails in an unexpected way: isolate the GPU
                log.warning("gpu %d: read failed: %r", g.index, exc)
                self._mark(g, "stale", now)
                rows[g.index] = [self._down_row(g, now_ns)]
        return [s for i in sorted(rows) for s in rows[i]]


def _str(v) -> str | None:
    if v is None:
        return None
    if isinstance(v, bytes):
        v = v.decode("utf-8", "replace")
    return str(v)
