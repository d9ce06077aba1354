"""The agent's configuration: one TOML file, validated up front, command-line overrides on top.

Every key is declared in ``SCHEMA`` (section -> key -> spec); an unknown key or a bad value is a
:class:`gpufleet.errors.ConfigError` naming the key (the CLI prints one line, exit 2). Secrets
(InfluxDB token and password) are read from a file or an environment variable, never from the
TOML itself, and never logged: :func:`gpufleet.net.redact_url` strips credentials from URLs before logging.
The reference is ``docs/agent.md``; ``packaging/config/agent.toml`` holds every key.

Several InfluxDB-protocol destinations: besides ``[influx]`` (exporter ``influx``), a table
``[influx.NAME]`` declares the destination ``influx.NAME`` (the same keys, plus ``spool_dir``),
active when ``agent.exporters`` lists it. Each has its own spool, sender, backoff and counters
(:func:`influx_destinations` is the one list of them).
"""

from __future__ import annotations

import math
import os
import re
import socket
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import urlsplit

from gpufleet.errors import ConfigError
from gpufleet.units import parse_duration, parse_size

EXPORTERS = ("file", "influx", "otlp", "prometheus")
INFLUX = "influx"  # the exporter of the [influx] table; [influx.NAME] tables are "influx.NAME"
_DEST_NAME = re.compile(r"^[A-Za-z][A-Za-z0-9_-]{0,62}$")
STATE_DIR = "/var/lib/gpufleet-agent"  # the systemd unit's StateDirectory: the one place it may write
COLLECTOR_SECTIONS = ("ipmi", "xid", "canary")
JOB_TAG_KEYS = ("scheduler", "namespace", "partition", "user")  # gpufleet.agent.jobs.TAG_KEYS
_LABEL_KEY = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
RESERVED_LABELS = {"host", "gpu", "uuid", "model", "link", "type", "source", "sensor", "sensor_type",
                   "unit", "collector", "exporter", "time"}


@dataclass(frozen=True)
class Spec:
    kind: str  # str | bool | int | float | duration | size | choice | strlist | path
    default: object
    lo: float | None = None
    hi: float | None = None
    choices: tuple = ()


