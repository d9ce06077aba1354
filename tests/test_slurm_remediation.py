"""Nothing a node sends can be turned against the fleet, against a real Slurm (tests/slurm.py) with
six nodes (this host and gpu[001-005]) and the shipped drain rule (dry_run = false):

- host tags a node could write (hostlists, ALL, comma lists, options, words) go through ingest,
  detection and the action sink: no command runs for any of them, a plain name still drains,
  and ``sinfo -R`` shows only that node;
- two analyzer processes (shards) sharing a disruption budget of 2 nodes, given DBEs on 5 nodes,
  drain exactly 2 and page "remediation budget exhausted" once, across a SIGKILL and restart:
  of both, state lost, and of one killed (with its command, as systemd's control-group kill does)
  between its ledger entry and its drain, restarted on its own state.
"""

from __future__ import annotations

import copy
import dataclasses
import json
import os
import signal
import subprocess
import sys
import time
import tomllib
from pathlib import Path

import pytest
from gpufleet.analyzer.alerting import Notifier, load_sinks
from gpufleet.analyzer.alerting.audit import read_actions
from gpufleet.analyzer.pipeline import Analyzer

from gpufleet import hosts
from tests.action_support import fleet_lp
from tests.alerting_receiver import T0, Receiver, fast
from tests.slurm import Slurm, skip_unless_slurm

pytestmark = skip_unless_slurm()
ROOT = Path(__file__).resolve().parent.parent
EXAMPLE = ROOT / "packaging" / "examples" / "action-slurm-drain.toml"
MORE = "gpu[001-005]"


@pytest.fixture(scope="module")
def slurm(tmp_path_factory):
    with Slurm(tmp_path_factory.mktemp("slurm6"), more_nodes=MORE) as s:
        yield s


@pytest.fixture
def cluster(slurm, monkeypatch):
    """Every node back in service before and after a test; scontrol finds this cluster."""
    monkeypatch.setenv("SLURM_CONF", str(slurm.conf))
    resume(slurm)
    yield slurm
    resume(slurm)


def resume(slurm):
    for n in [slurm.node] + [f"gpu00{i}" for i in range(1, 6)]:
        slurm.run(["scontrol", "update", f"NodeName={n}", "State=RESUME"], check=False)
    assert slurm.wait_for(lambda: not drained(slurm), timeout=10)


def drained(slurm) -> list[str]:
    """Nodes ``sinfo -R`` lists with a reason (drained or draining)."""
    out = slurm.run(["sinfo", "-R", "-h", "-N", "-o", "%n|%E"], check=False).stdout
    return sorted(line.split("|")[0] for line in out.splitlines() if "gpufleet" in line)


def example_sink(**overrides) -> dict:
    spec = copy.deepcopy(tomllib.loads(EXAMPLE.read_text())["sink"][0])
    del spec["budget_ledger"]  # beside the test's state file, not in /var/lib
    spec.update(overrides)
    return spec


def test_no_command_for_any_unsafe_host_tag_and_a_plain_name_still_drains(cluster, tmp_path):
    slurm = cluster
    names = ["gpu[001-003]", "ALL", "all", f"{slurm.node},gpu005", "-n", "gpu001 State=RESUME",
             "--selector=x=y", "gpu004"]
    data = fleet_lp(names, set(range(len(names))))
    an = Analyzer()
    an.feed_bytes(data)
    an.finish()
    incs = [r for r in an.incidents() if r.kind == "memory_errors"]
    assert sorted(r.host for r in incs) == sorted(hosts.safe(h) for h in names)
    # the raw tags again, as another feed might hand them over: the sink refuses them itself
    raw = [dataclasses.replace(r, host=an.parser.series.unsafe_hosts.get(r.host, r.host), id=f"raw-{i}")
           for i, r in enumerate(incs)]
    sink = example_sink(dry_run=False, budget_nodes=20, budget_percent=100, max_per_hour=100)
    sinks = load_sinks([sink], [])
    with Notifier(sinks, tmp_path / "s.db") as n:
        n.update(incs + raw, now=T0)
        assert n.flush(30)
        log = n.actions()
    assert drained(slurm) == ["gpu004"]
    assert slurm.node_state() == "idle"
    ok = [r for r in log if r["status"] == "ok"]
    assert [r["argv"][2] for r in ok] == ["NodeName=gpu004"]
    refused = [r for r in log if r["status"] == "refused-unsafe"]
    assert len(refused) == 2 * len(names) - 2 and all(r["argv"] is None for r in refused)
    assert {r["status"] for r in log} == {"ok", "refused-unsafe"}  # raw gpu004 joined gpu004's page
    assert sum("quarantined at ingest" in r["detail"] for r in refused) == len(names) - 1


