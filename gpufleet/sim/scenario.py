"""Scenario files (TOML): the fleet, its workload, telemetry cadence, nuisances and faults.

Built-in scenarios live in ``gpufleet/sim/scenarios/NAME.toml``; any other path is read as a
custom scenario. The format is documented in docs/faults.md; every key is optional.
"""

from __future__ import annotations

import tomllib
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path

from gpufleet.errors import GpufleetError
from gpufleet.sim.faults import REGISTRY as FAULT_KINDS
from gpufleet.sim.units import parse_duration
from gpufleet.times import parse_time

BUILTIN = ("healthy", "thermal", "link", "memory", "sdc", "mixed", "chaos", "straggler")

FLEET = {
    "nodes": 8,
    "gpus_per_node": 8,
    "nodes_per_rack": 4,
    "racks_per_cluster": 8,
    "start": "2026-11-20T00:00:00Z",
    "model": "NVIDIA H200",
    "generations": [],  # other GPU models beside it: [[model, share of the nodes], ...]
}
WORKLOAD = {"busy": 0.85, "job_hours": [0.5, 4.0], "job_nodes": [1, 1, 2, 2, 4], "fleet_idle": []}
# cadences as the agent's defaults (gpu.slow_interval 60 s, gpu.nvlink_interval 30 s); an integer is steps
TELEMETRY = {"slow_every": "60s", "nvlink_full_every": "30s", "canary_every": "5m", "missing_rate": 0.0002}
NUISANCES = {
    "inlet_c": 24.0,
    "inlet_diurnal_c": 1.5,
    "inlet_drift_c": 0.8,
    "driver_reloads": 0,
    "agent_restarts": 0,
    "late_batches": 0,
    "node_churn": 0,
    "background_sbe_per_gpu_day": 0.02,
    "collective_waits": 0,  # episodes of a job waiting in a collective on one GPU (gpufleet.sim.activity)
    # what healthy links do (docs/faults.md): sporadic CRC errors the replay mechanism corrects, a
    # rare burst, a rare replay; PCIe replays a few an hour
    "nvlink_crc_per_link_hour": 1.0,
    "nvlink_crc_bursts_per_link_day": 0.5,
    "nvlink_replays_per_link_day": 0.1,
    "pcie_replays_per_gpu_hour": 2.0,
    # site life (no truth): an operator lowering a node's power limit for hours, maintenance drains
    # (a node idle, no job), job restarts (all GPUs of a job idle together for minutes), racks whose
    # inlet runs warmer than the room's all day by about warm_rack_c
    "power_caps": 0,
    "drains": 0,
    "job_restarts": 0,
    "warm_racks": 0,
    "warm_rack_c": 5.0,
}
FAULT_KEYS = {
    "kind",
    "count",
    "host",
    "gpu",
    "link",
    "rack",
    "mode",
    "onset",
    "growth",
    "duration",
    "severity",
    "probability",
}


@dataclass
class FaultSpec:
    kind: str
    count: int = 1
    mode: str | None = None
    host: str | None = None
    gpu: int | None = None
    link: int | None = None
    rack: str | None = None
    onset: tuple[float, float] | None = None  # seconds, or negative = share of the run (encoded)
    growth: float | None = None
    duration: float | None = None
    severity: float = 1.0
    probability: float | None = None


@dataclass
class Scenario:
    name: str
    description: str = ""
    fleet: dict = field(default_factory=lambda: dict(FLEET))
    workload: dict = field(default_factory=lambda: dict(WORKLOAD))
    telemetry: dict = field(default_factory=lambda: dict(TELEMETRY))
    nuisances: dict = field(default_factory=lambda: dict(NUISANCES))
    faults: list[FaultSpec] = field(default_factory=list)
    source: str = ""


def _when(value, where: str) -> float:
    """A time inside the run: '2h' (offset) -> seconds; '30%' or 0.3 (share) -> -share (resolved later)."""
    if isinstance(value, str) and value.strip().endswith("%"):
        try:
            share = float(value.strip()[:-1]) / 100
        except ValueError:
            raise GpufleetError(f"{where}: bad share {value!r}") from None
        if not 0 <= share <= 1:
            raise GpufleetError(f"{where}: share {value!r} outside 0%..100%")
        return -share if share > 0 else -1e-12
    return parse_duration(value, where)


