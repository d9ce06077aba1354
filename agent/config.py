"""The agent's configuration: one TOML file, validated up front, command-line overrides on top.

Every key is declared once as a :class:`gpufleet.options.Option`: the agent's own sections on their
:class:`Section` classes (``OWN``), each exporter's and collector's section on its class
(:func:`sections` joins them); an
unknown key or a bad value is a :class:`gpufleet.errors.ConfigError` naming the key (the CLI prints
one line, exit 2). Secrets (InfluxDB token and password, the BMC password) are read from a file or
an environment variable, never from the TOML itself, and never logged:
:func:`gpufleet.net.redact_url` strips credentials from URLs before logging. The key table of
``docs/agent.md`` and every section of ``packaging/config/agent.toml`` are generated from the
declarations (``python -m gpufleet.regen``).

Several InfluxDB-protocol destinations: besides ``[influx]`` (exporter ``influx``), a table
``[influx.NAME]`` declares the destination ``influx.NAME`` (the same keys, plus ``spool_dir``),
active when ``agent.exporters`` lists it. Each has its own spool, sender, backoff and counters
(:func:`influx_destinations` is the one list of them).
"""

from __future__ import annotations

import os
import re
import socket
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import ClassVar
from urllib.parse import urlsplit

from gpufleet.agent.model import STATE_DIR, Collector, Exporter

from gpufleet import options
from gpufleet.errors import ConfigError
from gpufleet.options import Option

INFLUX = "influx"  # the exporter of the [influx] table; [influx.NAME] tables are "influx.NAME"
_DEST_NAME = re.compile(r"^[A-Za-z][A-Za-z0-9_-]{0,62}$")
_LABEL_KEY = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
RESERVED_LABELS = {"host", "gpu", "uuid", "model", "link", "type", "source", "sensor", "sensor_type",
                   "unit", "collector", "exporter", "time"}


def _o(name, kind, default=None, help="", lo=None, hi=None, **kw) -> Option:
    return Option(name, kind, default, help, lo, hi, **kw)


class Section:
    """One of the agent's own config sections, its facts declared on the class as a collector's
    or an exporter's are: ``name``, ``options`` (its keys), ``lead`` (the comment lines above it
    in the packaged config) and :meth:`example` (the keys the packaged config sets otherwise than
    their defaults). The config's validation, the key table of ``docs/agent.md`` and the section
    in ``packaging/config/agent.toml`` come from them (``python -m gpufleet.regen``)."""

    name: ClassVar[str] = ""
    options: ClassVar[tuple[Option, ...]] = ()
    lead: ClassVar[tuple[str, ...]] = ()

    @classmethod
    def example(cls) -> dict[str, object]:
        """Keys the packaged config sets otherwise than their defaults."""
        return {}

    @classmethod
    def validate(cls, given: dict) -> dict[str, object]:
        return options.validate(cls.options, given, options.agent_key(cls.name))

    @classmethod
    def markdown_rows(cls) -> list[str]:
        return options.markdown_rows(f"{cls.name}.", cls.options)

    @classmethod
    def toml_lines(cls) -> list[str]:
        values = cls.example()
        lines = [*(f"# {line}" for line in cls.lead),
                 *options.toml_section(cls.name, cls.options, values)]
        for key, value in values.items():  # say the default the packaged value replaces
            opt = next(o for o in cls.options if o.name == key)
            at = lines.index(f"{key} = {options.toml_value(opt, value)}")
            lines.insert(at, f"# (without this file: {options.toml_value(opt, opt.default)})")
        return lines


class AgentSection(Section):
    name = "agent"
    options = (
        _o("interval", "duration", 10.0, "poll and export interval", 1.0, 3600.0),
        _o("backend", "str", "nvml", "`nvml`, `sim` or `recorded:PATH`"),
        _o("sim_node", "str", "", "with `sim`: play this node of a simulated fleet"),
        _o("host", "str", "", "the `host` tag; empty: the host name"),
        _o("collectors", "strlist", ["gpu", "host"], "registered names (the `[NAME]` sections of the "
           "collectors, docs/sources.md) or `package.module:Class`; those that read NVML share one "
           "backend, snapshotted once per tick. The packaged config lists every registered one: each "
           "says in one line at start (and `gpufleet agent check` says now) whether it is on, off or "
           "unavailable and why; `ipmi` in-band starts only where `/dev/ipmi0` and FreeIPMI are"),
        _o("exporters", "strlist", [], "registered names (the `[NAME]` sections of the exporters) and "
           "`influx.NAME` (an `[influx.NAME]` table); `[]`: `influx` when `influx.url` is set, else `file`"),
        _o("log_level", "choice", "info", choices=("debug", "info", "warning", "error")),
        _o("flush_timeout", "duration", 5.0, "spool drain budget on SIGTERM", 0.0, 60.0),
        _o("degraded_restart", "duration", 300.0, "spool unwritable this long: watchdog pings stop "
           "(systemd restarts the unit; without a watchdog: exit 1); `0` = never", 0.0, 86400.0),
    )

    @classmethod
    def example(cls) -> dict[str, object]:
        """Every source the node may have: the default ones, then every other registered collector."""
        default = next(o.default for o in cls.options if o.name == "collectors")
        assert isinstance(default, list)
        return {"collectors": [*default, *(n for n in collector_classes() if n not in default)]}