def test_verify_refuses_a_plain_name_slurm_does_not_know(cluster, tmp_path):
    slurm = cluster
    data = fleet_lp(["gpu999", "gpu003"], {0, 1})
    an = Analyzer()
    an.feed_bytes(data)
    an.finish()
    sinks = load_sinks([example_sink(dry_run=False, budget_percent=100)], [])
    with Notifier(sinks, tmp_path / "s.db") as n:
        n.update(an.incidents(), now=T0)
        assert n.flush(30)
        log = {r["argv"][2]: r for r in n.actions()}
    assert drained(slurm) == ["gpu003"]
    assert log["NodeName=gpu999"]["status"] == "refused-verify"
    assert "Node gpu999 not found" in log["NodeName=gpu999"]["detail"]


def test_the_incident_page_says_what_slurm_refused_and_why(cluster, tmp_path):
    """`gpufleet report --state`: the page of a node Slurm does not know says the verification
    refused it, with scontrol's answer; the page of the node past the budget says the budget did."""
    from gpufleet.analyzer.alerting import page_name

    from gpufleet import records
    from gpufleet.cli import main

    slurm = cluster
    data = tmp_path / "fleet.lp"
    data.write_bytes(fleet_lp(["gpu999", "gpu003", "gpu004"], {0, 1, 2}))
    an = Analyzer()
    an.feed_bytes(data.read_bytes())
    an.finish()
    incs = an.incidents()
    with Notifier(load_sinks([example_sink(dry_run=False, budget_nodes=1, budget_percent=100)], []),
                  tmp_path / "s.db") as n:
        n.update(incs, now=T0)
        assert n.flush(30)
    [done] = drained(slurm)
    records.write(tmp_path / "incidents.jsonl", incs)
    assert main(["report", "--incidents", str(tmp_path / "incidents.jsonl"), "--input", str(data),
                 "--out", str(tmp_path / "pages"), "--state", str(tmp_path / "s.db"), "--no-progress"]) == 0
    page = {r.host: (tmp_path / "pages" / page_name(r.id)).read_text() for r in incs}
    assert '<span class="refused">refused (verification)</span>' in page["gpu999"]
    assert "scontrol show node -o gpu999 exited 1: Node gpu999 not found" in page["gpu999"]
    assert '<span class="ok">run</span>' in page[done]
    other = page[({"gpu003", "gpu004"} - {done}).pop()]
    assert '<span class="refused">refused (budget)</span>' in other
    assert f"disruption budget: 1 distinct nodes acted on in the last 3600 s ({done}); at most 1" in other
    assert "Run by hand if it must be: <code>scontrol update NodeName=gpu00" in other


def _analyze(data: Path, cfg: Path, shard: int, tmp: Path, tag: str) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-m", "gpufleet", "analyze", "--input", str(data), "--config", str(cfg),
         "--shard", f"{shard}/2", "--state", str(tmp / f"{tag}.db"), "--out", str(tmp / f"{tag}.jsonl")],
        stdout=subprocess.DEVNULL, stderr=open(tmp / f"{tag}.err", "wb"), stdin=subprocess.DEVNULL,
        env={**os.environ, "SLURM_CONF": os.environ["SLURM_CONF"]}, start_new_session=True)


