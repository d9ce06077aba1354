"""The line-protocol parser (the C tokenizer and the numpy one) against the reference parser in
gpufleet.lineprotocol."""

from __future__ import annotations

import math
import os
import random

import numpy as np
import pytest
from gpufleet.analyzer import parse
from gpufleet.analyzer.parse import Parser
from hypothesis import given, settings
from hypothesis import strategies as st

from gpufleet.lineprotocol import ParseError, encode, parse_line, skip_line

ENGINES = ["c", "numpy"]
FUZZ_SEEDS = int(os.environ.get("GPUFLEET_FUZZ_SEEDS", "40"))


def _rows(data: bytes, engine: str = "c"):
    p = Parser(engine=engine)
    return p, p.feed(data)


def test_c_tokenizer_is_built():
    # the install builds analyzer/_lpscan.c (a compiler and Python's headers are there: ./run
    # installs them); without it the analyzer falls back to the slower numpy tokenizer
    assert parse._lpscan is not None
    assert Parser().engine == "c"
    with pytest.raises(ValueError):
        Parser(engine="fortran")


def _as_points(p: Parser, rows) -> list[tuple]:
    out = []
    for m, r in rows.items():
        for i in range(len(r)):
            fields = {k: float(v[i]) for k, v in r.num.items() if not math.isnan(v[i])}
            fields.update({k: v[i] for k, v in r.text.items() if v[i] is not None})
            out.append(
                (
                    m,
                    tuple(sorted(p.series.written(int(r.sid[i])).items())),
                    int(r.t[i]),
                    tuple(sorted(fields.items())),
                )
            )
    return sorted(out, key=repr)


def _reference(lines: list[str]) -> list[tuple]:
    out = []
    for ln in lines:
        try:
            pt = parse_line(ln)
        except ParseError:  # InfluxDB's rules refuse some encodable names ("time" as a tag key)
            continue
        fields = {k: (v if isinstance(v, str) else float(v)) for k, v in pt.fields.items()}
        out.append((pt.measurement, tuple(sorted(pt.tags.items())), pt.time, tuple(sorted(fields.items()))))
    return sorted(out, key=repr)


@pytest.mark.parametrize("engine", ENGINES)
def test_wide_rows_escapes_and_strings(engine):
    lines = [
        encode(
            "gpu",
            {"host": "n 1", "gpu": "0", "model": "NVIDIA H200"},
            {"power_watts": 700.5, "temperature_gpu_celsius": 61, "job_id": 'a "quoted", job = 1'},
            10**18,
        ),
        encode("gpu", {"host": "n,2", "gpu": "1"}, {"power_watts": 1e-3, "clock_sm_mhz": 1980}, 10**18 + 1),
        encode(
            "gpu_nvlink",
            {"host": "n=3", "gpu": "0", "link": "17"},
            {"up": 1, "crc_flit_errors_total": 2**40},
            10**18 + 2,
        ),
        encode(
            "gpu_event",
            {"host": "h", "gpu": "0", "type": "xid"},
            {"code": 79, "message": "fell off\\the bus\nagain"},
            10**18 + 3,
        ),
    ]
    p, rows = _rows(("\n".join(lines) + "\n").encode(), engine)
    assert _as_points(p, rows) == _reference(lines)
    assert p.stats.bad_lines == 0 and p.stats.points == 4


@pytest.mark.parametrize("engine", ENGINES)
def test_garbage_is_skipped_and_counted(engine):
    good = encode("gpu", {"host": "a", "gpu": "0"}, {"power_watts": 100.0}, 5 * 10**18)
    data = (
        "\n".join(
            [
                good,
                "complete garbage",
                "gpu,host=a,gpu=0 power_watts==5 5",
                'gpu,host=a,gpu=0 power_watts=1,x="unterminated 6',
                "gpu,host=a,gpu=0 power_watts=7",  # no timestamp
                "gpu,host=a,gpu=0 power_watts=abc 8",  # a bad value: InfluxDB refuses the line
                "gpu,host=a,gpu=0 power_watts=nan 9",
                "gpu,host=a,gpu=0 power_watts=1 10\r",  # a carriage return is no line end
                " gpu,host=a,gpu=0 power_watts=11 11",  # leading blanks are skipped
                "gpu,host=a,gpu=0 power_watts=12 0",  # time 0 is a time
                "# a comment",
                "",
                "\x00\xff\xfe binary",
            ]
        ).encode("utf-8", "surrogateescape")
        + b"\xff\xfe\n"
    )
    p, rows = _rows(data, engine)
    r = rows["gpu"]
    assert sorted(r.t.tolist()) == [0, 11, 5 * 10**18]
    assert sorted(r.num["power_watts"].tolist()) == [11.0, 12.0, 100.0]
    assert p.stats.bad_lines == 7
    assert p.stats.no_timestamp == 1
    assert p.stats.lines == 11


