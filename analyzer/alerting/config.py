"""Build sinks from the analyzer's ``[[sink]]`` tables and ``--sink TYPE=URL`` options.

A table is checked against what its sink class declares (:mod:`gpufleet.analyzer.alerting.base`:
``options``, ``needs_url``, ``default_url``, ``delivery_defaults``) through :mod:`gpufleet.options`,
the one validation of the agent, the analyzer and the sinks. Every problem (unknown type or key,
a value of the wrong type or out of range, invalid URL, a secret that is missing, empty or given
inline) is a :class:`gpufleet.errors.ConfigError` naming the sink, raised before anything is sent.
Secrets come from ``*_file`` (a path) or ``*_env`` (an environment variable name) and are
never printed: messages name the sink and the key, never the value.
"""

from __future__ import annotations

import os
from urllib.parse import urlsplit

from gpufleet.analyzer.alerting.base import DELIVERY_OPTIONS, REGISTRY, Delivery, Sink, redact_url

from gpufleet import options
from gpufleet.errors import ConfigError
from gpufleet.secrets import read_secret


def sink_classes() -> dict[str, type[Sink]]:
    """Every sink type: each module of ``analyzer/alerting/`` imported (a sink module registers
    its class with ``@register``; the others are light), then the registry (type -> class)."""
    import importlib
    import pkgutil

    import gpufleet.analyzer.alerting as pkg

    for m in pkgutil.iter_modules(pkg.__path__):
        importlib.import_module(f"{pkg.__name__}.{m.name}")
    return dict(sorted(REGISTRY.items()))  # by type: the same order whatever was imported first


def _sink_secret(label: str, key: str, spec: dict) -> str | None:
    """Secret ``key`` of a sink from ``key_file`` or ``key_env`` (:func:`gpufleet.secrets.read_secret`)."""
    return read_secret(f"{label}: {key}", spec.get(f"{key}_file"), spec.get(f"{key}_env"))


def check_url(label: str, url: str) -> str:
    try:
        parts = urlsplit(url)
        parts.port  # noqa: B018 (raises on a bad port)
    except ValueError:
        raise ConfigError(f"{label}: invalid URL {redact_url(url)}") from None
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ConfigError(f"{label}: invalid URL {redact_url(url)} (need http:// or https:// and a host)")
    return url


def build_sink(spec: dict, label: str, name: str) -> Sink:
    """One sink from its ``[[sink]]`` table, checked against what its class declares
    (``Sink.table_options``: its own options, the delivery keys, the URL)."""
    if not isinstance(spec, dict):
        raise ConfigError(f"{label}: must be a table")
    typ = spec.get("type")
    if typ not in REGISTRY:
        raise ConfigError(f"{label}: unknown sink type {typ!r} (known: {', '.join(sorted(REGISTRY))})")
    cls = REGISTRY[typ]
    table = options.validate(cls.table_options(), spec, lambda k: f"{label}: {k}", ignore=("type", "name"))
    # url: inline, or from a file/env (a Slack webhook URL is itself the credential)
    if spec.get("url") and (table["url_file"] or table["url_env"]):
        raise ConfigError(f"{label}: give url, url_file or url_env, not two of them")
    url = spec.get("url") or _sink_secret(label, "url", table) or cls.default_url
    if cls.needs_url:
        if not url:
            raise ConfigError(f"{label}: missing url (or url_file / url_env)")
        check_url(label, str(url))
    d = Delivery()
    for o in DELIVERY_OPTIONS:
        v = table[o.name]
        setattr(d, o.name, None if v is None else int(v) if o.kind == "int" else float(v))
    if d.rate_limit == 0:
        d.rate_limit = None
    own = {o.keyword: table[o.name] for o in cls.options if not o.secret}
    secrets = options.read_secrets(cls.options, table, lambda k: f"{label}: {k}")
    kwargs = cls.configure(label, {**own, **secrets})
    return cls(name=name, url=str(url or ""), delivery=d, **kwargs)


