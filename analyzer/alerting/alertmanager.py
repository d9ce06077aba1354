"""Prometheus Alertmanager, API v2: ``POST /api/v2/alerts`` with a JSON array of alerts.

Labels: ``alertname`` (the incident kind), ``severity``, ``host``, ``gpu``, ``link``,
``cluster``, ``rack`` (absent ones left out) and ``incident`` (the group key, so two incidents
never merge into one alert). Annotations, in reading order: ``summary`` (what is wrong, in plain
words), ``impact``, ``action`` (the recommended action), ``runbook_url``, ``jobs``,
``incident_url`` (the incident page, when a page base URL is configured) and ``description``
(the detector's technical line). A firing alert is
posted without ``endsAt``; Alertmanager then expires it ``resolve_timeout`` (default 5 m) after
the last post, so active alerts are re-posted every ``repost_interval`` (default 60 s, keep it
well under the resolve timeout). Resolving posts the alert again with ``endsAt``.
"""

from __future__ import annotations

import time

from gpufleet.analyzer.alerting.base import Alert, Outcome, Sink, register

from gpufleet.options import Option
from gpufleet.records import to_rfc3339


@register
class AlertmanagerSink(Sink):
    type = "alertmanager"
    options = (Option("repost_interval", "duration", 60.0, "active alerts are re-posted this often; keep "
                      "it well under Alertmanager's resolve_timeout; 0 = never"),)
    delivery_defaults = {"rate_limit": 600.0}
    url_is_address = True  # an Alertmanager URL is an address, not a credential

    def __init__(self, name, url, delivery=None, repost_interval: float = 60.0, **options):
        super().__init__(name, url, delivery, **options)
        self.repost_interval = float(repost_interval) if repost_interval else None

    def target_url(self) -> str:
        base = self.url.rstrip("/")
        return base if base.endswith("/api/v2/alerts") else base + "/api/v2/alerts"

    def alert_doc(self, alert: Alert, now: float | None = None) -> dict:
        now = time.time() if now is None else now
        labels = {"alertname": alert.kind, "severity": alert.severity, "incident": alert.key}
        for k in ("host", "gpu", "link", "cluster", "rack"):
            v = getattr(alert, k)
            if v is not None and v != "":
                labels[k] = str(v)
        ann = {"summary": alert.title or alert.summary}
        for k in ("impact", "action", "runbook_url"):
            if getattr(alert, k):
                ann[k] = getattr(alert, k)
        if alert.jobs:
            ann["jobs"] = ", ".join(alert.jobs)
        if alert.page_url:
            ann["incident_url"] = alert.page_url
        if alert.description:
            ann["description"] = alert.description
        # Alertmanager rejects endsAt before startsAt; a start in the future (replayed data) is
        # clamped to now so the alert is active at once.
        start = min(alert.start, now)
        doc = {"labels": labels, "annotations": ann, "startsAt": to_rfc3339(start)}
        if alert.page_url:
            doc["generatorURL"] = alert.page_url
        if alert.status == "resolved":
            end = alert.end if alert.end is not None else now
            doc["endsAt"] = to_rfc3339(max(start, min(end, now)))
        return doc

    def render(self, alert: Alert) -> list:
        return [self.alert_doc(alert)]

    def repost(self, alerts: list[Alert]) -> Outcome:
        if not alerts:
            return Outcome("sent")
        return self.post([self.alert_doc(a) for a in alerts])
