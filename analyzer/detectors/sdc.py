"""sdc: silent data corruption confirmed by the known-answer canary.

Reads gpu_canary.mismatches (result elements that differ from this GPU's own first answer),
checks / checks_failed (the agent's confirmation round: a failed check is rechecked at once on
the same GPU), reference_match and passed. Each hit says how many checks failed of how many.

- Critical: the GPU disagrees with its own answer and it is confirmed: ``confirm_checks`` (2)
  failed checks, in one round or over the GPU's rows so far. A row without ``checks`` (a producer
  without rechecks) is taken as confirmed.
- Warning: one failed check that its recheck did not repeat (transient, unconfirmed), and a
  digest that differs only from the fleet reference while the GPU agrees with its own first
  answer: deterministic, most likely a driver / engine / library version the reference key does
  not separate (the evidence says so), until the GPU's own answers change too.
- A failed memory pattern alone (gpu_canary.memory_mismatches) is not SDC: memory_errors reads it.
"""

from __future__ import annotations

import numpy as np
from gpufleet.analyzer.detectors.base import Detector, Hits, nz
from gpufleet.analyzer.frame import Window

REFERENCE_ONLY = ("digest differs from the fleet reference only (the GPU repeats its own first "
                  "answer): likely a driver/engine/library mismatch with the reference, not "
                  "corruption, until confirmed")


class SilentDataCorruption(Detector):
    kind = "sdc"
    tables = ("gpu_canary",)
    params = {"confirm_checks": 2, "dwell_seconds": 0.0, "gap_seconds": 86400.0, "resolve_seconds": 86400.0}
    fields = {
        "gpu_canary": (
            "passed", "mismatches", "memory_mismatches", "reference_match", "checks", "checks_failed",
        ),
    }
    summary = "silent data corruption: canary result mismatch"
    panels = (
        ("gpu_canary", "passed", "Canary passed (1) / failed (0)", "value"),
        ("gpu_canary", "mismatches", "Canary mismatching elements", "value"),
        ("gpu", "temperature_gpu_celsius", "GPU temperature (°C)", "value"),
    )

    def _parts(self, window: Window):
        return window.once(self, "parts", lambda: self._parts_uncached(window))

    def _parts_uncached(self, window: Window):
        tab = window.canary
        passed = tab.col("passed")
        mism = tab.col("mismatches")
        mem = nz(tab.col("memory_mismatches"))
        ref = tab.col("reference_match")
        checks = tab.col("checks")
        failed = tab.col("checks_failed")
        # disagrees with its own answer; a legacy row (no mismatch count) that failed without a
        # memory or reference reason counts too
        own = (nz(mism) > 0) | (np.isnan(mism) & (passed == 0) & (mem == 0) & ~(ref == 0))
        ref_only = ~own & (ref == 0)
        n_checks = np.where(np.isnan(checks), 1.0, checks)
        n_failed = np.where(np.isnan(failed), np.where(own, 1.0, 0.0), failed)
        # failed checks of this GPU so far (earlier windows' rows, then this window's, in time order)
        total = np.zeros(len(tab))
        seen = self.__dict__.setdefault("failed_", {})
        rows = np.flatnonzero(own & tab.in_window())
        for i in rows[np.argsort(tab.t[rows], kind="stable")].tolist():
            e = int(tab.ent[i])
            seen[e] = seen.get(e, 0.0) + n_failed[i]
            total[i] = seen[e]
        k = self.confirm_checks
        confirmed = own & (np.isnan(checks) | (n_failed >= k) | (total >= k))
        return own, ref_only, confirmed, n_checks, n_failed, mism

    def score(self, window: Window) -> np.ndarray:
        own, ref_only, confirmed, _, n_failed, mism = self._parts(window)
        return np.where(own, np.maximum(n_failed, 1.0) + np.minimum(nz(mism), 1e9) * 1e-9,
                        np.where(ref_only, 0.5, 0.0))

    def detect(self, window: Window) -> Hits:
        tab = window.canary
        own, ref_only, confirmed, n_checks, n_failed, mism = self._parts(window)
        passed = tab.col("passed")
        ref = tab.col("reference_match")

        def ev(i):
            e = {
                "signals": ["gpu_canary.mismatches", "gpu_canary.checks_failed"],
                "passed": None if np.isnan(passed[i]) else int(passed[i]),
                "mismatches": None if np.isnan(mism[i]) else int(mism[i]),
                "checks": int(n_checks[i]),
                "checks_failed": int(n_failed[i]),
                "failed_of": f"{int(n_failed[i])} of {int(n_checks[i])} checks failed",
                "confirmed": bool(confirmed[i]),
            }
            if not np.isnan(ref[i]):
                e["reference_match"] = int(ref[i])
            if ref_only[i]:
                e["signals"] = ["gpu_canary.reference_match"]
                e["cause"] = REFERENCE_ONLY
            return e

        return self._gpu_hits(window, tab, own | ref_only, lambda: self.score(window), confirmed, ev)
