"""canary_unchecked: a GPU the SDC canary has not checked for longer than it should.

The agent checks every GPU at least every ``canary.max_age`` (6 h by default), in idle windows
or through job-boundary hooks (``gpufleet canary`` from a Slurm Epilog); a GPU it never reaches
is one whose corruption nobody would see. Reads gpu_canary (when each GPU was last checked) and
gpu (the GPU is still reporting). Warns when a reporting GPU's last check, or its first row if it
was never checked, lies more than ``factor`` x ``max_age_seconds`` back, on hosts where a canary
runs at all (any GPU of the host has a gpu_canary row): a fleet without the canary is not warned.
"""

from __future__ import annotations

import numpy as np
from gpufleet.analyzer.detectors.base import Detector, Hits
from gpufleet.analyzer.frame import Window


def _grow(a: np.ndarray, n: int, fill: float) -> np.ndarray:
    return a if len(a) >= n else np.concatenate([a, np.full(n - len(a), fill)])


class CanaryUnchecked(Detector):
    kind = "canary_unchecked"
    fit_late = True
    tables = ("gpu", "gpu_canary")
    params = {
        "max_age_seconds": 21600.0,  # the agents' canary.max_age
        "factor": 2.0,  # warn at factor x max_age without a check
        "dwell_seconds": 0.0,
        "gap_seconds": 3600.0,
        "resolve_seconds": 3600.0,
    }
    # (it reads when rows arrive, no field)
    fields: dict[str, tuple[str, ...]] = {}
    summary = "SDC canary has not checked this GPU for over twice its max_age"
    panels = (
        ("gpu_canary", "passed", "Canary passed (1) / failed (0)", "value"),
        ("gpu", "utilization_gpu_ratio", "GPU utilization", "value"),
    )

    def fit(self, window: Window) -> CanaryUnchecked:
        n = len(window.reg.gpu_node)
        self.last_check_ = _grow(getattr(self, "last_check_", np.zeros(0)), n, -np.inf)
        self.first_seen_ = _grow(getattr(self, "first_seen_", np.zeros(0)), n, np.inf)
        self.canary_hosts_ = getattr(self, "canary_hosts_", set())
        can = window.canary
        if len(can):
            np.maximum.at(self.last_check_, can.ent, can.t)
            self.canary_hosts_.update(np.unique(window.node_of[can.ent]).tolist())
        gpu = window.gpu
        if len(gpu):
            np.minimum.at(self.first_seen_, gpu.ent, gpu.t)
        return self

    def score(self, window: Window) -> np.ndarray:
        tab = window.gpu
        if not len(tab) or not hasattr(self, "last_check_"):
            return np.zeros(len(tab))
        since = np.maximum(self.last_check_[tab.ent], self.first_seen_[tab.ent])
        return (tab.t - since) / (self.factor * self.max_age_seconds)

    def detect(self, window: Window) -> Hits:
        tab = window.gpu
        if not len(tab) or not getattr(self, "canary_hosts_", None):
            return Hits.none(self.kind)
        sc = self.score(window)
        hosts = np.fromiter(self.canary_hosts_, np.int64, len(self.canary_hosts_))
        on = np.isin(window.node_of[tab.ent], hosts)
        # one hit per GPU and window: its last row
        last = np.zeros(len(tab), bool)
        order = np.lexsort((tab.t, tab.ent))
        ends = np.r_[tab.ent[order][1:] != tab.ent[order][:-1], True]
        last[order[ends]] = True
        hit = on & last & (sc > 1.0)
        checked = self.last_check_

        def ev(i):
            e = int(tab.ent[i])
            never = not np.isfinite(checked[e])
            return {
                "signals": ["gpu_canary"],
                "unchecked_hours": round(float(tab.t[i] - max(checked[e], self.first_seen_[e])) / 3600, 2),
                "last_check": None if never else float(checked[e]),
                "never_checked": never,
                "max_age_hours": self.max_age_seconds / 3600,
            }

        return self._gpu_hits(window, tab, hit, sc, False, ev)
