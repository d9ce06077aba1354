"""inlet_above_room: a rack whose inlet runs steadily warmer than the room (a facility note, informational).

Not a GPU fault: the room is a baseline. Reads the hosts' inlet temperature (``bmc_sensor`` rows
whose name contains "inlet", the bmc table's ``inlet``) and, for the "near its limits" check,
gpu.temperature_gpu_celsius and temperature_slowdown_celsius. Per minute, a rack's inlet is the
median of its hosts' and the room's is the median of the other racks' (at least one other rack);
a rack ``above_celsius`` or more above the room is a hit, one per rack and minute, severity
``info``: held for ``dwell_seconds`` it is one record per rack ("rack r01 inlet 6 °C above the
room"), written to the incident file and the store, never sent to a sink, never scored as a page.

It stays a note only while the rack is steady and its GPUs are far from their limits: while the
rack's excess over the room rose ``rise_celsius`` or more over the trailing ``rise_seconds``, or
GPUs of ``near_nodes`` nodes of the rack (every node, in a smaller rack) came within
``near_limit_celsius`` of their slowdown temperature, there is no hit here: that is the cooling
detector's rack page (``cooling_degradation``, its inlet rule), which judges the rack against its
own inlet and pages while the inlet keeps rising or the GPUs near their limits.
"""

from __future__ import annotations

import numpy as np
from gpufleet.analyzer.detectors.base import Detector, Hits
from gpufleet.analyzer.detectors.rack_inlet import (
    RackHistory,
    host_racks,
    leave_one_out_median,
    racks_near_limits,
)
from gpufleet.analyzer.frame import Window
from gpufleet.analyzer.groupby import buckets, distinct_count, group_median


