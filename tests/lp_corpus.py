"""The line-protocol corpus the differential test (tests/test_lineprotocol_influx.py) writes to a
real InfluxDB and feeds to the parsers: the checked-in edge cases, lines generated from every
token spelling in every position, damaged real lines, and the project's own encoders' output."""

from __future__ import annotations

import gzip
import random
from pathlib import Path

from tests.conftest import FIXTURES

EDGE_CASES = FIXTURES / "lineprotocol" / "edge_cases.lp"
T = b"1700000000000000000"

# spellings to try in each position (bytes: a backslash is one backslash)
NAMES = [
    b"a", b"a b", b"a\\ b", b"a\\,b", b"a\\=b", b'a\\"b', b"a\\\\b", b"a\\\\", b"a\\", b'a"b', b"a=b",
    b"a\\\\ b", b"a\\\\,b", b"a\\\\=b", b"a\\tb", b"a\tb", b"\\ ", b"\\,", b"\\=", b"\\\\", b"=", b'"',
    b"\xc3\xa9t\xc3\xa9", b"a\xffb", b"a\x01b", b"a\x00b", b"a#b", b"a\\nb", b"time", b"a\\\\\\ b",
    b"a\\\\\\,b", b"a\\\\\\=b", b"'a'", b"a b\\", b"\\a", b"", b"a\\\\\\\\",
]
NUMBERS = [
    b"1", b"-1", b"1.5", b"-1.5", b".5", b"5.", b"-.5", b"-5.", b"0", b"-0", b"00.10", b"1e5", b"1E5",
    b"1e+5", b"1e-5", b"1.e5", b".5e1", b"-1.5E-3", b"1e", b"1e+", b"e5", b"-e5", b"1ee5", b"1e5.5",
    b"1.2.3", b".", b"-", b"-.", b"--1", b"+1", b"1-2", b"1_000", b"0x10", b"1e999", b"-1e999",
    b"1e-400", b"0e99999", b"1" * 24, b"1" * 25, b"1" * 400, b"9" * 309 + b".5", b"0." + b"0" * 30 + b"1",
    b"nan", b"NaN", b"inf", b"-inf", b"Inf", b"infinity", b"1.7976931348623157e308",
    b"1.7976931348623159e308", b"4.9e-324", b"2.2250738585072014e-308", b"9007199254740993",
    b"1i", b"-1i", b"0i", b"-0i", b"007i", b"+1i", b"1.0i", b"1e5i", b"i", b"-i", b"1ii", b"1i1",
    b"9223372036854775807i", b"-9223372036854775808i", b"9223372036854775808i",
    b"-9223372036854775809i", b"9007199254740993i", b"0000000000000000000000001i", b"99999999999999999999i",
    b"1u", b"0u", b"18446744073709551615u", b"1I", b"1 i",
    b"t", b"T", b"true", b"True", b"TRUE", b"f", b"F", b"false", b"False", b"FALSE", b"tRUE", b"fAlse",
    b"yes", b"no", b"on", b"1t", b"tt", b"truex", b"N", b"n", b"nA",
]
STRINGS = [
    b'""', b'"a"', b'"a b"', b'"a,b=c d"', b'"a\\"b"', b'"a\\\\b"', b'"a\\nb"', b'"a\\\\nb"', b'"a\\\\"',
    b'"a\\\\\\"b"', b'"a\\"', b'"a', b'a"', b'"a"b', b'"a""b"', b'"\\"', b'"\\\\\\\\"', b'"a\\,b"',
    b'"a\\ b"', b'"a\\=b"', b'"\xc3\xa9\xff"', b'"a\tb"', b'"a\\tb"', b'"' + b"x" * 300 + b'"', b'"=1"',
    b'"a" ', b'"a"1',
]
TIMES = [
    T, b"0", b"-0", b"1", b"-1", b"00017", b"9223372036854775806", b"9223372036854775807",
    b"-9223372036854775806", b"-9223372036854775807", b"-9223372036854775808", b"9223372036854775808",
    b"99999999999999999999", b"+1700000000000000000", b"1_700_000_000", b"1.7e18", b"1700000000000000000i",
    b"0x10", b"-", b"--1", b"1-", b"", b" ", b"  " + T, T + b" ", T + b"  ", T + b"\t", b"\t" + T,
    T + b" x", T + b" 1", T + b"\x00", b"\x00" + T,
]
STRUCTURE = [
    b"m", b"m ", b"m f", b"m f=", b"m =1", b"m f=1,", b"m ,f=1", b"m f=1,,g=2", b"m f=1 g=2 " + T,
    b",m f=1", b"m, f=1", b"m,t f=1", b"m,t= f=1", b"m,=a f=1", b"m,t=a, f=1", b"m,t=a,,u=b f=1",
    b"m,t==a f=1", b"m,t=a=b f=1", b"m,t=a f=1 " + T + b" " + T, b"m  f=1  " + T, b"m\tf=1 " + T,
    b"m \tf=1 " + T, b"m f=1\t" + T, b" m f=1 " + T, b"\tm f=1 " + T, b"\x00m f=1 " + T, b"# m f=1 " + T,
    b"  # comment", b"", b" ", b"\t", b"#", b"m f=1 f2=2", b"m f=1,f=2 " + T, b"m f=1i,f=2i " + T,
    b"m f=1i,f=2.5 " + T, b'm f="a",f=1 ' + T, b"m f=t,f=1 " + T, b"m time=1 " + T, b"m time=1,f=2 " + T,
    b"m f=1,time=1i,time=1.5 " + T, b"m,time=a f=1 " + T, b"m,t=x,t=y f=1 " + T, b"m,u=1,t=x,t=y f=1 " + T,
    b"m,t=x,u=y,t=z f=1 " + T, b"m,b=1,a=2 f=1 " + T, b"m,t=1 t=2 " + T, b"m e\\ k=1i,f=1 0",
    b"m k\\\\=1,z=2i " + T, b"m a\\\\=1 " + T, b"m a\\\\=1,b=2 " + T, b"m a=1\\,b=2 " + T,
    b"m a\\=1,b=2 " + T, b"m,t=a\\\\ f=1 " + T, b"m,t=a\\\\ f=1 x=2 " + T, b"m\\\\,t=a f=1 " + T,
    b"m\\\\ f=1 " + T, b"m f=1 " + T + b"\r", b"m f=1\r " + T, b"m,t=a\r f=1 " + T,
    b"m f=" + b'"a b" ' + T, b'm f="a b",g=1 ' + T, b'm f="a" ' + T + b' "', b"m f=1 \"" + T + b'"',
    b"m" + b"x" * 65600 + b" f=1 " + T, b"m,t=" + b"x" * 65530 + b" f=1 " + T,
    b"m " + b"k" * 65530 + b"=1 " + T,
]


