"""Options declared on a part's class, and the one way every config table is checked against them.

A part (an agent collector or exporter, an alert sink, a section of the agent or the analyzer)
declares its options as a tuple of :class:`Option`: name, type, range, default, whether it is a
secret, one line of help. Everything else derives from that tuple:

- :func:`validate` checks one table: an unknown key, a value of the wrong type or out of range is
  one :class:`~gpufleet.errors.ConfigError` line naming the key (the CLIs exit 2); it returns the
  table with every default filled in;
- a secret option ``NAME`` is never written in a config: the table holds ``NAME_file`` (a path) or
  ``NAME_env`` (a variable name) and :func:`read_secrets` reads it through
  :func:`gpufleet.secrets.read_secret`; an inline ``NAME`` is refused with a line saying so. The
  value is never part of an error message;
- :func:`markdown_rows` gives a table's rows for the docs (``python -m gpufleet.regen``).

Types (``Option.kind``): ``str``, ``path``, ``choice`` (one of ``choices``), ``bool``, ``int``,
``float``, ``duration`` (seconds: a number or ``"10s"``, ``"5m"``), ``size`` (bytes: a number or
``"64MiB"``), ``strlist`` (a list of distinct non-empty names, from ``choices`` when given),
``intlist`` (a list of integers, each within the range), ``tables`` (a list of tables, checked by
the part itself) and ``secret``. An ``int`` may be written as a whole float (``3.0``).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from gpufleet.errors import ConfigError
from gpufleet.units import format_duration, parse_duration, parse_size

KINDS = ("str", "path", "choice", "bool", "int", "float", "duration", "size", "strlist", "intlist", "tables",
         "secret")


@dataclass(frozen=True)
class Option:
    """One key of a config table, as a part declares it.

    ``lo``/``hi``: the inclusive range of a number (``lo_open``: ``lo`` itself is refused);
    ``none_ok``: ``None`` passes (a programmatic table; TOML has no null); ``required``: a secret
    or value that must be given; ``env``: for a secret, the environment variable a command-line
    shortcut reads it from; ``arg``: the part's constructor keyword where it differs from ``name``.
    """

    name: str
    kind: str
    default: object = None
    help: str = ""
    lo: float | None = None
    hi: float | None = None
    choices: tuple = ()
    lo_open: bool = False
    none_ok: bool = False
    required: bool = False
    env: str = ""
    arg: str = ""

    def __post_init__(self):
        if self.kind not in KINDS:
            raise ValueError(f"option {self.name}: unknown kind {self.kind!r}")

    @property
    def secret(self) -> bool:
        return self.kind == "secret"

    @property
    def keyword(self) -> str:
        return self.arg or self.name

    def keys(self) -> tuple[str, ...]:
        """The keys this option takes in a table: ``NAME_file`` and ``NAME_env`` for a secret."""
        return (f"{self.name}_file", f"{self.name}_env") if self.secret else (self.name,)


Where = Callable[[str], str]  # key -> how an error names it ("config key 'ipmi.port'", "sink #1: timeout")


def agent_key(section: str) -> Where:
    """How the agent's errors name a key: ``config key 'SECTION.KEY'``."""
    return lambda key: f"config key '{section}.{key}'"


def check(where: str, opt: Option, v: object) -> object:
    """One value of ``opt``, checked; ``where`` names it in the error."""
    def bad(why: str) -> ConfigError:
        return ConfigError(f"{where}: {why}")

    k = opt.kind
    if v is None and opt.none_ok:
        return None
    if k in ("str", "path", "choice", "secret"):
        if not isinstance(v, str):
            raise bad(f"expected a string, got {type(v).__name__}")
        if "\x00" in v:
            raise bad("contains a NUL byte")
        if k == "choice" and v not in opt.choices:
            raise bad(f"expected one of {', '.join(opt.choices)}, got {v!r}")
        return v
    if k == "bool":
        if not isinstance(v, bool):
            raise bad(f"expected true or false, got {v!r}")
        return v
    if k == "strlist":
        if not isinstance(v, list) or not all(isinstance(x, str) and x for x in v):
            raise bad("expected a list of names")
        if len(set(v)) != len(v):
            raise bad("names listed twice")
        for x in v:
            if opt.choices and x not in opt.choices:
                raise bad(f"unknown name {x!r}; expected {', '.join(opt.choices)}")
        return list(v)
    if k == "intlist":
        if not isinstance(v, list) or not all(isinstance(x, int) and not isinstance(x, bool)
                                              and (opt.lo is None or x >= opt.lo)
                                              and (opt.hi is None or x <= opt.hi) for x in v):
            raise bad(f"expected a list of integers{_between(opt)}, got {v!r}")
        return list(v)
    if k == "tables":
        if not isinstance(v, list) or not all(isinstance(x, dict) for x in v):
            raise bad("expected a list of tables")
        return v
    out: float
    if k == "int":
        if isinstance(v, float) and v.is_integer():
            v = int(v)
        if not isinstance(v, int) or isinstance(v, bool):
            raise bad(f"expected an integer, got {v!r}")
        out = v
    elif k == "float":
        if not isinstance(v, int | float) or isinstance(v, bool):
            raise bad(f"expected a number, got {v!r}")
        out = float(v)
    elif k == "duration":
        out = parse_duration(v, where, ConfigError)
    else:  # size
        out = parse_size(v, where, ConfigError)
    if isinstance(out, float) and not math.isfinite(out):
        raise bad(f"not a finite number: {v!r}")
    if opt.lo is not None and (out < opt.lo or (opt.lo_open and out == opt.lo)):
        raise bad(f"{v!r} is {'not above' if opt.lo_open else 'below'} the minimum {opt.lo:g}")
    if opt.hi is not None and out > opt.hi:
        raise bad(f"{v!r} is above the maximum {opt.hi:g}")
    return out


