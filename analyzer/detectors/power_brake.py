"""power_brake: the external hardware power brake (PSU/BMC) slowing the GPU.

Reads gpu.clock_event_hw_power_brake (bit 0x80 of clock_event_reasons) and the counter
throttle_hw_power_brake_ns_total (brake time between polls counts). The SW power cap (0x4)
is the driver holding the power limit: healthy, never read here. A brake applied by the node's
PSU or BMC slows every GPU of the node at once: when at least ``node_share`` of a node's GPUs
(and ``node_min_gpus``) brake in the same minute, the hit is the node's (gpu = null), one page
listing its GPUs, not one per GPU.
"""

from __future__ import annotations

import numpy as np
from gpufleet.analyzer.detectors.base import (
    Detector,
    Evidence,
    Hits,
    concat,
    nan_as_zero_gt,
    node_together,
    nz,
    share,
)
from gpufleet.analyzer.detectors.thermal_throttle import _f
from gpufleet.analyzer.frame import Window
from gpufleet.analyzer.groupby import per_key_minute

HW_POWER_BRAKE = 0x80


class PowerBrake(Detector):
    kind = "power_brake"
    peer_rows = False  # a GPU's own brake counters (a node's GPUs together: its own host's)
    params = {
        "min_share": 0.05,
        "dwell_seconds": 0.0,
        "gap_seconds": 35.0,
        "resolve_seconds": 3600.0,
        "node_share": 0.5,  # this share of a node's GPUs braking in the same minute: the node's brake
        "node_min_gpus": 2,
    }
    fields = {
        "gpu": (
            "clock_event_reasons", "clock_event_hw_power_brake", "throttle_hw_power_brake_ns_total",
            "power_watts",
        ),
    }
    summary = "hardware power brake slowing the GPU"
    panels = (
        ("gpu", "power_watts", "Power (W)", "value"),
        ("gpu", "clock_sm_mhz", "SM clock (MHz)", "value"),
        ("gpu", "throttle_hw_power_brake_ns_total", "HW power brake (share of time)", "share"),
    )

    def _bits(self, tab) -> np.ndarray:
        return tab.cached("power_brake_bits", lambda: self._bits_uncached(tab))

    @staticmethod
    def _bits_uncached(tab) -> np.ndarray:
        reasons = tab.col("clock_event_reasons")
        ok = np.isfinite(reasons) & (reasons >= 0) & (reasons < 2**63)
        bits = np.zeros(len(tab))
        bits[ok] = (reasons[ok].astype(np.int64) & HW_POWER_BRAKE) != 0
        return np.fmax(nan_as_zero_gt(tab.col("clock_event_hw_power_brake"), 0), bits).astype(float)

    def score(self, window: Window) -> np.ndarray:
        tab = window.gpu
        return np.fmax(nz(share(tab, "throttle_hw_power_brake_ns_total")), self._bits(tab))

    def detect(self, window: Window) -> Hits:
        tab = window.gpu
        sc = self.score(window)
        bits = self._bits(tab)
        power = tab.col("power_watts")

        def ev(i):
            return {
                "signals": ["clock_event_hw_power_brake", "throttle_hw_power_brake_ns_total"],
                "brake_bit": int(bits[i]),
                "brake_share": round(float(sc[i]), 3),
                "threshold_share": self.min_share,
                "power_watts": _f(power[i]),
            }

        hit = ((bits > 0) | (sc >= self.min_share)) & tab.in_window()
        seen = tab.in_window()
        together, n_hot = node_together(window, tab, hit, seen, self.node_share, self.node_min_gpus)
        gpu_hits = self._gpu_hits(window, tab, hit & ~together, sc, False, ev)
        idx = np.flatnonzero(together)
        if not len(idx):
            return gpu_hits
        node = window.node_of[tab.ent]
        sel = per_key_minute(node, tab.t, idx, sc)
        gidx = window.reg.gpu_index
        braked: dict[tuple, set] = {}
        for i in idx.tolist():
            braked.setdefault((int(node[i]), int(tab.t[i] // 60)), set()).add(gidx[int(tab.ent[i])])

        def node_ev(j):
            i = int(sel[j])
            d = ev(i)
            d["scope"] = "node"
            d["braked_gpus"] = sorted(braked[(int(node[i]), int(tab.t[i] // 60))])
            return d

        node_hits = Hits(
            self.kind,
            node[sel].astype(np.int64),
            np.full(len(sel), -1, np.int64),
            np.full(len(sel), -1, np.int64),
            tab.t[sel],
            sc[sel],
            np.zeros(len(sel), bool),
            Evidence(node_ev, list(range(len(sel)))),
        )
        return concat(self.kind, [gpu_hits, node_hits])
