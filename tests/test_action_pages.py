"""What the action sink did, on the incident's page (``gpufleet report --state``) and in the pages
the other sinks send: real incidents (the analyzer on telemetry with DBEs), real commands, a real
webhook receiver, the state file read back the way ``gpufleet actions`` reads it."""

from __future__ import annotations

import dataclasses
import json
import sys
import time

import pytest
from gpufleet.analyzer.alerting import Notifier, load_sinks, page_name
from gpufleet.analyzer.alerting.audit import read_actions
from gpufleet.analyzer.pipeline import Analyzer

from gpufleet import hosts, records
from gpufleet.cli import main
from tests.action_support import action, calls, fleet_lp, recorder
from tests.alerting_receiver import T0, Receiver, fast

HOSTILE = "<script>alert(1)</script>"
# the verification's answer for gpu002: markup and a control character, as a broken or forged
# scheduler reply could carry
VERIFY = ("import sys; h = sys.argv[1]\n"
          "if h == 'gpu002':\n"
          "    print('<img src=x onerror=alert(2)> no node \\x1b[2J' + h); sys.exit(1)\n"
          "print('NodeName=' + h)")


@pytest.mark.slow
def test_the_page_names_each_refusal_and_why_escaped(tmp_path):
    names = ["gpu001", "gpu002", "gpu003", HOSTILE]
    data = tmp_path / "fleet.lp"
    data.write_bytes(fleet_lp(names, {0, 1, 2, 3}))
    an = Analyzer()
    an.feed_bytes(data.read_bytes())
    an.finish()
    incs = [r for r in an.incidents() if r.kind == "memory_errors"]
    assert sorted(r.host for r in incs) == sorted(hosts.safe(h) for h in names)
    # the raw tag as another feed might hand it over: the sink refuses it by itself
    incs.append(dataclasses.replace(incs[-1], host=HOSTILE, id="raw"))
    by_host = {r.host: r for r in incs}
    cmd, out = recorder(tmp_path)
    reason = "Reason=<b>gpufleet</b> {kind} & co"
    rule = {"kinds": ["memory_errors"], "command": cmd + ["drain", "{host}", reason],
            "verify": [sys.executable, "-c", VERIFY, "{host}"]}
    state = tmp_path / "state.db"
    with Receiver() as rx:
        sinks = load_sinks([action([rule], budget_nodes=1, budget_percent=100, max_per_hour=100),
                            fast({"type": "webhook", "url": rx.url + "/h"})], [])
        with Notifier(sinks, state) as n:
            n.update(incs, now=T0)
            assert n.flush(30)
        sent = [r["json"] for r in rx.requests if r["json"]]
    drained = [c["argv"][1] for c in calls(out)]
    assert len(drained) == 1 and drained[0] in ("gpu001", "gpu003")
    budgeted = "gpu003" if drained[0] == "gpu001" else "gpu001"

    # the pages the other sinks got say what was refused and why
    refused = {p["key"]: p for p in sent if p.get("kind") == "remediation_refused"}
    verify_page = refused[f"action-refused:{by_host['gpu002'].id}"]
    assert "verify:" in verify_page["title"] and "exited 1" in verify_page["title"]
    assert "no node" in verify_page["title"] and "\x1b" not in json.dumps(verify_page)
    unsafe = refused[f"action-refused:{by_host[hosts.safe(HOSTILE)].id}"]
    assert "quarantined at ingest" in unsafe["title"]
    assert "is not a plain node name" in refused["action-refused:raw"]["title"]
    [budget] = [p for p in sent if p.get("kind") == "remediation_budget"]
    assert "disruption budget: 1 distinct nodes acted on" in budget["description"]
    assert f"drain {budgeted}" in budget["description"]

    # the page, from the state file as `gpufleet report --state` reads it
    inc_file = tmp_path / "incidents.jsonl"
    records.write(inc_file, incs)
    rc = main(["report", "--incidents", str(inc_file), "--input", str(data), "--out", str(tmp_path / "pages"),
               "--state", str(state), "--no-progress"])
    assert rc == 0

    def page(host):
        return (tmp_path / "pages" / page_name(by_host[host].id)).read_text()

    ran = page(drained[0])
    assert '<td id="remediation"><div>\n<span class="ok">run</span> by action' in ran
    quoted = "&#39;Reason=&lt;b&gt;gpufleet&lt;/b&gt; memory_errors &amp; co&#39;"  # shell-quoted, escaped
    assert quoted in ran
    assert "<b>gpufleet" not in ran and "Run by hand" not in ran

    v = page("gpu002")
    assert '<span class="refused">refused (verification)</span>' in v
    assert "exited 1: &lt;img src=x onerror=alert(2)&gt; no node" in v
    assert "<img src=x" not in v and "\x1b" not in v
    assert ("Run by hand if it must be: <code>" in v and
            "drain gpu002 &#39;Reason=&lt;b&gt;gpufleet&lt;/b&gt; memory_errors &amp; co&#39;</code>" in v)

    b = page(budgeted)
    assert '<span class="refused">refused (budget)</span>' in b
    assert f"disruption budget: 1 distinct nodes acted on in the last 3600 s ({drained[0]}); at most 1" in b
    assert f"drain {budgeted} " in b

    u = page(hosts.safe(HOSTILE))
    assert '<span class="refused">refused (unsafe name)</span>' in u
    assert "quarantined at ingest" in u and "<script>" not in u
    raw = page(HOSTILE)
    assert '<span class="refused">refused (unsafe name)</span>' in raw
    assert "host &lt;script&gt;alert(1)&lt;/script&gt; is not a plain node name" in raw
    assert "<script>" not in raw

    # pages without --state say nothing about actions; a wrong --state is one line, exit 2
    assert main(["report", "--incidents", str(inc_file), "--input", str(data), "--out", str(tmp_path / "p2"),
                 "--no-progress"]) == 0
    assert "remediation" not in (tmp_path / "p2" / page_name(by_host["gpu002"].id)).read_text()
    assert main(["report", "--incidents", str(inc_file), "--input", str(data), "--out", str(tmp_path / "p3"),
                 "--state", str(tmp_path / "nope.db")]) == 2
    assert not (tmp_path / "p3").exists()


