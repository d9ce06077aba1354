"""A simulated node behind the NVML function names.

The backend answers from a **node-state source**: any object with ``gpus(t) -> list[dict]``
(``t`` in seconds since the epoch), one dict per GPU holding catalogue field values of
measurement ``gpu`` in catalogue units (``power_watts``, ``temperature_gpu_celsius``,
``clock_event_reasons``, ``throttle_sw_power_cap_ns_total``, ...), plus the keys ``index``,
``uuid``, ``model``, ``pci_bus_id``, ``health`` (``"up"`` | ``"lost"`` | ``"stale"``) and
``nvlink`` (a list of ``gpu_nvlink`` field dicts, one per link). A key that is absent is a
feature the GPU lacks (NotSupported). ``gpufleet.sim.node.SimNode`` is such a source;
:class:`TinyNode` is a small deterministic one.

The backend converts the state back into NVML units (W -> mW, J -> mJ, ratio -> percent), so
the collector's own conversions run exactly as on hardware. A ``lost`` GPU raises
``NVMLError_GpuIsLost`` on every call, a ``stale`` one ``NVMLError_Unknown``.
"""

from __future__ import annotations

import collections
import math
import numbers
import threading
import time
import uuid as _uuid

import pynvml
from gpufleet.agent.backends._proctree import ProcTree
from gpufleet.agent.backends._replay import AnswerBackend, DeviceAnswers, Handle, call_key
from gpufleet.agent.collectors.gpu import (
    GPM_METRICS,
    NVLINK_COUNTER_FIELDS,
    NVLINK_COUNTERS,
    NVLINK_STATE_FIELD,
    NVLINK_THROUGHPUT,
    PLAN,
)

from gpufleet import catalogue

# What the GPU collector reads, and how, is the catalogue's (gpufleet.agent.collectors.gpu.PLAN): the
# simulated node answers exactly those calls and field ids, in NVML units (the catalogue's scale
# undone).
_U32, _U64 = pynvml.NVML_VALUE_TYPE_UNSIGNED_INT, pynvml.NVML_VALUE_TYPE_UNSIGNED_LONG_LONG
# field values an H200 answers as unsigned int, with the PCIe link counters (ids from
# NVML_FI_DEV_PCIE_L0_TO_RECOVERY_COUNTER up); the others as unsigned long long
_U32_FIELDS = {pynvml.NVML_FI_DEV_MEMORY_TEMP, pynvml.NVML_FI_DEV_POWER_INSTANT}


def _factor(name: str):
    """Catalogue unit -> NVML unit of field ``name`` (an integer where the scale is 1/n)."""
    inv = 1.0 / catalogue.by_key()[("gpu", name)].scale
    return round(inv) if abs(inv - round(inv)) < 1e-9 else inv


_FIELDS = tuple(  # catalogue field -> (NVML field id, value type, factor to NVML units)
    (name, fid, _U32 if fid in _U32_FIELDS or fid >= pynvml.NVML_FI_DEV_PCIE_L0_TO_RECOVERY_COUNTER
     else _U64, _factor(name))
    for tier in PLAN.values() for fid, name in tier["fields"].items())
_CALLS = (  # catalogue field -> (NVML call key, factor to NVML units): the calls answered as is
    *((name, call_key(c.fn, c.args), _factor(name)) for tier in PLAN.values() for c in tier["calls"]
      for name, member, count, _, bits in c.outs if member is None and not count and not bits),
    *((name, call_key(fn, args), _factor(name)) for tier in PLAN.values()
      for _, name, _, fn, args in tier["fallback"]),
)
# GPM: catalogue field -> (NVML metric id, factor to NVML units: percent, MiB/s)
_GPM = tuple((name, mid, 1.0 / catalogue.by_key()[("gpu", name)].scale) for mid, name in GPM_METRICS.items())
# per-link throughput counters: catalogue field -> (field id, bytes per NVML unit)
_LINK_IO = tuple((name, fid, unit) for name, (fid, unit) in NVLINK_THROUGHPUT.items())
_FLAGS = tuple(flag for tier in PLAN.values() for c in tier["calls"] for *_, bits in c.outs for flag in bits)
_LINK_COUNTERS = NVLINK_COUNTERS
_OK = pynvml.NVML_SUCCESS
_LINK_STATE = NVLINK_STATE_FIELD
_ACTIVE, _INACTIVE = pynvml.NVML_NVLINK_STATE_ACTIVE, pynvml.NVML_NVLINK_STATE_INACTIVE