@pytest.mark.parametrize("engine", ENGINES)
def test_series_ids_stable_across_chunks_and_paths(engine):
    p = Parser(engine=engine)
    a = p.feed(b"gpu,host=a,gpu=0,model=X\\ Y power_watts=1 1\n")
    b = p.feed(b'gpu,model=X\\ Y,gpu=0,host=a power_watts=2,job_id="j\\"1" 2\n')  # other tag order
    assert a["gpu"].sid[0] == b["gpu"].sid[0]
    assert b["gpu"].text["job_id"][0] == 'j"1'


_name = st.text(
    alphabet=st.characters(codec="utf-8", exclude_categories=["Cs", "Cc"], exclude_characters='"\\'),
    min_size=1,
    max_size=8,
)  # the encoder leaves quotes and backslashes in keys as they are
_val = st.one_of(
    st.integers(-(2**53), 2**53),
    st.floats(allow_nan=False, allow_infinity=False, width=32),
    st.text(alphabet=st.characters(codec="utf-8", exclude_categories=["Cs"]), max_size=10),
)


@pytest.mark.parametrize("engine", ENGINES)
@settings(max_examples=60, deadline=None)
@given(
    st.lists(
        st.tuples(
            st.dictionaries(_name, _name, max_size=3),
            st.dictionaries(_name, _val, min_size=1, max_size=5),
            st.integers(1, 2**62),
        ),
        min_size=1,
        max_size=20,
    )
)
@pytest.mark.slow
def test_matches_reference_parser(engine, points):
    lines = [encode("m", tags, fields, t) for tags, fields, t in points]
    lines = [ln for ln in lines if ln is not None]
    p, rows = _rows(("\n".join(lines) + "\n").encode(), engine)
    got = _as_points(p, rows)
    ref = _reference(lines)
    assert len(got) == len(ref)
    for g, r in zip(got, ref, strict=True):
        assert g[:3] == r[:3]
        gf, rf = dict(g[3]), dict(r[3])
        assert gf.keys() == rf.keys()
        for k in gf:
            if isinstance(rf[k], str) or engine == "c":  # C converts exactly, like float()
                assert gf[k] == rf[k]
            else:
                assert math.isclose(gf[k], rf[k], rel_tol=1e-12, abs_tol=1e-300)


def _realistic_lines(rng: random.Random) -> list[bytes]:
    out = []
    for i in range(60):
        tags = {"host": f"gpu{i % 7:04d}", "gpu": str(i % 8), "model": "NVIDIA H200", "rack": "r,1"}
        t = 1_795_000_000_000_000_000 + i * 10**10
        fields = {
            "power_watts": round(rng.uniform(60, 700), 3),
            "temperature_gpu_celsius": rng.randrange(30, 90),
            "energy_joules_total": rng.uniform(0, 1e9),
            "clock_event_reasons": rng.choice([0, 1, 4, 0x20]),
            "ratio": rng.choice([0.0, 1e-7, 2.5e-300, 1e21, -3.75]),
            "flag": rng.choice([True, False]),
        }
        if i % 5 == 0:
            fields["job_id"] = rng.choice(["j 1", 'a "q", b=c', "back\\slash", "\\r", ""])
        out.append(encode("gpu" if i % 3 else "gpu_event", tags, fields, t).encode())
    return out


def _mutate(rng: random.Random, line: bytes) -> bytes:
    b = bytearray(line)
    for _ in range(rng.randint(1, 3)):
        i = rng.randrange(len(b) + 1)
        op = rng.random()
        if op < 0.4:
            b[i:i] = bytes([rng.choice(b' ,="\\\r#ituTfe.-+09x\x00\xff')])
        elif op < 0.7 and b:
            del b[min(i, len(b) - 1)]
        elif op < 0.85 and b:
            b[min(i, len(b) - 1)] = rng.choice(b' ,="\\.-e9i')
        else:
            j = rng.randrange(len(b) + 1)
            b[i:i] = b[j : j + rng.randint(1, 12)]
    return bytes(b)


def _reference_point(line: bytes):
    try:
        pt = parse_line(line)
    except ParseError:
        return None
    if pt.time is None:
        return None
    fields = {k: (v if isinstance(v, str) else float(v)) for k, v in pt.fields.items()}
    return (pt.measurement, tuple(sorted(pt.tags.items())), pt.time, tuple(sorted(fields.items())))


