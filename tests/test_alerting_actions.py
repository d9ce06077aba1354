"""The action catalogue: one entry and one runbook per incident kind, and every sink's payload
leading with what is wrong, the impact, the recommended action and the runbook."""

from __future__ import annotations

import json
import re
import tomllib
import urllib.parse
from pathlib import Path

import pytest
from gpufleet.analyzer.alerting import REGISTRY, Notifier
from gpufleet.analyzer.alerting.actions import (
    ALERT_KINDS,
    PAGE_KINDS,
    catalogue,
    guide,
    render,
    runbook_url,
    xid_action,
    xid_resolution,
)

from gpufleet.records import ANALYSIS_KINDS, KINDS
from tests.alerting_receiver import incident

ROOT = Path(__file__).resolve().parent.parent
RUNBOOKS = ROOT / "docs" / "runbooks"

# evidence as the detectors write it (peak values), one per kind
EVIDENCE = {
    "thermal_throttle": {"throttle_share": 0.62, "temperature_gpu_celsius": 91.0,
                         "temperature_slowdown_celsius": 89.0},
    "cooling_degradation": {"excess_celsius": 9.4, "threshold_celsius": 6.0, "power_watts": 612.0,
                            "temperature_gpu_celsius": 81.0},
    "power_brake": {"brake_share": 0.3, "power_watts": 402.0},
    "nvlink_degradation": {"crc_rate_per_s": 41.2, "crc_threshold_per_s": 1.0, "new_replays": 12,
                           "new_recoveries": 1},
    "pcie_degradation": {"gen": 3, "gen_max": 5, "width": 8, "width_max": 16, "replay_rate_per_s": 4.2,
                         "replay_allowance_per_s": 1.0},
    "memory_errors": {"sbe_rate_per_s": 2.5, "sbe_threshold_per_s": 0.1, "new_dbe": 1},
    "sdc": {"passed": 0, "mismatches": 17},
    "gpu_lost": {"xid": 79},
    "straggler": {"clock_vs_peers": 0.87, "power_vs_peers": 0.8},
    "canary_unchecked": {"unchecked_hours": 13.5, "max_age_hours": 6.0},
    "power_limit_below_peers": {"power_limit_watts": 500, "peers_power_limit_watts": 700,
                                "model": "NVIDIA H200"},
    "inlet_above_room": {"inlet_celsius": 30.2, "room_celsius": 24.1, "above_room_celsius": 6.1},
}


def test_every_kind_has_an_action_entry_and_a_runbook():
    cat = catalogue()
    assert set(cat["kind"]) == set(ALERT_KINDS) and set(KINDS) == set(EVIDENCE)
    for kind in ALERT_KINDS:
        e = cat["kind"][kind]
        assert {"title", "impact", "action", "runbook"} <= set(e), kind
        assert kind not in KINDS or "{where}" in e["title"]
        assert len(e["action"]) > 30
        # the last impact line needs no evidence: every incident gets one
        assert render(e["impact"][-1], {}) == e["impact"][-1]
        book = RUNBOOKS / e["runbook"]
        assert book.name == f"{kind}.md" and book.is_file(), f"no runbook for {kind}"
        text = book.read_text()
        assert text.startswith(f"# {kind}")
        for section in ("## Confirm", "## Do", "## Escalate"):
            assert section in text, f"{book.name}: missing {section}"
        assert f"[{kind}.md]({kind}.md)" in (RUNBOOKS / "README.md").read_text()
    assert sorted(p.stem for p in RUNBOOKS.glob("*.md") if p.stem != "README") == sorted(ALERT_KINDS)


def test_every_kind_an_alert_can_carry_links_an_existing_runbook(monkeypatch):
    # the kinds as their sources define them: the detectors' registry, the analysis's own records,
    # and every kind= the alerting code gives its own pages
    from gpufleet.analyzer.detectors import REGISTRY as DETECTORS

    own = set()
    for src in (ROOT / "analyzer" / "alerting").glob("*.py"):
        own |= set(re.findall(r"\bkind=\"([a-z_]+)\"", src.read_text()))
    assert own and own <= set(PAGE_KINDS), own
    kinds = [*DETECTORS, *ANALYSIS_KINDS, *own]
    assert set(kinds) <= set(ALERT_KINDS)
    monkeypatch.delenv("GPUFLEET_RUNBOOK_BASE_URL", raising=False)
    for kind in kinds:
        url = runbook_url(kind)
        assert url is not None and url.startswith("file://"), kind
        assert Path(urllib.parse.unquote(urllib.parse.urlparse(url).path)).is_file(), url
        assert kind in catalogue()["kind"], kind
    # the analysis's records read as what they are, from the evidence the pipeline writes
    why = "more than the late bound behind the analysis"
    gap = guide(incident(kind="analysis_gap", gpu=None, evidence={"rows": 480, "why": why}))
    assert gap.title.startswith("Analysis gap on node01") and gap.impact.startswith("480 rows of node01")
    assert gap.runbook_url.endswith("/analysis_gap.md")
    quiet = guide(incident(kind="node_stopped_reporting", gpu=None,
                           evidence={"signals": ["absence"], "quiet_after_seconds": 60.0}))
    assert quiet.title == "node01 stopped reporting: no telemetry from any of its GPUs"
    assert "for over 60 s" in quiet.impact and quiet.runbook_url.endswith("/node_stopped_reporting.md")