class LabelsSection(Section):
    """Free-form operator labels, ``NAME = "value"``: a tag on every row (checked by ``_check_label``)."""

    name = "labels"
    lead = ("operator labels, added as tags to every row (not a tag the agent sets itself)",)

    @classmethod
    def validate(cls, given: dict) -> dict[str, object]:
        return {name: _check_label(f"labels.{name}", name, v) for name, v in given.items()}

    @classmethod
    def markdown_rows(cls) -> list[str]:
        return ["| `labels.NAME` | | operator label, a tag on every row (not a reserved tag name) |"]

    @classmethod
    def toml_lines(cls) -> list[str]:
        return [*(f"# {line}" for line in cls.lead), "[labels]", '# cluster = "a"', '# rack = "r12"']


class SpoolSection(Section):
    name = "spool"
    options = (
        _o("dir", "path", f"{STATE_DIR}/spool", "the disk spool of the `influx` exporter (an "
           "`[influx.NAME]` destination's: this + `-NAME`)"),
        _o("max_bytes", "size", 512 * 2**20, "bound; oldest dropped beyond", 65536, 2**50),
        _o("segment_bytes", "size", 4 * 2**20, "", 4096, 2**31),
        _o("fsync", "bool", False, "fsync every append"),
        _o("rejected_max_files", "int", 1000, "batches kept in `rejected/`; the oldest deleted (and "
           "logged) beyond", 1, 10_000_000),
        _o("rejected_max_bytes", "size", 64 * 2**20, "bytes kept in `rejected/`", 4096, 2**50),
    )


# The agent's own sections; each exporter's and each collector's section is declared on its class
# (``options``, gpufleet.agent.model) and joined in by :func:`sections`.
OWN: tuple[type[Section], ...] = (AgentSection, LabelsSection, SpoolSection)
CORE: dict[str, tuple[Option, ...]] = {cls.name: cls.options for cls in OWN}


def exporter_classes() -> dict[str, type[Exporter]]:
    """Every exporter of ``agent/pipeline/`` (and any registered since): name -> class, by name."""
    import importlib
    import pkgutil

    import gpufleet.agent.pipeline as pkg
    from gpufleet.agent.model import EXPORTERS

    for m in pkgutil.iter_modules(pkg.__path__):
        importlib.import_module(f"gpufleet.agent.pipeline.{m.name}")
    return dict(sorted(EXPORTERS.items()))  # by name: the same order whatever was imported first


def _influx_options() -> tuple[Option, ...]:
    return exporter_classes()[INFLUX].options


def _destination_options() -> tuple[Option, ...]:
    cls = exporter_classes()[INFLUX]
    return (*cls.options, *cls.destination_options)


def collector_classes() -> dict[str, type[Collector]]:
    """Every collector of ``agent/collectors/`` (and any registered since): name -> class, by
    name. A module whose dependencies are missing (the ``agent`` extra) is left out."""
    import importlib
    import pkgutil

    import gpufleet.agent.collectors as pkg
    from gpufleet.agent.model import REGISTRY

    for m in pkgutil.iter_modules(pkg.__path__):
        try:
            importlib.import_module(f"gpufleet.agent.collectors.{m.name}")
        except ImportError:
            continue
    return dict(sorted(REGISTRY.items()))  # by name: the same order whatever was imported first


def sections() -> dict[str, tuple[Option, ...]]:
    """Every section of the agent config -> its options: the agent's own, each exporter's, then
    each collector's (those that declare options, in registry order)."""
    out = dict(CORE)
    for name, cls in [*exporter_classes().items(), *collector_classes().items()]:
        opts = tuple(getattr(cls, "options", ()))
        if opts:
            if name in out:  # pragma: no cover - a part named like another section
                raise AssertionError(f"{cls.__name__} {name!r} clashes with the agent's [{name}] section")
            out[name] = opts
    return out


