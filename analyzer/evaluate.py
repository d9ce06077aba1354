"""``gpufleet eval``: score incidents against ground truth (a public contract).

Match rule: an incident matches a truth record when kind and host agree (the rack when the
truth names a rack but no host), gpu agrees when the truth names one, link agrees when the
truth names one, and the incident starts between truth ``start`` - 60 s and truth ``end`` + 5 min
(no end: any time after).

Scoring is one-to-one, as an on-call engineer counts pages: truths in order of start each take
their earliest matching incident not taken yet; every other incident is false, and one that
matches a fault already paged is a *duplicate page* of that fault (reported as such).
Precision = incidents that took a truth / incidents; recall = truths with an incident / truths;
pages per fault = matching incidents per detected fault. ``lenient=True`` keeps the old rule
(every matching incident is true, a truth is detected by any of them) for comparison.
Latency = the truth's incident start - truth start. ``cooling_before_impact`` = share of
cooling_degradation truths with an ``impact_at`` whose incident started before it. False
incidents per 1000 GPU-days need the fleet's GPU-days: ``--gpu-days``, else counted from the
telemetry (GPU rows present: each GPU's time between consecutive rows, gaps over 5 min not
counted), else the simulator's manifest. Informational records (severity ``info``: a setting or
the room worth telling someone, never paged) are not scored: counted per kind in ``notes``. Nor
are the analysis's own records (``analysis_gap``, ``node_stopped_reporting``: rows it could not
analyse, a node whose data stopped; no fault of a GPU claimed) where the truth has none of their
kind: counted per kind in ``analysis``.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np

from gpufleet.errors import GpufleetError
from gpufleet.records import ANALYSIS_KINDS, KINDS, Record, to_rfc3339

BEFORE = 60.0
AFTER = 300.0


def matches(inc: Record, tr: Record) -> bool:
    if inc.kind != tr.kind:
        return False
    if tr.host is not None:
        if inc.host != tr.host:
            return False
    elif tr.rack is not None and inc.rack != tr.rack:
        return False
    if tr.gpu is not None and inc.gpu != tr.gpu:
        return False
    if tr.link is not None and inc.link != tr.link:
        return False
    hi = math.inf if tr.end is None else tr.end + AFTER
    return tr.start - BEFORE <= inc.start <= hi


def _stats(vals: list[float]) -> tuple[float | None, float | None]:
    if not vals:
        return None, None
    a = np.asarray(vals, float)
    return float(np.median(a)), float(np.percentile(a, 95))


def _prf(tp_inc: int, n_inc: int, tp_truth: int, n_truth: int) -> dict:
    p = tp_inc / n_inc if n_inc else (1.0 if n_truth == 0 else 0.0)
    r = tp_truth / n_truth if n_truth else (1.0 if n_inc == 0 else 0.0)
    f = 2 * p * r / (p + r) if p + r else 0.0
    return {"precision": round(p, 4), "recall": round(r, 4), "f1": round(f, 4)}


def assign(truth: list[Record], incidents: list[Record], lenient: bool = False):
    """(taken, first, dup_of): per incident the truth it took (or None), per truth the start of
    its incident (or None), per incident the truth it duplicates (or None). One-to-one unless
    ``lenient``: then every matching incident is true and a truth's first is its earliest match."""
    taken: list[int | None] = [None] * len(incidents)
    dup_of: list[int | None] = [None] * len(incidents)
    first: list[float | None] = [None] * len(truth)
    cands = [
        sorted((i for i, inc in enumerate(incidents) if matches(inc, tr)), key=lambda i: incidents[i].start)
        for tr in truth
    ]
    if lenient:
        for ti, c in enumerate(cands):
            for i in c:
                if taken[i] is None:
                    taken[i] = ti
            if c:
                first[ti] = incidents[c[0]].start
        return taken, first, dup_of
    for ti in sorted(range(len(truth)), key=lambda k: (truth[k].start, k)):
        free = [i for i in cands[ti] if taken[i] is None]
        if free:
            taken[free[0]] = ti
            first[ti] = incidents[free[0]].start
    for ti, c in enumerate(cands):
        for i in c:
            if taken[i] is None and dup_of[i] is None:
                dup_of[i] = ti
    return taken, first, dup_of


def _counts(ti: list[int], ii: list[int], taken, first, dup_of, truth) -> dict:
    pages: dict[int, int] = {}
    for i in ii:
        t = taken[i] if taken[i] is not None else dup_of[i]
        if t is not None:
            pages[t] = pages.get(t, 0) + 1
    det = [k for k in ti if first[k] is not None]
    lat = [first[k] - truth[k].start for k in det]
    med, p95 = _stats(lat)
    d = {
        "truths": len(ti),
        "incidents": len(ii),
        "true_incidents": sum(taken[i] is not None for i in ii),
        "detected": len(det),
        "false_incidents": sum(taken[i] is None for i in ii),
        "duplicates": sum(dup_of[i] is not None for i in ii),
        "pages_per_fault": round(sum(pages.get(k, 0) for k in det) / len(det), 3) if det else None,
        "max_pages_per_fault": max((pages.get(k, 0) for k in det), default=None),
    }
    d.update(_prf(d["true_incidents"], len(ii), d["detected"], len(ti)))
    d["latency_median_s"], d["latency_p95_s"] = _r(med), _r(p95)
    return d