def _between(opt: Option) -> str:
    return f" from {opt.lo:g} to {opt.hi:g}" if opt.lo is not None and opt.hi is not None else ""


def validate(options: Iterable[Option], given: dict, where: Where, *, ignore: Iterable[str] = ()) -> dict:
    """``given`` checked against ``options``: every key known and valid, defaults filled in.

    A secret option fills ``NAME_file`` and ``NAME_env`` (default ``""``); giving ``NAME`` itself,
    or both, is an error. ``ignore``: keys the caller checks itself (left out of the result).
    """
    opts = list(options)
    by_key: dict[str, Option] = {}
    for o in opts:
        for k in o.keys():
            by_key[k] = o
    skip = set(ignore)
    for key in given:
        if key in by_key or key in skip:
            continue
        if any(o.secret and o.name == key for o in opts):
            raise ConfigError(f"{where(key)}: a secret is never written in the config; "
                              f"use {key}_file or {key}_env")
        raise ConfigError(f"{where(key)}: unknown key")
    out: dict[str, object] = {}
    for o in opts:
        if o.secret:
            fkey, ekey = o.keys()
            for k in (fkey, ekey):
                out[k] = check(where(k), Option(k, "str"), given[k]) if k in given else ""
            if out[fkey] and out[ekey]:
                raise ConfigError(f"{where(fkey)}: give {fkey} or {ekey}, not both")
            continue
        if o.name in given:
            out[o.name] = check(where(o.name), o, given[o.name])
        elif o.required:
            raise ConfigError(f"{where(o.name)}: missing")
        else:
            out[o.name] = o.default
    return out


def read_secrets(options: Iterable[Option], table: dict, name: Callable[[str], str]) -> dict[str, str]:
    """The secrets of a validated table, read from their ``*_file`` / ``*_env`` keys: option name ->
    value, only those given. ``name(option)`` is how errors call it (``ipmi.password``); a
    required one that is missing is an error saying which keys give it."""
    from gpufleet.secrets import read_secret

    out = {}
    for o in options:
        if not o.secret:
            continue
        value = read_secret(name(o.name), table.get(f"{o.name}_file"), table.get(f"{o.name}_env"))
        if value is None and o.required:
            raise ConfigError(f"{name(o.name)}: missing (set {o.name}_file or {o.name}_env)")
        if value is not None:
            out[o.name] = value
    return out


def defaults(options: Iterable[Option]) -> dict:
    """The table of every default (secrets as empty ``*_file`` / ``*_env``)."""
    return validate(options, {}, lambda k: k, ignore=())


# ---------------------------------------------------------------------------------------- docs
def _num(x: float) -> str:
    return f"{x:g}" if isinstance(x, float) else str(x)


def _duration(s: float) -> str:
    return format_duration(s)


