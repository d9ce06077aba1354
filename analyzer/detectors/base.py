"""The detector contract, scikit-learn style.

``__init__`` only stores parameters (the config's ``[detectors.NAME]`` table); ``fit(window)``
learns from a window and returns ``self`` (learned state ends in ``_``; detectors are fitted
window after window, so learning is incremental); ``score(window)`` gives one number per row
of the detector's table, higher = more abnormal, NaN where it cannot judge; ``detect(window)``
turns scores into :class:`Hits` with the configured thresholds. Dwell, persistence and
merging into incidents are the engine's (``gpufleet.analyzer.engine``), driven by the same parameters.

A detector declares its own facts on its class, and every other place derives them from the
registry (``gpufleet.analyzer.detectors.REGISTRY``): ``kind``; ``params`` (the ``[detectors.KIND]`` keys with
their defaults: ``gpufleet.analyzer.config``'s defaults); ``context`` (parameters the analyzer sets from its
own configuration); ``tables`` (the streams whose windows it analyses); ``fields`` (per measurement,
the fields it reads: the parser's field list, ``gpufleet.analyzer.pipeline.fields``); ``summary`` and
``severity`` (the incident's words and severity unless a hit is critical: ``gpufleet.analyzer.engine``);
``panels`` (the signals its incident page plots: ``gpufleet.analyzer.alerting.pages``).
"""

from __future__ import annotations

import copy
import math
from bisect import bisect_right
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np
from gpufleet.analyzer.frame import Table, Window, nan_to_zero
from gpufleet.analyzer.groupby import buckets, distinct_count, latest_at, member, raise_latest


class Evidence(Sequence):
    """Evidence per hit, each dict built when it is read: a detector may hit thousands of rows of
    a window, the engine keeps a run's first and peak hit. ``make(row)`` must depend only on what
    the window computed (arrays that are not modified afterwards)."""

    def __init__(self, make: Callable[[int], dict], rows: list[int]):
        self.make, self.rows = make, rows

    def __len__(self):
        return len(self.rows)

    def __getitem__(self, i):
        if isinstance(i, slice):
            return [self[j] for j in range(*i.indices(len(self)))]
        return self.make(self.rows[i])


class _Chain(Sequence):
    """Several evidence sequences read as one."""

    def __init__(self, parts: list[Sequence]):
        self.parts = parts
        self.starts = np.cumsum([0] + [len(p) for p in parts]).tolist()

    def __len__(self):
        return self.starts[-1]

    def __getitem__(self, i):
        if isinstance(i, slice):
            return [self[j] for j in range(*i.indices(len(self)))]
        if i < 0:
            i += len(self)
        if not 0 <= i < len(self):
            raise IndexError(i)
        k = bisect_right(self.starts, i) - 1
        return self.parts[k][i - self.starts[k]]


@dataclass
class Hits:
    """Rows where a detector's condition holds. ``gpu``/``link``: -1 = not that scope."""

    kind: str
    host: np.ndarray  # host id (Registry.hosts)
    gpu: np.ndarray  # GPU id (Registry) or -1 (node/rack scope)
    link: np.ndarray  # link number or -1
    t: np.ndarray
    score: np.ndarray
    critical: np.ndarray  # bool per hit
    evidence: Sequence[dict] = field(default_factory=list)  # one per hit (list or Evidence), or empty
    rack: np.ndarray | None = None  # rack id per hit for rack scope (host = -1)
    began: np.ndarray | None = None  # per hit: when the condition behind it began (<= t), if known
    # per hit: True = only holds an open incident open (the fault is still there but cannot show,
    # e.g. a GPU with failed cooling sitting idle); it never opens one and is no evidence
    sustain: np.ndarray | None = None

    def __len__(self):
        return len(self.t)

    @classmethod
    def none(cls, kind: str) -> Hits:
        z = np.zeros(0, np.int64)
        return cls(kind, z, z, z, np.zeros(0), np.zeros(0), np.zeros(0, bool))

    @classmethod
    def of_racks(cls, kind: str, rack: np.ndarray, t: np.ndarray, score: np.ndarray, evidence: Sequence[dict],
                 began: np.ndarray | None = None) -> Hits:
        """Rack-scope hits (no host, GPU or link), never critical."""
        n = len(t)
        none = np.full(n, -1, np.int64)
        return cls(kind, none, none, none, t, score, np.zeros(n, bool), evidence, rack, began)


