"""Analyzer configuration: detector thresholds, engine timing, windowing, sinks.

Every analyzer, engine and sink setting has its default here, every detector threshold on its
detector's class (``Detector.params``, collected by :func:`detector_defaults`); each can be
overridden in ``analyzer.toml``::

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
    # how far behind the analysis a host's rows may arrive and still be analysed (in their own time,
    # from memory); older ones are re-read from the store or dropped with an ``analysis_gap`` record
    "late_bound_seconds": 86400.0,
    # processed rows held for the late rows of a host that comes back (its peers, its own context);
    # 0 in batch runs, whose input is in time order (online: see gpufleet.analyzer.online)
    "peers_hold_seconds": 0.0,
}

def detector_defaults() -> dict[str, dict]:
    """Each registered detector's parameters with their defaults, as its class declares them
    (``Detector.params``: the one place they are written), in registry order; a fresh copy."""
    from gpufleet.analyzer.detectors import REGISTRY  # numpy and the detectors only when a config is built

    return {kind: copy.deepcopy(cls.params) for kind, cls in REGISTRY.items()}


# value ranges (inclusive); a detector key matches its own name first, then its suffix
DAY = 86400.0
RANGES: dict[str, tuple[float, float]] = {
    "window_seconds": (1.0, DAY),
    "context_seconds": (0.0, DAY),
    "lateness_seconds": (0.0, 7 * DAY),
    "poll_seconds": (1.0, 3600.0),
    "max_future_seconds": (0.0, 3650 * DAY),
    "late_bound_seconds": (0.0, 30 * DAY),
    "peers_hold_seconds": (0.0, DAY),
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


class Config:
    def __init__(self):
        self.analyzer = dict(ANALYZER)
        self.detectors = detector_defaults()
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
            self.analyzer[key] = _number(parse_duration(v, where), where, key)
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
                    v = _number(parse_duration(v, where), where, k)
                else:
                    v = _number(v, where, k, integer=isinstance(old, int))
                self.detectors[name][k] = v
        for k, v in (doc.get("engine") or {}).items():
            if k not in self.engine:
                raise ConfigError(f"{src}: [engine] unknown key {k!r}")
            where = f"{src}: engine.{k}"
            if k.endswith("_seconds"):
                v = _number(parse_duration(v, where), where, k)
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