SCHEMA: dict[str, dict[str, Spec]] = {
    "agent": {
        "interval": Spec("duration", 10.0, 1.0, 3600.0),
        "backend": Spec("str", "nvml"),
        "sim_node": Spec("str", ""),
        "host": Spec("str", ""),
        "collectors": Spec("strlist", ["gpu", "host"]),
        # EXPORTERS and influx.NAME (checked in _cross_check); [] = influx when [influx] url is
        # set, else file (exporters(cfg) resolves it)
        "exporters": Spec("strlist", []),
        "log_level": Spec("choice", "info", choices=("debug", "info", "warning", "error")),
        "flush_timeout": Spec("duration", 5.0, 0.0, 60.0),
        # degraded (the spool cannot be written) this long: stop the watchdog pings so systemd
        # restarts the unit (without a watchdog: exit 1); 0 = never
        "degraded_restart": Spec("duration", 300.0, 0.0, 86400.0),
    },
    "labels": {},  # free-form operator labels: name = "value"
    "gpu": {
        "nvlink_interval": Spec("duration", 30.0, 0.0, 3600.0),
        "job_tags": Spec("strlist", [], choices=JOB_TAG_KEYS),
        "gpm": Spec("bool", True),
    },
    "file": {
        "dir": Spec("path", f"{STATE_DIR}/telemetry"),
        "segment_bytes": Spec("size", 64 * 2**20, 4096, 2**40),
        "segment_age": Spec("duration", 3600.0, 1.0, 7 * 86400.0),
        "compress": Spec("bool", True),
        "keep_bytes": Spec("size", 4 * 2**30, 0, 2**50),
    },
    "influx": {
        "url": Spec("str", ""),
        "api": Spec("choice", "v1", choices=("v1", "v2")),
        "db": Spec("str", "gpufleet"),
        "rp": Spec("str", ""),
        "username": Spec("str", ""),
        "password_file": Spec("path", ""),
        "password_env": Spec("str", ""),
        "bucket": Spec("str", ""),
        "org": Spec("str", ""),
        "token_file": Spec("path", ""),
        "token_env": Spec("str", ""),
        "precision": Spec("choice", "ns", choices=("ns", "s")),
        "gzip": Spec("bool", True),
        "batch_lines": Spec("int", 5000, 1, 5000),
        "timeout": Spec("duration", 10.0, 0.1, 300.0),
        "backoff_min": Spec("duration", 1.0, 0.01, 3600.0),
        "backoff_max": Spec("duration", 60.0, 0.01, 3600.0),
    },
    "otlp": {
        "endpoint": Spec("str", "http://127.0.0.1:4318/v1/metrics"),
        "protocol": Spec("choice", "http/protobuf", choices=("http/protobuf", "grpc")),
        "timeout": Spec("duration", 10.0, 0.1, 300.0),
        "insecure": Spec("bool", True),
    },
    "prometheus": {  # GET /metrics (dcgm-exporter's port); beyond loopback only when listen says so
        "listen": Spec("str", "127.0.0.1:9400"),
        "names": Spec("choice", "gpufleet", choices=("gpufleet", "dcgm", "both")),
    },
    "spool": {
        "dir": Spec("path", f"{STATE_DIR}/spool"),
        "max_bytes": Spec("size", 512 * 2**20, 65536, 2**50),
        "segment_bytes": Spec("size", 4 * 2**20, 4096, 2**31),
        "fsync": Spec("bool", False),
        "rejected_max_files": Spec("int", 1000, 1, 10_000_000),
        "rejected_max_bytes": Spec("size", 64 * 2**20, 4096, 2**50),
    },
    # The sections of the ipmi, xid and canary collectors: their constructor's keyword arguments
    # (docs/sources.md), passed to the collector when it is listed in gpufleet.agent.collectors.
    "ipmi": {
        "host": Spec("str", ""),
        "port": Spec("int", 623, 1, 65535),
        "username": Spec("str", ""),
        "password_file": Spec("path", ""),
        "password_env": Spec("str", ""),
        "privilege": Spec("choice", "", choices=("", "USER", "OPERATOR", "ADMIN")),
        "driver": Spec("str", ""),
        "workarounds": Spec("str", ""),
        "deadline": Spec("duration", 4.0, 0.1, 60.0),
        "backoff_min": Spec("duration", 10.0, 0.01, 86400.0),
        "backoff_max": Spec("duration", 300.0, 0.01, 86400.0),
        "sel": Spec("bool", True),
        "sel_every": Spec("int", 6, 1, 100000),
        "dcmi": Spec("bool", True),
        "cache_dir": Spec("path", ""),
    },
    "xid": {
        "kmsg": Spec("path", "/dev/kmsg"),
        "nvml_events": Spec("bool", True),
        "replay": Spec("bool", False),
        "max_events": Spec("int", 1000, 1, 1_000_000),
        "wait_ms": Spec("int", 500, 10, 60_000),
        "state_dir": Spec("path", f"{STATE_DIR}/xid"),
    },
    "canary": {
        "engine": Spec("choice", "auto", choices=("auto", "backend", "torch", "cupy", "numpy")),
        "interval": Spec("duration", 3600.0, 1.0, 30 * 86400.0),
        "max_age": Spec("duration", 21600.0, 60.0, 365 * 86400.0),
        "size": Spec("int", 0, 0, 32768),
        "dtype": Spec("choice", "", choices=("", "float32", "float16", "bfloat16")),
        "seed": Spec("int", 20261126, 0, 2**63 - 1),
        "memory_bytes": Spec("size", 0, 0, 2**40),
        "idle_util": Spec("float", 5.0, 0.0, 100.0),
        "busy_size": Spec("int", 0, 0, 32768),
        "duty": Spec("float", 0.001, 1e-9, 1.0),
        "busy_backoff": Spec("duration", 60.0, 0.0, 30 * 86400.0),
        "idle_for": Spec("duration", 0.0, 0.0, 86400.0),
        "confirm": Spec("int", 2, 0, 10),
        "timeout": Spec("duration", 120.0, 1.0, 3600.0),
        "max_rss": Spec("size", 4 << 30, 0, 2**44),
        "parallel": Spec("int", 1, 1, 64),
        "drop_dir": Spec("path", f"{STATE_DIR}/canary-drop"),
        "status_every": Spec("duration", 60.0, 1.0, 86400.0),
        "reference": Spec("str", ""),
        "reference_refresh": Spec("duration", 3600.0, 1.0, 30 * 86400.0),
        "state_dir": Spec("path", f"{STATE_DIR}/canary"),
        "standin": Spec("bool", False),
        "python": Spec("path", ""),
    },
}
# the keys an [influx.NAME] table has beyond [influx]'s (its other keys: SCHEMA["influx"], same defaults)
DESTINATION_KEYS: dict[str, Spec] = {
    "spool_dir": Spec("path", ""),  # "" = spool.dir + "-NAME"
}
# config section -> collector keyword, where the names differ
COLLECTOR_ALIASES = {"ipmi": {"host": "bmc_host", "port": "bmc_port"}}


