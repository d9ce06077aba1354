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


_text = st.text(st.characters(blacklist_categories=("Cs",)))
# a measurement as a name: InfluxDB skips a line that starts with blanks or "#"
_meas = hostile.filter(lambda m: m[:1] not in "#\t\x00")


def _stored(s: str) -> str:
    """What InfluxDB stores for a name or tag: line ends become spaces, a trailing backslash gets
    a space so that it does not escape the separator."""
    s = s.replace("\n", " ").replace("\r", " ")
    return s + " " if s.endswith("\\") else s


@given(meas=_meas, tag=_text.filter(bool), sval=_text, ival=st.integers(-2**63, 2**63 - 1),
       fval=st.floats(allow_nan=False, allow_infinity=False), b=st.booleans())
@pytest.mark.slow
def test_round_trip(meas, tag, sval, ival, fval, b):
    line = lp.encode(meas, {"host": tag}, {"s": sval, "i": ival, "f": fval, "b": b}, 123)
    p = lp.parse_line(line)
    assert p.measurement == _stored(meas)
    assert p.tags == {"host": _stored(tag)}
    assert p.fields == {"s": sval.replace("\n", " ").replace("\r", " "), "i": ival, "f": fval, "b": b}
    assert type(p.fields["i"]) is int and type(p.fields["b"]) is bool
    assert p.time == 123
    # and back: the encoder writes what it read byte for byte
    assert lp.encode(p.measurement, p.tags, p.fields, p.time) == line


def test_out_of_range_integer_is_left_out():
    assert lp.encode("m", {}, {"a": 2**63, "b": 1}, 1) == "m b=1i 1"


@pytest.mark.parametrize(
    "bad", ["", "gpu", "gpu x=", "gpu x=1 notatime", "gpu,host x=1", 'gpu s="open 1', "# a", "gpu x=1 1\r"]
)
def test_parse_rejects_garbage(bad):
    with pytest.raises(lp.ParseError):
        lp.parse_line(bad)


def test_quotes_in_tags_are_literal():
    line = lp.encode("gpu", {"host": 'say "hi" there', "rack": '"'}, {"v": 1, "s": "a b"}, 7)
    p = lp.parse_line(line)
    assert p.tags == {"host": 'say "hi" there', "rack": '"'}
    assert p.fields == {"v": 1, "s": "a b"}
