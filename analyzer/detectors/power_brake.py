"""power_brake: the external hardware power brake (PSU/BMC) slowing the GPU.

Reads gpu.clock_event_hw_power_brake (bit 0x80 of clock_event_reasons) and the counter
throttle_hw_power_brake_ns_total (brake time between polls counts). The SW power cap (0x4)
is the driver holding the power limit: healthy, never read here.
"""

from __future__ import annotations

import numpy as np

from analyzer.detectors.base import Detector, Hits, nz, share
from analyzer.detectors.thermal_throttle import _f
from analyzer.frame import Window

HW_POWER_BRAKE = 0x80


class PowerBrake(Detector):
    kind = "power_brake"

    def __init__(self, min_share=0.05, dwell_seconds=0.0, gap_seconds=35.0, resolve_seconds=3600.0):
        self.min_share = min_share
        self.dwell_seconds = dwell_seconds
        self.gap_seconds = gap_seconds
        self.resolve_seconds = resolve_seconds

    def _bits(self, tab) -> np.ndarray:
        return tab.cached("power_brake_bits", lambda: self._bits_uncached(tab))

    @staticmethod
    def _bits_uncached(tab) -> np.ndarray:
        reasons = tab.col("clock_event_reasons")
        ok = np.isfinite(reasons) & (reasons >= 0) & (reasons < 2**63)
        bits = np.zeros(len(tab))
        bits[ok] = (reasons[ok].astype(np.int64) & HW_POWER_BRAKE) != 0
        return np.fmax(nz(tab.col("clock_event_hw_power_brake")) > 0, bits).astype(float)

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

        return self._gpu_hits(window, tab, (bits > 0) | (sc >= self.min_share), sc, False, ev)