@pytest.mark.slow
def test_actions_of_a_group_show_on_every_member_page(tmp_path):
    """An incident that joined another's group (same kind, host, near in time) shows the group's
    actions: the sink acted once, for both."""
    from tests.alerting_receiver import incident

    cmd, out = recorder(tmp_path)
    state = tmp_path / "s.db"
    incs = [incident(kind="sdc", id="g1", host="n1", gpu=0), incident(kind="sdc", id="g2", host="n1", gpu=1,
                                                                     start=T0 + 30)]
    with Notifier(load_sinks([action([{"command": cmd + ["drain", "{host}"]}])], []), state) as n:
        n.update(incs, now=T0 + 30)
        assert n.flush(10)
    assert [c["argv"] for c in calls(out)] == [["drain", "n1"]]
    [row] = read_actions([state])
    assert row["grp"] == "g1" and row["incidents"] == ["g1", "g2"] and row["what"] == "run"
    from gpufleet.analyzer.alerting import write_pages

    paths = write_pages(incs, [], tmp_path / "pages", actions=read_actions([state]))
    for p in paths[:-1]:
        assert " drain n1</code>" in p.read_text()


@pytest.mark.slow
def test_a_page_the_action_sink_queues_while_closing_still_goes_out(tmp_path):
    """Batch mode closes the notifier right after its one update: the webhook has sent the
    incidents and has nothing left while the action sink is still running a slow command; the
    budget page it queues after that goes out before close() returns, not on some next run."""
    from tests.alerting_receiver import incident

    cmd, out = recorder(tmp_path)
    slow = [sys.executable, "-c", "import time; time.sleep(1.0)"]
    rule = {"command": cmd + ["drain", "{host}"], "verify": slow}
    with Receiver() as rx:
        sinks = load_sinks([action([rule], budget_nodes=1, budget_percent=100, max_per_hour=100),
                            fast({"type": "webhook", "url": rx.url + "/h"})], [])
        n = Notifier(sinks, tmp_path / "s.db")
        n.update([incident(kind="sdc", id=f"c{i}", host=f"n{i}", start=T0 + i) for i in range(2)], now=T0)
        left = n.close(timeout=10)
        kinds = [r["json"].get("kind") for r in rx.requests if r["json"]]
    assert left == {}
    assert [c["argv"] for c in calls(out)] == [["drain", "n0"]]
    assert kinds.count("sdc") == 2 and kinds.count("remediation_budget") == 1


def test_close_waits_for_a_command_already_running(tmp_path):
    """A command that outlasts close()'s timeout is waited for and recorded: the analyzer never
    exits in batch mode leaving a drain running that no record knows of."""
    from tests.alerting_receiver import incident

    cmd, out = recorder(tmp_path)
    slow = [sys.executable, "-c", "import time; time.sleep(1.5)"]
    rule = {"command": cmd + ["drain", "{host}"], "verify": slow}
    n = Notifier(load_sinks([action([rule], timeout=5)], []), tmp_path / "s.db")
    n.update([incident(kind="sdc", id="w1", host="n1")], now=T0)
    time.sleep(0.3)  # the verification is running
    assert n.close(timeout=0.2) == {}
    assert [c["argv"] for c in calls(out)] == [["drain", "n1"]]
    assert [r["status"] for r in read_actions([tmp_path / "s.db"])] == ["ok"]
