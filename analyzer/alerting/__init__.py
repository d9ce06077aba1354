"""On-call alerting: sinks (Alertmanager, PagerDuty, Slack, signed webhook, console), the
notifier that delivers incidents to them exactly once each, and HTML incident pages.

Entry points for the analyzer and the demo::

    sinks = load_sinks(config.get("sink", []), cli_sink_options)   # ConfigError before sending
    notifier = Notifier(sinks, state_path, page_base_url=None)
    notifier.update(incidents, now)      # cheap; delivery runs in background workers
    notifier.close()                     # bounded flush
    write_pages(incidents, data, out_dir, page_base_url=None, actions=None) -> list[Path]

``write_pages`` imports matplotlib when called, not when this package is imported.
"""

from __future__ import annotations

from gpufleet.analyzer.alerting.base import REGISTRY, Alert, Delivery, Outcome, Sink
from gpufleet.analyzer.alerting.config import load_sinks, sink_classes
from gpufleet.analyzer.alerting.notifier import Notifier, incident_key

sink_classes()  # every sink module registered: REGISTRY lists every type once the package is imported

__all__ = ["REGISTRY", "Alert", "Delivery", "Notifier", "Outcome", "Sink", "incident_key", "load_sinks",
           "page_name", "write_pages"]


def write_pages(incidents, data_points_or_path, out_dir, page_base_url=None, runbook_base_url=None,
                progress=False, actions=None):
    """Write one HTML page per incident plus index.html into ``out_dir``; returns the paths.
    ``actions``: the action sink's log (``audit.read_actions(state_paths)``), shown on the pages."""
    from gpufleet.analyzer.alerting.pages import write_pages as _write

    return _write(incidents, data_points_or_path, out_dir, page_base_url=page_base_url,
                  runbook_base_url=runbook_base_url, progress=progress, actions=actions)


def page_name(key: str) -> str:
    from gpufleet.analyzer.alerting.pages import page_name as _name

    return _name(key)
