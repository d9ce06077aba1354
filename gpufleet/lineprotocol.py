"""InfluxDB line protocol: encoding and parsing, both exactly as InfluxDB 1.x reads it.

https://docs.influxdata.com/influxdb/v1/write_protocols/line_protocol_reference/
Measurement: escape ``,`` and space. Tag keys, tag values, field keys: escape ``,``, ``=``
and space. String field values: double-quoted, escape ``"`` and ``\\``. Integers end in
``i`` (int64). InfluxDB has no escape for a line end: a newline or carriage return in a name,
tag or string value is written as a space. A backslash ending a name or tag would escape the
separator after it: a space is added after it. What ``encode`` writes, ``parse_line`` reads
back to the same values and ``encode`` writes again byte for byte (tests check both, and the
parser against a real InfluxDB), for any tag and string value and for measurement and field
names as the catalogue has them (a backslash before ``,`` ``=`` ``"`` or a space in a
measurement or field name is beyond what InfluxDB 1.x can store and read back).
"""

from __future__ import annotations

import math
import re
import sys
from collections.abc import Iterable, Iterator, Mapping
from typing import NamedTuple

_MEAS = str.maketrans({",": r"\,", " ": r"\ ", "\n": r"\ ", "\r": r"\ "})
_KEY = str.maketrans({",": r"\,", "=": r"\=", " ": r"\ ", "\n": r"\ ", "\r": r"\ "})
_STR = str.maketrans({'"': r"\"", "\\": r"\\", "\n": " ", "\r": " "})


class Point(NamedTuple):
    measurement: str
    tags: dict[str, str]
    fields: dict[str, object]
    time: int | None  # nanoseconds since the epoch; None: the line has no timestamp


def escape_measurement(s: str) -> str:
    s = s.translate(_MEAS)
    if s.endswith("\\"):
        s += "\\ "
    return s


def escape_key(s: str) -> str:
    """Escape a tag key, tag value or field key."""
    s = s.translate(_KEY)
    if s.endswith("\\"):
        s += "\\ "
    return s


def format_value(v: object) -> str | None:
    """Format a field value; None (and NaN/inf, which InfluxDB rejects) -> None (field left out)."""
    if v is None:
        return None
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, int):
        return f"{v}i" if -(2**63) <= v < 2**63 else None  # InfluxDB would refuse the whole line
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


# ---------------------------------------------------------------------------------------------
# Parsing: InfluxDB 1.x's own rules (models/points.go of 1.6.7), checked line by line against a
# real influxd by tests/test_lineprotocol_influx.py. Its quirks are kept on purpose, so that a
# fleet read from files is the fleet InfluxDB would store:
#   - measurement and tags end at the first space whose previous byte is not a backslash (a
#     backslash "escapes" the byte after it even when it is itself escaped: ``a\\ b`` is one
#     token); quotes there are literal; the measurement unescapes ``\,`` ``\ `` ``\=`` ``\"``,
#     tag keys and values ``\,`` ``\ `` ``\=`` only (``\\`` stays two backslashes);
#   - the field section is checked with backslash pairs skipped, then split into keys and values
#     with the previous-byte rule again (``k\\=1,z=2i`` is one field ``k\=1,z``); string values
#     unescape ``\\`` and ``\"`` only (``\n`` is a backslash and an n);
#   - numbers: ``-?digits[.digits][e[+-]digits]`` (finite), integers ``-?digits`` + ``i`` within
#     int64, booleans t T true True TRUE f F false False FALSE; no ``+``, ``inf``, ``nan``,
#     ``u`` (unsigned is off in 1.x), ``_``;
#   - a key written twice keeps its last value; the same key with two types rejects the line;
#   - a field named ``time`` is dropped (the line too when it was the only field); a tag key
#     ``time`` rejects the line; a measurement or field key that is not valid UTF-8 rejects the
#     line (InfluxDB fails the write);
#   - timestamp ``-?digits`` in [-2**63 + 2, 2**63 - 2], only spaces after it; absent: ``time``
#     is None (InfluxDB would stamp the arrival time).
# ---------------------------------------------------------------------------------------------

_MAX_KEY = 65535
_MIN_NS, _MAX_NS = -(2**63) + 2, 2**63 - 2
_SP, _TAB, _NUL, _COMMA, _EQ, _BS, _QUOTE = 32, 9, 0, 44, 61, 92, 34
_DIGITS = frozenset(b"0123456789")
_NUMERIC = frozenset(b"0123456789.")
_FLOAT = re.compile(rb"-?(?:[0-9]+\.?[0-9]*|\.[0-9]+)(?:[eE][+-]?[0-9]+)?\Z")
_INT = re.compile(rb"-?[0-9]+\Z")
_TRUE = (b"true", b"True", b"TRUE", b"t", b"T")
_FALSE = (b"false", b"False", b"FALSE", b"f", b"F")
_FIELD_UNESC = re.compile(rb'\\([ ,="])')
_STR_UNESC = re.compile(rb'\\([\\"])')


