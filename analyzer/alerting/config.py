"""Build sinks from the analyzer's ``[[sink]]`` tables and ``--sink TYPE=URL`` options.

Every problem (unknown type, invalid URL, a secret that is missing, empty or given inline)
is a :class:`gpufleet.errors.ConfigError` naming the sink, raised before anything is sent.
Secrets come from ``*_file`` (a path) or ``*_env`` (an environment variable name) and are
never printed: messages name the sink and the key, never the value.
"""

from __future__ import annotations

import os
from urllib.parse import urlsplit

from gpufleet.analyzer.alerting import action, alertmanager, console, pagerduty, slack, webhook  # noqa: F401 (register)
from gpufleet.analyzer.alerting.base import REGISTRY, Delivery, Sink, redact_url

from gpufleet.errors import ConfigError
from gpufleet.secrets import read_secret

# Environment variables that --sink TYPE=URL options read their secret from.
CLI_SECRET_ENV = {
    "pagerduty": ("routing_key", "GPUFLEET_PAGERDUTY_ROUTING_KEY"),
    "webhook": ("secret", "GPUFLEET_WEBHOOK_SECRET"),
}
SECRET_KEYS = {"pagerduty": ("routing_key",), "webhook": ("secret",), "slack": (), "alertmanager": (),
               "console": (), "action": ()}
REQUIRED_SECRETS = {"pagerduty": ("routing_key",)}
DELIVERY_KEYS = {"timeout", "backoff", "backoff_max", "give_up_after", "rate_limit", "burst"}
COMMON_KEYS = {"type", "name", "url", "url_file", "url_env"} | DELIVERY_KEYS
EXTRA_KEYS = {"alertmanager": {"repost_interval"}, "action": action.OPTION_KEYS}
DEFAULT_RATE = {"alertmanager": 600.0, "console": None, "action": None}
NO_URL = ("console", "action")


def _sink_secret(label: str, key: str, spec: dict) -> str | None:
    """Secret ``key`` of a sink from ``key_file`` or ``key_env`` (:func:`gpufleet.secrets.read_secret`)."""
    if key in spec and key != "url":
        raise ConfigError(f"{label}: '{key}' must not be written in the config; "
                          f"use '{key}_file' or '{key}_env'")
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


def _number(label: str, key: str, value, allow_none: bool = False):
    if value is None and allow_none:
        return None
    try:
        v = float(value)
    except (TypeError, ValueError):
        raise ConfigError(f"{label}: {key} must be a number, got {value!r}") from None
    if v < 0 or v != v:
        raise ConfigError(f"{label}: {key} must be >= 0, got {value!r}")
    return v


def build_sink(spec: dict, label: str, name: str) -> Sink:
    if not isinstance(spec, dict):
        raise ConfigError(f"{label}: must be a table")
    typ = spec.get("type")
    if typ not in REGISTRY:
        raise ConfigError(f"{label}: unknown sink type {typ!r} (known: {', '.join(sorted(REGISTRY))})")
    unknown = set(spec) - COMMON_KEYS - EXTRA_KEYS.get(typ, set()) - {
        f"{k}{s}" for k in SECRET_KEYS[typ] for s in ("", "_file", "_env")}
    if unknown:
        raise ConfigError(f"{label}: unknown key(s) {', '.join(sorted(unknown))}")
    # url: inline, or from a file/env (a Slack webhook URL is itself the credential)
    url = spec.get("url")
    if url is None and ("url_file" in spec or "url_env" in spec):
        url = _sink_secret(label, "url", {k: v for k, v in spec.items() if k != "url"})
    if typ == "pagerduty" and not url:
        url = pagerduty.DEFAULT_URL
    if typ not in NO_URL:
        if not url:
            raise ConfigError(f"{label}: missing url (or url_file / url_env)")
        check_url(label, str(url))
    secrets = {}
    for key in SECRET_KEYS[typ]:
        value = _sink_secret(label, key, spec)
        if value is None and key in REQUIRED_SECRETS.get(typ, ()):
            raise ConfigError(f"{label}: missing {key} (set {key}_file or {key}_env)")
        if value is not None:
            secrets[key] = value
    d = Delivery()
    d.rate_limit = DEFAULT_RATE.get(typ, d.rate_limit)
    for k in DELIVERY_KEYS & set(spec):
        v = _number(label, k, spec[k], allow_none=(k == "rate_limit"))
        setattr(d, k, int(v) if k == "burst" else v)
    if d.timeout <= 0:
        raise ConfigError(f"{label}: timeout must be > 0")
    if d.rate_limit == 0:
        d.rate_limit = None
    if typ == "action":
        if "timeout" not in spec:
            d.timeout = 30.0
        return REGISTRY[typ](name=name, url="", delivery=d, **action.check_options(label, spec))
    extra = {k: _number(label, k, spec[k]) for k in EXTRA_KEYS.get(typ, set()) & set(spec)}
    return REGISTRY[typ](name=name, url=str(url or ""), delivery=d, **secrets, **extra)


def parse_cli_spec(spec: str, config_sinks: list[dict]) -> dict:
    """``TYPE=URL`` (or just ``console``) -> a sink table; secrets from the environment or config."""
    typ, sep, url = spec.partition("=")
    typ = typ.strip()
    if typ not in REGISTRY:
        raise ConfigError(f"--sink {typ or spec!r}: unknown sink type (known: {', '.join(sorted(REGISTRY))})")
    if typ == "action":
        raise ConfigError("--sink action: the action sink needs rules; configure it as a [[sink]] table")
    table: dict = {"type": typ}
    if url:
        table["url"] = url.strip()
    elif typ not in ("console", "pagerduty"):
        raise ConfigError(f"--sink {typ}: expected {typ}=URL")
    if typ in CLI_SECRET_ENV:
        key, var = CLI_SECRET_ENV[typ]
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
