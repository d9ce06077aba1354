"""Replay what real GPUs said: NVML dumps (JSON) and ``nvidia-smi -q -x`` files (XML).

Two recording shapes are read:

- **NVML dump** (``h200/nvml_dump*.json``): ``calls`` (every single-handle getter: value or the
  NVML error it returned), ``multi``/``args`` (getters with arguments), ``fields`` (every
  ``NVML_FI_*`` id with its return code and value) and, optionally, ``procs`` (the GPU's
  processes with their ``SLURM_*`` environment and cgroup). A JSON object ``{"gpus": [dump, ...]}``
  holds several GPUs.
- **GPM probe** (``h200/gpm_probe.json``): ``rows`` of GPM metrics (percent, MiB/s) once a
  second beside utilization, power and SM clock, plus ``extra_fields`` (field id -> [return code,
  value]). Replayed one row per poll (``begin_poll``; after the last row it starts again): a GPM
  sample taken at a poll carries that row, which holds the metrics over the second before it.
- **nvidia-smi XML** (``nvidia-smi -q -x``, schema v10..v13): one ``<gpu>`` element per GPU.
  Values are converted to what the NVML call behind them returns (W -> mW, MiB -> bytes,
  ``P8`` -> 8, Active flags -> the clock-event bitmask, µs counters -> ns field values).

``N/A`` (or a value that is not there) answers ``NVMLError_NotSupported``, as the GPU did.
"""

from __future__ import annotations

import json
import re
import xml.etree.ElementTree as ET
from pathlib import Path

import pynvml
from gpufleet.agent.backends._proctree import ProcTree
from gpufleet.agent.backends._replay import AnswerBackend, DeviceAnswers, Err

from gpufleet.errors import GpufleetError

_ERRORS = {s.lower(): c for c, s in pynvml.NVMLError._errcode_to_string.items()}
_ERRORS.update({
    "system is not in ready state": pynvml.NVML_ERROR_NOT_READY,
    "no data": pynvml.NVML_ERROR_NO_DATA,
    "timeout": pynvml.NVML_ERROR_TIMEOUT,
})

# nvml_dump.json "multi" entries -> the call they recorded
_MULTI = {
    "clock_sm": "nvmlDeviceGetClockInfo(1)",
    "clock_mem": "nvmlDeviceGetClockInfo(2)",
    "max_clock_sm": "nvmlDeviceGetMaxClockInfo(1)",
    "temp_gpu": "nvmlDeviceGetTemperature(0)",
    "temp_threshold_shutdown": "nvmlDeviceGetTemperatureThreshold(0)",
    "temp_threshold_slowdown": "nvmlDeviceGetTemperatureThreshold(1)",
    "temp_threshold_mem_max": "nvmlDeviceGetTemperatureThreshold(2)",
    "temp_threshold_gpu_max": "nvmlDeviceGetTemperatureThreshold(3)",
    "ecc_volatile_corrected": "nvmlDeviceGetTotalEccErrors(0,0)",
    "ecc_volatile_uncorrected": "nvmlDeviceGetTotalEccErrors(1,0)",
    "ecc_aggregate_corrected": "nvmlDeviceGetTotalEccErrors(0,1)",
    "ecc_aggregate_uncorrected": "nvmlDeviceGetTotalEccErrors(1,1)",
    "retired_pages_sbe": "nvmlDeviceGetRetiredPages(0)",
    "retired_pages_dbe": "nvmlDeviceGetRetiredPages(1)",
    "pcie_tx_kbs": "nvmlDeviceGetPcieThroughput(0)",
    "pcie_rx_kbs": "nvmlDeviceGetPcieThroughput(1)",
}
# The same driver counters, read as field values: used where the dump lacks the call.
_FROM_FIELDS = {
    "nvmlDeviceGetTotalEccErrors(0,0)": 3,  # NVML_FI_DEV_ECC_SBE_VOL_TOTAL
    "nvmlDeviceGetTotalEccErrors(1,0)": 4,  # NVML_FI_DEV_ECC_DBE_VOL_TOTAL
    "nvmlDeviceGetTotalEccErrors(0,1)": 5,  # NVML_FI_DEV_ECC_SBE_AGG_TOTAL
    "nvmlDeviceGetTotalEccErrors(1,1)": 6,  # NVML_FI_DEV_ECC_DBE_AGG_TOTAL
}
_NVLINK_ERR = re.compile(r"nvlink_(\d+)_(NVML_NVLINK_ERROR_\w+)$")
_NVLINK_STATE = re.compile(r"nvlink_state_(\d+)$")


