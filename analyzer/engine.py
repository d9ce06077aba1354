"""Incident engine: detector hits -> incidents (one per fault, not one per sample).

Per (kind, scope key) the engine follows runs of hits: hits closer than the detector's
``gap_seconds`` form a run; a run that lasts ``dwell_seconds`` opens an incident whose start is
the run's first hit (so latency is the physics', not the dwell's); an open incident absorbs
later hits until none came for ``resolve_seconds`` of data time, then it resolves with ``end``
= its last hit. A node (rack) incident absorbs the GPU (node) incidents of its kind that
began within ``absorb_seconds``; a kind listed in ``fold`` that lands on a GPU an incident of the
named kind covers becomes evidence of that incident instead of a second page: by default thermal
throttling folds into the cooling_degradation incident of its GPU (or node, or rack), whose
``impact_at`` is then when throttling began (an update of the cooling page, not a second page).
"""

from __future__ import annotations

import hashlib
import math
from dataclasses import dataclass, field, replace

import numpy as np
from gpufleet.analyzer.detectors import REGISTRY
from gpufleet.analyzer.detectors.base import Hits
from gpufleet.analyzer.frame import Registry

from gpufleet.records import Record

EARLY_KEEP = 86400.0  # how long late hits not chained to a run wait for the hits between (s)


def kind_summary(kind: str) -> str:
    """What an incident of ``kind`` means, in words: its detector's ``summary`` (the kind itself
    for a kind no detector declares)."""
    cls = REGISTRY.get(kind)
    return cls.summary if cls is not None and cls.summary else kind


# evidence keys that are not evidence a person reads (the engine's own labels and lists)
_NOT_SHOWN = ("signals", "time", "critical")


def evidence_line(evidence: dict | None) -> str:
    """The decisive evidence of an incident in words, each part labelled with its time: the worst
    hit (``peak``: a critical hit before any other, then the highest score), the run's first
    hit and, for an incident found in late data, how long after it began, e.g.
    ``peak (critical) at 2026-11-20T00:41:10Z: new_dbe=1; first at
    2026-11-20T00:30:40Z: sbe_rate_per_s=0.0417``. The engine's summary, every alert's description
    and the incident page's lead all say this line; "" for an incident without evidence."""
    ev = evidence or {}
    parts = []
    peak, first = ev.get("peak") or {}, ev.get("first") or {}
    same = peak and first and _shown(peak) == _shown(first) and peak.get("time") == first.get("time")
    for label, e in (("peak", peak), ("first", None if same else first)):
        if not e:
            continue
        head = label + (" (critical)" if e.get("critical") else "")
        if e.get("time"):
            head += f" at {e['time']}"
        body = ", ".join(f"{k}={v}" for k, v in _shown(e))
        parts.append(f"{head}: {body}" if body else head)
    after = ev.get("found_after_seconds")
    if after:  # set by the online analyzer on an incident found in data that landed late
        parts.append(f"found {after / 60:.0f} min after it began: its data arrived late")
    return "; ".join(parts)


def _shown(e: dict) -> list[tuple[str, object]]:
    return [(k, v) for k, v in e.items() if k not in _NOT_SHOWN and v is not None]


def kind_severity(kind: str) -> str:
    """An incident's severity unless one of its hits is critical: its detector's ``severity``."""
    return getattr(REGISTRY.get(kind), "severity", "warning")


@dataclass
class _State:
    kind: str
    key: tuple
    run_start: float = 0.0
    run_hits: int = 0
    last_hit: float = -np.inf
    incident: Record | None = None
    peak: float = -np.inf
    peak_critical: bool = False  # the peak is a critical hit (which outranks any score)
    peak_time: float = np.inf
    first_time: float = np.inf
    first_critical: bool = False
    hits: int = 0
    critical: bool = False
    first_evidence: dict = field(default_factory=dict)
    peak_evidence: dict = field(default_factory=dict)
    began: float = np.inf  # earliest onset the detector reported for the current run
    stale: bool = False  # the incident's evidence lags the hits (brought up to date when read)
    early: list = field(default_factory=list)  # late hits before the run, not (yet) chained to it
    # the last run a gap ended before it lasted its dwell: a host's late rows landing in that gap
    # (its live rows came first) join it to the run after
    dropped: _State | None = None