def _position_lines() -> list[bytes]:
    out = []
    for s in NAMES:
        out += [
            s + b" f=1 " + T,  # measurement
            b"m," + s + b"=v f=1 " + T,  # tag key
            b"m,t=" + s + b" f=1 " + T,  # tag value
            b"m,t=" + s + b",u=v f=1 " + T,
            b"m " + s + b"=1 " + T,  # field key
            b"m g=2," + s + b"=1 " + T,
            b"m " + s + b'="x",g=1i ' + T,
        ]
    for v in NUMBERS + STRINGS:
        out += [b"m f=" + v + b" " + T, b"m f=" + v + b",g=2 " + T, b"m g=2,f=" + v]
        out.append(b"m,t=a f=" + v + b" " + T)
    for t in TIMES:
        out += [b"m f=1 " + t, b"m,t=a f=1i,g=\"s\" " + t]
    return out + STRUCTURE


def sim_lines(tmp: Path) -> list[bytes]:
    """The simulator's output: a short run, the first rows of every measurement."""

    from gpufleet.sim import scenario
    from gpufleet.sim.engine import generate
    from gpufleet.sim.fleet import Fleet

    out = tmp / "sim"
    generate(Fleet(scenario.load("chaos"), seed=3, duration=1200.0, step=10.0, nodes=1, gpus_per_node=8), out,
             progress=False)
    per: dict[bytes, int] = {}
    keep = []
    with gzip.open(out / "telemetry.lp.gz", "rb") as f:
        for line in f.read().splitlines():
            m = line.split(b",", 1)[0]
            per[m] = per.get(m, 0) + 1
            if per[m] <= 40:
                keep.append(line)
    return keep