def _merge(defaults: dict, got, section: str, src: str) -> dict:
    if got is None:
        return dict(defaults)
    if not isinstance(got, dict):
        raise GpufleetError(f"{src}: [{section}] must be a table")
    unknown = set(got) - set(defaults)
    if unknown:
        raise GpufleetError(f"{src}: [{section}] unknown key(s) {', '.join(sorted(unknown))}")
    out = dict(defaults)
    out.update(got)
    return out


def _num(d: dict, key: str, src: str, lo: float = 0, hi: float = float("inf"), integer: bool = False):
    v = d[key]
    if isinstance(v, bool) or not isinstance(v, int | float) or (integer and not isinstance(v, int)):
        raise GpufleetError(f"{src}: {key} must be a{'n integer' if integer else ' number'}, got {v!r}")
    if not lo <= v <= hi:
        raise GpufleetError(f"{src}: {key}={v!r} outside [{lo}, {hi}]")
    return v


def parse(doc: dict, name: str, src: str) -> Scenario:
    known = {"name", "description", "fleet", "workload", "telemetry", "nuisances", "fault"}
    unknown = set(doc) - known
    if unknown:
        raise GpufleetError(f"{src}: unknown key(s) {', '.join(sorted(unknown))}")
    sc = Scenario(name=str(doc.get("name", name)), description=str(doc.get("description", "")), source=src)
    sc.fleet = _merge(FLEET, doc.get("fleet"), "fleet", src)
    sc.workload = _merge(WORKLOAD, doc.get("workload"), "workload", src)
    sc.telemetry = _merge(TELEMETRY, doc.get("telemetry"), "telemetry", src)
    sc.nuisances = _merge(NUISANCES, doc.get("nuisances"), "nuisances", src)
    for k in ("nodes", "gpus_per_node", "nodes_per_rack", "racks_per_cluster"):
        _num(sc.fleet, k, src, 1, 100_000, integer=True)
    _num(sc.fleet, "gpus_per_node", src, 1, 16, integer=True)
    sc.fleet["start"] = parse_time(sc.fleet["start"], f"{src}: fleet.start")
    gens = sc.fleet["generations"]
    if not isinstance(gens, list) or not all(
        isinstance(g, list) and len(g) == 2 and isinstance(g[0], str)
        and isinstance(g[1], int | float) and not isinstance(g[1], bool) and 0 <= g[1] <= 1
        for g in gens
    ):
        raise GpufleetError(f"{src}: fleet.generations must be [[model, share 0..1], ...]")
    _num(sc.workload, "busy", src, 0, 1)
    jh = sc.workload["job_hours"]
    if not (
        isinstance(jh, list)
        and len(jh) == 2
        and all(isinstance(x, int | float) for x in jh)
        and 0 < jh[0] <= jh[1]
    ):
        raise GpufleetError(f"{src}: workload.job_hours must be [min, max] hours")
    jn = sc.workload["job_nodes"]
    if not (isinstance(jn, list) and jn and all(isinstance(x, int) and x >= 1 for x in jn)):
        raise GpufleetError(f"{src}: workload.job_nodes must be a list of node counts")
    windows = []
    for w in sc.workload["fleet_idle"]:
        if not (isinstance(w, list) and len(w) == 2):
            raise GpufleetError(f"{src}: workload.fleet_idle entries must be [start, length]")
        windows.append((_when(w[0], f"{src}: fleet_idle"), parse_duration(w[1], f"{src}: fleet_idle")))
    sc.workload["fleet_idle"] = windows
    for k in ("slow_every", "nvlink_full_every"):
        v = sc.telemetry[k]
        if isinstance(v, str):
            sc.telemetry[k] = parse_duration(v, f"{src}: {k}")  # seconds (float)
        else:
            _num(sc.telemetry, k, src, 1, 10_000, integer=True)  # steps (int)
    sc.telemetry["canary_every"] = parse_duration(sc.telemetry["canary_every"], f"{src}: canary_every")
    _num(sc.telemetry, "missing_rate", src, 0, 0.5)
    for k in (
        "inlet_c",
        "inlet_diurnal_c",
        "inlet_drift_c",
        "background_sbe_per_gpu_day",
        "nvlink_crc_per_link_hour",
        "nvlink_crc_bursts_per_link_day",
        "nvlink_replays_per_link_day",
        "pcie_replays_per_gpu_hour",
        "warm_rack_c",
    ):
        _num(sc.nuisances, k, src, 0, 60)
    for k in ("driver_reloads", "agent_restarts", "late_batches", "node_churn", "collective_waits",
              "power_caps", "drains", "job_restarts", "warm_racks"):
        _num(sc.nuisances, k, src, 0, 100_000, integer=True)
    faults = doc.get("fault", [])
    if not isinstance(faults, list):
        raise GpufleetError(f"{src}: [[fault]] must be an array of tables")
    for i, f in enumerate(faults):
        where = f"{src}: fault #{i + 1}"
        if not isinstance(f, dict):
            raise GpufleetError(f"{where}: must be a table")
        unknown = set(f) - FAULT_KEYS
        if unknown:
            raise GpufleetError(f"{where}: unknown key(s) {', '.join(sorted(unknown))}")
        kind = f.get("kind")
        if kind not in FAULT_KINDS:
            raise GpufleetError(f"{where}: unknown kind {kind!r} (one of {', '.join(FAULT_KINDS)})")
        modes = FAULT_KINDS[kind].modes
        mode = f.get("mode", modes[0])
        if mode not in modes:
            raise GpufleetError(f"{where}: {kind} mode {mode!r} not one of {', '.join(modes)}")
        spec = FaultSpec(kind=kind, mode=mode)
        spec.count = int(_num({"count": f.get("count", 1)}, "count", where, 0, 100_000, integer=True))
        for k in ("host", "rack"):
            if k in f:
                if not isinstance(f[k], str) or not f[k]:
                    raise GpufleetError(f"{where}: {k} must be a name")
                setattr(spec, k, f[k])
        for k in ("gpu", "link"):
            if k in f:
                setattr(spec, k, int(_num({k: f[k]}, k, where, 0, 64, integer=True)))
        if "onset" in f:
            o = f["onset"]
            if isinstance(o, list):
                if len(o) != 2:
                    raise GpufleetError(f"{where}: onset range must be [earliest, latest]")
                spec.onset = (_when(o[0], where), _when(o[1], where))
            else:
                w = _when(o, where)
                spec.onset = (w, w)
        if "growth" in f:
            spec.growth = parse_duration(f["growth"], f"{where}: growth")
        if "duration" in f:
            spec.duration = parse_duration(f["duration"], f"{where}: duration")
        if "severity" in f:
            spec.severity = float(_num({"severity": f["severity"]}, "severity", where, 0, 100))
        if "probability" in f:
            spec.probability = float(_num({"probability": f["probability"]}, "probability", where, 0, 1))
        sc.faults.append(spec)
    return sc


def load(name_or_path: str) -> Scenario:
    """A built-in scenario by name, or a TOML file by path. Anything wrong -> GpufleetError."""
    if not isinstance(name_or_path, str) or not name_or_path:
        raise GpufleetError("no scenario given")
    if name_or_path in BUILTIN:
        text = resources.files("gpufleet.sim").joinpath("scenarios", f"{name_or_path}.toml").read_text()
        src, name = f"scenario {name_or_path}", name_or_path
    else:
        p = Path(name_or_path)
        if not p.is_file():
            raise GpufleetError(
                f"unknown scenario {name_or_path!r}: not one of {', '.join(BUILTIN)} and no such file"
            )
        try:
            text = p.read_text()
        except (OSError, UnicodeDecodeError) as exc:
            raise GpufleetError(f"{p}: cannot read scenario: {exc}") from None
        src, name = str(p), p.stem
    try:
        doc = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise GpufleetError(f"{src}: malformed scenario file: {exc}") from None
    return parse(doc, name, src)
