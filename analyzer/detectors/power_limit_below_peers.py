"""power_limit_below_peers: a node's GPUs power-limited below their same-model peers (informational).

Not a fault: an operator's setting worth telling someone. A GPU whose power limit
(``gpu.power_limit_watts``, the enforced limit) sits ``min_below`` or more under the median limit of
the fleet's GPUs of its own model in the same minute (at least ``min_peer_gpus`` of them on other
nodes) runs lower clocks and power by setting; the comparing detectors already judge it against
peers of its own limit (straggler) and its own power (cooling), so nothing pages. Held for
``dwell_seconds`` (hours), it is one record per node, severity ``info``: written to the incident
file and the store, never sent to a sink (``gpufleet.analyzer.alerting.notifier``), never scored as
a page by ``gpufleet eval``. Its evidence says "power limit 500 W (peers 700 W)" and lists the
GPUs. A model whose GPUs all share one limit, or a model the fleet has too few of, gives nothing.
"""

from __future__ import annotations

import numpy as np
from gpufleet.analyzer.detectors.base import Detector, Evidence, Hits
from gpufleet.analyzer.frame import Window
from gpufleet.analyzer.groupby import buckets, distinct_count, group_median


class PowerLimitBelowPeers(Detector):
    kind = "power_limit_below_peers"
    severity = "info"
    params = {
        "min_below": 0.05,  # the limit at least this share under its same-model peers' median
        "min_peer_gpus": 4,  # GPUs of the model on other nodes that report a limit in the minute
        "dwell_seconds": 7200.0,  # below its peers this long: a setting that stays, worth a note
        "gap_seconds": 300.0,
        "resolve_seconds": 1800.0,
    }
    fields = {"gpu": ("power_limit_watts",)}
    summary = "power limit set below its same-model peers' (an operator's setting, not a fault)"
    panels = (
        ("gpu", "power_limit_watts", "Power limit (W)", "value"),
        ("gpu", "power_watts", "Power (W)", "value"),
        ("gpu", "clock_sm_mhz", "SM clock (MHz)", "value"),
    )

    def score(self, window: Window) -> np.ndarray:
        """Per gpu row: how far its limit sits under its model's median that minute (0..1, NaN unknown)."""
        return self._below(window)[0]

    def _below(self, window: Window):
        return window.once(self, "below", lambda: self._below_uncached(window))

    def _below_uncached(self, window: Window):
        tab = window.gpu
        out = np.full(len(tab), np.nan)
        peers = np.full(len(tab), np.nan)
        enough = np.zeros(len(tab), bool)
        if not len(tab) or "power_limit_watts" not in tab.cols:
            return out, peers, enough
        lim = tab.col("power_limit_watts")
        ok = np.isfinite(lim) & (lim > 0)
        if not ok.any():
            return out, peers, enough
        idx = np.flatnonzero(ok)  # the rows with a limit (the slow tier: one in six at a 10 s poll)
        ent, t, v = tab.ent[idx], tab.t[idx], lim[idx]
        model = window.reg.model_ids()[ent]
        node = window.node_of[ent]
        inv, ng = buckets(t, 60.0, model)  # (minute, model)
        med, _ = group_median(inv, v, ng)
        every = np.ones(len(idx), bool)
        gpus = distinct_count(inv, ent, every, ng)
        # GPUs of the model that minute, less the row's own node's: its peers on other nodes
        ninv, nn = buckets(t, 60.0, model * (int(node.max()) + 1) + node)
        own = distinct_count(ninv, ent, every, nn)
        good = gpus[inv] - own[ninv] >= self.min_peer_gpus
        enough[idx] = good
        peers[idx] = np.where(good, med[inv], np.nan)
        with np.errstate(invalid="ignore", divide="ignore"):
            out[idx] = np.where(good, 1.0 - v / peers[idx], np.nan)
        return out, peers, enough

    def detect(self, window: Window) -> Hits:
        tab = window.gpu
        below, peers, _ = self._below(window)
        with np.errstate(invalid="ignore"):
            low = tab.in_window() & (below >= self.min_below)
        idx = np.flatnonzero(low)
        if not len(idx):
            return Hits.none(self.kind)
        lim = tab.col("power_limit_watts")
        node = window.node_of[tab.ent]
        # one hit per node and minute, listing its GPUs under their peers' limit that minute
        grp = node[idx] * 10**7 + np.floor(tab.t[idx] / 60).astype(np.int64)
        order = np.lexsort((-below[idx], grp))
        head = np.ones(len(order), bool)
        head[1:] = grp[order][1:] != grp[order][:-1]
        sel = idx[order[head]]
        gidx = window.reg.gpu_index
        listed: dict[int, set] = {}
        for g, e in zip(grp.tolist(), tab.ent[idx].tolist(), strict=True):
            listed.setdefault(g, set()).add(gidx[e])
        models = window.reg.gpu_model

        def ev(j):
            i = int(sel[j])
            mine, theirs = round(float(lim[i])), round(float(peers[i]))
            key = int(node[i]) * 10**7 + int(np.floor(tab.t[i] / 60))
            out = {
                "signals": ["power_limit_watts"],
                "scope": "node",
                "setting": f"power limit {mine} W (peers {theirs} W)",
                "power_limit_watts": mine,
                "peers_power_limit_watts": theirs,
                "below_peers": round(float(below[i]), 3),
                "gpus": sorted(x for x in listed[key] if x is not None),
            }
            if models[int(tab.ent[i])]:
                out["model"] = models[int(tab.ent[i])]
            return out

        n = len(sel)
        return Hits(
            self.kind,
            node[sel].astype(np.int64),
            np.full(n, -1, np.int64),
            np.full(n, -1, np.int64),
            tab.t[sel],
            below[sel],
            np.zeros(n, bool),
            Evidence(ev, list(range(n))),
        )