def _skip_ws(b: bytes, i: int) -> int:
    n = len(b)
    while i < n and b[i] in (_SP, _TAB, _NUL):
        i += 1
    return i


def skip_line(line: bytes) -> bool:
    """An empty, blank or comment line: InfluxDB skips it silently (neither point nor error)."""
    i = _skip_ws(line, 0)
    return i >= len(line) or line[i] == ord("#")


def _scan_to(b: bytes, i: int, stop: int) -> int:
    """Index of the first ``stop`` at or after i whose previous byte is not a backslash."""
    n = len(b)
    while i < n:
        if b[i] == stop and (i == 0 or b[i - 1] != _BS):
            return i
        i += 1
    return n


def _scan_head(b: bytes, i: int) -> tuple[int, list[int]]:
    """End of the measurement and tags (the index of the space after them) and the start of
    each tag; raises ParseError where InfluxDB does."""
    n = len(b)
    if i >= n or b[i] == _COMMA:
        raise ParseError("missing measurement")
    while True:  # the measurement
        i += 1
        if i >= n:
            raise ParseError("missing fields")
        if b[i - 1] == _BS:
            continue
        if b[i] == _SP:
            return i, []
        if b[i] == _COMMA:
            i += 1
            break
    starts = []
    while True:  # tags: key=value[,key=value...]
        starts.append(i)
        if i >= n or b[i] in (_SP, _COMMA, _EQ):
            raise ParseError("missing tag key")
        while True:
            i += 1
            if i >= n or (b[i] in (_SP, _COMMA) and b[i - 1] != _BS):
                raise ParseError("missing tag value")
            if b[i] == _EQ and b[i - 1] != _BS:
                i += 1
                break
        if i >= n or b[i] in (_COMMA, _SP):
            raise ParseError("missing tag value")
        while True:
            i += 1
            if i >= n:
                raise ParseError("missing fields")
            c = b[i]
            if b[i - 1] == _BS:
                continue
            if c == _EQ:
                raise ParseError("invalid tag format")
            if c == _COMMA:
                i += 1
                break
            if c == _SP:
                return i, starts


def _unescape_name(raw: bytes) -> bytes:
    return _FIELD_UNESC.sub(rb"\1", raw) if b"\\" in raw else raw


def _unescape_tag(raw: bytes) -> bytes:
    return raw.replace(b"\\,", b",").replace(b"\\ ", b" ").replace(b"\\=", b"=")


_PLACE = {b"\\,": b"\x00", b"\\ ": b"\x01", b"\\=": b"\x02"}
_UNPLACE = bytes.maketrans(b"\x00\x01\x02", b", =")


def parse_head(head: bytes) -> tuple[str, dict[str, str]]:
    """Measurement and tags of a series head (the bytes before the first unescaped space)."""
    if b"\\\\" not in head and head[-1:] != b"\\" and not any(c in head for c in b"\x00\x01\x02"):
        # the common case, by splits: every backslash escapes the one byte after it, so the
        # escaped delimiters can stand aside as placeholders (the same answer as the scan, tested)
        esc = b"\\" in head
        raw = head
        if esc:
            for k, v in _PLACE.items():
                raw = raw.replace(k, v)
        if b" " not in raw:
            return _split_head(raw, esc, len(head))
    b = head + b" "
    end, starts = _scan_head(b, 0)
    if end != len(head):
        raise ParseError("unexpected space in measurement or tags")
    return _head_parts(b, end, starts)


def _split_head(raw: bytes, esc: bool, size: int) -> tuple[str, dict[str, str]]:
    if not raw or raw[0] == _COMMA:
        raise ParseError("missing measurement")
    meas, *pairs = raw.split(b",")
    if esc:
        meas = meas.translate(_UNPLACE).replace(b'\\"', b'"')
    try:
        measurement = meas.decode("utf-8")
    except UnicodeDecodeError:
        raise ParseError("measurement is not valid UTF-8") from None
    tags = {}
    seen = set()
    for pair in pairs:
        got = _PAIRS.get(pair)
        if got is None:
            got = _tag_pair(pair)
            if len(_PAIRS) >= _PAIRS_MAX:
                _PAIRS.clear()
            _PAIRS[pair] = got
        k, key, value = got
        if k in seen:
            raise ParseError("duplicate tags")
        seen.add(k)
        tags[key] = value
    if size > _MAX_KEY:
        raise ParseError(f"max key length exceeded: {size} > {_MAX_KEY}")
    return measurement, tags


