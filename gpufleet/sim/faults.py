"""Fault kinds: each declares its modes and what the truth record of one injected fault says.

One class per kind, registered by name in :data:`REGISTRY` (``@register``). The scenario reader
takes a kind's modes from it (the first is the default) and :func:`gpufleet.sim.engine.truth`
asks it for each injected fault's severity, ``impact_at`` and detail; the target (host, GPU,
link, rack) and the start and end come from the fault itself, the same for every kind.
A kind that says nothing else gets the base class's record: a warning from its onset.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, ClassVar

import numpy as np

from gpufleet.records import to_rfc3339

if TYPE_CHECKING:
    from gpufleet.sim.fleet import Fault
    from gpufleet.sim.state import SimState


@dataclass(frozen=True)
class Seen:
    """What a run observed that a truth record needs (times in seconds from ``start``)."""

    start: float  # the run's start, seconds since the epoch
    state: SimState  # every GPU of the fleet, at the end of the run
    first_throttle: np.ndarray  # per GPU: first time its clock was cut at its thermal limit (inf: never)
    hw_throttle: np.ndarray  # per GPU: whether any of that cut was in hardware (HW thermal)


@dataclass(frozen=True)
class Truth:
    """What one injected fault's truth record says beyond its target, start and end."""

    severity: str
    impact_at: float | None  # seconds since the epoch; None: the fault never showed its impact
    detail: str
    kind: str | None = None  # the record's kind where it is not the fault's own


class FaultKind:
    """A fault kind: its name (a ``gpufleet.records.KINDS`` value), modes and truth record."""

    name: ClassVar[str]
    modes: ClassVar[tuple[str, ...]]  # the first is the default
    # its GPUs' throttling is its impact (impact_at), never a thermal_throttle record of its own
    explains_throttling: ClassVar[bool] = False

    @classmethod
    def truth(cls, f: Fault, seen: Seen) -> Truth:
        return Truth(severity="warning", impact_at=seen.start + f.onset,
                     detail=f"{f.mode}, severity {f.severity:g}")


REGISTRY: dict[str, type[FaultKind]] = {}


def register(cls: type[FaultKind]) -> type[FaultKind]:
    """Class decorator: ``cls`` is the fault kind named ``cls.name``."""
    if cls.name in REGISTRY:
        raise ValueError(f"fault kind {cls.name!r} registered twice")
    REGISTRY[cls.name] = cls
    return cls


@register
class CoolingDegradation(FaultKind):
    """Thermal resistance or inlet rising: one record for its scope, ``impact_at`` when any GPU it
    covers began to throttle (from the physics), critical if any throttled in hardware."""

    name = "cooling_degradation"
    modes: ClassVar[tuple[str, ...]] = ("gpu", "node", "rack", "node_idle")
    explains_throttling = True

    @classmethod
    def cause(cls, f: Fault) -> str:
        return {
            "gpu": "GPU heatsink/thermal interface degrading",
            "node": "node fan/coolant failure" + (" on an idle node" if f.mode == "node_idle" else ""),
            "rack": "rack inlet temperature rise",
        }.get(f.scope, "cooling")

    @classmethod
    def truth(cls, f: Fault, seen: Seen) -> Truth:
        sel = seen.state._gpus_of(f)
        ft = seen.first_throttle[sel]
        ft = ft[np.isfinite(ft) & (ft >= f.onset)]
        return Truth(
            severity="critical" if bool(seen.hw_throttle[sel].any()) else "warning",
            impact_at=seen.start + float(ft.min()) if len(ft) else None,
            detail=f"{cls.cause(f)}; growth {f.growth:.0f} s, severity {f.severity:g}",
            kind="cooling_degradation",  # the cause (thermal_throttle: throttling nothing injected caused)
        )


@register
class ThermalThrottle(CoolingDegradation):
    """A sudden loss of the heat sink's contact: scored as the cooling fault it is."""

    name = "thermal_throttle"
    modes = ("heatsink",)

    @classmethod
    def cause(cls, f: Fault) -> str:
        return "sudden cooling loss (heatsink)"


