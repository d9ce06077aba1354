"""The action sink with real commands (no scheduler): argument lists without a shell, dry-run,
deadline, failures that never stop the notifier or the other sinks, rate limit, resume.
The same sink against a real Slurm: tests/test_slurm_action.py."""

from __future__ import annotations

import dataclasses
import logging
import sys
import time
import tomllib
from pathlib import Path

import pytest
from gpufleet.analyzer.alerting import Notifier, load_sinks

from gpufleet.errors import ConfigError
from tests.action_support import action, calls, recorder
from tests.alerting_receiver import T0, Receiver, fast, incident

ROOT = Path(__file__).resolve().parent.parent
def test_runs_argument_lists_without_a_shell_with_incident_fields(tmp_path):
    cmd, out = recorder(tmp_path)
    rule = {"command": cmd + ["drain", "{host}", "Reason=gpufleet: {kind} {where}", "{title}"],
            "resolve_command": cmd + ["resume", "{host}"], "resolve_verify": [sys.executable, "-c", "pass"]}
    sinks = load_sinks([action([rule], resume=True)], [])
    inc = incident(kind="sdc", id="s1", host="node07", summary="x; $(id)", jobs=["4242"])
    inc.evidence = {"peak": {"mismatches": 3}}
    with Notifier(sinks, tmp_path / "s.db") as n:
        n.update([inc], now=T0)
        assert n.flush(10)
        n.update([dataclasses.replace(inc, end=T0 + 60)], now=T0 + 60)
        assert n.flush(10)
        log = n.actions()
    got = calls(out)
    assert [c["argv"][:2] for c in got] == [["drain", "node07"], ["resume", "node07"]]
    assert got[0]["argv"][2] == "Reason=gpufleet: sdc node07 GPU 3"
    assert got[0]["argv"][3] == "node07 GPU 3 returned WRONG RESULTS (silent data corruption)"
    env = got[0]["env"]
    assert env["GPUFLEET_HOST"] == "node07" and env["GPUFLEET_GPU"] == "3" and env["GPUFLEET_KIND"] == "sdc"
    assert env["GPUFLEET_JOBS"] == "4242" and env["GPUFLEET_STATUS"] == "firing"
    assert env["GPUFLEET_RUNBOOK_URL"].endswith("/sdc.md") and env["GPUFLEET_ACTION"].startswith("Drain")
    assert [(r["action"], r["status"], r["rc"]) for r in log] == [("firing", "ok", 0), ("resolved", "ok", 0)]
    assert log[0]["argv"][-4:] == got[0]["argv"] and log[0]["seconds"] < 5


def test_incident_text_never_reaches_a_shell(tmp_path):
    cmd, out = recorder(tmp_path)
    pwned = tmp_path / "pwned"
    nasty = f'n1; touch {pwned}; $(touch {pwned}) `touch {pwned}`'
    sinks = load_sinks([action([{"command": cmd + ["{host}", "{jobs}"]}])], [])
    with Notifier(sinks, tmp_path / "s.db") as n:
        n.update([incident(kind="gpu_lost", id="g1", host="n1", jobs=[nasty])], now=T0)
        n.update([incident(kind="gpu_lost", id="g2", host=nasty, start=T0 + 1)], now=T0 + 1)
        assert n.flush(10)
        log = n.actions()
    assert [c["argv"] for c in calls(out)] == [["n1", nasty]] and not pwned.exists()
    assert [r["status"] for r in log] == ["ok", "refused-unsafe"]


def test_dry_run_is_the_default_and_is_recorded(tmp_path, caplog):
    cmd, out = recorder(tmp_path)
    sinks = load_sinks([{"type": "action", "rule": [{"command": cmd + ["{host}"]}]}], [])
    with caplog.at_level(logging.INFO, logger="gpufleet.alerting"), Notifier(sinks, tmp_path / "s.db") as n:
        n.update([incident(kind="sdc", id="d1")], now=T0)
        assert n.flush(10)
        log = n.actions()
    assert not out.exists()
    assert [(r["status"], r["argv"][-1]) for r in log] == [("dry-run", "node01")]
    assert any("action action: firing sdc on node01 (d1): dry-run:" in m for m in caplog.messages)


