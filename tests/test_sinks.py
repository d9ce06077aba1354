"""PagerDuty, Slack and webhook payloads against local servers that enforce the published rules.

PagerDuty Events API v2 (developer.pagerduty.com, "Send an Alert Event"): routing_key (32
chars), event_action trigger|acknowledge|resolve, dedup_key <= 255 chars (required to resolve),
payload.summary (required, <= 1024), payload.source (required), payload.severity
critical|error|warning|info, optional timestamp (ISO 8601), component, group, class,
custom_details (object); links [{href, text}]. Accepted events answer 202.
Slack incoming webhooks / Block Kit (api.slack.com/reference/block-kit): text fallback, at most
50 blocks, header plain_text <= 150, section text <= 3000, <= 10 fields of <= 2000, context <= 10
elements; &, <, > escaped except in <url|text> links. Bad payloads answer 400 invalid_blocks.
"""

from __future__ import annotations

import dataclasses
import json
import re
import subprocess
import time
from datetime import datetime

from gpufleet.analyzer.alerting import Notifier, load_sinks

from tests.alerting_receiver import T0, Receiver, fast, incident

ROUTING_KEY = "R0123456789abcdef0123456789ABCDE"
NASTY = 'GPU 3 <script>alert("x")</script> & more > less'


def pagerduty_errors(doc) -> list[str]:
    e = []
    if not isinstance(doc, dict):
        return ["body is not a JSON object"]
    if not isinstance(doc.get("routing_key"), str) or len(doc["routing_key"]) != 32:
        e.append("routing_key must be a 32-character string")
    action = doc.get("event_action")
    if action not in ("trigger", "acknowledge", "resolve"):
        e.append("event_action invalid")
    dk = doc.get("dedup_key")
    if dk is not None and (not isinstance(dk, str) or not 0 < len(dk) <= 255):
        e.append("dedup_key must be a string of at most 255 characters")
    if action in ("acknowledge", "resolve") and dk is None:
        e.append("dedup_key required")
    if action == "trigger":
        p = doc.get("payload")
        if not isinstance(p, dict):
            return e + ["payload required"]
        if not isinstance(p.get("summary"), str) or not 0 < len(p["summary"]) <= 1024:
            e.append("payload.summary required, at most 1024 characters")
        if not isinstance(p.get("source"), str) or not p["source"]:
            e.append("payload.source required")
        if p.get("severity") not in ("critical", "error", "warning", "info"):
            e.append("payload.severity invalid")
        if "timestamp" in p:
            try:
                datetime.fromisoformat(p["timestamp"].replace("Z", "+00:00"))
            except (AttributeError, ValueError):
                e.append("payload.timestamp not ISO 8601")
        for k in ("component", "group", "class"):
            if k in p and not isinstance(p[k], str):
                e.append(f"payload.{k} must be a string")
        if "custom_details" in p and not isinstance(p["custom_details"], dict):
            e.append("payload.custom_details must be an object")
        unknown = set(p) - {"summary", "source", "severity", "timestamp", "component", "group", "class",
                            "custom_details"}
        if unknown:
            e.append(f"payload has unknown keys {unknown}")
    for link in doc.get("links", []):
        if not isinstance(link, dict) or not isinstance(link.get("href"), str):
            e.append("links[].href required")
    unknown = set(doc) - {"routing_key", "event_action", "dedup_key", "payload", "images", "links",
                          "client", "client_url"}
    if unknown:
        e.append(f"unknown keys {unknown}")
    return e


def pagerduty(req):
    errors = pagerduty_errors(req["json"])
    if errors:
        return 400, {}, json.dumps({"status": "invalid event", "message": "Event object is invalid",
                                    "errors": errors}).encode()
    return 202, {}, json.dumps({"status": "success", "message": "Event processed",
                                "dedup_key": req["json"].get("dedup_key")}).encode()


_LINK = re.compile(r"<(?:https?://[^|<>\s]+)(?:\|[^<>]*)?>")


def mrkdwn_errors(text: str, limit: int, where: str) -> list[str]:
    e = []
    if len(text) > limit:
        e.append(f"{where}: longer than {limit}")
    bare = _LINK.sub("", text)
    if "<" in bare or ">" in bare:
        e.append(f"{where}: unescaped < or >")
    if re.search(r"&(?!amp;|lt;|gt;)", bare):
        e.append(f"{where}: unescaped &")
    return e


