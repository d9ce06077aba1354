"""Slack incoming webhook: ``text`` (the notification fallback) and ``blocks``.

The webhook URL is the credential (its path holds the token): give it from a file or the
environment in production. ``&``, ``<`` and ``>`` in our text are escaped as Slack asks.
"""

from __future__ import annotations

from gpufleet.analyzer.alerting.base import Alert, Sink, register

from gpufleet.records import to_rfc3339


def escape(s: str) -> str:
    return s.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


def clip(s: str, n: int) -> str:
    return s if len(s) <= n else s[: n - 1] + "…"


def link(url: str, text: str) -> str:
    """A Slack link for http(s) URLs; other schemes (a file:// runbook) as escaped text."""
    if not url.startswith(("http://", "https://")):
        return f"{text}: {escape(url)}"
    return f"<{url.replace('>', '%3E').replace('|', '%7C')}|{text}>"


@register
class SlackSink(Sink):
    type = "slack"

    def render(self, alert: Alert) -> dict:
        """Header: what is wrong; then impact, the recommended action and the runbook; then
        where/job/since; the technical line and the page link last."""
        firing = alert.status == "firing"
        icon = ":red_circle:" if firing else ":large_green_circle:"
        state = "FIRING" if firing else "RESOLVED"
        title = alert.title or alert.summary or alert.kind
        text = escape(f"[{state}] {alert.severity}: {title}")
        if firing and alert.action:
            text += escape(f" Do: {alert.action}")
        lead = f"{icon} *{escape(title)}*"
        if firing and alert.impact:
            lead += f"\n{escape(alert.impact)}"
        blocks = [
            {"type": "header", "text": {"type": "plain_text", "text": clip(f"{state}: {title}", 150)}},
            {"type": "section", "text": {"type": "mrkdwn", "text": clip(lead, 3000)}},
        ]
        todo = f"*Do:* {escape(alert.action)}" if firing and alert.action else ""
        if alert.runbook_url:
            todo += ("\n" if todo else "") + link(alert.runbook_url, "Runbook")
        if todo:
            blocks.append({"type": "section", "text": {"type": "mrkdwn", "text": clip(todo, 3000)}})
        where = []
        for k in ("host", "cluster", "rack"):
            v = getattr(alert, k)
            if v:
                where.append(f"*{k}*: {escape(str(v))}")
        if alert.gpus:
            where.append("*gpu*: " + ", ".join(str(g) for g in alert.gpus))
        if alert.links:
            where.append("*link*: " + ", ".join(map(str, alert.links)))
        if alert.jobs:
            where.insert(1, "*job*: " + escape(", ".join(alert.jobs)))
        when = f"*since*: {to_rfc3339(alert.start)}"
        if alert.status == "resolved" and alert.end is not None:
            when += f"  *ended*: {to_rfc3339(alert.end)}"
        fields = [{"type": "mrkdwn", "text": clip(w, 2000)} for w in where + [when]][:10]
        blocks.append({"type": "section", "fields": fields})
        context = []
        if alert.page_url:
            context.append({"type": "mrkdwn", "text": link(alert.page_url, "Incident page")})
        if alert.description:
            context.append({"type": "mrkdwn", "text": clip(escape(alert.description), 2000)})
        if context:
            blocks.append({"type": "context", "elements": context})
        return {"text": clip(text, 4000), "blocks": blocks}
