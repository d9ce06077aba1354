"""The project's encoders against its parser: the simulator's and the agent's line protocol (and
gpufleet.lineprotocol.encode with hostile names and values) parses back and re-encodes byte for
byte, and both engines of the analyzer read every line as the reference parser does."""

from __future__ import annotations

import random

import pytest

from gpufleet.lineprotocol import encode, parse_line
from tests.lp_corpus import agent_lines, encoder_lines, sim_lines
from tests.test_lineprotocol_influx import engine_points, reference


@pytest.fixture(scope="module")
def own_lines(tmp_path_factory) -> dict[str, list[bytes]]:
    return {
        "sim": sim_lines(tmp_path_factory.mktemp("sim")),
        "agent": agent_lines(),
        "encode": encoder_lines(random.Random(7), plain_names=True),
    }


@pytest.mark.parametrize("source", ["sim", "agent", "encode"])
def test_encoder_output_round_trips_byte_for_byte(own_lines, source):
    lines = own_lines[source]
    assert len(lines) > 50
    for line in lines:
        p = parse_line(line)
        assert encode(p.measurement, p.tags, p.fields, p.time).encode() == line


@pytest.mark.parametrize("engine", ["c", "numpy"])
@pytest.mark.parametrize("source", ["sim", "agent", "encode"])
def test_engines_read_encoder_output_as_the_reference(own_lines, source, engine):
    lines = own_lines[source]
    got, parser = engine_points(engine, lines)
    assert got == sorted(map(reference, lines), key=repr)
    assert parser.stats.bad_lines == 0 and parser.stats.points == len(lines)


def test_hostile_agent_labels_are_stored_as_written():
    # the agent's second node has a host name and labels full of delimiters, quotes and trailing
    # backslashes: every tag comes back as the agent meant it (a trailing backslash gains a space)
    tags = {k: v for line in agent_lines() for k, v in parse_line(line).tags.items()}
    assert tags["host"] in ("node-1", 'no de,"x"=1\\ ')
    assert tags["rack"] == "r 1,=2" and tags["room"] == "a\\,b" and tags["path"] == "C:\\ "
    assert tags["team"] == 'say "hi"\\ '


@pytest.mark.parametrize("engine", ["c", "numpy"])
@pytest.mark.parametrize("source", ["sim", "agent"])
def test_fast_paths_take_the_projects_own_lines(own_lines, source, engine, monkeypatch):
    # the project's plain output never needs the reference parser: the speed depends on it
    from gpufleet.analyzer.parse import Parser

    slow = []
    real = Parser._slow

    def counting(self, lines, pieces, count=True):
        lines = list(lines)
        slow.extend(lines)
        return real(self, lines, pieces, count)

    monkeypatch.setattr(Parser, "_slow", counting)
    lines = [ln for ln in own_lines[source] if b'"' not in ln and b"\\\\" not in ln]  # not the hostile node
    _, parser = engine_points(engine, lines)
    assert parser.stats.points == len(lines) > 30
    assert slow == []