class InletAboveRoom(Detector):
    kind = "inlet_above_room"
    severity = "info"
    params = {
        "above_celsius": 4.0,  # the rack's inlet this far above the other racks' median
        "rise_seconds": 1800.0,  # not a note while its excess rose ...
        "rise_celsius": 1.5,  # ... this much over the trailing rise_seconds (still rising: a page's)
        "near_limit_celsius": 5.0,  # not a note while GPUs of near_nodes nodes are this close to slowdown
        "near_nodes": 2,
        "dwell_seconds": 3600.0,  # warmer this long, steadily: a note
        "gap_seconds": 300.0,
        "resolve_seconds": 3600.0,
    }
    fields = {
        "bmc_sensor": ("value",),
        "gpu": ("temperature_gpu_celsius", "temperature_slowdown_celsius"),
    }
    summary = "rack inlet steadily warmer than the room (a facility note, not a GPU fault)"
    panels = (
        ("gpu", "temperature_gpu_celsius", "GPU temperature (°C)", "value"),
        ("gpu", "power_watts", "Power (W)", "value"),
    )

    def score(self, window: Window) -> np.ndarray:
        """Per gpu row: its rack's inlet above the room that minute, in units of ``above_celsius``."""
        tab = window.gpu
        out = np.full(len(tab), np.nan)
        got = self._racks(window)
        if got is None or not len(tab):
            return out
        g_rack, excess, minute = got[2], got[3], got[4]
        key = minute * 10**7 + g_rack
        order = np.argsort(key)
        q = np.floor(tab.t / 60.0).astype(np.int64) * 10**7 + window.rack_of[tab.ent]
        j = np.clip(np.searchsorted(key[order], q), 0, len(key) - 1)
        hit = key[order][j] == q
        out[hit] = excess[order][j[hit]] / self.above_celsius
        return out

    def _racks(self, window: Window):
        return window.once(self, "racks", lambda: self._racks_uncached(window))

    def _racks_uncached(self, window: Window):
        """(group per kept row, kept rows, per (minute, rack) group: rack, excess, minute, inlet, room,
        hosts) or None."""
        bmc = window.bmc
        if not len(bmc) or "inlet" not in bmc.cols or not len(window.node_of):
            return None
        rack = host_racks(window)[bmc.ent]
        inlet = bmc.cols["inlet"]
        ok = bmc.in_window() & np.isfinite(inlet) & (rack >= 0) & (rack < 10**6)
        if not ok.any():
            return None
        host, t, v, rk = bmc.ent[ok], bmc.t[ok], inlet[ok], rack[ok]
        # per (minute, host) its inlet, then per (minute, rack) the median of its hosts'
        hinv, nh = buckets(t, 60.0, host)
        hmean = np.bincount(hinv, v, nh) / np.maximum(np.bincount(hinv, minlength=nh), 1)
        inv, ng = buckets(t, 60.0, rk)
        rmed, _ = group_median(inv, hmean[hinv], ng)
        first = np.zeros(ng, np.int64)
        first[inv] = np.arange(len(inv))
        minute = np.floor(t[first] / 60.0).astype(np.int64)
        g_rack = rk[first]
        room = leave_one_out_median(minute, rmed)
        minv = np.unique(minute, return_inverse=True)[1]
        racks_in_minute = np.bincount(minv)[minv]
        excess = np.where(racks_in_minute >= 2, rmed - room, np.nan)
        hosts = distinct_count(inv, host, np.ones(len(inv), bool), ng)
        tmax = np.full(ng, -np.inf)
        np.maximum.at(tmax, inv, t)
        return inv, ok, g_rack, excess, minute, rmed, room, hosts, tmax

    def _rising(self, rack: np.ndarray, minute: np.ndarray, excess: np.ndarray, ask: np.ndarray):
        """Per (rack, minute) group: did the rack's excess rise ``rise_celsius`` over the trailing
        ``rise_seconds`` (its history kept per rack, two spans)? Answered where ``ask``ed."""
        hist = self.__dict__.setdefault("hist_", RackHistory())  # rack -> {minute: excess}
        span = max(int(self.rise_seconds // 60), 1)
        hist.add(rack, minute, excess, finite_only=True)
        out = np.zeros(len(rack), bool)
        for i in np.flatnonzero(ask).tolist():
            r, m, x = int(rack[i]), int(minute[i]), float(excess[i])
            h = hist.get(r, {})
            past = [h[k] for k in range(m - span, m) if k in h]
            out[i] = bool(past) and np.isfinite(x) and x - min(past) >= self.rise_celsius
        hist.prune(span)
        return out

    def detect(self, window: Window) -> Hits:
        got = self._racks(window)
        if got is None:
            return Hits.none(self.kind)
        _, _, g_rack, excess, minute, rmed, room, hosts, tmax = got
        with np.errstate(invalid="ignore"):
            warm = excess >= self.above_celsius
        rising = self._rising(g_rack, minute, excess, warm)  # (the history is kept for every rack)
        if not warm.any():
            return Hits.none(self.kind)
        near = racks_near_limits(window, self.near_limit_celsius, self.near_nodes, throttled=False)
        warm &= ~rising & ~np.isin(minute * 10**7 + g_rack, near)
        sel = np.flatnonzero(warm)
        if not len(sel):
            return Hits.none(self.kind)
        names: dict = {}  # rack id -> its name
        for r, h in zip(window.rack_of.tolist(), window.node_of.tolist(), strict=True):
            names.setdefault(r, window.reg.host_rack[h])
        ev = [
            {
                "signals": ["bmc_sensor.value (inlet)"],
                "scope": "rack",
                "setting": f"rack {names.get(int(g_rack[g])) or '?'} inlet {excess[g]:.0f} °C above the room",
                "inlet_celsius": round(float(rmed[g]), 1),
                "room_celsius": round(float(room[g]), 1),
                "above_room_celsius": round(float(excess[g]), 1),
                "threshold_celsius": self.above_celsius,
                "hosts": int(hosts[g]),
            }
            for g in sel.tolist()
        ]
        return Hits.of_racks(self.kind, g_rack[sel], tmax[sel], excess[sel] / self.above_celsius, ev)
