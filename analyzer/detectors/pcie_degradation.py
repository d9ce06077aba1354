"""pcie_degradation: the GPU's PCIe link replaying or trained below its capability.

Reads gpu.pcie_replay_total (replay rate against an allowance that scales with the link's
generation x lanes: a wider, faster link moves more and may replay more), pcie_link_gen /
pcie_link_width against pcie_link_gen_max / pcie_link_width_max (or the best seen on that GPU).
The generation is judged only under load (links legitimately drop their generation to save power
at idle); the width at any load (a link does not shed lanes at idle: fewer lanes than the GPU has
is a link that trained down). A degraded link stays one incident while its GPU idles, until it
has carried load ``clear_seconds`` at full speed without replays beyond the allowance.

PCIe link error rates (slow tier: pcie_l0_to_recovery_total and the error counters in
``LINK_ERROR_FIELDS``) are a rule of their own, judged as a rate over ``link_error_span_seconds``
against what healthy GPUs accumulate (docs/analyzer.md cites the recordings): the link errors at
``link_errors_per_minute`` or more, or the link falling out of L0 into Recovery (retraining) at
``l0_recovery_per_minute`` or more, is a link taking errors faster than any healthy link does.
"""

from __future__ import annotations

import math

import numpy as np
from gpufleet.analyzer.detectors.base import Detector, Hits, concat, nan_as_zero_ge, nz
from gpufleet.analyzer.frame import Window
from gpufleet.analyzer.groupby import lookup

# PCIe link-layer error counters summed into one link error rate (slow tier; absent where the GPU
# does not report them: counted as no error). Lane errors (183) are left out: a lane error is the
# per-lane view of the receiver errors already counted.
LINK_ERROR_FIELDS = (
    "pcie_receiver_errors_total",
    "pcie_bad_tlp_total",
    "pcie_bad_dllp_total",
    "pcie_naks_received_total",
    "pcie_naks_sent_total",
    "pcie_lcrc_errors_total",
    "pcie_correctable_errors_total",
)


