"""Windows of parsed telemetry, as the detectors see them.

Rows of each measurement are mapped to stable entity ids (a GPU is ``(host, gpu)``, a link
``(host, gpu, link)``), sorted by entity and time, de-duplicated (the last copy of a point
wins) and held as float columns where NaN means absent. A :class:`Window` carries the rows
of ``[start, end)`` plus a little context before ``start`` (for counter deltas and smoothing);
detectors report only on rows with ``new`` set.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from gpufleet.analyzer.groupby import dense_inverse, group_median, member
from gpufleet.analyzer.parse import Rows, SeriesIndex


class Registry:
    """Stable ids for GPUs, links and hosts across windows, with their labels."""

    def __init__(self):
        self.gpu_ids: dict[tuple[str, str], int] = {}
        self.gpu_host: list[str] = []
        self.gpu_index: list[int | None] = []
        self.gpu_node: list[int] = []
        self.gpu_model: list[str | None] = []
        self.host_ids: dict[str, int] = {}
        self.hosts: list[str] = []
        self.host_rack: list[str | None] = []
        self.host_cluster: list[str | None] = []
        self.link_ids: dict[tuple[str, str, str], int] = {}
        self.link_gpu: list[int] = []
        self.link_no: list[int | None] = []
        self._sid_gpu: dict[int, int] = {}
        self._sid_link: dict[int, int] = {}
        self._sid_host: dict[int, int] = {}
        self._sid_table: dict[str, np.ndarray] = {}  # kind -> entity id per series id (-1: unknown)
        self._link_arrays = (np.zeros(0, np.int64), np.zeros(0, np.int64))

    def host(self, tags: dict) -> int:
        h = tags.get("host", "")
        i = self.host_ids.get(h)
        if i is None:
            i = self.host_ids[h] = len(self.hosts)
            self.hosts.append(h)
            self.host_rack.append(tags.get("rack"))
            self.host_cluster.append(tags.get("cluster"))
        else:
            if self.host_rack[i] is None and tags.get("rack"):
                self.host_rack[i] = tags["rack"]
            if self.host_cluster[i] is None and tags.get("cluster"):
                self.host_cluster[i] = tags["cluster"]
        return i

    def gpu(self, tags: dict) -> int:
        key = (tags.get("host", ""), tags.get("gpu", ""))
        i = self.gpu_ids.get(key)
        if i is None:
            i = self.gpu_ids[key] = len(self.gpu_host)
            self.gpu_host.append(key[0])
            self.gpu_index.append(_int(key[1]))
            self.gpu_node.append(self.host(tags))
            self.gpu_model.append(tags.get("model"))
        else:
            self.host(tags)
        return i

    def link(self, tags: dict) -> int:
        key = (tags.get("host", ""), tags.get("gpu", ""), tags.get("link", ""))
        i = self.link_ids.get(key)
        if i is None:
            i = self.link_ids[key] = len(self.link_gpu)
            self.link_gpu.append(self.gpu(tags))
            self.link_no.append(_int(key[2]))
        return i

    def entity(self, rows: Rows, series: SeriesIndex, kind: str) -> np.ndarray:
        """Entity id per row: kind 'gpu', 'link' or 'host'."""
        cache, fn = {
            "gpu": (self._sid_gpu, self.gpu),
            "link": (self._sid_link, self.link),
            "host": (self._sid_host, self.host),
        }[kind]
        table = self._sid_table.get(kind)
        sids = rows.sid
        if table is not None and len(sids) and len(table) > int(sids.max()):
            # every series seen before: one table look-up per row
            ids = table[sids]
            if (ids >= 0).all():
                return ids
        u, inv = np.unique(sids, return_inverse=True)
        ids = np.empty(len(u), np.int64)
        for j, s in enumerate(u.tolist()):
            e = cache.get(s)
            if e is None:
                e = cache[s] = fn(series.tags[s])
            ids[j] = e
        if len(u):
            n = max(int(u[-1]) + 1, len(table) if table is not None else 0)
            new = np.full(n, -1, np.int64)
            if table is not None:
                new[: len(table)] = table
            new[u] = ids
            self._sid_table[kind] = new
        return ids[inv]

    def arrays(self):
        """(gpu -> node id, gpu -> rack id) as arrays, racks numbered in first-seen order."""
        racks: dict = {}
        for r in self.host_rack:
            if r is not None:
                racks.setdefault(r, len(racks))
        # a host without a rack label is a rack of its own (never merged with other unlabelled hosts)
        host_rack = np.array(
            [racks[r] if r is not None else 10**6 + i for i, r in enumerate(self.host_rack)], np.int64
        )
        node = self.node_array()
        return node, host_rack[node] if len(node) else node

    def node_array(self) -> np.ndarray:
        """GPU id -> its node's id, as an array (GPUs are only ever added, never moved)."""
        cache = getattr(self, "_node_array", None)
        if cache is None or len(cache) != len(self.gpu_node):
            cache = self._node_array = np.array(self.gpu_node, np.int64).reshape(-1)
            cache.flags.writeable = False
        return cache

    def model_ids(self) -> np.ndarray:
        """GPU id -> its model's number (models numbered in first-seen order; GPUs reporting no
        model share one number): the peer groups of detectors that compare GPUs."""
        cache = getattr(self, "_model_ids", None)
        if cache is None or len(cache) != len(self.gpu_model):
            names: dict = {}
            for m in self.gpu_model:
                names.setdefault(m, len(names))
            self._model_names = list(names)
            cache = self._model_ids = np.array([names[m] for m in self.gpu_model], np.int64).reshape(-1)
        return cache

    def model_name(self, mid: int) -> str | None:
        """The model tag of model number ``mid`` (:meth:`model_ids`)."""
        self.model_ids()
        return self._model_names[mid] if 0 <= mid < len(self._model_names) else None

    def link_arrays(self) -> tuple[np.ndarray, np.ndarray]:
        """(link -> GPU id, link -> link number or -1) as arrays."""
        if len(self._link_arrays[0]) != len(self.link_gpu):
            self._link_arrays = (
                np.array(self.link_gpu, np.int64).reshape(-1),
                np.array([-1 if x is None else x for x in self.link_no], np.int64).reshape(-1),
            )
        return self._link_arrays

    def labels(self, gid: int) -> dict:
        h = self.gpu_node[gid]
        return {
            "host": self.gpu_host[gid],
            "gpu": self.gpu_index[gid],
            "rack": self.host_rack[h],
            "cluster": self.host_cluster[h],
        }


