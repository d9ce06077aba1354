"""InfluxDB line protocol: encoding and parsing, escaping done right.

https://docs.influxdata.com/influxdb/v1/write_protocols/line_protocol_reference/
Measurement: escape ``,`` and space. Tag keys, tag values, field keys: escape ``,``, ``=``
and space. String field values: double-quoted, escape ``"`` and ``\\``. Integers end in
``i``. Newlines cannot appear in tag values or keys; they are replaced by a space (a string
field value may hold ``\\n`` as two characters; it is written escaped and read back).
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Iterator, Mapping
from typing import NamedTuple

_MEAS = str.maketrans({",": r"\,", " ": r"\ ", "\n": " ", "\r": " "})
_KEY = str.maketrans({",": r"\,", "=": r"\=", " ": r"\ ", "\n": " ", "\r": " "})
_STR = str.maketrans({'"': r"\"", "\\": r"\\", "\n": r"\n", "\r": r"\r"})


class Point(NamedTuple):
    measurement: str
    tags: dict[str, str]
    fields: dict[str, object]
    time: int  # nanoseconds since the epoch


def escape_measurement(s: str) -> str:
    return s.translate(_MEAS)


def escape_key(s: str) -> str:
    """Escape a tag key, tag value or field key."""
    return s.translate(_KEY)


def format_value(v: object) -> str | None:
    """Format a field value; None (and NaN/inf, which InfluxDB rejects) -> None (field left out)."""
    if v is None:
        return None
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, int):
        return f"{v}i"
    if isinstance(v, float):
        if math.isnan(v) or math.isinf(v):
            return None
        return repr(v)
    return '"' + str(v).translate(_STR) + '"'


def head(measurement: str, tags: Mapping[str, object]) -> str:
    """A row's series head: the escaped measurement and its tags sorted by key; a tag whose
    value is None or empty is left out (the one encoder of heads: agent, simulator, analyzer)."""
    out = escape_measurement(measurement)
    for k in sorted(tags):
        v = tags[k]
        if v is None or v == "":
            continue
        out += f",{escape_key(str(k))}={escape_key(str(v))}"
    return out


def encode(measurement: str, tags: Mapping[str, object], fields: Mapping[str, object],
           time_ns: int | None = None) -> str | None:
    """One line of line protocol, tags sorted; None when no field has a value."""
    parts = []
    for k, v in fields.items():
        fv = format_value(v)
        if fv is not None:
            parts.append(f"{escape_key(k)}={fv}")
    if not parts:
        return None
    line = head(measurement, tags) + " " + ",".join(parts)
    if time_ns is not None:
        line += f" {int(time_ns)}"
    return line


def encode_points(points: Iterable[Point]) -> Iterator[str]:
    for p in points:
        line = encode(p.measurement, p.tags, p.fields, p.time)
        if line is not None:
            yield line


class ParseError(ValueError):
    pass


_UNESC_KEY = re.compile(r"\\([ ,=\\])")
_UNESC_STR = re.compile(r'\\(["\\nr])')
_STR_ESC = {'"': '"', "\\": "\\", "n": "\n", "r": "\r"}


def _split_unescaped(s: str, sep: str, quotes: bool = True, maxsplit: int = -1) -> list[str]:
    """Split on ``sep`` not preceded by a backslash escape (nor inside double quotes, if ``quotes``)."""
    out, buf, i, n, quoted = [], [], 0, len(s), False
    while i < n:
        c = s[i]
        if c == "\\" and i + 1 < n:
            buf.append(s[i:i + 2])
            i += 2
            continue
        if c == '"' and quotes:
            quoted = not quoted
        elif c == sep and not quoted and maxsplit != len(out):
            out.append("".join(buf))
            buf = []
            i += 1
            continue
        buf.append(c)
        i += 1
    out.append("".join(buf))
    return out


def _unkey(s: str) -> str:
    return _UNESC_KEY.sub(r"\1", s) if "\\" in s else s


def _parse_value(raw: str) -> object:
    if not raw:
        raise ParseError("empty field value")
    if raw[0] == '"':
        if len(raw) < 2 or raw[-1] != '"':
            raise ParseError("unterminated string")
        body = raw[1:-1]
        return _UNESC_STR.sub(lambda m: _STR_ESC[m.group(1)], body) if "\\" in body else body
    if "_" in raw:  # Python's int() and float() take "1_000"; line protocol does not
        raise ParseError("bad number")
    last = raw[-1]
    if last == "i" or last == "u":
        return int(raw[:-1])
    if raw in ("t", "T", "true", "True", "TRUE"):
        return True
    if raw in ("f", "F", "false", "False", "FALSE"):
        return False
    return float(raw)


def parse_line(line: str) -> Point:
    """Parse one line of line protocol. Raises ParseError for anything malformed."""
    line = line.rstrip("\n")
    # measurement and tags end at the first unescaped space; quotes are literal there
    head_rest = _split_unescaped(line, " ", quotes=False, maxsplit=1)
    if len(head_rest) != 2:
        raise ParseError("expected 2 or 3 sections, got 1")
    sections = [head_rest[0]] + [s for s in _split_unescaped(head_rest[1], " ") if s != ""]
    if len(sections) not in (2, 3):
        raise ParseError(f"expected 2 or 3 sections, got {len(sections)}")
    head = _split_unescaped(sections[0], ",", quotes=False)
    measurement = _unkey(head[0])
    if not measurement:
        raise ParseError("empty measurement")
    tags: dict[str, str] = {}
    for t in head[1:]:
        kv = _split_unescaped(t, "=", quotes=False)
        if len(kv) != 2 or not kv[0]:
            raise ParseError(f"bad tag {t!r}")
        tags[_unkey(kv[0])] = _unkey(kv[1])
    fields: dict[str, object] = {}
    for f in _split_unescaped(sections[1], ","):
        kv = _split_unescaped(f, "=")
        if len(kv) != 2 or not kv[0]:
            raise ParseError(f"bad field {f!r}")
        try:
            fields[_unkey(kv[0])] = _parse_value(kv[1])
        except ValueError as exc:
            raise ParseError(f"bad field value {kv[1]!r}: {exc}") from None
    try:
        ts = int(sections[2]) if len(sections) == 3 else 0
    except ValueError:
        raise ParseError(f"bad timestamp {sections[2]!r}") from None
    return Point(measurement, tags, fields, ts)
