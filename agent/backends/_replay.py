"""What the recorded and simulated backends share: NVML answers looked up per device.

A device's answers are a dict keyed by call, spelled as in the NVML dumps: the function name
alone (``nvmlDeviceGetPowerUsage``) or with its arguments (``nvmlDeviceGetTemperature(0)``,
``nvmlDeviceGetTotalEccErrors(0,1)``). A value is what pynvml would return (in NVML units) or an
:class:`Err` holding the NVML return code the device gave. A call with no answer raises
``NVMLError_NotSupported``: the data is not there, exactly like a GPU that lacks the feature.
Field values (``nvmlDeviceGetFieldValues``) come from ``fields``: field id, or ``(field id, scope id)``
for a scoped one (an NVLink link), -> (return code, value type, value), answered as real
``pynvml.c_nvmlFieldValue_t`` structures.
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
