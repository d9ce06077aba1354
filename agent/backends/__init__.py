"""NVML backends: the hardware is passed in.

A backend is an object with the nvidia-ml-py function names the GPU collector calls
(``nvmlInit``, ``nvmlDeviceGetCount``, ``nvmlDeviceGetHandleByIndex``, ``nvmlDeviceGetTemperature``,
``nvmlDeviceGetFieldValues``, ...) that answers in NVML's own units (mW, mJ, percent, MHz) and fails
by raising real ``pynvml.NVMLError`` instances (``NVMLError_NotSupported``, ``NVMLError_GpuIsLost``,
...). Three exist:

- ``nvml``: nvidia-ml-py itself (:mod:`gpufleet.agent.backends.nvml`);
- ``recorded:PATH``: replays what a real GPU said, from an NVML dump (JSON) or an
  ``nvidia-smi -q -x`` file (:mod:`gpufleet.agent.backends.recorded`);
- ``sim``: answers from simulated GPU state (:mod:`gpufleet.agent.backends.sim`).

Optional members a backend may have, which the collector uses when present:

- ``begin_poll(now_ns)``: called at the start of every poll with the tick's time (the simulator
  takes its snapshot of the node there; the daemon calls it once per tick for all collectors
  sharing the backend, and a second call for the same time is free);
- ``canary_engine()``: a canary engine of the backend's own, or None (the sim backend's gives
  the simulated node's verdicts; see :mod:`gpufleet.agent.collectors.canary`);
- the NVML event-set calls (``nvmlEventSetCreate``, ``nvmlDeviceRegisterEvents``,
  ``nvmlEventSetWait[_v2]``, ...) for the XID collector; event data may carry ``timestamp_ns``,
  the event's own time;
- ``proc_root``: where ``/proc/<pid>`` of the GPU processes can be read for job attribution
  (``"/proc"`` for real NVML, a synthesised tree for recordings and the simulator, None: none).
"""

from __future__ import annotations

from pathlib import Path

from gpufleet.errors import GpufleetError

SPECS = "nvml | sim | recorded:PATH"


def get_backend(spec: str, *, sim_node=None):
    """Build the backend a spec names: ``"nvml"``, ``"sim"`` or ``"recorded:PATH"``.

    ``sim_node`` is the node-state source of the ``sim`` backend (any object with
    ``gpus(t) -> list[dict]``); the default is the small :class:`gpufleet.agent.backends.sim.TinyNode`.
    A bad spec, a missing file or a garbled recording raises :class:`GpufleetError`.
    """
    if not isinstance(spec, str) or not spec.strip():
        raise GpufleetError(f"empty backend; expected {SPECS}")
    spec = spec.strip()
    if spec == "nvml":
        from gpufleet.agent.backends.nvml import NvmlBackend

        return NvmlBackend()
    if spec == "sim":
        from gpufleet.agent.backends.sim import SimBackend, TinyNode

        return SimBackend(sim_node if sim_node is not None else TinyNode())
    if spec.startswith("recorded:"):
        path = spec[len("recorded:"):]
        if not path:
            raise GpufleetError("recorded: needs a path, e.g. recorded:nvsmi_q.xml")
        from gpufleet.agent.backends.recorded import RecordedBackend

        return RecordedBackend(Path(path))
    raise GpufleetError(f"unknown backend {spec!r}; expected {SPECS}")