@pytest.mark.parametrize("seed", range(FUZZ_SEEDS))
def test_c_tokenizer_on_mutated_lines(seed):
    """Real-looking lines with random damage: C keeps exactly the lines the reference parser
    accepts, read identically, and nothing raises."""
    rng = random.Random(seed)
    lines = [_mutate(rng, ln) if rng.random() < 0.5 else ln for ln in _realistic_lines(rng)]
    lines.insert(rng.randrange(len(lines)), b"# comment")
    lines.insert(rng.randrange(len(lines)), b"")
    if seed % 4 == 0:  # a file with CRLF line ends: InfluxDB reads the CR as part of the line
        lines = [ln + b"\r" for ln in lines]
    p, rows = _rows(b"\n".join(lines) + b"\n", "c")
    got = _as_points(p, rows)
    ref = sorted((r for r in map(_reference_point, lines) if r is not None), key=repr)
    assert got == ref
    assert p.stats.lines == sum(1 for ln in lines if not skip_line(ln))
    assert p.stats.points == len(got)
    q = Parser(engine="c")  # the same lines twice, cut into chunks: the scanner's state carried across
    for _ in range(2):
        got, i = [], 0
        while i < len(lines):
            k = rng.randint(1, 8)
            got += _as_points(q, q.feed(b"\n".join(lines[i : i + k]) + b"\n"))
            i += k
        assert sorted(got, key=repr) == ref


def test_key_fingerprint_is_injective_over_the_catalogue():
    from gpufleet.analyzer.parse import _fingerprint

    from gpufleet import catalogue

    names = sorted({m.field for m in catalogue.load()})
    data = (",".join(names) + ",").encode() + b"\0" * 64
    buf = np.frombuffer(data, np.uint8)
    starts, pos = [], 0
    for n in names:
        starts.append(pos)
        pos += len(n) + 1
    fp = _fingerprint(buf, np.array(starts), np.array([len(n) for n in names]))
    assert len(set(fp.tolist())) == len(names)


@pytest.mark.parametrize("engine", ENGINES)
def test_field_sets_rotating_within_one_series(engine):
    # one series writing three field sets in turn (more than the two the tokenizer remembers per
    # series), the same keys in another order, and another measurement with the same keys
    sets = [("a", "b"), ("a", "b", "c"), ("c",), ("b", "a")]
    lines = []
    for i in range(40):
        keys = sets[i % len(sets)]
        meas = "m2" if i % 5 == 0 else "m"
        lines.append(encode(meas, {"host": "h"}, {k: float(i * 10 + j) for j, k in enumerate(keys)}, i + 1))
    p, rows = _rows(("\n".join(lines) + "\n").encode(), engine)
    assert _as_points(p, rows) == _reference(lines)


def typed_points(p: Parser, rows) -> list[tuple]:
    """(measurement, tags, time, fields) with each value in its own type, as Rows.kind says."""
    out = []
    for m, r in rows.items():
        for i in range(len(r)):
            fields = {}
            for k, kind in r.kind.items():
                code = int(kind[i])
                if code == parse.STR:
                    fields[k] = r.text[k][i]
                elif code == parse.INT:
                    fields[k] = int(r.ints[k][i]) if k in r.ints else int(r.num[k][i])
                elif code == parse.BOOL:
                    fields[k] = bool(r.num[k][i])
                elif code == parse.FLOAT:
                    fields[k] = float(r.num[k][i])
            out.append((m, p.series.written(int(r.sid[i])), int(r.t[i]), fields))
    return out