_LINK_KEYS: dict[int, tuple] = {}


def _link_keys(link: int) -> tuple:
    """A link's NVML answer keys: the state call, and (field, counter call, field id) per counter."""
    keys = _LINK_KEYS.get(link)
    if keys is None:
        keys = _LINK_KEYS[link] = (
            f"nvmlDeviceGetNvLinkState({link})",
            tuple((name, f"nvmlDeviceGetNvLinkErrorCounter({link},{counter})",
                   NVLINK_COUNTER_FIELDS.get((name, link))) for name, counter in _LINK_COUNTERS))
    return keys


def _nvml(v, factor) -> int:
    """A catalogue value (Python or numpy number) -> NVML's integer units (integers stay exact)."""
    if isinstance(v, numbers.Integral):
        return int(v) * factor
    return int(round(float(v) * factor))


def state_to_answers(s: dict, procs: ProcTree | None = None) -> DeviceAnswers:
    """One GPU's simulated state (catalogue units) -> its NVML answers (NVML units)."""
    dev = DeviceAnswers()
    a = dev.answers
    idx = int(s.get("index", 0))
    a["nvmlDeviceGetIndex"] = idx
    a["nvmlDeviceGetName"] = str(s.get("model", "NVIDIA H200"))
    a["nvmlDeviceGetUUID"] = str(s.get("uuid") or f"GPU-{_uuid.UUID(int=idx)}")
    bus = s.get("pci_bus_id") or f"00000000:{0x18 + idx * 0x10:02X}:00.0"
    a["nvmlDeviceGetPciInfo"] = {"busId": bus, "busIdLegacy": bus}
    health = s.get("health", "up")
    if health == "lost":
        dev.fail_all = pynvml.NVML_ERROR_GPU_IS_LOST
    elif health == "stale":
        dev.fail_all = pynvml.NVML_ERROR_UNKNOWN

    def g(name):  # absent, None or NaN: the GPU does not report it
        v = s.get(name)
        return None if v is None or (isinstance(v, float) and v != v) else v

    if g("utilization_gpu_ratio") is not None and g("utilization_memory_ratio") is not None:
        a["nvmlDeviceGetUtilizationRates"] = {"gpu": _nvml(s["utilization_gpu_ratio"], 100),
                                              "memory": _nvml(s["utilization_memory_ratio"], 100)}
    if g("memory_used_bytes") is not None and g("memory_total_bytes") is not None:
        total, used = int(s["memory_total_bytes"]), int(s["memory_used_bytes"])
        a["nvmlDeviceGetMemoryInfo"] = {"total": total, "used": used, "free": max(total - used, 0)}
    for name, key, factor in _CALLS:
        v = g(name)
        if v is not None:
            a[key] = _nvml(v, factor)
    for name, fid, vtype, factor in _FIELDS:
        v = g(name)
        if v is not None:
            dev.fields[fid] = (pynvml.NVML_SUCCESS, vtype, _nvml(v, factor))
    gpm = {mid: float(g(name)) * factor for name, mid, factor in _GPM if g(name) is not None}
    if gpm:
        a["gpm"] = gpm
    reasons = g("clock_event_reasons")
    if reasons is None and any(g(f) is not None for f, _ in _FLAGS):
        reasons = sum(bit for f, bit in _FLAGS if g(f))
    if reasons is not None:
        a["nvmlDeviceGetCurrentClocksEventReasons"] = int(reasons)
    for cause, name in ((0, "retired_pages_sbe"), (1, "retired_pages_dbe")):
        if g(name) is not None:
            a[f"nvmlDeviceGetRetiredPages({cause})"] = [0x1000 * (k + 1) for k in range(int(s[name]))]
    rr = [g(f"remapped_rows_{k}") for k in ("correctable", "uncorrectable", "pending", "failure")]
    if any(v is not None for v in rr):
        a["nvmlDeviceGetRemappedRows"] = [int(v or 0) for v in rr]
    if g("mig_mode") is not None:
        a["nvmlDeviceGetMigMode"] = [int(s["mig_mode"])] * 2
        n = int(g("mig_device_count") or 0)
        a["nvmlDeviceGetMaxMigDeviceCount"] = 7 if s["mig_mode"] else 0
        for i in range(n):
            a[f"nvmlDeviceGetMigDeviceHandleByIndex({i})"] = True
    if g("process_count") is not None:
        job = g("job_id")
        pids = [100_000 + idx * 1000 + k for k in range(int(s["process_count"]))]
        a["nvmlDeviceGetComputeRunningProcesses"] = [
            {"pid": p, "usedGpuMemory": None, "gpuInstanceId": 0xFFFFFFFF, "computeInstanceId": 0xFFFFFFFF}
            for p in pids]
        if procs is not None:
            for p in pids:
                env = {"SLURM_JOB_ID": str(job)} if job is not None and str(job).isdigit() else {}
                cg = f"0::/kubepods.slice/kubepods-pod{str(job).replace('-', '_')}.slice/c\n" \
                    if job is not None and not str(job).isdigit() else "0::/user.slice\n"
                procs.set(p, environ=env, cgroup=cg)
    fields = dev.fields
    for link, ls in enumerate(g("nvlink") or ()):
        state_key, counters = _link_keys(link)
        up = ls.get("up")
        if up is not None:
            a[state_key] = int(up)
            fields[(_LINK_STATE, link)] = (_OK, _U32, _ACTIVE if int(up) else _INACTIVE)
        for name, key, fid in counters:
            v = ls.get(name)
            if v is not None:
                a[key] = v = int(v)
                if fid is not None:
                    fields[fid] = (_OK, _U64, v)
        for name, fid, unit in _LINK_IO:
            v = ls.get(name)
            if v is not None:
                fields[(fid, link)] = (_OK, _U64, int(v) // unit)
    return dev


_XID_EVENT, _DBE_EVENT = pynvml.nvmlEventTypeXidCriticalError, pynvml.nvmlEventTypeDoubleBitEccError
SIM_EVENT_TYPES = _XID_EVENT | _DBE_EVENT  # what a simulated GPU raises: XIDs, and a DBE with XID 48


class SimEventData:
    """What ``nvmlEventSetWait`` gives (the fields of ``c_nvmlEventData_t``), plus ``timestamp_ns``:
    the event's own time on the node's clock (NVML's events carry no time; the reader stamps
    them on arrival when this is absent)."""

    __slots__ = ("device", "eventType", "eventData", "gpuInstanceId", "computeInstanceId", "timestamp_ns")

    def __init__(self, device, event_type: int, data: int, timestamp_ns: int):
        self.device, self.eventType, self.eventData = device, int(event_type), int(data)
        self.gpuInstanceId = self.computeInstanceId = 0xFFFFFFFF
        self.timestamp_ns = int(timestamp_ns)


class _EventSet:
    """One ``nvmlEventSetCreate``: registered GPUs (index -> (handle, mask)) and queued events."""

    def __init__(self):
        self.masks: dict[int, tuple[object, int]] = {}
        self.queue: collections.deque[SimEventData] = collections.deque()
        self.cond = threading.Condition()


class SimBackend(AnswerBackend):
    """NVML answered from a node-state source, one snapshot per poll (``begin_poll``).

    Time is the poll's own: every collector that uses the backend calls ``begin_poll(now_ns)``
    with its tick's time (a second call for the same time is free), so a node played on a fleet's
    clock is seen at that clock's time. Before the first poll (``nvmlInit`` from a collector's
    constructor) the snapshot is taken at the source's ``t0`` (the start of its timeline) when it
    has one, else at the wall clock.

    **Events**: a source with an ``events`` list of ``(epoch seconds, gpu index, xid, message)``
    (:class:`gpufleet.sim.node.SimNode`) is played through NVML's event-set calls
    (``nvmlEventSetCreate``, ``nvmlDeviceGetSupportedEventTypes``, ``nvmlDeviceRegisterEvents``,
    ``nvmlEventSetWait[_v2]``, ``nvmlEventSetFree``): an XID (and for XID 48 the double-bit ECC
    event) is delivered to every set that registered its GPU once the poll time has reached it,
    stamped with its own time (:class:`SimEventData`). Without ``events`` the calls answer
    NotSupported.

    **Canary**: a source with ``canary(index, t) -> (passed, mismatches, digest)`` gives a canary
    engine (:meth:`canary_engine`), so the canary collector reports the node's own verdicts.
    """

    name = "sim"

    def __init__(self, source, clock=time.time):
        super().__init__()
        if not callable(getattr(source, "gpus", None)):
            from gpufleet.errors import GpufleetError

            raise GpufleetError(f"sim source {type(source).__name__} has no gpus(t) method")
        self.source = source
        self._clock = clock
        self._procs = ProcTree()
        self.driver_version = "sim"
        self.t: float | None = None
        self._poll_ns: int | None = None
        self._event_sets: list[_EventSet] = []
        self._events_seen: tuple[object, int] = (None, 0)  # (the source's events list, delivered so far)

    @property
    def proc_root(self) -> str:
        return self._procs.root

    def describe(self) -> str:
        return f"simulated node {type(self.source).__name__} ({len(self.devices)} GPU)"

    def begin_poll(self, now_ns: int | None = None) -> None:
        """Take the node's state at ``now_ns`` (default: now); every answer until the next call
        comes from this snapshot. Events up to that time go to the registered event sets."""
        if now_ns is not None and now_ns == self._poll_ns:
            return
        self._poll_ns = now_ns
        self.t = (now_ns / 1e9) if now_ns is not None else self._clock()
        states = sorted(self.source.gpus(self.t), key=lambda s: int(s.get("index", 0)))
        self.devices = [state_to_answers(s, self._procs) for s in states]
        self._deliver_events()

    def nvmlInit(self):
        super().nvmlInit()
        if self.t is None:
            t0 = getattr(self.source, "t0", None)
            self.begin_poll(int(t0 * 1e9) if isinstance(t0, numbers.Real) else None)

    # -- events ----------------------------------------------------------------------------
    def _deliver_events(self) -> None:
        evs = getattr(self.source, "events", None)
        if evs is None:
            return
        seen, done = self._events_seen
        if evs is not seen:  # a new timeline (the node replayed from its start)
            done = 0
        n = done
        while n < len(evs) and evs[n][0] <= self.t + 1e-6:
            n += 1
        new = evs[done:n]
        self._events_seen = (evs, n)
        for es in list(self._event_sets):
            with es.cond:
                for t, idx, code, _msg in new:
                    reg = es.masks.get(int(idx))
                    if reg is None:
                        continue
                    handle, mask = reg
                    t_ns = int(round(t * 1e9))
                    if mask & _XID_EVENT:
                        es.queue.append(SimEventData(handle, _XID_EVENT, code, t_ns))
                    if int(code) == 48 and mask & _DBE_EVENT:
                        es.queue.append(SimEventData(handle, _DBE_EVENT, 0, t_ns))
                es.cond.notify_all()

    def _events_supported(self) -> None:
        if getattr(self.source, "events", None) is None:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_SUPPORTED)

    def nvmlEventSetCreate(self):
        self._events_supported()
        es = _EventSet()
        self._event_sets.append(es)
        return es

    def nvmlEventSetFree(self, eventSet):
        if eventSet in self._event_sets:
            self._event_sets.remove(eventSet)

    def nvmlDeviceGetSupportedEventTypes(self, handle):
        self._device(handle)
        self._events_supported()
        return SIM_EVENT_TYPES

    def nvmlDeviceRegisterEvents(self, handle, eventTypes, eventSet):
        self._device(handle)
        if not isinstance(eventSet, _EventSet):
            raise pynvml.NVMLError(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        mask = int(eventTypes)
        if mask & ~SIM_EVENT_TYPES:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_SUPPORTED)
        with eventSet.cond:
            eventSet.masks[handle.index] = (handle, mask)

    def nvmlEventSetWait_v2(self, eventSet, timeoutms):
        """The next event, waiting up to ``timeoutms`` of wall time; NVMLError_Timeout if none."""
        with eventSet.cond:
            if not eventSet.queue:
                eventSet.cond.wait(max(0.0, timeoutms / 1000.0))
            if not eventSet.queue:
                raise pynvml.NVMLError(pynvml.NVML_ERROR_TIMEOUT)
            return eventSet.queue.popleft()

    nvmlEventSetWait = nvmlEventSetWait_v2

    # -- canary ----------------------------------------------------------------------------
    def canary_engine(self):
        """A canary engine answering from the source's ``canary(index, t)``, or None."""
        if not callable(getattr(self.source, "canary", None)):
            return None
        return SimCanaryEngine(self)