class RecordedBackend(AnswerBackend):
    name = "recorded"

    def __init__(self, path: str | Path):
        super().__init__()
        self.path = Path(path)
        self._procs = ProcTree()
        self._has_procs = False
        self._frames: list[list[dict]] = []  # per device: answers replayed one per poll
        self._frame = -1  # the first poll reads the first row
        self._poll_ns: int | None = None
        if not self.path.is_file():
            raise GpufleetError(f"recording {self.path}: no such file")
        try:
            raw = self.path.read_bytes()
        except OSError as exc:
            raise GpufleetError(f"recording {self.path}: {exc.strerror or exc}") from None
        head = raw.lstrip()[:1]
        if head == b"{":
            self._load_json(raw)
        elif head == b"<":
            self._load_xml(raw)
        else:
            raise GpufleetError(f"recording {self.path}: neither an NVML dump (JSON) nor nvidia-smi XML")
        if not self.devices:
            raise GpufleetError(f"recording {self.path}: holds no GPU")

    def describe(self) -> str:
        return f"recording {self.path.name} ({len(self.devices)} GPU)"

    @property
    def proc_root(self) -> str | None:
        return self._procs.root if self._has_procs else None

    def begin_poll(self, now_ns: int | None = None) -> None:
        """A recording of several rows moves to its next row at each poll (a second call for the
        same time is free); a single snapshot stays as it is."""
        if not self._frames or (now_ns is not None and now_ns == self._poll_ns):
            return
        self._poll_ns = now_ns
        self._frame += 1
        for dev, frames in zip(self.devices, self._frames, strict=True):
            if frames:
                dev.answers.update(frames[self._frame % len(frames)])

    # -- NVML dumps ------------------------------------------------------------------------
    def _load_json(self, raw: bytes) -> None:
        try:
            data = json.loads(raw)
        except (ValueError, UnicodeDecodeError) as exc:
            raise GpufleetError(f"recording {self.path}: garbled JSON ({exc})") from None
        if isinstance(data, dict) and isinstance(data.get("rows"), list) and "gpm_supported" in data:
            self._load_gpm_probe(data)
            return
        dumps = data.get("gpus") if isinstance(data, dict) and "gpus" in data else [data]
        if not isinstance(dumps, list):
            raise GpufleetError(f"recording {self.path}: 'gpus' is not a list")
        for n, dump in enumerate(dumps):
            if not isinstance(dump, dict) or not isinstance(dump.get("calls"), dict):
                raise GpufleetError(
                    f"recording {self.path}: GPU #{n} has no 'calls' section (not an NVML dump)")
            try:
                self.devices.append(self._dump_device(dump, n))
            except (TypeError, ValueError, KeyError, AttributeError) as exc:
                raise GpufleetError(f"recording {self.path}: GPU #{n}: malformed entry ({exc})") from None

    def _load_gpm_probe(self, data: dict) -> None:
        from gpufleet.agent.collectors.gpu import GPM_METRICS

        by_name = {name: mid for mid, name in GPM_METRICS.items()}
        cols = {  # gpm_probe.json column -> the catalogue field of that GPM metric
            "sm_util": "sm_active_ratio", "graphics_util": "gr_engine_active_ratio",
            "sm_occupancy": "sm_occupancy_ratio", "any_tensor_util": "tensor_active_ratio",
            "dram_bw_util": "dram_active_ratio", "pcie_tx_mib_s": "pcie_tx_bytes_per_second",
            "pcie_rx_mib_s": "pcie_rx_bytes_per_second", "nvlink_tx_mib_s": "nvlink_tx_bytes_per_second",
            "nvlink_rx_mib_s": "nvlink_rx_bytes_per_second"}
        dev = DeviceAnswers()
        if data.get("name"):
            dev.answers["nvmlDeviceGetName"] = str(data["name"])
        self.driver_version = data.get("driver")
        try:
            for fid, (ret, value) in (data.get("extra_fields") or {}).items():
                dev.fields[int(fid)] = (int(ret), pynvml.NVML_VALUE_TYPE_UNSIGNED_LONG_LONG, int(value))
            frames = []
            for row in data["rows"]:
                util = {"gpu": int(row["util_gpu"]), "memory": int(row["util_mem"])}
                a = {"nvmlDeviceGetUtilizationRates": util,
                     "nvmlDeviceGetPowerUsage": int(round(float(row["power_w"]) * 1000)),
                     "nvmlDeviceGetClockInfo(1)": int(row["sm_mhz"])}
                if int(data["gpm_supported"]) == 1:
                    a["gpm"] = {by_name[f]: float(row[c]) for c, f in cols.items() if row.get(c) is not None}
                frames.append(a)
        except (TypeError, ValueError, KeyError, AttributeError) as exc:
            raise GpufleetError(f"recording {self.path}: malformed GPM probe ({exc})") from None
        if not frames:
            raise GpufleetError(f"recording {self.path}: GPM probe without rows")
        dev.answers.update(frames[0])
        self.devices.append(dev)
        self._frames.append(frames)

    @staticmethod
    def _result(entry):
        if not isinstance(entry, dict):
            raise ValueError(f"entry {entry!r} is not an object")
        if entry.get("ok"):
            return entry.get("value")
        return Err(_ERRORS.get(str(entry.get("error", "")).lower(), pynvml.NVML_ERROR_UNKNOWN))

    def _dump_device(self, dump: dict, n: int) -> DeviceAnswers:
        dev = DeviceAnswers()
        for name, entry in dump["calls"].items():
            dev.answers[name] = self._result(entry)
        for name, entry in (dump.get("args") or {}).items():
            dev.answers[name.replace(" ", "")] = self._result(entry)
        for name, entry in (dump.get("multi") or {}).items():
            if name in _MULTI:
                dev.answers[_MULTI[name]] = self._result(entry)
            elif m := _NVLINK_STATE.match(name):
                dev.answers[f"nvmlDeviceGetNvLinkState({m.group(1)})"] = self._result(entry)
            elif m := _NVLINK_ERR.match(name):
                counter = getattr(pynvml, m.group(2), None)
                if counter is not None:
                    key = f"nvmlDeviceGetNvLinkErrorCounter({m.group(1)},{counter})"
                    dev.answers[key] = self._result(entry)
        for entry in (dump.get("fields") or {}).values():
            fid = int(entry["id"])
            ret = int(entry.get("ret", pynvml.NVML_ERROR_UNKNOWN))
            dev.fields[fid] = (ret, int(entry.get("valueType", 3)), entry.get("value", 0))
        for key, fid in _FROM_FIELDS.items():
            if key not in dev.answers and dev.fields.get(fid, (1,))[0] == pynvml.NVML_SUCCESS:
                dev.answers[key] = int(dev.fields[fid][2])
        procs = dump.get("procs")
        if isinstance(procs, list):
            for p in procs:
                self._procs.set(int(p["pid"]), environ=p.get("slurm_env") or {}, cgroup=p.get("cgroup"))
                self._has_procs = True
        return dev

    # -- nvidia-smi -q -x ------------------------------------------------------------------
    def _load_xml(self, raw: bytes) -> None:
        try:
            root = ET.fromstring(raw)
        except ET.ParseError as exc:
            raise GpufleetError(f"recording {self.path}: garbled XML ({exc})") from None
        if root.tag != "nvidia_smi_log":
            raise GpufleetError(f"recording {self.path}: <{root.tag}> is not an nvidia-smi -q -x log")
        self.driver_version = _text(root, "driver_version")
        for n, gpu in enumerate(root.findall("gpu")):
            try:
                self.devices.append(_xml_device(gpu, n))
            except (TypeError, ValueError) as exc:
                raise GpufleetError(f"recording {self.path}: GPU #{n}: malformed value ({exc})") from None