# a fleet's series heads share most of their tag pairs (a GPU's host, rack, model and UUID in each
# of its links' heads): each pair as written (escapes as placeholders) is read once
_PAIRS: dict[bytes, tuple[bytes, str, str]] = {}
_PAIRS_MAX = 1 << 16


def _tag_pair(pair: bytes) -> tuple[bytes, str, str]:
    """One ``key=value`` of a head split by ``parse_head``: (the key's bytes, key, value)."""
    k, _, v = pair.partition(b"=")
    if not k or not v or b"=" in v[1:]:
        raise ParseError(f"bad tag {pair!r}")
    k, v = k.translate(_UNPLACE), v.translate(_UNPLACE)  # (no placeholder: unchanged)
    if k == b"time":
        raise ParseError('invalid tag key "time"')
    return k, sys.intern(k.decode("utf-8", "replace")), sys.intern(v.decode("utf-8", "replace"))


def _head_parts(b: bytes, end: int, starts: list[int]) -> tuple[str, dict[str, str]]:
    if end > _MAX_KEY:
        raise ParseError(f"max key length exceeded: {end} > {_MAX_KEY}")
    meas_end = starts[0] - 1 if starts else end
    raw_meas = _unescape_name(b[:meas_end])
    try:
        measurement = raw_meas.decode("utf-8")
    except UnicodeDecodeError:
        raise ParseError("measurement is not valid UTF-8") from None
    tags: dict[str, str] = {}
    keys = set()
    escaped = b"\\" in b[:end]
    for j, s in enumerate(starts):
        e = starts[j + 1] - 1 if j + 1 < len(starts) else end
        k = _scan_to(b, s, _EQ)
        key, value = b[s:k], b[k + 1 : e]
        if key in keys:
            raise ParseError("duplicate tags")
        keys.add(key)
        if escaped:
            key, value = _unescape_tag(key), _unescape_tag(value)
        if key == b"time":
            raise ParseError('invalid tag key "time"')
        tags[key.decode("utf-8", "replace")] = value.decode("utf-8", "replace")
    return measurement, tags


def _scan_number(b: bytes, i: int) -> int:
    n, start = len(b), i
    is_int = is_uint = decimal = scientific = False
    if i < n and b[i] == ord("-"):
        i += 1
        if i == n:
            raise ParseError("invalid number")
    while i < n:
        c = b[i]
        if c in (_COMMA, _SP):
            break
        if c == ord("i") and i > start and not (is_int or is_uint):
            is_int = True
            i += 1
            continue
        if c == ord("u") and i > start and not (is_int or is_uint):
            is_uint = True
            i += 1
            continue
        if c == ord("."):
            if decimal:
                raise ParseError("invalid number")
            decimal = True
        if i > start and c in b"eE":
            scientific = True
            i += 1
            continue
        if c in b"+-" and b[i - 1] in b"eE":
            i += 1
            continue
        if c not in _NUMERIC:
            raise ParseError("invalid number")
        i += 1
    if (is_int or is_uint) and (decimal or scientific):
        raise ParseError("invalid number")
    digits = i - start - is_int - decimal - (b[start] == ord("-"))
    if digits == 0:
        raise ParseError("invalid number")
    if is_uint:
        raise ParseError("unsigned integers are not enabled (InfluxDB 1.x)")
    if is_int:
        if b[i - 1] != ord("i"):
            raise ParseError("invalid number")
        if not -(2**63) <= int(b[start : i - 1]) < 2**63:
            raise ParseError(f"integer out of range: {b[start:i - 1].decode()}")
    elif not _FLOAT.match(b, start, i) or not math.isfinite(float(b[start:i])):
        raise ParseError("invalid float")
    return i


def _scan_boolean(b: bytes, i: int) -> int:
    n, start = len(b), i
    if b[i] not in b"tfTF":
        raise ParseError("invalid boolean")
    i += 1
    while i < n and b[i] not in (_COMMA, _SP):
        i += 1
    if i - start > 1 and b[start:i] not in _TRUE and b[start:i] not in _FALSE:
        raise ParseError("invalid boolean")
    return i