def slack_errors(doc) -> list[str]:
    if not isinstance(doc, dict) or not isinstance(doc.get("text"), str) or not doc["text"]:
        return ["text (the notification fallback) required"]
    e = mrkdwn_errors(doc["text"], 40000, "text")
    blocks = doc.get("blocks", [])
    if not isinstance(blocks, list) or len(blocks) > 50:
        return e + ["blocks: at most 50"]
    for i, b in enumerate(blocks):
        t = b.get("type")
        if t == "header":
            txt = b.get("text", {})
            if txt.get("type") != "plain_text" or not 0 < len(txt.get("text", "")) <= 150:
                e.append(f"blocks[{i}] header: plain_text of 1..150")
        elif t == "section":
            if "text" not in b and "fields" not in b:
                e.append(f"blocks[{i}] section: text or fields required")
            if "text" in b:
                e += mrkdwn_errors(b["text"].get("text", ""), 3000, f"blocks[{i}].text")
            fields = b.get("fields", [])
            if len(fields) > 10:
                e.append(f"blocks[{i}]: more than 10 fields")
            for j, f in enumerate(fields):
                if f.get("type") not in ("mrkdwn", "plain_text"):
                    e.append(f"blocks[{i}].fields[{j}]: bad type")
                e += mrkdwn_errors(f.get("text", ""), 2000, f"blocks[{i}].fields[{j}]")
        elif t == "context":
            els = b.get("elements", [])
            if not 0 < len(els) <= 10:
                e.append(f"blocks[{i}] context: 1..10 elements")
            for j, el in enumerate(els):
                e += mrkdwn_errors(el.get("text", ""), 3000, f"blocks[{i}].elements[{j}]")
        else:
            e.append(f"blocks[{i}]: unexpected type {t!r}")
    return e


def slack(req):
    return (400, {}, b"invalid_blocks") if slack_errors(req["json"]) else (200, {}, b"ok")


def test_pagerduty_trigger_and_resolve_follow_the_events_v2_rules(tmp_path, monkeypatch):
    monkeypatch.setenv("GPUFLEET_PAGERDUTY_ROUTING_KEY", ROUTING_KEY)
    inc = incident(id="x" * 300, host="node01", summary=NASTY * 40, severity="warning",
                   evidence={"temperature_gpu_celsius": 91.5, "peak": {"throttle_share": 0.42}},
                   jobs=["4242"])
    with Receiver(pagerduty) as rx:
        sinks = load_sinks([], [f"pagerduty={rx.url}/v2/enqueue"])
        with Notifier(sinks, tmp_path / "s.db", page_base_url="https://pages.example/inc") as n:
            n.update([inc], now=T0)
            n.update([dataclasses.replace(inc, end=T0 + 60)], now=T0 + 60)
            assert n.flush(5)
    assert [r["status"] for r in rx.requests] == [202, 202], [r.get("body") for r in rx.requests]
    trig, res = (r["json"] for r in rx.requests)
    assert trig["event_action"] == "trigger" and res["event_action"] == "resolve"
    assert trig["dedup_key"] == res["dedup_key"] and len(trig["dedup_key"]) <= 255
    p = trig["payload"]
    assert p["summary"] == "node01 GPU 3 is thermal throttling: its clocks are held down by heat"
    assert p["severity"] == "warning" and p["source"] == "node01"
    assert p["component"] == "gpu3" and p["group"] == "c1/r07" and p["class"] == "thermal_throttle"
    details = p["custom_details"]
    assert list(details)[:5] == ["impact", "action", "runbook", "jobs", "since"]
    assert details["impact"].startswith("Clocks held down 42% of the time") and details["jobs"] == ["4242"]
    assert details["evidence"]["temperature_gpu_celsius"] == 91.5
    assert details["description"].startswith(NASTY)  # the detector's line, kept whole, after the lead
    assert trig["links"][0]["href"].endswith("/thermal_throttle.md")
    assert trig["links"][1]["href"].startswith("https://pages.example/inc/incident-")
    # a title over PagerDuty's 1024 characters is cut, never rejected
    from gpufleet.analyzer.alerting.base import Alert
    from gpufleet.analyzer.alerting.pagerduty import PagerDutySink

    long = PagerDutySink("pd", "", routing_key=ROUTING_KEY).render(
        Alert(key="k", status="firing", kind="sdc", severity="critical", start=T0, title=NASTY * 40))
    assert len(long["payload"]["summary"]) == 1024 and not pagerduty_errors(long)


def test_pagerduty_validator_rejects_what_the_api_rejects():
    assert pagerduty_errors({"routing_key": "short", "event_action": "fire"})
    assert pagerduty_errors({"routing_key": ROUTING_KEY, "event_action": "resolve"})  # no dedup_key
    bad = {"routing_key": ROUTING_KEY, "event_action": "trigger",
           "payload": {"summary": "x" * 1025, "source": "h", "severity": "major"}}
    assert len(pagerduty_errors(bad)) == 2


