"""A rack's inlet against the room: the cooling detector's rack rule, and what inlet_above_room's
note shares with it.

Both read the hosts' inlet temperature (the bmc table's ``inlet``), judge a rack per minute by the
median of its hosts' against the other racks' (:func:`leave_one_out_median`: the room's common
mode), keep each rack's excess per minute (:class:`RackHistory`) to tell a ramp from a step, and
stand aside for racks whose GPUs came near their limits (:func:`racks_near_limits`).

:class:`RackInletRule` is the cooling detector's rack scope from the inlet itself: a rack's hosts
above their own usual inlet by ``excess_celsius`` more than the other racks moved, paged while it
still rises or while its GPUs near their slowdown temperature. The GPU model subtracts the inlet,
so this is where a hot aisle or a failing rack cooler shows, in fleets of two racks as of many.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
from gpufleet.analyzer.detectors.base import Hits, nz, rounded
from gpufleet.analyzer.detectors.thermal_throttle import thermal_bits
from gpufleet.analyzer.frame import Window
from gpufleet.analyzer.groupby import buckets, distinct_count, group_median, lookup


def host_racks(window: Window) -> np.ndarray:
    """Host id -> rack id (-1: none), for every host of the window's GPU and BMC rows."""
    top = max(int(window.bmc.ent.max()) if len(window.bmc) else -1, int(window.node_of.max()))
    out = np.full(top + 1, -1, np.int64)
    out[window.node_of] = window.rack_of
    return out


def racks_with_inlet(window: Window) -> np.ndarray:
    """Rack ids whose hosts have an inlet reading in this window."""
    bmc = window.bmc
    if not len(bmc) or "inlet" not in bmc.cols or not len(window.node_of):
        return np.zeros(0, np.int64)
    r = np.unique(host_racks(window)[bmc.ent[np.isfinite(bmc.cols["inlet"])]])
    return r[r >= 0]


