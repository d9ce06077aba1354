"""straggler: a GPU persistently slower than its peers doing the same work, with no reason bit.

Reads gpu.clock_sm_mhz, power_watts, utilization_gpu_ratio, job_id (slow tier, carried
forward) and the clock-event reasons. Peers are the busy GPUs of the same job in the same
poll (all GPUs of the node when no job is reported): the job moves through its phases in
lockstep, so each feature is normalised by the peers' median at that instant. A robust
covariance fitted on the fleet's peer-normalised features (the Minimum Covariance Determinant:
FastMCD as scikit-learn's ``MinCovDet`` fits it, in numpy, its 500 random starts run side by side
as stacked arrays, :func:`_mcd`) gives a Mahalanobis distance; a hit needs that distance above
``distance``, a clock at least ``min_slowdown`` below the peers', no thermal/brake reason, and
persistence (the engine's dwell).
The covariance is learned from the first window with enough busy rows (``fit_sample_``) and
fitted when first needed: a fleet without a slow GPU never pays for the fit.

**GPM evidence** (where the GPUs report ``sm_active_ratio``): the GPU's SM activity against its
busy peers' median. A job meets at every collective, so a straggler keeps its peers waiting only
the share of time it lags: they stay near its own activity (a GPU 13 % slow: peers at ~0.87 of
it). A GPU whose peers sit far below it (under ``peer_activity_min`` of its activity) computed
while they waited the whole interval (a rank with more work, a data-loader stall: the
collective-wait nuisance): its clock below theirs is the power cap of the one GPU working, not a
fault, so it is not a straggler. A GPU far below its peers (under ``waiting_activity``) is the
one waiting: not a straggler either. Without GPM the clock evidence decides alone, but for its
power: a GPU drawing ``min_power_drop`` more than its peers' does more work than they do (its clock
held by its power limit), and is not a straggler with GPM or without.

**Peers of the same model and power limit.** A job that spans GPU models is compared within each
model (an A100 beside H100s is no slower H100), and GPUs whose power limit an operator lowered are
compared with those of the same limit: a node capped at 500 W among 700 W peers runs a lower
clock and power by setting, not by fault. The evidence names the limit where it differs from the
job's (``power_limit_watts``, ``peers_power_limit_watts``).

**Slowness from every signal**: a GPU is a candidate when its SM clock, its memory clock or its
power sits below its peers' (``min_slowdown``, ``min_power_drop``): a GPU slowed by its memory or
interconnect keeps its SM clock and does less work at the same utilization, drawing less power.

**Scope by cause**: when at least ``node_share`` of a node's GPUs (and ``node_min_gpus``) are slow in
the same minute, the node is the incident (gpu = null), one page listing them.
"""

from __future__ import annotations

import math
import warnings

import numpy as np
from gpufleet.analyzer.detectors.base import Detector, Hits, concat, nan_as_zero_gt, node_scope_hits
from gpufleet.analyzer.detectors.thermal_throttle import thermal_bits
from gpufleet.analyzer.frame import Window
from gpufleet.analyzer.groupby import buckets, dense_inverse, group_median

EXPLAINED = 0x20 | 0x40 | 0x80 | 0x8  # thermal, power brake, hw slowdown: a known reason