class PcieDegradation(Detector):
    kind = "pcie_degradation"
    peer_rows = False  # a GPU's own link against the best it trained to (fit)
    params = {
        "replay_allowance_per_s": 8 / 60,  # at gen 5 x16, scaled by gen x lanes: DCGM's 8 replays/min
        "load_utilization": 0.2,
        "load_power_watts": 200.0,
        "downgrade_dwell_seconds": 60.0,
        # PCIe link error rates over link_error_span_seconds, per minute: healthy H100/H200 links
        # showed at most ~17/min over 15 min (docs/analyzer.md); 7-10x that is a failing link
        "link_errors_per_minute": 120.0,  # receiver, bad TLP/DLLP, NAKs, LCRC, correctable summed
        "l0_recovery_per_minute": 200.0,  # L0 -> Recovery transitions (the link retraining)
        "link_error_span_seconds": 600.0,
        "dwell_seconds": 0.0,
        "gap_seconds": 600.0,
        "resolve_seconds": 3600.0,
        "clear_seconds": 600.0,  # under load at full speed this long before idle stops holding it
    }
    fields = {
        "gpu": (
            "pcie_link_gen", "pcie_link_width", "pcie_link_gen_max", "pcie_link_width_max",
            "pcie_replay_total", "utilization_gpu_ratio", "power_watts", "pcie_l0_to_recovery_total",
            *LINK_ERROR_FIELDS,
        ),
    }
    summary = "PCIe link degraded"
    panels = (
        ("gpu", "pcie_replay_total", "PCIe replays (/s)", "rate"),
        ("gpu", "pcie_link_width", "PCIe link width (lanes)", "value"),
        ("gpu", "pcie_link_gen", "PCIe generation", "value"),
        ("gpu", "utilization_gpu_ratio", "GPU utilization", "value"),
    )

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
        return window.once(self, "parts", lambda: self._parts_uncached(window))

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
        # replays per second over the trailing minute; a GPU's first rows (under a minute of its data)
        # count the rest of the minute as replay-free, as the link error rates below do: a healthy
        # link's burst of 2 replays in its first 10 s is no 0.2/s
        step, dt = tab.delta("pcie_replay_total"), tab.dt()
        ok = np.isfinite(step) & (nz(dt) > 0)
        span = np.fmax(tab.rolling_sum(np.where(ok, dt, 0.0), 60.0), 60.0)
        rate = tab.rolling_sum(np.where(ok, step, 0.0), 60.0) / span
        # replays over a gap: no rate of the row after it; paged only when even their mean over the
        # gap (a lower bound of the rate somewhere in it) is above the allowance
        gap_rate = tab.gap_rate("pcie_replay_total")
        rate = np.where(gap_rate > allowance, gap_rate, rate)
        load = nan_as_zero_ge(tab.col("utilization_gpu_ratio"), self.load_utilization) | nan_as_zero_ge(
            tab.col("power_watts"), self.load_power_watts
        )
        # the generation may drop at idle (link power management), the width does not: a link trained
        # to fewer lanes than the GPU has is a fault at any load (an idle GPU's x8 link included)
        down = (load & (gen_eff < gmax) & np.isfinite(gen)) | ((width_eff < wmax) & np.isfinite(width))
        # a downgrade must hold for the dwell time under load (a poll during retraining is not one)
        run = _run_seconds(tab, down)
        down_ok = down & (run >= self.downgrade_dwell_seconds)
        # link error rates per minute over the span (a span not yet covered by data counts as
        # error-free: the rate starts low, never high)
        per_min = 60.0 / self.link_error_span_seconds
        errs = sum(_slow_delta(tab, f) for f in LINK_ERROR_FIELDS)
        over = self.link_error_span_seconds  # (longer than a window's context: see trailing_sum)
        err_rate = self.trailing_sum(window, tab, "link_errors", errs, over) * per_min
        l0 = _slow_delta(tab, "pcie_l0_to_recovery_total")
        l0 = self.trailing_sum(window, tab, "l0_to_recovery", l0, over) * per_min
        erring = (err_rate >= self.link_errors_per_minute) | (l0 >= self.l0_recovery_per_minute)
        link_err = (err_rate, l0, erring)
        return rate, allowance, down_ok, gen, gmax, width, wmax, load & ~down & ~erring, link_err

    def score(self, window: Window) -> np.ndarray:
        rate, allowance, down, *_, (err_rate, l0, _) = self._parts(window)
        errs = np.fmax(err_rate / self.link_errors_per_minute, l0 / self.l0_recovery_per_minute)
        return np.fmax(np.fmax(nz(rate) / allowance, down.astype(float)), errs)

    def detect(self, window: Window) -> Hits:
        rate, allowance, down, gen, gmax, width, wmax, full_speed, link_err = self._parts(window)
        err_rate, l0, erring = link_err
        rate = nz(rate)
        hit = (rate > allowance) | down | erring

        tab = window.gpu

        def ev(i):
            out = {
                "signals": [
                    n
                    for n, on in (
                        ("pcie_replay_total", rate[i] > allowance[i]),
                        ("pcie_link_gen/width", down[i]),
                        ("pcie_link_errors", err_rate[i] >= self.link_errors_per_minute),
                        ("pcie_l0_to_recovery", l0[i] >= self.l0_recovery_per_minute),
                    )
                    if on
                ],
                "replay_rate_per_s": round(float(rate[i]), 3),
                "replay_allowance_per_s": round(float(allowance[i]), 3),
                "gen": _i(gen[i]),
                "gen_max": _i(gmax[i]),
                "width": _i(width[i]),
                "width_max": _i(wmax[i]),
                "link_errors_per_min": round(float(err_rate[i]), 1),
                "l0_to_recovery_per_min": round(float(l0[i]), 1),
            }
            if tab.over_gap()[i] and rate[i] > allowance[i]:  # the replays came somewhere in the gap
                out["replay_rate_per_s"] = None
                out["replays_over_gap"] = int(tab.increase("pcie_replay_total", gaps=True)[i])
                out["over_gap_seconds"] = round(float(tab.gap()[i]))
            return out

        new = tab.in_window()
        held = self._hold(window, tab, hit & new, new & full_speed, [("gpu", tab.ent, hit & new)])
        hits = self._gpu_hits(window, tab, hit, lambda: self.score(window), False, ev)
        return concat(self.kind, [hits, held])


def _i(x):
    x = float(x)
    return int(x) if math.isfinite(x) else None


def _slow_delta(tab, name: str) -> np.ndarray:
    """Increase of a slow-tier counter at each row that carries it (0 elsewhere, at resets, over
    gaps and where the GPU does not report it): the counter forward-filled, then differenced."""

    def calc():
        # the forward-filled counter changes only at rows that carry it: differenced over those
        d = np.zeros(len(tab))
        v = tab.cols.get(name)
        if v is None:
            return d
        at = np.flatnonzero(~np.isnan(v))
        if len(at) > 1:
            step = v[at[1:]] - v[at[:-1]]
            step[tab.ent[at[1:]] != tab.ent[at[:-1]]] = np.nan  # the entity's first reading
            step[tab.spans_gap(at[1:], at[:-1])] = np.nan  # errors somewhere in a gap: no span's rate
            d[at[1:]] = np.where(step > 0, step, 0.0)  # NaN, resets (negative) and no change: 0
        return d

    return tab.cached(("slow_delta", name), calc)


def _run_seconds(tab, cond: np.ndarray) -> np.ndarray:
    """Seconds the condition has held continuously on the entity up to each row (0 where false)."""
    out = np.zeros(len(cond))
    rows = np.flatnonzero(cond)
    if len(rows):
        out[rows] = tab.t[rows] - tab.run_start(cond)[rows]
    return out
