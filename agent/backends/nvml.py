"""The real thing: nvidia-ml-py (``pynvml``), passed through unchanged.

Every ``nvml*`` attribute is the pynvml function of that name; errors are pynvml's own.
"""

from __future__ import annotations


class NvmlBackend:
    name = "nvml"
    proc_root = "/proc"

    def __init__(self):
        import pynvml

        self._nvml = pynvml

    def __getattr__(self, name: str):
        if name.startswith("nvml"):
            fn = getattr(self._nvml, name)
            setattr(self, name, fn)  # resolve once
            return fn
        raise AttributeError(name)

    def describe(self) -> str:
        return "NVML (nvidia-ml-py)"
