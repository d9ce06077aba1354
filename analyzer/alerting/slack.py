"""Slack incoming webhook: ``text`` (the notification fallback) and ``blocks``.

The webhook URL is the credential (its path holds the token): give it from a file or the
environment in production. ``&``, ``<`` and ``>`` in our text are escaped as Slack asks.
"""

from __future__ import annotations

from analyzer.alerting.base import Alert, Sink, register
from gpufleet.records import to_rfc3339


def escape(s: str) -> str:
    return s.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


def clip(s: str, n: int) -> str:
    return s if len(s) <= n else s[: n - 1] + "…"


@register
class SlackSink(Sink):
    type = "slack"

    def render(self, alert: Alert) -> dict:
        icon = ":red_circle:" if alert.status == "firing" else ":large_green_circle:"
        state = "FIRING" if alert.status == "firing" else "RESOLVED"
        head = f"[{state}] {alert.severity} {alert.kind}: {alert.summary}"
        text = escape(head)
        where = []
        for k in ("cluster", "rack", "host"):
            v = getattr(alert, k)
            if v:
                where.append(f"*{k}*: {escape(str(v))}")
        if alert.gpus:
            where.append("*gpu*: " + ", ".join(str(g) for g in alert.gpus))
        if alert.links:
            where.append("*link*: " + ", ".join(map(str, alert.links)))
        when = f"*since*: {to_rfc3339(alert.start)}"
        if alert.status == "resolved" and alert.end is not None:
            when += f"  *ended*: {to_rfc3339(alert.end)}"
        blocks = [
            {"type": "header", "text": {"type": "plain_text", "text": clip(f"{state}: {alert.kind}", 150)}},
            {"type": "section", "text": {"type": "mrkdwn", "text": clip(f"{icon} {text}", 3000)}},
        ]
        fields = [{"type": "mrkdwn", "text": clip(w, 2000)} for w in where + [when]][:10]
        blocks.append({"type": "section", "fields": fields})
        if alert.description:
            blocks.append({"type": "section",
                           "text": {"type": "mrkdwn", "text": clip(escape(alert.description), 3000)}})
        if alert.page_url:
            url = alert.page_url.replace(">", "%3E").replace("|", "%7C")
            blocks.append({"type": "context",
                           "elements": [{"type": "mrkdwn", "text": f"<{url}|Incident page>"}]})
        return {"text": clip(text, 4000), "blocks": blocks}
