"""Against a real Alertmanager 0.25 routing to a local webhook receiver."""

from __future__ import annotations

import dataclasses
import time

from gpufleet.analyzer.alerting import Notifier, load_sinks

from tests.alerting_receiver import Receiver, fast, incident
from tests.servers import Alertmanager, skip_unless

pytestmark = skip_unless("prometheus-alertmanager")


def notifications(rx, status=None):
    out = []
    for r in rx.requests:
        for a in r["json"]["alerts"]:
            if status is None or a["status"] == status:
                out.append(a)
    return out


def test_firing_labels_annotations_resolve_and_no_duplicates_across_restart(tmp_path):
    now = time.time()
    inc = incident(kind="nvlink_degradation", host="node07", gpu=5, link=11, start=now - 30, id="nv-1",
                   summary="NVLink 11 replays at 40/s", detail="Replay rate 40/s against a floor of 1/s.",
                   severity="warning")
    state = tmp_path / "alerts.db"
    with Receiver() as rx, Alertmanager(tmp_path / "am", rx.url + "/am", resolve_timeout="3s") as am:
        def sinks():
            return load_sinks([fast({"type": "alertmanager", "url": am.url, "repost_interval": 1})], [])

        n = Notifier(sinks(), state, page_base_url="https://gpufleet.example/incidents")
        n.update([inc], now=now)
        got = rx.wait_for(1, timeout=10)
        assert got, "Alertmanager did not notify"
        a = notifications(rx)[0]
        assert a["status"] == "firing"
        assert a["labels"] == {"alertname": "nvlink_degradation", "severity": "warning", "host": "node07",
                               "gpu": "5", "link": "11", "cluster": "c1", "rack": "r07", "incident": "nv-1"}
        ann = a["annotations"]
        assert {"summary", "impact", "action", "runbook_url"} <= set(ann)  # Alertmanager sorts keys
        assert ann["summary"].endswith("link 11: NVLink errors are growing")
        assert ann["action"].startswith("Drain the node, reset its GPUs")
        assert ann["runbook_url"].endswith("/nvlink_degradation.md")
        assert ann["description"] == "NVLink 11 replays at 40/s. Replay rate 40/s against a floor of 1/s."
        assert ann["incident_url"].startswith("https://gpufleet.example/incidents/incident-nv-1-")
        assert a["generatorURL"] == ann["incident_url"]
        # the analyzer restarts; re-posting keeps the alert alive past the 3 s resolve timeout
        n.close()
        n = Notifier(sinks(), state, page_base_url="https://gpufleet.example/incidents")
        n.update([inc], now=now + 1)
        time.sleep(4.5)
        assert len(notifications(rx, "firing")) == 1 and not notifications(rx, "resolved")
        assert n.outbox("alertmanager") == [{"seq": 1, "grp": "nv-1", "action": "firing", "state": "sent",
                                             "attempts": 1, "last_error": None}]
        n.update([dataclasses.replace(inc, end=time.time() - 1)], now=time.time())
        resolved = rx.wait_for(1, timeout=10, pred=lambda r: r["json"]["status"] == "resolved")
        n.close()
        assert resolved and notifications(rx, "resolved")[0]["labels"]["incident"] == "nv-1"
        assert len(notifications(rx, "firing")) == 1
