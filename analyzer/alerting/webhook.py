"""Generic JSON webhook: a versioned payload, signed with HMAC-SHA256 when a secret is set.

Payload (version ``"1"``, see docs/alerting.md): ``version``, ``status`` (firing/resolved),
``title`` (what is wrong, in plain words), ``impact``, ``action`` (the recommended action),
``runbook_url``, ``jobs``, ``key``, ``kind``, ``severity``, ``summary``, ``description``,
``starts_at``, ``ends_at``, ``host``, ``gpu``, ``link``, ``gpus``, ``links``, ``cluster``,
``rack``, ``incidents``, ``page_url``, ``evidence``.

Headers: ``X-Gpufleet-Event`` (``<key>:<status>``, the same on every retry: receivers dedup on
it), ``X-Gpufleet-Timestamp`` (Unix seconds at sending) and, with a secret,
``X-Gpufleet-Signature: v1=<hex HMAC-SHA256(secret, timestamp + "." + body)>``.
"""

from __future__ import annotations

import hashlib
import hmac
import time

from gpufleet.analyzer.alerting.base import Alert, Sink, register

from gpufleet.options import Option
from gpufleet.records import to_rfc3339

VERSION = "1"


def sign(secret: str, timestamp: str, body: bytes) -> str:
    mac = hmac.new(secret.encode(), timestamp.encode() + b"." + body, hashlib.sha256)
    return "v1=" + mac.hexdigest()


@register
class WebhookSink(Sink):
    type = "webhook"
    options = (Option("secret", "secret", help="HMAC-SHA256 key of the X-Gpufleet-Signature header; "
                      "without one: unsigned", env="GPUFLEET_WEBHOOK_SECRET"),)

    def __init__(self, name, url, delivery=None, secret: str | None = None, **options):
        super().__init__(name, url, delivery, **options)
        self.secret = secret or None
        self._event = ""

    def secrets(self) -> list[str]:
        return ([self.secret] if self.secret else []) + super().secrets()

    def render(self, alert: Alert) -> dict:
        return {
            "version": VERSION,
            "status": alert.status,
            "title": alert.title or alert.summary,
            "impact": alert.impact,
            "action": alert.action,
            "runbook_url": alert.runbook_url,
            "jobs": alert.jobs,
            "key": alert.key,
            "kind": alert.kind,
            "severity": alert.severity,
            "summary": alert.summary,
            "description": alert.description,
            "starts_at": to_rfc3339(alert.start),
            "ends_at": to_rfc3339(alert.end) if alert.status == "resolved" else None,
            "host": alert.host,
            "gpu": alert.gpu,
            "link": alert.link,
            "gpus": alert.gpus,
            "links": alert.links,
            "cluster": alert.cluster,
            "rack": alert.rack,
            "incidents": alert.incidents,
            "page_url": alert.page_url,
            "evidence": alert.evidence,
        }

    def deliver(self, alert: Alert):
        self._event = f"{alert.key}:{alert.status}"
        return self.post(self.render(alert))

    def headers(self, body: bytes) -> dict[str, str]:
        ts = str(int(time.time()))
        h = {"X-Gpufleet-Event": self._event, "X-Gpufleet-Timestamp": ts}
        if self.secret:
            h["X-Gpufleet-Signature"] = sign(self.secret, ts, body)
        return h
