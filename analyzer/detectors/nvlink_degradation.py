"""nvlink_degradation: one NVLink link getting worse (CRC -> replay -> recovery -> down).

Reads gpu_nvlink.crc_flit_errors_total, crc_data_errors_total, replay_errors_total,
recovery_errors_total and up, per link, judged against what a healthy link does (see
docs/analyzer.md for the sources): healthy links throw a sporadic CRC error now and then (the
replay mechanism corrects it) and, rarely, a replay; NVIDIA DCGM's health watch fails a link at a
CRC rate of 100/s or more, at any replay or recovery, or when it is down, and only warns below.
Here: a CRC rate at or above ``crc_rate_max`` (DCGM's 100/s), or sustained above the fleet's own
links (``crc_fleet_factor`` x their 90th-percentile rate, at least ``crc_rate_min``; in a mixed
fleet the links of the GPU's own model: each model's link count, generation and background
error rate are its own); a sustained
CRC rate of ``crc_count_min`` errors within ``crc_span_seconds`` (45 in 15 min: 0.05/s, hundreds
of times a healthy link's background); ``replay_count_min`` replays within the span (one replay
is a link correcting one error); any recovery (the link retrained: critical); a link down while
its GPU's other links are up (critical). A degrading link does not heal: its incident stays open
while it keeps collecting errors below the bar, until it has gone ``clear_seconds`` without one.

Throughput against the siblings (tx_data_bytes_total + rx_data_bytes_total, fields 138/139): on
an NVSwitch board a job's traffic is striped over all of a GPU's links, so a link carrying less
than ``throughput_ratio`` x the median of its GPU's links at the same poll, while that median is
busy (``busy_bytes_per_s`` or more) and at least ``min_links`` links report, is slow. A slow link
is evidence on every incident of that link; it opens a warning by itself only when it stays slow
for ``slow_seconds`` and the link also took an error (CRC, replay, recovery) within
``crc_span_seconds``: a link idle because the job's traffic pattern skips it has no errors, and
a whole GPU going quiet moves the median with it.
"""

from __future__ import annotations

import math

import numpy as np
from gpufleet.analyzer.detectors.base import Detector, Hits, concat, nz, time_weighted
from gpufleet.analyzer.frame import Window
from gpufleet.analyzer.groupby import dense_inverse, group_median, lookup