def _text(el, path: str) -> str | None:
    """The text at ``path``; None when absent, empty, N/A or 'Requested functionality...'."""
    node = el.find(path)
    if node is None or node.text is None:
        return None
    t = node.text.strip()
    if not t or t in ("N/A", "Unknown Error", "[N/A]") or t.startswith("Requested functionality") \
            or t.startswith("Not Supported") or t.startswith("[Not Supported]"):
        return None
    return t


_NUM = re.compile(r"^\s*([-+]?\d+(?:\.\d+)?)\s*([A-Za-z/%()]*)")
_SCALE = {"": 1, "W": 1000, "MiB": 2**20, "KiB": 2**10, "GiB": 2**30, "C": 1, "MHz": 1, "%": 1,
          "x": 1, "us": 1000, "bank(s)": 1, "KB/s": 1}


def _num(el, path: str) -> int | None:
    """A number with its unit converted to NVML's (W -> mW, MiB -> B, us -> ns); None when N/A."""
    t = _text(el, path)
    if t is None:
        return None
    m = _NUM.match(t)
    if not m:
        return None
    unit = m.group(2)
    if unit not in _SCALE:
        raise ValueError(f"{path}: unit {unit!r} of {t!r}")
    return int(round(float(m.group(1)) * _SCALE[unit]))