T = 1_700_000_000_000_000_000
# issue 21's table, each line as InfluxDB 1.6.7 reads it (None: refused); the differential test
# checks the same lines (tests/fixtures/lineprotocol/edge_cases.lp) against a real influxd
ISSUE_TABLE = [
    (rb"m,t=a\\b f=1 %d", ("m", {"t": "a\\\\b"}, T, {"f": 1.0})),
    (rb"m,t=a\\ f=1 %d", None),
    (rb"m k\\=1,z=2i %d", ("m", {}, T, {"k\\=1,z": 2})),
    (rb"ma\"b f=1 %d", ('ma"b', {}, T, {"f": 1.0})),
    (rb'm s="a\nb" %d', ("m", {}, T, {"s": "a\\nb"})),
    (rb"m f=9223372036854775808i %d", None),
    (rb"m f=9223372036854775807i %d", ("m", {}, T, {"f": 2**63 - 1})),
    (rb"m f=-9007199254740993i %d", ("m", {}, T, {"f": -(2**53) - 1})),
    (rb"m f=+1 %d", None),
    (rb"m f=1e999 %d", None),
    (rb"m f=inf %d", None),
    (rb"m f=0u %d", None),
    (rb"m f=1.0i %d", None),
    (rb"m f=tRUE %d", None),
    (rb"m f=t %d", ("m", {}, T, {"f": True})),
    (rb"m f=FALSE,g=1i,h=2.5 %d", ("m", {}, T, {"f": False, "g": 1, "h": 2.5})),
    (rb"m,t=x,t=y f=1 %d", None),
    (rb"m f=1i,f=2.5 %d", None),
    (rb"m f=1i,f=2i %d", ("m", {}, T, {"f": 2})),
    (rb"m e\ k=1i,f=1 0", ("m", {}, 0, {"e k": 1, "f": 1.0})),
    (rb"m f=1 9223372036854775807", None),
    (rb"m f=1 -9223372036854775807", None),
    (rb"m f=1 9223372036854775806", ("m", {}, 2**63 - 2, {"f": 1.0})),
    (rb"m f=1 +%d", None),
    (rb"m f=1 1_700_000_000_000_000_000", None),
    (rb"m time=1,g=2 %d", ("m", {}, T, {"g": 2.0})),
    (rb"m,time=a f=1 %d", None),
]


@pytest.mark.parametrize("engine", ENGINES)
@pytest.mark.parametrize("line,want", ISSUE_TABLE, ids=[ln.decode() for ln, _ in ISSUE_TABLE])
def test_issue_table(engine, line, want):
    if b"%d" in line:
        line = line % T
    p, rows = _rows(line + b"\n", engine)
    assert typed_points(p, rows) == ([want] if want else [])
    assert p.stats.bad_lines == (0 if want else 1)
    ref = None
    try:
        pt = parse_line(line)
        ref = (pt.measurement, pt.tags, pt.time, pt.fields)
    except ParseError:
        pass
    assert ref == want and (ref is None or all(type(v) is type(want[3][k]) for k, v in ref[3].items()))