def test_impact_uses_the_evidence_and_falls_back_without_it():
    for kind, peak in EVIDENCE.items():
        r = incident(kind=kind, evidence={"peak": peak})
        g = guide(r)
        first = catalogue()["kind"][kind]["impact"][0]
        assert g.impact == render(first, {**peak, "where": "node01 GPU 3"}), kind
        assert g.title.startswith("node01 GPU 3") and g.runbook_url.endswith(f"/{kind}.md")
        bare = guide(incident(kind=kind))
        assert bare.impact == catalogue()["kind"][kind]["impact"][-1]
    g = guide(incident(kind="thermal_throttle", evidence={"peak": EVIDENCE["thermal_throttle"]}))
    assert g.impact.startswith("Clocks held down 62% of the time at 91 °C (slowdown at 89 °C)")
    assert guide(incident(kind="pcie_degradation", gpu=None)).title.startswith("node01 (several GPUs)")
    assert guide(incident(kind="cooling_degradation", host=None, gpu=None)).title.startswith("rack r07")


def test_templates_fill_names_only():
    assert render("{x.__class__}", {"x": 1}) is None
    assert render("{x[0]}", {"x": "ab"}) is None
    assert render("{x:.0%}", {"x": "text"}) is None  # wrong type: the next template is used
    assert render("{x:.1f} °C", {"x": 3}) == "3.0 °C"
    assert render("{missing}", {}) is None


def test_runbook_base_url_from_argument_or_environment(monkeypatch):
    from urllib.parse import unquote, urlsplit

    from gpufleet.analyzer.alerting import actions

    monkeypatch.delenv("GPUFLEET_RUNBOOK_BASE_URL", raising=False)
    # unset: the runbooks on this machine (here the checkout's docs/runbooks/), a file that exists
    url = runbook_url("sdc")
    assert url.startswith("file://") and Path(unquote(urlsplit(url).path)).is_file(), url
    # no runbooks on the machine and no base set: no link, rather than a link to a missing file
    monkeypatch.setattr(actions, "LOCAL_RUNBOOKS", (ROOT / "no-such-folder",))
    assert runbook_url("sdc") is None and guide(incident(kind="sdc")).runbook_url is None
    monkeypatch.setenv("GPUFLEET_RUNBOOK_BASE_URL", "https://wiki.example/gpu/")
    assert runbook_url("sdc") == "https://wiki.example/gpu/sdc.md"
    assert runbook_url("sdc", "https://git.example/rb") == "https://git.example/rb/sdc.md"


def test_every_xid_resolution_bucket_has_words():
    doc = tomllib.loads((ROOT / "gpufleet" / "xid_catalogue.toml").read_text())
    for code, info in doc["xid"].items():
        words = xid_action(info["action"])
        assert words and words != info["action"], f"xid {code}: no words for {info['action']}"
    name, todo = xid_resolution(79)
    assert name == "GPU has fallen off the bus" and todo == "Drain and reboot the node."
    assert xid_resolution(99999) == ("", "")


@pytest.fixture
def alert(tmp_path):
    inc = incident(kind="sdc", id="sdc-1", evidence={"peak": {"mismatches": 17}}, jobs=["4242"],
                   summary="node01 GPU 3: silent data corruption: canary result mismatch (mismatches=17)")
    with Notifier([], tmp_path / "s.db", page_base_url="https://pages.example",
                  runbook_base_url="https://wiki.example/runbooks") as n:
        return n.build_alert("sdc-1", [inc], "firing")


LEAD = ("node01 GPU 3 returned WRONG RESULTS", "The canary found 17 wrong elements",
        "Drain the node now", "https://wiki.example/runbooks/sdc.md")


def test_alert_carries_the_guidance_and_the_job(alert):
    assert alert.title.startswith(LEAD[0]) and alert.summary == alert.title
    assert alert.impact.startswith(LEAD[1]) and alert.action.startswith(LEAD[2])
    assert alert.runbook_url == LEAD[3] and alert.jobs == ["4242"]
    assert "mismatches=17" in alert.description  # the detector's line stays, after the lead


def _order(text: str) -> list[int]:
    return [text.find(s) for s in LEAD]


@pytest.mark.parametrize("typ", sorted(set(REGISTRY) - {"action"}))
def test_every_sink_payload_leads_with_what_impact_action_and_runbook(typ, alert):
    kw = {"routing_key": "r" * 32} if typ == "pagerduty" else {}
    sink = REGISTRY[typ](name=typ, url="https://sink.example/x", **kw)
    doc = sink.render(alert)
    if typ == "alertmanager":
        ann = doc[0]["annotations"]
        assert list(ann)[:4] == ["summary", "impact", "action", "runbook_url"]
        assert ann["jobs"] == "4242"
        text = json.dumps(list(ann.values())[:4], ensure_ascii=False)
    elif typ == "pagerduty":
        assert doc["payload"]["summary"].startswith(LEAD[0])
        details = doc["payload"]["custom_details"]
        assert list(details)[:4] == ["impact", "action", "runbook", "jobs"]
        assert doc["links"][0]["href"] == LEAD[3]
        text = doc["payload"]["summary"] + json.dumps(details, ensure_ascii=False)
    elif typ == "slack":
        assert doc["blocks"][0]["text"]["text"].startswith("FIRING: " + LEAD[0])
        text = json.dumps(doc["blocks"][:3], ensure_ascii=False)
        assert "*job*: 4242" in json.dumps(doc["blocks"])
    elif typ == "webhook":
        assert list(doc)[:7] == ["version", "status", "title", "impact", "action", "runbook_url", "jobs"]
        text = json.dumps(doc, ensure_ascii=False)
    else:
        assert typ == "console"
        text = doc
        assert doc.startswith("FIRING   [critical] " + LEAD[0]) and "job 4242" in doc
    pos = _order(text)
    assert all(p >= 0 for p in pos), (typ, pos, text[:600])
    assert pos == sorted(pos), f"{typ}: the lead is out of order: {pos}"
    # the detector's technical line, where a payload carries it, comes after the lead
    assert text.find("(mismatches=17)") == -1 or text.find("(mismatches=17)") > pos[-1]
