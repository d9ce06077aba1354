"""What stands between an incident and a command (analyzer/alerting/action.py): the verification
command, the disruption budget (analyzer/alerting/budget.py) and the pages saying what was refused;
with real commands and a real webhook receiver. Two analyzer processes sharing one budget against
a real Slurm: tests/test_remediation_budget.py."""

from __future__ import annotations

import dataclasses
import json
import logging
import re
import sys

import pytest
from gpufleet.analyzer.alerting import Notifier, load_sinks
from gpufleet.analyzer.alerting.budget import Ledger

from gpufleet.errors import ConfigError
from tests.action_support import action, calls, recorder
from tests.alerting_receiver import T0, Receiver, fast, incident


def pages(rx, kind):
    return [r["json"] for r in rx.requests if r["json"] and r["json"].get("kind") == kind]


def test_a_failed_verification_runs_nothing_and_pages_why(tmp_path, caplog):
    cmd, out = recorder(tmp_path)
    fail = [sys.executable, "-c", "import sys; print('no such node: ' + sys.argv[1]); sys.exit(1)", "{host}"]
    ok = [sys.executable, "-c", "import sys; print('NodeName=' + sys.argv[1] + ' State=IDLE')", "{host}"]
    rules = [{"kinds": ["sdc"], "command": cmd + ["drain", "{host}"], "verify": fail},
             {"kinds": ["gpu_lost"], "command": cmd + ["drain", "{host}"], "verify": ok,
              "verify_expect": r"\ANodeName={host} State=IDLE\n?\Z"},
             {"kinds": ["memory_errors"], "command": cmd + ["drain", "{host}"], "verify": ok,
              "verify_expect": r"\ANodeName=other "}]
    with Receiver() as rx:
        sinks = load_sinks([action(rules, resume=True), fast({"type": "webhook", "url": rx.url + "/h"})], [])
        with caplog.at_level(logging.INFO, logger="gpufleet.alerting"), \
                Notifier(sinks, tmp_path / "s.db") as n:
            n.update([incident(kind="sdc", id="v1", host="n1"),
                      incident(kind="gpu_lost", id="v2", host="n.2", start=T0 + 1),
                      incident(kind="memory_errors", id="v3", host="n3", start=T0 + 2)], now=T0)
            assert n.flush(10)
            n.update([incident(kind="sdc", id="v1", host="n1", end=T0 + 60)], now=T0 + 60)
            assert n.flush(10)
            log = n.actions()
        refused = pages(rx, "remediation_refused")
    assert [c["argv"] for c in calls(out)] == [["drain", "n.2"]]  # '.' matched literally: escaped
    assert [(r["grp"], r["action"], r["status"]) for r in log] == [
        ("v1", "firing", "refused-verify"), ("v2", "firing", "ok"), ("v3", "firing", "refused-verify")]
    assert "exited 1: no such node: n1" in log[0]["detail"]
    assert "does not match verify_expect" in log[2]["detail"]
    # the page says the action was refused, why, and what to run by hand; the resolve undoes nothing
    assert sorted(p["key"] for p in refused) == ["action-refused:v1", "action-refused:v3"]
    p1 = next(p for p in refused if p["key"] == "action-refused:v1")
    assert "Remediation refused" in p1["title"] and "no such node: n1" in p1["title"]
    assert "drain n1" in p1["description"]
    assert p1["runbook_url"].endswith("/remediation_refused.md")  # its own runbook, not the incident's
    assert sum("v1" in m and "refused-verify" in m for m in caplog.messages) == 1


def test_a_node_our_own_command_drained_before_a_restart_is_not_a_refusal(tmp_path):
    # an analyzer claimed n1 for incident w1 in the ledger and started its drain, then was killed
    # (SIGKILL) before it could write the outcome down; the drain finished without it. Restarted, it
    # delivers w1 again: the verification now fails ("already drained"), but that is its own doing
    cmd, out = recorder(tmp_path)
    drained = [sys.executable, "-c", "import sys; print('NodeName=' + sys.argv[1] + ' State=DRAINED'); "
               "sys.exit(1)", "{host}"]
    rule = {"command": cmd + ["drain", "{host}"], "verify": drained}
    Ledger(tmp_path / "remediation-budget.jsonl").claim("n1", None, None, {}, sink="action", key="w1")
    with Receiver() as rx:
        sinks = load_sinks([action([rule]), fast({"type": "webhook", "url": rx.url + "/h"})], [])
        with Notifier(sinks, tmp_path / "s.db") as n:
            n.update([incident(kind="sdc", id="w1", host="n1"),
                      incident(kind="gpu_lost", id="w2", host="n1", start=T0 + 1)], now=T0)
            assert n.flush(10)
            log = n.actions()
        refused = pages(rx, "remediation_refused")
    assert calls(out) == []  # run by nobody now
    by = {r["grp"]: r for r in log}
    assert by["w1"]["status"] == "ran-before" and "before a restart" in by["w1"]["detail"]
    assert by["w2"]["status"] == "refused-verify"  # another incident on the same node: a refusal
    assert [p["key"] for p in refused] == ["action-refused:w2"]