class SimCanaryEngine:
    """The SDC canary of a simulated node: each check is the node's own verdict
    ``source.canary(index, t)`` at the check's time, so a GPU the fleet corrupts fails its checks.

    A *verdict engine* (see :mod:`gpufleet.agent.collectors.canary`): ``devices()`` and
    ``check(dev, size, now_ns) -> fields``, no GEMM of its own.
    """

    name = "sim"

    def __init__(self, backend: SimBackend):
        self.backend = backend
        self.version = f"sim-{type(backend.source).__name__}"

    def devices(self) -> list[dict]:
        out = []
        for i, dev in enumerate(self.backend.devices):
            a = dev.answers
            d = {"index": int(a.get("nvmlDeviceGetIndex", i)), "label": str(a.get("nvmlDeviceGetIndex", i)),
                 "model": str(a.get("nvmlDeviceGetName", "unknown"))}
            bus = (a.get("nvmlDeviceGetPciInfo") or {}).get("busId")
            if bus:
                dom, b, slot = str(bus).lower().split(".")[0].split(":")[-3:]
                d["pci"] = (int(dom, 16), int(b, 16), int(slot, 16))
            out.append(d)
        return out

    def check(self, dev: dict, size: int, now_ns: int) -> dict:
        """The node's verdict for GPU ``dev`` at ``now_ns``: passed, mismatches, digest, duration."""
        t0 = time.perf_counter()
        self.backend.begin_poll(now_ns)
        self.backend._device(Handle(int(dev["index"])))  # a lost GPU answers nothing: NVMLError
        passed, mismatches, digest = self.backend.source.canary(int(dev["index"]), now_ns / 1e9)
        return {"passed": int(passed), "mismatches": int(mismatches), "digest": str(digest),
                "duration_seconds": time.perf_counter() - t0}


