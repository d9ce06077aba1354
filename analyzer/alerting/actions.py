"""What to tell a person about an incident: plain-words title, impact, recommended action, runbook.

The text is data (``actions.toml``, one entry per incident kind, plus the words for the XID
catalogue's resolution buckets); pages and every sink take it from :func:`guide`, so an alert
in Slack, a PagerDuty page, an Alertmanager annotation, the webhook payload, the console line
and the incident page all say the same thing.

Templates are filled from the incident's evidence (peak values, then first, then top-level) by
name only: no attribute or index lookups, so evidence text can never reach into objects.
"""

from __future__ import annotations

import os
import string
import tomllib
from dataclasses import dataclass
from functools import cache
from pathlib import Path

from gpufleet.errors import ConfigError
from gpufleet.records import ANALYSIS_KINDS, KINDS, Record

CATALOGUE = Path(__file__).resolve().parent / "actions.toml"
PAGE_KINDS = ("remediation_refused", "remediation_budget")  # the action sink's own pages, never acted on
# every kind an alert can carry: the detectors' incidents, the analysis's own records, the sinks' pages
ALERT_KINDS = (*KINDS, *ANALYSIS_KINDS, *PAGE_KINDS)
RUNBOOK_ENV = "GPUFLEET_RUNBOOK_BASE_URL"
_FMT = string.Formatter()


@cache
def catalogue() -> dict:
    """The parsed ``actions.toml``: ``{"kind": {kind: entry}, "xid_action": {...}, ...}``."""
    with CATALOGUE.open("rb") as f:
        doc = tomllib.load(f)
    missing = [k for k in ALERT_KINDS if k not in doc.get("kind", {})]
    if missing:
        raise ConfigError(f"{CATALOGUE}: no action entry for {', '.join(missing)}")
    return doc


@dataclass(frozen=True)
class Guidance:
    title: str
    impact: str
    action: str
    runbook_url: str | None


def where(r) -> str:
    """Host, GPU and link (or rack) in words: 'node01 GPU 3 link 2', 'node01 (several GPUs)'.

    ``r``: anything with ``host``, ``gpu``, ``link`` and ``rack`` (a Record, an Alert)."""
    if r.host is None:
        return f"rack {r.rack}" if r.rack else "the fleet"
    out = r.host
    if r.gpu is not None:
        out += f" GPU {r.gpu}"
    elif r.link is None:
        out += " (several GPUs)"
    if r.link is not None:
        out += f" link {r.link}"
    return out


def values(r: Record) -> dict:
    """Names a template may use: the evidence's scalars (peak over first over top level) and where."""
    ev = r.evidence or {}
    out: dict = {}
    for part in (ev, ev.get("first"), ev.get("peak")):
        if isinstance(part, dict):
            out.update({k: v for k, v in part.items()
                        if isinstance(v, (int, float, str)) and not isinstance(v, bool)})
    out.update(where=where(r), host=r.host, gpu=r.gpu, link=r.link, rack=r.rack, cluster=r.cluster)
    return out


def render(template: str, vals: dict) -> str | None:
    """``template`` filled from ``vals``; None when a name is missing, null or the wrong type."""
    out = []
    try:
        for text, name, spec, _conv in _FMT.parse(template):
            out.append(text)
            if name is None:
                continue
            if not name.isidentifier() or vals.get(name) is None:
                return None
            out.append(format(vals[name], spec or ""))
    except (ValueError, TypeError):
        return None
    return "".join(out)


# Where the runbooks are on this machine, first that holds them: the Debian package's docs, the
# checkout's docs/runbooks/ (a clone, an editable install), the copy a wheel carries
INSTALLED = Path("/usr/share/doc/gpufleet/runbooks")
_HERE = Path(__file__).resolve().parent
LOCAL_RUNBOOKS = (INSTALLED, _HERE.parents[1] / "docs" / "runbooks", _HERE / "runbooks")


def local_runbooks() -> Path | None:
    """The folder of runbooks on this machine (see ``LOCAL_RUNBOOKS``); None when none is there."""
    return next((d for d in LOCAL_RUNBOOKS if (d / "sdc.md").is_file()), None)


def configured_runbook_base(base: str | None = None) -> str | None:
    """The runbook base someone set: ``base``, env GPUFLEET_RUNBOOK_BASE_URL or the catalogue's."""
    chosen = base or os.environ.get(RUNBOOK_ENV) or catalogue().get("runbook_base_url")
    return chosen.rstrip("/") if chosen else None


def runbook_base(base: str | None = None) -> str | None:
    """Where runbook links point: ``base`` (``--runbook-base-url``), else env
    GPUFLEET_RUNBOOK_BASE_URL, else the catalogue's ``runbook_base_url`` when set, else the runbooks
    on this machine (:func:`local_runbooks`, as a file:// URL); None when there are none to link."""
    chosen = configured_runbook_base(base)
    if chosen:
        return chosen
    local = local_runbooks()
    return local.as_uri() if local is not None else None


def runbook_file(kind: str) -> str:
    """The runbook's file name of ``kind`` (``sdc.md``)."""
    return catalogue()["kind"].get(kind, {}).get("runbook", kind + ".md")


def runbook_url(kind: str, base: str | None = None) -> str | None:
    """The link to ``kind``'s runbook (see :func:`runbook_base`); None: no runbook to link."""
    root = runbook_base(base)
    return f"{root}/{runbook_file(kind)}" if root else None


def guide(r: Record, runbook_base_url: str | None = None, where_text: str | None = None) -> Guidance:
    """Title, impact, recommended action and runbook link of one incident (``where_text``: the
    place in words when it is wider than the incident's, e.g. a group's 'node01 GPUs 0-7')."""
    entry = catalogue()["kind"].get(r.kind)
    vals = values(r)
    if where_text:
        vals["where"] = where_text
    if entry is None:  # a kind newer than this catalogue: still a readable page
        return Guidance(f"{vals['where']}: {r.kind.replace('_', ' ')}", "", "See the runbook.",
                        runbook_url(r.kind, runbook_base_url))
    title = render(entry["title"], vals) or f"{vals['where']}: {r.kind.replace('_', ' ')}"
    impacts = entry.get("impact", [])
    impact = next((s for s in (render(t, vals) for t in impacts) if s), "")
    return Guidance(title, impact, entry["action"], runbook_url(r.kind, runbook_base_url))


def xid_action(bucket: str | None) -> str:
    """Plain words for an XID resolution bucket (RESET_GPU, RESTART_APP, WORKFLOW_XID_45, ...)."""
    if not bucket:
        return ""
    words = catalogue().get("xid_action", {})
    if bucket in words:
        return words[bucket]
    if bucket.startswith("WORKFLOW"):
        return words.get("WORKFLOW", "")
    return bucket


def xid_resolution(code) -> tuple[str, str]:
    """(name, what to do) of an XID code from the agent's XID catalogue; ('', '') when unknown."""
    from gpufleet.catalogue import xids

    try:
        info = xids().get(int(code))
    except (TypeError, ValueError, OSError):
        return "", ""
    if not info:
        return "", ""
    return info.get("name", ""), xid_action(info.get("action"))