def test_resolve_verify_keeps_a_node_a_person_took_over(tmp_path):
    cmd, out = recorder(tmp_path)
    state = tmp_path / "reason"
    state.write_text("gpufleet: x1")
    show = [sys.executable, "-c", f"print(open({str(state)!r}).read())"]
    rule = {"command": cmd + ["drain", "{host}"], "resolve_command": cmd + ["resume", "{host}"],
            "resolve_verify": show, "resolve_verify_expect": r"gpufleet: {key}\b"}
    with Notifier(load_sinks([action([rule], resume=True)], []), tmp_path / "s.db") as n:
        for i, reason in ((1, "gpufleet: x1"), (2, "admin: bad fan, do not resume")):
            inc = incident(kind="sdc", id=f"x{i}", host="n1", start=T0 + 1000 * i)
            state.write_text(reason if i == 2 else "gpufleet: x1")
            n.update([inc], now=T0 + 1000 * i)
            assert n.flush(10)
            n.update([dataclasses.replace(inc, end=T0 + 1000 * i + 60)], now=T0 + 1000 * i + 60)
            assert n.flush(10)
        log = n.actions()
    assert [c["argv"] for c in calls(out)] == [["drain", "n1"], ["resume", "n1"], ["drain", "n1"]]
    assert [(r["grp"], r["action"], r["status"]) for r in log][-1] == ("x2", "resolved", "not-undone")
    assert "a person may have taken it over" in log[-1]["detail"]


def test_budget_acts_on_two_nodes_refuses_the_rest_and_pages_once(tmp_path):
    cmd, out = recorder(tmp_path)
    rule = {"command": cmd + ["drain", "{host}"]}
    with Receiver() as rx:
        sinks = load_sinks([action([rule], budget_nodes=2, budget_percent=100, max_per_hour=100),
                            fast({"type": "webhook", "url": rx.url + "/h"})], [])
        with Notifier(sinks, tmp_path / "s.db") as n:
            n.update([incident(kind="sdc", id=f"b{i}", host=f"n{i}", start=T0 + i) for i in range(5)], now=T0)
            assert n.flush(10)
            # the same node again spends nothing; a new one is still refused
            n.update([incident(kind="gpu_lost", id="b0-again", host="n0", start=T0 + 900),
                      incident(kind="gpu_lost", id="b9", host="n9", start=T0 + 901)], now=T0 + 900)
            assert n.flush(10)
            log = n.actions()
        budget = pages(rx, "remediation_budget")
    assert [c["argv"] for c in calls(out)] == [["drain", "n0"], ["drain", "n1"], ["drain", "n0"]]
    assert [r["status"] for r in log] == ["ok", "ok", "refused-budget", "refused-budget", "refused-budget",
                                          "ok", "refused-budget"]
    assert "2 distinct nodes acted on" in log[2]["detail"] and "run it by hand" in log[2]["detail"]
    assert len(budget) == 1 and budget[0]["severity"] == "critical"
    assert "budget exhausted" in budget[0]["title"] and "drain n2" in budget[0]["description"]
    assert budget[0]["runbook_url"].endswith("/remediation_budget.md")
    ledger = [json.loads(x) for x in (tmp_path / "remediation-budget.jsonl").read_text().splitlines()]
    assert [(e["type"], e.get("host")) for e in ledger] == [("act", "n0"), ("act", "n1"), ("exhausted", "n2")]


def test_budget_percent_of_a_rack_and_dry_run_spends_nothing(tmp_path):
    cmd, out = recorder(tmp_path)
    rule = {"command": cmd + ["drain", "{host}"]}
    fleet = [(f"n{i}", f"r{i // 10}", "c1") for i in range(40)]  # 4 racks of 10, 40 nodes
    for dry in (True, False):
        sinks = load_sinks([action([rule], dry_run=dry, budget_nodes=10, budget_percent=10,
                                   max_per_hour=100)], [])
        with Notifier(sinks, tmp_path / f"s{dry}.db") as n:
            n.fleet = lambda: fleet
            n.update([incident(kind="sdc", id=f"p{i}", host=f"n{i}", rack=f"r{i // 10}", start=T0 + i)
                      for i in (0, 1, 2, 10, 11)], now=T0)
            assert n.flush(10)
            log = n.actions()
        want = ["ok", "refused-budget", "refused-budget", "ok", "refused-budget"]
        assert [r["status"] for r in log] == [("dry-run" if s == "ok" and dry else s) for s in want]
        assert "1 of the 10 nodes of rack r0" in log[1]["detail"]
    assert [c["argv"] for c in calls(out)] == [["drain", "n0"], ["drain", "n10"]]
    # the dry run's ledger is its own: the live one was whole when the live sink started
    dry = Ledger(tmp_path / "remediation-budget.jsonl.dry-run").entries()
    live = Ledger(tmp_path / "remediation-budget.jsonl").entries()
    assert [e["host"] for e in dry if e["type"] == "act"] == ["n0", "n10"]
    assert [e["host"] for e in live if e["type"] == "act"] == ["n0", "n10"]


