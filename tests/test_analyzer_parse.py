"""The vectorised line-protocol parser against the reference parser in gpufleet.lineprotocol."""

from __future__ import annotations

import math

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from analyzer.parse import Parser
from gpufleet.lineprotocol import encode, parse_line


def _rows(data: bytes):
    p = Parser()
    return p, p.feed(data)


def _as_points(p: Parser, rows) -> list[tuple]:
    out = []
    for m, r in rows.items():
        for i in range(len(r)):
            fields = {k: float(v[i]) for k, v in r.num.items() if not math.isnan(v[i])}
            fields.update({k: v[i] for k, v in r.text.items() if v[i] is not None})
            out.append(
                (
                    m,
                    tuple(sorted(p.series.tags[r.sid[i]].items())),
                    int(r.t[i]),
                    tuple(sorted(fields.items())),
                )
            )
    return sorted(out, key=repr)


def _reference(lines: list[str]) -> list[tuple]:
    out = []
    for ln in lines:
        pt = parse_line(ln)
        fields = {k: (v if isinstance(v, str) else float(v)) for k, v in pt.fields.items()}
        out.append((pt.measurement, tuple(sorted(pt.tags.items())), pt.time, tuple(sorted(fields.items()))))
    return sorted(out, key=repr)


def test_wide_rows_escapes_and_strings():
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
    p, rows = _rows(("\n".join(lines) + "\n").encode())
    assert _as_points(p, rows) == _reference(lines)
    assert p.stats.bad_lines == 0 and p.stats.points == 4


def test_garbage_is_skipped_and_counted():
    good = encode("gpu", {"host": "a", "gpu": "0"}, {"power_watts": 100.0}, 5 * 10**18)
    data = (
        "\n".join(
            [
                good,
                "complete garbage",
                "gpu,host=a,gpu=0 power_watts==5 5",
                'gpu,host=a,gpu=0 power_watts=1,x="unterminated 6',
                "gpu,host=a,gpu=0 power_watts=7",  # no timestamp
                "gpu,host=a,gpu=0 power_watts=abc 8",  # garbage value: absent, the row stays
                "gpu,host=a,gpu=0 power_watts=nan 9",
                "# a comment",
                "",
                "\x00\xff\xfe binary",
            ]
        ).encode("utf-8", "surrogateescape")
        + b"\xff\xfe\n"
    )
    p, rows = _rows(data)
    r = rows["gpu"]
    assert sorted(r.t.tolist()) == [8, 9, 5 * 10**18]
    assert np.isnan(r.num["power_watts"][r.t < 10]).all()
    assert p.stats.bad_lines >= 4
    assert p.stats.no_timestamp == 1


def test_series_ids_stable_across_chunks_and_paths():
    p = Parser()
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
def test_matches_reference_parser(points):
    lines = [encode("m", tags, fields, t) for tags, fields, t in points]
    lines = [ln for ln in lines if ln is not None]
    p, rows = _rows(("\n".join(lines) + "\n").encode())
    got = _as_points(p, rows)
    ref = _reference(lines)
    assert len(got) == len(ref)
    for g, r in zip(got, ref, strict=True):
        assert g[:3] == r[:3]
        gf, rf = dict(g[3]), dict(r[3])
        assert gf.keys() == rf.keys()
        for k in gf:
            if isinstance(rf[k], str):
                assert gf[k] == rf[k]
            else:
                assert math.isclose(gf[k], rf[k], rel_tol=1e-12, abs_tol=1e-300)


def test_key_fingerprint_is_injective_over_the_catalogue():
    from analyzer.parse import _fingerprint
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
