"""thermal_throttle: clocks held down because the GPU is too hot.

Reads gpu.clock_event_sw_thermal, clock_event_hw_thermal (or bits 0x20/0x40 of
clock_event_reasons) and the throttle-time counters throttle_sw_thermal_ns_total /
throttle_hw_thermal_ns_total, so throttling that starts and ends between two polls counts.
Power capping (0x4) and idle (0x1) are not throttling and are never read as such. A GPU that
throttled stays one incident while it idles or runs a lighter phase (it cannot throttle without
heat) until it has worked ``clear_seconds`` at full load without throttling, at least
``clear_margin_celsius`` below its slowdown temperature.
"""

from __future__ import annotations

import math

import numpy as np
from gpufleet.analyzer.detectors.base import Detector, Hits, concat, nan_as_zero_ge, nan_as_zero_gt, nz, share
from gpufleet.analyzer.frame import Window

SW_THERMAL, HW_THERMAL = 0x20, 0x40


def thermal_bits(tab) -> np.ndarray:
    """1 where a thermal reason is active, from the decoded flags or the bitmask (read-only)."""
    return tab.cached("thermal_bits", lambda: _thermal_bits(tab))


def _thermal_bits(tab) -> np.ndarray:
    flags = np.fmax(tab.col("clock_event_sw_thermal"), tab.col("clock_event_hw_thermal"))
    reasons = tab.col("clock_event_reasons")
    ok = np.isfinite(reasons) & (reasons >= 0) & (reasons < 2**63)
    bits = np.zeros(len(tab), float)
    r = reasons[ok].astype(np.int64)
    bits[ok] = ((r & (SW_THERMAL | HW_THERMAL)) != 0).astype(float)
    return np.fmax(nan_as_zero_gt(flags, 0), bits).astype(float)


class ThermalThrottle(Detector):
    kind = "thermal_throttle"
    peer_rows = False  # a GPU's own throttle counters and clocks
    params = {
        "min_share": 0.05,
        "dwell_seconds": 0.0,
        "gap_seconds": 35.0,
        "resolve_seconds": 3600.0,
        "load_share": 0.8,  # full load (this share of the power limit): where heat would show
        "busy_utilization": 0.5,  # full load where the power limit is not reported
        "clear_margin_celsius": 5.0,  # ... and this far below the slowdown temperature: healthy
        "clear_seconds": 600.0,  # at full load this long without throttling before idle stops holding it
    }
    fields = {
        "gpu": (
            "clock_event_reasons", "clock_event_sw_thermal", "clock_event_hw_thermal",
            "throttle_sw_thermal_ns_total", "throttle_hw_thermal_ns_total", "temperature_gpu_celsius",
            "temperature_slowdown_celsius", "clock_sm_mhz", "power_watts", "power_limit_watts",
            "utilization_gpu_ratio",
        ),
    }
    summary = "thermal throttling (clocks held down by temperature)"
    panels = (
        ("gpu", "temperature_gpu_celsius", "GPU temperature (°C)", "value"),
        ("gpu", "power_watts", "Power (W)", "value"),
        ("gpu", "clock_sm_mhz", "SM clock (MHz)", "value"),
        ("gpu", "throttle_hw_thermal_ns_total", "HW thermal slowdown (share of time)", "share"),
    )

    def score(self, window: Window) -> np.ndarray:
        tab = window.gpu
        s = np.fmax(share(tab, "throttle_sw_thermal_ns_total"), share(tab, "throttle_hw_thermal_ns_total"))
        return np.fmax(nz(s), thermal_bits(tab))

    def detect(self, window: Window) -> Hits:
        tab = window.gpu
        sc = self.score(window)
        bits = thermal_bits(tab)
        hit = (bits > 0) | (sc >= self.min_share)
        temp = tab.col("temperature_gpu_celsius")
        slow = tab.ffill("temperature_slowdown_celsius")
        clock = tab.col("clock_sm_mhz")

        def ev(i):
            return {
                "signals": ["clock_event_sw_thermal/hw_thermal", "throttle_*_thermal_ns_total"],
                "thermal_bits": int(bits[i]),
                "throttle_share": round(float(sc[i]), 3),
                "threshold_share": self.min_share,
                "temperature_gpu_celsius": _f(temp[i]),
                "temperature_slowdown_celsius": _f(slow[i]),
                "clock_sm_mhz": _f(clock[i]),
            }

        new = tab.in_window()
        # at full load, where heat would show: load_share of its power limit or more (busy, where the
        # limit is not reported); a lighter phase of the same job proves nothing
        limit = tab.ffill("power_limit_watts")
        busy = np.where(
            np.isfinite(limit),
            nan_as_zero_ge(tab.col("power_watts"), self.load_share * limit),
            nan_as_zero_ge(tab.col("utilization_gpu_ratio"), self.busy_utilization),
        )
        # ... and with headroom: a GPU at its slowdown temperature that happens not to throttle this
        # minute is no evidence that the problem is gone
        headroom = ~(temp > slow - self.clear_margin_celsius)  # (unknown temperatures: no test)
        held = self._hold(window, tab, hit & new, new & busy & headroom, [("gpu", tab.ent, hit & new)])
        return concat(self.kind, [self._gpu_hits(window, tab, hit, sc, False, ev), held])


def _f(x):
    if x is None:
        return None
    x = float(x)
    return round(x, 2) if math.isfinite(x) else None