def _int(s):
    try:
        return int(s)
    except (TypeError, ValueError):
        return None


GAP_POLLS = 3.0  # a step longer than this many of the entity's median poll interval is a gap
GAP_MIN_STEPS = 4  # steps an entity needs in a table for its own median (else the table's)


@dataclass
class Table:
    """Rows of one measurement for one window, sorted by (entity, time), duplicates removed.

    A table is read-only once built: what the detectors derive from it (counter deltas,
    forward fills, rolling spans) is computed once per table and shared, as read-only arrays.
    """

    ent: np.ndarray
    t: np.ndarray  # seconds since the epoch
    cols: dict[str, np.ndarray] = field(default_factory=dict)
    text: dict[str, np.ndarray] = field(default_factory=dict)
    new: np.ndarray | None = None  # rows inside the window proper
    _memo: dict = field(default_factory=dict, init=False, repr=False, compare=False)

    @classmethod
    def build(cls, ent: np.ndarray, t_ns: np.ndarray, cols: dict, text: dict | None = None) -> Table:
        n = len(ent)
        if n > 1 and bool((t_ns[1:] >= t_ns[:-1]).all()):
            # rows already in time order (as files and exports are): a stable sort by entity keeps
            # each entity's rows in time order, arrival order breaking ties (as the lexsort below)
            small = int(ent.min()) >= 0 and int(ent.max()) < 2**16  # a 16-bit key sorts by radix
            order = np.argsort(ent.astype(np.uint16) if small else ent, kind="stable")
        else:
            order = np.lexsort((np.arange(n), t_ns, ent))
        ent, t_ns = ent.take(order), t_ns.take(order)
        keep = np.ones(len(ent), bool)
        if len(ent) > 1:
            keep[:-1] = (ent[1:] != ent[:-1]) | (t_ns[1:] != t_ns[:-1])  # last copy wins
        if keep.all():
            idx = order
        else:
            idx = order[keep]
            ent, t_ns = ent[keep], t_ns[keep]
        tab = cls(ent, t_ns / 1e9)
        # ndarray.take: the same rows as indexing, without indexing's per-call overhead
        tab.cols = {k: v.take(idx) for k, v in cols.items()}
        tab.text = {k: v.take(idx) for k, v in (text or {}).items()}
        return tab

    @classmethod
    def empty(cls) -> Table:
        return cls(np.zeros(0, np.int64), np.zeros(0))

    def __len__(self):
        return len(self.t)

    def subset(self, keep: np.ndarray) -> Table:
        """The rows ``keep`` in their order (a mask that keeps or drops each entity's rows whole:
        every per-entity feature is the same on them)."""
        tab = Table(self.ent[keep], self.t[keep], {k: v[keep] for k, v in self.cols.items()},
                    {k: v[keep] for k, v in self.text.items()})
        tab.new = None if self.new is None else self.new[keep]
        return tab

    def in_window(self) -> np.ndarray:
        """Rows inside the window proper (``new``); every row where the table has no context."""
        return self.new if self.new is not None else np.ones(len(self), bool)

    def cached(self, key, fn):
        """``fn()`` computed once per table and key; an array result is returned read-only."""
        v = self._memo.get(key)
        if v is None:
            v = fn()
            for a in v if isinstance(v, tuple) else (v,):
                if isinstance(a, np.ndarray):
                    a.flags.writeable = False
            self._memo[key] = v
        return v

    def col(self, name: str) -> np.ndarray:
        v = self.cols.get(name)
        if v is None:
            return self.cached(("nan",), lambda: np.full(len(self.t), np.nan))
        return v

    def first_of_entity(self) -> np.ndarray:
        return self.cached(("first",), self._first_of_entity)

    def _first_of_entity(self) -> np.ndarray:
        f = np.ones(len(self.ent), bool)
        if len(f) > 1:
            f[1:] = self.ent[1:] != self.ent[:-1]
        return f

    def entity_start(self) -> np.ndarray:
        """Per row: the index of its entity's first row."""
        return self.cached(
            ("entity_start",), lambda: _carry(np.where(self.first_of_entity(), np.arange(len(self)), 0))
        )

    def _first_rows(self) -> np.ndarray:
        """Indices of each entity's first row."""
        return self.cached(("first_rows",), lambda: np.flatnonzero(self.first_of_entity()))

    def prev(self, v: np.ndarray) -> np.ndarray:
        out = np.empty(len(v), dtype=float)
        if len(v):
            out[1:] = v[:-1]
            out[self._first_rows()] = np.nan
        return out

    def _step(self, v: np.ndarray) -> np.ndarray:
        """``v - prev(v)``: the change since the entity's previous row (NaN at its first row)."""
        out = np.empty(len(v), dtype=float)
        if len(v):
            np.subtract(v[1:], v[:-1], out=out[1:])
            out[self._first_rows()] = np.nan
        return out

    def dt(self) -> np.ndarray:
        """Seconds since the entity's previous row (NaN at its first row), gaps included."""
        return self.cached(("dt",), lambda: self._step(self.t))

    def gap(self) -> np.ndarray:
        """Per row: the seconds since the entity's previous row where that step spans a gap, NaN
        where the rows are adjacent (and at first rows).

        A step is a gap when it is longer than ``GAP_POLLS`` x the entity's own median poll
        interval in this table (the table's median over all entities where the entity has fewer
        than ``GAP_MIN_STEPS`` steps in it). A counter's change over a gap happened somewhere in
        it: :meth:`delta` is NaN there (no rate is averaged over an outage) and :meth:`increase`
        0 (its events are not the row's); ``increase(name, gaps=True)`` keeps them, for the
        detectors that page on any step (their evidence says ``over_gap_seconds``)."""
        return self.cached(("gap",), self._gap)

    def _gap(self) -> np.ndarray:
        dt = self.dt()
        out = np.full(len(dt), np.nan)
        # the table's poll: the median step, of an even sample of about 8k rows in a large table
        sample = dt[:: max(1, len(dt) // 8192)]
        sample = sample[sample > 0]
        if len(sample) < GAP_MIN_STEPS:
            return out
        bound = GAP_POLLS * float(np.partition(sample, len(sample) // 2)[len(sample) // 2])
        with np.errstate(invalid="ignore"):
            cand = np.flatnonzero(dt > bound)  # longer than a few of the table's polls: mostly none
        if not len(cand):
            return out
        # each candidate entity's own median step (a slower-polled entity is no gap at its poll)
        mine = np.flatnonzero(member(self.ent, set(self.ent[cand].tolist())) & (dt > 0))
        inv, k = dense_inverse(self.ent[mine])
        med, cnt = group_median(inv, dt[mine], k)
        own = np.where(cnt >= GAP_MIN_STEPS, GAP_POLLS * med, bound)[inv]
        rows = mine[dt[mine] > own]
        out[rows] = dt[rows]
        return out

    def over_gap(self) -> np.ndarray:
        """Rows whose step since the entity's previous row spans a gap (:meth:`gap`)."""
        return self.cached(("over_gap",), lambda: ~np.isnan(self.gap()))

    def _gap_rows(self) -> np.ndarray:
        """Indices of the rows after a gap (none, as a rule)."""
        return self.cached(("gap_rows",), lambda: np.flatnonzero(self.over_gap()))

    def delta(self, name: str) -> np.ndarray:
        """Counter increase since the entity's previous row; NaN at resets, rollovers and gaps."""
        return self.cached(("delta", name), lambda: self._delta(name))

    def increase(self, name: str, gaps: bool = False) -> np.ndarray:
        """:meth:`delta` with 0 where it is unknown (NaN): a counter's new events per row. With
        ``gaps``: the increase over a gap (:meth:`gap`) is kept, at the row after the gap."""
        return self.cached(("increase", name, gaps), lambda: self._increase(name, gaps))

    def _increase(self, name: str, gaps: bool = False) -> np.ndarray:
        d = self._step(self.col(name))
        d[~(d >= 0)] = 0.0  # unknown (NaN), resets and rollovers (negative)
        np.minimum(d, np.finfo(d.dtype).max, out=d)  # as nan_to_zero takes +inf
        if not gaps:
            d[self._gap_rows()] = 0.0
        return d

    def _delta(self, name: str) -> np.ndarray:
        d = self._step(self.col(name))
        d[d < 0] = np.nan
        d[self._gap_rows()] = np.nan
        return d

    def gap_rate(self, name: str) -> np.ndarray:
        """Per row after a gap: the counter's mean rate over the gap (its increase / the gap's
        seconds), NaN elsewhere. Never a measured rate: a lower bound of the peak rate somewhere
        in the gap, for a rule that pages when even that is above its bar (the evidence then says
        ``over_gap_seconds``, not a rate)."""
        return self.cached(("gap_rate", name), lambda: self._gap_rate(name))

    def _gap_rate(self, name: str) -> np.ndarray:
        out = np.full(len(self.t), np.nan)
        rows = self._gap_rows()
        if len(rows):
            out[rows] = self.increase(name, gaps=True)[rows] / self.gap()[rows]
        return out

    def spans_gap(self, later: np.ndarray, earlier: np.ndarray) -> np.ndarray:
        """Per pair of rows of one entity (``earlier`` < ``later``, as indices): whether a gap
        (:meth:`gap`) lies between them (a slow-tier counter read at some rows only)."""
        c = self.cached(("gap_count",), lambda: np.cumsum(self.over_gap()))
        return (c[later] - c[earlier]) > 0

    def ffill(self, name: str) -> np.ndarray:
        """Forward-fill a slow-tier column within each entity."""
        return self.cached(("ffill", name), lambda: self._ffill(name))

    def _ffill(self, name: str) -> np.ndarray:
        v = self.col(name)
        if not len(v):
            return v.copy()
        # reset the carry at each entity start: positions before the first valid value stay NaN
        idx = _carry(np.where(np.isnan(v), 0, np.arange(len(v))))
        return np.where(idx >= self.entity_start(), v[idx], np.nan)

    def ffill_codes(self, name: str) -> np.ndarray:
        """Forward-filled integer codes of a string column (equal strings, equal codes; -1 none)."""
        return self.cached(("ffill_codes", name), lambda: self._ffill_codes(name))

    def _ffill_codes(self, name: str) -> np.ndarray:
        v = self.text.get(name)
        if v is None:
            return np.full(len(self.t), -1, np.int64)
        has = np.flatnonzero(v != None)  # noqa: E711
        codes = np.full(len(v), -1, np.int64)
        seen: dict = {}
        # numbered in order of first appearance, one look-up per run of equal values (a GPU's job
        # id holds for many rows)
        vals = v[has]
        run = np.ones(len(vals), bool)
        run[1:] = vals[1:] != vals[:-1]
        first = np.flatnonzero(run)
        run_codes = np.array([seen.setdefault(x, len(seen)) for x in vals[first].tolist()], np.int64)
        codes[has] = np.repeat(run_codes, np.diff(np.append(first, len(vals))))
        idx = self._ffill_index(codes >= 0)
        return np.where(idx >= 0, codes[np.maximum(idx, 0)], -1)

    def _ffill_index(self, present: np.ndarray) -> np.ndarray:
        """Per row: index of the entity's latest row with ``present`` set at or before it, or -1."""
        n = len(present)
        if not n:
            return np.zeros(0, np.int64)
        idx = _carry(np.where(present, np.arange(n), -1))
        return np.where(idx >= self.entity_start(), idx, -1)

    def run_start(self, cond: np.ndarray) -> np.ndarray:
        """Time the entity's current run of ``cond`` began, per row (NaN where ``cond`` is false)."""
        out = np.full(len(cond), np.nan)
        rows = np.flatnonzero(cond)
        if not len(rows):
            return out
        # found over the rows with ``cond`` only: a run's rows are consecutive, so its first row is
        # the latest row at or before each that follows a row without it (or starts the entity)
        began = self.first_of_entity()[rows] | ~cond[np.maximum(rows - 1, 0)]
        idx = _carry(np.where(began, rows, 0))
        out[rows] = self.t[idx]
        return out

    def rolling_sum(self, v: np.ndarray, seconds: float, rows: np.ndarray | None = None) -> np.ndarray:
        """Sum of the entity's non-NaN values over the trailing ``seconds`` (inclusive); at ``rows``
        only, where given (the same sums, for a detector that needs a few of them)."""
        if not np.isfinite(v).all():
            v = nan_to_zero(v)
        if not v.any():  # nothing to sum (a counter that did not move)
            return np.zeros(len(v) if rows is None else len(rows))
        if rows is None:
            lo, hi = self._span(seconds)
        else:
            lo, hi = self._span_at(seconds, rows), rows + 1
            # prefix sums over the nonzero values only (a counter's increases: mostly 0), found by
            # position: the same sums as over every row (adding 0 changes no partial sum)
            at = np.flatnonzero(v)
            c = np.empty(len(at) + 1)
            c[0] = 0.0
            np.cumsum(v[at], out=c[1:])
            return c[np.searchsorted(at, hi)] - c[np.searchsorted(at, lo)]
        c = np.empty(len(v) + 1)
        c[0] = 0.0
        np.cumsum(v, out=c[1:])
        return c[hi] - c[lo]

    def rolling_count(self, mask: np.ndarray, seconds: float) -> np.ndarray:
        """How many of the entity's rows over the trailing ``seconds`` (inclusive) have ``mask`` set."""
        lo, hi = self._span(seconds)
        c = np.concatenate([[0], np.cumsum(mask)])
        return c[hi] - c[lo]

    def _span(self, seconds: float):
        """Per row: [lo, hi) row range of the entity's trailing ``seconds`` (inclusive)."""
        return self.cached(("span", seconds), lambda: self._span_uncached(seconds))

    def _span_uncached(self, seconds: float):
        key = self._span_key()
        return np.searchsorted(key, key - seconds, side="left"), np.arange(len(self.t)) + 1

    def _span_at(self, seconds: float, rows: np.ndarray) -> np.ndarray:
        """``_span(seconds)[0][rows]``, searched for those rows only unless already known."""
        known = self._memo.get(("span", seconds))
        if known is not None:
            return known[0][rows]
        key = self._span_key()
        return np.searchsorted(key, key[rows] - seconds, side="left")

    def _span_key(self) -> np.ndarray:
        """(entity, time) as one sorted float per row, for searching trailing spans."""

        def calc():
            t0 = self.t.min() if len(self.t) else 0.0
            return self.ent.astype(np.float64) * 1e7 + (self.t - t0)  # exact while a window spans < 1e7 s

        return self.cached(("span_key",), calc)

    def since(self, seconds: float) -> np.ndarray:
        """Per row: the index of the entity's earliest row at most ``seconds`` before it
        (``t[i] - t[j] <= seconds``, compared exactly as written)."""
        return self.cached(("since", seconds), lambda: self._since(seconds))

    def since_at(self, seconds: float, rows: np.ndarray) -> np.ndarray:
        """``since(seconds)[rows]``, found for those rows only unless already known."""
        known = self._memo.get(("since", seconds))
        if known is not None:
            return known[rows]
        return self._since(seconds, rows)

    def _since(self, seconds: float, rows: np.ndarray | None = None) -> np.ndarray:
        n = len(self.t) if rows is None else len(rows)
        if not n:
            return np.zeros(0, np.int64)
        if rows is None:
            i, first, lo = np.arange(n), self.entity_start(), self._span(seconds)[0]
        else:
            i, first, lo = rows, self.entity_start()[rows], self._span_at(seconds, rows)
        # the trailing span's start as _span finds it (its key is rounded for far entities), moved
        # row by row to where the exact difference puts it (no move at all, as a rule)
        lo = np.clip(lo, first, i)
        t = self.t
        ti = t[i]
        while True:
            fwd = ti - t[lo] > seconds
            back = (lo > first) & (ti - t[np.maximum(lo - 1, 0)] <= seconds)
            if not (fwd.any() or back.any()):
                return lo
            lo = lo + fwd - back

    def rolling_mean(self, v: np.ndarray, seconds: float) -> np.ndarray:
        """Mean of the entity's non-NaN values over the trailing ``seconds`` (inclusive)."""
        ok = ~np.isnan(v)
        c = np.concatenate([[0.0], np.cumsum(np.where(ok, v, 0.0))])
        n = np.concatenate([[0], np.cumsum(ok)])
        lo, hi = self._span(seconds)
        cnt = n[hi] - n[lo]
        with np.errstate(invalid="ignore", divide="ignore"):
            return np.where(cnt > 0, (c[hi] - c[lo]) / np.maximum(cnt, 1), np.nan)


def nan_to_zero(v: np.ndarray) -> np.ndarray:
    """``np.nan_to_num(v, nan=0.0)`` (NaN -> 0, ±inf -> ±largest float) in a new array, faster."""
    v = np.asarray(v)
    if v.dtype.kind != "f":
        return np.array(v, copy=True)
    big = _FLOAT_MAX.get(v.dtype)
    if big is None:
        big = _FLOAT_MAX[v.dtype] = v.dtype.type(np.finfo(v.dtype).max)
    out = np.where(np.isnan(v), v.dtype.type(0), v)
    np.minimum(out, big, out=out)  # np.clip(out, -big, big), without its Python wrapper
    np.maximum(out, -big, out=out)
    return out


_FLOAT_MAX: dict = {}  # float dtype -> its largest finite value


def _carry(idx: np.ndarray) -> np.ndarray:
    """Running maximum, in place (carries the latest marked row index forward)."""
    np.maximum.accumulate(idx, out=idx)
    return idx


@dataclass
class Window:
    start: float
    end: float
    reg: Registry
    gpu: Table
    nvlink: Table
    event: Table
    canary: Table
    host: Table
    bmc: Table
    node_of: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))
    rack_of: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))
    last_seen: np.ndarray = field(default_factory=lambda: np.zeros(0))  # per GPU, up to window end
    host_last_seen: np.ndarray = field(default_factory=lambda: np.zeros(0))  # per host (host rows)
    fan: Table | None = None  # BMC fan sensors per host (fan_rpm, fan_state), with the gpu table
    # a late host's window (event time): the hosts whose late rows it analyses; the others' rows in
    # it are peers' rows, analysed in time already (None: a window of the stream's own)
    late_hosts: frozenset[int] | None = None
    # the batch window (``window_seconds``): what a row's features take of learned state is what a
    # batch run had learned by the start of the row's batch window (see as_of), however it arrives
    grid: float = 300.0
    # per-window features: (detector, name) -> value (see once)
    features: dict = field(default_factory=dict, init=False, repr=False, compare=False)

    def fresh(self, tab: Table | None = None) -> np.ndarray:
        """The rows of ``tab`` (the gpu table by default; a table of GPUs or of links) analysed here
        for the first time: the window's own (not context), and in a late window the late hosts'
        only. What learns from each row once, or keeps state from it, takes these."""
        tab = self.gpu if tab is None else tab
        if self.late_hosts is None:
            return tab.in_window()
        gpu = self.reg.link_arrays()[0][tab.ent] if tab is self.nvlink else tab.ent
        return tab.in_window() & self.analyses(self.node_of[gpu])

    def analyses(self, hosts: np.ndarray) -> np.ndarray:
        """Per row, by its host id: whether this window analyses that host's rows (a late window:
        its late hosts' only; the others' rows are peers', analysed in time already)."""
        if self.late_hosts is None:
            return np.ones(len(hosts), bool)
        return np.isin(hosts, list(self.late_hosts))

    def as_of(self, t: np.ndarray) -> np.ndarray:
        """Per row time ``t`` (s): the start of its batch window. A batch run learns from a window
        after judging it, so state learned by then, and only that, is what a row's features take in
        batch; online (windows a poll long, a late host's windows later) takes the same."""
        return np.floor(t / self.grid) * self.grid

    def once(self, detector: object, name: object, compute: Callable[[], Any]) -> Any:
        """``compute()`` the first time ``detector`` asks for feature ``name`` of this window, the
        same value after: a detector's fit, score and detect of one window share what they derive
        from its rows. It lives as long as the window (the pipeline builds one per analysis step);
        what it read of the detector's learned state is that state as it stood when first asked
        (a detector that learns in ``fit`` scores the window against what it knew before it).
        Keyed by the detector itself, not its ``id``: a window that outlives a detector (a test's
        windows replayed through one new detector after another) never hands a later one, given
        the dead one's id, what the dead one derived."""
        key = (detector, name)
        if key not in self.features:
            self.features[key] = compute()
        return self.features[key]
