"""One definition of the InfluxDB flags every subcommand that talks to InfluxDB takes.

``@influx_options()`` adds the same eight options to a click command, with the same names and
help everywhere: ``--influx-url``, ``--influx-api``, ``--influx-db``, ``--influx-bucket``,
``--influx-org``, ``--influx-user``, ``--influx-password-file``, ``--influx-token-file``; the
command receives them as one :class:`InfluxFlags` (``influx``). A command that has no use for one
of them refuses it in one line (:meth:`InfluxFlags.refuse`, exit 2) rather than ignoring it.
docs/operations.md's flag table lists them; a test holds every command's ``--help`` to it.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, fields

import click

from gpufleet.errors import ConfigError

# (name, flag, help): the one spelling and meaning of each flag
INFLUX: tuple[tuple[str, str, str], ...] = (
    ("url", "--influx-url", "InfluxDB base URL, e.g. http://localhost:8086."),
    ("api", "--influx-api", "Server API: v1 (database, user/password), v2 (bucket, org, token), "
                            "v3 (database, token)."),
    ("db", "--influx-db", "Database (v1, v3; v2 through a DBRP mapping)."),
    ("bucket", "--influx-bucket", "Bucket (v2)."),
    ("org", "--influx-org", "Organisation (v2)."),
    ("user", "--influx-user", "User (v1)."),
    ("password_file", "--influx-password-file", "File holding the user's password (v1)."),
    ("token_file", "--influx-token-file", "File holding the API token (v2, v3)."),
)
APIS = ("v1", "v2", "v3")
FLAG = {name: flag for name, flag, _ in INFLUX}


@dataclass(frozen=True)
class InfluxFlags:
    url: str | None = None
    api: str | None = None
    db: str | None = None
    bucket: str | None = None
    org: str | None = None
    user: str | None = None
    password_file: str | None = None
    token_file: str | None = None

    def refuse(self, names: tuple[str, ...] | list[str], why: str) -> None:
        """A ConfigError (exit 2) naming the first of ``names`` that was given, and ``why``."""
        for n in names:
            if getattr(self, n) not in (None, ()):
                raise ConfigError(f"{FLAG[n]}: {why}")

    def secrets(self) -> dict:
        """``username``, ``password``, ``token`` from the flags (files read now), those given."""
        from gpufleet.secrets import read_secret

        out: dict[str, str | None] = {}
        if self.user:
            out["username"] = self.user
        if self.password_file:
            out["password"] = read_secret(FLAG["password_file"], self.password_file)
        if self.token_file:
            out["token"] = read_secret(FLAG["token_file"], self.token_file)
        return out


def influx_options(defaults: dict | None = None, required: tuple[str, ...] = ()):
    """Decorator: the eight ``--influx-*`` options (``defaults`` per name, shown in --help;
    ``required`` names), passed to the command as ``influx: InfluxFlags``."""
    defaults = defaults or {}

    def deco(f):
        @functools.wraps(f)
        def wrapper(*args, **kwargs):
            kwargs["influx"] = InfluxFlags(**{x.name: kwargs.pop(f"influx_{x.name}")
                                              for x in fields(InfluxFlags)})
            return f(*args, **kwargs)

        for name, flag, text in reversed(INFLUX):
            wrapper = click.option(
                flag, f"influx_{name}", default=defaults.get(name), show_default=name in defaults,
                required=name in required, help=text,
                type=click.Choice(APIS) if name == "api" else None,
            )(wrapper)
        return wrapper

    return deco
