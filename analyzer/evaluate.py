"""``gpufleet eval``: score incidents against ground truth (a public contract).

Match rule: an incident matches a truth record when kind and host agree (the rack when the
truth names a rack but no host), gpu agrees when the truth names one, link agrees when the
truth names one, and the incident starts between truth ``start`` - 60 s and truth ``end`` + 5 min
(no end: any time after). Precision = matched incidents / incidents; recall = truths matched by
at least one incident / truths. Latency = first matching incident start - truth start.
``cooling_before_impact`` = share of cooling_degradation truths with an ``impact_at`` whose first
matching incident started before it. False incidents per 1000 GPU-days need the fleet's
GPU-days: from ``--gpu-days`` or the simulator's manifest.json beside the truth file.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np

from gpufleet.errors import GpufleetError
from gpufleet.records import KINDS, Record

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


def evaluate(truth: list[Record], incidents: list[Record], gpu_days: float | None = None) -> dict:
    inc_matched = [False] * len(incidents)
    first: list[float | None] = []
    for tr in truth:
        best = None
        for i, inc in enumerate(incidents):
            if matches(inc, tr):
                inc_matched[i] = True
                if best is None or inc.start < best:
                    best = inc.start
        first.append(best)
    per_kind = {}
    kinds = [k for k in KINDS if any(r.kind == k for r in truth) or any(r.kind == k for r in incidents)]
    for k in kinds:
        ti = [i for i, r in enumerate(truth) if r.kind == k]
        ii = [i for i, r in enumerate(incidents) if r.kind == k]
        lat = [first[i] - truth[i].start for i in ti if first[i] is not None]
        med, p95 = _stats(lat)
        d = {
            "truths": len(ti),
            "incidents": len(ii),
            "true_incidents": sum(inc_matched[i] for i in ii),
            "detected": sum(first[i] is not None for i in ti),
            "false_incidents": sum(not inc_matched[i] for i in ii),
        }
        d.update(_prf(d["true_incidents"], len(ii), d["detected"], len(ti)))
        d["latency_median_s"], d["latency_p95_s"] = _r(med), _r(p95)
        per_kind[k] = d
    lat = [first[i] - tr.start for i, tr in enumerate(truth) if first[i] is not None]
    med, p95 = _stats(lat)
    n_false = sum(not m for m in inc_matched)
    overall = {
        "truths": len(truth),
        "incidents": len(incidents),
        "true_incidents": sum(inc_matched),
        "detected": sum(f is not None for f in first),
        "false_incidents": n_false,
    }
    overall.update(_prf(overall["true_incidents"], len(incidents), overall["detected"], len(truth)))
    overall["latency_median_s"], overall["latency_p95_s"] = _r(med), _r(p95)
    cool = [(tr, first[i]) for i, tr in enumerate(truth) if tr.kind == "cooling_degradation" and tr.impact_at]
    before = sum(1 for tr, f in cool if f is not None and f < tr.impact_at)
    out = {
        "overall": overall,
        "per_kind": per_kind,
        "precision": overall["precision"],
        "recall": overall["recall"],
        "f1": overall["f1"],
        "latency_median_s": overall["latency_median_s"],
        "latency_p95_s": overall["latency_p95_s"],
        "cooling_before_impact": round(before / len(cool), 4) if cool else None,
        "gpu_days": _r(gpu_days),
        "false_per_1000_gpu_days": round(n_false / gpu_days * 1000, 4) if gpu_days else None,
    }
    return out


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
        from analyzer.config import parse_duration

        try:
            dur = parse_duration(dur, "manifest duration")
        except GpufleetError:
            dur = None
    if isinstance(gpus, int | float) and isinstance(dur, int | float) and gpus > 0 and dur > 0:
        return gpus * dur / 86400.0
    return None


def table(result: dict) -> str:
    rows = [("kind", "truths", "incidents", "precision", "recall", "f1", "lat_med_s", "lat_p95_s")]
    for k, d in result["per_kind"].items():
        rows.append(
            (
                k,
                d["truths"],
                d["incidents"],
                d["precision"],
                d["recall"],
                d["f1"],
                d["latency_median_s"],
                d["latency_p95_s"],
            )
        )
    o = result["overall"]
    rows.append(
        (
            "overall",
            o["truths"],
            o["incidents"],
            o["precision"],
            o["recall"],
            o["f1"],
            o["latency_median_s"],
            o["latency_p95_s"],
        )
    )
    w = [max(len(str(r[i])) for r in rows) for i in range(len(rows[0]))]
    lines = ["  ".join(str(v).ljust(w[i]) for i, v in enumerate(r)) for r in rows]
    lines.append(f"cooling_degradation flagged before impact: {result['cooling_before_impact']}")
    lines.append(
        f"false incidents per 1000 GPU-days: {result['false_per_1000_gpu_days']} "
        f"(GPU-days: {result['gpu_days']})"
    )
    return "\n".join(lines)
