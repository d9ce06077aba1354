"""cooling_degradation: a GPU (or a node, or a rack) running hotter than it should, before it throttles.

Reads gpu.temperature_gpu_celsius, power_watts, temperature_slowdown_celsius and the thermal
clock-event flags, plus a host's inlet temperature where bmc_sensor reports one (a sensor
whose name contains "inlet"). Model, per GPU: ``T - dInlet - b*P - c(t) = a_i + noise`` (dInlet: the
inlet's deviation from the host's usual inlet, 0 when unknown) with a
pooled slope ``b`` (°C/W), the fleet's common mode ``c(t)`` (median over GPUs in the same minute
and power band: fleet-wide inlet swings cancel) and a per-GPU offset ``a_i`` learned robustly
(median, MAD) over the GPU's first ``min_learn_samples`` steady samples (counted at a 10 s poll; the
same span of time at another interval). The excess over that
model, smoothed over ``smooth_seconds``, above ``excess_celsius`` and ``sigma`` robust deviations,
on steady rows is a hit. Throttled rows count too: a GPU throttling where power, inlet and
peers say it should not has a cooling problem; the evidence says whether the hit came before
throttling. When at least ``node_share`` of a node's GPUs (and ``node_min_gpus``) are hot in
the same minute the hit moves to the node (gpu = null), and to the rack (host = null) when
``rack_min_nodes`` nodes of one rack are (unless the rack's hosts report their inlet: then a
rack-wide cause shows in the inlet rule, and hot nodes of the rack are node faults). A node whose
BMC fan sensor says its fans are failing (``bmc_sensor`` with "fan" in its name or type: the state
critical, or the RPM below ``fan_drop_share`` of the fleet's median) is a node fault once its
GPUs run ``fan_excess_celsius`` above their own baselines together: a fan failure on an idle node
warms its GPUs by a few degrees only.

**Time to throttling** (where the GPUs report ``temperature_margin_celsius``, degrees to the
nearest slowdown limit): the margin's fall over the trailing ``margin_trend_seconds`` at the same
power (within 10 %: a margin that moved with the load is no trend) gives the minutes left before
the GPU throttles. A hit with less than ``urgent_seconds`` left is critical (act now, the job is
about to slow down); otherwise the incident stays a warning. Both go in the evidence.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
from gpufleet.analyzer.detectors.base import (
    Detector,
    Evidence,
    Hits,
    concat,
    nan_as_zero_ge,
    nan_as_zero_gt,
    nz,
    rounded,
)
from gpufleet.analyzer.detectors.rack_inlet import RackInletRule, racks_with_inlet
from gpufleet.analyzer.detectors.thermal_throttle import thermal_bits
from gpufleet.analyzer.frame import Window
from gpufleet.analyzer.groupby import buckets, distinct_count, group_median, lookup, raise_latest

DEFAULT_SLOPE = 0.04  # °C per W, from the real H200 trace (39 -> 61 °C for 80 -> 690 W)
MINUTE = 60.0  # the common mode's bucket (s): a minute's GPUs of one power band


class CoolingDegradation(Detector):
    kind = "cooling_degradation"
    peers = True
    fit_late = True  # a host cut off while learning learns from its late rows, in its own order
    params = {
        "min_power_watts": 50.0,
        "min_learn_samples": 60,
        "excess_celsius": 6.0,
        "sigma": 4.0,
        "fleet_spread_celsius": 0.0,
        "smooth_seconds": 120.0,
        "throttle_margin_celsius": 3.0,
        "node_share": 0.5,
        "node_min_gpus": 2,
        "rack_min_nodes": 2,
        "inlet_excess_celsius": 6.0,
        "low_power_watts": 300.0,
        "low_excess_celsius": 3.5,
        "dwell_seconds": 600.0,
        "gap_seconds": 120.0,
        "resolve_seconds": 3600.0,
        "clear_seconds": 600.0,  # judged at load without a hit this long before idle stops holding it
        "inlet_track_seconds": 14400.0,  # time constant of a host's tracked usual inlet (rack scope)
        "urgent_seconds": 1800.0,  # thermal margin: throttling sooner than this makes the incident critical
        "margin_trend_seconds": 600.0,  # thermal margin: its fall over this span gives the time to throttling
        "fan_excess_celsius": 1.5,  # a node's GPUs this far above baseline together, its BMC fans failing
        "fan_drop_share": 0.6,  # a fan below this share of the fleet's median RPM is failing
        "inlet_rise_seconds": 2700.0,  # a rack's inlet excess pages while it still rises over this span
        "inlet_rise_celsius": 1.5,  # ... by this much, a third in each third of it
        "near_limit_celsius": 5.0,  # ... or while a GPU of the rack is this close to its slowdown
        "slope_span_seconds": 300.0,  # a model's first slope: from the rows of such a span (on its grid)
        "slope_refine_seconds": 7200.0,  # a model's slope is refitted over its first this long
        "settle_seconds": 180.0,  # ... on rows this long after a power step of 40 W
        "slope_doubt": 0.15,  # the bar rises by this share of the °C a GPU rose above its baseline's power
    }
    # bmc_sensor: the inlet temperature and fan rows (the bmc and fan tables)
    fields = {
        "gpu": (
            "temperature_gpu_celsius", "power_watts", "temperature_slowdown_celsius",
            "temperature_margin_celsius", "utilization_memory_ratio",
        ),
        "bmc_sensor": ("value", "state_code"),
    }
    summary = "running hotter than its power, inlet and peers predict"
    panels = (
        ("gpu", "temperature_gpu_celsius", "GPU temperature (°C)", "value"),
        ("gpu", "temperature_memory_celsius", "Memory temperature (°C)", "value"),
        ("gpu", "power_watts", "Power (W)", "value"),
        ("gpu", "clock_sm_mhz", "SM clock (MHz)", "value"),
    )

    # ------------------------------------------------------------------ features
    def _inlet(self, window: Window) -> np.ndarray:
        """Inlet °C per GPU row (NaN where the node reports none)."""
        tab = window.gpu
        bmc = window.bmc
        out = np.full(len(tab), np.nan)
        if not len(bmc) or "inlet" not in bmc.cols:
            return out
        node = window.node_of[tab.ent]
        # latest inlet reading per host at or before each GPU row (the table is in (host, time) order)
        h, t, v = bmc.ent, bmc.t, bmc.cols["inlet"]
        key = h.astype(np.float64) * 1e7 + (t - t.min())
        q = node.astype(np.float64) * 1e7 + (tab.t - t.min())
        j = np.searchsorted(key, q, side="right") - 1
        ok = (j >= 0) & (h[np.maximum(j, 0)] == node)
        out[ok] = v[j[ok]]
        return out

    def _no_prev(self, tab, prev: np.ndarray) -> np.ndarray:
        """Rows with no previous reading (``prev`` NaN: a GPU's first, or after a missing one),
        which count as a step (nothing before them to settle from); not at the table's start, where
        the readings before are outside the table, not missing. (Online, a window a poll long
        learns its model's first slope span from its context, which begins a poll before the span:
        those rows are settled in batch, whose table reaches further back.)"""
        edge = (tab.t.min() if len(tab) else 0.0) + 2 * getattr(self, "poll_", 10.0)
        return np.isnan(prev) & (tab.t > edge)

    def _features(self, window: Window):
        return window.once(self, "features", lambda: self._features_uncached(window))

    def _features_uncached(self, window: Window):
        tab = window.gpu
        temp = tab.col("temperature_gpu_celsius")
        power = tab.col("power_watts")
        pprev = tab.prev(power)
        # steady: no power drop above 40 W in the last minute (temperature lags power by tens of
        # seconds: after a drop the GPU is still warmer than its new power predicts). After a rise it
        # is cooler than predicted, so those rows stay: a GPU that overheats as its job starts shows.
        jump = (pprev - power >= 40.0) | self._no_prev(tab, pprev)
        settled = tab.rolling_count(jump, 60.0) == 0
        valid = (power >= self.min_power_watts) & (temp > 0) & (temp < 150)
        steady = valid & settled
        throttled = thermal_bits(tab) > 0
        inlet = self._inlet(window)
        slope = self._slope_rows(window)
        # the inlet enters as its deviation from the host's usual inlet, so a host whose inlet
        # readings come and go (late, missing, a BMC that answers sometimes) does not jump by 25 °C
        node = window.node_of[tab.ent] if len(tab) else np.zeros(0, np.int64)
        ref = lookup(getattr(self, "inlet_ref_", {}), node)
        ref[lookup(getattr(self, "inlet_when_", {}), node) >= window.as_of(tab.t)] = np.nan  # (as of)
        dev = np.where(np.isfinite(inlet) & np.isfinite(ref), inlet - ref, 0.0)
        # within a minute of a power drop the model takes the minute's highest power: a lower bound
        # of the excess (a GPU whose power fell as it got hotter, e.g. throttling, still shows)
        p_eff = power
        if not settled.all():
            p_eff = power.copy()
            rows = np.flatnonzero(~settled)
            p_eff[rows] = _recent_max(tab, power, 60.0, rows)
        # memory-bound work spends part of the board's power in its HBM, which the die's sensor sees
        # little of: at the same power the die runs cooler the busier its memory (an A100 ~11 °C
        # between compute and memory-bound work). Learned with the slope, per model (0 where not).
        umem = tab.ffill("utilization_memory_ratio")
        u = temp - dev - slope * p_eff + self._mem_rows(window) * np.where(np.isfinite(umem), umem, 0.0)
        u = np.where(valid, u, np.nan)
        # the common mode per minute and power band (idle vs loaded GPUs move differently), taken
        # over each GPU's deviation from its own baseline where GPUs have one: which GPUs sit in a
        # band changes from minute to minute (a node going idle joins the idle band) and their raw
        # levels differ by their offsets, which would move a median of raw levels
        uc = np.where(throttled | ~steady, np.nan, u)
        band = nan_as_zero_ge(power, self.low_power_watts).astype(np.int64)
        # (over deviations from each GPU's own baseline the room's common mode is the same for every
        # model; split by model it would be a few nodes' own, and absorb a node's fault)
        # In a mixed fleet a baseline learned where too few GPUs had one (the minutes below) is an
        # offset from its own model's raw level, not the fleet's: its frame, the model's level above
        # the fleet's then, is learned with it and taken out here, so every GPU's deviation is in the
        # fleet's frame (an A100 rack learned against the A100s' level is not 4 °C "hot" once the
        # fleet-wide median, mostly H200s, is its common mode), and each GPU is judged in its own.
        groups = {"band": buckets(tab.t, MINUTE, band)}
        own, _, frame, p_at, _ = self._reference(window, power, as_of=True)
        frame = np.where(np.isfinite(frame), frame, 0.0)
        c = np.full(len(u), np.nan)
        # what a baseline is learned against: its band's common mode over the GPUs judged against a
        # baseline learned in that band. A GPU judged at idle against its all-load baseline, learned
        # under load, deviates by its model's idle level below the line its slope draws (an H200 6 °C
        # above its idle peers), and the judged common mode over a mix of the two moves with who is
        # idle that minute: a low-power baseline learned where most idle GPUs had only their load
        # baseline is 6 °C low once the idle band is of GPUs with idle baselines (an idle node paged)
        learn_c = np.full(len(u), np.nan)
        if np.isfinite(own).any():
            dev = uc - own - frame
            c = _common_mode(groups, tab.t, dev, np.isfinite(u)) + frame
            matched = band == nan_as_zero_ge(p_at, self.low_power_watts)
            med, cnt = group_median(groups["band"][0], np.where(matched, dev, np.nan), groups["band"][1])
            learn_c = np.where(cnt >= 8, med, np.nan)[groups["band"][0]] + frame
        # where no GPU has a baseline of a row's band yet (as of the row), the band's chain starts
        # from its raw level (below); where some have but too few are in its minute, nothing is
        # learned from it
        unchained = ~self._bands_learned(window.as_of(tab.t), band) & np.isfinite(u)
        # per row: the frame its value is in, which a baseline learned from it takes: the frame of
        # the baseline it is judged against (a GPU learning its high-power baseline while judged
        # against its all-load one, learned in the fleet's first minutes, is in that one's frame)
        level = frame.copy()
        few = np.isnan(c) & np.isfinite(u)
        raw_start = few | unchained
        if raw_start.any():  # minutes where too few GPUs have a baseline yet: their raw levels
            level[unchained] = 0.0  # (the fleet's raw level: no frame)
            idx = np.flatnonzero(_same_minute(tab.t, raw_start))
            if np.isfinite(uc[idx]).any():  # (not so in a table's first minute: nothing steady yet)
                part = {"band": buckets(tab.t[idx], MINUTE, band[idx])}
                raw = _common_mode(part, tab.t[idx], uc[idx], raw_start[idx])
                if len(getattr(self, "slopes_", {})) > 1:  # a mixed fleet: raw levels per model
                    mb = band[idx] + 2 * window.reg.model_ids()[tab.ent[idx]]
                    per_model = _common_mode({"band": buckets(tab.t[idx], MINUTE, mb)}, tab.t[idx], uc[idx],
                                             raw_start[idx])
                    level[idx] = np.where(unchained[idx] & np.isfinite(raw), per_model - raw, level[idx])
                    raw = per_model
                c[idx] = np.where(few[idx], raw, c[idx])
                learn_c[idx] = np.where(unchained[idx], raw, learn_c[idx])
        level = np.where(np.isfinite(level), level, 0.0)
        if unchained.any() and not self._mostly_modelled(window):
            # a minute's raw level stands for the fleet's only where the GPUs it is taken over (those
            # of models with a slope) are most of the fleet: where most have none yet it is a few
            # models' own, and a baseline learned from it would be in another frame than those
            # learned once the rest are modelled (an A100 node of a warm rack learned idle against
            # the A100s' own level in a fleet's first window, the H200s' slope not learned yet, then
            # judged in the fleet's: 6 °C "hot"). No frame (NaN): nothing is learned from those rows
            # (see fit). A minority model waiting for its slope holds nobody back: it learns later
            # in the frame the others' baselines keep.
            level[unchained] = np.nan
        level[np.isnan(learn_c)] = np.nan
        return u - c, steady, throttled, temp, power, level, u - learn_c

    def _bands_learned(self, as_of: np.ndarray, band: np.ndarray) -> np.ndarray:
        """Per row: whether some GPU had a baseline learned in the row's power band (idle, loaded)
        before ``as_of`` (the row's, see Window.as_of)."""
        whens = [getattr(self, f"when_{x}", {}) for x in ("lo_", "hi_", "")]
        key = tuple(len(w) for w in whens)
        if getattr(self, "_first", (None,))[0] != key:
            first = [math.inf, math.inf]  # per band, when its first baseline was frozen
            for x, w in zip(("lo_", "hi_", ""), whens, strict=True):
                for e, when in w.items():
                    b = int(x == "hi_" or (x == "" and self.p_at_[e] >= self.low_power_watts))
                    first[b] = min(first[b], when)
            self._first = (key, np.array(first))
        return as_of > self._first[1][band]

    def _band_gaps(self, window: Window, as_of: float = math.inf) -> np.ndarray:
        """Per GPU model: its GPUs' idle baselines above their load ones (median, each in the fleet's
        frame; NaN for a model with no GPU holding both), of the baselines frozen before ``as_of``."""
        lo, hi = getattr(self, "offset_lo_", {}), getattr(self, "offset_hi_", {})
        w_lo, w_hi = getattr(self, "when_lo_", {}), getattr(self, "when_hi_", {})
        both = [e for e in lo if e in hi and max(w_lo.get(e, -math.inf), w_hi.get(e, -math.inf)) < as_of]
        key = (tuple(both), len(window.reg.gpu_model))
        if getattr(self, "_gaps", (None,))[0] != key:
            models = window.reg.model_ids()
            gaps = np.full(int(models.max()) + 1 if len(models) else 0, np.nan)
            if both:
                d = np.array([lo[e] + self.frame_lo_[e] - hi[e] - self.frame_hi_[e] for e in both])
                gaps = group_median(models[np.array(both)], d, len(gaps))[0]
            self._gaps = (key, gaps)
        return self._gaps[1]

    def _mostly_modelled(self, window: Window) -> bool:
        """Whether most of the table's GPUs are of a model whose slope is learned."""
        tab = window.gpu
        slopes = getattr(self, "slopes_", {})
        if not len(tab):
            return True
        models = window.reg.model_ids()[np.unique(tab.ent)]
        return 2 * int(np.isin(models, list(slopes)).sum()) > len(models)

    def _slope_rows(self, window: Window):
        """The °C per W of each row's GPU model (a scalar where the fleet has one model); NaN for a
        model whose own slope is not learned yet (its GPUs are neither learned nor judged until then,
        rather than judged by another model's heatsinks)."""
        slopes = getattr(self, "slopes_", {})
        if len(slopes) <= 1 and (not len(window.gpu) or int(window.reg.model_ids().max(initial=0)) == 0):
            return getattr(self, "slope_", np.nan)  # (none before the first span is fitted)
        return lookup(slopes, window.reg.model_ids()[window.gpu.ent])

    def _mem_rows(self, window: Window):
        """The °C per unit of memory utilisation of each row's GPU model (as ``_slope_rows``)."""
        mems = getattr(self, "mems_", {})
        if len(mems) <= 1 and (not len(window.gpu) or int(window.reg.model_ids().max(initial=0)) == 0):
            return getattr(self, "mem_", 0.0)
        return np.nan_to_num(lookup(mems, window.reg.model_ids()[window.gpu.ent]))

    def _slope_span(self, window: Window) -> np.ndarray | None:
        """The rows a first slope is fitted on in this window: those of the ``slope_span_seconds``
        ending at the last multiple of it the window reaches (None where it reaches none). The same
        rows whatever the window's size: a batch window ends there, an online one a poll long holds
        the span in its context; so online and batch fit the same first slopes."""
        span = self.slope_span_seconds
        g = math.floor(window.end / span) * span
        if g <= window.start:
            return None
        tab = window.gpu
        return (tab.t >= g - span) & (tab.t < g)

    @staticmethod
    def _due(window: Window) -> np.ndarray:
        """The rows a window learns from: the minutes (the common mode's buckets) of its fresh rows
        that end in it. A minute that windows a poll long split is learned whole in the window that
        completes it, against its whole minute's common mode, as a batch window (whole minutes)
        learns it; each row once."""
        tab = window.gpu
        end = (np.floor(tab.t / MINUTE) + 1) * MINUTE
        return (end > window.start) & (end <= window.end) & window.analyses(window.node_of[tab.ent])

    def _fit_slopes(self, window: Window, fresh: np.ndarray) -> np.ndarray:
        """The pooled slope (``slope_``) and one per GPU model (``slopes_``), each from the first
        slope span (see ``_slope_span``) with enough of its own rows (refined after: _refine_slopes).
        Returns the rows to learn from: ``fresh``, and the span of a model whose slope it just
        learned (its rows were never learned from: a model without a slope is neither learned nor
        judged)."""
        slopes = self.slopes_ = getattr(self, "slopes_", {})
        mems = self.mems_ = getattr(self, "mems_", {})
        tab = window.gpu
        span = self._slope_span(window)
        if not len(tab) or span is None or not span.any():
            return fresh
        if not hasattr(self, "slope_"):
            self.slope_, self.mem_ = self._fit_slope(window, span)
        ids = window.reg.model_ids()
        mrow = ids[tab.ent]
        models = np.unique(mrow[span]).tolist()
        if len(models) == 1 and not slopes:
            slopes[models[0]] = self.slope_  # one model: the pooled slope is its own
            mems[models[0]] = self.mem_
            learned = models
        else:
            learned = []
        late = bool(slopes) and not learned  # a model first seen after the fleet's first span
        end = float(tab.t[span].max())
        for m in models:
            if m in slopes:
                continue
            got = self._fit_slope(window, span & (mrow == m), default=None)
            since = self.__dict__.setdefault("slope_wait_", {}).setdefault(m, end)
            if got is None and end - since >= 3600:  # its power never moved: the physical default
                got = DEFAULT_SLOPE, 0.0
            if got is not None:
                slopes[m], mems[m] = got
                learned.append(m)
                if late:
                    self.model_learned_ = {**getattr(self, "model_learned_", {}), m: end}
        return fresh | (span & np.isin(mrow, learned)) if learned else fresh

    def _reference(self, window: Window, power, as_of: bool = False) -> tuple[np.ndarray, ...]:
        """Per row: the GPU's learned offset, the bar its excess must pass, the offset's frame (the
        common mode it was learned against), and the power and temperature it was learned at. At
        low power the low-power baseline with the lower bar, at load the high-power one, where the
        GPU has them; otherwise the baseline over all steady load. As learned when asked: a window's
        features take the baselines from before its fit, its excess (what detect judges) from after
        it (a baseline frozen in this window counts). ``as_of``: each row with the baselines frozen
        before its batch window only (``Window.as_of``: what the features take, as a batch run has
        them, however the row arrives: online a poll's window, a late window's peers analysed in
        their own time before it, have baselines a batch run does not have yet)."""
        tab = window.gpu
        t0 = window.as_of(tab.t) if as_of else np.full(len(tab), np.inf)
        # per band, the rows whose GPU's baseline was frozen since their batch window began (a
        # GPU's baseline not frozen yet is NaN already: NaN >= t is False)
        later = {b: lookup(getattr(self, f"when_{b}", {}), tab.ent) >= t0 for b in ("", "lo_", "hi_")}

        def learned(name):  # name: "offset_", "scale_lo_", ... (a baseline's band ends it)
            v = lookup(getattr(self, name, {}), tab.ent)
            band = name[-3:] if name[-3:] in ("lo_", "hi_") else ""
            return np.where(later[band], np.nan, v)

        a = learned("offset_")
        low = nz(power) < self.low_power_watts
        a_lo, a_hi = learned("offset_lo_"), learned("offset_hi_")
        lo = low & np.isfinite(a_lo) & np.isfinite(a)  # the lower bar once the GPU has a full baseline
        hi = ~low & np.isfinite(a_hi)
        # (np.select's choice, as nested np.where: the first condition that holds wins)
        base = np.where(lo, a_lo, np.where(hi, a_hi, a))
        # a GPU judged in one band against its all-load baseline learned in the other is judged
        # where its model's GPUs with a baseline in each band put it: a model's idle level sits off
        # the line its slope draws through its load (an A100 idle 6 °C above it), and its idle peers
        # are judged against their idle baselines
        at_load = nan_as_zero_ge(learned("p_at_"), self.low_power_watts)
        up = low & ~lo & at_load  # idle, against a baseline learned under load
        down = ~low & ~hi & ~at_load & np.isfinite(a)  # loaded, against one learned idle
        if (up | down).any():
            models = window.reg.model_ids()[tab.ent]
            gap = np.zeros(len(tab))
            for g in np.unique(t0[up | down]).tolist():  # (as of each row)
                rows = t0 == g
                gap[rows] = np.nan_to_num(self._band_gaps(window, g)[models[rows]])
            base = base + np.where(up, gap, np.where(down, -gap, 0.0))
        frame = np.where(lo, learned("frame_lo_"), np.where(hi, learned("frame_hi_"), learned("frame_")))
        thr = np.where(
            lo,
            np.fmax(self.low_excess_celsius, self.sigma * learned("scale_lo_")),
            np.where(
                hi,
                np.fmax(self.excess_celsius, self.sigma * learned("scale_hi_")),
                np.fmax(self.excess_celsius, self.sigma * learned("scale_")),
            ),
        )
        p_at, t_at = (np.where(lo, learned(f"{x}_lo_"), np.where(hi, learned(f"{x}_hi_"), learned(f"{x}_")))
                      for x in ("p_at", "t_at"))
        return base, thr, frame, p_at, t_at

    # ------------------------------------------------------------------ learning
    def fit(self, window: Window) -> CoolingDegradation:
        tab = window.gpu
        # each row is learned from once, whatever windows it falls in (a window's context rows are
        # the window before's; a late host's peers' rows were learned in time): what a baseline
        # learns does not depend on the window size, nor on a host's rows landing late
        learn = self._fit_slopes(window, self._due(window))  # (and a span just given its slope)
        self.samples_ = getattr(self, "samples_", {})
        self.offset_ = getattr(self, "offset_", {})
        self.scale_ = getattr(self, "scale_", {})
        if len(tab):
            self._learn_baselines(window, learn)
        # what the window's rows teach that its features do not take (as a batch window learns
        # after it is judged, and a row's features take what was learned before its batch window)
        self._refine_slopes(window, learn)
        self._learn_inlet(window)
        return self

    def _learn_inlet(self, window: Window) -> None:
        """Each host's usual inlet: the median of its first ten BMC inlet readings, each reading
        taken once (a late window's: its late hosts'), and when the tenth was (``inlet_when_``)."""
        refs = self.inlet_ref_ = getattr(self, "inlet_ref_", {})
        when = self.__dict__.setdefault("inlet_when_", {})
        seen = self.__dict__.setdefault("inlet_seen_", {})
        bmc = window.bmc
        if not len(bmc) or "inlet" not in bmc.cols:
            return
        v = bmc.cols["inlet"]
        ok = bmc.in_window() & np.isfinite(v) & window.analyses(bmc.ent)
        for h in np.unique(bmc.ent[ok]).tolist():
            if h in refs:
                continue
            got = seen.setdefault(h, [])
            rows = np.flatnonzero(ok & (bmc.ent == h))[: 10 - len(got)]
            got.extend(zip(bmc.t[rows].tolist(), v[rows].tolist(), strict=True))
            if len(got) >= 10:
                refs[h] = float(np.median([x for _t, x in got]))
                when[h] = got[-1][0]
                del seen[h]

    def _learn_baselines(self, window: Window, learn: np.ndarray) -> None:
        tab = window.gpu
        # (the window's features, which detect() reuses: its rows against the baselines learned
        # before it; cm: the frame of each row, see _features)
        _, steady, *_, cm, v = self._features(window)
        for band in ("", "lo_", "hi_"):
            for name in ("samples", "offset", "scale", "frame", "p_at", "u_at", "t_at", "when"):
                setattr(self, f"{name}_{band}", getattr(self, f"{name}_{band}", {}))
        # nothing is learned from a GPU (node) held as faulty: its broken state is not its normal
        good = (np.isfinite(v) & np.isfinite(cm) & steady & (thermal_bits(tab) == 0)
                & ~self._held_rows(window))
        power, temp = tab.col("power_watts"), tab.col("temperature_gpu_celsius")
        umem = np.nan_to_num(tab.ffill("utilization_memory_ratio"))
        low = nz(power) < self.low_power_watts
        # the baseline over all steady load, and one per power band: a GPU's own slope differs from
        # the pooled one by a few percent (its heatsink, its paste), a few degrees between idle and
        # full load; at low power a degrading heatsink shows only a few degrees (the excess scales
        # with power), which a baseline learned at high power would hide
        # min_learn_samples is counted at a 10 s poll: the same time span at the data's own interval
        # (20 min of a 60 s poll is 20 samples, not 2 h), never fewer than 20 samples
        if not hasattr(self, "poll_"):
            dt = tab.dt()
            dt = dt[np.isfinite(dt) & (dt > 0)]
            if len(dt) >= 20:
                self.poll_ = float(np.median(dt))
        n_learn = max(20, round(self.min_learn_samples * 10.0 / getattr(self, "poll_", 10.0)))
        for ok, band, need in (
            (good & learn, "", n_learn),
            (good & learn & low, "lo_", n_learn),
            (good & learn & ~low, "hi_", n_learn),
        ):
            samples, offset, scale, frame, p_at_, u_at_, t_at_, when_ = (
                getattr(self, f"{x}_{band}")
                for x in ("samples", "offset", "scale", "frame", "p_at", "u_at", "t_at", "when")
            )
            ok = ok & np.isnan(lookup(offset, tab.ent))  # GPUs without a frozen (finite) baseline
            ready = []  # the GPUs whose samples this window brought to ``need``
            if ok.any():
                ents = tab.ent[ok]
                order = np.argsort(ents, kind="stable")  # (the table is in time order per GPU)
                # per sample (a row): its value, its frame, the power and memory utilisation it was
                # taken at (for a refitted slope to move it by), the temperature and the time; per GPU
                # a list of arrays, one per window, its first ``need`` samples in all
                block = np.column_stack([v[ok], cm[ok], power[ok], umem[ok], temp[ok], tab.t[ok]])[order]
                u, first = np.unique(ents[order], return_index=True)
                bounds = first.tolist() + [len(ents)]
                for e, lo, hi in zip(u.tolist(), bounds[:-1], bounds[1:], strict=True):
                    chunks = samples.setdefault(e, [])
                    room = need - sum(len(c) for c in chunks)
                    chunks.append(block[lo:min(hi, lo + room)].copy())  # (a copy: not the block)
                    if hi - lo >= room:
                        ready.append(e)
            # freeze a GPU's baseline once it has seen enough steady samples: median and MAD
            if ready:
                arrs = [np.concatenate(samples.pop(e)) for e in ready]
                g = np.repeat(np.arange(len(ready)), [len(a) for a in arrs])
                got = np.concatenate(arrs)
                # the frame (the common mode it was learned in), the power, memory utilisation and
                # temperature
                cmed, p_at, u_at, t_at = (group_median(g, got[:, k], len(ready))[0] for k in (1, 2, 3, 4))
                # each sample in the fleet's frame (its value plus its own frame): a GPU whose samples
                # span the fleet's first minutes (raw levels per model, a frame) and the minutes after
                # (each GPU's deviation, no frame) learns one level, not the median of two
                vals = got[:, 0] + got[:, 1]
                done = raise_latest(np.full(len(ready), -np.inf), g, got[:, 5])  # its last sample's time
                med = group_median(g, vals, len(ready))[0]
                mad = group_median(g, np.abs(vals - med[g]), len(ready))[0]
                per_gpu = (med - cmed, mad, cmed, p_at, u_at, t_at, done)
                for e, m, d, f, pw, um, tc, w in zip(ready, *(a.tolist() for a in per_gpu), strict=True):
                    offset[e] = m
                    when_[e] = w  # (its last sample's time: the baseline is the GPU's from then on)
                    scale[e] = max(1.4826 * d, 0.25)
                    frame[e] = f
                    p_at_[e], u_at_[e], t_at_[e] = pw, um, tc  # the load it was learned at

    def _slope_rows_of(self, window: Window, rows: np.ndarray | None = None):
        """What a slope is fitted on: (ok, temperature, power, memory utilisation) of the window's
        loaded rows without thermal throttling (and ``rows``)."""
        tab = window.gpu
        t, p = tab.col("temperature_gpu_celsius"), tab.col("power_watts")
        ok = np.isfinite(t) & np.isfinite(p) & (p > 50) & (thermal_bits(tab) == 0)
        if rows is not None:
            ok &= rows
        return ok, t, p, tab.ffill("utilization_memory_ratio")

    def _fit_slope(self, window: Window, rows: np.ndarray | None = None, default=(DEFAULT_SLOPE, 0.0)):
        """(°C per W, °C per unit of memory utilisation) from the window's loaded rows, each GPU
        against its own means; ``default`` where power barely moves (see ``_slope_of``)."""
        tab = window.gpu
        ok, t, p, um = self._slope_rows_of(window, rows)
        low = ok & (nz(um) <= 0.5)
        got = _slope_of(*(_subset_moments(tab.ent, t, p, um, sel) for sel in (ok, low)))
        return default if got is None else got

    def _refine_slopes(self, window: Window, fresh: np.ndarray) -> None:
        """A model's slope learned from one window reads the heatsink from the ramps and jobs of
        minutes; its baselines learned at idle are then judged at full load through it (an A100's
        0.06 °C/W from a first window against 0.08 over a day: 6 °C at 400 W). Over its first
        ``slope_refine_seconds`` the slope is refitted on the settled rows of every window (no step
        of 40 W within ``settle_seconds``: the temperature has caught up with the power), the sums
        kept per GPU; where the refit moves it by more than a tenth the slope changes, and the
        baselines already learned move with it (by the slope's change times the power they were
        learned at), so what they judge stays the same physics. The sums take each window's learned
        rows; the refit is made as a batch window ends (a window reaching the batch grid), after the
        window is judged, so a row's features take the slope as of its batch window, online as in
        batch."""
        tab = window.gpu
        slopes = self.slopes_
        if not len(tab) or not slopes:
            return
        ids = window.reg.model_ids()
        since = self.__dict__.setdefault("refine_since_", {})
        end = math.ceil(window.end / window.grid) * window.grid  # (its batch window's end)
        if all(m in since and end - since[m] > self.slope_refine_seconds
               for m in np.unique(ids[tab.ent]).tolist()):
            return  # every model here is past its refit: no per-window work once a fleet has settled
        ok, t, p, um = self._slope_rows_of(window)
        pprev = tab.prev(p)
        step = (np.abs(p - pprev) >= 40.0) | self._no_prev(tab, pprev)
        ok &= fresh & (tab.rolling_count(step, self.settle_seconds) == 0) & ~self._held_rows(window)
        for m in np.unique(ids[tab.ent[ok]]).tolist():
            since.setdefault(m, end - window.grid)
        going = {m for m, t0 in since.items() if m in slopes and end - t0 <= self.slope_refine_seconds}
        if not going:
            return
        ok &= np.isin(ids[tab.ent], list(going))
        size = len(ids)  # (every GPU id)
        sums = self.__dict__.setdefault("slope_sums_", [np.zeros((0, 9)), np.zeros((0, 9))])
        for i, sel in enumerate((ok, ok & (nz(um) <= 0.5))):
            got = _subset_moments(tab.ent, t, p, um, sel, size)
            grown = np.zeros((size, 9))
            grown[: len(sums[i])] = sums[i]
            sums[i] = grown + got
        if math.floor(window.end / window.grid) * window.grid <= window.start:
            return  # (the refit where a batch window ends: this window reaches none)
        for m in sorted(going):
            got = _slope_of(sums[0][ids == m], sums[1][ids == m])
            if got is not None and abs(got[0] - slopes[m]) > 0.1 * slopes[m]:
                self._reslope(window, m, *got)

    def _reslope(self, window: Window, m: int, b: float, k: float) -> None:
        """Model ``m``'s slope (and memory term) becomes ``b`` (``k``); its GPUs' baselines move
        with it, each by the change times the power (memory utilisation) it was learned at."""
        db, dk = self.slopes_[m] - b, self.mems_[m] - k
        self.slopes_[m], self.mems_[m] = b, k
        if len(self.slopes_) == 1:
            self.slope_, self.mem_ = b, k
        ids = window.reg.model_ids()
        for band in ("", "lo_", "hi_"):
            offset, u_at = getattr(self, f"offset_{band}", {}), getattr(self, f"u_at_{band}", {})
            for e, pw in getattr(self, f"p_at_{band}", {}).items():
                if ids[e] == m:
                    offset[e] += db * pw - dk * u_at[e]
            for e, chunks in getattr(self, f"samples_{band}", {}).items():
                if ids[e] == m:
                    for c in chunks:
                        c[:, 0] += db * c[:, 2] - dk * c[:, 3]

    def _held_rows(self, window: Window) -> np.ndarray:
        """Rows of GPUs (nodes) held as faulty: nothing is learned from them."""
        tab = window.gpu
        held = list(getattr(self, "latch_gpu_", {}))
        held_nodes = list(getattr(self, "latch_node_", {}))
        if not (held or held_nodes):
            return np.zeros(len(tab), bool)
        return np.isin(tab.ent, held) | np.isin(window.node_of[tab.ent], held_nodes)

    # ------------------------------------------------------------------ scoring
    def _excess(self, window: Window) -> Excess:
        return window.once(self, "excess", lambda: self._excess_uncached(window))

    def _excess_uncached(self, window: Window) -> Excess:
        tab = window.gpu
        v, steady, throttled, temp, power, *_ = self._features(window)
        base, thr, _, p_at, t_at = self._reference(window, power)
        # a baseline judged above the power it was learned at is extrapolated by its model's slope,
        # and a GPU's own heatsink differs from its model's by a few percent (a node's airflow, a
        # GPU's paste; a slope fitted in a fleet's first hours reads a little low): the bar rises by
        # slope_doubt of the GPU's temperature rise since (an A100 learned at 40 °C idle, judged at
        # 66 °C under load: 4 °C; its own rise, not the slope's, so it does not hang on which rows
        # a slope was fitted on). Not at or below the power it was learned at (a GPU that lost its
        # heatsink under load and went idle still shows), nor while it throttles thermally: at its
        # limit where its power says it should not be is no question of a few percent.
        rise = temp - t_at
        up = np.isfinite(rise) & (rise > 0) & nan_as_zero_gt(power - p_at, 0.0) & ~throttled
        doubt = self.slope_doubt * np.where(up, rise, 0.0)
        r = tab.rolling_mean(v - base, self.smooth_seconds)
        from_fleet = np.full(len(v), np.nan)
        if self.fleet_spread_celsius > 0:
            # (a GPU whose learned offset is itself far off the fleet's was hot from the start)
            off = getattr(self, "offset_", {})
            a = lookup(off, tab.ent)
            fleet_a = np.median(list(off.values())) if len(off) >= 4 else np.nan
            from_fleet = tab.rolling_mean(v - fleet_a, self.smooth_seconds) - self.fleet_spread_celsius
            from_fleet[~np.isfinite(a)] = np.nan  # only for GPUs with a baseline of their own to compare
        return Excess(smoothed=r, bar=thr + doubt, doubt=doubt, from_fleet=from_fleet, steady=steady,
                      throttled=throttled,
                      temp=temp, power=power, modelled=v, base=base)

    @staticmethod
    def _step_onset(tab, raw: np.ndarray, thr: np.ndarray) -> np.ndarray:
        """Per row: the time of the last normal poll before the current run of raw excess above half
        the bar, where that run opened with a jump past the full bar; or of the poll before the run's
        latest jump by a full bar, past it (NaN otherwise)."""
        n = len(raw)
        out = np.full(n, np.nan)
        if not n:
            return out
        high = nan_as_zero_gt(raw, thr / 2)
        first = tab.first_of_entity()
        prev_high = np.concatenate([[False], high[:-1]])
        opened = high & ~first & ~prev_high
        prev_raw = tab.prev(raw)
        measured = np.isfinite(prev_raw) & ~first
        past = nan_as_zero_gt(raw, thr)
        # the run opened at a jump: from a measured normal poll straight past the full bar
        jump = opened & past & measured & (prev_raw < thr / 2)
        # or, inside a run, a jump by a full bar between two polls (a heatsink lost on a GPU that ran
        # a few degrees warm already, judged at a load its baseline was not learned at): the fault
        # began after the poll before it, not where the run of a few degrees began
        jump |= high & past & measured & nan_as_zero_ge(raw - prev_raw, thr)
        pt = tab.prev(tab.t)
        idx = np.where(opened | (high & first) | jump, np.arange(n), 0)
        np.maximum.accumulate(idx, out=idx)
        ok = high & jump[idx]
        out[ok] = pt[idx[ok]]
        return out

    def score(self, window: Window) -> np.ndarray:
        ex = self._excess(window)
        return np.fmax(ex.smoothed / ex.bar, ex.from_fleet / self.excess_celsius)

    def detect(self, window: Window) -> Hits:
        """A GPU row is hot where its smoothed excess over its own baseline passes its bar (or,
        with ``fleet_spread_celsius``, it runs that far above the fleet's median baseline). A node
        is one incident where at least ``node_min_gpus`` and ``node_share`` of its evaluated GPUs
        are hot in the same minute (or its fans fail and its GPUs run ``fan_excess_celsius`` warm
        together), a rack where ``rack_min_nodes`` of its nodes are (unless its hosts report their
        inlet: then the inlet rule speaks for the rack). Each is dated back to where its excess
        began; an open one is held while its GPUs cannot show it (see ``Detector._hold``)."""
        tab = window.gpu
        ex = self._excess(window)
        r, thr, from_fleet, steady, throttled = ex.smoothed, ex.bar, ex.from_fleet, ex.steady, ex.throttled
        temp, power, v = ex.temp, ex.power, ex.modelled
        slow = tab.ffill("temperature_slowdown_celsius")
        slow = np.where(np.isfinite(slow), slow, 89.0)
        below = ~throttled & (temp < slow - self.throttle_margin_celsius)
        hot = (nan_as_zero_gt(r, thr) | nan_as_zero_gt(from_fleet, 0)) & np.isfinite(v)
        # a node whose BMC reports its fans failing (RPM well below the fleet's, or the sensor's
        # state critical): its GPUs warmer than their own baselines by fan_excess_celsius together
        # are a node cooling fault even at idle, where a fan failure warms a GPU by only a few °C.
        # Rows that pass only by this bar count towards the node, never towards a GPU incident.
        fan_rpm, fan_state, fan_bad = self._fan(window)
        by_fan = fan_bad & nan_as_zero_gt(r, self.fan_excess_celsius) & np.isfinite(v) & ~hot
        hot |= by_fan
        # the drift began where the excess last rose above half the bar and stayed there
        # (at most 3/4 of a smoothing span back: about what the smoothing delays a sudden step by);
        # the bar without its extrapolation doubt, which says whether, not since when
        plain = thr - ex.doubt
        began = np.fmax(tab.run_start(nan_as_zero_gt(r, plain / 2)), tab.t - 0.75 * self.smooth_seconds)
        # a step (the raw excess jumped from below half the bar to above it between two polls): the
        # fault began after the last normal poll, and that is the best onset the data can give (the
        # smoothed excess may have wandered above half the bar earlier: noise, not the fault)
        raw = v - ex.base
        step = self._step_onset(tab, raw, plain)
        began = np.where(np.isfinite(step), step, began)
        began = np.where(hot & np.isfinite(began), began, tab.t)
        new = tab.in_window()
        hot &= new
        # a GPU hot against its own baseline (the model takes the inlet out), or held as faulty, is
        # near its limits by its own fault: no sign of the room's heat reaching the rack's GPUs
        own = hot | self._held_rows(window)
        inlet_hits = self._rack_inlet().hits(window, self.kind, getattr(self, "inlet_ref_", {}), own)
        node = window.node_of[tab.ent] if len(tab) else np.zeros(0, np.int64)
        # rows where failed cooling would show plainly: steady load, modelled, not throttling
        judged = new & steady & np.isfinite(v) & ~throttled & nan_as_zero_ge(power, self.low_power_watts)
        if not hot.any():
            held = self._hold(window, tab, hot, judged, [("gpu", tab.ent, hot), ("node", node, hot)])
            return concat(self.kind, [inlet_hits, held])
        # (the evidence of hot rows reads it: found there only)
        margin, to_throttle = _time_to_throttle(tab, power, self.margin_trend_seconds, np.flatnonzero(hot))
        found = Found(excess=ex, score=self.score(window), began=began, below=below, margin=margin,
                      to_throttle=to_throttle)
        rack = window.rack_of[tab.ent]
        # node scope: share of the node's evaluated GPUs hot in the same minute; the share counts
        # the GPUs at three quarters of their bar too (scope by cause: a node whose GPUs all sit
        # 3.5-4 °C up, three of them just past the bar, is one node deviation, not three GPU faults)
        inv, ng = buckets(tab.t, 60.0, node)
        evald = np.isfinite(v) & new
        hot_g = distinct_count(inv, tab.ent, hot, ng)
        warm_g = distinct_count(inv, tab.ent, hot | (evald & nan_as_zero_ge(r, 0.75 * thr)), ng)
        ev_g = distinct_count(inv, tab.ent, evald, ng)
        node_hot = (hot_g >= self.node_min_gpus) & (warm_g >= self.node_share * np.maximum(ev_g, 1))
        row_node_hot = node_hot[inv] & hot
        # rack scope: nodes of a rack hot together in the same minute
        rinv, rng_ = buckets(tab.t, 60.0, rack)
        node_key_hot = np.where(row_node_hot, node, -1)
        rack_nodes = distinct_count(rinv, node_key_hot, row_node_hot, rng_)
        rack_hot = rack_nodes >= self.rack_min_nodes
        row_rack_hot = rack_hot[rinv] & row_node_hot
        # a rack whose hosts report their inlet: a rack-wide cause (a hot aisle, a failing rack
        # cooler) shows in the inlet (the inlet rule below), and the model subtracts it from the
        # GPUs, so nodes of such a rack hot together are that many node faults, not a rack fault
        with_inlet = racks_with_inlet(window)
        if with_inlet.size and row_rack_hot.any():
            row_rack_hot &= ~np.isin(rack, with_inlet)
        gpu_rows = hot & ~row_node_hot & ~by_fan
        node_rows = row_node_hot & ~row_rack_hot
        sc = found.score
        parts = [self._mk(window, found, np.flatnonzero(gpu_rows), "gpu")]
        for rows, scope in ((node_rows, "node"), (row_rack_hot, "rack")):
            idx = np.flatnonzero(rows)
            if not len(idx):
                continue
            # one hit per node (rack) and minute: the hottest GPU's row speaks for it
            minute = np.floor(tab.t[idx] / 60).astype(np.int64)
            grp = (node if scope == "node" else rack)[idx] * 10**7 + minute
            order = np.lexsort((-sc[idx], grp))
            first = np.ones(len(order), bool)
            first[1:] = grp[order][1:] != grp[order][:-1]
            sel = idx[order[first]]
            if scope == "node":
                hits = self._mk(window, found, sel, scope, count=hot_g[inv[sel]], fan=(fan_rpm, fan_state))
            else:
                hits = self._mk(window, found, sel, scope, count=rack_nodes[rinv[sel]])
            parts.append(hits)
        held = self._hold(window, tab, hot, judged, [("gpu", tab.ent, gpu_rows), ("node", node, node_rows)])
        return concat(self.kind, parts + [inlet_hits, held])

    def _fan(self, window: Window):
        """Per GPU row: its host's latest fan RPM and sensor state at or before it (the slowest fan
        when a host reports several), and whether they say the fans are failing: the state
        critical (2), or the RPM below ``fan_drop_share`` of the fleet's median fan."""
        tab = window.gpu
        n = len(tab)
        rpm, state = np.full(n, np.nan), np.full(n, np.nan)
        fan = window.fan
        if fan is None or not len(fan) or not n or "fan_rpm" not in fan.cols:
            return rpm, state, np.zeros(n, bool)
        node = window.node_of[tab.ent]
        h, t = fan.ent, fan.t
        v, s = fan.col("fan_rpm"), fan.col("fan_state")
        key = h.astype(np.float64) * 1e7 + (t - t.min())
        q = node.astype(np.float64) * 1e7 + (tab.t - t.min())
        j = np.searchsorted(key, q, side="right") - 1
        ok = (j >= 0) & (h[np.maximum(j, 0)] == node) & (tab.t - t[np.maximum(j, 0)] <= 300.0)
        rpm[ok], state[ok] = v[j[ok]], s[j[ok]]
        known = v[~np.isnan(v)]
        fleet = float(np.median(known)) if np.isfinite(known).any() else np.nan  # (np.nanmedian's)
        with np.errstate(invalid="ignore"):
            bad = (state >= 2) | (rpm < self.fan_drop_share * fleet)
        return rpm, state, bad & ok

    def _rack_inlet(self) -> RackInletRule:
        """The rack rule from the inlet itself (``rack_inlet``), with its learned state."""
        if not hasattr(self, "rack_inlet_"):
            self.rack_inlet_ = RackInletRule(
                excess_celsius=self.inlet_excess_celsius, track_seconds=self.inlet_track_seconds,
                rise_seconds=self.inlet_rise_seconds, rise_celsius=self.inlet_rise_celsius,
                near_limit_celsius=self.near_limit_celsius, min_nodes=self.rack_min_nodes)
        return self.rack_inlet_

    def _mk(self, window: Window, found: Found, idx: np.ndarray, scope: str, count=None, fan=None) -> Hits:
        """The hits at rows ``idx`` of the window's GPU table, at ``scope``: "gpu" (the row's GPU),
        "node" (its node; ``count``: its hot GPUs, ``fan``: its fans' RPM and state per row) or
        "rack" (its rack; ``count``: its hot nodes)."""
        if not len(idx):
            return Hits.none(self.kind)
        rows = idx.tolist()
        slope = round(getattr(self, "slope_", DEFAULT_SLOPE), 4)
        slopes = getattr(self, "slopes_", {})
        reg, tab = window.reg, window.gpu
        ent = tab.ent
        ex, margin, to_thr = found.excess, found.margin, found.to_throttle

        def evidence(k):
            i = rows[k]
            d = {
                "signals": ["temperature_gpu_celsius", "power_watts"],
                "scope": scope,
                "excess_celsius": rounded(ex.smoothed[i]),
                "threshold_celsius": rounded(ex.bar[i]),
                "temperature_gpu_celsius": rounded(ex.temp[i]),
                "power_watts": rounded(ex.power[i]),
                "slope_c_per_w": slope,
            }
            if len(slopes) > 1:  # a mixed fleet: the GPU's model, judged by its own model's physics
                mid = int(reg.model_ids()[ent[i]])
                d["model"] = reg.gpu_model[int(ent[i])]
                d["slope_c_per_w"] = rounded(slopes.get(mid, math.nan))
                late = mid in getattr(self, "model_learned_", {})
                d["baseline"] = "own model" + (" (first seen here: learned its own)" if late else "")
            if scope == "gpu":
                d["before_throttling"] = bool(found.below[i])
            if count is not None:
                d["hot_gpus" if scope == "node" else "hot_nodes"] = int(count[k])
            if np.isfinite(margin[i]):
                d["signals"].append("temperature_margin_celsius")
                d["temperature_margin_celsius"] = rounded(margin[i])
                d["minutes_to_throttling"] = rounded(to_thr[i] / 60.0) if np.isfinite(to_thr[i]) else None
            if fan is not None and np.isfinite(fan[0][i]):
                d["signals"] = d["signals"] + ["bmc_sensor fan"]
                d["fan_rpm"] = rounded(fan[0][i])
                d["fan_state"] = None if not np.isfinite(fan[1][i]) else int(fan[1][i])
            return d

        with np.errstate(invalid="ignore"):
            urgent = to_thr[idx] <= self.urgent_seconds  # NaN (no margin): not urgent
        none = np.full(len(idx), -1, np.int64)
        node = window.node_of[ent[idx]]
        return Hits(
            self.kind,
            none if scope == "rack" else node,
            ent[idx] if scope == "gpu" else none,
            none,
            tab.t[idx],
            found.score[idx],
            urgent,
            Evidence(evidence, list(range(len(rows)))),
            window.rack_of[ent[idx]] if scope == "rack" else None,
            found.began[idx],
        )


@dataclass
class Excess:
    """Per GPU row of a window: what cooling judges (``CoolingDegradation._excess``)."""

    smoothed: np.ndarray  # °C the GPU runs above its baseline, smoothed over smooth_seconds
    bar: np.ndarray  # °C that excess must pass (its band's, scaled by the GPU's own spread, + doubt)
    doubt: np.ndarray  # °C of the bar that is the baseline's extrapolation (dating uses the rest)
    from_fleet: np.ndarray  # °C above the fleet's median baseline past fleet_spread_celsius (NaN: off)
    steady: np.ndarray  # steady load, the row modelled
    throttled: np.ndarray  # thermally throttled
    temp: np.ndarray  # °C
    power: np.ndarray  # W
    modelled: np.ndarray  # the temperature less what power, memory load and the inlet explain
    base: np.ndarray  # the GPU's learned baseline of ``modelled`` (its band's)


@dataclass
class Found:
    """What detect derives from the excess, per GPU row, for the hits' evidence."""

    excess: Excess
    score: np.ndarray
    began: np.ndarray  # s: when the excess began (its step, or its run above half the bar)
    below: np.ndarray  # still below the throttling temperature by throttle_margin_celsius
    margin: np.ndarray  # °C of thermal margin (carried forward; NaN: none reported)
    to_throttle: np.ndarray  # s left before the margin reaches 0 (at hot rows; NaN elsewhere)


def _moments(ent, t, p, um, size: int | None = None) -> np.ndarray:
    """Per entity (rows: its id, up to ``size``), the sums a slope fit needs:
    n, St, Sp, Su, Spp, Stp, Suu, Spu, Stu (``_MOMENTS``). Sums add up over windows."""
    size = size if size is not None else (int(ent.max()) + 1 if len(ent) else 0)
    cols = (np.ones(len(p)), t, p, um, p * p, t * p, um * um, p * um, t * um)
    return np.stack([np.bincount(ent, c, size) for c in cols], axis=1)


def _subset_moments(ent, t, p, um, sel, size: int | None = None) -> np.ndarray:
    """``_moments`` of the rows ``sel`` (memory utilisation 0 where any of them lacks it: no memory
    term to fit)."""
    u = um[sel]
    if not np.isfinite(u).all():
        u = np.zeros(len(u))
    return _moments(ent[sel], t[sel], p[sel], u, size)


def _slope_of(m_all: np.ndarray, m_low: np.ndarray) -> tuple[float, float] | None:
    """(°C per W, °C per unit of memory utilisation) from per-GPU sums of loaded rows (``m_all``)
    and of those whose memory is at most half utilised (``m_low``); None where power barely moves.
    Memory-bound work runs the die cooler per W (its HBM takes part of the power), so the slope
    fitted alone over a window whose jobs ran memory-bound comes out well below the heatsink's, and
    every compute-bound minute after it looks hot. Where memory utilisation moves independently of
    power the memory term is fitted with the slope; where it moves only with power (idle, then
    memory-bound load) the two cannot be told apart: the slope comes from the rows whose memory is
    not the busy part."""
    fit = _moments_fit(m_all)
    if fit is None:
        return None
    b, k, separable = fit
    if not separable:  # memory moved with power: the slope from the compute-like rows alone
        fit = _moments_fit(m_low)
        if fit is None:
            return None
        b, k = fit[0], 0.0
    return float(np.clip(b, 0.01, 0.1)), float(k)


def _moments_fit(m: np.ndarray):
    """A slope fit by least squares, each entity against its own means, from per-entity sums
    (``_moments``): (°C per W, °C per unit of memory utilisation, separable), the memory term 0 where memory
    utilisation does not move (a tenth on average), or moves in lockstep with power (then
    ``separable`` is False and the slope is the power-only fit); None with under 50 rows or where
    power barely moves."""
    m = m[m[:, 0] > 0]
    n, st, sp, su, spp, stp, suu, spu, stu = m.T
    if n.sum() < 50:
        return None
    var = float((spp - sp * sp / n).sum())
    if var < 1e4 * len(n):  # power barely moves
        return None
    ct = float((stp - st * sp / n).sum())
    vu, cpu = float((suu - su * su / n).sum()), float((spu - sp * su / n).sum())
    if vu < 0.01 * n.sum():  # memory utilisation barely moves: no term to fit
        return ct / var, 0.0, True
    det = var * vu - cpu * cpu
    if det <= 0.1 * var * vu:  # in lockstep with power
        return ct / var, 0.0, False
    cu = float((stu - st * su / n).sum())
    b, k = (ct * vu - cu * cpu) / det, -(cu * var - ct * cpu) / det
    if k <= 0:  # (busier memory never makes the die hotter at the same power)
        return ct / var, 0.0, True
    return b, min(k, 30.0), True


def _recent_max(tab, v: np.ndarray, seconds: float, rows: np.ndarray, polls: int = 8) -> np.ndarray:
    """At ``rows``: the largest of the entity's values over the trailing ``seconds`` (up to ``polls``
    rows back)."""
    out = v[rows]
    ent, t = tab.ent[rows], tab.t[rows]
    for k in range(1, min(polls, len(v) - 1) + 1):
        back = np.maximum(rows - k, 0)
        near = (rows >= k) & (tab.ent[back] == ent) & (t - tab.t[back] <= seconds)
        if not near.any():  # (nor any further back: the rows are in time order per entity)
            break
        out = np.where(near, np.fmax(out, v[back]), out)
    return out


def _time_to_throttle(tab, power: np.ndarray, seconds: float, rows: np.ndarray, polls: int = 90):
    """Per row: the thermal margin (°C, carried forward) and, at ``rows`` (NaN elsewhere), the
    seconds left before it reaches 0 at its fall over the trailing ``seconds`` (inf: not falling;
    NaN: no margin, or no span of at least half of ``seconds`` at the same power, within 10 %)."""
    margin = tab.ffill("temperature_margin_celsius")
    n = len(margin)
    out = np.full(n, np.nan)
    if not len(rows) or not np.isfinite(margin).any():
        return margin, out
    t, m, p = tab.t[rows], margin[rows], power[rows]
    # the row the span starts at: the entity's earliest within ``seconds``, at most ``polls`` back
    j = np.maximum(tab.since_at(seconds, rows), rows - polls)
    past_m, past_t, past_p = margin[j], tab.t[j], power[j]
    span = t - past_t
    with np.errstate(invalid="ignore", divide="ignore"):
        same_load = np.abs(p - past_p) <= 0.1 * np.maximum(p, past_p)
        rate = (m - past_m) / span  # °C/s; negative while the margin shrinks
        ok = np.isfinite(m) & np.isfinite(past_m) & (span >= seconds / 2) & same_load
        out[rows] = np.where(ok, np.where(rate < 0, np.maximum(m, 0.0) / -rate, np.inf), np.nan)
    return margin, out


def _same_minute(t: np.ndarray, mask: np.ndarray) -> np.ndarray:
    """Rows whose minute (``floor(t / 60)``) holds a row with ``mask`` set."""
    minute = np.floor(t / MINUTE)
    if not mask.any():
        return np.zeros(len(t), bool)
    lo, hi = minute.min(), minute.max()
    if hi - lo > 4 * len(t) + 4096:
        return np.isin(minute, minute[mask])
    k = (minute - lo).astype(np.int64)
    flag = np.zeros(int(hi - lo) + 1, bool)
    flag[k[mask]] = True
    return flag[k]


def _common_mode(groups: dict, t: np.ndarray, x: np.ndarray, need: np.ndarray) -> np.ndarray:
    """Per row: the median of ``x`` over its minute and power band (8 GPUs or more), else over the
    whole fleet in that minute (4 or more), else NaN; the fleet's only where ``need``ed. ``groups``
    caches the row groupings."""
    inv, ng = groups["band"]
    med, cnt = group_median(inv, x, ng)
    out = np.where(cnt[inv] >= 8, med[inv], np.nan)
    few = np.isnan(out) & need
    if few.any() and np.isfinite(x[_same_minute(t, few)]).any():
        if "all" not in groups:
            groups["all"] = buckets(t, MINUTE)
        inv_all, ng_all = groups["all"]
        med_all, cnt_all = group_median(inv_all, x, ng_all)
        out[few] = np.where(cnt_all[inv_all] >= 4, med_all[inv_all], np.nan)[few]
    return out