def collector_options(cfg: dict, name: str) -> dict[str, object]:
    """The validated ``[name]`` section as the collector's keyword arguments ({} when none)."""
    if name not in COLLECTOR_SECTIONS:
        return {}
    aliases = COLLECTOR_ALIASES.get(name, {})
    return {aliases.get(k, k): v for k, v in (cfg.get(name) or {}).items()}


def _bad(key: str, why: str) -> ConfigError:
    return ConfigError(f"config key '{key}': {why}")


def _duration(key: str, v: object) -> float:
    return parse_duration(v, f"config key '{key}'", ConfigError)


def _size(key: str, v: object) -> int:
    return parse_size(v, f"config key '{key}'", ConfigError)


def _check(key: str, spec: Spec, v: object) -> object:
    k = spec.kind
    if k in ("str", "path", "choice"):
        if not isinstance(v, str):
            raise _bad(key, f"expected a string, got {type(v).__name__}")
        if "\x00" in v:
            raise _bad(key, "contains a NUL byte")
        if k == "choice" and v not in spec.choices:
            raise _bad(key, f"expected one of {', '.join(spec.choices)}, got {v!r}")
        return v
    if k == "bool":
        if not isinstance(v, bool):
            raise _bad(key, f"expected true or false, got {v!r}")
        return v
    if k == "strlist":
        if not isinstance(v, list) or not all(isinstance(x, str) and x for x in v):
            raise _bad(key, "expected a list of names")
        if len(set(v)) != len(v):
            raise _bad(key, "names listed twice")
        if spec.choices:
            for x in v:
                if x not in spec.choices:
                    raise _bad(key, f"unknown name {x!r}; expected {', '.join(spec.choices)}")
        return list(v)
    if k == "int":
        if not isinstance(v, int) or isinstance(v, bool):
            raise _bad(key, f"expected an integer, got {v!r}")
        out: float = v
    elif k == "float":
        if not isinstance(v, (int, float)) or isinstance(v, bool):
            raise _bad(key, f"expected a number, got {v!r}")
        out = float(v)
    elif k == "duration":
        out = _duration(key, v)
    elif k == "size":
        out = _size(key, v)
    else:  # pragma: no cover - schema typo
        raise AssertionError(k)
    if isinstance(out, float) and not math.isfinite(out):
        raise _bad(key, f"not a finite number: {v!r}")
    if spec.lo is not None and out < spec.lo:
        raise _bad(key, f"{v!r} is below the minimum {spec.lo:g}")
    if spec.hi is not None and out > spec.hi:
        raise _bad(key, f"{v!r} is above the maximum {spec.hi:g}")
    return out


def _check_label(key: str, name: object, value: object) -> str:
    if not isinstance(name, str) or not _LABEL_KEY.match(name):
        raise _bad(key, "label names are letters, digits and _ (not starting with a digit)")
    if name in RESERVED_LABELS:
        raise _bad(key, f"'{name}' is a tag the agent sets itself")
    if not isinstance(value, str) or not value:
        raise _bad(key, "a label value is a non-empty string")
    _check_tag_value(key, value)
    return value


def _check_tag_value(key: str, value: str) -> None:
    """What InfluxDB line protocol cannot carry in a tag value, refused up front."""
    if "\n" in value or "\r" in value:
        raise _bad(key, "a tag value cannot hold a newline")
    if re.search(r"\\(?=[ ,=]|$)", value):
        raise _bad(key, "a backslash before a space, comma, '=' or at the end cannot be stored in a tag")
    if value.strip() != value:
        raise _bad(key, "has leading or trailing white space")


