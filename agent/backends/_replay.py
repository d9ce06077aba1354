"""What the recorded and simulated backends share: NVML answers looked up per device.

A device's answers are a dict keyed by call, spelled as in the NVML dumps: the function name
alone (``nvmlDeviceGetPowerUsage``) or with its arguments (``nvmlDeviceGetTemperature(0)``,
``nvmlDeviceGetTotalEccErrors(0,1)``). A value is what pynvml would return (in NVML units) or an
:class:`Err` holding the NVML return code the device gave. A call with no answer raises
``NVMLError_NotSupported``: the data is not there, exactly like a GPU that lacks the feature.
Field values (``nvmlDeviceGetFieldValues``) come from ``fields``: field id, or ``(field id, scope id)``
for a scoped one (an NVLink link), -> (return code, value type, value), answered as real
``pynvml.c_nvmlFieldValue_t`` structures.

**GPM** (``nvmlGpmQueryDeviceSupport``, ``nvmlGpmSampleAlloc``/``Get``/``Free``,
``nvmlGpmMetricsGet``): a device whose answers hold ``"gpm"`` (NVML metric id -> value in NVML's
units, percent or MiB/s, over the interval that ends at the sample) supports it; a sample is a
real ``c_nvmlGpmSample_t`` pointer that records the device's ``"gpm"`` answer when taken, and a
metrics call answers sample 2's values into pynvml's own ``c_nvmlGpmMetricsGet_t``. A device
without ``"gpm"`` answers NotSupported. ``gpm_live`` counts the samples allocated and not freed.
"""

from __future__ import annotations

import ctypes
import struct
from dataclasses import dataclass, field

import pynvml

NOT_SUPPORTED = pynvml.NVML_ERROR_NOT_SUPPORTED

# Older and newer spellings of the same NVML call.
ALIASES = {
    "nvmlDeviceGetCurrentClocksEventReasons": ("nvmlDeviceGetCurrentClocksThrottleReasons",),
    "nvmlDeviceGetComputeRunningProcesses": (
        "nvmlDeviceGetComputeRunningProcesses_v3", "nvmlDeviceGetComputeRunningProcesses_v2"),
    "nvmlDeviceGetPciInfo": ("nvmlDeviceGetPciInfo_v3",),
    "nvmlDeviceGetMemoryInfo": ("nvmlDeviceGetMemoryInfo_v2",),
}

_FV_RECORD = struct.Struct("=IIqqIIQ")  # c_nvmlFieldValue_t, the value union as 8 raw bytes
assert ctypes.sizeof(pynvml.c_nvmlFieldValue_t) == _FV_RECORD.size
_M64 = (1 << 64) - 1
_VALUE_PACK = {
    pynvml.NVML_VALUE_TYPE_DOUBLE: lambda v: struct.unpack("=Q", struct.pack("=d", float(v)))[0],
    pynvml.NVML_VALUE_TYPE_UNSIGNED_INT: lambda v: int(v) & 0xFFFFFFFF,
    pynvml.NVML_VALUE_TYPE_UNSIGNED_LONG: lambda v: int(v) & _M64,
    pynvml.NVML_VALUE_TYPE_UNSIGNED_LONG_LONG: lambda v: int(v) & _M64,
    pynvml.NVML_VALUE_TYPE_SIGNED_LONG_LONG: lambda v: int(v) & _M64,
    pynvml.NVML_VALUE_TYPE_SIGNED_INT: lambda v: int(v) & 0xFFFFFFFF,
    pynvml.NVML_VALUE_TYPE_UNSIGNED_SHORT: lambda v: int(v) & 0xFFFF,
}


@dataclass(frozen=True, slots=True)
class Err:
    code: int


@dataclass
class DeviceAnswers:
    answers: dict[str, object] = field(default_factory=dict)
    fields: dict[int | tuple[int, int], tuple[int, int, object]] = field(default_factory=dict)
    fail_all: int | None = None  # every call on this device fails with this code (a lost GPU)


class Handle:
    """An opaque device handle, as ``nvmlDeviceGetHandleByIndex`` gives one."""

    __slots__ = ("index",)

    def __init__(self, index: int):
        self.index = index

    def __repr__(self):
        return f"<handle gpu {self.index}>"


_KEYS: dict[tuple, str] = {}


def call_key(func: str, args: tuple) -> str:
    try:
        return _KEYS[(func, args)]
    except (KeyError, TypeError):  # first time, or arguments that do not hash
        pass
    key = func if not args else f"{func}({','.join(str(int(a)) for a in args)})"
    if len(_KEYS) < 65536:
        try:
            _KEYS[(func, args)] = key
        except TypeError:
            pass
    return key


def _convert(func: str, v):
    if func == "nvmlDeviceGetUtilizationRates":
        return pynvml.c_nvmlUtilization_t(gpu=int(v["gpu"]), memory=int(v["memory"]))
    if func == "nvmlDeviceGetMemoryInfo":
        return pynvml.c_nvmlMemory_t(total=int(v["total"]), free=int(v["free"]), used=int(v["used"]))
    if func == "nvmlDeviceGetComputeRunningProcesses":
        return [pynvml.nvmlFriendlyObject(dict(p)) for p in v]
    if func == "nvmlDeviceGetPciInfo":
        return pynvml.nvmlFriendlyObject(dict(v))
    if func in ("nvmlDeviceGetRemappedRows", "nvmlDeviceGetMigMode"):
        return tuple(v) if func == "nvmlDeviceGetRemappedRows" else list(v)
    if func == "nvmlDeviceGetRetiredPages":
        return list(v)
    return v


