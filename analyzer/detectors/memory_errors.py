"""memory_errors: device memory failing.

Reads gpu.ecc_uncorrected_volatile_total (any increase: a double-bit error),
ecc_corrected_volatile_total (single-bit storms, judged against the fleet's own rate in the
window), remapped_rows_pending / remapped_rows_failure / retired_pages_pending, and XID events
48 (DBE), 63/64 (row remap), 92 (high SBE rate), 94/95 (contained/uncontained ECC) from
gpu_event (tag type=xid, field code), and gpu_canary.memory_mismatches (the canary's memory
pattern read back wrong: critical, device memory returned other data than was written).
"""

from __future__ import annotations

import numpy as np
from gpufleet.analyzer.detectors.base import Detector, Hits, concat, nz, time_weighted
from gpufleet.analyzer.frame import Window
from gpufleet.analyzer.groupby import dense_inverse

CRITICAL_XIDS = {48, 64, 95}


class MemoryErrors(Detector):
    kind = "memory_errors"
    peer_rows = False  # a GPU's own counters against the fleet rate fit() learned
    tables = ("gpu", "gpu_event", "gpu_canary")
    params = {
        "xids": [48, 63, 64, 92, 94, 95],
        "sbe_count_min": 2,
        "sbe_rate_min": 0.02,
        "sbe_fleet_factor": 50.0,
        "dwell_seconds": 0.0,
        "gap_seconds": 3600.0,
        "resolve_seconds": 7200.0,
    }
    fields = {
        "gpu": (
            "ecc_corrected_volatile_total", "ecc_uncorrected_volatile_total", "remapped_rows_pending",
            "remapped_rows_failure", "retired_pages_pending",
        ),
        "gpu_event": ("code",),
        "gpu_canary": ("memory_mismatches", "checks", "checks_failed"),
    }
    summary = "device memory errors"
    panels = (
        ("gpu", "ecc_corrected_volatile_total", "Corrected ECC errors (/s)", "rate"),
        ("gpu", "ecc_uncorrected_volatile_total", "Uncorrected ECC errors (count)", "value"),
        ("gpu", "remapped_rows_pending", "Row remap pending", "value"),
        ("gpu", "remapped_rows_uncorrectable", "Rows remapped (uncorrectable)", "value"),
    )

    def fit(self, window: Window) -> MemoryErrors:
        tab = window.gpu
        d = tab.delta("ecc_corrected_volatile_total")
        dt = tab.dt()
        ok = np.isfinite(d) & np.isfinite(dt) & (dt > 0)
        # the fleet's own single-bit rate: the 90th percentile of per-GPU rates in the window, never
        # above the third highest (a storm on one or two GPUs cannot raise it however few GPUs
        # report: a small fleet, or the few on time while the rest lands late), exponentially
        # weighted over time
        inv, n = dense_inverse(tab.ent[ok])
        if n >= 3:
            per_gpu = np.bincount(inv, d[ok]) / np.maximum(np.bincount(inv, dt[ok]), 1e-9)
            p90 = min(float(np.quantile(per_gpu, 0.9)), float(np.partition(per_gpu, n - 3)[n - 3]))
            self.fleet_sbe_rate_ = time_weighted(getattr(self, "fleet_sbe_rate_", None), p90, window)
        else:
            self.fleet_sbe_rate_ = getattr(self, "fleet_sbe_rate_", 0.0)
        return self

    def _rates(self, tab):
        """Single-bit errors per second over the trailing two minutes; 0 unless at least
        ``sbe_count_min`` arrived in them (a lone background SBE is not a storm)."""
        d = tab.increase("ecc_corrected_volatile_total")
        count = tab.rolling_sum(d, 120.0)
        return np.where(count >= self.sbe_count_min, count / 120.0, 0.0)

    def _parts(self, window: Window):
        return window.once(self, "parts", lambda: self._parts_uncached(window))

    def _parts_uncached(self, window: Window):
        tab = window.gpu
        thr = max(self.sbe_rate_min, self.sbe_fleet_factor * getattr(self, "fleet_sbe_rate_", 0.0))
        rate = nz(self._rates(tab))
        # any uncorrectable error pages, one that happened somewhere in a gap too (its evidence says so)
        dbe = tab.increase("ecc_uncorrected_volatile_total", gaps=True)
        pend = nz(tab.col("remapped_rows_pending"))
        fail = nz(tab.col("remapped_rows_failure"))
        rpend = nz(tab.col("retired_pages_pending"))
        return thr, rate, dbe, pend, fail, rpend

    def score(self, window: Window) -> np.ndarray:
        thr, rate, dbe, pend, fail, rpend = self._parts(window)
        flags = pend + 10 * fail + rpend
        return np.fmax(np.fmax(rate / thr, dbe * 10), flags)

    def detect(self, window: Window) -> Hits:
        tab = window.gpu
        thr, rate, dbe, pend, fail, rpend = self._parts(window)
        hit = (rate > thr) | (dbe > 0) | (pend > 0) | (fail > 0) | (rpend > 0)
        crit = (dbe > 0) | (fail > 0)

        def ev(i):
            sig = [
                n
                for n, on in (
                    ("ecc_corrected_volatile_total", rate[i] > thr),
                    ("ecc_uncorrected_volatile_total", dbe[i] > 0),
                    ("remapped_rows_pending", pend[i] > 0),
                    ("remapped_rows_failure", fail[i] > 0),
                    ("retired_pages_pending", rpend[i] > 0),
                )
                if on
            ]
            # what is absent was not seen (never "0 uncorrectable" beside an uncorrectable error)
            out = {
                "signals": sig,
                "new_dbe": int(dbe[i]) if dbe[i] > 0 else None,
                "remapped_rows_failure": int(fail[i]) if fail[i] > 0 else None,
                "remapped_rows_pending": int(pend[i]) if pend[i] > 0 else None,
                "retired_pages_pending": int(rpend[i]) if rpend[i] > 0 else None,
                "sbe_rate_per_s": round(float(rate[i]), 4) if rate[i] > 0 else None,
                "sbe_threshold_per_s": round(thr, 4),
            }
            if dbe[i] > 0 and tab.over_gap()[i]:  # the error happened somewhere in the gap before row i
                out["over_gap_seconds"] = round(float(tab.gap()[i]))
            return out

        parts = [self._gpu_hits(window, tab, hit, lambda: self.score(window), crit, ev)]
        parts.append(self._xid_hits(window))
        parts.append(self._canary_hits(window))
        return concat(self.kind, parts)

    def _canary_hits(self, window: Window) -> Hits:
        tab = window.canary
        bad = nz(tab.col("memory_mismatches"))
        checks, failed = tab.col("checks"), tab.col("checks_failed")

        def ev(i):
            e = {"signals": ["gpu_canary.memory_mismatches"], "memory_mismatches": int(bad[i])}
            if not np.isnan(checks[i]):
                e["failed_of"] = f"{int(nz(failed)[i])} of {int(checks[i])} canary checks failed"
            return e

        return self._gpu_hits(window, tab, bad > 0, np.minimum(bad, 1e9), True, ev)

    def _xid_hits(self, window: Window) -> Hits:
        ev_tab = window.event
        code = ev_tab.col("code")
        typ = ev_tab.text.get("type")
        is_xid = (
            np.ones(len(ev_tab), bool)
            if typ is None
            else np.array([t is None or str(t).lower() == "xid" for t in typ], bool)
        )
        hit = is_xid & np.isin(code, list(self.xids))
        crit = np.isin(code, list(CRITICAL_XIDS))

        def ev(i):
            return {"signals": ["gpu_event xid"], "xid": int(code[i])}

        return self._gpu_hits(window, ev_tab, hit, np.where(hit, 1.0, 0.0), crit, ev)