def validate(doc: object) -> dict[str, dict[str, object]]:
    """Check a parsed TOML document; return every section with defaults filled in.

    Raises :class:`ConfigError` naming the first bad key. Pure: reads no file, no environment.
    """
    if not isinstance(doc, dict):
        raise ConfigError("config: expected a table at the top level")
    out: dict[str, dict[str, object]] = {}
    for section, value in doc.items():
        if section not in SCHEMA:
            raise _bad(str(section), f"unknown section; expected one of {', '.join(SCHEMA)}")
        if not isinstance(value, dict):
            raise _bad(section, "expected a table")
    for section, specs in SCHEMA.items():
        given = doc.get(section, {})
        sec: dict[str, object] = {}
        if section == "labels":
            for name, v in given.items():
                sec[name] = _check_label(f"labels.{name}", name, v)
            out[section] = sec
            continue
        for name in given:
            if name not in specs and not (section == INFLUX and isinstance(given[name], dict)):
                raise _bad(f"{section}.{name}", "unknown key")
        for name, spec in specs.items():
            key = f"{section}.{name}"
            sec[name] = _check(key, spec, given[name]) if name in given else spec.default
        if section == INFLUX:
            for name, table in given.items():
                if name not in specs:
                    sec[name] = _destination_table(str(name), table)
        out[section] = sec
    _cross_check(out)
    return out


def _destination_table(name: str, table: dict) -> dict[str, object]:
    """An ``[influx.NAME]`` table: the keys of ``[influx]`` (with their defaults) and ``spool_dir``."""
    if not _DEST_NAME.match(name):
        raise _bad(f"influx.{name}", "a destination name is letters, digits, '_' and '-', "
                                     "starting with a letter")
    specs = {**SCHEMA[INFLUX], **DESTINATION_KEYS}
    for k in table:
        if k not in specs:
            raise _bad(f"influx.{name}.{k}", "unknown key")
    return {k: _check(f"influx.{name}.{k}", spec, table[k]) if k in table else spec.default
            for k, spec in specs.items()}


def named_destinations(cfg: dict) -> dict[str, dict]:
    """The ``[influx.NAME]`` tables: NAME -> table (declared, whether listed in exporters or not)."""
    return {k: v for k, v in cfg[INFLUX].items() if isinstance(v, dict)}


@dataclass(frozen=True)
class Destination:
    """One InfluxDB-protocol destination of the agent: its exporter name, keys and spool."""

    name: str  # "influx" or "influx.NAME": the exporter tag of its gpufleet_agent row
    cfg: dict = field(compare=False)  # the keys of [influx] (make_client, InfluxSender)
    spool_dir: str


def exporters(cfg: dict) -> list[str]:
    """The exporters the agent runs: ``agent.exporters`` as listed; none listed (the packaged
    config): ``influx`` when ``[influx] url`` is set (the one key the README asks for switches it
    on), else ``file``."""
    given = list(cfg["agent"]["exporters"])
    if given:
        return given
    return [INFLUX] if cfg[INFLUX]["url"] else ["file"]


def unexported(cfg: dict) -> list[str]:
    """``[influx]`` / ``[influx.NAME]`` tables that name a url but that the exporters leave out:
    data the operator meant to send somewhere the agent would not send it (``gpufleet agent
    check`` refuses such a config; ``agent run`` logs it)."""
    active = set(exporters(cfg))
    out = [INFLUX] if cfg[INFLUX]["url"] and INFLUX not in active else []
    return out + [f"{INFLUX}.{n}" for n, t in named_destinations(cfg).items()
                  if t["url"] and f"{INFLUX}.{n}" not in active]


def influx_destinations(cfg: dict) -> list[Destination]:
    """The active InfluxDB-protocol destinations, in the order ``agent.exporters`` lists them."""
    named = named_destinations(cfg)
    base = os.path.normpath(str(cfg["spool"]["dir"]))
    out = []
    for exp in exporters(cfg):
        if exp == INFLUX:
            ix = {k: v for k, v in cfg[INFLUX].items() if k in SCHEMA[INFLUX]}
            out.append(Destination(INFLUX, ix, str(cfg["spool"]["dir"])))
        elif exp.startswith(INFLUX + ".") and exp[len(INFLUX) + 1:] in named:
            name = exp[len(INFLUX) + 1:]
            t = named[name]
            out.append(Destination(exp, t, str(t["spool_dir"]) or f"{base}-{name}"))
    return out