def _first(el, *paths) -> int | None:
    for p in paths:
        v = _num(el, p)
        if v is not None:
            return v
    return None


def _yes(el, path: str) -> int | None:
    t = _text(el, path)
    if t is None:
        return None
    return 1 if t.lower() in ("yes", "enabled", "active") else 0


_REASON_BITS = {
    "gpu_idle": 0x1, "applications_clocks_setting": 0x2, "sw_power_cap": 0x4, "hw_slowdown": 0x8,
    "sync_boost": 0x10, "sw_thermal_slowdown": 0x20, "hw_thermal_slowdown": 0x40,
    "hw_power_brake_slowdown": 0x80, "display_clocks_setting": 0x100,
}
_COUNTER_FIELDS = {  # clocks_event_reasons_counters_* (µs) -> NVML field id (ns)
    "sw_power_cap": 74, "sw_therm_slowdown": 269, "hw_therm_slowdown": 270, "hw_power_brake": 271,
}


def _xml_device(g, n: int) -> DeviceAnswers:
    dev = DeviceAnswers()
    a = dev.answers

    def put(key, value):
        if value is not None:
            a[key] = value

    put("nvmlDeviceGetName", _text(g, "product_name"))
    put("nvmlDeviceGetUUID", _text(g, "uuid"))
    put("nvmlDeviceGetIndex", n)
    bus = g.get("id") or _text(g, "pci/pci_bus_id")
    if bus:
        a["nvmlDeviceGetPciInfo"] = {"busId": bus, "busIdLegacy": bus}
    put("nvmlDeviceGetSerial", _text(g, "serial"))
    put("nvmlDeviceGetVbiosVersion", _text(g, "vbios_version"))

    gu, mu = _num(g, "utilization/gpu_util"), _num(g, "utilization/memory_util")
    if gu is not None and mu is not None:
        a["nvmlDeviceGetUtilizationRates"] = {"gpu": gu, "memory": mu}
    total, used, free = (_num(g, f"fb_memory_usage/{k}") for k in ("total", "used", "free"))
    if total is not None and used is not None:
        a["nvmlDeviceGetMemoryInfo"] = {"total": total, "used": used,
                                        "free": free if free is not None else total - used}

    put("nvmlDeviceGetPowerUsage", _first(g, "power_readings/power_draw", "gpu_power_readings/power_draw",
                                          "gpu_power_readings/average_power_draw"))
    put("nvmlDeviceGetEnforcedPowerLimit", _first(g, "power_readings/enforced_power_limit",
                                                  "gpu_power_readings/current_power_limit"))
    put("nvmlDeviceGetPowerManagementDefaultLimit", _first(g, "power_readings/default_power_limit",
                                                           "gpu_power_readings/default_power_limit"))
    put("nvmlDeviceGetTemperature(0)", _num(g, "temperature/gpu_temp"))
    put("nvmlDeviceGetTemperatureThreshold(0)", _num(g, "temperature/gpu_temp_max_threshold"))
    put("nvmlDeviceGetTemperatureThreshold(1)", _num(g, "temperature/gpu_temp_slow_threshold"))
    put("nvmlDeviceGetTemperatureThreshold(2)", _num(g, "temperature/gpu_temp_max_mem_threshold"))
    put("nvmlDeviceGetTemperatureThreshold(3)", _num(g, "temperature/gpu_temp_max_gpu_threshold"))
    put("nvmlDeviceGetClockInfo(0)", _num(g, "clocks/graphics_clock"))
    put("nvmlDeviceGetClockInfo(1)", _num(g, "clocks/sm_clock"))
    put("nvmlDeviceGetClockInfo(2)", _num(g, "clocks/mem_clock"))
    put("nvmlDeviceGetMaxClockInfo(1)", _num(g, "max_clocks/sm_clock"))
    put("nvmlDeviceGetMaxClockInfo(2)", _num(g, "max_clocks/mem_clock"))
    ps = _text(g, "performance_state")
    if ps and re.fullmatch(r"P\d+", ps):
        a["nvmlDeviceGetPerformanceState"] = int(ps[1:])
    fan = _num(g, "fan_speed")
    put("nvmlDeviceGetFanSpeed", fan)

    for section, prefix in (("clocks_event_reasons", "clocks_event_reason_"),
                            ("clocks_throttle_reasons", "clocks_throttle_reason_")):
        node = g.find(section)
        if node is None:
            continue
        mask, seen = 0, False
        for name, bit in _REASON_BITS.items():
            v = _yes(node, prefix + name)
            if v is not None:
                seen = True
                mask |= bit if v else 0
        if seen:
            a["nvmlDeviceGetCurrentClocksEventReasons"] = mask
    for name, fid in _COUNTER_FIELDS.items():
        v = _num(g, f"clocks_event_reasons_counters/clocks_event_reasons_counters_{name}")
        if v is not None:
            dev.fields[fid] = (pynvml.NVML_SUCCESS, pynvml.NVML_VALUE_TYPE_UNSIGNED_LONG_LONG, v)
    mt = _num(g, "temperature/memory_temp")
    if mt is not None:
        dev.fields[82] = (pynvml.NVML_SUCCESS, pynvml.NVML_VALUE_TYPE_UNSIGNED_INT, mt)
    ip = _num(g, "gpu_power_readings/instant_power_draw")
    if ip is not None:
        dev.fields[186] = (pynvml.NVML_SUCCESS, pynvml.NVML_VALUE_TYPE_UNSIGNED_INT, ip)

    link = "pci/pci_gpu_link_info"
    put("nvmlDeviceGetCurrPcieLinkGeneration", _num(g, f"{link}/pcie_gen/current_link_gen"))
    put("nvmlDeviceGetMaxPcieLinkGeneration", _num(g, f"{link}/pcie_gen/max_link_gen"))
    put("nvmlDeviceGetCurrPcieLinkWidth", _num(g, f"{link}/link_widths/current_link_width"))
    put("nvmlDeviceGetMaxPcieLinkWidth", _num(g, f"{link}/link_widths/max_link_width"))
    put("nvmlDeviceGetPcieReplayCounter", _num(g, "pci/replay_counter"))
    put("nvmlDeviceGetPcieThroughput(0)", _num(g, "pci/tx_util"))
    put("nvmlDeviceGetPcieThroughput(1)", _num(g, "pci/rx_util"))

    # ECC totals: the old schema's single_bit/double_bit totals, or the sum over SRAM and DRAM.
    for counter, scope in ((0, "volatile"), (1, "aggregate")):
        for err, old, new in ((0, "single_bit/total", ("sram_correctable", "dram_correctable")),
                              (1, "double_bit/total", ("sram_uncorrectable", "sram_uncorrectable_parity",
                                                       "sram_uncorrectable_secded", "dram_uncorrectable"))):
            v = _num(g, f"ecc_errors/{scope}/{old}")
            if v is None:
                parts = [_num(g, f"ecc_errors/{scope}/{k}") for k in new]
                parts = [p for p in parts if p is not None]
                v = sum(parts) if parts else None
            put(f"nvmlDeviceGetTotalEccErrors({err},{counter})", v)

    for cause, path in ((0, "multiple_single_bit_retirement"), (1, "double_bit_retirement")):
        count = _num(g, f"retired_pages/{path}/retired_count")
        if count is not None:
            a[f"nvmlDeviceGetRetiredPages({cause})"] = [0] * count
    put("nvmlDeviceGetRetiredPagesPendingStatus", _yes(g, "retired_pages/pending_retirement"))
    rr = [_num(g, "remapped_rows/remapped_row_corr"), _num(g, "remapped_rows/remapped_row_unc"),
          _yes(g, "remapped_rows/remapped_row_pending"), _yes(g, "remapped_rows/remapped_row_failure")]
    if all(v is not None for v in rr):
        a["nvmlDeviceGetRemappedRows"] = rr

    cur, pend = _yes(g, "mig_mode/current_mig"), _yes(g, "mig_mode/pending_mig")
    if cur is not None:
        a["nvmlDeviceGetMigMode"] = [cur, pend if pend is not None else cur]
        migs = g.findall("mig_devices/mig_device")
        a["nvmlDeviceGetMaxMigDeviceCount"] = len(migs)
        for i in range(len(migs)):
            a[f"nvmlDeviceGetMigDeviceHandleByIndex({i})"] = True

    procs = g.find("processes")
    if procs is not None:
        out = []
        for p in procs.findall("process_info"):
            kind = _text(p, "type") or ""
            pid = _num(p, "pid")
            if "C" in kind and pid is not None:
                out.append({"pid": pid, "usedGpuMemory": _num(p, "used_memory"),
                            "gpuInstanceId": 0xFFFFFFFF, "computeInstanceId": 0xFFFFFFFF})
        a["nvmlDeviceGetComputeRunningProcesses"] = out
    return dev
