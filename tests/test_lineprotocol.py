import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from gpufleet import lineprotocol as lp

hostile = st.text(st.characters(blacklist_categories=("Cs",), blacklist_characters="\n\r\\"), min_size=1)


def test_encode_sorts_tags_and_types_fields():
    line = lp.encode("gpu", {"uuid": "GPU-1", "host": "n 1,a=b"}, {"t": 38, "p": 79.3, "s": 'say "hi"'}, 5)
    assert line == 'gpu,host=n\\ 1\\,a\\=b,uuid=GPU-1 t=38i,p=79.3,s="say \\"hi\\"" 5'


def test_absent_values_are_left_out_never_zero():
    assert lp.encode("gpu", {"host": "a"}, {"x": None, "y": math.nan, "z": 1}, 1) == "gpu,host=a z=1i 1"
    assert lp.encode("gpu", {"host": "a"}, {"x": None}, 1) is None


@given(meas=hostile, tag=hostile, sval=st.text(st.characters(blacklist_categories=("Cs",))),
       ival=st.integers(-2**63, 2**63 - 1), fval=st.floats(allow_nan=False, allow_infinity=False))
def test_round_trip(meas, tag, sval, ival, fval):
    line = lp.encode(meas, {"host": tag}, {"s": sval, "i": ival, "f": fval}, 123)
    p = lp.parse_line(line)
    assert p.measurement == meas.replace("\n", " ")
    assert p.tags == {"host": tag}
    assert p.fields == {"s": sval, "i": ival, "f": fval}
    assert p.time == 123


@pytest.mark.parametrize("bad", ["", "gpu", "gpu x=", "gpu x=1 notatime", "gpu,host x=1", 'gpu s="open 1'])
def test_parse_rejects_garbage(bad):
    with pytest.raises(lp.ParseError):
        lp.parse_line(bad)


def test_quotes_in_tags_are_literal():
    line = lp.encode("gpu", {"host": 'say "hi" there', "rack": '"'}, {"v": 1, "s": "a b"}, 7)
    p = lp.parse_line(line)
    assert p.tags == {"host": 'say "hi" there', "rack": '"'}
    assert p.fields == {"v": 1, "s": "a b"}
