"""The one way every part of gpufleet reads a secret (tokens, passwords, routing keys).

A secret is never written in a config file: it comes from a file (``<name>_file``) or an
environment variable (``<name>_env``). The rule, the same for the agent, the analyzer, the
alert sinks and ``gpufleet replay``:

- a file: read as UTF-8, surrounding whitespace (the trailing newline) removed;
- a variable: its value, surrounding whitespace removed;
- the value must be one non-empty line: an empty file, an unset or empty variable, a value with a
  line break inside (it would end a header or a config line early) are errors;
- both a file and a variable given: an error (which one wins would be a guess);
- neither: ``None`` (the caller decides whether the secret is required).

Errors are :class:`~gpufleet.errors.ConfigError` naming the option and the path or variable,
never the value.
"""

from __future__ import annotations

import os
from pathlib import Path

from gpufleet.errors import ConfigError


def read_secret(name: str, file: str | os.PathLike | None = None, env: str | None = None) -> str | None:
    """The secret ``name`` from ``file`` or from the environment variable ``env``; None if neither.

    ``name`` is how errors call the option: ``influx.token`` gives ``influx.token_file: ...``, a
    command-line ``--token`` gives ``--token-file: ...``. Empty strings count as not given (a
    config template's ``token_file = ""``).
    """
    sep = "-" if name.startswith("--") else "_"
    fkey, ekey = f"{name}{sep}file", f"{name}{sep}env"
    file = str(file) if file not in (None, "") else ""
    env = str(env) if env not in (None, "") else ""
    if file and env:
        raise ConfigError(f"{name}: give {fkey} or {ekey}, not both")
    if file:
        try:
            value = Path(file).read_text(encoding="utf-8").strip()
        except (OSError, UnicodeDecodeError) as exc:
            why = getattr(exc, "strerror", None) or type(exc).__name__
            raise ConfigError(f"{fkey}: cannot read {file}: {why}") from None
        if not value:
            raise ConfigError(f"{fkey}: {file} is empty")
        where = f"{fkey}: {file}"
    elif env:
        value = os.environ.get(env, "").strip()
        if not value:
            raise ConfigError(f"{ekey}: environment variable {env} is not set or empty")
        where = f"{ekey}: environment variable {env}"
    else:
        return None
    if "\n" in value or "\r" in value:
        raise ConfigError(f"{where} holds more than one line (a secret is one line)")
    return value