def _drop(st: _State) -> None:
    """A gap ends the run before its dwell: it is kept as ``dropped`` (see ``Engine._rejoin``)."""
    if st.run_hits:
        st.dropped = replace(st, early=[], dropped=None)
    st.run_hits = 0


class Engine:
    def __init__(
        self,
        detector_params: dict[str, dict],
        absorb_seconds: float = 3600.0,
        fold: dict[str, list[str]] | None = None,
    ):
        self.params = detector_params
        self.absorb_seconds = absorb_seconds
        self.fold = fold or {}
        self.states: dict[tuple, _State] = {}
        self.closed: list[Record] = []
        self.absorbed: list[Record] = []  # incidents merged into a wider one (kept for online resolve)
        self._folded_ids: set[str] = set()
        self.watermark = -np.inf
        # per kind: how far the streams its detector reads have been analysed (the watermark where
        # absent); a late stream's incident must not be resolved by other streams' progress
        self.progress: dict[str, float] = {}
        self.pending: dict[tuple, list] = {}
        self._pending_first: dict[tuple, float] = {}  # per key: its earliest queued hit's time
        self._reg: Registry | None = None
        self._racks: list[str] = []
        # online: per host id, the latest of its data analysed; its incidents resolve by it (a node
        # whose data is late keeps them open), unless it is more than host_bound behind
        self.host_progress: np.ndarray | None = None
        self.host_bound = np.inf
        # online: per host id, the stretches (s) it sent no rows ([from, to], to = inf while it
        # lasts: node_stopped_reporting); no quiet time of its incidents, which then say nothing
        self.host_gaps: dict[int, list[list[float]]] = {}
        self._late: dict[tuple, bool] = {}  # keys that got hits from late data -> judged without peers

    # ------------------------------------------------------------------ input
    def add(self, hits: Hits, reg: Registry, rack_names: list[str], late: bool = False,
            no_peers: bool = False) -> None:
        """Queue hits; they are turned into incidents, in time order per key, by :meth:`advance`.
        ``late``: found in data that landed behind the analysis (its incident says so);
        ``no_peers``: a peer-relative detector judged them with no peer rows held."""
        if not len(hits):
            return
        self._reg, self._racks = reg, rack_names
        n = len(hits)
        racks = np.asarray(hits.rack, np.int64).tolist() if hits.rack is not None else [-1] * n
        t = np.asarray(hits.t, float)
        # min(began, t) as Python's min takes it
        began = np.where(t < hits.began, t, hits.began).tolist() if hits.began is not None else t.tolist()
        ev = hits.evidence
        sustain = hits.sustain.tolist() if hits.sustain is not None else [False] * n
        cols = zip(
            np.asarray(hits.host, np.int64).tolist(),  # (Python ints: the incident keys)
            np.asarray(hits.gpu, np.int64).tolist(),
            np.asarray(hits.link, np.int64).tolist(),
            racks,
            t.tolist(),
            np.asarray(hits.score, float).tolist(),
            np.asarray(hits.critical, bool).tolist(),
            range(n),
            began,
            sustain,
            strict=True,
        )
        batch: dict[tuple, list] = {}
        kind = hits.kind
        for host, gpu, link, rack, ti, score, crit, i, b, sus in cols:
            batch.setdefault((kind, host, gpu, link, rack), []).append((ti, score, crit, i, b, sus))
        gap = float(self.params.get(hits.kind, {}).get("gap_seconds", 60.0))
        for key, items in batch.items():
            keep = _evidence_candidates(items, gap) if ev else set()
            # evidence is built now for the hits that can become a run's first or peak, and for no
            # other: a queued hit holds no reference to its window's arrays (the queue can be long)
            self.pending.setdefault(key, []).extend(
                (ti, score, crit, ev[i] if i in keep else {}, b, sus) for ti, score, crit, i, b, sus in items
            )
            first = min(x[0] for x in items)
            self._pending_first[key] = min(self._pending_first.get(key, first), first)
            if late:
                self._late[key] = self._late.get(key, False) or no_peers

    def _run(self, key: tuple, items: list) -> None:
        kind = key[0]
        p = self.params.get(kind, {})
        dwell = float(p.get("dwell_seconds", 0.0))
        gap = float(p.get("gap_seconds", 60.0))
        resolve = float(p.get("resolve_seconds", 900.0))
        st = self.states.get(key)
        if st is None:
            st = self.states[key] = _State(kind, key)
        items = sorted(items, key=lambda x: x[0])
        if self._late and (st.incident is not None or st.run_hits):
            items = self._early(st, items, gap, dwell, resolve)
        for t, score, critical, e, began, sustain in items:
            if sustain:  # holds an open incident open; never opens one, never evidence
                if st.incident is not None and t - st.last_hit <= resolve:
                    st.last_hit = max(st.last_hit, t)
                continue
            if st.incident is not None and t < st.incident.start:
                # a late hit (another stream, late data) just before the incident: it began earlier
                if st.incident.start - t <= gap:
                    st.incident.start = t
                self._extend(st, t, score, critical, e)
                continue
            if st.incident is not None and t - st.last_hit > resolve and self._quiet(st, t) > resolve:
                self._close(st)
            if st.incident is not None:
                self._extend(st, t, score, critical, e)
                continue
            if t - st.last_hit > gap or st.run_hits == 0:
                _drop(st)
                st.run_start = t
                st.critical, st.peak, st.peak_critical, st.hits = False, -np.inf, False, 0
                # a run restarted mid-stream (its hits were absorbed by a wider incident) keeps the
                # first evidence it had: only a run's possible first hits carry evidence
                if e or not st.first_evidence:
                    st.first_evidence, st.first_time, st.first_critical = e, t, critical
                st.began = began
                # the run a host's progress ended (its late hits were still to come) goes on here
                # when this hit follows it within the gap, as it did in time order
                self._rejoin(st, t, gap)
            st.began = min(st.began, began)
            st.run_hits += 1
            self._extend(st, t, score, critical, e)
            if t - st.run_start >= dwell:
                wide = self._cover(st)
                if wide is not None:
                    # a node/rack incident of this kind already covers it: one page, not eight
                    if min(st.run_start, st.began) < wide.start:
                        wide.start = min(st.run_start, st.began)
                    st.run_hits = 0
                    continue
                st.incident = self._open(st, self._reg, self._racks)

    def _early(self, st: _State, items: list, gap: float, dwell: float, resolve: float) -> list:
        """Hits from late data before the current run or incident (a host's backlog analysed after
        its newer rows): those that chain back from its start, ``gap`` by ``gap``, move the start
        back (the true start), and so does an earlier run of them lasting ``dwell``, less than
        ``resolve`` before it (in time order it opened the incident, which stayed open until the
        later hits); the rest are returned, in time order, for the usual walk."""
        anchor = st.incident.start if st.incident is not None else st.run_start
        early = [x for x in items if x[0] < anchor and not x[5]]
        if not early:
            return items
        rest = [x for x in items if not (x[0] < anchor and not x[5])]
        # hits not chained yet wait for the late hits between them and the run (a backlog arrives
        # in pieces, newest piece not always last)
        early = sorted(st.early + early, key=lambda x: x[0])
        st.early = []
        start = anchor
        i = len(early) - 1
        while i >= 0:
            j = i  # the run of early hits ending at early[i]: early[j..i]
            while j > 0 and early[j][0] - early[j - 1][0] <= gap:
                j -= 1
            lo, hi = early[j][0], early[i][0]
            if start - hi > gap and not (start - hi <= resolve and hi - lo >= dwell):
                st.early = [x for x in early[: i + 1] if anchor - x[0] <= EARLY_KEEP]
                break
            for t, score, critical, e, began, _sus in reversed(early[j : i + 1]):
                start = t
                if st.incident is not None:
                    st.incident.start = min(st.incident.start, t, began)
                    if st.key in self._late:  # opened before its backlog landed: it says so
                        st.incident.evidence["arrived_late"] = True
                    if e and t < st.first_time:  # the backlog's first hit is the run's first
                        st.first_evidence, st.first_time, st.first_critical = e, t, critical
                else:
                    st.run_start, st.run_hits = t, st.run_hits + 1
                    st.first_evidence = e or st.first_evidence
                    st.began = min(st.began, began)
                self._extend(st, t, score, critical, e)
            i = j - 1
        self._rejoin(st, start, gap)
        if st.incident is None and st.run_hits and st.last_hit - st.run_start >= dwell:
            if self._cover(st) is None:
                st.incident = self._open(st, self._reg, self._racks)
        return rest

    @staticmethod
    def _rejoin(st: _State, start: float, gap: float) -> None:
        """The run a gap ended (``dropped``) joins the run or incident beginning at ``start`` where
        late hits have filled that gap: one fault whose host was cut off mid-run, its rows after
        the cut landing before its backlog, began where that run began, and counts its hits."""
        prev = st.dropped
        if prev is None or not prev.last_hit < start <= prev.last_hit + gap:
            return
        st.dropped = None
        if st.incident is not None:
            st.incident.start = min(st.incident.start, prev.run_start, prev.began)
        else:
            st.run_start, st.run_hits = prev.run_start, st.run_hits + prev.run_hits
        st.began = min(st.began, prev.began)
        st.hits += prev.hits
        st.critical |= prev.critical
        if prev.first_evidence and prev.first_time < st.first_time:
            st.first_evidence, st.first_time, st.first_critical = (
                prev.first_evidence, prev.first_time, prev.first_critical)
        if (prev.peak_critical, prev.peak) > (st.peak_critical, st.peak):
            st.peak, st.peak_critical, st.peak_time, st.peak_evidence = (
                prev.peak, prev.peak_critical, prev.peak_time, prev.peak_evidence)

    def _cover(self, st: _State) -> Record | None:
        kind, host, gpu, link, rack = st.key
        if gpu == -1 and host == -1:
            return None
        reg = self._reg
        hname = reg.hosts[host] if host >= 0 else None
        rname = reg.host_rack[host] if host >= 0 else None
        for o in self.states.values():
            inc = o.incident
            if inc is None or o.kind != kind or o.key[2] != -1 or o is st:
                continue
            if inc.start - self.absorb_seconds > min(st.run_start, st.began):
                continue
            if gpu != -1 and inc.host is not None and inc.host == hname:
                return inc
            if inc.host is None and inc.rack is not None and inc.rack == rname:
                return inc
        return None

    def _extend(self, st: _State, t: float, score: float, critical: bool, e: dict) -> None:
        st.last_hit = max(st.last_hit, t)
        st.hits += 1
        st.critical |= critical
        if (critical, score) > (st.peak_critical, st.peak) or not st.peak_evidence:
            # the worst hit: a critical one (an uncorrectable error) before any higher score
            # (a corrected-error rate), then the highest score
            st.peak, st.peak_critical, st.peak_time = score, critical, t
            st.peak_evidence = e
        if st.incident is not None:
            st.incident.severity = "critical" if st.critical else st.incident.severity
            st.stale = True

    def _sync(self, st: _State) -> None:
        """Bring the incident's evidence up to date with the state's hits."""
        if st.stale and st.incident is not None:
            st.incident.evidence.update(self._evidence(st))
            st.incident.summary = summary_line(st.incident)
        st.stale = False

    def _evidence(self, st: _State) -> dict:
        return {
            "hits": st.hits,
            "last_hit": _iso(st.last_hit),
            "first": _stamped(st.first_evidence, st.first_time, st.first_critical),
            "peak": _stamped(st.peak_evidence, st.peak_time, st.peak_critical),
            "peak_score": None if not np.isfinite(st.peak) else round(st.peak, 3),
        }

    def _open(self, st: _State, reg: Registry, rack_names: list[str]) -> Record:
        kind, host, gpu, link, rack = st.key
        if host >= 0:
            hname = reg.hosts[host]
            rname = reg.host_rack[host]
            cluster = reg.host_cluster[host]
        else:
            hname, cluster = None, None
            rname = rack_names[rack] if 0 <= rack < len(rack_names) else None
            if rname is not None:
                cluster = next(
                    (c for r, c in zip(reg.host_rack, reg.host_cluster, strict=True) if r == rname), None
                )
        gidx = reg.gpu_index[gpu] if gpu >= 0 else None
        lno = link if link >= 0 else None
        rec = Record(
            kind=kind,
            host=hname,
            gpu=gidx,
            link=lno,
            start=min(st.run_start, st.began),
            end=None,
            severity="critical" if st.critical else kind_severity(kind),  # as the detector's hits say
            cluster=cluster,
            rack=rname,
        )
        rec.id = incident_id(rec)
        rec.evidence = {
            "signals": sorted(
                {s for e in (st.first_evidence, st.peak_evidence) for s in e.get("signals", [])}
            ),
            "thresholds": {k: v for k, v in self.params.get(kind, {}).items() if not isinstance(v, list)},
        }
        rec.evidence.update(self._evidence(st))
        if st.key in self._late:
            rec.evidence["arrived_late"] = True  # found in data that landed behind the analysis
            if self._late[st.key]:
                rec.evidence["peers"] = "none held: judged without peers"
        rec.summary = summary_line(rec)
        self._consolidate(rec, st)
        return rec

    def _consolidate(self, rec: Record, st: _State) -> None:
        """A wider incident absorbs narrower ones of its kind that began shortly before it."""
        kind = rec.kind
        if rec.gpu is not None or rec.link is not None:
            return  # only node (gpu = null) and rack (host = null) incidents are wider than others
        for other in list(self.states.values()):
            inc = other.incident
            if other is st or inc is None or other.kind != kind:
                continue
            inside = (rec.host is not None and inc.host == rec.host and inc.gpu is not None) or (
                rec.host is None and rec.rack is not None and inc.rack == rec.rack and inc.host is not None
            )
            if inside and inc.start >= rec.start - self.absorb_seconds:
                self._sync(other)
                rec.start = min(rec.start, inc.start)
                rec.evidence.setdefault("absorbed", []).append(inc.id)
                inc.end = other.last_hit
                self.absorbed.append(inc)
                other.incident = None
                other.run_hits = 0
        rec.id = incident_id(rec)

    def _quiet(self, st: _State, t: float) -> float:
        """How long an incident has been quiet at ``t``: since its last hit, less the stretches its
        host sent no rows (a node cut off whose live rows land before its backlog: its silence is
        no sign the fault has gone, and batch, which has those rows, keeps one incident). Never
        more than ``t - last_hit``: asked only where that alone would resolve it."""
        q = t - st.last_hit
        for a, b in self.host_gaps.get(st.key[1], ()) if q > 0 else ():
            q -= max(0.0, min(b, t) - max(a, st.last_hit))
        return q

    def _close(self, st: _State) -> None:
        self._sync(st)
        inc = st.incident
        inc.end = st.last_hit
        self.closed.append(inc)
        st.incident = None
        st.run_hits = 0

    def advance(self, watermark: float) -> None:
        """Data time has reached ``watermark``: resolve what has been quiet long enough."""
        self.watermark = max(self.watermark, watermark)
        # wider scopes first (rack, node, then GPU), so a node incident is there to absorb its GPUs
        for key in sorted(self.pending, key=lambda k: (k[1] != -1, k[2] != -1)):
            if self._pending_first[key] > self.watermark:
                continue  # none of its hits is due yet
            items = self.pending[key]
            ready = [x for x in items if x[0] <= self.watermark]
            if len(ready) == len(items):
                del self.pending[key]
                del self._pending_first[key]
            else:
                self.pending[key] = [x for x in items if x[0] > self.watermark]
                self._pending_first[key] = min(x[0] for x in self.pending[key])
            if ready:
                self._run(key, ready)
        # per host as floats, read once (a numpy scalar per incident state costs more than the loop)
        hp = self.host_progress.tolist() if self.host_progress is not None else []
        for st in self.states.values():
            wm = min(self.watermark, self.progress.get(st.kind, self.watermark))
            h = st.key[1]
            if 0 <= h < len(hp) and math.isfinite(hp[h]):
                wm = min(wm, max(hp[h], wm - self.host_bound))
            if st.incident is not None:
                resolve = float(self.params.get(st.kind, {}).get("resolve_seconds", 900.0))
                if wm - st.last_hit > resolve and self._quiet(st, wm) > resolve:
                    self._close(st)
            elif st.run_hits and wm - st.last_hit > float(
                self.params.get(st.kind, {}).get("gap_seconds", 60.0)
            ):
                _drop(st)

    # ------------------------------------------------------------------ output
    def open_incidents(self) -> list[Record]:
        out = []
        for st in self.states.values():
            if st.incident is not None:
                self._sync(st)
                out.append(st.incident)
        return out

    def incidents(self) -> list[Record]:
        """Every incident so far (closed and open), folds applied, sorted by start."""
        out = self._folded(self.closed + self.open_incidents())
        return sorted(out, key=lambda r: (r.start, r.kind, r.host or "", r.gpu or -1, r.link or -1))

    def _folded(self, recs: list[Record]) -> list[Record]:
        if not self.fold:
            return recs
        keep = []
        for r in recs:
            hosts = self.fold.get(r.kind)
            if hosts:
                cover = [o for o in recs if o.kind in hosts and _covers(o, r)]
                if cover:
                    target = min(cover, key=lambda o: o.start)
                    impact = target.evidence.setdefault("impact", [])
                    if all(x.get("id") != r.id for x in impact):
                        impact.append({"kind": r.kind, "start": _iso(r.start), "id": r.id})
                    if target.impact_at is None or r.start < target.impact_at:
                        target.impact_at = r.start
                    if r.id not in self._folded_ids:
                        # online, a page already sent for it resolves into the wider incident
                        self._folded_ids.add(r.id)
                        self.absorbed.append(replace(r, end=r.end if r.end is not None else r.start))
                    continue
            keep.append(r)
        return keep


