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

Every value is checked by :mod:`gpufleet.options`, as the agent's and the sinks' are: an unknown
key or a value out of its range (the declared ``ANALYZER_OPTIONS``, ``INFLUX_OPTIONS``; a detector
parameter's type from its default and its range from its name, ``PARAM_RANGES``; non-finite
numbers never pass) is a :class:`ConfigError` naming the key (exit 2). Secrets come only from
``*_file`` / ``*_env`` keys (``gpufleet.secrets.read_secret``), never from the TOML.
"""

from __future__ import annotations

import copy
import tomllib
from pathlib import Path

from gpufleet import options, units
from gpufleet.errors import ConfigError
from gpufleet.options import Option

DAY = 86400.0


def _sec(name: str, default: float, help: str, lo: float, hi: float) -> Option:
    return Option(name, "duration", default, help, lo, hi)


# the [analyzer] keys (a key may leave out its "_seconds": window = "5m")
ANALYZER_OPTIONS = (
    _sec("window_seconds", 300.0, "detection window", 1.0, DAY),
    _sec("context_seconds", 300.0, "rows of the previous window kept for deltas and rolling features",
         0.0, DAY),
    _sec("lateness_seconds", 900.0, "how late a point may arrive (batch) before it is dropped and counted",
         0.0, 7 * DAY),
    _sec("poll_seconds", 10.0, "expected poll interval (buckets peers, bounds gaps)", 1.0, 3600.0),
    _sec("max_future_seconds", 86400.0, "points stamped this far past the wall clock are dropped and "
         "counted", 0.0, 3650 * DAY),
    # how far behind the analysis a host's rows may arrive and still be analysed (in their own time,
    # from memory); older ones are re-read from the store or dropped with an ``analysis_gap`` record
    _sec("late_bound_seconds", 86400.0, "how far behind the analysis a host's rows may arrive and still "
         "be analysed; older ones are re-read from the store or dropped with an analysis_gap record",
         0.0, 30 * DAY),
    # processed rows held for the late rows of a host that comes back (its peers, its own context);
    # 0 in batch runs, whose input is in time order (online: see gpufleet.analyzer.online)
    _sec("peers_hold_seconds", 0.0, "processed rows held for the late rows of a host that comes back",
         0.0, DAY),
    # ... and older ones, up to the late bound, while all the rows held fit in this much memory
    Option("peers_hold_bytes", "size", 0, "memory for processed rows held longer than peers_hold, up to "
           "the late bound (about: their arrays' size)", 0, 2**40),
)
ANALYZER = options.defaults(ANALYZER_OPTIONS)
# [influx]: the store --follow and batch runs read when no --influx-url is given
INFLUX_OPTIONS = (
    Option("url", "str", "", "http(s)://HOST:PORT"),
    Option("db", "str", "", "database"),
    Option("username", "str", "", "basic auth user"),
    Option("password", "secret", help="basic auth password"),
    Option("token", "secret", help="v2 token"),
)


def detector_defaults() -> dict[str, dict]:
    """Each registered detector's parameters with their defaults, as its class declares them
    (``Detector.params``: the one place they are written), in registry order; a fresh copy."""
    from gpufleet.analyzer.detectors import REGISTRY  # numpy and the detectors only when a config is built

    return {kind: copy.deepcopy(cls.params) for kind, cls in REGISTRY.items()}


# the range of a detector parameter (inclusive), by its name: its own name first, then its suffix
PARAM_RANGES: dict[str, tuple[float, float]] = {
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


def _range(key: str) -> tuple[float, float]:
    if key in PARAM_RANGES:
        return PARAM_RANGES[key]
    for suffix in sorted((k for k in PARAM_RANGES if k.startswith("_")), key=len, reverse=True):
        if key.endswith(suffix):
            return PARAM_RANGES[suffix]
    return PARAM_RANGES[""]


def param_option(name: str, default: object) -> Option:
    """A detector parameter as an :class:`Option`: its type from its default (a list: XID numbers),
    a duration where it ends in ``_seconds``, its range from its name (``PARAM_RANGES``)."""
    lo, hi = _range(name)
    if isinstance(default, list):
        return Option(name, "intlist", default, "XID numbers", 0, 1000)
    if name.endswith("_seconds"):
        return Option(name, "duration", default, lo=lo, hi=hi)
    return Option(name, "int" if isinstance(default, int) else "float", default, lo=lo, hi=hi)


ENGINE = {
    "absorb_seconds": 3600.0,  # a node/rack incident absorbs GPU/node incidents of its kind this close
    # an incident of the key kind on a GPU already covered by an open incident of a listed kind is
    # folded into that one as evidence (the throttling is the impact of the cooling fault)
    "fold": {"thermal_throttle": ["cooling_degradation"]},
}


def parse_duration(v, where: str) -> float:
    """Seconds of a duration (:func:`gpufleet.units.parse_duration`); ConfigError naming ``where``."""
    return units.parse_duration(v, where, ConfigError)


ENGINE_OPTIONS = (Option("absorb_seconds", "duration", ENGINE["absorb_seconds"], "a node/rack incident "
                         "absorbs GPU/node incidents of its kind this close", *_range("absorb_seconds")),)


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
        by_name = {o.name: o for o in ANALYZER_OPTIONS}
        for k, v in (doc.get("analyzer") or {}).items():
            key = k if k in by_name or k.endswith("_seconds") else f"{k}_seconds"
            if key not in by_name:
                raise ConfigError(f"{src}: [analyzer] unknown key {k!r}")
            self.analyzer[key] = options.check(f"{src}: analyzer.{k}", by_name[key], v)
        for name, params in (doc.get("detectors") or {}).items():
            if name not in self.detectors:
                raise ConfigError(f"{src}: unknown detector {name!r} (one of {', '.join(self.detectors)})")
            if not isinstance(params, dict):
                raise ConfigError(f"{src}: [detectors.{name}] must be a table")
            for k, v in params.items():
                if k not in self.detectors[name]:
                    raise ConfigError(f"{src}: detectors.{name}: unknown parameter {k!r}")
                opt = param_option(k, self.detectors[name][k])
                checked = options.check(f"{src}: detectors.{name}.{k}", opt, v)
                # a number written as an integer stays one (as the detectors have always seen it)
                self.detectors[name][k] = v if opt.kind == "float" and isinstance(v, int) else checked
        for k, v in (doc.get("engine") or {}).items():
            if k not in self.engine:
                raise ConfigError(f"{src}: [engine] unknown key {k!r}")
            where = f"{src}: engine.{k}"
            if k == "fold":
                if not isinstance(v, dict) or not all(
                    a in self.detectors and isinstance(b, list) and all(x in self.detectors for x in b)
                    for a, b in v.items()
                ):
                    raise ConfigError(f"{where} must map a detector name to a list of detector names")
            else:
                v = options.check(where, next(o for o in ENGINE_OPTIONS if o.name == k), v)
            self.engine[k] = v
        sinks = doc.get("sink", [])
        if not isinstance(sinks, list) or not all(isinstance(s, dict) for s in sinks):
            raise ConfigError(f"{src}: [[sink]] must be an array of tables")
        self.sinks = sinks
        influx = doc.get("influx") or {}
        checked = options.validate(INFLUX_OPTIONS, influx, lambda k: f"{src}: influx.{k}")
        self.influx = {k: v for k, v in checked.items() if k in influx}  # only what the file gives

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