def test_slack_blocks_are_valid_and_escaped(tmp_path):
    inc = incident(host="n<1>&2", summary=NASTY, detail="temp > slowdown & rising <fast>", id="s1")
    with Receiver(slack) as rx:
        sinks = load_sinks([fast({"type": "slack", "url": rx.url + "/services/T1/B2/abc"})], [])
        with Notifier(sinks, tmp_path / "s.db", page_base_url="https://pages.example") as n:
            n.update([inc], now=T0)
            n.update([dataclasses.replace(inc, end=T0 + 5)], now=T0 + 5)
            assert n.flush(5)
    assert [r["status"] for r in rx.requests] == [200, 200], [slack_errors(r["json"]) for r in rx.requests]
    fired = rx.requests[0]["json"]
    assert "n&lt;1&gt;&amp;2 GPU 3 is thermal throttling" in fired["text"]
    assert "&lt;script&gt;" in json.dumps(fired["blocks"]) and "<script>" not in json.dumps(fired)
    head, todo = fired["blocks"][0]["text"]["text"], fired["blocks"][2]["text"]["text"]
    assert head == "FIRING: n<1>&2 GPU 3 is thermal throttling: its clocks are held down by heat"
    assert "*Do:* Compare its inlet" in todo
    from gpufleet.analyzer.alerting.actions import runbook_url

    assert f"Runbook: {runbook_url('thermal_throttle')}" in todo  # a file:// URL: text, not a link
    assert rx.requests[1]["json"]["text"].startswith("[RESOLVED]")
    assert "<https://pages.example/incident-s1-" in json.dumps(fired["blocks"])
    long_header = {"type": "header", "text": {"type": "plain_text", "text": "h" * 151}}
    assert slack_errors({"text": "a < b"}) and slack_errors({"text": "x", "blocks": [long_header]})


def openssl_hmac(secret: str, data: bytes) -> str:
    out = subprocess.run(["openssl", "dgst", "-sha256", "-hmac", secret, "-r"], input=data,
                         capture_output=True, check=True).stdout.decode()
    return out.split()[0]


def test_webhook_payload_and_signature_verified_independently(tmp_path, monkeypatch):
    secret = "s3cr3t-for-hmac"
    monkeypatch.setenv("HOOK_SECRET", secret)
    with Receiver() as rx:
        sinks = load_sinks([fast({"type": "webhook", "url": rx.url + "/hook", "secret_env": "HOOK_SECRET"}),
                            fast({"type": "webhook", "url": rx.url + "/plain", "name": "unsigned"})], [])
        inc = incident(kind="nvlink_degradation", link=2, id="n1", evidence={"replay_rate": 3.5})
        with Notifier(sinks, tmp_path / "s.db") as n:
            n.update([inc], now=T0)
            n.update([dataclasses.replace(inc, end=T0 + 30)], now=T0 + 40)
            assert n.flush(5)
    signed = [r for r in rx.requests if r["path"] == "/hook"]
    assert [r["json"]["status"] for r in signed] == ["firing", "resolved"]
    for r in signed:
        ts = r["headers"]["x-gpufleet-timestamp"]
        assert abs(int(ts) - r["wall"]) < 60  # replay protection: receivers reject old timestamps
        expected = openssl_hmac(secret, ts.encode() + b"." + r["body"])
        assert r["headers"]["x-gpufleet-signature"] == "v1=" + expected
        doc = r["json"]
        assert doc["version"] == "1" and doc["key"] == "n1" and doc["link"] == 2
        assert doc["kind"] == "nvlink_degradation" and doc["evidence"] == {"replay_rate": 3.5}
    assert signed[1]["json"]["ends_at"] and signed[0]["json"]["ends_at"] is None
    # a tampered body no longer verifies
    r = signed[0]
    assert openssl_hmac(secret, r["headers"]["x-gpufleet-timestamp"].encode() + b"." + r["body"] + b" ") \
        != r["headers"]["x-gpufleet-signature"][3:]
    plain = [r for r in rx.requests if r["path"] == "/plain"]
    assert len(plain) == 2 and all("x-gpufleet-signature" not in r["headers"] for r in plain)
    assert all("x-gpufleet-timestamp" in r["headers"] for r in plain)


def test_console_prints_one_line_per_notification(tmp_path, capsys):
    sinks = load_sinks([], ["console"])
    inc = incident(kind="sdc", id="c1", summary="canary mismatch on GPU 3")
    with Notifier(sinks, tmp_path / "s.db") as n:
        n.update([inc], now=T0)
        n.update([dataclasses.replace(inc, end=T0 + 60)], now=T0 + 60)
        assert n.flush(5)
        time.sleep(0.05)
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 2
    assert err[0].startswith("gpufleet: alert: FIRING   [critical] node01 GPU 3 returned WRONG RESULTS")
    assert " | do: Drain the node now" in err[0] and "| runbook: " in err[0]
    assert "sdc host=node01 gpu=3" in err[0]
    assert err[1].startswith("gpufleet: alert: RESOLVED") and "WRONG RESULTS" in err[1]