def test_two_analyzers_share_a_budget_of_two_nodes_across_a_sigkill(cluster, tmp_path):
    slurm = cluster
    data = tmp_path / "fleet.lp"
    names = [slurm.node, "gpu001", "gpu002", "gpu003", "gpu004", "gpu005"]
    data.write_bytes(fleet_lp(names, {1, 2, 3, 4, 5}))
    ledger = tmp_path / "shared" / "budget.jsonl"
    with Receiver() as rx:
        sink = example_sink(dry_run=False, budget_nodes=2, budget_percent=100, max_per_hour=100,
                            budget_ledger=str(ledger))
        hook = fast({"type": "webhook", "name": "oncall", "url": rx.url + "/hook"})
        cfg = tmp_path / "analyzer.toml"
        cfg.write_text(_toml({"sink": [sink, hook]}))

        def budget_pages():
            return [r for r in rx.requests if (r["json"] or {}).get("kind") == "remediation_budget"]

        # both shards at once (shard 1 has gpu001-003, shard 0 gpu004-005)
        procs = [_analyze(data, cfg, i, tmp_path, f"a{i}") for i in (0, 1)]
        for i, p in enumerate(procs):
            assert p.wait(120) == 0, (tmp_path / f"a{i}.err").read_text()
        assert len(drained(slurm)) == 2, drained(slurm)
        first = drained(slurm)
        assert len(rx.wait_for(1, 10, lambda r: (r["json"] or {}).get("kind") == "remediation_budget")) == 1
        # state lost and a SIGKILL mid-run: both shards start again from nothing but the ledger
        for tag in ("a0", "a1"):
            (tmp_path / f"{tag}.db").unlink()
        p = _analyze(data, cfg, 1, tmp_path, "b1")
        time.sleep(1.0)
        os.killpg(p.pid, signal.SIGKILL)
        p.wait(10)
        procs = [_analyze(data, cfg, i, tmp_path, f"c{i}") for i in (0, 1)]
        for i, p in enumerate(procs):
            assert p.wait(120) == 0, (tmp_path / f"c{i}.err").read_text()
        time.sleep(1.5)  # a second budget page would have arrived by now
        assert drained(slurm) == first
        assert len(budget_pages()) == 1
        page = budget_pages()[0]["json"]
        assert page["severity"] == "critical" and "budget exhausted" in page["title"]
    entries = [json.loads(x) for x in ledger.read_text().splitlines() if x.strip()]
    assert sorted(e["host"] for e in entries if e.get("type") == "act") == first
    assert sum(e.get("type") == "exhausted" for e in entries) == 1


# an action command that says it started (its mark written beside the folder, then renamed into it:
# the test never reads a mark half written), waits, then becomes the real command (same pid)
SLOW = """import json, os, sys, time
mark = sys.argv[1]
tmp = os.path.join(os.path.dirname(mark), f"mark-{os.getpid()}.tmp")
with open(tmp, "w") as f:
    json.dump({"pid": os.getpid(), "parent": os.getppid(), "argv": sys.argv[2:]}, f)
os.replace(tmp, os.path.join(mark, str(os.getpid())))
time.sleep(2.0)
os.execvp(sys.argv[2], sys.argv[2:])
"""