class Straggler(Detector):
    kind = "straggler"
    peers = True
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
        "min_power_drop": 0.1,  # power this share below its peers' (same model and limit): doing less work
        "node_share": 0.5,  # this share of a node's GPUs slow in the same minute: the node's incident
        "node_min_gpus": 3,
    }
    # (clock_event_*_thermal: through thermal_throttle.thermal_bits)
    fields = {
        "gpu": (
            "clock_sm_mhz", "power_watts", "utilization_gpu_ratio", "job_id", "sm_active_ratio",
            "power_limit_watts", "clock_memory_mhz",
            "clock_event_reasons", "clock_event_sw_thermal", "clock_event_hw_thermal",
            "clock_event_hw_power_brake",
        ),
    }
    summary = "straggler: persistently slower than its job peers"

    def _peers(self, window: Window):
        """Busy rows, and each row's peer group (job or node, and poll): (busy, group, n_groups)."""
        return window.once(self, "peers", lambda: self._peers_uncached(window))

    def _peers_uncached(self, window: Window):
        tab = window.gpu
        clock = tab.col("clock_sm_mhz")
        power = tab.col("power_watts")
        util = tab.col("utilization_gpu_ratio")
        busy = (util >= self.busy_utilization) & (clock > 0) & (power > 0)
        jobs = tab.ffill_codes("job_id")
        node = window.node_of[tab.ent]
        group = np.where(jobs >= 0, jobs * 2, node * 2 + 1)
        # peers: the same model and the same power limit (where either differs within the group)
        model = window.reg.model_ids()[tab.ent] if len(tab) else np.zeros(0, np.int64)
        limit = tab.ffill("power_limit_watts") if "power_limit_watts" in tab.cols else None
        varies = limit is not None and np.isfinite(limit).any() and np.nanmin(limit) != np.nanmax(limit)
        if len(tab) and (model.min() != model.max() or varies):
            lim = 0
            if limit is not None:
                lim = np.where(np.isfinite(limit), np.round(limit), -1).astype(np.int64)
            sub, _ = dense_inverse(model * 100_003 + (lim + 1) % 100_003)
            key, _ = dense_inverse(group % 1_000_003 * 1024 + sub % 1024)
            inv, ng = buckets(tab.t, self.poll_seconds, key)
        else:
            inv, ng = buckets(tab.t, self.poll_seconds, group % 1_000_003)
        return busy, inv, ng

    def _feature(self, window: Window, name: str):
        """log(value / the busy peers' median) per row, and how many busy peers had a value."""
        return window.once(self, ("feature", name), lambda: self._feature_uncached(window, name))

    def _feature_uncached(self, window: Window, name: str):
        busy, inv, ng = self._peers(window)
        v = window.gpu.col(name)
        med, cnt = group_median(inv, np.where(busy, v, np.nan), ng)
        with np.errstate(invalid="ignore", divide="ignore"):
            return np.log(v / med[inv]), cnt[inv]

    def _features(self, window: Window):
        return window.once(self, "features", lambda: self._features_uncached(window))

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
        super().warm()
        import numpy.random  # noqa: F401 - its fit samples rows

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
                with np.errstate(all="ignore"), warnings.catch_warnings():
                    warnings.simplefilter("ignore")
                    location, cov = _mcd(X, support_fraction=0.9)
                precision = np.linalg.inv(cov + np.eye(X.shape[1]) * 1e-6)
            except np.linalg.LinAlgError:
                return False
            if not (np.isfinite(location).all() and np.isfinite(precision).all()):
                return False
            self.location_ = location
            self.precision_ = precision
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
            ((r & EXPLAINED) != 0) | (thermal_bits(tab) > 0)
            | nan_as_zero_gt(tab.col("clock_event_hw_power_brake"), 0)
        )
        busy, _, _ = self._peers(window)
        clock, peers = self._feature(window, "clock_sm_mhz")
        slow = clock < np.log(1 - self.min_slowdown)
        # slowness the SM clock does not show: less power (less work done at the same utilization)
        # or a memory clock below its peers'
        power_f, _ = self._feature(window, "power_watts")
        with np.errstate(invalid="ignore"):
            slow |= power_f < np.log(1 - self.min_power_drop)
            mclk = tab.cols.get("clock_memory_mhz")
            # (a memory clock that is the same everywhere says nothing: not compared)
            if mclk is not None and np.nanmax(mclk, initial=0) > np.nanmin(mclk, initial=np.inf):
                slow |= self._feature(window, "clock_memory_mhz")[0] < np.log(1 - self.min_slowdown)
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
            # drawing well more power than its peers (min_power_drop above theirs): more work, its
            # clock held by its power limit while they wait on it (a rank with more data, a node
            # a phase ahead), not a slower GPU, which does the same work at its peers' power or less
            not_same_work |= power_f > -np.log(1 - self.min_power_drop)
        candidate = valid & slow & ~explained & ~not_same_work
        hit = candidate & nan_as_zero_gt(sc, self.distance)

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
            if int(window.reg.model_ids().max(initial=0)) > 0:  # a mixed fleet: its peers' model
                out["model"] = window.reg.gpu_model[int(tab.ent[i])]
            lim = limits()
            if lim is not None and np.isfinite(lim[0][i]) and np.isfinite(lim[1][i]) and (
                abs(lim[1][i] - lim[0][i]) >= 1
            ):  # a limit an operator set: "power limit 500 W (peers 700 W)"
                out["power_limit_watts"] = round(float(lim[0][i]))
                out["peers_power_limit_watts"] = round(float(lim[1][i]))
            return out

        memo: dict = {}

        def limits():
            """(power limit per row, the job's median limit per row), computed once when read."""
            if "power_limit_watts" not in tab.cols:
                return None
            if "v" not in memo:
                lim = tab.ffill("power_limit_watts")
                jobs = tab.ffill_codes("job_id")
                node = window.node_of[tab.ent]
                g = np.where(jobs >= 0, jobs * 2, node * 2 + 1)
                jinv, jn = buckets(tab.t, self.poll_seconds, dense_inverse(g)[0])
                med, _ = group_median(jinv, np.where(busy, lim, np.nan), jn)
                memo["v"] = (lim, med[jinv])
            return memo["v"]

        hit_new = hit & new
        held = self._hold(window, tab, hit_new, judged, [("gpu", tab.ent, hit_new)])
        hits = self._gpu_hits(window, tab, hit, sc, False, ev)
        if len(hits) >= self.node_min_gpus:
            hits = node_scope_hits(hits, window, self.node_share, self.node_min_gpus)
        return concat(self.kind, [hits, held])