def evaluate(
    truth: list[Record], incidents: list[Record], gpu_days: float | None = None, lenient: bool = False
) -> dict:
    # informational records (severity info) are not pages: counted apart, never true or false
    notes = [r for r in incidents if r.severity == "info"]
    incidents = [r for r in incidents if r.severity != "info"]
    # the analysis's own records claim no fault: scored only against a truth that has their kind
    unscored = set(ANALYSIS_KINDS) - {t.kind for t in truth}
    own = [r for r in incidents if r.kind in unscored]
    incidents = [r for r in incidents if r.kind not in unscored]
    taken, first, dup_of = assign(truth, incidents, lenient)
    per_kind = {}
    kinds = [k for k in KINDS if any(r.kind == k for r in truth) or any(r.kind == k for r in incidents)]
    for k in kinds:
        ti = [i for i, r in enumerate(truth) if r.kind == k]
        ii = [i for i, r in enumerate(incidents) if r.kind == k]
        per_kind[k] = _counts(ti, ii, taken, first, dup_of, truth)
    overall = _counts(list(range(len(truth))), list(range(len(incidents))), taken, first, dup_of, truth)
    n_false = overall["false_incidents"]
    cool = [(tr, first[i]) for i, tr in enumerate(truth) if tr.kind == "cooling_degradation" and tr.impact_at]
    before = sum(1 for tr, f in cool if f is not None and f < tr.impact_at)
    duplicates = [
        {
            "incident": incidents[i].id,
            "kind": incidents[i].kind,
            "host": incidents[i].host,
            "gpu": incidents[i].gpu,
            "link": incidents[i].link,
            "start": to_rfc3339(incidents[i].start),
            "repeats": _where(truth[dup_of[i]]),
        }
        for i in range(len(incidents))
        if dup_of[i] is not None
    ]
    out = {
        "scoring": "lenient" if lenient else "one-to-one",
        "overall": overall,
        "per_kind": per_kind,
        "precision": overall["precision"],
        "recall": overall["recall"],
        "f1": overall["f1"],
        "latency_median_s": overall["latency_median_s"],
        "latency_p95_s": overall["latency_p95_s"],
        "pages_per_fault": overall["pages_per_fault"],
        "duplicates": len(duplicates),
        "duplicate_pages": duplicates,
        "cooling_before_impact": round(before / len(cool), 4) if cool else None,
        "cooling_throttled": len(cool),
        "gpu_days": _r(gpu_days),
        "false_incidents": n_false,
        "false_per_1000_gpu_days": round(n_false / gpu_days * 1000, 4) if gpu_days else None,
        "notes": _per_kind(notes),
        "analysis": _per_kind(own),
    }
    return out


def _per_kind(recs: list[Record]) -> dict[str, int]:
    """How many records of each kind, by kind's name."""
    return {k: sum(r.kind == k for r in recs) for k in sorted({r.kind for r in recs})}


def _where(r: Record) -> str:
    """A fault named as on-call would: kind, place, start."""
    place = r.host or (f"rack {r.rack}" if r.rack else "fleet")
    if r.gpu is not None:
        place += f" GPU {r.gpu}"
    if r.link is not None:
        place += f" link {r.link}"
    return f"{r.kind} {place} from {to_rfc3339(r.start)}"


def _r(x):
    return None if x is None else round(float(x), 3)


def gpu_days_from_manifest(truth_path: str | Path) -> float | None:
    """GPU-days of a simulated fleet from the manifest.json beside its truth file, if any."""
    m = Path(truth_path).with_name("manifest.json")
    if not m.is_file():
        return None
    try:
        doc = json.loads(m.read_text())
    except (OSError, ValueError):
        return None
    return _find_gpu_days(doc)


def _find_gpu_days(doc: dict) -> float | None:
    if not isinstance(doc, dict):
        return None
    for k in ("gpu_days",):
        if isinstance(doc.get(k), int | float):
            return float(doc[k])
    fleet = doc.get("fleet") if isinstance(doc.get("fleet"), dict) else {}
    params = doc.get("parameters") if isinstance(doc.get("parameters"), dict) else {}
    merged = {**doc, **params, **fleet}
    gpus = merged.get("gpus")
    if not isinstance(gpus, int | float):
        nodes, gpn = merged.get("nodes"), merged.get("gpus_per_node")
        if isinstance(nodes, int | float) and isinstance(gpn, int | float):
            gpus = nodes * gpn
    dur = merged.get("duration_seconds", merged.get("duration_s", merged.get("duration")))
    if isinstance(dur, str):
        from gpufleet.analyzer.config import parse_duration

        try:
            dur = parse_duration(dur, "manifest duration")
        except GpufleetError:
            dur = None
    if isinstance(gpus, int | float) and isinstance(dur, int | float) and gpus > 0 and dur > 0:
        return gpus * dur / 86400.0
    return None


