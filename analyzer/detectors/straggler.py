"""straggler: a GPU persistently slower than its peers doing the same work, with no reason bit.

Reads gpu.clock_sm_mhz, power_watts, utilization_gpu_ratio, job_id (slow tier, carried
forward) and the clock-event reasons. Peers are the busy GPUs of the same job in the same
poll (all GPUs of the node when no job is reported): the job moves through its phases in
lockstep, so each feature is normalised by the peers' median at that instant. A robust
covariance (scikit-learn ``MinCovDet``) fitted on the fleet's peer-normalised features gives a
Mahalanobis distance; a hit needs that distance above ``distance``, a clock at least
``min_slowdown`` below the peers', no thermal/brake reason, and persistence (the engine's dwell).
The covariance is learned from the first window with enough busy rows (``fit_sample_``) and
fitted when first needed: a fleet without a slow GPU never pays for the fit.

**GPM evidence** (where the GPUs report ``sm_active_ratio``): the GPU's SM activity against its
busy peers' median. A job meets at every collective, so a straggler keeps its peers waiting only
the share of time it lags: they stay near its own activity (a GPU 13 % slow: peers at ~0.87 of
it). A GPU whose peers sit far below it (under ``peer_activity_min`` of its activity) computed
while they waited the whole interval (a rank with more work, a data-loader stall: the
collective-wait nuisance): its clock below theirs is the power cap of the one GPU working, not a
fault, so it is not a straggler. A GPU far below its peers (under ``waiting_activity``) is the
one waiting: not a straggler either. Without GPM the clock evidence decides alone.
"""

from __future__ import annotations

import warnings

import numpy as np
from gpufleet.analyzer.detectors.base import Detector, Hits, buckets, concat, group_median, nz
from gpufleet.analyzer.detectors.thermal_throttle import thermal_bits
from gpufleet.analyzer.frame import Window

EXPLAINED = 0x20 | 0x40 | 0x80 | 0x8  # thermal, power brake, hw slowdown: a known reason


