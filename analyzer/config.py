"""Analyzer configuration: detector thresholds, engine timing, windowing, sinks.

Every threshold lives here (defaults) and can be overridden in ``analyzer.toml``::

    [analyzer]
    window = "5m"
    [detectors.thermal_throttle]
    dwell_seconds = 10
    [[sink]]
    type = "alertmanager"
    url = "http://127.0.0.1:9093"
    [influx]               # the store --follow and batch runs read when no --influx-url is given
    url = "http://influxdb:8086"
    db = "gpufleet"
    username = "analyzer"
    password_file = "/etc/gpufleet/influx-password"

Every value is checked like the agent's: an unknown key or a value out of its range (``RANGES``,
non-finite numbers never pass) is a :class:`ConfigError` naming the key (exit 2). Secrets come
only from ``*_file`` / ``*_env`` keys (``gpufleet.secrets.read_secret``), never from the TOML.
"""

from __future__ import annotations

import copy
import math
import tomllib
from pathlib import Path

from gpufleet import units
from gpufleet.errors import ConfigError

ANALYZER = {
    "window_seconds": 300.0,  # detection window
    "context_seconds": 300.0,  # rows of the previous window kept for deltas and rolling features
    "lateness_seconds": 900.0,  # how late a point may arrive (batch) before it is dropped and counted
    "poll_seconds": 10.0,  # expected poll interval (buckets peers, bounds gaps)
    "max_future_seconds": 86400.0,  # points stamped this far past the wall clock are dropped and counted
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
        "urgent_seconds": 1800.0,  # thermal margin: throttling sooner than this makes the incident critical
        "margin_trend_seconds": 600.0,  # thermal margin: its fall over this span gives the time to throttling
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
        # a link below throughput_ratio x its GPU's median link throughput while that is busy: slow;
        # slow for slow_seconds with an error within crc_span_seconds opens a warning
        "throughput_ratio": 0.5,
        "busy_bytes_per_s": 1e9,  # tx + rx per link: ~2 % of an H100 link's 50 GB/s
        "min_links": 3,
        "slow_seconds": 300.0,
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
        # PCIe link error rates over link_error_span_seconds, per minute: healthy H100/H200 links
        # showed at most ~17/min over 15 min (docs/analyzer.md); 7-10x that is a failing link
        "link_errors_per_minute": 120.0,  # receiver, bad TLP/DLLP, NAKs, LCRC, correctable summed
        "l0_recovery_per_minute": 200.0,  # L0 -> Recovery transitions (the link retraining)
        "link_error_span_seconds": 600.0,
        "dwell_seconds": 0.0,
        "gap_seconds": 600.0,
        "resolve_seconds": 3600.0,
        "clear_seconds": 600.0,  # under load at full speed this long before idle stops holding it
    },
    "sdc": {"confirm_checks": 2, "dwell_seconds": 0.0, "gap_seconds": 86400.0, "resolve_seconds": 86400.0},
    "canary_unchecked": {
        "max_age_seconds": 21600.0,  # the agents' canary.max_age
        "factor": 2.0,  # warn at factor x max_age without a check
        "dwell_seconds": 0.0,
        "gap_seconds": 3600.0,
        "resolve_seconds": 3600.0,
    },
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
        "peer_activity_min": 0.4,  # GPM: peers under this share of its SM activity waited: not the same work
        "waiting_activity": 0.7,  # GPM: under this share of its peers' SM activity it is the one waiting
    },
}

# value ranges (inclusive); a detector key matches its own name first, then its suffix
DAY = 86400.0
RANGES: dict[str, tuple[float, float]] = {
    "window_seconds": (1.0, DAY),
    "context_seconds": (0.0, DAY),
    "lateness_seconds": (0.0, 7 * DAY),
    "poll_seconds": (1.0, 3600.0),
    "max_future_seconds": (0.0, 3650 * DAY),
    "absorb_seconds": (0.0, 30 * DAY),
    "_seconds": (0.0, 365 * DAY),
    "_share": (0.0, 1.0),
    "_utilization": (0.0, 1.0),
    "min_slowdown": (0.0, 1.0),
    "sigma": (0.01, 1e6),
    "distance": (0.01, 1e6),
    "_factor": (1e-6, 1e9),
    "_celsius": (-100.0, 200.0),
    "_watts": (0.0, 1e5),
    "fit_rows": (1.0, 1e8),
    "min_peers": (1.0, 1e6),
    "_gpus": (1.0, 1e6),
    "_nodes": (1.0, 1e6),
    "": (0.0, 1e12),  # every other number: finite, not negative
}
INFLUX_KEYS = ("url", "db", "username", "password_file", "password_env", "token_file", "token_env")


def _range(key: str) -> tuple[float, float]:
    if key in RANGES:
        return RANGES[key]
    for suffix in sorted((k for k in RANGES if k.startswith("_")), key=len, reverse=True):
        if key.endswith(suffix):
            return RANGES[suffix]
    return RANGES[""]