def test_the_ledger_skips_a_torn_line_and_forgets_after_the_window(tmp_path):
    path = tmp_path / "l.jsonl"
    led = Ledger(path, nodes=1, percent=100, window=60)
    assert led.claim("a", None, None, {}, sink="s", key="k1", now=1000).ok
    with path.open("a") as f:
        f.write('{"type": "act", "t": 10')  # a crash mid-line
    d = led.claim("b", None, None, {}, sink="s", key="k2", now=1010)
    assert not d.ok and d.page and "1 distinct nodes" in d.why
    assert not led.claim("c", None, None, {}, sink="s", key="k3", now=1020).page  # paged once
    assert led.claim("b", None, None, {}, sink="s", key="k4", now=1061).ok  # the window moved on


def gpufleet(*args):
    import subprocess

    return subprocess.run([sys.executable, "-m", "gpufleet", *args], capture_output=True, text=True,
                          timeout=60)


@pytest.mark.slow
def test_gpufleet_actions_lists_what_ran_was_refused_and_undone(tmp_path):
    cmd, out = recorder(tmp_path)
    fail = [sys.executable, "-c", "import sys; print('Node gone'); sys.exit(1)"]
    rules = [{"kinds": ["sdc"], "command": cmd + ["drain", "{host}"],
              "resolve_command": cmd + ["resume", "{host}"],
              "resolve_verify": [sys.executable, "-c", "pass"]},
             {"kinds": ["gpu_lost"], "command": cmd + ["drain", "{host}"], "verify": fail}]
    state = tmp_path / "s.db"
    sinks = load_sinks([action(rules, resume=True, budget_nodes=2, budget_percent=100)], [])
    with Notifier(sinks, state) as n:
        sdc = incident(kind="sdc", id="a1", host="n1")
        n.update([sdc, incident(kind="sdc", id="a2", host="ALL", start=T0 + 1),
                  incident(kind="gpu_lost", id="a3", host="n3", start=T0 + 2),
                  incident(kind="sdc", id="a4", host="n4", start=T0 + 3),
                  incident(kind="sdc", id="a5", host="n5", start=T0 + 4)], now=T0)
        assert n.flush(10)
        n.update([dataclasses.replace(sdc, end=T0 + 60)], now=T0 + 60)
        assert n.flush(10)
    r = gpufleet("actions", "--state", str(state))
    assert r.returncode == 0, r.stderr
    heads = [" ".join(re.split(r"\s{2,}", line)[1:3]) for line in r.stdout.splitlines()
             if not line.startswith("    ")]
    assert heads == ["run a1", "refused (unsafe name) a2", "refused (verification) a3", "run a4",
                     "refused (budget) a5", "undone a1"]
    assert "drain n5" in r.stdout and "why: disruption budget: 2 distinct nodes" in r.stdout
    assert "exited 1: Node gone" in r.stdout
    r = gpufleet("actions", "--state", str(state), "--status", "refused", "--json")
    got = [json.loads(x) for x in r.stdout.splitlines()]
    assert [(g["grp"], g["what"]) for g in got] == [
        ("a2", "refused (unsafe name)"), ("a3", "refused (verification)"), ("a5", "refused (budget)")]
    assert got[2]["argv"][-2:] == ["drain", "n5"]
    r = gpufleet("actions", "--state", str(tmp_path / "nope.db"))
    assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1 and "no such state file" in r.stderr
    assert not (tmp_path / "nope.db").exists()


def test_resume_without_resolve_verify_is_a_config_error():
    rule = {"command": ["drain", "{host}"], "resolve_command": ["resume", "{host}"]}
    with pytest.raises(ConfigError, match="rule #1: resume = true needs resolve_verify"):
        load_sinks([action([rule], resume=True)], [])
    load_sinks([action([rule], resume=False)], [])  # no undo: nothing to guard


def test_refusals_do_not_spend_the_rate_limit(tmp_path):
    cmd, out = recorder(tmp_path)
    known = [sys.executable, "-c", "import sys; sys.exit(sys.argv[1] != 'n3')", "{host}"]
    rule = {"command": cmd + ["drain", "{host}"], "verify": known}
    sinks = load_sinks([action([rule], max_per_hour=1)], [])
    with Notifier(sinks, tmp_path / "s.db") as n:
        n.update([incident(kind="sdc", id=f"u{i}", host=f"n{i}", start=T0 + i) for i in (1, 2, 3)], now=T0)
        assert n.flush(10)
        assert [r["status"] for r in n.actions()] == ["refused-verify", "refused-verify", "ok"]
    assert [c["argv"] for c in calls(out)] == [["drain", "n3"]]
