"""Analyzer configuration: detector thresholds, engine timing, windowing, sinks.

Every threshold lives here (defaults) and can be overridden in ``analyzer.toml``::

    [analyzer]
    window = "5m"
    [detectors.thermal_throttle]
    dwell_seconds = 10
    [[sink]]
    type = "alertmanager"
    url = "http://127.0.0.1:9093"
"""

from __future__ import annotations

import copy
import tomllib
from pathlib import Path

from gpufleet.errors import ConfigError

ANALYZER = {
    "window_seconds": 300.0,  # detection window
    "context_seconds": 300.0,  # rows of the previous window kept for deltas and rolling features
    "lateness_seconds": 900.0,  # how late a point may arrive (batch) before it is dropped and counted
    "poll_seconds": 10.0,  # expected poll interval (buckets peers, bounds gaps)
}

DETECTORS: dict[str, dict] = {
    "thermal_throttle": {
        "min_share": 0.05,
        "dwell_seconds": 0.0,
        "gap_seconds": 35.0,
        "resolve_seconds": 3600.0,
        "load_share": 0.8,  # full load (this share of the power limit): where heat would show
        "busy_utilization": 0.5,  # full load where the power limit is not reported
        "clear_margin_celsius": 5.0,  # ... and this far below the slowdown temperature: healthy
        "clear_seconds": 600.0,  # at full load this long without throttling before idle stops holding it
    },
    "power_brake": {
        "min_share": 0.05,
        "dwell_seconds": 0.0,
        "gap_seconds": 35.0,
        "resolve_seconds": 3600.0,
        "node_share": 0.5,  # this share of a node's GPUs braking in the same minute: the node's brake
        "node_min_gpus": 2,
    },
    "cooling_degradation": {
        "min_power_watts": 50.0,
        "min_learn_samples": 120,
        "excess_celsius": 6.0,
        "sigma": 4.0,
        "fleet_spread_celsius": 0.0,
        "smooth_seconds": 120.0,
        "throttle_margin_celsius": 3.0,
        "node_share": 0.5,
        "node_min_gpus": 2,
        "rack_min_nodes": 2,
        "inlet_excess_celsius": 6.0,
        "low_power_watts": 300.0,
        "low_excess_celsius": 3.5,
        "dwell_seconds": 600.0,
        "gap_seconds": 120.0,
        "resolve_seconds": 3600.0,
        "clear_seconds": 600.0,  # judged at load without a hit this long before idle stops holding it
        "inlet_track_seconds": 14400.0,  # time constant of a host's tracked usual inlet (rack scope)
        "fan_excess_celsius": 1.5,  # a node's GPUs this far above baseline together, its BMC fans failing
        "fan_drop_share": 0.6,  # a fan below this share of the fleet's median RPM is failing
    },
    "nvlink_degradation": {
        "crc_rate_max": 100.0,
        "crc_rate_min": 1.0,
        "crc_fleet_factor": 20.0,
        "crc_count_min": 45,  # CRC errors within crc_span_seconds (0.05/s sustained): far above background
        "crc_span_seconds": 900.0,
        "replay_count_min": 3,  # replays within crc_span_seconds (one replay corrects one error)
        "dwell_seconds": 0.0,
        "gap_seconds": 600.0,
        "resolve_seconds": 3600.0,
        "clear_seconds": 3600.0,  # a degraded link stays one incident until this long without an error
    },
    "pcie_degradation": {
        "replay_allowance_per_s": 8 / 60,  # at gen 5 x16, scaled by gen x lanes: DCGM's 8 replays/min
        "load_utilization": 0.2,
        "load_power_watts": 200.0,
        "downgrade_dwell_seconds": 60.0,
        "dwell_seconds": 0.0,
        "gap_seconds": 600.0,
        "resolve_seconds": 3600.0,
        "clear_seconds": 600.0,  # under load at full speed this long before idle stops holding it
    },
    "sdc": {"dwell_seconds": 0.0, "gap_seconds": 86400.0, "resolve_seconds": 86400.0},
    "memory_errors": {
        "xids": [48, 63, 64, 92, 94, 95],
        "sbe_count_min": 2,
        "sbe_rate_min": 0.02,
        "sbe_fleet_factor": 50.0,
        "dwell_seconds": 0.0,
        "gap_seconds": 3600.0,
        "resolve_seconds": 7200.0,
    },
    "gpu_lost": {
        "xids": [79],
        "lost_after_seconds": 180.0,
        "stale_after_seconds": 300.0,  # reported stale (up=0, health_code=1) this long: a warning
        "node_share": 0.5,  # this share of a node's GPUs lost in the same minute: the node's incident
        "node_min_gpus": 2,
        "dwell_seconds": 0.0,
        "gap_seconds": 86400.0,
        "resolve_seconds": 86400.0,
    },
    "straggler": {
        "min_peers": 3,
        "min_slowdown": 0.06,
        "distance": 4.0,
        "busy_utilization": 0.5,
        "fit_rows": 5000,
        "dwell_seconds": 300.0,
        "gap_seconds": 60.0,
        "resolve_seconds": 1800.0,
        "clear_seconds": 600.0,  # kept up with its peers this long before idle stops holding it
    },
}