def keys_markdown() -> str:
    """The sink key tables of docs/alerting.md, from the sink classes (``python -m gpufleet.regen``)."""
    from gpufleet.analyzer.alerting.base import URL_OPTIONS

    sinks = sink_classes()
    types = ", ".join(f"`{t}`" for t in sinks)
    rows = ["Keys every sink takes:", "", "| key | default | meaning |", "|---|---|---|",
            f"| `type` | required | {types} |",
            "| `name` | the type (`slack-2` for a second one) | identifies the sink in the state file and "
            "logs |"]
    need = [t for t, c in sinks.items() if not c.needs_url]
    dflt = [f"{t}: {c.default_url}" for t, c in sinks.items() if c.default_url]
    url, url_secret = URL_OPTIONS
    rows.append(f"| `url` | required ({'; '.join(dflt)}; {', '.join(need)}: none) | {url.help} |")
    rows += options.markdown_rows("", (url_secret,))
    for o in DELIVERY_OPTIONS:
        row = options.markdown_rows("", (o,))[0]
        other = [f"{t}: {options.shown(o, c.delivery_defaults[o.name]) or 'none'}"
                 for t, c in sinks.items() if o.name in c.delivery_defaults]
        rows.append(row[:-2] + f" ({'; '.join(other)}) |" if other else row)
    rows += ["", "Keys of one type:", "", "| type | key | default | meaning |", "|---|---|---|---|"]
    for t, c in sinks.items():
        rows += options.markdown_rows("", c.options, lead=f"`{t}` |")
    return "\n".join(rows) + "\n"


def parse_cli_spec(spec: str, config_sinks: list[dict]) -> dict:
    """``TYPE=URL`` (or just ``console``) -> a sink table; secrets from the environment or config
    (a secret option's ``env`` variable, or its ``_FILE`` twin naming a file)."""
    typ, sep, url = spec.partition("=")
    typ = typ.strip()
    if typ not in REGISTRY:
        raise ConfigError(f"--sink {typ or spec!r}: unknown sink type (known: {', '.join(sorted(REGISTRY))})")
    cls = REGISTRY[typ]
    tables = [o.name for o in cls.options if o.kind == "tables"]
    if tables:
        raise ConfigError(f"--sink {typ}: the {typ} sink needs [[sink.{tables[0]}]] tables; configure it "
                          "as a [[sink]] table")
    table: dict = {"type": typ}
    if url:
        table["url"] = url.strip()
    elif cls.needs_url and not cls.default_url:
        raise ConfigError(f"--sink {typ}: expected {typ}=URL")
    for o in cls.options:
        if not (o.secret and o.env):
            continue
        key, var = o.name, o.env
        if os.environ.get(var, "").strip():
            table[f"{key}_env"] = var
        elif os.environ.get(var + "_FILE", "").strip():
            table[f"{key}_file"] = os.environ[var + "_FILE"]
        else:  # reuse the secret source of a configured sink of the same type
            for c in config_sinks or []:
                if isinstance(c, dict) and c.get("type") == typ:
                    for s in ("_file", "_env"):
                        if key + s in c:
                            table[key + s] = c[key + s]
                    break
    return table


def load_sinks(config_sinks: list[dict] | None, cli_specs: list[str] | None) -> list[Sink]:
    """Sinks from the config's ``[[sink]]`` tables plus ``--sink TYPE=URL`` options.

    Names: ``name`` when the table gives one, else the type (``slack-2`` for the second one);
    a name keys the notification state, so keep it stable across restarts.
    """
    config_sinks = list(config_sinks or [])
    if not isinstance(config_sinks, list):
        raise ConfigError("sink: expected a list of [[sink]] tables")
    specs = [(f"sink #{i + 1}", s) for i, s in enumerate(config_sinks)]
    specs += [(f"--sink {c.partition('=')[0]}", parse_cli_spec(c, config_sinks)) for c in cli_specs or []]
    sinks: list[Sink] = []
    names: set[str] = set()
    for label, spec in specs:
        typ = spec.get("type") if isinstance(spec, dict) else None
        name = spec.get("name") if isinstance(spec, dict) else None
        if name is not None:
            name = str(name)
            if not name or name in names:
                raise ConfigError(f"{label}: sink name {name!r} is empty or used twice")
        else:
            name, n = str(typ), 1
            while name in names:
                n += 1
                name = f"{typ}-{n}"
        if isinstance(spec, dict) and spec.get("name"):
            label = f"{label} ({name})"
        elif typ:
            label = f"{label} ({typ})" if not label.startswith("--sink") else label
        sinks.append(build_sink(spec, label, name))
        names.add(name)
    return sinks
