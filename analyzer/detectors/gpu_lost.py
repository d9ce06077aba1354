"""gpu_lost: a GPU that fell off the bus or stopped answering.

Reads gpu_event XID 79 (fallen off the bus), gpu.health_code == 2 (NVML GPU_IS_LOST), and
absence: a GPU with no rows for ``lost_after_seconds`` while another GPU of its node still
reports (a whole node going quiet is the node or its agent, not a lost GPU): critical. A GPU the
agent reports stale (``up=0, health_code=1``: NVML missed its deadline, the GPU is quarantined and
retried) for ``stale_after_seconds`` in a row is a warning incident of the same kind (a hung
driver call is how a GPU on its way off the bus often looks first); it turns critical if the GPU
is then lost. When at least ``node_share`` of a node's GPUs (and ``node_min_gpus``) are lost in the
same minute (an XID 79 on each: the node's PCIe switch or power, not each GPU) the incident is
the node's (gpu = null), its evidence listing the GPUs.
"""

from __future__ import annotations

import numpy as np
from gpufleet.analyzer.detectors.base import Detector, Hits, concat, node_scope_hits
from gpufleet.analyzer.frame import Window


class GpuLost(Detector):
    kind = "gpu_lost"
    peer_rows = False  # a GPU's own health and events; its silence is read off last_seen
    tables = ("gpu", "gpu_event")
    params = {
        "xids": [79],
        "lost_after_seconds": 180.0,
        "stale_after_seconds": 300.0,  # reported stale (up=0, health_code=1) this long: a warning
        "node_share": 0.5,  # this share of a node's GPUs lost in the same minute: the node's incident
        "node_min_gpus": 2,
        "dwell_seconds": 0.0,
        "gap_seconds": 86400.0,
        "resolve_seconds": 86400.0,
    }
    # up: the row that says the GPU answered (its last_seen), whatever its other fields
    fields = {
        "gpu": ("health_code", "up"),
        "gpu_event": ("code",),
    }
    summary = "GPU lost (fell off the bus or stopped reporting)"
    panels = (
        ("gpu", "up", "GPU answered the poll", "value"),
        ("gpu", "power_watts", "Power (W)", "value"),
        ("gpu", "utilization_gpu_ratio", "GPU utilization", "value"),
    )

    def score(self, window: Window) -> np.ndarray:
        return (window.gpu.col("health_code") == 2).astype(float)

    def detect(self, window: Window) -> Hits:
        tab = window.gpu
        lost = self.score(window) > 0
        parts = [
            self._gpu_hits(
                window,
                tab,
                lost,
                lost.astype(float),
                True,
                lambda i: {"signals": ["gpu.health_code"], "health_code": 2},
            )
        ]
        # stale for stale_after_seconds in a row: a warning (the run's start is the onset)
        stale = tab.col("health_code") == 1
        since = tab.run_start(stale)
        long_stale = stale & (tab.t - np.nan_to_num(since, nan=np.inf) >= self.stale_after_seconds)
        stale_hits = self._gpu_hits(
            window,
            tab,
            long_stale,
            long_stale.astype(float) * 0.5,
            False,
            lambda i: {
                "signals": ["gpu.health_code", "gpu.up"],
                "health_code": 1,
                "stale_seconds": round(float(tab.t[i] - since[i]), 1),
                "threshold_seconds": self.stale_after_seconds,
            },
        )
        stale_hits.began = since[np.flatnonzero(long_stale & tab.in_window())]
        parts.append(stale_hits)
        ev = window.event
        code = ev.col("code")
        typ = ev.text.get("type")
        is_xid = (
            np.ones(len(ev), bool)
            if typ is None
            else np.array([t is None or str(t).lower() == "xid" for t in typ], bool)
        )
        x = is_xid & np.isin(code, list(self.xids))
        parts.append(
            self._gpu_hits(
                window,
                ev,
                x,
                x.astype(float),
                True,
                lambda i: {"signals": ["gpu_event xid"], "xid": int(code[i])},
            )
        )
        parts.append(self._silent(window))
        # most of a node's GPUs lost in the same minute (XID 79 on each, NVML lost): the node's
        # PCIe switch or power, one node incident
        return node_scope_hits(concat(self.kind, parts), window, self.node_share, self.node_min_gpus)

    def _silent(self, window: Window) -> Hits:
        last = window.last_seen
        if not len(last) or not len(window.gpu):
            return Hits.none(self.kind)
        node = window.node_of
        # latest row of any *other* GPU of the node: max and second max per node
        n_nodes = int(node.max()) + 1 if len(node) else 0
        best = np.full(n_nodes, -np.inf)
        np.maximum.at(best, node, last)
        is_best = last == best[node]
        tmp = np.where(is_best, -np.inf, last)
        second = np.full(n_nodes, -np.inf)
        np.maximum.at(second, node, tmp)
        # several GPUs sharing the best time: the other one also reports then
        nbest = np.bincount(node[is_best], minlength=n_nodes)
        other = np.where(is_best & (nbest[node] == 1), second[node], best[node])
        with np.errstate(invalid="ignore"):
            quiet = other - last
        cond = np.isfinite(last) & (quiet >= self.lost_after_seconds) & (last >= window.start - 2 * 86400)
        cond &= (other >= window.start) & (other < window.end)
        g = np.flatnonzero(cond)
        if not len(g):
            return Hits.none(self.kind)
        hosts = node[g]
        return Hits(
            self.kind,
            hosts,
            g.astype(np.int64),
            np.full(len(g), -1),
            last[g] + 1.0,
            quiet[g] / self.lost_after_seconds,
            np.ones(len(g), bool),
            [
                {"signals": ["absence"], "last_seen_seconds_before_peers": round(float(quiet[i]), 1)}
                for i in g.tolist()
            ],
        )
