"""Differential test: every line of the corpus (tests/lp_corpus.py) is written to a real InfluxDB
1.6.7 and read back, and parsed by the reference parser (gpufleet.lineprotocol.parse_line) and
both engines of the analyzer's parser (C and numpy). All four must agree on every line: accepted
or rejected, measurement, tags, fields with their types (64-bit integers exact) and timestamp.

Lines are written in batches, one database per batch, to stay fast. So that the lines of a batch
cannot touch each other (field types, series), a line starting with a letter or digit gets a
unique prefix on its measurement (``q00017_`` + the line: the same grammar, a name of its own);
the others, and lines InfluxDB would read into the next line (an open quote or a trailing
backslash), are written alone. A batch InfluxDB fails as a whole (a field type conflict inside a
line, a measurement that is not UTF-8) is written again one line per database.
"""

from __future__ import annotations

import json
import math
import re
import time

import pytest
import requests
from gpufleet.analyzer.parse import Parser

from gpufleet.lineprotocol import ParseError, parse_line, skip_line
from tests.lp_corpus import corpus
from tests.servers import InfluxDB1, skip_unless
from tests.test_analyzer_parse import typed_points

BATCH = 400
NOW = "now"  # the time of a line without one: InfluxDB stamps its arrival
_SELECT = "SELECT * FROM {} WHERE time >= -9223372036854775806 AND time <= 9223372036854775806 GROUP BY *"


def _typed(v) -> tuple[str, object]:
    if isinstance(v, bool):
        return ("boolean", v)
    if isinstance(v, int):
        return ("integer", v)
    if isinstance(v, float):
        return ("float", v)
    return ("string", v)


def _point(measurement: str, tags: dict, t, fields: dict) -> tuple:
    typed = tuple(sorted((k, _typed(v)) for k, v in fields.items()))
    return (measurement, tuple(sorted(tags.items())), t, typed)


def reference(line: bytes) -> tuple | None:
    try:
        p = parse_line(line)
    except ParseError:
        return None
    return _point(p.measurement, p.tags, NOW if p.time is None else p.time, p.fields)


def engine_points(engine: str, lines: list[bytes]) -> tuple[list[tuple], Parser]:
    p = Parser(engine=engine)
    rows = p.feed(b"\n".join(lines) + b"\n")
    return sorted((_point(*pt) for pt in typed_points(p, rows)), key=repr), p


# ------------------------------------------------------------------ InfluxDB side
def _scan_line_end(buf: bytes) -> int:
    """Where InfluxDB ends the line starting at buf[0] (models.scanLine: a newline inside a quoted
    field value, or right after a backslash, does not end it)."""
    i, quoted, fields, equals, commas = 0, False, False, 0, 0
    while i < len(buf):
        c = buf[i]
        if c == 0x5C and i + 2 < len(buf):
            i += 2
            continue
        if c == 0x20:
            fields = True
        if fields:
            if not quoted and c == 0x3D:
                i, equals = i + 1, equals + 1
                continue
            if not quoted and c == 0x2C:
                i, commas = i + 1, commas + 1
                continue
            if c == 0x22 and equals > commas:
                i, quoted = i + 1, not quoted
                continue
        if c == 0x0A and not quoted:
            break
        i += 1
    return i


_LOST = re.compile(rb'\\\\[ ,="]')


def influx_loses(line: bytes) -> bool:
    r"""InfluxDB 1.6.7's own bug: a measurement holding a backslash right before an escaped space,
    comma, equals sign or quote (``a\\ b``) is written (204) but never read back: its series key and
    its index name disagree. The parsers read it as the write path names it (``a\ b``)."""
    head = line.lstrip(b" \t\0")
    i = 1
    while i < len(head) and not (head[i] in b" ," and head[i - 1] != 0x5C):
        i += 1
    return bool(_LOST.search(head[:i]))


def _prefixed(lines: list[bytes]) -> tuple[list[bytes], list[bool]]:
    out, alone = [], []
    for i, ln in enumerate(lines):
        if influx_loses(ln):
            continue
        ok = ln[:1].isalnum() and ln[:1].isascii()
        ln = b"q%05d_" % i + ln if ok else ln
        out.append(ln)
        alone.append(not ok or _scan_line_end(ln + b"\nm f=1 1") != len(ln) or _fails_request(ln))
    return out, alone