class Detector:
    """Base class: parameter handling and the default fit (nothing to learn)."""

    kind = "base"
    # the [detectors.KIND] parameters and their defaults (the one place they are written)
    params: dict[str, object] = {}
    # parameters set from the analyzer's own configuration (name -> default), not [detectors.KIND] keys
    context: dict[str, object] = {}
    tables: tuple[str, ...] = ("gpu",)  # the streams (measurements) whose windows this detector analyses
    # per measurement, the fields it reads (each one parsed, and in gpufleet/catalogue.toml)
    fields: dict[str, tuple[str, ...]] = {}
    summary = ""  # what its incident means, in words (after "WHERE: ")
    severity = "warning"  # an incident's severity unless one of its hits is critical
    # judges a GPU against its peers' rows of the same time (a late window with none held says so)
    peers = False
    # reads other hosts' rows of its window itself (peer medians, job peers): a late host's window
    # then holds the peers' rows of that time; without it (a GPU judged against its own rows and
    # what fit() learned on time) a late window's table is the late hosts' rows alone
    peer_rows = True
    # fit() on a late host's windows too (its learning is per entity and order-free); otherwise
    # a late window is scored against what was learned so far
    fit_late = False
    # its incident page's panels: (measurement, field, label, "value" | "rate" | "share")
    panels: tuple[tuple[str, str, str, str], ...] = (
        ("gpu", "utilization_gpu_ratio", "GPU utilization", "value"),
        ("gpu", "clock_sm_mhz", "SM clock (MHz)", "value"),
        ("gpu", "power_watts", "Power (W)", "value"),
        ("gpu", "temperature_gpu_celsius", "GPU temperature (°C)", "value"),
    )

    def __init__(self, **params):
        """Store the parameters: each declared default, overridden by ``params``."""
        cls = type(self)
        unknown = set(params) - set(cls.params) - set(cls.context)
        if unknown:
            raise TypeError(f"{cls.__name__}: unknown parameter(s) {', '.join(sorted(unknown))}")
        for k, v in {**cls.params, **cls.context, **params}.items():
            setattr(self, k, copy.deepcopy(v))

    def get_params(self) -> dict:
        return {k: getattr(self, k) for k in {**type(self).params, **type(self).context}}

    def warm(self) -> None:
        """Load what the detector imports lazily (online modes call it at start, so the first
        window that needs it is not delayed); by default what numpy loads on a first quantile or
        median (``numpy.ma``), which most detectors take."""
        import numpy.ma  # noqa: F401

    def fit(self, window: Window) -> Detector:
        self.n_windows_ = getattr(self, "n_windows_", 0) + 1
        return self

    def score(self, window: Window) -> np.ndarray:
        raise NotImplementedError

    def detect(self, window: Window) -> Hits:
        raise NotImplementedError

    # helpers ---------------------------------------------------------------
    def trailing_sum(self, window: Window, tab: Table, name: str, v: np.ndarray, seconds: float,
                     rows: np.ndarray | None = None) -> np.ndarray:
        """Per row of ``tab`` (at ``rows`` only, where given): the sum of ``v`` (>= 0: a counter's
        increases) over the entity's trailing ``seconds`` (inclusive), whatever the window's size
        and context. A span longer than the context reaches rows analysed in earlier windows: each
        counts with the value it had when it was new, kept here (only the nonzero ones, mostly
        none) while the entity's next rows in time can reach it. A host's backlog analysed after
        its newer rows may find its older rows gone: never less than the table's own sum then (as
        before this was kept). ``v`` is taken on the table's new rows; the same ``name`` reads the
        same ``v`` within a window."""
        past = window.once(self, ("trailing", name), lambda: self._trail(window, tab, name, v, seconds))
        table = tab.rolling_sum(v, seconds, rows)
        if past is None:
            return table
        ent, t = (tab.ent, tab.t) if rows is None else (tab.ent[rows], tab.t[rows])
        add = past.sum(ent, t - seconds, t)
        at = np.flatnonzero(add)  # (the rows whose span reaches a kept past row: mostly none)
        if not len(at):
            return table
        own = tab.rolling_sum(np.where(tab.in_window(), v, 0.0), seconds, at if rows is None else rows[at])
        table[at] = np.maximum(table[at], own + add[at])
        return table

    def _trail(self, window: Window, tab: Table, name: str, v: np.ndarray, seconds: float) -> _Past | None:
        """What earlier windows left of ``name`` (the past rows ``trailing_sum`` adds), then this
        window's new nonzero rows kept; an entity's rows older than its newest new row here by more
        than ``seconds`` are let go (its next rows in time cannot reach them)."""
        trails = self.__dict__.setdefault("trails_", {})
        ent, t, x = trails.get(name) or (np.zeros(0, np.int64), np.zeros(0), np.zeros(0))
        past = _Past(ent, t, x) if len(ent) else None
        new = window.fresh(tab)  # (a late window's peers' rows: kept when they were analysed)
        add = new & np.isfinite(v) & (v != 0)
        ent, t, x = (np.concatenate([a, b]) for a, b in ((ent, tab.ent[add]), (t, tab.t[add]), (x, v[add])))
        latest = tab.cached(("latest new",), lambda: raise_latest(np.zeros(0), tab.ent[new], tab.t[new]))
        keep = t > latest_at(latest, ent) - seconds
        trails[name] = (ent[keep], t[keep], x[keep])
        return past

    def _hold(self, window: Window, tab: Table, hot: np.ndarray, judged: np.ndarray, scopes) -> Hits:
        """Keep an incident open while its fault cannot show. Some faults show only under load (a
        GPU with failed cooling runs a few degrees warm at 80 W; a throttling or slow GPU is neither
        once its job ends): an incident resolved while the GPU idles would page again at its next
        job. A key (a GPU, a node) that hit stays latched until it has been ``judged`` (seen where
        its fault would show) without a hit for ``clear_seconds`` in a row; meanwhile its unjudged
        rows are sustain hits, one per key and minute, which hold an open incident open and never
        open one.

        ``hot``: rows that hit (this window's new rows); ``scopes``: (scope, key per row, rows that
        hit at that scope) with scope "gpu" (key: the GPU), "node" (key: the row's node) or "link"
        (a link table; key: the link).
        """
        new = window.fresh(tab)  # (a late window's peers' rows: their latches moved in time)
        parts = []
        for scope, keys, rows in scopes:
            latch = self.__dict__.setdefault(f"latch_{scope}_", {})  # key -> start of its quiet run
            if rows.any():
                for k in np.unique(keys[rows]).tolist():
                    latch[k] = None
            if not latch:
                continue
            # cleared: judged without a hit, continuously, for clear_seconds (this window's rows
            # continue the run the previous windows left in the latch)
            quiet = judged & ~hot
            latched = member(keys, latch)
            n_latched = len(latch)
            sel = np.flatnonzero(new & latched)
            if len(sel):
                # the latched keys' rows, per key in time order (row order breaking ties): the
                # table's own order where the keys are its entities
                if keys is not tab.ent:
                    sel = sel[np.lexsort((tab.t[sel], keys[sel]))]
                ks, ts, q = keys[sel], tab.t[sel], quiet[sel]
                first = np.flatnonzero(np.concatenate([[True], ks[1:] != ks[:-1]]))
                last = np.append(first[1:], len(ks)) - 1
                # per key: its last row that was not quiet (-1: none); every row after it is quiet
                broken = np.maximum.reduceat(np.where(q, -1, np.arange(len(ks))), first)
                for k, b, f, e in zip(ks[first].tolist(), broken.tolist(), first.tolist(), last.tolist(),
                                      strict=True):
                    start = latch[k]
                    if b >= 0:
                        start = float(ts[b + 1]) if b < e else None
                    elif start is None:
                        start = float(ts[f])
                    if start is not None and float(ts[e]) - start >= self.clear_seconds:
                        del latch[k]
                    else:
                        latch[k] = start
            if len(latch) < n_latched:  # keys cleared above
                latched = member(keys, latch)
            idx = np.flatnonzero(new & ~judged & ~hot & latched)
            if not len(idx):
                continue
            grp = keys[idx] * 10**7 + np.floor(tab.t[idx] / 60).astype(np.int64)
            idx = idx[np.unique(grp, return_index=True)[1]]
            z = np.zeros(len(idx))
            gpu, link = tab.ent[idx], np.full(len(idx), -1)
            if scope == "link":
                link_gpu, link_no = window.reg.link_arrays()
                gpu, link = link_gpu[gpu], link_no[gpu]
            node = window.node_of[gpu]
            if scope == "node":
                gpu = np.full(len(idx), -1)
            parts.append(
                Hits(
                    self.kind,
                    node,
                    gpu,
                    link,
                    tab.t[idx],
                    z,
                    z.astype(bool),
                    sustain=np.ones(len(idx), bool),
                )
            )
        return concat(self.kind, parts)

    def _gpu_hits(
        self,
        window: Window,
        tab: Table,
        mask: np.ndarray,
        score: np.ndarray | Callable[[], np.ndarray],
        critical: np.ndarray | bool = False,
        evidence=None,
        ent_is_link: bool = False,
    ) -> Hits:
        mask = mask & tab.in_window()
        idx = np.flatnonzero(mask)
        if not len(idx):
            return Hits.none(self.kind)
        reg = window.reg
        if ent_is_link:
            link_gpu, link_no = reg.link_arrays()
            gids, links = link_gpu[tab.ent[idx]], link_no[tab.ent[idx]]
        else:
            gids = tab.ent[idx]
            links = np.full(len(idx), -1, np.int64)
        hosts = np.array([reg.gpu_node[g] for g in gids.tolist()], np.int64)
        crit = np.broadcast_to(np.asarray(critical), mask.shape)[idx].astype(bool)
        ev = Evidence(evidence, idx.tolist()) if evidence is not None else []
        if callable(score):  # the scores, computed only when a row hits
            score = score()
        return Hits(self.kind, hosts, gids, links, tab.t[idx], np.asarray(score, float)[idx], crit, ev)