def _check_destination(key: str, ix: dict, active: bool) -> None:
    """One destination's own keys (``key``: ``influx`` or ``influx.NAME``); its URL when active."""
    if ix["backoff_min"] > ix["backoff_max"]:
        raise _bad(f"{key}.backoff_min", f"is larger than {key}.backoff_max")
    if ix["password_file"] and ix["password_env"]:
        raise _bad(f"{key}.password_file", "give password_file or password_env, not both")
    if ix["token_file"] and ix["token_env"]:
        raise _bad(f"{key}.token_file", "give token_file or token_env, not both")
    if not active:
        return
    url = ix["url"]
    try:
        parts = urlsplit(url)
        parts.port  # noqa: B018 - raises on a bad port
    except ValueError as exc:
        raise _bad(f"{key}.url", f"not a URL ({exc})") from None
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise _bad(f"{key}.url", "expected http://HOST:PORT or https://HOST:PORT")
    if ix["api"] == "v1" and not ix["db"]:
        raise _bad(f"{key}.db", "needed with api = \"v1\"")
    if ix["api"] == "v2" and not ix["bucket"]:
        raise _bad(f"{key}.bucket", "needed with api = \"v2\"")


def _check_exporters(c: dict) -> None:
    named = named_destinations(c)
    for x in exporters(c):
        if x in EXPORTERS:
            continue
        if x.startswith(INFLUX + "."):
            if x[len(INFLUX) + 1:] in named:
                continue
            raise _bad("agent.exporters", f"{x!r} names no [{x}] table")
        raise _bad("agent.exporters", f"unknown name {x!r}; expected {', '.join(EXPORTERS)} or influx.NAME "
                                      "(an [influx.NAME] table)")
    for name, t in named.items():
        _check_destination(f"influx.{name}", t, f"{INFLUX}.{name}" in exporters(c))
    dests = influx_destinations(c)
    if not dests:
        return
    first = dests[0]
    seen: dict[str, str] = {}
    for d in dests:
        key = "spool.dir" if d.name == INFLUX else f"{d.name}.spool_dir"
        if d.cfg["precision"] != first.cfg["precision"]:  # the lines are encoded once for all sinks
            raise _bad(f"{d.name}.precision", f"every influx destination writes the same lines: "
                                              f"{first.cfg['precision']!r} as {first.name}.precision")
        real = os.path.realpath(d.spool_dir)
        if real in seen:
            raise _bad(key, f"{d.spool_dir} is also the spool of {seen[real]}: each destination needs "
                            "its own spool directory")
        seen[real] = d.name


def _cross_check(c: dict[str, dict[str, object]]) -> None:
    a, ix = c["agent"], c["influx"]
    b = a["backend"]
    if not (b in ("nvml", "sim") or (b.startswith("recorded:") and len(b) > len("recorded:"))):
        raise _bad("agent.backend", f"expected nvml, sim or recorded:PATH, got {b!r}")
    if a["sim_node"] and b != "sim":
        raise _bad("agent.sim_node", "needs backend = \"sim\"")
    if c["ipmi"]["backoff_min"] > c["ipmi"]["backoff_max"]:
        raise _bad("ipmi.backoff_min", "is larger than ipmi.backoff_max")
    if c["ipmi"]["password_file"] and c["ipmi"]["password_env"]:
        raise _bad("ipmi.password_file", "give password_file or password_env, not both")
    for key in ("size", "busy_size"):
        if 0 < c["canary"][key] < 16:
            raise _bad(f"canary.{key}", f"{c['canary'][key]} is outside 16..32768 (0: the default)")
    _check_destination(INFLUX, ix, INFLUX in exporters(c))
    _check_exporters(c)
    if "otlp" in exporters(c):
        try:
            parts = urlsplit(c["otlp"]["endpoint"])
        except ValueError as exc:
            raise _bad("otlp.endpoint", f"not a URL ({exc})") from None
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise _bad("otlp.endpoint", "expected http(s)://HOST:PORT[/path]")
    if "prometheus" in a["exporters"]:
        parse_listen(c["prometheus"]["listen"])
    for key in ("host", "sim_node"):
        if a[key]:
            _check_tag_value(f"agent.{key}", a[key])
            _check_host(f"agent.{key}", a[key])