def _source(name: str) -> str:
    """A FROM clause for one measurement: its unique prefix (a name may hold bytes InfluxQL cannot
    quote), or every measurement of a database that holds one line."""
    return f"/^{name[:7]}/" if re.match(r"q\d{5}_", name) else "/.*/"


def _fails_request(line: bytes) -> bool:
    """A line InfluxDB parses but refuses when it stores it (a tag key "time", a field type
    conflict, a name that is not UTF-8...): written alone, because the error ends the request
    before the other shards of a batch are written (the points come later, or never)."""
    try:
        parse_line(line)
    except ParseError as exc:
        return any(w in str(exc) for w in ("time", "conflict", "UTF-8", "no value", "max key"))
    return False


class Influx:
    def __init__(self, server: InfluxDB1):
        self.s = server
        self.n = 0

    def _db(self) -> str:
        self.n += 1
        db = f"c{self.n}"
        self.s.create_db(db)
        return db

    def write(self, lines: list[bytes]) -> tuple[list[tuple], bool]:
        """The points InfluxDB keeps of these lines, and whether it kept or refused each line on its
        own (False: the whole request failed)."""
        db = self._db()
        t0 = time.time_ns()
        r = requests.post(self.s.url + "/write", params={"db": db}, data=b"\n".join(lines), timeout=60)
        t1 = time.time_ns()
        err = r.json().get("error", "") if r.status_code != 204 else ""
        per_line = r.status_code == 204 or (
            r.status_code == 400 and err.startswith(("partial write", "unable to parse"))
        )
        if not per_line:
            return [], False
        types = {}
        for res in self.s.query("SHOW FIELD KEYS", db=db)["results"]:
            for ser in res.get("series", []):
                types[ser["name"]] = dict(map(tuple, ser["values"]))
        # one statement per measurement: a query over several would give a field one type for all
        q = ";".join(_SELECT.format(_source(name)) for name in types)
        out = []
        for res in self.s.query(q, db=db)["results"] if q else []:
            assert "error" not in res, res
            for ser in res.get("series", []):
                name, cols = ser["name"], ser["columns"]
                tags = {k: v for k, v in (ser.get("tags") or {}).items() if v != ""}
                for row in ser["values"]:
                    t = row[0]
                    fields = {}
                    for k, v in zip(cols[1:], row[1:], strict=True):
                        if v is None:
                            continue
                        if k not in types[name] and "" in types[name]:
                            k = ""  # InfluxQL names a column for an empty field key "val0"
                        typ = types[name][k]
                        fields[k] = float(v) if typ == "float" else v
                    out.append(_point(name, tags, NOW if t0 - 10**9 <= t <= t1 + 10**9 else t, fields))
        return out, per_line


def influx_points(ix: Influx, lines: list[bytes], alone: list[bool]) -> list[list[tuple]]:
    """Per batch of lines (as returned by batches()), the points InfluxDB keeps."""
    out = []
    for batch in batches(lines, alone):
        pts, per_line = ix.write(batch)
        if not per_line:
            pts = [p for ln in batch for p in ix.write([ln])[0]]
        out.append(sorted(pts, key=repr))
    return out


def batches(lines: list[bytes], alone: list[bool]) -> list[list[bytes]]:
    group = [ln for ln, a in zip(lines, alone, strict=True) if not a]
    return [group[i : i + BATCH] for i in range(0, len(group), BATCH)] + [
        [ln] for ln, a in zip(lines, alone, strict=True) if a
    ]


def _same(a: list[tuple], b: list[tuple]) -> bool:
    if len(a) != len(b):
        return False
    for x, y in zip(a, b, strict=True):
        if x[:3] != y[:3] or len(x[3]) != len(y[3]):
            return False
        for (k1, (t1, v1)), (k2, (t2, v2)) in zip(x[3], y[3], strict=True):
            if k1 != k2 or t1 != t2:
                return False
            if t1 == "float" and not (v1 == v2 or (math.isnan(v1) and math.isnan(v2))):
                return False
            if t1 != "float" and v1 != v2:
                return False
    return True


def _diff(name: str, got: list[tuple], want: list[tuple], lines: list[bytes]) -> str:
    extra = [p for p in got if p not in want]
    lost = [p for p in want if p not in got]
    names = {p[0][:7] for p in extra + lost}
    shown = [ln for ln in lines if ln[:7].decode("latin-1") in names][:5] or lines[:3]
    return (f"{name} differs from InfluxDB on a batch of {len(lines)} lines\n  extra: {extra[:5]}\n"
            f"  missing: {lost[:5]}\n  lines: {shown}")