def collector_options(cfg: dict, name: str) -> dict[str, object]:
    """The validated ``[name]`` section as the collector's keyword arguments ({} when none)."""
    cls = collector_classes().get(name)
    if cls is None or name not in cfg:
        return {}
    table = cfg[name]
    out: dict[str, object] = {}
    for o in getattr(cls, "options", ()):
        for k in o.keys():
            out[o.keyword if not o.secret else k] = table[k]
    return out


def keys_markdown() -> str:
    """The key table of docs/agent.md, from the declarations (``python -m gpufleet.regen``)."""
    rows = ["| key | default | meaning |", "|---|---|---|"]
    own = {cls.name: cls for cls in OWN}
    for section, opts in sections().items():
        if section in own:
            rows += own[section].markdown_rows()
            continue
        rows += options.markdown_rows(f"{section}.", opts)
        if section == INFLUX:
            rows.append("| `influx.NAME.*` | as `influx.*` | a further destination `influx.NAME`: every "
                        "`influx` key, with `influx`'s defaults |")
            rows += options.markdown_rows("influx.NAME.", exporter_classes()[INFLUX].destination_options)
    return "\n".join(rows) + "\n"


def _sections_toml(classes: dict[str, type]) -> str:
    lines: list[str] = []
    for name, cls in classes.items():
        if getattr(cls, "options", ()):
            lines += ["", *options.toml_section(name, cls.options)]
    return "\n".join(lines[1:]) + "\n"


def own_sections_toml() -> str:
    """The agent's own sections of ``packaging/config/agent.toml`` (``[agent]``, ``[labels]``,
    ``[spool]``), from their :class:`Section` classes (``python -m gpufleet.regen``)."""
    lines: list[str] = []
    for cls in OWN:
        lines += ["", *cls.toml_lines()]
    return "\n".join(lines[1:]) + "\n"


def collector_sections_toml() -> str:
    """The collectors' sections of ``packaging/config/agent.toml``, every key at its default after
    its help, from the declarations (``python -m gpufleet.regen``)."""
    return _sections_toml(collector_classes())


def exporter_sections_toml() -> str:
    """The exporters' sections of ``packaging/config/agent.toml``, as :func:`collector_sections_toml`."""
    return _sections_toml(exporter_classes())


def _bad(key: str, why: str) -> ConfigError:
    return ConfigError(f"config key '{key}': {why}")


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
    schema = sections()
    own = {cls.name: cls for cls in OWN}
    out: dict[str, dict[str, object]] = {}
    for section, value in doc.items():
        if section not in schema:
            raise _bad(str(section), f"unknown section; expected one of {', '.join(schema)}")
        if not isinstance(value, dict):
            raise _bad(section, "expected a table")
    for section, opts in schema.items():
        given = doc.get(section, {})
        if section in own:
            out[section] = own[section].validate(given)
            continue
        named = {k: v for k, v in given.items() if section == INFLUX and isinstance(v, dict)
                 and k not in {key for o in opts for key in o.keys()}}
        sec = options.validate(opts, given, options.agent_key(section), ignore=named)
        for name, table in named.items():
            sec[name] = _destination_table(str(name), table)
        out[section] = sec
    for name, cls in collector_classes().items():
        check = getattr(cls, "check_options", None)
        if check is not None and name in out:
            check(out[name])
    _cross_check(out)
    return out


def _destination_table(name: str, table: dict) -> dict[str, object]:
    """An ``[influx.NAME]`` table: the keys of ``[influx]`` (with their defaults) and ``spool_dir``."""
    if not _DEST_NAME.match(name):
        raise _bad(f"influx.{name}", "a destination name is letters, digits, '_' and '-', "
                                     "starting with a letter")
    return options.validate(_destination_options(), table, options.agent_key(f"influx.{name}"))


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
            keys = {k for o in _influx_options() for k in o.keys()}
            ix = {k: v for k, v in cfg[INFLUX].items() if k in keys}
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
    known = exporter_classes()
    for x in exporters(c):
        if x in known:
            known[x].check_active(c[x])
            continue
        if x.startswith(INFLUX + "."):
            if x[len(INFLUX) + 1:] in named:
                continue
            raise _bad("agent.exporters", f"{x!r} names no [{x}] table")
        raise _bad("agent.exporters", f"unknown name {x!r}; expected {', '.join(known)} or influx.NAME "
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
    _check_destination(INFLUX, ix, INFLUX in exporters(c))
    _check_exporters(c)
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