def _size(b: int) -> str:
    for unit, n in (("TiB", 2**40), ("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if b >= n and b % n == 0:
            return f"{b // n}{unit}"
    return str(b)


def shown(opt: Option, value: object) -> str:
    """A value as the config writes it (``10s``, ``64MiB``, ``true``, ``["gpu", "host"]``)."""
    if value is None or value == "":
        return ""
    if isinstance(value, bool):
        return "true" if value else "false"
    if opt.kind == "duration" and isinstance(value, int | float):
        return _duration(float(value)) if value else "0"
    if opt.kind == "size" and isinstance(value, int):
        return _size(value) if value else "0"
    if isinstance(value, list | tuple):
        return "[" + ", ".join(f'"{x}"' for x in value) + "]"
    if isinstance(value, float | int):
        return _num(value)
    return str(value)


def _range(opt: Option) -> str:
    if opt.choices and opt.kind in ("choice", "strlist"):
        return ("one of " if opt.kind == "choice" else "from ") + ", ".join(f"`{c}`" if c else '`""`'
                                                                             for c in opt.choices)
    if opt.lo is None and opt.hi is None:
        return ""
    lo = "" if opt.lo is None else shown(opt, opt.lo if opt.kind != "size" else int(opt.lo)) or "0"
    hi = "" if opt.hi is None else shown(opt, opt.hi if opt.kind != "size" else int(opt.hi))
    if opt.lo_open:
        return f"> {lo}" + (f", ≤ {hi}" if hi else "")
    return f"{lo} .. {hi}" if hi else f"≥ {lo}"


def markdown_rows(prefix: str, options: Iterable[Option], lead: str = "") -> list[str]:
    """One ``| key | default | meaning |`` row per key of ``options`` (``prefix``: ``"ipmi."``;
    ``lead``: a first cell before the key, e.g. the sink type)."""
    return [f"| {lead} {row[2:]}" if lead else row for row in _rows(prefix, options)]


def _rows(prefix: str, options: Iterable[Option]) -> list[str]:
    rows = []
    for o in options:
        default = shown(o, o.default)
        meaning = o.help.replace("|", "\\|")
        rng = _range(o)
        if rng:
            meaning = f"{meaning} ({rng})" if meaning else rng
        if o.secret:
            rows.append(f"| `{prefix}{o.name}_file`, `{prefix}{o.name}_env` | | secret: "
                        f"{'required; ' if o.required else ''}{meaning} (a file, or an environment "
                        f"variable; never inline) |")
            continue
        if o.required:
            default = "required"
        shown_default = f"`{default}` " if default else ""
        rows.append(f"| `{prefix}{o.name}` | {shown_default}| {meaning} |".replace("|  |", "| |"))
    return rows


def toml_value(opt: Option, value: object) -> str:
    """``value`` as a TOML value, as the example config writes it (``"10s"``, ``"64MiB"``)."""
    import json

    if isinstance(value, bool):
        return "true" if value else "false"
    if opt.kind == "duration" and isinstance(value, int | float):
        return f'"{_duration(float(value))}"' if value else '"0s"'
    if opt.kind == "size" and isinstance(value, int) and value:
        return f'"{_size(value)}"'
    if isinstance(value, list | tuple):
        return "[" + ", ".join(json.dumps(x) for x in value) + "]"
    if isinstance(value, float):
        return repr(value)
    if isinstance(value, int):
        return str(value)
    return json.dumps("" if value is None else str(value), ensure_ascii=False)


def toml_section(section: str, options: Iterable[Option], values: dict | None = None,
                 width: int = 100) -> list[str]:
    """``[section]`` with every key at its default (or its value in ``values``), each after its
    help as comment lines."""
    import textwrap

    out = [f"[{section}]"]
    for o in options:
        words = o.help.replace("`", "")
        rng = _range(o).replace("`", "")
        if rng:
            words = f"{words} ({rng})" if words else rng
        if o.secret:
            words = f"secret, from a file or an environment variable, never inline: {words}"
        out += textwrap.wrap(words, width - 2, initial_indent="# ", subsequent_indent="# ")
        if o.secret:
            out += [f'{o.name}_file = ""', f'{o.name}_env = ""']
        else:
            out.append(f"{o.name} = {toml_value(o, (values or {}).get(o.name, o.default))}")
    return out


def replace_block(text: str, name: str, body: str, comment: tuple[str, str] = ("<!--", " -->")) -> str:
    """``text`` with the generated block ``name`` (between its BEGIN and END comment lines)
    replaced by ``body``; a missing marker is a ValueError naming it. ``comment``: how the file
    opens and closes a comment (``("#", "")`` in TOML)."""
    a, b = comment
    begin = f"{a} BEGIN {name} (python -m gpufleet.regen){b}"
    end = f"{a} END {name}{b}"
    if begin not in text or end not in text:
        raise ValueError(f"no generated block {name!r}: add the lines {begin} and {end}")
    i, j = text.index(begin) + len(begin), text.index(end)
    return text[:i] + "\n" + body + text[j:]