class NvlinkDegradation(Detector):
    kind = "nvlink_degradation"
    peers = True
    peer_rows = False  # the rates it judges against are fit()'s; a link's siblings are its own GPU's links
    tables = ("gpu_nvlink",)
    params = {
        "crc_rate_max": 100.0,
        "crc_rate_min": 1.0,
        "crc_fleet_factor": 20.0,
        "crc_count_min": 45,  # CRC errors within crc_span_seconds (0.05/s sustained): far above background
        "crc_span_seconds": 900.0,
        "replay_count_min": 3,  # replays within crc_span_seconds (one replay corrects one error)
        # a link below throughput_ratio x its GPU's median link throughput while that is busy: slow;
        # slow for slow_seconds with an error within crc_span_seconds opens a warning
        "throughput_ratio": 0.5,
        "busy_bytes_per_s": 1e9,  # tx + rx per link: ~2 % of an H100 link's 50 GB/s
        "min_links": 3,
        "slow_seconds": 300.0,
        "dwell_seconds": 0.0,
        "gap_seconds": 600.0,
        "resolve_seconds": 3600.0,
        "clear_seconds": 3600.0,  # a degraded link stays one incident until this long without an error
    }
    fields = {
        "gpu_nvlink": (
            "crc_data_errors_total", "crc_flit_errors_total", "replay_errors_total", "recovery_errors_total",
            "up", "tx_data_bytes_total", "rx_data_bytes_total",
        ),
    }
    summary = "NVLink errors growing"
    panels = (
        ("gpu_nvlink", "crc_flit_errors_total", "NVLink CRC flit errors (/s)", "rate"),
        ("gpu_nvlink", "crc_data_errors_total", "NVLink CRC data errors (/s)", "rate"),
        ("gpu_nvlink", "replay_errors_total", "NVLink replays (/s)", "rate"),
        ("gpu_nvlink", "recovery_errors_total", "NVLink recoveries (/s)", "rate"),
        ("gpu_nvlink", "up", "Link up", "value"),
    )

    @staticmethod
    def _crc_rate(tab):
        """CRC errors per second since the link's previous row (read-only, once per table)."""
        return tab.cached("nvlink_crc_rate", lambda: _crc_rate(tab))

    def fit(self, window: Window) -> NvlinkDegradation:
        tab = window.nvlink
        r = self._crc_rate(tab)
        ok = np.isfinite(r)
        if ok.sum() > 20:
            p90 = _p90(r[ok])  # a few bad links cannot raise the fleet's own rate
            self.fleet_crc_rate_ = time_weighted(getattr(self, "fleet_crc_rate_", None), p90, window)
        else:
            self.fleet_crc_rate_ = getattr(self, "fleet_crc_rate_", 0.0)
        # per GPU model too (its links' count, generation and background are its own): a model's
        # rate from its own links, where a window has more than 20 of their rows
        per = self.model_crc_rate_ = getattr(self, "model_crc_rate_", {})
        if int(window.reg.model_ids().max(initial=0)) == 0:
            return self  # one model: the fleet's rate is its own
        model = _models(window)[ok]
        if not len(model):
            return self  # no link row with a rate in this window
        r = r[ok]
        order = np.argsort(model, kind="stable")
        ms, first = np.unique(model[order], return_index=True)
        for m, part in zip(ms.tolist(), np.split(r[order], first[1:]), strict=True):
            if len(part) > 20:
                per[m] = time_weighted(per.get(m), _p90(part), window)
        return self

    def _crc_hit(self, window: Window) -> np.ndarray:
        """CRC errors per second since the link's previous row (0 where unknown); at a row after a
        gap, their mean over the gap where even that is above the bar (a lower bound of the rate
        somewhere in it), else 0: what a silent link collected is no one row's rate."""
        tab = window.nvlink
        crc = _crc(tab)
        over = _crc_gap_rate(tab) > self._threshold(window)
        return np.where(over, _crc_gap_rate(tab), crc) if over.any() else crc

    def _rate(self, window: Window):
        """The healthy links' CRC rate each link row is judged against: its GPU model's own where a
        mixed fleet has learned one (an array), the whole fleet's otherwise (a number)."""
        fleet = getattr(self, "fleet_crc_rate_", 0.0)
        per = getattr(self, "model_crc_rate_", {})
        if len(per) <= 1 or not len(window.nvlink):
            return fleet
        return lookup(per, _models(window), default=fleet)

    def _threshold(self, window: Window):
        """The CRC rate bar: crc_fleet_factor x the healthy rate, within crc_rate_min .. crc_rate_max."""
        return np.minimum(self.crc_rate_max,
                          np.maximum(self.crc_rate_min, self.crc_fleet_factor * self._rate(window)))

    def _slow(self, window: Window):
        """(throughput B/s, its GPU's median link throughput at that poll, slow, slow long enough),
        per link row."""
        return window.once(self, "slow", lambda: self._slow_uncached(window))

    def _slow_uncached(self, window: Window):
        """The rule: a link row is slow where its throughput is below ``throughput_ratio`` x the
        median of its GPU's links at that poll, that median busy (``busy_bytes_per_s``), the link
        up and at least ``min_links`` of the GPU's links measured; slow for long once it has been
        for ``slow_seconds``.

        Speed: the median is taken only at polls holding a row that can pass, one below
        ``throughput_ratio`` x the busiest link while that one is busy (the median is at most the
        busiest link's throughput): a handful of polls, as a rule."""
        tab = window.nvlink
        with np.errstate(invalid="ignore", divide="ignore"):
            tput = (tab.delta("tx_data_bytes_total") + tab.delta("rx_data_bytes_total")) / tab.dt()
        inv, n = _poll_groups(window, tab)
        ok = np.isfinite(tput)
        enough = (np.bincount(inv[ok], minlength=n) >= self.min_links)[inv]
        up = tab.col("up") == 1
        top = np.full(n, -np.inf)
        np.maximum.at(top, inv[ok], tput[ok])
        with np.errstate(invalid="ignore"):
            can = enough & up & (top >= self.busy_bytes_per_s)[inv]
            if self.throughput_ratio >= 0:
                can &= tput < self.throughput_ratio * top[inv]
            med = _siblings_median(window, tab, tput, np.flatnonzero(can))
            slow = enough & up & (med >= self.busy_bytes_per_s) & (tput < self.throughput_ratio * med)
        rows = np.flatnonzero(slow)
        slow_long = np.zeros(len(slow), bool)
        if len(rows):
            slow_long[rows] = tab.t[rows] - tab.run_start(slow)[rows] >= self.slow_seconds
        return tput, med, slow, slow_long

    def score(self, window: Window, rows: np.ndarray | None = None) -> np.ndarray:
        """Per link row (at ``rows`` only, where given)."""
        tab = window.nvlink

        def at(v):
            return v if rows is None else v[rows]

        thr = self._threshold(window)
        crc = at(self._crc_hit(window)) / (thr if np.ndim(thr) == 0 else at(thr))
        rep = at(tab.increase("replay_errors_total")) / max(self.replay_count_min, 1)
        rep = rep + at(tab.increase("recovery_errors_total", gaps=True))
        down = (at(tab.col("up")) == 0).astype(float)
        slow = at(self._slow(window)[3]).astype(float)
        return np.fmax(np.fmax(np.fmax(crc, rep), slow), 10 * down)

    def detect(self, window: Window) -> Hits:
        """A link row hits where its CRC error rate passes the bar (``crc_fleet_factor`` x the
        healthy links' rate, within ``crc_rate_min`` .. ``crc_rate_max``), its CRC errors over
        ``crc_span_seconds`` reach ``crc_count_min`` (or the fleet's count over the span), its
        replays over the span reach ``replay_count_min``, it recovered, it is down while most of its
        GPU's links are up, or it has been slow (see ``_slow_uncached``) for ``slow_seconds`` and took
        an error within the span. Down and recovering are critical. Speed: the span's sums are taken
        only at rows that can hit."""
        tab = window.nvlink
        thr = self._threshold(window)  # a number, or one per row (per GPU model)
        crc = self._crc_hit(window)
        rep = tab.increase("replay_errors_total")
        # any recovery pages, one somewhere in a gap too (its evidence says so); CRC errors and replays
        # are judged as rates and counts within a span: what a gap collected is no one row's
        rec = tab.increase("recovery_errors_total", gaps=True)
        up = tab.col("up")
        down = up == 0
        # a link down on a GPU whose other links are down too is the GPU, not the link
        if down.any():
            inv, n = _poll_groups(window, tab)
            cnt = np.bincount(inv, minlength=n)
            ndown = np.bincount(inv, weights=down.astype(float), minlength=n)
            down &= ndown[inv] < np.maximum(cnt[inv] / 2, 1.5)
        # slow growth: a link collecting CRC errors while the fleet's links collect none (or far fewer)
        dcrc = _crc_errors(tab)
        tput, med, slow, slow_long = self._slow(window)
        # the sums over the span matter only at rows that took an error, are down, or slow for long
        # enough (every row that can hit): taken there only (NaN elsewhere)
        rows = np.flatnonzero((crc > thr) | (dcrc > 0) | (rep > 0) | (rec > 0) | down | slow_long)

        def span_sum(name, v):  # (the span reaches rows of earlier windows: see trailing_sum)
            out = np.full(len(tab), np.nan)
            out[rows] = self.trailing_sum(window, tab, name, v, self.crc_span_seconds, rows)
            return out

        count = span_sum("crc", dcrc)
        fleet = self.crc_fleet_factor * self._rate(window) * self.crc_span_seconds
        growing = (count >= np.maximum(self.crc_count_min, fleet)) & (dcrc > 0)
        replays = span_sum("replay", rep)
        replaying = (replays >= self.replay_count_min) & (rep > 0)
        # a link far below its busy siblings for slow_seconds that took an error within the span
        # (the counts are >= 0: an error of any kind within it makes one of the sums positive)
        new = tab.in_window()
        erred = (count > 0) | (replays > 0) | (span_sum("recovery", rec) > 0)
        slow_hit = slow_long & erred
        hit = (crc > thr) | replaying | (rec > 0) | down | growing | slow_hit
        crit = down | (rec > 0)
        if (hit & new).any():  # the siblings' median of every hit row, for its evidence
            med = _siblings_median(window, tab, tput, np.flatnonzero(hit & new), med)

        def bar(i):
            return float(thr if np.ndim(thr) == 0 else thr[i])

        def ev(i):
            out = {
                "signals": [
                    n
                    for n, on in (
                        ("crc_errors", crc[i] > bar(i) or growing[i]),
                        ("replay_errors", replaying[i]),
                        ("recovery_errors", rec[i] > 0),
                        ("link_down", down[i]),
                        ("low_throughput", slow[i]),
                    )
                    if on
                ],
                "crc_rate_per_s": round(float(crc[i]), 3),
                "crc_threshold_per_s": round(bar(i), 3),
                "crc_errors_in_span": int(count[i]),
                "new_replays": int(rep[i]),
                "replays_in_span": int(replays[i]),
                "new_recoveries": int(rec[i]),
                "up": None if np.isnan(up[i]) else int(up[i]),
                "throughput_bytes_per_s": None if not np.isfinite(tput[i]) else round(float(tput[i])),
                "siblings_median_bytes_per_s": None if not np.isfinite(med[i]) else round(float(med[i])),
            }
            if tab.over_gap()[i] and (rec[i] > 0 or crc[i] > bar(i)):  # it happened somewhere in the gap
                out["over_gap_seconds"] = round(float(tab.gap()[i]))
                if crc[i] > bar(i):
                    out["crc_rate_per_s"] = None
                    out["crc_errors_over_gap"] = int(
                        tab.increase("crc_flit_errors_total", gaps=True)[i]
                        + tab.increase("crc_data_errors_total", gaps=True)[i])
            return out

        at = np.flatnonzero(hit & new)

        def score():  # at the hit rows only (the others are not read)
            out = np.zeros(len(tab))
            out[at] = self.score(window, at)
            return out

        # (each hit is dated at its row, when the rate crossed its bar: dating it back to the span's
        # first error would date it to a healthy link's background error from before the fault)
        hits = self._gpu_hits(window, tab, hit, score, crit, ev, ent_is_link=True)
        # judged healthy: up, and no new error of any kind since the previous row
        clean = (up == 1) & (dcrc == 0) & (rep == 0) & (rec == 0)
        held = self._hold(window, tab, hit & new, new & clean, [("link", tab.ent, hit & new)])
        return concat(self.kind, [hits, held])