def racks_near_limits(window: Window, near_celsius: float, min_nodes: int, throttled: bool,
                      own: np.ndarray | None = None) -> np.ndarray:
    """(minute, rack) keys, ``minute * 10**7 + rack``, of the minutes where GPUs of ``min_nodes``
    nodes of the rack (every node seen that minute, in a smaller rack) came within
    ``near_celsius`` of their slowdown temperature (or, with ``throttled``, throttled for heat):
    the room's heat reaching the GPUs, not one GPU's own fault (``own``: rows whose heat is their
    GPU's own, left out). Judged per minute over every row the table holds of it (its context
    too), so neither a five-minute window nor a poll-long one changes which minutes they are."""
    tab = window.gpu
    if not len(tab):
        return np.zeros(0, np.int64)
    slow = tab.ffill("temperature_slowdown_celsius")
    slow = np.where(np.isfinite(slow), slow, 89.0)
    near = nz(tab.col("temperature_gpu_celsius")) >= slow - near_celsius
    if throttled:
        near |= thermal_bits(tab) > 0
    if own is not None:
        near &= ~own
    if not near.any():
        return np.zeros(0, np.int64)
    key = np.floor(tab.t / 60.0).astype(np.int64) * 10**7 + window.rack_of[tab.ent]
    uk, kinv = np.unique(key, return_inverse=True)
    node = window.node_of[tab.ent]
    nn = int(node.max()) + 1
    pair = kinv * nn + node  # per (rack, minute): the nodes seen, and those with a GPU near its limit
    seen = np.bincount(np.unique(pair) // nn, minlength=len(uk))
    hot = np.bincount(np.unique(pair[near]) // nn, minlength=len(uk))
    return uk[(hot > 0) & (hot >= np.minimum(min_nodes, seen))]


def leave_one_out_median(group: np.ndarray, v: np.ndarray) -> np.ndarray:
    """Per element: the median of the other elements of its group (0 where it is alone); finite ``v``."""
    n = len(v)
    out = np.zeros(n)
    if n < 2:
        return out
    order = np.lexsort((v, group))
    g, vs = group[order], v[order]
    first = np.ones(n, bool)
    first[1:] = g[1:] != g[:-1]
    start = np.maximum.accumulate(np.where(first, np.arange(n), 0))
    size = np.bincount(np.cumsum(first) - 1)[np.cumsum(first) - 1]
    pos = np.arange(n) - start  # rank of the element within its group
    rest = size - 1  # how many remain without it
    many = rest >= 1

    def kth(k):  # the k-th smallest of the others: skip the element's own rank
        return vs[np.minimum(start + k + (k >= pos), n - 1)]

    lo_k = np.where(many, (rest - 1) // 2, 0)
    hi_k = np.where(many, rest // 2, 0)
    med = (kth(lo_k) + kth(hi_k)) / 2
    med = np.where(rest % 2 == 1, kth(lo_k), med)
    out[order] = np.where(many, med, 0.0)
    return out


class RackHistory(dict):
    """Rack -> {minute: its excess over the room}, two spans of minutes kept per rack (pruned once
    a rack holds four)."""

    def add(self, rack: np.ndarray, minute: np.ndarray, excess: np.ndarray, finite_only: bool) -> None:
        for r, m, x in zip(rack.tolist(), minute.tolist(), excess.tolist(), strict=True):
            if not finite_only or np.isfinite(x):
                self.setdefault(r, {})[m] = x

    def prune(self, span: int) -> None:
        for h in self.values():
            if len(h) > 4 * span:
                last = max(h)
                for k in [k for k in h if k < last - 2 * span]:
                    del h[k]


@dataclass
class RackInletRule:
    """The cooling detector's rack scope from the inlet (its parameters; its learned state:
    ``track``, ``since``, ``history``)."""

    excess_celsius: float  # a rack's inlet above its hosts' usual, beyond the other racks' movement
    track_seconds: float  # time constant of a host's tracked usual inlet
    rise_seconds: float  # it pages while its excess still rises over this span ...
    rise_celsius: float  # ... by this much, a third in each third of it
    near_limit_celsius: float  # ... or while GPUs of min_nodes nodes are this close to slowdown
    min_nodes: int
    track: dict = field(default_factory=dict)  # host -> its tracked usual inlet
    since: dict = field(default_factory=dict)  # rack -> when its excess crossed the bar
    history: RackHistory = field(default_factory=RackHistory)

    def hits(self, window: Window, kind: str, refs: dict, own: np.ndarray | None = None) -> Hits:
        """Rack hits of ``kind``: the inlet of a rack's hosts above their usual inlet (``refs``:
        host -> the inlet learned at its start, tracked since) by ``excess_celsius`` more than the
        other racks' inlets moved (with one rack, the usual inlet alone), on at least ``min_nodes``
        of its hosts, while rising or near the GPUs' limits (``own``: GPU rows whose heat is their
        own fault, which say nothing of the room); dated to where it crossed the bar."""
        bmc = window.bmc
        if not len(bmc) or "inlet" not in bmc.cols or not refs or not len(window.node_of):
            return Hits.none(kind)
        # against each host's slowly tracking usual inlet (time constant track_seconds), so a room
        # that drifts a few degrees over a day is no incident; a failing rack cooler (tens of
        # minutes to hours) still stands out, and a rack flagged here stops its hosts' tracking
        ref = lookup({h: self.track.get(h, r) for h, r in refs.items()}, bmc.ent)
        rack = host_racks(window)[bmc.ent]
        new = bmc.in_window()
        ok = new & np.isfinite(bmc.cols["inlet"]) & np.isfinite(ref) & (rack >= 0) & (rack < 10**6)
        if not ok.any():
            return Hits.none(kind)
        dev = (bmc.cols["inlet"] - ref)[ok]
        host, rack, t = bmc.ent[ok], rack[ok], bmc.t[ok]
        minute = np.floor(t / 60.0).astype(np.int64)
        # per (minute, rack): median deviation of the rack's hosts
        inv, ng = buckets(t, 60.0, rack)
        rmed, _ = group_median(inv, dev, ng)
        first = np.zeros(ng, np.int64)
        first[inv] = np.arange(len(inv))
        g_min, g_rack = minute[first], rack[first]
        # the other racks' movement in the same minute (leave one out; 0 with a single rack)
        others = leave_one_out_median(g_min, rmed)
        hot_row = dev - others[inv] >= self.excess_celsius
        hosts_hot = distinct_count(inv, host, hot_row, ng)
        hosts_all = distinct_count(inv, host, np.ones(len(inv), bool), ng)
        need = np.minimum(self.min_nodes, hosts_all)
        flag = (rmed - others >= self.excess_celsius) & (hosts_hot >= np.maximum(need, 1))
        self._track(window, host, bmc.cols["inlet"][ok], rack, set(g_rack[flag].tolist()), refs)
        # the room is a baseline: a rack that steps to a warmer inlet and stays there is judged
        # against its own inlet (the GPU model subtracts it) and pages only while its inlet keeps
        # rising, or once its GPUs come near their slowdown temperature
        rising = self._rising(g_rack, g_min, rmed - others, flag)
        if not flag.any() and not self.since:
            return Hits.none(kind)
        tmax = np.full(ng, -np.inf)
        np.maximum.at(tmax, inv, t)
        # an incident the gate delayed still begins where the rack's excess crossed the bar
        began = np.full(ng, np.nan)
        for g in np.lexsort((g_min, g_rack)).tolist():
            r = int(g_rack[g])
            if flag[g]:
                began[g] = self.since.setdefault(r, float(tmax[g]))
            else:
                self.since.pop(r, None)
        if flag.any():
            near = racks_near_limits(window, self.near_limit_celsius, self.min_nodes, throttled=True, own=own)
            flag &= rising | np.isin(g_min * 10**7 + g_rack, near)
        sel = np.flatnonzero(flag)
        if not len(sel):
            return Hits.none(kind)
        ev = [
            {
                "signals": ["bmc_sensor.value (inlet)"],
                "scope": "rack",
                "inlet_excess_celsius": rounded(rmed[g] - others[g]),
                "threshold_celsius": self.excess_celsius,
                "other_racks_celsius": rounded(others[g]),
                "hot_nodes": int(hosts_hot[g]),
                "inlet_rising": bool(rising[g]),
            }
            for g in sel.tolist()
        ]
        score = (rmed[sel] - others[sel]) / self.excess_celsius
        return Hits.of_racks(kind, g_rack[sel], tmax[sel], score, ev, began[sel])

    def _rising(self, rack: np.ndarray, minute: np.ndarray, excess: np.ndarray, ask: np.ndarray):
        """Per (rack, minute) group: is the rack's inlet excess still rising? Over the trailing
        ``rise_seconds``, cut in three, it rose by a third of ``rise_celsius`` in each part: a ramp
        (a failing rack cooler), not a step that then stays (one part holds all of it)."""
        span = max(int(self.rise_seconds // 60), 3)
        self.history.add(rack, minute, excess, finite_only=False)
        out = np.zeros(len(rack), bool)
        need = self.rise_celsius / 3
        for i in np.flatnonzero(ask).tolist():  # (only where asked: the flagged groups)
            r, m = int(rack[i]), int(minute[i])
            h = self.history[r]
            at = [m - span + k * span // 3 for k in range(3)] + [m]
            got = [h.get(k, h.get(k - 1, h.get(k + 1))) for k in at]
            if any(x is None for x in got):
                continue
            out[i] = all(b - a >= need for a, b in zip(got[:-1], got[1:], strict=True))
        self.history.prune(span)
        return out

    def _track(self, window: Window, host, inlet, rack, hot_racks: set, refs: dict) -> None:
        """Move each host's tracked inlet toward this window's mean (not for hosts of a hot rack)."""
        alpha = 1.0 - np.exp(-(window.end - window.start) / self.track_seconds)
        keep = ~np.isin(rack, list(hot_racks)) if hot_racks else np.ones(len(host), bool)
        u, inv = np.unique(host[keep], return_inverse=True)
        if not len(u):
            return
        mean = np.bincount(inv, inlet[keep]) / np.bincount(inv)
        for h, m in zip(u.tolist(), mean.tolist(), strict=True):
            cur = self.track.get(h, refs.get(h, m))
            self.track[h] = cur + alpha * (m - cur)