class _Past:
    """Rows of earlier windows (entity, time, value), searchable by entity and time span."""

    def __init__(self, ent: np.ndarray, t: np.ndarray, x: np.ndarray):
        self.ents = np.unique(ent)
        self.base = float(t.min())
        self.width = float(t.max()) - self.base + 2.0  # each entity's times in a block of its own
        key = self._key(ent, t)
        order = np.argsort(key, kind="stable")
        self.key = key[order]
        self.csum = np.concatenate([[0.0], np.cumsum(x[order])])

    def _key(self, ent: np.ndarray, t: np.ndarray) -> np.ndarray:
        rank = np.searchsorted(self.ents, ent)
        return rank * self.width + np.clip(t - self.base, -0.5, self.width - 1.5)

    def sum(self, ent: np.ndarray, lo: np.ndarray, hi: np.ndarray) -> np.ndarray:
        """Per query: the values of ``ent``'s rows with ``lo <= t <= hi``."""
        known = np.isin(ent, self.ents)
        a = np.searchsorted(self.key, self._key(ent, lo), side="left")
        b = np.searchsorted(self.key, self._key(ent, hi), side="right")
        return np.where(known, self.csum[b] - self.csum[a], 0.0)


# a fleet's background rate (fit): exponentially weighted over time, this time constant (s); a
# 5-minute window weighs 0.1, ten 30 s windows as much, so what it learns does not depend on the
# window size (online windows are a poll long, batch ones five minutes)
RATE_TAU = 300.0 / math.log(10 / 9)