class TinyNode:
    """A small deterministic node: 8 H200-like GPUs taking turns between idle and a training
    job pinned at the 700 W power limit (clock-event reason SW power cap, as a real H200 does).

    ``t`` is seconds since the epoch; the "driver" loaded at ``t0`` (counters count from there;
    default: one hour before the first ``t`` seen). ``lost``/``stale``: GPU indices that report
    that health.
    """

    model = "NVIDIA H200"
    memory_total = 143771 * 2**20
    period_s = 600.0
    busy_s = 420.0
    links = 18
    link_rate = 6.5e9  # bytes/s each way per NVLink link while the job runs (all-reduce traffic)
    # PCIe link error counters as an idle H200 reported them (nvml_dump.json): constant here
    pcie_errors = {"pcie_l0_to_recovery_total": 325, "pcie_correctable_errors_total": 0,
                   "pcie_naks_received_total": 0, "pcie_receiver_errors_total": 45, "pcie_bad_tlp_total": 68,
                   "pcie_naks_sent_total": 43, "pcie_bad_dllp_total": 3, "pcie_nonfatal_errors_total": 0,
                   "pcie_fatal_errors_total": 0, "pcie_unsupported_requests_total": 0,
                   "pcie_lcrc_errors_total": 0, "pcie_lane_errors_total": 55}

    def __init__(self, n_gpus: int = 8, t0: float | None = None, lost=(), stale=()):
        self.n = n_gpus
        self.t0 = t0
        self.lost, self.stale = set(lost), set(stale)

    def _busy_time(self, t: float, offset: float) -> float:
        """Seconds spent busy in [t0, t] for a GPU whose cycle is shifted by ``offset``."""
        def cum(x):
            cycles, rem = divmod(x + offset, self.period_s)
            return cycles * self.busy_s + min(rem, self.busy_s)
        return max(cum(t - self.t0) - cum(0.0), 0.0)

    def gpus(self, t: float) -> list[dict]:
        if self.t0 is None:
            self.t0 = t - 3600.0
        out = []
        for i in range(self.n):
            offset = i * 7.0  # the job starts a little later on each GPU
            phase = (t - self.t0 + offset) % self.period_s
            busy = phase < self.busy_s
            job = int((t - self.t0 + offset) // self.period_s)
            wobble = math.sin(t / 13.0 + i)  # deterministic, small
            up_s = t - self.t0
            busy_total = self._busy_time(t, offset)
            idle_w, busy_w = 80.0 + i * 0.5, 690.0 + 5.0 * wobble
            temp = 58.0 + i * 0.4 + 2.0 * min(phase / 60.0, 1.0) if busy else 38.0 + i * 0.3
            s = {
                "index": i,
                "uuid": f"GPU-5e1f0a2c-7d31-4b58-9c2e-{0xa0200 + i:012x}",
                "model": self.model,
                "pci_bus_id": f"00000000:{0x18 + i * 0x10:02X}:00.0",
                "health": "lost" if i in self.lost else "stale" if i in self.stale else "up",
                "utilization_gpu_ratio": 0.99 if busy else 0.0,
                "utilization_memory_ratio": 0.24 + 0.01 * wobble if busy else 0.0,
                "memory_used_bytes": (60 << 30) + i * (1 << 20) if busy else 0,
                "memory_total_bytes": self.memory_total,
                "power_watts": busy_w if busy else idle_w,
                "power_instant_watts": (busy_w + 30.0 * wobble) if busy else idle_w + 1.0,
                "power_limit_watts": 700.0,
                "energy_joules_total": busy_total * busy_w + (up_s - busy_total) * idle_w,
                "temperature_gpu_celsius": round(temp),
                "temperature_memory_celsius": round(temp - 8.0 if busy else temp),
                "temperature_slowdown_celsius": 89,
                "temperature_shutdown_celsius": 95,
                "temperature_max_operating_celsius": 87,
                "temperature_memory_max_celsius": 95,
                "clock_sm_mhz": 1500 + round(30 * wobble) if busy else 345,
                "clock_memory_mhz": 3201,
                "clock_sm_max_mhz": 1980,
                "performance_state": 0,
                "clock_event_reasons": 0x4 if busy else 0x1,
                "throttle_sw_power_cap_ns_total": int(busy_total * 1e9),
                "throttle_sw_thermal_ns_total": 0,
                "throttle_hw_thermal_ns_total": 0,
                "throttle_hw_power_brake_ns_total": 0,
                "pcie_link_gen": 5, "pcie_link_gen_max": 5,
                "pcie_link_width": 16, "pcie_link_width_max": 16,
                "pcie_replay_total": 1,
                "ecc_corrected_volatile_total": 0, "ecc_uncorrected_volatile_total": 0,
                "ecc_corrected_aggregate_total": 0, "ecc_uncorrected_aggregate_total": 0,
                "remapped_rows_correctable": 0, "remapped_rows_uncorrectable": 0,
                "remapped_rows_pending": 0, "remapped_rows_failure": 0,
                "mig_mode": 0,
                "process_count": 1 if busy else 0,
                "job_id": str(4000 + job) if busy else None,
                "nvlink": [{"up": 1, "crc_flit_errors_total": 0, "crc_data_errors_total": 0,
                            "replay_errors_total": 0, "recovery_errors_total": 0,
                            "tx_data_bytes_total": int(busy_total * self.link_rate),
                            "rx_data_bytes_total": int(busy_total * self.link_rate)}
                           for _ in range(self.links)],
                # GPM over the last interval: a bf16 training step as the H200 showed it
                # (gpm_probe.json: SM 96 %, tensor 93 %, DRAM 16 %), 0 at idle
                "sm_active_ratio": 0.95 + 0.01 * wobble if busy else 0.0,
                "gr_engine_active_ratio": 0.99 if busy else 0.0,
                "sm_occupancy_ratio": 0.14 if busy else 0.0,
                "tensor_active_ratio": 0.92 + 0.01 * wobble if busy else 0.0,
                "dram_active_ratio": 0.16 if busy else 0.0,
                "pcie_tx_bytes_per_second": (4.3 if busy else 0.3) * 2**20,
                "pcie_rx_bytes_per_second": (12.5 if busy else 0.07) * 2**20,
                "nvlink_tx_bytes_per_second": self.links * self.link_rate if busy else 0.0,
                "nvlink_rx_bytes_per_second": self.links * self.link_rate if busy else 0.0,
                "temperature_margin_celsius": 88 - round(temp),
                "perf_policy_thermal_ns_total": 0, "perf_policy_sync_boost_ns_total": 0,
                "perf_policy_board_limit_ns_total": 0, "perf_policy_reliability_ns_total": 0,
                "perf_policy_low_utilization_ns_total": int((up_s - busy_total) * 1e9),
                "perf_policy_app_clocks_ns_total": int(busy_total * 1e9),
                "perf_policy_base_clocks_ns_total": int(busy_total * 1e9),
                **self.pcie_errors,
            }
            out.append(s)
        return out
