"""PagerDuty Events API v2 (``POST https://events.pagerduty.com/v2/enqueue``).

``trigger`` with ``routing_key``, ``dedup_key`` (the group key, hashed when over 255 chars),
``payload`` (``summary`` ≤ 1024 chars, ``source``, ``severity`` in critical/error/warning/info,
``timestamp``, ``component``, ``group``, ``class``, ``custom_details``) and ``links``; ``resolve``
with the same ``dedup_key``. The summary is the plain-words title; ``custom_details`` leads
with impact, recommended action, runbook, jobs and since, then the evidence; ``links`` put
the runbook first, then the incident page. The routing key is a secret: from a file or the environment.
"""

from __future__ import annotations

import hashlib

from gpufleet.analyzer.alerting.base import Alert, Sink, register

from gpufleet.options import Option
from gpufleet.records import to_rfc3339

DEFAULT_URL = "https://events.pagerduty.com/v2/enqueue"
SEVERITY = {"critical": "critical", "error": "error", "warning": "warning", "info": "info"}


def dedup_key(key: str) -> str:
    if len(key) <= 255:
        return key
    return key[:190] + ":" + hashlib.sha256(key.encode()).hexdigest()


def clip(s: str, n: int) -> str:
    return s if len(s) <= n else s[: n - 1] + "…"


@register
class PagerDutySink(Sink):
    type = "pagerduty"
    default_url = DEFAULT_URL
    options = (Option("routing_key", "secret", help="the Events API v2 integration key", required=True,
                      env="GPUFLEET_PAGERDUTY_ROUTING_KEY"),)

    def __init__(self, name, url, delivery=None, routing_key: str = "", **options):
        super().__init__(name, url or DEFAULT_URL, delivery, **options)
        self.routing_key = routing_key

    def secrets(self) -> list[str]:
        return [self.routing_key, *super().secrets()] if self.routing_key else super().secrets()

    def render(self, alert: Alert) -> dict:
        doc = {"routing_key": self.routing_key, "dedup_key": dedup_key(alert.key)}
        if alert.status == "resolved":
            doc["event_action"] = "resolve"
            return doc
        doc["event_action"] = "trigger"
        component = None
        if alert.gpu is not None:
            component = f"gpu{alert.gpu}" + (f"/link{alert.link}" if alert.link is not None else "")
        details = {"impact": alert.impact, "action": alert.action, "runbook": alert.runbook_url,
                   "jobs": alert.jobs, "since": to_rfc3339(alert.start)}
        details = {k: v for k, v in details.items() if v not in (None, [], "")}
        details.update(kind=alert.kind, incidents=alert.incidents, description=alert.description)
        for k in ("host", "gpus", "links", "cluster", "rack"):
            v = getattr(alert, k)
            if v not in (None, [], ""):
                details[k] = v
        if alert.evidence:
            details["evidence"] = alert.evidence
        payload = {
            "summary": clip(alert.title or alert.summary or alert.kind, 1024),
            "source": alert.host or alert.cluster or "gpufleet",
            "severity": SEVERITY.get(alert.severity, "warning"),
            "timestamp": to_rfc3339(alert.start),
            "class": alert.kind,
            "custom_details": details,
        }
        if component:
            payload["component"] = component
        group = "/".join(x for x in (alert.cluster, alert.rack) if x)
        if group:
            payload["group"] = group
        doc["payload"] = payload
        doc["client"] = "gpufleet"
        links = []
        if alert.runbook_url:
            links.append({"href": alert.runbook_url, "text": f"Runbook: {alert.kind}"})
        if alert.page_url:
            doc["client_url"] = alert.page_url
            links.append({"href": alert.page_url, "text": "Incident page"})
        if links:
            doc["links"] = links
        return doc
