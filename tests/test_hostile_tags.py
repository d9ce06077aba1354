"""Hostile host tags, end to end: the values a node could write (the issue's table, unicode, 10 kB
strings, NUL, escape sequences, newlines, markup) through ingest (the file parser and a real
``--listen``), detection, incident pages (HTML escaped), every sink's rendered body and the action
sink's argument list and environment: nothing crashes, nothing is injected, and no command runs
for a host that is not one plain node name."""

from __future__ import annotations

import json
import re

import pytest
import requests
from gpufleet.analyzer.alerting import Notifier, load_sinks
from gpufleet.analyzer.alerting.action import ActionSink, Unsafe
from gpufleet.analyzer.alerting.config import build_sink
from gpufleet.analyzer.listen import Listener
from gpufleet.analyzer.parse import Parser
from gpufleet.analyzer.pipeline import FIELDS, MEASUREMENTS, Analyzer
from gpufleet.analyzer.sources import Influx
from hypothesis import given, settings
from hypothesis import strategies as st

from gpufleet import hosts
from tests.action_support import action, calls, fleet_lp, recorder
from tests.alerting_receiver import T0, incident
from tests.servers import InfluxDB1, skip_unless

HOSTILE = ["gpu[001-100]", "ALL", "all", "n1,n2", "-n", "node1 State=RESUME", "--selector=x=y",
           "--kubeconfig=/tmp/x", "nöde1", "节点1", "node\u202e1", "n\U0001f525", "x" * 10_000, "node\x00x",
           "evil\x1b[2J\r RESOLVED all clear", "<script>alert(1)</script>", "n1\"}],\"x\":{\"",
           "{host}", "%s%n", "n1;id", "$(touch /tmp/pwned)", "..", "a\tb"]
NEWLINE = ["n1\nRESOLVED", "n1\r\nx"]  # line protocol cannot carry these: refused as bad lines
PLAIN = "gpu004"
CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f\u202e]")


def _all_sinks(url: str) -> list:
    specs = [{"type": "alertmanager", "url": url}, {"type": "pagerduty", "url": url, "routing_key_env": "RK"},
             {"type": "slack", "url": url}, {"type": "webhook", "url": url}, {"type": "console"}]
    return [build_sink(s, f"sink {s['type']}", s["type"]) for s in specs]