class AnswerBackend:
    """Answers NVML calls from per-device :class:`DeviceAnswers` (``self.devices``)."""

    name = "answers"
    proc_root: str | None = None

    def __init__(self):
        self.devices: list[DeviceAnswers] = []
        self.driver_version: str | None = None
        self.init_error: int | None = None
        self._gpm: dict[int, list] = {}  # sample address -> [its buffer, (device index, values) or None]

    # -- GPM -------------------------------------------------------------------------------
    @property
    def gpm_live(self) -> int:
        return len(self._gpm)

    def nvmlGpmQueryDeviceSupport(self, handle):
        dev = self._device(handle)
        if "gpm" not in dev.answers:
            raise pynvml.NVMLError(NOT_SUPPORTED)
        return pynvml.nvmlFriendlyObject({"version": 1, "isSupportedDevice": 1})

    def nvmlGpmSampleAlloc(self):
        buf = ctypes.create_string_buffer(8)
        self._gpm[ctypes.addressof(buf)] = [buf, None]
        return ctypes.cast(buf, pynvml.c_nvmlGpmSample_t)

    def _gpm_entry(self, sample) -> list:
        entry = self._gpm.get(ctypes.cast(sample, ctypes.c_void_p).value or 0)
        if entry is None:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        return entry

    def nvmlGpmSampleFree(self, sample):
        self._gpm_entry(sample)
        del self._gpm[ctypes.cast(sample, ctypes.c_void_p).value]

    def nvmlGpmSampleGet(self, handle, sample):
        dev = self._device(handle)
        entry = self._gpm_entry(sample)
        values = dev.answers.get("gpm")
        if values is None:
            raise pynvml.NVMLError(NOT_SUPPORTED)
        entry[1] = (handle.index, values)
        return sample

    def nvmlGpmMetricsGet(self, req):
        one, two = self._gpm_entry(req.sample1)[1], self._gpm_entry(req.sample2)[1]
        if one is None or two is None or one[0] != two[0]:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        values = two[1]
        for i in range(int(req.numMetrics)):
            m = req.metrics[i]
            v = values.get(int(m.metricId))
            if v is None:
                m.nvmlReturn, m.value = NOT_SUPPORTED, 0.0
            else:
                m.nvmlReturn, m.value = pynvml.NVML_SUCCESS, float(v)
        return req

    # -- library ---------------------------------------------------------------------------
    def nvmlInit(self):
        if self.init_error is not None:
            raise pynvml.NVMLError(self.init_error)

    def nvmlShutdown(self):
        pass

    def nvmlSystemGetDriverVersion(self):
        if self.driver_version is None:
            raise pynvml.NVMLError(NOT_SUPPORTED)
        return self.driver_version

    def nvmlDeviceGetCount(self):
        return len(self.devices)

    def nvmlDeviceGetHandleByIndex(self, index):
        if not 0 <= int(index) < len(self.devices):
            raise pynvml.NVMLError(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        return Handle(int(index))

    # -- devices ---------------------------------------------------------------------------
    def _device(self, handle) -> DeviceAnswers:
        if not isinstance(handle, Handle) or not 0 <= handle.index < len(self.devices):
            raise pynvml.NVMLError(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        dev = self.devices[handle.index]
        if dev.fail_all is not None:
            raise pynvml.NVMLError(dev.fail_all)
        return dev

    def answer(self, func: str, handle, *args):
        dev = self._device(handle)
        key = call_key(func, args)
        v = dev.answers.get(key, _MISSING)
        if v is _MISSING:
            for alias in ALIASES.get(func, ()):
                v = dev.answers.get(call_key(alias, args), _MISSING)
                if v is not _MISSING:
                    break
        if v is _MISSING:
            raise pynvml.NVMLError(NOT_SUPPORTED)
        if isinstance(v, Err):
            raise pynvml.NVMLError(v.code)
        return _convert(func, v)

    def nvmlDeviceGetFieldValues(self, handle, fieldIds):
        """Real ``c_nvmlFieldValue_t`` structures, packed from bytes (pynvml's structure classes
        set every attribute through Python-level hooks)."""
        dev = self._device(handle)
        fields = dev.fields
        buf = bytearray(_FV_RECORD.size * len(fieldIds))
        pack = _FV_RECORD.pack_into
        for i, fid in enumerate(fieldIds):
            if isinstance(fid, tuple):  # (field id, scope id): a scoped answer first
                ans = fields.get(fid)
                fid, scope = fid
            else:
                ans, scope = None, 0
            ret, vtype, value = ans or fields.get(fid, _NO_FIELD)
            raw = _VALUE_PACK[vtype](value) if ret == pynvml.NVML_SUCCESS and vtype in _VALUE_PACK else 0
            pack(buf, i * _FV_RECORD.size, fid, scope, 0, 0, vtype, ret, raw)
        return (pynvml.c_nvmlFieldValue_t * len(fieldIds)).from_buffer_copy(buf)

    def nvmlDeviceGetMigDeviceHandleByIndex(self, handle, index):
        self.answer("nvmlDeviceGetMigDeviceHandleByIndex", handle, index)
        return (handle.index, int(index))

    def __getattr__(self, name: str):
        # Every other nvmlDevice* getter: look the call up in the device's answers.
        if name.startswith("nvmlDevice"):
            def call(handle, *args, _f=name):
                return self.answer(_f, handle, *args)

            call.__name__ = name
            setattr(self, name, call)
            return call
        raise AttributeError(name)


_MISSING = object()
_NO_FIELD = (NOT_SUPPORTED, 0, 0)