ENGINE = {
    "absorb_seconds": 3600.0,  # a node/rack incident absorbs GPU/node incidents of its kind this close
    # an incident of the key kind on a GPU already covered by an open incident of a listed kind is
    # folded into that one as evidence (the throttling is the impact of the cooling fault)
    "fold": {"thermal_throttle": ["cooling_degradation"]},
}


def _duration(v, where: str) -> float:
    if isinstance(v, bool):
        raise ConfigError(f"{where}: expected a duration, got {v!r}")
    if isinstance(v, int | float):
        return float(v)
    if isinstance(v, str):
        s = v.strip()
        units = {"ms": 0.001, "s": 1, "m": 60, "h": 3600, "d": 86400}
        for u in ("ms", "s", "m", "h", "d"):
            if s.endswith(u):
                try:
                    return float(s[: -len(u)]) * units[u]
                except ValueError:
                    break
        try:
            return float(s)
        except ValueError:
            pass
    raise ConfigError(f"{where}: bad duration {v!r} (e.g. 30s, 5m, 6h)")


parse_duration = _duration


class Config:
    def __init__(self):
        self.analyzer = dict(ANALYZER)
        self.detectors = copy.deepcopy(DETECTORS)
        self.engine = copy.deepcopy(ENGINE)
        self.sinks: list[dict] = []
        self.influx: dict = {}

    @classmethod
    def load(cls, path: str | Path | None) -> Config:
        cfg = cls()
        if path is None:
            return cfg
        p = Path(path)
        if not p.is_file():
            raise ConfigError(f"{p}: no such config file")
        try:
            doc = tomllib.loads(p.read_text())
        except (tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
            raise ConfigError(f"{p}: malformed TOML: {exc}") from None
        cfg.update(doc, str(p))
        return cfg

    def update(self, doc: dict, src: str = "config") -> None:
        unknown = set(doc) - {"analyzer", "detectors", "engine", "sink", "influx"}
        if unknown:
            raise ConfigError(f"{src}: unknown section(s) {', '.join(sorted(unknown))}")
        for k, v in (doc.get("analyzer") or {}).items():
            key = k if k.endswith("_seconds") else f"{k}_seconds"
            if key not in self.analyzer:
                raise ConfigError(f"{src}: [analyzer] unknown key {k!r}")
            self.analyzer[key] = _duration(v, f"{src}: analyzer.{k}")
        for name, params in (doc.get("detectors") or {}).items():
            if name not in self.detectors:
                raise ConfigError(f"{src}: unknown detector {name!r} (one of {', '.join(self.detectors)})")
            if not isinstance(params, dict):
                raise ConfigError(f"{src}: [detectors.{name}] must be a table")
            for k, v in params.items():
                if k not in self.detectors[name]:
                    raise ConfigError(f"{src}: detectors.{name}: unknown parameter {k!r}")
                old = self.detectors[name][k]
                if isinstance(old, list):
                    if not isinstance(v, list):
                        raise ConfigError(f"{src}: detectors.{name}.{k} must be a list")
                elif k.endswith("_seconds"):
                    v = _duration(v, f"{src}: detectors.{name}.{k}")
                elif isinstance(v, bool) or not isinstance(v, int | float):
                    raise ConfigError(f"{src}: detectors.{name}.{k} must be a number, got {v!r}")
                self.detectors[name][k] = v
        for k, v in (doc.get("engine") or {}).items():
            if k not in self.engine:
                raise ConfigError(f"{src}: [engine] unknown key {k!r}")
            self.engine[k] = _duration(v, f"{src}: engine.{k}") if k.endswith("_seconds") else v
        sinks = doc.get("sink", [])
        if not isinstance(sinks, list) or not all(isinstance(s, dict) for s in sinks):
            raise ConfigError(f"{src}: [[sink]] must be an array of tables")
        self.sinks = sinks
        influx = doc.get("influx", {})
        if not isinstance(influx, dict):
            raise ConfigError(f"{src}: [influx] must be a table")
        self.influx = influx