def _number(v, where: str, key: str, integer: bool = False) -> float | int:
    """A finite number within the key's range (an int where the default is one)."""
    if isinstance(v, bool) or not isinstance(v, int | float):
        raise ConfigError(f"{where} must be a number, got {v!r}")
    if integer and not (isinstance(v, int) or float(v).is_integer()):
        raise ConfigError(f"{where} must be a whole number, got {v!r}")
    if not math.isfinite(v):
        raise ConfigError(f"{where} must be a finite number, got {v!r}")
    lo, hi = _range(key)
    if not lo <= v <= hi:
        raise ConfigError(f"{where} = {v!r} is out of range [{lo:g}, {hi:g}]")
    return int(v) if integer else v


ENGINE = {
    "absorb_seconds": 3600.0,  # a node/rack incident absorbs GPU/node incidents of its kind this close
    # an incident of the key kind on a GPU already covered by an open incident of a listed kind is
    # folded into that one as evidence (the throttling is the impact of the cooling fault)
    "fold": {"thermal_throttle": ["cooling_degradation"]},
}


def parse_duration(v, where: str) -> float:
    """Seconds of a duration (:func:`gpufleet.units.parse_duration`); ConfigError naming ``where``."""
    return units.parse_duration(v, where, ConfigError)


_duration = parse_duration




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
        for sec in ("analyzer", "detectors", "engine", "influx"):
            if not isinstance(doc.get(sec, {}), dict):
                raise ConfigError(f"{src}: [{sec}] must be a table")
        for k, v in (doc.get("analyzer") or {}).items():
            key = k if k.endswith("_seconds") else f"{k}_seconds"
            if key not in self.analyzer:
                raise ConfigError(f"{src}: [analyzer] unknown key {k!r}")
            where = f"{src}: analyzer.{k}"
            self.analyzer[key] = _number(_duration(v, where), where, key)
        for name, params in (doc.get("detectors") or {}).items():
            if name not in self.detectors:
                raise ConfigError(f"{src}: unknown detector {name!r} (one of {', '.join(self.detectors)})")
            if not isinstance(params, dict):
                raise ConfigError(f"{src}: [detectors.{name}] must be a table")
            for k, v in params.items():
                if k not in self.detectors[name]:
                    raise ConfigError(f"{src}: detectors.{name}: unknown parameter {k!r}")
                where = f"{src}: detectors.{name}.{k}"
                old = self.detectors[name][k]
                if isinstance(old, list):
                    if not isinstance(v, list) or not all(
                        isinstance(x, int) and not isinstance(x, bool) and 0 <= x <= 1000 for x in v
                    ):
                        raise ConfigError(f"{where} must be a list of XID numbers, got {v!r}")
                elif k.endswith("_seconds"):
                    v = _number(_duration(v, where), where, k)
                else:
                    v = _number(v, where, k, integer=isinstance(old, int))
                self.detectors[name][k] = v
        for k, v in (doc.get("engine") or {}).items():
            if k not in self.engine:
                raise ConfigError(f"{src}: [engine] unknown key {k!r}")
            where = f"{src}: engine.{k}"
            if k.endswith("_seconds"):
                v = _number(_duration(v, where), where, k)
            elif k == "fold":
                if not isinstance(v, dict) or not all(
                    a in self.detectors and isinstance(b, list) and all(x in self.detectors for x in b)
                    for a, b in v.items()
                ):
                    raise ConfigError(f"{where} must map a detector name to a list of detector names")
            self.engine[k] = v
        sinks = doc.get("sink", [])
        if not isinstance(sinks, list) or not all(isinstance(s, dict) for s in sinks):
            raise ConfigError(f"{src}: [[sink]] must be an array of tables")
        self.sinks = sinks
        influx = doc.get("influx") or {}
        for k, v in influx.items():
            if k in ("password", "token"):
                raise ConfigError(f"{src}: influx.{k}: secrets are never read from the TOML; "
                                  f"use {k}_file or {k}_env")
            if k not in INFLUX_KEYS:
                raise ConfigError(f"{src}: [influx] unknown key {k!r} (one of {', '.join(INFLUX_KEYS)})")
            if not isinstance(v, str):
                raise ConfigError(f"{src}: influx.{k} must be a string, got {v!r}")
        for a, b in (("password_file", "password_env"), ("token_file", "token_env")):
            if influx.get(a) and influx.get(b):
                raise ConfigError(f"{src}: influx.{a}: give {a} or {b}, not both")
        self.influx = influx

    def influx_auth(self) -> dict:
        """``username``, ``password`` and ``token`` for the InfluxDB client, secrets read from their
        ``*_file`` / ``*_env`` keys (the one secret reader); only the keys that are set."""
        from gpufleet.secrets import read_secret

        out = {}
        if self.influx.get("username"):
            out["username"] = self.influx["username"]
        pw = read_secret("influx.password", self.influx.get("password_file"), self.influx.get("password_env"))
        if pw is not None:
            out["password"] = pw
        tok = read_secret("influx.token", self.influx.get("token_file"), self.influx.get("token_env"))
        if tok is not None:
            out["token"] = tok
        return out
