"""sdc: silent data corruption confirmed by the known-answer canary.

Reads gpu_canary.passed and gpu_canary.mismatches. A canary that does not match bit for bit
is corruption nothing else reports: critical on the first occurrence.
"""

from __future__ import annotations

import numpy as np

from analyzer.detectors.base import Detector, Hits, nz
from analyzer.frame import Window


class SilentDataCorruption(Detector):
    kind = "sdc"
    tables = ("gpu_canary",)

    def __init__(self, dwell_seconds=0.0, gap_seconds=86400.0, resolve_seconds=86400.0):
        self.dwell_seconds = dwell_seconds
        self.gap_seconds = gap_seconds
        self.resolve_seconds = resolve_seconds

    def score(self, window: Window) -> np.ndarray:
        tab = window.canary
        failed = (tab.col("passed") == 0).astype(float)
        return np.fmax(failed, np.minimum(nz(tab.col("mismatches")), 1e9))

    def detect(self, window: Window) -> Hits:
        tab = window.canary
        sc = self.score(window)
        mism = tab.col("mismatches")
        passed = tab.col("passed")

        def ev(i):
            return {
                "signals": ["gpu_canary.passed", "gpu_canary.mismatches"],
                "passed": None if np.isnan(passed[i]) else int(passed[i]),
                "mismatches": None if np.isnan(mism[i]) else int(mism[i]),
            }

        return self._gpu_hits(window, tab, sc > 0, sc, True, ev)