def _scan_fields(b: bytes, i: int) -> tuple[int, int]:
    """(start, end) of the field section, checked as InfluxDB checks it."""
    n = len(b)
    start = i = _skip_ws(b, i)
    quoted = False
    equals = commas = 0
    while i < n:
        c = b[i]
        if c == _BS and i + 1 < n:
            i += 2
            continue
        if c == _QUOTE and equals > commas:
            quoted = not quoted
            i += 1
            continue
        if c == _EQ and not quoted:
            equals += 1
            if b[i - 1] in (_SP, _COMMA) and b[i - 2] != _BS:
                raise ParseError("missing field key")
            if i + 1 >= n or b[i + 1] in (_COMMA, _SP):
                raise ParseError("missing field value")
            nxt = b[i + 1]
            if nxt in _NUMERIC or nxt in b"-Nn":
                i = _scan_number(b, i + 1)
                continue
            if nxt != _QUOTE:
                i = _scan_boolean(b, i + 1)
                continue
        if c == _COMMA and not quoted:
            commas += 1
        elif c == _SP and not quoted:
            break
        i += 1
    if quoted:
        raise ParseError("unbalanced quotes")
    if equals == 0 or commas != equals - 1:
        raise ParseError("invalid field format")
    return start, i


def _field_value_end(f: bytes, i: int) -> int:
    quoted = False
    n = len(f)
    while i < n:
        c = f[i]
        if c == _BS and i + 1 < n and f[i + 1] in (_QUOTE, _BS):
            i += 2
            continue
        if c == _QUOTE:
            quoted = not quoted
        elif c == _COMMA and not quoted:
            break
        i += 1
    return i


def _field_value(v: bytes) -> object:
    c = v[0]
    if c == _QUOTE:
        body = v[1:-1]
        if b"\\" in body:
            body = _STR_UNESC.sub(rb"\1", body)
        return body.decode("utf-8", "replace")
    if c in b"0123456789-.nNiIu":
        last = v[-1]
        if last == ord("i"):
            if not _INT.match(v, 0, len(v) - 1) or not -(2**63) <= int(v[:-1]) < 2**63:
                raise ParseError(f"invalid integer {v!r}")
            return int(v[:-1])
        if last == ord("u"):
            raise ParseError("unsigned integers are not enabled (InfluxDB 1.x)")
        if not _FLOAT.match(v):
            raise ParseError(f"invalid float {v!r}")
        return float(v)
    if v in _TRUE:
        return True
    if v in _FALSE:
        return False
    raise ParseError(f"invalid boolean {v!r}")


def _fields(b: bytes, start: int, end: int, key_len: int) -> dict[str, object]:
    """Keys and values of a checked field section, split as InfluxDB's field iterator splits it."""
    f = b[start:end]
    out: dict[str, object] = {}
    pos, n = 0, len(f)
    while pos < n:
        k = _scan_to(f, pos, _EQ)
        raw = f[pos:k]
        if key_len + 4 + len(raw) > _MAX_KEY:
            raise ParseError("max key length exceeded")
        e = _field_value_end(f, k + 1)
        v = f[k + 1 : e]
        pos = e + 1
        if not v:
            raise ParseError(f"field {raw!r} has no value")
        try:
            key = _unescape_name(raw).decode("utf-8")
        except UnicodeDecodeError:
            raise ParseError("field key is not valid UTF-8") from None
        val = _field_value(v)
        if key in out and type(out[key]) is not type(val) and key != "time":
            raise ParseError(f"field type conflict on {key!r}")
        out[key] = val
    out.pop("time", None)
    if not out:
        raise ParseError('no field left (a field named "time" is dropped)')
    return out


def _scan_time(b: bytes, i: int) -> int | None:
    n = len(b)
    start = i = _skip_ws(b, i)
    while i < n and b[i] != _SP:
        if not (b[i] in _DIGITS or (i == start and b[i] == ord("-"))):
            raise ParseError("bad timestamp")
        i += 1
    if i == start:
        return None
    try:
        ts = int(b[start:i])
    except ValueError:
        raise ParseError("bad timestamp") from None
    if not _MIN_NS <= ts <= _MAX_NS:
        raise ParseError(f"time outside range {_MIN_NS} - {_MAX_NS}")
    if b[i:].strip(b" "):
        raise ParseError("point is invalid")
    return ts


def parse_line(line: str | bytes) -> Point:
    """Parse one line of line protocol as InfluxDB 1.x does. Raises ParseError for anything it
    rejects (a blank or comment line included); ``time`` is None when the line has none."""
    b = line.encode("utf-8", "surrogateescape") if isinstance(line, str) else bytes(line)
    if b.endswith(b"\n"):
        b = b[:-1]
    if skip_line(b):
        raise ParseError("empty line or comment")
    b = b[_skip_ws(b, 0) :]
    end, starts = _scan_head(b, 0)
    measurement, tags = _head_parts(b, end, starts)
    f0, f1 = _scan_fields(b, end)
    fields = _fields(b, f0, f1, end)
    return Point(measurement, tags, fields, _scan_time(b, f1))