@pytest.fixture(scope="module")
def influxd(tmp_path_factory):
    with InfluxDB1(tmp_path_factory.mktemp("influxd")) as s:
        yield s


@pytest.fixture(scope="module")
def lines_and_truth(influxd, tmp_path_factory):
    lines, alone = _prefixed(corpus(tmp_path_factory.mktemp("corpus")))
    ix = Influx(influxd)
    return batches(lines, alone), influx_points(ix, lines, alone), ix


def _agree(got: list[tuple], want: list[tuple], lines: list[bytes], ix: Influx) -> bool:
    """Do the points agree with InfluxDB's for these lines? A disagreement is checked again by
    writing the lines involved once more, together and then alone (alone, a line is its own
    truth)."""
    if _same(got, want):
        return True
    now = any(p[2] == NOW for p in want)
    for together in (True, False):
        names = {p[0][:7] for p in got + want if (p in got) != (p in want)}
        redo = [ln for ln in lines if ln[:7].decode("latin-1") in names] if names else lines
        if not together and len(redo) > 50:
            return False
        again = ix.write(redo)[0] if together else [p for ln in redo for p in ix.write([ln])[0]]
        keep = {ln[:7].decode("latin-1") for ln in redo}
        want = [p for p in want if p[0][:7] not in keep] + [p for p in again if now or p[2] != NOW]
        want = sorted(want, key=repr)
        if _same(got, want):
            return True
    return False


@skip_unless("influxd")
def test_influxdb_loses_measurements_with_escaped_backslashes(influxd):
    lines = [b"a\\\\ b f=1 1", b"m\\\\,t=a f=1 1", b"a\\\\=b f=1 1", b"\\\\,b f=1 1", b'a\\\\"b f=1 1']
    assert all(map(influx_loses, lines)) and not influx_loses(b"a\\ b,t=a\\\\\\ b f=1 1")
    ix = Influx(influxd)
    for ln in lines:
        r = requests.post(influxd.url + "/write", params={"db": ix._db()}, data=ln, timeout=30)
        assert r.status_code == 204
        assert influxd.query("SELECT * FROM /.*/", db=f"c{ix.n}")["results"] == [{"statement_id": 0}]
    assert [reference(ln)[0] for ln in lines] == ["a\\ b", "m\\,t=a", "a\\=b", "\\,b", 'a\\"b']
    for engine in ("c", "numpy"):
        names = sorted(p[0] for p in engine_points(engine, lines)[0])
        assert names == sorted(reference(ln)[0] for ln in lines)


@skip_unless("influxd")
def test_reference_parser_agrees_with_influxdb(lines_and_truth):
    groups, truth, ix = lines_and_truth
    assert sum(map(len, groups)) > 1500
    bad = []
    for lines, want in zip(groups, truth, strict=True):
        got = sorted((p for p in map(reference, lines) if p is not None), key=repr)
        if not _agree(got, want, lines, ix):
            bad.append(_diff("reference", got, want, lines))
    assert not bad, "\n".join(bad[:20]) + f"\n{len(bad)} batches differ"


@skip_unless("influxd")
@pytest.mark.parametrize("engine", ["c", "numpy"])
def test_engines_agree_with_influxdb(lines_and_truth, engine):
    groups, truth, ix = lines_and_truth
    bad = []
    for lines, want in zip(groups, truth, strict=True):
        got, parser = engine_points(engine, lines)
        ref = [p for p in map(reference, lines) if p is not None]
        stamped = sum(1 for p in ref if p[2] == NOW)  # InfluxDB stamps them; the analyzer counts them
        want = [p for p in want if p[2] != NOW]
        counted = parser.stats.lines == sum(1 for ln in lines if not skip_line(ln))  # no fallback
        if not _agree(got, want, lines, ix) or parser.stats.no_timestamp != stamped or not counted:
            bad.append(_diff(engine, got, want, lines))
    assert not bad, "\n".join(bad[:20]) + f"\n{len(bad)} batches differ"


def _dump(lines_and_truth):  # pragma: no cover - a debugging aid
    return json.dumps([[repr(x) for x in b] for b in lines_and_truth[0]])