def _models(window: Window) -> np.ndarray:
    """The GPU model number of each link row's GPU (``Registry.model_ids``)."""
    tab = window.nvlink
    if not len(tab):
        return np.zeros(0, np.int64)
    link_gpu, _ = window.reg.link_arrays()
    return window.reg.model_ids()[link_gpu[tab.ent]]


def _p90(r: np.ndarray) -> float:
    """``np.quantile(r, 0.9)`` of finite rates; 0 at once where over a tenth of the rows are zero
    and none negative (healthy links: most rows take no error)."""
    if not (r < 0).any() and math.ceil(0.9 * (len(r) - 1)) < len(r) - np.count_nonzero(r):
        return 0.0
    return float(np.quantile(r, 0.9))


def _poll_groups(window: Window, tab) -> tuple[np.ndarray, int]:
    """Group index of each link row: the links of one GPU at one poll (same second); groups may be
    empty (the number of groups is an upper bound)."""

    def calc():
        if not len(tab):
            return np.zeros(0, np.int64), 0
        gid = window.reg.link_arrays()[0][tab.ent]
        # (GPU, second) as one integer over the seconds the table holds rows at (ranked: a quiet
        # link's last row, kept as context for hours, does not stretch the range), that integer
        # itself where its range is small (a GPU's polls: a few empty groups between them), else
        # ranked by counting
        sec, nsec = dense_inverse(np.round(tab.t).astype(np.int64))
        key = gid * nsec + sec
        k0, k1 = int(key.min()), int(key.max())
        if k1 - k0 <= 4 * len(key) + 4096:
            return key - k0, k1 - k0 + 1
        return dense_inverse(key)

    return tab.cached("nvlink_poll_groups", calc)