def agent_lines() -> list[bytes]:
    """The agent's OpenTelemetry -> line-protocol exporter on the sim node, with hostile labels."""
    from gpufleet.agent.backends.sim import SimBackend, TinyNode
    from gpufleet.agent.collectors.gpu import GpuCollector
    from gpufleet.agent.pipeline import Pipeline
    from gpufleet.agent.pipeline.lineprotocol import LineProtocolExporter

    class Lines(list):
        def write(self, lines):
            self.extend(lines)

    out = Lines()
    for host, labels in [
        ("node-1", {"cluster": "c1"}),
        ('no de,"x"=1\\', {"rack": "r 1,=2", "team": 'say "hi"\\', "room": "a\\,b", "path": "C:\\"}),
    ]:
        backend = SimBackend(TinyNode(n_gpus=2, t0=0.0))
        t = 500 * 10**9
        backend.begin_poll(t)
        gpu = GpuCollector(backend)
        try:
            samples = gpu.collect(t)
        finally:
            gpu.close()
        pipe = Pipeline(host, labels, [LineProtocolExporter([out])])
        pipe.observe(samples)
        pipe.collect(t)
        pipe.shutdown()
    return [ln.encode() for ln in out]


def encoder_lines(rng: random.Random, plain_names: bool = False) -> list[bytes]:
    """gpufleet.lineprotocol.encode with hostile tags and values; measurement and field names
    hostile too, or (``plain_names``) as a catalogue could have them: no backslash, tab or line
    end, no leading "#" (names InfluxDB 1.x cannot store and read back)."""
    from gpufleet.lineprotocol import encode

    chars = ["a", " ", ",", "=", '"', "\\", "\n", "\r", "\t", "é", "#", "x"]
    plain = [c for c in chars if c not in "\\\t\n\r"]
    out = []
    for _ in range(150):
        def s(k, alphabet=chars):
            return "".join(rng.choice(alphabet) for _ in range(rng.randint(1, k)))

        name = s(4, plain if plain_names else chars)
        if plain_names:
            name = name.lstrip("#") or "m"
        key = s(4, plain if plain_names else chars)
        v = rng.choice([s(6), rng.randint(-(2**63), 2**63 - 1), rng.uniform(-1e300, 1e300), rng.random(),
                        rng.choice([True, False]), float(rng.randint(-5, 5)), 2**53 + 1])
        line = encode(name, {s(3): s(5), "host": s(4)}, {key: v, "up": 1}, rng.randint(-(2**62), 2**62))
        if line is not None:
            out.append(line.encode())
    return out


def _damaged(rng: random.Random, lines: list[bytes], n: int) -> list[bytes]:
    alphabet = b' ,="\\\r\t#ituTfe.-+09x\x00\xff'
    out = []
    for _ in range(n):
        b = bytearray(rng.choice(lines))
        for _ in range(rng.randint(1, 3)):
            i = rng.randrange(len(b) + 1)
            op = rng.random()
            if op < 0.4:
                b[i:i] = bytes([rng.choice(alphabet)])
            elif op < 0.7 and b:
                del b[min(i, len(b) - 1)]
            elif b:
                b[min(i, len(b) - 1)] = rng.choice(alphabet)
        out.append(bytes(b).replace(b"\n", b""))
    return out


def edge_cases() -> list[bytes]:
    """The checked-in corpus: one line per line (a line is bytes up to LF; comments are lines too)."""
    return EDGE_CASES.read_bytes().split(b"\n")[:-1]


def corpus(tmp: Path, seed: int = 21) -> list[bytes]:
    rng = random.Random(seed)
    own = sim_lines(tmp) + agent_lines() + encoder_lines(rng)
    made = _position_lines()
    lines = edge_cases() + made + own + _damaged(rng, made + own, 400)
    return list(dict.fromkeys(ln for ln in lines if b"\n" not in ln))

