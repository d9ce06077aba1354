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

import math
import numbers
import time
import uuid as _uuid

import pynvml

from agent.backends._proctree import ProcTree
from agent.backends._replay import AnswerBackend, DeviceAnswers

_U32, _U64 = pynvml.NVML_VALUE_TYPE_UNSIGNED_INT, pynvml.NVML_VALUE_TYPE_UNSIGNED_LONG_LONG
_FIELDS = (  # catalogue field -> (NVML field id, value type, factor to NVML units)
    ("throttle_sw_power_cap_ns_total", 74, _U64, 1),
    ("throttle_sw_thermal_ns_total", 269, _U64, 1),
    ("throttle_hw_thermal_ns_total", 270, _U64, 1),
    ("throttle_hw_power_brake_ns_total", 271, _U64, 1),
    ("temperature_memory_celsius", 82, _U32, 1),
    ("power_instant_watts", 186, _U32, 1000),
    ("energy_joules_total", 83, _U64, 1000),
)
_CALLS = (  # catalogue field -> (NVML call key, factor to NVML units)
    ("power_watts", "nvmlDeviceGetPowerUsage", 1000),
    ("power_limit_watts", "nvmlDeviceGetEnforcedPowerLimit", 1000),
    ("energy_joules_total", "nvmlDeviceGetTotalEnergyConsumption", 1000),
    ("temperature_gpu_celsius", "nvmlDeviceGetTemperature(0)", 1),
    ("temperature_shutdown_celsius", "nvmlDeviceGetTemperatureThreshold(0)", 1),
    ("temperature_slowdown_celsius", "nvmlDeviceGetTemperatureThreshold(1)", 1),
    ("temperature_memory_max_celsius", "nvmlDeviceGetTemperatureThreshold(2)", 1),
    ("temperature_max_operating_celsius", "nvmlDeviceGetTemperatureThreshold(3)", 1),
    ("clock_sm_mhz", "nvmlDeviceGetClockInfo(1)", 1),
    ("clock_memory_mhz", "nvmlDeviceGetClockInfo(2)", 1),
    ("clock_sm_max_mhz", "nvmlDeviceGetMaxClockInfo(1)", 1),
    ("performance_state", "nvmlDeviceGetPerformanceState", 1),
    ("pcie_link_gen", "nvmlDeviceGetCurrPcieLinkGeneration", 1),
    ("pcie_link_gen_max", "nvmlDeviceGetMaxPcieLinkGeneration", 1),
    ("pcie_link_width", "nvmlDeviceGetCurrPcieLinkWidth", 1),
    ("pcie_link_width_max", "nvmlDeviceGetMaxPcieLinkWidth", 1),
    ("pcie_replay_total", "nvmlDeviceGetPcieReplayCounter", 1),
    ("ecc_corrected_volatile_total", "nvmlDeviceGetTotalEccErrors(0,0)", 1),
    ("ecc_uncorrected_volatile_total", "nvmlDeviceGetTotalEccErrors(1,0)", 1),
    ("ecc_corrected_aggregate_total", "nvmlDeviceGetTotalEccErrors(0,1)", 1),
    ("ecc_uncorrected_aggregate_total", "nvmlDeviceGetTotalEccErrors(1,1)", 1),
    ("retired_pages_pending", "nvmlDeviceGetRetiredPagesPendingStatus", 1),
    ("fan_speed_ratio", "nvmlDeviceGetFanSpeed", 100),
)
_FLAGS = (("clock_event_idle", 0x1), ("clock_event_sw_power_cap", 0x4), ("clock_event_hw_slowdown", 0x8),
          ("clock_event_sync_boost", 0x10), ("clock_event_sw_thermal", 0x20),
          ("clock_event_hw_thermal", 0x40), ("clock_event_hw_power_brake", 0x80))
_LINK_COUNTERS = (("replay_errors_total", pynvml.NVML_NVLINK_ERROR_DL_REPLAY),
                  ("recovery_errors_total", pynvml.NVML_NVLINK_ERROR_DL_RECOVERY),
                  ("crc_flit_errors_total", pynvml.NVML_NVLINK_ERROR_DL_CRC_FLIT),
                  ("crc_data_errors_total", pynvml.NVML_NVLINK_ERROR_DL_CRC_DATA))


# NVML's per-link field ids of the NVLink error counters (links 0..11 have one each)
_LINK_FIELD_PREFIX = (("crc_flit_errors_total", "CRC_FLIT"), ("crc_data_errors_total", "CRC_DATA"),
                      ("replay_errors_total", "REPLAY"), ("recovery_errors_total", "RECOVERY"))
NVLINK_COUNTER_FIELDS = {(name, link): getattr(pynvml, f"NVML_FI_DEV_NVLINK_{kind}_ERROR_COUNT_L{link}")
                         for name, kind in _LINK_FIELD_PREFIX for link in range(32)
                         if hasattr(pynvml, f"NVML_FI_DEV_NVLINK_{kind}_ERROR_COUNT_L{link}")}
_OK = pynvml.NVML_SUCCESS
_LINK_STATE = pynvml.NVML_FI_DEV_NVLINK_GET_STATE
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
    return dev


class SimBackend(AnswerBackend):
    """NVML answered from a node-state source, one snapshot per poll (``begin_poll``)."""

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

    @property
    def proc_root(self) -> str:
        return self._procs.root

    def describe(self) -> str:
        return f"simulated node {type(self.source).__name__} ({len(self.devices)} GPU)"

    def begin_poll(self, now_ns: int | None = None) -> None:
        """Take the node's state at ``now_ns`` (default: now); every answer until the next call
        comes from this snapshot."""
        self.t = (now_ns / 1e9) if now_ns is not None else self._clock()
        states = sorted(self.source.gpus(self.t), key=lambda s: int(s.get("index", 0)))
        self.devices = [state_to_answers(s, self._procs) for s in states]

    def nvmlInit(self):
        super().nvmlInit()
        if self.t is None:
            self.begin_poll()


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
                            "replay_errors_total": 0, "recovery_errors_total": 0}
                           for _ in range(self.links)],
            }
            out.append(s)
        return out