def _siblings_median(window: Window, tab, tput: np.ndarray, rows: np.ndarray, out=None) -> np.ndarray:
    """Per link row: the median throughput of its GPU's links at its poll, for the polls of ``rows``
    (``out``'s values, or NaN, elsewhere)."""
    out = np.full(len(tab), np.nan) if out is None else out.copy()
    if len(rows):
        inv, n = _poll_groups(window, tab)
        want = np.zeros(n, bool)
        want[inv[rows]] = True
        sel = np.flatnonzero(want[inv])
        g, k = dense_inverse(inv[sel])
        out[sel] = group_median(g, tput[sel], k)[0][g]
    return out


def _crc_errors(tab) -> np.ndarray:
    """New CRC errors (flit and data) since the link's previous row, 0 where unknown."""
    return tab.cached(
        "nvlink_crc_errors",
        lambda: tab.increase("crc_flit_errors_total") + tab.increase("crc_data_errors_total"),
    )


def _crc(tab) -> np.ndarray:
    """CRC errors per second since the link's previous row, 0 where unknown."""
    return tab.cached("nvlink_crc", lambda: nz(NvlinkDegradation._crc_rate(tab)))


def _crc_rate(tab) -> np.ndarray:
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(tab.over_gap(), np.nan, _crc_errors(tab) / tab.dt())  # unknown over a gap


def _crc_gap_rate(tab) -> np.ndarray:
    """CRC errors (flit and data) per second over the gap before a row (NaN where none)."""
    return tab.cached(
        "nvlink_crc_gap_rate",
        lambda: tab.gap_rate("crc_flit_errors_total") + tab.gap_rate("crc_data_errors_total"),
    )
