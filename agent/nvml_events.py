"""The NVML event follower: a thread that waits on an NVML event set and queues what it gets.

``nvmlEventSetCreate``, then ``nvmlDeviceRegisterEvents`` per GPU for the supported subset of XID
critical errors, single/double-bit ECC, DRAM retirement (event and failure), poison errors, GPU
unavailable and recovery-action events, then ``nvmlEventSetWait`` with a short timeout in a loop.
Each event is queued as ``(time_ns, gpu index, type, data)`` until its reader (the XID collector,
:mod:`gpufleet.agent.collectors.xid`) takes it.
"""

from __future__ import annotations

import ctypes
import queue
import threading
import time

from gpufleet.net import backoff_delay


def _event_type_names() -> dict[int, str]:
    """NVML event type bit -> the row's ``type`` tag, for the bits this nvidia-ml-py knows."""
    import pynvml

    names = {
        "nvmlEventTypeXidCriticalError": "xid",
        "nvmlEventTypeSingleBitEccError": "ecc_sbe",
        "nvmlEventTypeDoubleBitEccError": "ecc_dbe",
        "nvmlEventTypeSingleBitEccErrorStorm": "ecc_sbe_storm",
        "nvmlEventTypeDramRetirementEvent": "dram_retirement",
        "nvmlEventTypeDramRetirementFailure": "dram_retirement_failure",
        "nvmlEventTypeNonFatalPoisonError": "poison_nonfatal",
        "nvmlEventTypeFatalPoisonError": "poison_fatal",
        "nvmlEventTypeGpuUnavailableError": "gpu_unavailable",
        "nvmlEventTypeGpuRecoveryAction": "recovery_action",
    }
    return {getattr(pynvml, k): v for k, v in names.items() if hasattr(pynvml, k)}


def _device_key(h):
    """A hashable key for an NVML device handle (the pointer's value for a ctypes handle), so an
    event's ``device`` finds the GPU index its handle was registered under."""
    try:
        return ctypes.cast(h, ctypes.c_void_p).value
    except (TypeError, ctypes.ArgumentError):
        return h if getattr(type(h), "__hash__", None) else id(h)


class NvmlEventThread(threading.Thread):
    """Waits on an NVML event set and queues (time_ns, gpu index, type, code) tuples."""

    def __init__(self, backend, handles: dict, out: queue.Queue, wait_ms: int = 500):
        super().__init__(name="gpufleet-nvml-events", daemon=True)
        self.backend, self.handles, self.out, self.wait_ms = backend, handles, out, wait_ms
        self.stop_event = threading.Event()
        self.status = "starting"
        self.registered: dict[int, int] = {}  # gpu index -> event mask registered
        self.ready = threading.Event()

    def run(self) -> None:
        import pynvml

        types = _event_type_names()
        wanted = 0
        for t in types:
            wanted |= t
        try:
            es = self.backend.nvmlEventSetCreate()
        except (pynvml.NVMLError, AttributeError, TypeError) as exc:
            self.status = f"unavailable: nvmlEventSetCreate: {exc}"
            self.ready.set()
            return
        keys = {}
        for idx, h in self.handles.items():
            try:
                supported = int(self.backend.nvmlDeviceGetSupportedEventTypes(h))
            except (pynvml.NVMLError, AttributeError, TypeError):
                supported = wanted
            mask = supported & wanted
            if not mask:
                continue
            try:
                self.backend.nvmlDeviceRegisterEvents(h, mask, es)
            except pynvml.NVMLError:
                # some bits refused: fall back to XID only
                try:
                    mask = mask & getattr(pynvml, "nvmlEventTypeXidCriticalError", 8)
                    self.backend.nvmlDeviceRegisterEvents(h, mask, es)
                except pynvml.NVMLError:
                    continue
            self.registered[idx] = mask
            keys[_device_key(h)] = idx
        self.status = "registered" if self.registered else "unavailable: no GPU accepted event registration"
        self.ready.set()
        if not self.registered:
            self._free(es)
            return
        wait = getattr(self.backend, "nvmlEventSetWait_v2", None) or self.backend.nvmlEventSetWait
        errors = 0
        while not self.stop_event.is_set():
            try:
                data = wait(es, self.wait_ms)
            except pynvml.NVMLError_Timeout:
                errors = 0
                continue
            except pynvml.NVMLError as exc:
                errors += 1
                self.status = f"wait failed: {exc}"
                if self.stop_event.wait(backoff_delay(errors, 1.0, 30.0, jitter=False)):
                    break
                continue
            now = getattr(data, "timestamp_ns", None) or time.time_ns()  # a backend's own event time
            etype = int(data.eventType)
            idx = keys.get(_device_key(data.device))
            if idx is None:
                try:
                    idx = int(self.backend.nvmlDeviceGetIndex(data.device))
                except Exception:  # noqa: BLE001 - an unknown handle still records the event
                    idx = None
            self.out.put((now, idx, types.get(etype, f"nvml_{etype}"), int(data.eventData)))
        self._free(es)

    def _free(self, es) -> None:
        try:
            self.backend.nvmlEventSetFree(es)
        except Exception:  # noqa: BLE001 - best effort at shutdown
            pass