def _mcd(X: np.ndarray, support_fraction: float, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """Robust (location, covariance) of ``X`` (n × p, p > 1): the Minimum Covariance Determinant by
    FastMCD (Rousseeuw & Van Driessen 1999) as scikit-learn's ``MinCovDet(random_state=seed,
    support_fraction=...)`` computes it (1.9: 500 random starts, consistency factors, reweighting),
    the random starts drawn in the same order, but the C-steps of all starts run side by side as
    stacked arrays instead of one small covariance, pseudo-inverse and determinant at a time."""
    rng = np.random.RandomState(seed)
    n, p = X.shape
    h = int(support_fraction * n)
    rows = X.T[None]  # every start on all rows
    if n > 500:
        # candidates: 10 from each subset of about 300 rows, two C-steps from each random start
        n_subsets = n // 300
        n_sub = n // n_subsets
        shuffle = rng.permutation(n)
        h_sub = int(np.ceil(n_sub * (h / float(n))))
        trials = max(10, 500 // n_subsets)
        subsets = X[shuffle[: n_subsets * n_sub]].reshape(n_subsets, n_sub, p).transpose(0, 2, 1)
        starts = np.array([rng.permutation(n_sub)[:h_sub] for _ in range(n_subsets * trials)])
        loc, cov, det, _, _ = _c_steps(np.repeat(subsets, trials, axis=0), h_sub, 2, support=starts)
        best = np.argsort(det.reshape(n_subsets, trials), axis=1)[:, :10]
        best = (best + np.arange(n_subsets)[:, None] * trials).ravel()
        # refined on a merged set of at most 1500 rows (and then, past 1500 rows, on all of them)
        n_merged = min(1500, n)
        selection = rng.permutation(n)[:n_merged]
        h_merged = int(np.ceil(n_merged * (h / float(n))))
        merged = X[selection].T[None]
        loc, cov, det, sup, dist = _c_steps(merged, h_merged, 30, loc[best], cov[best], dists=True)
        if n < 1500:  # the merged set is every row
            b = np.argsort(det)[0]
            support, raw_dist = selection[sup[b]], np.empty(n)
            raw_dist[selection] = dist[b]
        else:
            best = np.argsort(det)[: 10 if n > 1500 else 1]
            loc, cov, det, sup, dist = _c_steps(rows, h, 30, loc[best], cov[best], dists=True)
            b = np.argsort(det)[0]
            support, raw_dist = sup[b], dist[b]
    else:
        starts = np.array([rng.permutation(n)[:h] for _ in range(30)])
        loc, cov, det, _, _ = _c_steps(rows, h, 2, support=starts)
        best = np.argsort(det)[:10]
        loc, cov, det, sup, dist = _c_steps(rows, h, 30, loc[best], cov[best], dists=True)
        b = np.argsort(det)[0]
        support, raw_dist = sup[b], dist[b]

    def consistency(alpha):  # Croux & Haesbroeck, Pison et al.: consistent at the normal distribution
        return alpha / _chi2_cdf(_chi2_ppf(alpha, p), p + 2)

    # the raw estimate picks the rows the reweighted one is computed from: those within the
    # chi-square's 97.5 % quantile
    raw_dist = raw_dist / consistency(len(support) / n)
    keep = raw_dist < _chi2_ppf(1 - 0.025, p)
    return X[keep].mean(0), _covariance(X[keep]) * consistency(1 - 0.025)


def _c_steps(X, h, n_iter, location=None, covariance=None, support=None, dists=False):
    """C-steps of FastMCD from many starts at once. Start k works on the rows ``X[k]`` (or on
    ``X[0]``, rows all starts share), a feature's values side by side (T × p × n); it begins with
    the ``h`` rows ``support[k]``, or those nearest the estimate (``location[k]``,
    ``covariance[k]``), and stops as scikit-learn's ``_c_step`` stops: when the determinant no
    longer falls, or after ``n_iter`` steps. Returns each start's location, covariance,
    log-determinant, ``h`` rows and (``dists``) distances of all rows."""
    T = len(location) if support is None else len(support)
    p, n = X.shape[1:]
    if support is None:
        precision = _pinvh(covariance)
        support = np.argpartition(_distance(X, location, precision), h - 1, axis=1)[:, :h]
    else:
        precision = np.zeros((T, p, p))
        support = support.copy()
    loc, cov, det = _estimate(X, support)
    stop = np.isinf(det)
    precision[stop] = _pinvh(cov[stop])
    prev_loc, prev_cov, prev_det, prev_sup = loc.copy(), cov.copy(), np.full(T, np.inf), support.copy()
    dist = np.full((T, n), np.inf)
    left = np.full(T, n_iter)
    run = (det < prev_det) & ~stop
    while run.any():
        k = slice(None) if run.all() else np.flatnonzero(run)
        Xk = X if len(X) == 1 else X[k]
        prev_loc[k], prev_cov[k], prev_det[k], prev_sup[k] = loc[k], cov[k], det[k], support[k]
        precision[k] = _pinvh(cov[k])
        dist[k] = _distance(Xk, loc[k], precision[k])
        support[k] = np.argpartition(dist[k], h - 1, axis=1)[:, :h]
        loc[k], cov[k], det[k] = _estimate(Xk, support[k])
        left[k] -= 1
        run = (det < prev_det) & (left > 0) & ~np.isinf(det)
    # as _c_step ends: a determinant that rose (more than rounding) before the last step gives
    # back the previous estimate, with the distances that estimate was judged by
    back = ~np.isinf(det) & ~np.isclose(det, prev_det, rtol=1e-5, atol=1e-8) & (det > prev_det) & (left > 0)
    loc[back], cov[back], det[back] = prev_loc[back], prev_cov[back], prev_det[back]
    support[back] = prev_sup[back]
    if not dists:
        return loc, cov, det, support, None
    final = _distance(X, loc, precision)  # the last precision: the estimate's before the last step
    final[back] = dist[back]
    return loc, cov, det, support, final


def _estimate(X: np.ndarray, support: np.ndarray):
    """Location, covariance and log-determinant (-inf where not positive) of rows ``support[k]``
    of ``X[k]``, for every k at once."""
    # np.take_along_axis(X, support[:, None, :], axis=2) as one gather by flat position
    T, p, n = len(support), X.shape[1], X.shape[2]
    row = np.arange(p) * n if len(X) == 1 else (np.arange(T)[:, None] * p + np.arange(p)) * n
    Xs = np.take(X, row[..., None] + support[:, None, :])
    loc = Xs.mean(axis=2)
    c = Xs - loc[:, :, None]
    cov = np.matmul(c, c.transpose(0, 2, 1)) / Xs.shape[2]
    sign, logdet = np.linalg.slogdet(cov)
    return loc, cov, np.where(sign > 0, logdet, -np.inf)


def _distance(X: np.ndarray, location: np.ndarray, precision: np.ndarray) -> np.ndarray:
    """Squared Mahalanobis distance of every row of ``X[k]`` from estimate k."""
    c = X - location[:, :, None]
    m = np.matmul(precision, c)
    m *= c
    # (m.sum(axis=1): the features added in order, without a strided reduction)
    out = m[:, 0] + m[:, 1] if m.shape[1] > 1 else m[:, 0].copy()
    for j in range(2, m.shape[1]):
        out += m[:, j]
    return out


def _pinvh(a: np.ndarray) -> np.ndarray:
    """Pseudo-inverses of stacked symmetric matrices (``scipy.linalg.pinvh``'s cut-off)."""
    s, u = np.linalg.eigh(a)
    cut = np.abs(s).max(axis=-1, initial=0.0, keepdims=True) * a.shape[-1] * np.finfo(np.float64).eps
    inv = np.where(np.abs(s) > cut, 1.0 / np.where(s == 0, 1.0, s), 0.0)
    return np.matmul(u * inv[..., None, :], u.transpose(0, 2, 1))


def _covariance(X: np.ndarray) -> np.ndarray:
    """The empirical covariance (``sklearn.covariance.empirical_covariance``'s arithmetic)."""
    Xt = np.array(X.T, ndmin=2, dtype=np.float64)  # as np.cov(X.T, bias=1)
    Xt -= Xt.mean(axis=1)[:, None]
    c = np.dot(Xt, Xt.T.conj())
    c *= np.true_divide(1, Xt.shape[1])
    return c


def _chi2_cdf(x: float, k: int) -> float:
    """P(X <= x) for X chi-square with ``k`` degrees of freedom: the regularised lower incomplete
    gamma P(k/2, x/2) by its series, y^a e^-y / Gamma(a + 1) * sum of y^n / ((a + 1)...(a + n))
    (terms all positive: no cancellation)."""
    a, y = k / 2, x / 2
    if y <= 0:
        return 0.0
    term = total = 1.0
    n = 0
    while term > total * 1e-17:
        n += 1
        term *= y / (a + n)
        total += term
    return min(1.0, math.exp(a * math.log(y) - y - math.lgamma(a + 1)) * total)


def _chi2_ppf(q: float, k: int) -> float:
    """The ``q`` quantile of the chi-square with ``k`` degrees of freedom (bisection to the last bit)."""
    if not 0 < q < 1:
        raise ValueError(f"chi-square quantile {q} outside (0, 1)")
    lo, hi = 0.0, float(k)
    while _chi2_cdf(hi, k) < q:
        lo, hi = hi, hi * 2
    while True:
        mid = (lo + hi) / 2
        if mid in (lo, hi):
            return mid
        if _chi2_cdf(mid, k) < q:
            lo = mid
        else:
            hi = mid
