"""What the recorded and simulated backends share: NVML answers looked up per device.

A device's answers are a dict keyed by call, spelled as in the NVML dumps: the function name
alone (``nvmlDeviceGetPowerUsage``) or with its arguments (``nvmlDeviceGetTemperature(0)``,
``nvmlDeviceGetTotalEccErrors(0,1)``). A value is what pynvml would return (in NVML units) or an
:class:`Err` holding the NVML return code the device gave. A call with no answer raises
``NVMLError_NotSupported``: the data is not there, exactly like a GPU that lacks the feature.
Field values (``nvmlDeviceGetFieldValues``) come from ``fields``: field id -> (return code,
value type, value), answered as real ``pynvml.c_nvmlFieldValue_t`` structures.
"""

from __future__ import annotations

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

_VALUE_MEMBER = {
    pynvml.NVML_VALUE_TYPE_DOUBLE: "dVal",
    pynvml.NVML_VALUE_TYPE_UNSIGNED_INT: "uiVal",
    pynvml.NVML_VALUE_TYPE_UNSIGNED_LONG: "ulVal",
    pynvml.NVML_VALUE_TYPE_UNSIGNED_LONG_LONG: "ullVal",
    pynvml.NVML_VALUE_TYPE_SIGNED_LONG_LONG: "sllVal",
    pynvml.NVML_VALUE_TYPE_SIGNED_INT: "siVal",
    pynvml.NVML_VALUE_TYPE_UNSIGNED_SHORT: "usVal",
}


@dataclass(frozen=True, slots=True)
class Err:
    code: int


@dataclass
class DeviceAnswers:
    answers: dict[str, object] = field(default_factory=dict)
    fields: dict[int, tuple[int, int, object]] = field(default_factory=dict)
    fail_all: int | None = None  # every call on this device fails with this code (a lost GPU)


class Handle:
    """An opaque device handle, as ``nvmlDeviceGetHandleByIndex`` gives one."""

    __slots__ = ("index",)

    def __init__(self, index: int):
        self.index = index

    def __repr__(self):
        return f"<handle gpu {self.index}>"


def call_key(func: str, args: tuple) -> str:
    return func if not args else f"{func}({','.join(str(int(a)) for a in args)})"


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
        dev = self._device(handle)
        out = (pynvml.c_nvmlFieldValue_t * len(fieldIds))()
        for i, fid in enumerate(fieldIds):
            fid, scope = (fid if isinstance(fid, tuple) else (fid, 0))
            out[i].fieldId = fid
            out[i].scopeId = scope
            ret, vtype, value = dev.fields.get(fid, (NOT_SUPPORTED, 0, 0))
            out[i].nvmlReturn = ret
            out[i].valueType = vtype
            if ret == pynvml.NVML_SUCCESS:
                setattr(out[i].value, _VALUE_MEMBER.get(vtype, "ullVal"), value)
        return out

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