@pytest.mark.parametrize("with_command", [True, False], ids=["cgroup-kill", "analyzer-only"])
def test_a_sigkill_between_the_ledger_and_the_drain_still_drains_exactly_two(cluster, tmp_path, with_command):
    """``with_command``: the drain command dies with the analyzer (systemd kills the unit's
    control group); else it lives on and drains while the analyzer restarts."""
    slurm = cluster
    data = tmp_path / "fleet.lp"
    names = [slurm.node, "gpu001", "gpu002", "gpu003", "gpu004", "gpu005"]
    data.write_bytes(fleet_lp(names, {1, 2, 3, 4, 5}))
    ledger = tmp_path / "shared" / "budget.jsonl"
    marks = tmp_path / "started"
    marks.mkdir()
    (tmp_path / "slow.py").write_text(SLOW)
    sink = example_sink(dry_run=False, budget_nodes=2, budget_percent=100, max_per_hour=100,
                        budget_ledger=str(ledger))
    for rule in sink["rule"]:
        rule["command"] = [sys.executable, str(tmp_path / "slow.py"), str(marks), *rule["command"]]

    def acted() -> list[str]:
        text = ledger.read_text() if ledger.exists() else ""
        lines = [json.loads(x) for x in text.splitlines() if x.strip()]
        return sorted(e["host"] for e in lines if e.get("type") == "act")

    with Receiver() as rx:
        hook = fast({"type": "webhook", "name": "oncall", "url": rx.url + "/hook"})
        cfg = tmp_path / "analyzer.toml"
        cfg.write_text(_toml({"sink": [sink, hook]}))
        procs = {i: _analyze(data, cfg, i, tmp_path, f"a{i}") for i in (0, 1)}
        try:
            assert slurm.wait_for(lambda: any(marks.iterdir()), timeout=120, every=0.02), \
                [(tmp_path / f"a{i}.err").read_text() for i in procs]
            started = json.loads(next(marks.iterdir()).read_text())
            victim = next(i for i, p in procs.items() if p.pid == started["parent"])
            # the ledger holds the node, Slurm does not (yet)
            os.killpg(procs[victim].pid, signal.SIGKILL)
            if with_command:
                os.killpg(started["pid"], signal.SIGKILL)
            procs[victim].wait(10)
            host = started["argv"][2].removeprefix("NodeName=")
            assert host in acted() and host not in drained(slurm)
            other = procs[1 - victim]
            assert other.wait(120) == 0, (tmp_path / f"a{1 - victim}.err").read_text()
            # the killed shard again, on its own state: what it had not delivered goes out now
            again = _analyze(data, cfg, victim, tmp_path, f"a{victim}")
            assert again.wait(120) == 0, (tmp_path / f"a{victim}.err").read_text()
            assert slurm.wait_for(lambda: not Path(f"/proc/{started['pid']}").exists(), timeout=30)
        finally:
            for p in procs.values():
                if p.poll() is None:
                    os.killpg(p.pid, signal.SIGKILL)
        time.sleep(1.5)  # a second budget page would have arrived by now
        budget = [r for r in rx.requests if (r["json"] or {}).get("kind") == "remediation_budget"]
        assert len(budget) == 1 and "budget exhausted" in budget[0]["json"]["title"]
        refused = [r["json"] for r in rx.requests if (r["json"] or {}).get("kind") == "remediation_refused"]
        assert not [p for p in refused if f"NodeName={host}" in json.dumps(p)]  # its own drain: no refusal
    assert len(drained(slurm)) == 2 and host in drained(slurm)
    assert acted() == drained(slurm)
    entries = [json.loads(x) for x in ledger.read_text().splitlines() if x.strip()]
    assert sum(e.get("type") == "exhausted" for e in entries) == 1
    log = read_actions([tmp_path / f"a{victim}.db"])
    mine = [r["status"] for r in log if r["argv"] and r["argv"][-3] == f"NodeName={host}"]
    # run again after the restart (the ledger already holds the node: it spends nothing), or, when
    # the orphaned command drained it first, known as this sink's own command (not a refusal page)
    assert mine == ["ok"] if with_command else mine in (["ok"], ["ran-before"])


def _toml(doc: dict) -> str:
    """The few TOML shapes this test writes: arrays of tables with strings, numbers, lists, bools."""
    out = []
    for name, tables in doc.items():
        for t in tables:
            out.append(f"[[{name}]]")
            subs = {k: v for k, v in t.items() if isinstance(v, list) and v and isinstance(v[0], dict)}
            for k, v in t.items():
                if k not in subs:
                    out.append(f"{k} = {json.dumps(v)}")
            for k, v in subs.items():
                for sub in v:
                    out.append(f"[[{name}.{k}]]")
                    out += [f"{kk} = {json.dumps(vv)}" for kk, vv in sub.items()]
    return "\n".join(out) + "\n"