@pytest.mark.parametrize("seed", range(max(FUZZ_SEEDS // 4, 1)))
def test_numpy_engine_on_mutated_lines(seed):
    """The numpy engine on the same damaged lines: exactly the reference parser's points."""
    rng = random.Random(1000 + seed)
    lines = [_mutate(rng, ln) if rng.random() < 0.5 else ln for ln in _realistic_lines(rng)]
    lines = [ln for chunk in lines for ln in chunk.split(b"\n")]
    p, rows = _rows(b"\n".join(lines) + b"\n", "numpy")
    assert _as_points(p, rows) == sorted((r for r in map(_reference_point, lines) if r is not None), key=repr)
    assert p.stats.lines == sum(1 for ln in lines if not skip_line(ln))


_HEAD_PARTS = [
    b"a",
    b"b",
    b",",
    b"=",
    b'"',
    b"time",
    b"\xff",
    b"#",
    b"\xc3\xa9",
    b"\\",
    b"\\,",
    b"\\ ",
    b"\\=",
    b'\\"',
    b" ",
    b"\x00",
]


@settings(max_examples=1000, deadline=None)
@given(st.lists(st.sampled_from(_HEAD_PARTS), max_size=10))
@pytest.mark.slow
def test_head_split_path_matches_the_scan(parts):
    """parse_head takes most heads by splits: the answer of InfluxDB's scan, always."""
    from gpufleet import lineprotocol as lp

    head = b"".join(parts)

    def scan():  # InfluxDB's scan over the head and the space that ends it
        b = head + b" "
        end, starts = lp._scan_head(b, 0)
        if end != len(head):  # a head never holds an unescaped space
            raise ParseError("space")
        return lp._head_parts(b, end, starts)

    results = []
    for f in (lambda: lp.parse_head(head), scan):
        try:
            results.append(f())
        except ParseError:
            results.append(None)
    assert results[0] == results[1]


_BITS = b'm f t = , . 1 i - e # \\ " \t \x00 \r'.split(b" ") + [b" ", b"m,t=a f=1", b" 1700000000000000000"]
_BITS += [b",g=2i", b'=" x"', b"m f=1 2"]


@pytest.mark.parametrize("engine", ENGINES)
@settings(max_examples=500, deadline=None)
@given(st.lists(st.lists(st.sampled_from(_BITS), max_size=12).map(b"".join), min_size=1, max_size=6))
@pytest.mark.slow
def test_degenerate_chunks(engine, lines):
    """Short lines of delimiters and fragments: each engine reads exactly what the reference
    parser reads, without falling back on the whole chunk (which would count lines twice)."""
    p, rows = _rows(b"\n".join(lines) + b"\n", engine)
    assert _as_points(p, rows) == sorted((r for r in map(_reference_point, lines) if r is not None), key=repr)
    assert p.stats.lines == sum(1 for ln in lines if not skip_line(ln))


@pytest.mark.parametrize("engine", ENGINES)
@pytest.mark.parametrize("chunking", ["one", "per_line", "random"])
def test_state_across_chunks_matches_reference(engine, chunking):
    """The C scanner keeps heads and field-key groups from chunk to chunk and first matches a
    line's keys with its series' last group: keys that are prefixes of each other, field sets
    changing mid-line, numbers on both sides of the short-number fast path, integers beyond 2**53,
    strings and booleans, timestamps at and beyond InfluxDB's range, and a refused head written
    again (counted once per line), read the same
    however the lines are cut into chunks, and as the reference parser reads them."""
    rng = random.Random(7)
    values = ["1", "-0.0", "5.", "0.05", "007i", "-12i", "123456789012345", "1234567890123456", "1.5e3",
              "9007199254740993i", "-9223372036854775808i", "t", "FALSE", '"s,\\" x"', "1.25", ".5"]
    sets = [("a", "ab", "abc"), ("ab", "a"), ("a", "ab"), ("abc",), ("a", "ab", "abc", "b")]
    stamps = ["-9223372036854775806", "9223372036854775806", "9223372036854775807", "-9223372036854775807",
              "00000000000000000000001", "18446744073709551617", "-0", "1700000000123456789"]
    lines = []
    for i in range(300):
        host = f"h{i % 3}"
        if i % 50 == 7:
            lines.append(f"m,{host} a=1 {i + 1}")  # a tag without a value: refused
            continue
        keys = sets[rng.randrange(len(sets))]
        fields = ",".join(f"{k}={values[rng.randrange(len(values))]}" for k in keys)
        ts = stamps[i // 4 % len(stamps)] if i % 4 == 0 else str(i + 1)
        lines.append(f"m,host={host} {fields} {ts}")
    data = [(ln + "\n").encode() for ln in lines]
    if chunking == "one":
        chunks = [b"".join(data)]
    elif chunking == "per_line":
        chunks = data
    else:
        chunks, i = [], 0
        while i < len(data):
            k = rng.randrange(1, 40)
            chunks.append(b"".join(data[i : i + k]))
            i += k
    p = Parser(engine=engine)
    got = []
    for c in chunks:
        got += typed_points(p, p.feed(c))
    want, refused = [], 0
    for ln in lines:
        try:
            pt = parse_line(ln)
        except ParseError:
            refused += 1
            continue
        want.append((pt.measurement, pt.tags, pt.time, pt.fields))
    def norm(points):
        return sorted(repr((m, sorted(tags.items()), t, sorted(f.items()))) for m, tags, t, f in points)

    assert norm(got) == norm(want)
    assert p.stats.bad_lines == refused > 6
    assert p.stats.points == len(want)


def test_scanner_starts_afresh_past_its_group_limit():
    """A producer writing ever new field names: the C scanner's field-key groups stay bounded (it
    starts afresh), series ids and rows stay as the reference parser reads them."""
    p = Parser(engine="c")
    p.max_groups = 8
    lines = [f"m,host=h{i % 3} f{i}=1i,g=2 {i + 1}" for i in range(60)]
    got = []
    for i in range(0, 60, 4):
        got += typed_points(p, p.feed(("\n".join(lines[i : i + 4]) + "\n").encode()))
        assert len(p._plans) <= p.max_groups + 4
    want = [(pt.measurement, pt.tags, pt.time, pt.fields) for pt in map(parse_line, lines)]
    assert sorted(got, key=repr) == sorted(want, key=repr)
    assert len(p.series) == 3


def test_scanner_gathers_a_groups_planned_columns():
    """Once told a group's wanted fields, the scanner gathers them itself (column by column);
    a plan naming no group or a field the group lacks is refused."""
    sc = parse._lpscan.Scanner()
    assert sc.scan(b"m f=1,g=2i 1\n")[-1] == [None]
    with pytest.raises(ValueError):
        sc.columns(5, np.array([0]).tobytes())
    with pytest.raises(ValueError):
        sc.columns(0, np.array([2]).tobytes())
    sc.columns(0, np.array([1, 0]).tobytes())
    (vals, kinds), other = sc.scan(b"m f=3,g=4i 2\nn x=1 3\nm f=5,g=6i 4\n")[-1]
    assert np.frombuffer(vals).tolist() == [4.0, 6.0, 3.0, 5.0]
    assert list(kinds) == [parse.INT, parse.INT, parse.FLOAT, parse.FLOAT]
    assert other is None