@register
class PowerBrake(FaultKind):
    name = "power_brake"
    modes = ("episodes", "node")

    @classmethod
    def truth(cls, f: Fault, seen: Seen) -> Truth:
        detail = f"{len(f.params['episodes'])} brake episodes of 20-120 s"
        if f.scope == "node":
            detail += ", every GPU of the node (PSU/BMC power brake)"
        return Truth(severity="warning", impact_at=seen.start + f.onset, detail=detail)


@register
class NvlinkDegradation(FaultKind):
    """``impact_at`` the link's first replay; critical if it went down."""

    name = "nvlink_degradation"
    modes = ("escalating",)

    @classmethod
    def truth(cls, f: Fault, seen: Seen) -> Truth:
        assert f.gpu is not None and f.link is not None  # a link fault has both (Fleet._resolve)
        ls = seen.state.links[(int(f.gpu), f.link)]
        impact = seen.start + ls["first_replay"] if "first_replay" in ls else None
        if "down_at" in ls:
            down = to_rfc3339(seen.start + ls["down_at"])
            return Truth(severity="critical", impact_at=impact,
                         detail=f"CRC -> replay -> recovery -> link down at {down}")
        return Truth(severity="warning", impact_at=impact, detail="CRC -> replay -> recovery, link stays up")


@register
class PcieDegradation(FaultKind):
    name = "pcie_degradation"
    modes = ("replay_storm", "width", "gen")

    @classmethod
    def truth(cls, f: Fault, seen: Seen) -> Truth:
        detail = {
            "replay_storm": f"replay storm ~{f.params['rate']:.0f}/s at full growth",
            "width": f"link width x16 -> x{f.params['width']}",
            "gen": f"link generation 5 -> {f.params['gen']}",
        }[f.mode]
        return Truth(severity="warning", impact_at=seen.start + f.onset, detail=detail)


@register
class MemoryErrors(FaultKind):
    """Critical where the memory lost data or a row could not be remapped."""

    name = "memory_errors"
    modes = ("sbe_storm", "remap_pending", "remap_failed", "dbe", "uncontained")
    DETAIL: ClassVar[dict[str, str]] = {
        "sbe_storm": "single-bit ECC storm (XID 92)",
        "remap_pending": "corrected errors, then a row remap pending (XID 63)",
        "remap_failed": "corrected errors, then a failed row remap (XID 64)",
        "dbe": "double-bit error, contained (XID 48, 94, 63), remap pending",
        "uncontained": "double-bit error, uncontained (XID 48, 95), remap pending",
    }

    @classmethod
    def truth(cls, f: Fault, seen: Seen) -> Truth:
        detail = cls.DETAIL[f.mode]
        if f.mode != "sbe_storm":
            detail += f"; escalates at {to_rfc3339(seen.start + f.params['escalate_at'])}"
        severity = "critical" if f.mode in ("remap_failed", "dbe", "uncontained") else "warning"
        return Truth(severity=severity, impact_at=seen.start + f.onset, detail=detail)


@register
class Sdc(FaultKind):
    """Silent data corruption: ``impact_at`` the first failed canary check (None if none failed)."""

    name = "sdc"
    modes = ("canary",)

    @classmethod
    def truth(cls, f: Fault, seen: Seen) -> Truth:
        first = seen.state.first.get(id(f))
        return Truth(severity="critical", impact_at=seen.start + first if first is not None else None,
                     detail=f"canary mismatch probability {f.probability:g} per check")


@register
class GpuLost(FaultKind):
    name = "gpu_lost"
    modes = ("xid79",)

    @classmethod
    def truth(cls, f: Fault, seen: Seen) -> Truth:
        return Truth(severity="critical", impact_at=seen.start + f.onset,
                     detail="XID 79, GPU fell off the bus")


@register
class Straggler(FaultKind):
    name = "straggler"
    modes = ("slow_clock", "slow_memory")

    @classmethod
    def truth(cls, f: Fault, seen: Seen) -> Truth:
        return Truth(severity="warning", impact_at=seen.start + f.onset,
                     detail=f"SM clock held at {1 - 0.13 * f.severity:.0%} of peers, no reason bit")