def time_weighted(prev: float | None, value: float, window: Window) -> float:
    """``value``, measured over ``window``, into the mean ``prev`` (``value`` where none yet),
    weighed by the window's length against ``RATE_TAU``."""
    if prev is None:
        return value
    a = 1.0 - math.exp(-max(window.end - window.start, 0.0) / RATE_TAU)
    return (1.0 - a) * prev + a * value


def share(tab: Table, counter: str) -> np.ndarray:
    """Share of the time between polls a nanosecond counter accumulated (0..1, NaN unknown)."""
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.clip(tab.delta(counter) / (tab.dt() * 1e9), 0, 1)


def rounded(x) -> float | None:
    """An evidence value: ``x`` to 2 decimals, None where it is not a finite number."""
    x = float(x)
    return round(x, 2) if math.isfinite(x) else None


def nz(v: np.ndarray) -> np.ndarray:
    """NaN -> 0 for flags and counts (``np.nan_to_num``; a new array)."""
    return nan_to_zero(v)


def nan_as_zero_gt(v: np.ndarray, c) -> np.ndarray:
    """``nz(v) > c`` without the copy: the same where ``c >= 0`` (NaN, as 0, is not above it;
    ±inf compare as the largest floats do)."""
    if (np.asarray(c) >= 0).all():
        return v > c
    return nz(v) > c


