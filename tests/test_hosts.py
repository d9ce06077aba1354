"""A host is one plain node name (gpufleet/hosts.py): the check itself, and the quarantine at the
analyzer's ingest, where every path (file, --follow's pull, --listen) builds its series."""

from __future__ import annotations

import pytest
from gpufleet.analyzer.parse import Parser

from gpufleet import hosts
from gpufleet.lineprotocol import escape_key

HOSTILE = ["gpu[001-100]", "ALL", "all", "All", "n1,n2", "-n", "node1 State=RESUME", "--selector=x=y",
           "a b", "nöde1", "node\x00", "node\x1b[2J", "x" * 254, "x" * 10_000, ".hidden", "_x", "",
           "n1=2", "node1\u202e", "n1;id", "$(id)", "n1/../x", "n1:22"]
PLAIN = ["node01", "gpu-001", "n1.cluster.example", "h200_ref", "a", "x" * 253, "ALLx", "all-1", "1node"]


@pytest.mark.parametrize("name", HOSTILE)
def test_hostile_names_are_not_plain_and_say_why(name):
    why = hosts.problem(name)
    assert why and "\n" not in why and len(why) < 200
    shown = hosts.display_name(name)
    assert shown.startswith("unsafe:") and not hosts.is_plain(shown) and len(shown) <= 60
    assert shown.isprintable() and shown.isascii()


@pytest.mark.parametrize("name", PLAIN)
def test_plain_names_pass_unchanged(name):
    assert hosts.problem(name) is None and hosts.safe(name) == name


def test_display_names_differ_per_raw_value():
    names = {hosts.display_name(h) for h in ["n1,n2", "n1 n2", "n1=n2", "ALL", "all"]}
    assert len(names) == 5


@pytest.mark.parametrize("engine", ["c", "numpy"])
def test_ingest_quarantines_unsafe_host_tags_and_counts_them(engine, caplog):
    lines = []
    for h in ["node01", "gpu[001-100]", "ALL", "n1,n2", "-n", "node1 State=RESUME", "nöde", "x" * 10_000]:
        for g in (0, 1):
            lines.append(f"gpu,host={escape_key(h)},gpu={g} power_watts=300 1795000000000000000")
    p = Parser({"gpu"}, engine=engine)
    rows = p.feed(("\n".join(lines) + "\n").encode())
    assert len(rows["gpu"]) == 16  # analysed, under their display names
    seen = {p.series.tags[s]["host"] for s in rows["gpu"].sid.tolist()}
    assert "node01" in seen and len(seen) == 8
    assert all(h == "node01" or (h.startswith("unsafe:") and not hosts.is_plain(h)) for h in seen)
    assert p.series.unsafe_series == 14 and len(p.series.unsafe_hosts) == 7
    assert p.series.unsafe_hosts[hosts.display_name("ALL")] == "ALL"
    warned = [m for m in caplog.messages if "not a plain node name" in m]
    assert len(warned) == 7 and all("\n" not in m and len(m) < 400 for m in warned)
