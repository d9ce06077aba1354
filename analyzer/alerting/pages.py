"""Incident pages: one self-contained HTML file per incident, plus ``index.html``.

A page leads with what an on-call person needs (from the action catalogue, ``actions.toml``):
what is wrong in plain words, where, which job, since when, the impact, the recommended
action and the runbook link. Then a PNG (matplotlib, Agg, embedded as a data URI) of the
affected GPU's key signals against its peers on the same node around the incident window (the
GPU in red, each peer in grey, the peers' median dashed, the incident shaded), the GPU's other
incidents, the GPU events (XIDs, with the XID catalogue's resolution in words) in the window,
and last, folded away, the detector's line, the incident's fields, evidence and thresholds.
Given the notifier's action log (``actions``: rows of
:func:`gpufleet.analyzer.alerting.audit.read_actions`), the lead says what the action sink last
did for the incident (run, refused and why, the command to run by hand) and a table lists every
decision. No external resources: the page opens without network access.
"""

from __future__ import annotations

import base64
import hashlib
import io
import json
import re
import warnings
from pathlib import Path

from gpufleet.errors import GpufleetError
from gpufleet.records import Record, to_rfc3339


def kind_panels(kind: str) -> tuple[tuple[str, str, str, str], ...]:
    """The signals an incident page of ``kind`` plots, as its detector declares them (``panels``:
    (measurement, field, label, "value" | "rate" | "share")); the GPU's basic signals otherwise."""
    from gpufleet.analyzer.detectors import REGISTRY, Detector

    return REGISTRY.get(kind, Detector).panels


PRE, POST = 900.0, 900.0


def page_name(key: str) -> str:
    """File name of an incident's page: readable and unique for any incident key."""
    slug = re.sub(r"[^A-Za-z0-9._-]+", "_", key).strip("_")[:80] or "incident"
    return f"incident-{slug}-{hashlib.sha1(key.encode()).hexdigest()[:8]}.html"


def window(r: Record, last: float | None) -> tuple[float, float]:
    end = r.end if r.end is not None else (last if last and last > r.start else r.start + 600)
    pad = max(PRE, 0.25 * (end - r.start))
    return r.start - pad, end + max(POST, 0.1 * (end - r.start))


def _series(points: list[tuple[float, object]], mode: str, lo: float, hi: float):
    """One entity's points of one field as a line to plot, ``(t, v)`` in ``[lo, hi]`` (None: none):
    the value, or its rate per second (``share``: of each second, a counter of ns). A gap in the
    rows (longer than a few of the entity's own polls: :meth:`frame.Table.gap`, the rule the
    detectors' windows use) breaks the line (a NaN point in it), and no rate is computed across one
    or across a counter reset: what happened in a gap is not drawn as if it were measured."""
    import numpy as np
    from gpufleet.analyzer.frame import Table

    pts = [(t, v) for t, v in points if isinstance(v, (int, float)) and not isinstance(v, bool)]
    if not pts:
        return None
    t_ns = np.array([round(p[0] * 1e9) for p in pts], dtype=np.int64)
    tab = Table.build(np.zeros(len(pts), np.int64), t_ns, {"v": np.array([p[1] for p in pts], dtype=float)})
    t, v, gap = tab.t, tab.cols["v"], tab.over_gap()
    if mode in ("rate", "share"):
        if len(t) < 2:
            return None
        # NaN at first rows, resets and gaps; a gap's row stays, as the line's break
        rate = tab.delta("v") / tab.dt()
        ok = np.isfinite(rate) | gap
        t, v, gap = t[ok], rate[ok], gap[ok]
        if mode == "share":
            v = v / 1e9
    elif gap.any():  # a NaN point between the rows either side of each gap
        at = np.flatnonzero(gap)
        t = np.insert(t, at, (t[at - 1] + t[at]) / 2)
        v = np.insert(v, at, np.nan)
    sel = (t >= lo) & (t <= hi)
    if not np.isfinite(v[sel]).any():
        return None
    return t[sel], v[sel]