def nan_as_zero_ge(v: np.ndarray, c) -> np.ndarray:
    """``nz(v) >= c`` without the copy: the same where ``0 < c < inf``."""
    c_ = np.asarray(c)
    if ((c_ > 0) & (c_ < np.inf)).all():
        return v >= c
    return nz(v) >= c


def concat(kind: str, parts: list[Hits]) -> Hits:
    parts = [p for p in parts if len(p)]
    if not parts:
        return Hits.none(kind)
    if len(parts) == 1:
        return parts[0]
    ev = _Chain([p.evidence if p.evidence else [{}] * len(p) for p in parts])
    racks = None
    if any(p.rack is not None for p in parts):
        racks = np.concatenate([p.rack if p.rack is not None else np.full(len(p), -1) for p in parts])
    began = None
    if any(p.began is not None for p in parts):
        began = np.concatenate([p.began if p.began is not None else p.t for p in parts])
    sustain = None
    if any(p.sustain is not None for p in parts):
        sustain = np.concatenate(
            [p.sustain if p.sustain is not None else np.zeros(len(p), bool) for p in parts]
        )
    return Hits(
        kind,
        *(
            np.concatenate([getattr(p, f) for p in parts])
            for f in ("host", "gpu", "link", "t", "score", "critical")
        ),
        ev,
        racks,
        began,
        sustain,
    )


def node_together(window, tab, hot: np.ndarray, seen: np.ndarray, min_share: float, min_gpus: int):
    """Rows of ``hot`` whose node had at least ``min_share`` of its GPUs seen in the same minute (and
    ``min_gpus``) hot together: a fault of the node (its PSU, its fans), not of one GPU. Returns
    (row mask, hot GPUs per row's node-minute)."""
    if not hot.any():
        return np.zeros(len(hot), bool), np.zeros(len(hot), np.int64)
    node = window.node_of[tab.ent]
    inv, ng = buckets(tab.t, 60.0, node)
    hot_g = distinct_count(inv, tab.ent, hot, ng)
    seen_g = distinct_count(inv, tab.ent, seen, ng)
    together = (hot_g >= min_gpus) & (hot_g >= min_share * np.maximum(seen_g, 1))
    return together[inv] & hot, hot_g[inv]


def node_scope_hits(hits: Hits, window, min_share: float, min_gpus: int) -> Hits:
    """Hits of at least ``min_share`` of a node's GPUs (and ``min_gpus``) in the same minute become the
    node's (gpu = -1): a fault of the node (every GPU falling off the bus at once is its PCIe
    switch or its power, not eight GPUs), one page listing them in its evidence."""
    if len(hits) < max(min_gpus, 1):
        return hits
    minute = np.floor(np.asarray(hits.t, float) / 60).astype(np.int64)
    key = hits.host.astype(np.int64) * 10**9 + minute
    u, inv = np.unique(key, return_inverse=True)
    n_hit = distinct_count(inv, hits.gpu, hits.gpu >= 0, len(u))
    per_node = np.bincount(window.node_of, minlength=int(hits.host.max()) + 1)
    need = np.maximum(min_gpus, np.ceil(min_share * per_node[hits.host]))
    wide = (n_hit[inv] >= need) & (hits.gpu >= 0)
    if not wide.any():
        return hits
    gidx = window.reg.gpu_index
    names: dict[int, list] = {}
    for k, g in zip(inv[wide].tolist(), hits.gpu[wide].tolist(), strict=True):
        names.setdefault(k, set()).add(gidx[g])
    ev = hits.evidence
    inv_l = inv.tolist()

    def evidence(i):
        d = dict(ev[i]) if ev else {}
        if wide[i]:
            d["scope"] = "node"
            d["gpus"] = sorted(names[inv_l[i]])
        return d

    out = Hits(
        hits.kind,
        hits.host,
        np.where(wide, -1, hits.gpu),
        hits.link,
        hits.t,
        hits.score,
        hits.critical,
        Evidence(evidence, list(range(len(hits)))),
        hits.rack,
        hits.began,
        hits.sustain,
    )
    return out