def test_rules_pick_by_kind_and_severity(tmp_path):
    cmd, out = recorder(tmp_path)
    sinks = load_sinks([action([{"kinds": ["sdc"], "command": cmd + ["sdc-rule"]},
                                {"kinds": ["thermal_throttle"], "severities": ["warning", "critical"],
                                 "command": cmd + ["thermal-rule"]}])], [])
    with Notifier(sinks, tmp_path / "s.db") as n:
        n.update([incident(kind="sdc", id="a", severity="warning"),            # no rule: warning
                  incident(kind="thermal_throttle", id="b", severity="warning", start=T0 + 1),
                  incident(kind="sdc", id="c", host="n2", start=T0 + 2),
                  incident(kind="straggler", id="d", host="n3", start=T0 + 3)], now=T0)
        assert n.flush(10)
    assert [c["argv"] for c in calls(out)] == [["thermal-rule"], ["sdc-rule"]]


@pytest.mark.parametrize("command,why", [
    ([sys.executable, "-c", "import sys; print('Invalid node name specified'); sys.exit(1)"],
     "exit status 1): Invalid node name specified"),
    (["/nonexistent/scontrol", "update"], "/nonexistent/scontrol: command not found"),
    ([sys.executable, "-c", "import time; time.sleep(60)"], "timed out after 0.5 s; killed"),
    (["{link}"], "placeholder with no value"),
])
def test_a_failing_missing_or_hanging_command_is_one_log_line_and_the_incident_still_pages(
        tmp_path, caplog, command, why):
    with Receiver() as rx:
        sinks = load_sinks([action([{"command": command}], timeout=0.5),
                            fast({"type": "webhook", "url": rx.url + "/hook"})], [])
        with caplog.at_level(logging.INFO, logger="gpufleet.alerting"), \
                Notifier(sinks, tmp_path / "s.db") as n:
            t = time.monotonic()
            n.update([incident(kind="sdc", id="f1")], now=T0)
            assert n.flush(10)
            assert time.monotonic() - t < 5  # the deadline holds: the command is killed
            n.update([incident(kind="sdc", id="f2", host="n2", start=T0 + 5)], now=T0 + 5)
            assert n.flush(10)  # the sink's worker lives on
            log = n.actions()
            pend = n.outbox("action")
        assert [r["json"]["key"] for r in rx.requests] == ["f1", "f2"]  # paged anyway
    assert [r["status"] for r in log] == ["failed", "failed"]
    assert [p["state"] for p in pend] == ["failed", "failed"]
    lines = [m for m in caplog.messages if "f1" in m]
    assert len(lines) == 1 and why in lines[0], lines


def test_rate_limit_is_a_safety_valve_that_survives_a_restart(tmp_path, caplog):
    cmd, out = recorder(tmp_path)
    spec = action([{"command": cmd + ["{host}"], "resolve_command": cmd + ["resume", "{host}"],
                    "resolve_verify": [sys.executable, "-c", "pass"]}], max_per_hour=2, resume=True)
    incs = [incident(kind="sdc", id=f"r{i}", host=f"n{i}", start=T0 + i) for i in range(4)]
    with Notifier(load_sinks([spec], []), tmp_path / "s.db") as n:
        n.update(incs, now=T0 + 10)
        assert n.flush(10)
        # a suppressed drain is never "resumed"
        n.update([dataclasses.replace(i, end=T0 + 20) for i in incs], now=T0 + 20)
        assert n.flush(10)
    got = [c["argv"] for c in calls(out)]
    assert got[:2] == [["n0"], ["n1"]] and sorted(got[2:]) == [["resume", "n0"], ["resume", "n1"]]
    with Notifier(load_sinks([spec], []), tmp_path / "s.db") as n:  # restart: still two this hour
        n.update([incident(kind="sdc", id="r9", host="n9", start=T0 + 30)], now=T0 + 30)
        assert n.flush(10)
        log = n.actions()
    assert [r["status"] for r in log if r["action"] == "firing"] == ["ok", "ok", "suppressed", "suppressed",
                                                                     "suppressed"]
    assert len(calls(out)) == 4
    assert any("rate limit reached: max_per_hour = 2 commands in the last hour; not run" in m
               for m in caplog.messages)