def plot(r: Record, data, lo: float, hi: float) -> bytes | None:
    """One PNG with a panel per signal; None when the data holds none of them."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.dates as mdates
    import matplotlib.pyplot as plt
    import numpy as np

    panels = []
    for meas, field, label, mode in kind_panels(r.kind):
        target, peers = [], []
        for key in data.keys(meas, r.host):
            s = _series(data.data[key].get(field, []), mode, lo, hi)
            if s is None:
                continue
            _, _, gpu, link = key
            mine = r.gpu is None or gpu == r.gpu
            if mine and meas == "gpu_nvlink" and r.link is not None:
                mine = link == r.link
            name = f"GPU {gpu}" + (f" link {link}" if link is not None else "")
            (target if mine else peers).append((name, s))
        if target or peers:
            panels.append((label, target, peers))
    if not panels:
        return None
    # a panel where every GPU shows one and the same constant says nothing: leave it out
    flat = [len({float(v) for _, (_, vs) in tg + pe for v in vs if v == v}) <= 1 for _, tg, pe in panels]
    if not all(flat):
        panels = [p for p, f in zip(panels, flat, strict=True) if not f]
    fig, axes = plt.subplots(len(panels), 1, figsize=(9, 1.9 * len(panels) + 0.6), sharex=True, squeeze=False)
    epoch = mdates.date2num(np.datetime64("1970-01-01T00:00:00"))
    x = lambda t: epoch + t / 86400.0  # noqa: E731
    end = r.end if r.end is not None else hi
    for ax, (label, target, peers) in zip(axes[:, 0], panels, strict=True):
        ax.axvspan(x(r.start), x(end), color="#f5c2c0", alpha=0.5, lw=0)
        for i, (_, (t, v)) in enumerate(peers[:16]):
            ax.plot(x(t), v, color="#9a9a9a", lw=0.8, alpha=0.7, label="peers" if i == 0 else None)
        if len(peers) >= 2:
            grid = np.linspace(lo, hi, 300)
            stack = [np.interp(grid, t, v, left=np.nan, right=np.nan) for _, (t, v) in peers if len(t) > 1]
            if stack:
                with warnings.catch_warnings():  # grid points no peer covers stay NaN (gaps)
                    warnings.simplefilter("ignore", RuntimeWarning)
                    med = np.nanmedian(np.vstack(stack), axis=0) if len(stack) > 1 else stack[0]
                ax.plot(x(grid), med, color="#333333", lw=1.2, ls="--", label="peer median")
        colors = ["#d62728", "#1f77b4", "#ff7f0e", "#2ca02c", "#9467bd", "#8c564b", "#e377c2", "#17becf"]
        for i, (name, (t, v)) in enumerate(target[:16]):
            style = "o-" if len(t) < 40 else "-"
            ax.plot(x(t), v, style, color=colors[i % len(colors)], lw=1.8, ms=3, label=name)
        ax.set_ylabel(label, fontsize=8)
        ax.tick_params(labelsize=7)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7, loc="upper left", ncol=4, frameon=False)
    axes[-1, 0].xaxis.set_major_formatter(mdates.DateFormatter("%H:%M\n%Y-%m-%d"))
    axes[-1, 0].set_xlim(x(lo), x(hi))
    where = f"{r.host} GPU {r.gpu}" if r.gpu is not None else f"{r.host} (all GPUs)"
    fig.suptitle(f"{r.kind} on {where}: signals vs peers (UTC, incident shaded)", fontsize=9)
    fig.tight_layout()
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=90)
    plt.close(fig)
    return buf.getvalue()


def _flatten(d, prefix=""):
    for k, v in (d or {}).items():
        key = f"{prefix}{k}"
        if isinstance(v, dict):
            yield from _flatten(v, key + ".")
        elif isinstance(v, float):
            yield key, f"{v:.6g}"
        elif isinstance(v, (list, tuple)):
            yield key, json.dumps(v)[:500]
        else:
            yield key, str(v)


PAGE = """<!doctype html>
<html lang="en"><head><meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>{{ g.title }} ({{ r.severity }})</title>
<style>
body{font:15px/1.45 system-ui,sans-serif;margin:1.2em auto;max-width:62em;padding:0 1em;color:#222}
h1{font-size:1.4em;margin:.2em 0 .5em}h2{font-size:1.1em;margin:1.4em 0 .4em}
.sev{display:inline-block;padding:.05em .5em;border-radius:.3em;font-size:.8em;vertical-align:middle;
color:#fff;background:{{ '#b3261e' if r.severity == 'critical' else '#b26a00' }}}
.lead{border-collapse:collapse;width:100%;margin:0 0 .5em;font-size:1.05em}
.lead th{width:7em;text-align:left;vertical-align:top;padding:.35em .6em;background:#f4f4f4;
border:1px solid #ddd}.lead td{padding:.35em .6em;border:1px solid #ddd}
.lead tr.do td{background:#fff4d6;font-weight:600}
table{border-collapse:collapse;margin:.4em 0 1em}td,th{border:1px solid #ddd;padding:.25em .6em;
text-align:left;vertical-align:top}th{background:#f4f4f4}img{max-width:100%;border:1px solid #ddd}
.muted{color:#666}.refused{color:#b3261e;font-weight:600}.ok{color:#1e6b2e;font-weight:600}.active{color:#b3261e;font-weight:600}
details{margin:1em 0;border:1px solid #ddd;border-radius:.3em;padding:.3em .8em}
summary{cursor:pointer;font-weight:600}code{font-size:.9em}
</style></head><body>
<p class="muted"><a href="index.html">All incidents</a></p>
<h1><span class="sev">{{ r.severity }}</span> {{ g.title }}</h1>
<table class="lead">
<tr><th>Where</th><td>{{ where }}{% if r.cluster %} · cluster {{ r.cluster }}{% endif %}
{%- if r.rack %} · rack {{ r.rack }}{% endif %}</td></tr>
<tr><th>Job</th><td>{% if r.jobs %}{{ r.jobs|join(', ') }}{% else %}<span class="muted">no job
recorded on the affected GPUs during the incident</span>{% endif %}</td></tr>
<tr><th>Since</th><td>{{ start }} · {% if r.end is not none %}<span class="ok">resolved</span> {{ end }}
({{ duration }}){% else %}<span class="active">active</span>{% endif %}</td></tr>
<tr><th>Impact</th><td id="impact">{{ g.impact }}</td></tr>
{% if lead %}<tr><th>Evidence</th><td id="lead">{{ lead }}</td></tr>{% endif %}
<tr class="do"><th>Do</th><td id="action">{{ g.action }}</td></tr>
{% if acted %}<tr><th>Remediation</th><td id="remediation">{% for a in acted %}<div>
<span class="{{ a.css }}">{{ a.what }}</span> by {{ a.sink }} at {{ a.at }}
{%- if a.why %}: {{ a.why }}{% endif %}
{%- if a.refused and a.cmd %}. Run by hand if it must be: <code>{{ a.cmd }}</code>{% endif %}</div>
{% endfor %}</td></tr>{% endif %}
<tr><th>Runbook</th><td>{% if g.runbook_url -%}
<a id="runbook" href="{{ g.runbook_url }}">{{ g.runbook_url }}</a>
{%- else %}<span class="muted">no runbook on this machine: set --runbook-base-url</span>{% endif %}</td></tr>
</table>
<h2>Signal vs peers</h2>
{% if png %}<img id="signals" alt="{{ r.kind }} signals of {{ where }} against its peers"
 src="data:image/png;base64,{{ png }}">
{% else %}<p class="muted">No telemetry for this GPU in {{ lo }} .. {{ hi }}.</p>{% endif %}
<h2>History of this GPU</h2>
{% if history %}<table><tr><th>start</th><th>end</th><th>severity</th><th>what</th></tr>
{% for h, hname, htitle in history %}<tr><td>{{ h.start|ts }}</td>
<td>{{ h.end|ts if h.end is not none else 'active' }}</td><td>{{ h.severity }}</td>
<td><a href="{{ hname }}">{{ htitle }}</a></td></tr>{% endfor %}</table>
{% else %}<p class="muted">No other incident on {{ where }} in these records.</p>{% endif %}
{% if events %}<h2>GPU events in the window</h2>
<table><tr><th>time</th><th>gpu</th><th>type</th><th>code</th><th>what it is</th><th>what to do</th>
<th>message</th></tr>
{% for e in events %}<tr><td>{{ e[0] }}</td><td>{{ e[1] }}</td><td>{{ e[2] }}</td><td>{{ e[3] }}</td>
<td>{{ e[5] }}</td><td>{{ e[6] }}</td><td>{{ e[4] }}</td></tr>{% endfor %}</table>{% endif %}
{% if actions %}<h2>What the action sink did</h2>
<table id="actions"><tr><th>time</th><th>what</th><th>sink</th><th>command</th><th>why</th>
<th>output</th></tr>
{% for a in actions %}<tr><td>{{ a.at }}</td><td class="{{ a.css }}">{{ a.what }}</td><td>{{ a.sink }}</td>
<td><code>{{ a.cmd or '-' }}</code></td><td>{{ a.why }}</td><td>{{ a.output }}</td></tr>{% endfor %}</table>
{% endif %}
<details id="evidence"><summary>Evidence and thresholds</summary>
<p>{{ technical }}</p>{% if r.detail %}<p>{{ r.detail }}</p>{% endif %}
<h3>Incident</h3>
<table>{% for k, v in fields %}<tr><th>{{ k }}</th><td>{{ v }}</td></tr>{% endfor %}</table>
<h3>Evidence</h3>
{% if evidence %}<table><tr><th>signal</th><th>value</th></tr>
{% for k, v in evidence %}<tr><td>{{ k }}</td><td>{{ v }}</td></tr>{% endfor %}</table>
{% else %}<p class="muted">The incident carries no evidence.</p>{% endif %}
{% if thresholds %}<h3>Thresholds</h3><table><tr><th>parameter</th><th>value</th></tr>
{% for k, v in thresholds %}<tr><td>{{ k }}</td><td>{{ v }}</td></tr>{% endfor %}</table>{% endif %}
</details>
<p class="muted">Window {{ lo }} .. {{ hi }} (UTC). Generated by gpufleet.</p>
</body></html>
"""

INDEX = """<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>gpufleet incidents</title>
<style>body{font:14px/1.45 system-ui,sans-serif;margin:1.5em auto;max-width:70em;padding:0 1em}
table{border-collapse:collapse}td,th{border:1px solid #ddd;padding:.25em .6em;text-align:left}
th{background:#f4f4f4}.critical{color:#b3261e;font-weight:600}</style></head><body>
<h1>Incidents ({{ rows|length }})</h1>
<table><tr><th>start</th><th>end</th><th>severity</th><th>kind</th><th>host</th><th>gpu</th><th>link</th>
<th>what</th></tr>
{% for r, name, summary in rows %}<tr><td>{{ r.start|ts }}</td>
<td>{{ r.end|ts if r.end is not none else 'active' }}</td>
<td class="{{ r.severity }}">{{ r.severity }}</td><td>{{ r.kind }}</td><td>{{ r.host or '' }}</td>
<td>{{ '' if r.gpu is none else r.gpu }}</td><td>{{ '' if r.link is none else r.link }}</td>
<td><a href="{{ name }}">{{ summary }}</a></td></tr>{% endfor %}
</table></body></html>
"""


def _duration(s: float) -> str:
    s = int(round(s))
    h, rem = divmod(s, 3600)
    m, sec = divmod(rem, 60)
    return f"{h} h {m} min" if h else (f"{m} min {sec} s" if m else f"{sec} s")


def _same_gpu(a: Record, b: Record) -> bool:
    """b happened on a's GPU (or node/rack): what a page lists as the GPU's history."""
    if a.host != b.host or (a.host is None and a.rack != b.rack):
        return False
    return a.gpu is None or b.gpu is None or a.gpu == b.gpu


def _event_row(p) -> tuple:
    from gpufleet.analyzer.alerting.actions import xid_action, xid_resolution

    code = p.fields.get("code", "")
    name, todo = ("", "")
    if p.tags.get("type") in (None, "xid") and code != "":
        name, todo = xid_resolution(code)
        if p.fields.get("action"):
            todo = xid_action(str(p.fields["action"]))
    return (to_rfc3339(p.time / 1e9), p.tags.get("gpu", ""), p.tags.get("type", ""), code,
            p.fields.get("message", ""), name, todo)


def _action_rows(rows: list[dict]) -> list[dict]:
    """Action log rows as a page shows them: every text control-escaped (the template HTML-escapes)."""
    import shlex

    from gpufleet.analyzer.alerting.action import clean

    out = []
    for r in rows:
        out.append({"at": to_rfc3339(r["at"]), "what": r["what"], "sink": clean(r["sink"]),
                    "cmd": clean(shlex.join(r["argv"])) if r["argv"] else "",
                    "why": clean(r["detail"] or ""), "output": clean(" ".join((r["output"] or "").split())),
                    "refused": r["group"] in ("refused", "not-undone"),
                    "css": "refused" if r["group"] in ("refused", "not-undone", "failed") else "ok",
                    "key": (r["sink"], r["action"])})
    return out


def _latest(rows: list[dict]) -> list[dict]:
    """Per sink, its last decision on the firing and on the resolve: what the lead shows."""
    last = {r["key"]: r for r in rows}
    return sorted(last.values(), key=lambda r: r["at"])


def _runbooks(out: Path, base: str | None) -> str | None:
    """Where the pages link runbooks: the base someone configured, else the runbooks on this
    machine copied beside the pages (``runbooks/``, linked relatively: the bundle moves as one)."""
    import shutil

    from gpufleet.analyzer.alerting.actions import configured_runbook_base, local_runbooks

    chosen = configured_runbook_base(base)
    src = local_runbooks()
    if chosen or src is None:
        return chosen
    dst = out / "runbooks"
    dst.mkdir(exist_ok=True)
    for f in src.glob("*.md"):
        shutil.copyfile(f, dst / f.name)
    return "runbooks"


def write_pages(incidents, data_points_or_path, out_dir, page_base_url: str | None = None,
                runbook_base_url: str | None = None, progress: bool | None = False,
                actions: list[dict] | None = None) -> list[Path]:
    """Write a page per incident and ``index.html``; returns the paths (pages first, index last).

    ``progress``: a bar on stderr (True), none (False), or one on a terminal only (None).
    ``actions``: the action sink's log (:func:`gpufleet.analyzer.alerting.audit.read_actions`);
    each page shows the entries of its incident's group."""
    from tqdm import tqdm

    bar = tqdm(total=len(incidents), desc="pages: reading telemetry", unit="page", leave=False,
               disable=None if progress is None else not progress)
    try:
        return _write_pages(incidents, data_points_or_path, out_dir, page_base_url, runbook_base_url, bar,
                            actions or [])
    finally:
        bar.close()


def _write_pages(incidents, data_points_or_path, out_dir, page_base_url, runbook_base_url, bar,
                 actions) -> list[Path]:
    import jinja2
    from gpufleet.analyzer.alerting.actions import guide
    from gpufleet.analyzer.alerting.actions import where as where_words
    from gpufleet.analyzer.alerting.audit import by_incident
    from gpufleet.analyzer.alerting.data import load
    from gpufleet.analyzer.alerting.notifier import default_summary, incident_key
    from gpufleet.analyzer.engine import evidence_line

    incidents = sorted(incidents, key=lambda r: (r.start, r.kind, r.host or ""))
    out = Path(out_dir)
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise GpufleetError(f"{out}: cannot create: {exc.strerror}") from None
    hosts = {r.host for r in incidents}
    rough = [window(r, r.start + 6 * 3600) for r in incidents]
    wanted: dict[str, set] = {"gpu_event": hosts}
    fields: dict[str, set] = {}
    for r in incidents:
        for meas, field, *_ in kind_panels(r.kind):
            wanted.setdefault(meas, set()).add(r.host)
            fields.setdefault(meas, set()).add(field)
    data = load(data_points_or_path, hosts, rough, wanted, fields) if incidents else None
    env = jinja2.Environment(autoescape=True, undefined=jinja2.StrictUndefined)
    env.filters["ts"] = to_rfc3339
    page_t, index_t = env.from_string(PAGE), env.from_string(INDEX)
    paths, rows = [], []
    base = page_base_url.rstrip("/") if page_base_url else None
    runbook_base_url = _runbooks(out, runbook_base_url)
    guides = {id(r): guide(r, runbook_base_url) for r in incidents}
    names = {id(r): page_name(incident_key(r)) for r in incidents}
    acted_on = by_incident(actions)
    bar.set_description("pages")
    for r in incidents:
        bar.update(1)
        key = incident_key(r)
        name = names[id(r)]
        g = guides[id(r)]
        lo, hi = window(r, data.last_time(r.host))
        png = plot(r, data, lo, hi)
        where = where_words(r)
        fields = [("key", key), ("kind", r.kind), ("severity", r.severity)]
        for k in ("cluster", "rack", "host", "gpu", "link"):
            v = getattr(r, k)
            if v is not None:
                fields.append((k, v))
        fields += [("start", to_rfc3339(r.start)), ("end", to_rfc3339(r.end) or "active")]
        if r.impact_at is not None:
            fields.append(("impact at", to_rfc3339(r.impact_at)))
        if base:
            fields.append(("page", f"{base}/{name}"))
        events = [_event_row(p) for p in data.events
                  if p.tags.get("host") == r.host and lo * 1e9 <= p.time <= hi * 1e9
                  and (r.gpu is None or p.tags.get("gpu") in (None, str(r.gpu)))][:50]
        ev = dict(r.evidence or {})
        thresholds = list(_flatten(ev.pop("thresholds", None) or {}))
        history = [(h, names[id(h)], guides[id(h)].title) for h in incidents
                   if h is not r and _same_gpu(r, h)][:50]
        acts = _action_rows(acted_on.get(key, []))
        html = page_t.render(
            r=r, g=g, actions=acts, acted=_latest(acts), where=where, lead=evidence_line(r.evidence),
            technical=r.summary or default_summary(r), start=to_rfc3339(r.start),
            end=to_rfc3339(r.end), duration=_duration((r.end or r.start) - r.start), fields=fields,
            evidence=list(_flatten(ev)), thresholds=thresholds, history=history,
            png=base64.b64encode(png).decode() if png else None,
            events=events, lo=to_rfc3339(lo), hi=to_rfc3339(hi))
        path = out / name
        path.write_text(html, encoding="utf-8")
        paths.append(path)
        rows.append((r, name, g.title))
    index = out / "index.html"
    index.write_text(index_t.render(rows=rows), encoding="utf-8")
    return paths + [index]
