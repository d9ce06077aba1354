"""pcie_degradation: the GPU's PCIe link replaying or trained below its capability.

Reads gpu.pcie_replay_total (replay rate against an allowance that scales with the link's
generation x lanes: a wider, faster link moves more and may replay more), pcie_link_gen /
pcie_link_width against pcie_link_gen_max / pcie_link_width_max (or the best seen on that GPU).
The generation is judged only under load (links legitimately drop their generation to save power
at idle); the width at any load (a link does not shed lanes at idle: fewer lanes than the GPU has
is a link that trained down). A degraded link stays one incident while its GPU idles, until it
has carried load ``clear_seconds`` at full speed without replays beyond the allowance.
"""

from __future__ import annotations

import numpy as np
from gpufleet.analyzer.detectors.base import Detector, Hits, concat, lookup, nz
from gpufleet.analyzer.frame import Window


class PcieDegradation(Detector):
    kind = "pcie_degradation"

    def __init__(
        self,
        replay_allowance_per_s=8 / 60,
        load_utilization=0.2,
        load_power_watts=200.0,
        downgrade_dwell_seconds=60.0,
        dwell_seconds=0.0,
        gap_seconds=600.0,
        resolve_seconds=3600.0,
        clear_seconds=600.0,
    ):
        self.replay_allowance_per_s = replay_allowance_per_s
        self.load_utilization = load_utilization
        self.load_power_watts = load_power_watts
        self.downgrade_dwell_seconds = downgrade_dwell_seconds
        self.dwell_seconds = dwell_seconds
        self.gap_seconds = gap_seconds
        self.resolve_seconds = resolve_seconds
        self.clear_seconds = clear_seconds

    def fit(self, window: Window) -> PcieDegradation:
        tab = window.gpu
        best_gen = dict(getattr(self, "best_gen_", {}))
        best_width = dict(getattr(self, "best_width_", {}))
        for name, best in (("gen", best_gen), ("width", best_width)):
            v = np.fmax(tab.col(f"pcie_link_{name}_max"), tab.col(f"pcie_link_{name}"))
            ok = np.isfinite(v)
            if ok.any():
                ent, val = tab.ent[ok], v[ok]
                order = np.lexsort((val, ent))
                last = np.ones(len(order), bool)
                last[:-1] = ent[order][1:] != ent[order][:-1]
                ue, top = ent[order][last], val[order][last]  # each entity's highest value
                up = top > lookup(best, ue, default=0.0)
                for e, x in zip(ue[up].tolist(), top[up].tolist(), strict=True):
                    best[e] = x
        self.best_gen_, self.best_width_ = best_gen, best_width
        return self

    def _parts(self, window: Window):
        return self._cached("parts", lambda: self._parts_uncached(window))

    def _parts_uncached(self, window: Window):
        tab = window.gpu
        gen = tab.col("pcie_link_gen")
        width = tab.col("pcie_link_width")
        bg = getattr(self, "best_gen_", {})
        bw = getattr(self, "best_width_", {})
        gmax = np.fmax(tab.ffill("pcie_link_gen_max"), lookup(bg, tab.ent))
        wmax = np.fmax(tab.ffill("pcie_link_width_max"), lookup(bw, tab.ent))
        gen_eff = np.where(np.isfinite(gen), gen, gmax)
        width_eff = np.where(np.isfinite(width), width, wmax)
        allowance = self.replay_allowance_per_s * nz(gmax) * nz(wmax) / 80.0
        allowance = np.where(allowance > 0, allowance, self.replay_allowance_per_s)
        with np.errstate(invalid="ignore", divide="ignore"):
            rate = tab.rolling_mean(tab.delta("pcie_replay_total") / tab.dt(), 60.0)
        load = (nz(tab.col("utilization_gpu_ratio")) >= self.load_utilization) | (
            nz(tab.col("power_watts")) >= self.load_power_watts
        )
        # the generation may drop at idle (link power management), the width does not: a link trained
        # to fewer lanes than the GPU has is a fault at any load (an idle GPU's x8 link included)
        down = (load & (gen_eff < gmax) & np.isfinite(gen)) | ((width_eff < wmax) & np.isfinite(width))
        # a downgrade must hold for the dwell time under load (a poll during retraining is not one)
        run = _run_seconds(tab, down)
        down_ok = down & (run >= self.downgrade_dwell_seconds)
        return rate, allowance, down_ok, gen, gmax, width, wmax, load & ~down

    def score(self, window: Window) -> np.ndarray:
        rate, allowance, down, *_ = self._parts(window)
        return np.fmax(nz(rate) / allowance, down.astype(float))

    def detect(self, window: Window) -> Hits:
        rate, allowance, down, gen, gmax, width, wmax, full_speed = self._parts(window)
        rate = nz(rate)
        hit = (rate > allowance) | down

        def ev(i):
            return {
                "signals": [
                    n
                    for n, on in (
                        ("pcie_replay_total", rate[i] > allowance[i]),
                        ("pcie_link_gen/width", down[i]),
                    )
                    if on
                ],
                "replay_rate_per_s": round(float(rate[i]), 3),
                "replay_allowance_per_s": round(float(allowance[i]), 3),
                "gen": _i(gen[i]),
                "gen_max": _i(gmax[i]),
                "width": _i(width[i]),
                "width_max": _i(wmax[i]),
            }

        tab = window.gpu
        new = tab.in_window()
        held = self._hold(window, tab, hit & new, new & full_speed, [("gpu", tab.ent, hit & new)])
        return concat(self.kind, [self._gpu_hits(window, tab, hit, self.score(window), False, ev), held])


def _i(x):
    return None if not np.isfinite(x) else int(x)


def _run_seconds(tab, cond: np.ndarray) -> np.ndarray:
    """Seconds the condition has held continuously on the entity up to each row (0 where false)."""
    return np.nan_to_num(tab.t - tab.run_start(cond), nan=0.0)