def gpu_days_from_data(path: str | Path, max_gap_seconds: float = 300.0) -> float | None:
    """GPU-days the telemetry at ``path`` (a .lp/.lp.gz file or a directory) covers: per GPU the
    time between consecutive ``gpu`` rows, a gap longer than ``max_gap_seconds`` not counted (the
    GPU was not observed then). None when there are no gpu rows."""
    from gpufleet.analyzer.parse import Parser
    from gpufleet.analyzer.sources import read_chunks

    parser = Parser({"gpu"}, {"gpu": set()})
    key_of: dict[int, int] = {}
    gpus: dict[tuple, int] = {}
    last = np.zeros(0, np.int64)
    total_ns = 0
    cap = int(max_gap_seconds * 1e9)
    for data in read_chunks(path):
        rows = parser.feed(data).get("gpu")
        if rows is None or not len(rows):
            continue
        for s in np.unique(rows.sid).tolist():
            if s not in key_of:
                tags = parser.series.tags[s]
                key_of[s] = gpus.setdefault((tags.get("host"), tags.get("gpu")), len(gpus))
        if len(last) < len(gpus):
            last = np.concatenate([last, np.full(len(gpus) - len(last), -1, np.int64)])
        g = np.array([key_of[s] for s in rows.sid.tolist()], np.int64)
        t = rows.t.astype(np.int64)
        order = np.lexsort((t, g))
        g, t = g[order], t[order]
        prev = np.empty_like(t)
        prev[1:] = t[:-1]
        head = np.ones(len(g), bool)
        head[1:] = g[1:] != g[:-1]
        prev[head] = last[g[head]]
        dt = t - prev
        ok = (prev >= 0) & (dt > 0) & (dt <= cap)
        total_ns += int(dt[ok].sum())
        tail = np.ones(len(g), bool)
        tail[:-1] = g[1:] != g[:-1]
        last[g[tail]] = np.maximum(last[g[tail]], t[tail])
    if not gpus:
        return None
    return total_ns / 1e9 / 86400.0


def telemetry_beside(truth_path: str | Path) -> Path | None:
    """The simulator's telemetry file beside its truth file (named by manifest.json), if any."""
    d = Path(truth_path).parent
    name = "telemetry.lp.gz"
    try:
        doc = json.loads((d / "manifest.json").read_text())
        name = str(doc.get("telemetry", {}).get("file") or name)
    except (OSError, ValueError, AttributeError):
        pass
    p = d / name
    return p if p.is_file() else None


def table(result: dict) -> str:
    rows = [
        (
            "kind",
            "truths",
            "incidents",
            "precision",
            "recall",
            "f1",
            "duplicates",
            "pages/fault",
            "lat_med_s",
            "lat_p95_s",
        )
    ]
    items = list(result["per_kind"].items()) + [("overall", result["overall"])]
    for k, d in items:
        rows.append(
            (
                k,
                d["truths"],
                d["incidents"],
                d["precision"],
                d["recall"],
                d["f1"],
                d["duplicates"],
                d["pages_per_fault"],
                d["latency_median_s"],
                d["latency_p95_s"],
            )
        )
    w = [max(len(str(r[i])) for r in rows) for i in range(len(rows[0]))]
    lines = [f"scoring: {result['scoring']}"]
    lines += ["  ".join(str(v).ljust(w[i]) for i, v in enumerate(r)) for r in rows]
    lines.append(f"duplicates: {result['duplicates']}")
    for d in result["duplicate_pages"]:
        lines.append(f"  duplicate page {d['incident']} ({d['start']}) repeats {d['repeats']}")
    lines.append(
        f"cooling_degradation flagged before impact: {result['cooling_before_impact']} "
        f"(of {result['cooling_throttled']} that throttled)"
    )
    lines.append(
        f"false incidents per 1000 GPU-days: {result['false_per_1000_gpu_days']} "
        f"({result['false_incidents']} false, GPU-days: {result['gpu_days']})"
    )
    if result.get("notes"):
        lines.append("informational records, not scored: "
                     + ", ".join(f"{k} {n}" for k, n in result["notes"].items()))
    if result.get("analysis"):
        lines.append("the analysis's own records (no GPU fault claimed), not scored: "
                     + ", ".join(f"{k} {n}" for k, n in result["analysis"].items()))
    return "\n".join(lines)