class Straggler(Detector):
    kind = "straggler"
    # set from the analyzer's [analyzer] poll_seconds, not a [detectors.straggler] key
    context = {"poll_seconds": 10.0}
    params = {
        "min_peers": 3,
        "min_slowdown": 0.06,
        "distance": 4.0,
        "busy_utilization": 0.5,
        "fit_rows": 5000,
        "dwell_seconds": 300.0,
        "gap_seconds": 60.0,
        "resolve_seconds": 1800.0,
        "clear_seconds": 600.0,  # kept up with its peers this long before idle stops holding it
        "peer_activity_min": 0.4,  # GPM: peers under this share of its SM activity waited: not the same work
        "waiting_activity": 0.7,  # GPM: under this share of its peers' SM activity it is the one waiting
    }
    # (clock_event_*_thermal: through thermal_throttle.thermal_bits)
    fields = {
        "gpu": (
            "clock_sm_mhz", "power_watts", "utilization_gpu_ratio", "job_id", "sm_active_ratio",
            "clock_event_reasons", "clock_event_sw_thermal", "clock_event_hw_thermal",
            "clock_event_hw_power_brake",
        ),
    }
    summary = "straggler: persistently slower than its job peers"

    def _peers(self, window: Window):
        """Busy rows, and each row's peer group (job or node, and poll): (busy, group, n_groups)."""
        return self._cached("peers", lambda: self._peers_uncached(window))

    def _peers_uncached(self, window: Window):
        tab = window.gpu
        clock = tab.col("clock_sm_mhz")
        power = tab.col("power_watts")
        util = tab.col("utilization_gpu_ratio")
        busy = (util >= self.busy_utilization) & (clock > 0) & (power > 0)
        jobs = tab.ffill_codes("job_id")
        node = window.node_of[tab.ent]
        group = np.where(jobs >= 0, jobs * 2, node * 2 + 1)
        inv, ng = buckets(tab.t, self.poll_seconds, group % 1_000_003)
        return busy, inv, ng

    def _feature(self, window: Window, name: str):
        """log(value / the busy peers' median) per row, and how many busy peers had a value."""
        return self._cached(("feature", name), lambda: self._feature_uncached(window, name))

    def _feature_uncached(self, window: Window, name: str):
        busy, inv, ng = self._peers(window)
        v = window.gpu.col(name)
        med, cnt = group_median(inv, np.where(busy, v, np.nan), ng)
        with np.errstate(invalid="ignore", divide="ignore"):
            return np.log(v / med[inv]), cnt[inv]

    def _features(self, window: Window):
        return self._cached("features", lambda: self._features_uncached(window))

    def _features_uncached(self, window: Window):
        busy, _, _ = self._peers(window)
        feats = []
        n = None
        valid = busy.copy()
        for name in ("clock_sm_mhz", "power_watts", "utilization_gpu_ratio"):
            f, n = self._feature(window, name)
            feats.append(f)
            valid &= np.isfinite(f)
        X = np.stack(feats, 1)
        valid &= n >= self.min_peers + 1
        return X, valid

    def warm(self) -> None:
        import sklearn.covariance  # noqa: F401 - the robust covariance: about a second of CPU to import

    def fit(self, window: Window) -> Straggler:
        if hasattr(self, "location_") or hasattr(self, "fit_sample_"):
            return self
        X, valid = self._features(window)
        X = X[valid]
        if len(X) < 200:
            return self
        if len(X) > self.fit_rows:
            X = X[np.random.default_rng(0).choice(len(X), self.fit_rows, replace=False)]
        # features that never vary (e.g. utilization pinned at 100 %) get a small floor of noise
        self.fit_sample_ = X + np.random.default_rng(1).normal(0, 1e-3, X.shape)
        return self

    def _fitted(self) -> bool:
        """Fit the robust covariance on the learned sample if not done yet; is there a model?"""
        X = getattr(self, "fit_sample_", None)
        if X is not None and not hasattr(self, "location_"):
            del self.fit_sample_  # a sample the fit rejects is replaced by the next window's
            try:
                with warnings.catch_warnings():
                    warnings.simplefilter("ignore")
                    mcd = _min_cov_det()(random_state=0, support_fraction=0.9).fit(X)
            except (ValueError, np.linalg.LinAlgError):
                return False
            cov = mcd.covariance_ + np.eye(X.shape[1]) * 1e-6
            self.location_ = mcd.location_
            self.precision_ = np.linalg.inv(cov)
        return hasattr(self, "location_")

    def score(self, window: Window) -> np.ndarray:
        X, valid = self._features(window)
        out = np.full(len(X), np.nan)
        if not self._fitted():
            return out
        d = X[valid] - self.location_
        out[valid] = np.sqrt(np.einsum("ij,jk,ik->i", d, self.precision_, d))
        return out

    def detect(self, window: Window) -> Hits:
        if not hasattr(self, "location_") and not hasattr(self, "fit_sample_"):
            return Hits.none(self.kind)
        tab = window.gpu
        reasons = tab.col("clock_event_reasons")
        r = np.where(np.isfinite(reasons) & (reasons >= 0), reasons, 0).astype(np.int64)
        explained = (
            ((r & EXPLAINED) != 0) | (thermal_bits(tab) > 0) | (nz(tab.col("clock_event_hw_power_brake")) > 0)
        )
        busy, _, _ = self._peers(window)
        clock, peers = self._feature(window, "clock_sm_mhz")
        slow = clock < np.log(1 - self.min_slowdown)
        new = tab.in_window()
        # seen where a straggler would show, and keeping up: busy beside enough peers, not slow
        judged = new & busy & (peers >= self.min_peers + 1) & ~slow
        if not (busy & slow & ~explained & new).any():  # no busy GPU slower than its peers
            none = np.zeros(len(tab), bool)
            return self._hold(window, tab, none, judged, [("gpu", tab.ent, none)])
        X, valid = self._features(window)
        sc = self.score(window)
        sm, _ = self._feature(window, "sm_active_ratio")  # NaN where the GPUs report no GPM
        with np.errstate(invalid="ignore"):
            not_same_work = (sm > -np.log(self.peer_activity_min)) | (sm < np.log(self.waiting_activity))
        candidate = valid & slow & ~explained & ~not_same_work
        hit = candidate & (nz(sc) > self.distance)

        def ev(i):
            out = {
                "signals": ["clock_sm_mhz", "power_watts", "utilization_gpu_ratio"],
                "clock_vs_peers": round(float(np.exp(X[i, 0])), 3),
                "power_vs_peers": round(float(np.exp(X[i, 1])), 3),
                "robust_distance": round(float(sc[i]), 2),
                "threshold_distance": self.distance,
            }
            if np.isfinite(sm[i]):  # GPM: the peers wait on it for the share of time it lags
                out["signals"].append("sm_active_ratio")
                out["sm_active_vs_peers"] = round(float(np.exp(sm[i])), 3)
            return out

        hit_new = hit & new
        held = self._hold(window, tab, hit_new, judged, [("gpu", tab.ent, hit_new)])
        return concat(self.kind, [self._gpu_hits(window, tab, hit, sc, False, ev), held])


def _covariance(X: np.ndarray, *, assume_centered: bool = False) -> np.ndarray:
    """``sklearn.covariance.empirical_covariance`` for a float array, without its input checks (the
    MCD fit calls it hundreds of times on small subsets); the same arithmetic, so the same result."""
    if assume_centered:
        from sklearn.covariance import empirical_covariance

        return empirical_covariance(X, assume_centered=True)
    Xt = np.array(X.T, ndmin=2, dtype=np.float64)  # as np.cov(X.T, bias=1)
    Xt -= Xt.mean(axis=1)[:, None]
    c = np.dot(Xt, Xt.T.conj())
    c *= np.true_divide(1, Xt.shape[1])
    return c


def _min_cov_det():
    from sklearn.covariance import MinCovDet

    class _MinCovDet(MinCovDet):
        _nonrobust_covariance = staticmethod(_covariance)

    return _MinCovDet