@pytest.mark.parametrize("spec,msg", [
    ({"type": "action"}, "needs at least one [[sink.rule]]"),
    ({"type": "action", "rule": [{"command": "scontrol update NodeName={host}"}]},
     "a non-empty list of strings"),
    ({"type": "action", "rule": [{"command": ["x"], "kinds": ["melted"]}]}, "unknown 'melted'"),
    ({"type": "action", "rule": [{"command": ["x"], "extra": 1}]}, "unknown key(s) extra"),
    ({"type": "action", "rule": [{"command": ["x"]}], "dry_run": "no"}, "dry_run: expected true or false"),
    ({"type": "action", "rule": [{"command": ["x"]}], "max_per_hour": -1}, "max_per_hour: -1 is below the "
                                                                           "minimum 0"),
    ({"type": "action", "rule": [{"command": ["x"]}], "budget_percent": 0}, "budget_percent: 0 is not above"),
    ({"type": "action", "rule": "x"}, "rule: expected a list of tables"),
    ({"type": "action", "rule": [{"command": ["x"]}], "shell": True}, "shell: unknown key"),
])
def test_bad_action_config_is_one_clear_error(spec, msg):
    with pytest.raises(ConfigError, match=None) as e:
        load_sinks([spec], [])
    assert msg in str(e.value) and "sink #1 (action)" in str(e.value)
    with pytest.raises(ConfigError, match="configure it as a"):
        load_sinks([], ["action"])


def test_shipped_examples_load_and_default_to_dry_run(tmp_path):
    examples = sorted((ROOT / "packaging" / "examples").glob("action-*.toml"))
    assert [p.name for p in examples] == ["action-k8s-cordon.toml", "action-slurm-drain.toml"]
    for p in examples:
        (sink,) = load_sinks(tomllib.loads(p.read_text())["sink"], [])
        assert sink.type == "action" and sink.dry_run and 0 < sink.max_per_hour <= 10
        with Notifier([], tmp_path / f"{p.stem}.db") as n:
            alert = n.build_alert("k", [incident(kind="sdc", id="k", host="node07")], "firing")
        argv = sink.render(alert)
        assert "node07" in " ".join(argv) and argv[0] in ("scontrol", "kubectl")
        # every shipped rule checks the node with the scheduler first, within a 2-node budget
        assert all(r["verify"] and r["verify_expect"] for r in sink.rules)
        assert sink.budget[:3] == (2, 5.0, 3600.0)
        assert sink.budget[3].startswith("/var/lib/gpufleet-analyzer/shared/")


@pytest.mark.slow  # a child python must start within the 0.5 s deadline: not on a loaded machine
def test_a_command_that_leaves_a_daemon_holding_its_output_does_not_hang_the_sink(tmp_path):
    # the command exits at once, but a process it started in a new session keeps stdout open
    daemon = "import os, time; os.setsid(); time.sleep(4)"
    cmd = [sys.executable, "-c", "import subprocess, sys; subprocess.Popen([sys.executable, '-c', "
           f"{daemon!r}], start_new_session=True); print('drained')"]
    with Notifier(load_sinks([action([{"command": cmd}], timeout=0.5)], []), tmp_path / "s.db") as n:
        t = time.monotonic()
        n.update([incident(kind="sdc", id="dm1")], now=T0)
        assert n.flush(10) and time.monotonic() - t < 5
        (rec,) = n.actions()
    assert rec["status"] == "ok" and rec["rc"] == 0