@pytest.mark.slow
def test_hostile_host_tags_end_to_end(tmp_path, monkeypatch):
    monkeypatch.setenv("RK", "routing-key-123")
    names = HOSTILE + [PLAIN]
    data = fleet_lp(names, set(range(len(names))))
    # ingest 1: the file path
    an = Analyzer()
    an.feed_bytes(data)
    an.finish()
    incs = [r for r in an.incidents() if r.kind == "memory_errors"]
    want = {hosts.safe(h) for h in names if "\r" not in h}
    got = {r.host for r in incs}
    # a carriage return is read as line protocol reads it (the one value not kept as written)
    assert len(got) == len(incs) == len(names) and want <= got
    assert got == set(an.parser.series.unsafe_hosts) | {PLAIN}
    for r in incs:
        assert r.host == PLAIN or (r.host.startswith("unsafe:") and not CONTROL.search(r.host)
                                   and len(r.host) < 60)
    # ingest 2: a real --listen, plus the two that line protocol cannot carry
    ls = Listener(("127.0.0.1", 0), Parser(set(MEASUREMENTS), FIELDS)).start()
    try:
        url = f"http://127.0.0.1:{ls.address[1]}/write"
        assert requests.post(url, data=data, timeout=30).status_code == 204
        bad = "".join(f"gpu,host={h},gpu=0 power_watts=1 {int(T0 * 1e9)}\n" for h in NEWLINE).encode()
        r = requests.post(url, data=bad, timeout=30)
        assert r.status_code == 400 and "not line protocol" in r.json()["error"]
        series = ls.parser.series
        got = {series.tags[int(s)]["host"] for b in ls.take() for rows in b.values() for s in rows.sid}
    finally:
        ls.stop()
    assert got == {r.host for r in incs}
    # the raw values themselves, as an incidents file or another feed could carry them
    raw = [incident(kind="memory_errors", id=f"raw{i}", host=h, start=T0 + i, jobs=[h], summary=h)
           for i, h in enumerate(HOSTILE + NEWLINE)]
    cmd, out = recorder(tmp_path)
    rule = {"command": cmd + ["{host}", "Reason=gpufleet: {kind} on {where} ({key})", "{jobs}", "{title}"]}
    sinks = load_sinks([action([rule], budget_nodes=100, budget_percent=100, max_per_hour=1000)], [])
    with Notifier(sinks, tmp_path / "s.db") as n:
        n.update(incs + raw, now=T0)
        assert n.flush(30)
        log = n.actions()
        alerts = [n.build_alert(r.id or "k", [r], "firing") for r in incs + raw]
    # no command for any unsafe host; the plain one ran with one argument per template element
    ran = calls(out)
    assert len(ran) == 1 and ran[0]["argv"][0] == PLAIN and len(ran[0]["argv"]) == 4
    assert sum(r["status"] == "refused-unsafe" for r in log) == len(log) - 1
    assert all(not CONTROL.search(v) for v in ran[0]["env"].values())
    # every sink renders every alert without crashing; JSON bodies carry the value as data
    for sink in _all_sinks("http://127.0.0.1:9/x"):
        for a in alerts:
            body = sink.render(a)
            if sink.type == "console":
                assert isinstance(body, str)
                continue
            doc = json.loads(json.dumps(body))
            assert doc == body
            if sink.type == "webhook":
                assert doc["host"] == a.host
    # the incident pages: HTML escaped, nothing of the markup survives
    from gpufleet.analyzer.alerting.pages import write_pages

    pages = write_pages(incs[:3] + raw[:1] + [r for r in raw if "<script>" in r.host], [], tmp_path / "pages")
    html = "".join(p.read_text() for p in pages)
    assert "<script>alert(1)</script>" not in html and "&lt;script&gt;alert(1)&lt;/script&gt;" in html


@settings(max_examples=300, deadline=None)
@given(st.text(min_size=0, max_size=300))
@pytest.mark.slow
def test_any_host_text_is_acted_on_only_as_one_plain_name(host):
    sink = ActionSink(rules=[{"kinds": ["sdc"], "severities": ["critical"],
                              "command": ["x", "NodeName={host}"], "resolve_command": None, "verify": None,
                              "verify_expect": None, "resolve_verify": None, "resolve_verify_expect": None}])
    with Notifier([], ":memory:") as n:
        alert = n.build_alert("k", [incident(kind="sdc", id="k", host=host or None)], "firing")
    try:
        argv = sink.render(alert)
    except Unsafe:
        assert host and not hosts.is_plain(host)
        return
    except ValueError:
        assert not host  # no host: the placeholder has no value
        return
    assert hosts.is_plain(host) and argv == ["x", f"NodeName={host}"]


@skip_unless("influxd")
def test_the_pull_path_quarantines_too_and_shards_agree(tmp_path):
    from gpufleet.analyzer.store import pull

    names = ["gpu[001-003]", "ALL", "n1,n2", "node1 State=RESUME", "-n", "nöde", PLAIN]
    data = fleet_lp(names, set(range(len(names))))
    with InfluxDB1(tmp_path / "influx") as db:
        db.create_db("fleet")
        db.write("fleet", data)
        span = (int((T0 - 60) * 1e9), int((T0 + 2500) * 1e9))
        an = Analyzer()
        pull(an, Influx(db.url, "fleet"), *span)
        an.finish()
        whole = sorted(r.host for r in an.incidents() if r.kind == "memory_errors")
        assert whole == sorted(hosts.safe(h) for h in names)
        shards = []
        for i in range(2):  # each unsafe host is analysed by exactly one shard, as its display name
            an = Analyzer(shard=(i, 2))
            pull(an, Influx(db.url, "fleet"), *span)
            an.finish()
            shards += [r.host for r in an.incidents() if r.kind == "memory_errors"]
        assert sorted(shards) == whole