def _stamped(e: dict, t: float, critical: bool) -> dict:
    """A hit's evidence with its time (and ``critical: True`` for a critical hit)."""
    if not e:
        return e
    out = {**e, "time": _iso(t)}
    if critical:
        out["critical"] = True
    return out


def summary_line(r: Record) -> str:
    """The incident's technical line: where, what, and :func:`evidence_line`."""
    where = r.host or (f"rack {r.rack}" if r.rack else "fleet")
    if r.gpu is not None:
        where += f" GPU {r.gpu}"
    elif r.host:
        where += " (node: several GPUs)"
    if r.link is not None:
        where += f" link {r.link}"
    line = evidence_line(r.evidence)
    return f"{where}: {kind_summary(r.kind)}" + (f" ({line})" if line else "")


def _evidence_candidates(items: list, gap: float) -> set[int]:
    """Indexes of the hits (ti, score, crit, i, began, sustain) of one key and batch that can be a
    run's first (the first after a gap) or its peak at some moment (a new worst since the gap: a
    critical hit outranks any score): the others' evidence is never read."""
    keep: set[int] = set()
    last, best = -np.inf, (False, -np.inf)
    for ti, score, crit, i, _b, sus in sorted(items, key=lambda x: x[0]):
        if sus:
            continue
        if ti - last > gap:
            keep.add(i)
            best = (False, -np.inf)
        if (crit, score) > best:
            keep.add(i)
            best = (crit, score)
        last = max(last, ti)
    return keep


def _covers(o: Record, r: Record) -> bool:
    """Does incident ``o`` (its time span and scope) cover incident ``r``? In time: ``r`` began
    within 30 min of ``o``'s span, or was still going (or ended within 30 min) when ``o`` began
    (a GPU throttling since before its cooling fault was found: that fault's impact, one page)."""
    if o.end is not None and o.end + 1800 < r.start:
        return False
    if o.start > r.start + 1800 and r.end is not None and r.end + 1800 < o.start:
        return False
    if o.host is None:
        return o.rack is not None and o.rack == r.rack
    if o.host != r.host:
        return False
    return o.gpu is None or o.gpu == r.gpu


def incident_id(r: Record) -> str:
    key = f"{r.kind}|{r.cluster}|{r.rack}|{r.host}|{r.gpu}|{r.link}|{int(r.start)}"
    return hashlib.sha1(key.encode()).hexdigest()[:16]


def _iso(t: float):
    from gpufleet.records import to_rfc3339

    return to_rfc3339(round(t, 3)) if np.isfinite(t) else None
