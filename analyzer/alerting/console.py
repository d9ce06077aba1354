"""Console: one line per firing/resolved notification on standard error (the demo's sink).

``FIRING   [critical] <what is wrong> | impact: ... | do: <action> | runbook: URL | job 4242 |
<kind> host=... gpu=... since <time> (<page>)``; a resolve names what ended and when.
"""

from __future__ import annotations

import sys

from gpufleet.analyzer.alerting.base import Alert, Outcome, Sink, register

from gpufleet.logs import escape
from gpufleet.records import to_rfc3339


def line(alert: Alert) -> str:
    """The alert as one line; control characters in any of its fields (a host tag is written by
    the node) are escaped (:func:`gpufleet.logs.escape`), so no field can start a line of its own."""
    where = " ".join(f"{k}={v}" for k, v in (("host", alert.host),
                                              ("gpu", ",".join(map(str, alert.gpus)) or None),
                                              ("link", ",".join(map(str, alert.links)) or None))
                     if v is not None)
    when = to_rfc3339(alert.end if alert.status == "resolved" and alert.end else alert.start)
    out = f"{alert.status.upper():8} [{alert.severity}] {alert.title or alert.summary}"
    if alert.status == "firing" and alert.impact:
        out += f" | impact: {alert.impact}"
    if alert.status == "firing" and alert.action:
        out += f" | do: {alert.action}"
    if alert.runbook_url:
        out += f" | runbook: {alert.runbook_url}"
    if alert.jobs:
        out += f" | job {','.join(alert.jobs)}"
    out += f" | {alert.kind} {where} {'since' if alert.status == 'firing' else 'ended'} {when}"
    if alert.page_url:
        out += f" ({alert.page_url})"
    return escape(out)


@register
class ConsoleSink(Sink):
    type = "console"
    needs_url = False
    delivery_defaults = {"rate_limit": None}

    def __init__(self, name="console", url="", delivery=None, **options):
        super().__init__(name, url, delivery, **options)

    def secrets(self) -> list[str]:
        return []

    def __repr__(self) -> str:
        return f"<ConsoleSink {self.name} stderr>"

    def render(self, alert: Alert) -> str:
        return line(alert)

    def deliver(self, alert: Alert) -> Outcome:
        print("gpufleet: alert: " + line(alert), file=sys.stderr, flush=True)
        return Outcome("sent")
