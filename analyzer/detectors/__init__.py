"""Detectors: one module per fault kind, all with the contract in ``base``.

``REGISTRY`` is the one list of them: adding a detector is its module plus its line here. Its
class declares its facts (parameters, fields, summary, severity, page panels); the config's
defaults, the parser's field list, the engine's summaries and the incident pages derive them.
"""

from __future__ import annotations

from gpufleet.analyzer.detectors.base import Detector, Hits
from gpufleet.analyzer.detectors.cooling_degradation import CoolingDegradation
from gpufleet.analyzer.detectors.gpu_lost import GpuLost
from gpufleet.analyzer.detectors.inlet_above_room import InletAboveRoom
from gpufleet.analyzer.detectors.memory_errors import MemoryErrors
from gpufleet.analyzer.detectors.nvlink_degradation import NvlinkDegradation
from gpufleet.analyzer.detectors.pcie_degradation import PcieDegradation
from gpufleet.analyzer.detectors.power_brake import PowerBrake
from gpufleet.analyzer.detectors.power_limit_below_peers import PowerLimitBelowPeers
from gpufleet.analyzer.detectors.sdc import SilentDataCorruption
from gpufleet.analyzer.detectors.sdc_unchecked import CanaryUnchecked
from gpufleet.analyzer.detectors.straggler import Straggler
from gpufleet.analyzer.detectors.thermal_throttle import ThermalThrottle

REGISTRY: dict[str, type[Detector]] = {
    c.kind: c
    for c in (
        ThermalThrottle,
        CoolingDegradation,
        PowerBrake,
        NvlinkDegradation,
        PcieDegradation,
        MemoryErrors,
        SilentDataCorruption,
        CanaryUnchecked,
        GpuLost,
        Straggler,
        PowerLimitBelowPeers,
        InletAboveRoom,
    )
}


def build(params: dict[str, dict], poll_seconds: float = 10.0) -> list[Detector]:
    """One detector per registered kind, with its ``[detectors.KIND]`` parameters (``params``) and
    the analyzer's settings it declares in its ``context``."""
    context = {"poll_seconds": poll_seconds}
    out = []
    for kind, cls in REGISTRY.items():
        p = dict(params.get(kind, {}))
        for k in cls.context:
            if k in context:
                p.setdefault(k, context[k])
        out.append(cls(**p))
    return out


__all__ = ["Detector", "Hits", "REGISTRY", "build"]