def parse_listen(value: str, key: str = "prometheus.listen") -> tuple[str, int]:
    """``HOST:PORT`` (``[v6]:PORT`` for IPv6) -> (host, port); ConfigError naming ``key``."""
    host, sep, port = value.rpartition(":")
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    if not sep or not host or not port.isdigit() or not 0 <= int(port) < 65536:
        raise _bad(key, f"expected HOST:PORT, e.g. 127.0.0.1:9400, got {value!r}")
    return host, int(port)


def parse_text(text: str, origin: str = "config") -> dict[str, dict[str, object]]:
    try:
        doc = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{origin}: not valid TOML: {exc}") from None
    return validate(doc)


def load(path: str | Path | None) -> dict[str, dict[str, object]]:
    """Read and validate a config file; ``None`` gives the defaults."""
    if path is None:
        return validate({})
    p = Path(path)
    try:
        text = p.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ConfigError(f"{p}: no such config file") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"{p}: cannot read: {exc}") from None
    return parse_text(text, str(p))


# command-line option -> (section, key)
OVERRIDES = {
    "backend": ("agent", "backend"),
    "interval": ("agent", "interval"),
    "sim_node": ("agent", "sim_node"),
    "host": ("agent", "host"),
    "influx_url": ("influx", "url"),
    "influx_api": ("influx", "api"),
    "influx_db": ("influx", "db"),
    "influx_bucket": ("influx", "bucket"),
    "influx_org": ("influx", "org"),
    "influx_user": ("influx", "username"),
    "influx_password_file": ("influx", "password_file"),
    "influx_token_file": ("influx", "token_file"),
    "spool_dir": ("spool", "dir"),
    "file_dir": ("file", "dir"),
}


def apply_overrides(cfg: dict, *, exporters: tuple[str, ...] = (), labels: tuple[str, ...] = (),
                    influx=None, **opts) -> dict:
    """Layer command-line values over a validated config and validate the result again
    (``influx``: the ``--influx-*`` flags, :class:`gpufleet.flags.InfluxFlags`)."""
    if influx is not None:
        opts.update({f"influx_{k}": v for k, v in vars(influx).items()})
    doc = {s: dict(v) for s, v in cfg.items()}
    for opt, value in opts.items():
        if value is None:
            continue
        if opt not in OVERRIDES:
            raise ConfigError(f"unknown override {opt!r}")
        section, key = OVERRIDES[opt]
        doc[section][key] = value
    if exporters:
        names = []
        for e in exporters:
            names.extend(x.strip() for x in e.split(",") if x.strip())
        doc["agent"]["exporters"] = names
    for lab in labels:
        if "=" not in lab:
            raise ConfigError(f"--label {lab!r}: expected NAME=VALUE")
        k, v = lab.split("=", 1)
        doc["labels"][k] = v
    return validate(doc)


def _check_host(key: str, value: str) -> None:
    """The host tag names one node to the analyzer and its actions: one plain name (gpufleet/hosts.py)."""
    from gpufleet.hosts import problem, shown

    why = problem(value)
    if why:
        raise _bad(key, f"'{shown(value)}' is not a plain node name: {why}")


def hostname(cfg: dict) -> str:
    """The host tag: agent.host (--host), else the system's host name, which must be a plain name too."""
    from gpufleet.hosts import problem, shown

    name = cfg["agent"]["host"] or socket.gethostname()
    why = problem(name)
    if why:
        raise ConfigError(f"the system host name '{shown(name)}' is not a plain node name: {why}; "
                          f"set agent.host (--host)")
    return name


def influx_secret(ix: dict, name: str = INFLUX) -> str | None:
    """A destination's secret (``name``: ``influx`` or ``influx.NAME``): the v2 token or the v1
    password, from its file or env key."""
    from gpufleet.secrets import read_secret

    key = "token" if ix["api"] == "v2" else "password"
    return read_secret(f"{name}.{key}", ix.get(f"{key}_file"), ix.get(f"{key}_env"))
