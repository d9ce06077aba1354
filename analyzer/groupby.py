"""Group-by on numpy arrays: the per-group medians, counts and ranks the detectors compute.

Integer keys (entity, link, host ids, time buckets) are small and dense in practice, so most
functions count on a table indexed by the key where the range allows and fall back to sorting
(``np.unique``) where it does not; each gives what its plain numpy spelling in its docstring gives.
"""

from __future__ import annotations

import numpy as np


def member(keys: np.ndarray, keyset) -> np.ndarray:
    """``np.isin(keys, list(keyset))`` for integer keys: a table look-up where the keys are small
    and non-negative (entity, link and host ids)."""
    if not len(keys) or not keyset:
        return np.zeros(len(keys), bool)
    want = np.fromiter(keyset, np.int64, len(keyset))
    hi = int(keys.max())
    if int(keys.min()) < 0 or hi > 4 * len(keys) + 4096:
        return np.isin(keys, want)
    table = np.zeros(hi + 1, bool)
    table[want[(want >= 0) & (want <= hi)]] = True
    return table[keys]


def group_median(inv: np.ndarray, v: np.ndarray, n_groups: int) -> tuple[np.ndarray, np.ndarray]:
    """Median and count of ``v`` per group (NaN values ignored); NaN for empty groups."""
    ok = np.isfinite(v)
    inv, v = inv[ok], v[ok]
    cnt = np.bincount(inv, minlength=n_groups)
    med = np.full(n_groups, np.nan)
    if not len(v):
        return med, cnt
    has = cnt > 0
    width = int(cnt.max())
    if n_groups * width <= 4 * len(v) + 4096:
        # groups of similar size (a GPU's links at one poll, the GPUs of one minute): one row per
        # group, padded with +inf, each row sorted on its own (short sorts instead of one long one)
        order = np.argsort(inv.astype(np.uint16) if n_groups <= 2**16 else inv, kind="stable")
        g = inv[order]
        start = np.cumsum(cnt) - cnt
        rows = np.full(n_groups * width, np.inf)
        rows[np.arange(len(g)) + (g * width - start[g])] = v[order]
        rows = rows.reshape(n_groups, width)
        rows.sort(axis=1)
        r = np.flatnonzero(has)
        c = cnt[r]
        med[r] = (rows[r, (c - 1) // 2] + rows[r, c // 2]) / 2
        return med, cnt
    lo_v, hi_v = float(v.min()), float(v.max())
    span = hi_v - lo_v
    if span > 0 and n_groups < 2**40:
        # group index plus the value scaled into [0, 0.5]: one float sort instead of a lexsort
        order = _stable_argsort(inv + (v - lo_v) * (0.5 / span), v)
    else:
        order = np.argsort(inv, kind="stable")
    vs = v[order]
    start = np.concatenate([[0], np.cumsum(cnt)[:-1]])
    lo = start[has] + (cnt[has] - 1) // 2
    hi = start[has] + cnt[has] // 2
    med[has] = (vs[lo] + vs[hi]) / 2
    return med, cnt


def _stable_argsort(key: np.ndarray, v: np.ndarray) -> np.ndarray:
    """An order of ``key`` whose ``v[order]`` equals that of the stable sort: the fast unstable
    sort, unless rows with equal keys carry different values (then their order would matter)."""
    order = np.argsort(key)
    ks, vs = key[order], v[order]
    if ((ks[1:] == ks[:-1]) & (vs[1:] != vs[:-1])).any():
        return np.argsort(key, kind="stable")
    return order


def dense_inverse(key: np.ndarray) -> tuple[np.ndarray, int]:
    """``np.unique(key, return_inverse=True)`` for integers as (inverse, number of distinct keys);
    keys within a small range are ranked by counting instead of sorting."""
    if not len(key):
        return np.zeros(0, np.int64), 0
    lo, hi = int(key.min()), int(key.max())
    if hi - lo > 8 * len(key) + 4096:
        u, inv = np.unique(key, return_inverse=True)
        return inv.reshape(-1), len(u)
    k = key - lo
    present = np.zeros(hi - lo + 1, bool)
    present[k] = True
    # counted in 32 bits where they suffice (a bool cumsum into 64 bits is several times slower)
    rank = np.cumsum(present, dtype=np.int32 if len(present) < 2**31 else np.int64)
    rank -= 1
    return rank[k].astype(np.int64), int(rank[-1]) + 1


def buckets(t: np.ndarray, seconds: float, extra: np.ndarray | None = None):
    """Group rows by time bucket (and an extra integer key): (inverse, number of groups)."""
    b = np.floor(t / seconds).astype(np.int64)
    if extra is None:
        return dense_inverse(b)
    if len(extra) and int(extra.min()) >= 0 and int(extra.max()) < 1_000_003:
        # (bucket, extra) ranks as the combined key below does, counted instead of sorted
        e, ne = dense_inverse(extra)
        return dense_inverse((b - int(b.min())) * ne + e)
    return dense_inverse(b * 1_000_003 + extra)


def lookup(mapping: dict, keys: np.ndarray, default=np.nan) -> np.ndarray:
    """``[mapping.get(k, default) for k in keys]`` for an integer array (as floats)."""
    if not len(keys):
        return np.zeros(0)
    lo, hi = int(keys.min()), int(keys.max())
    if lo < 0 or hi > 4 * len(keys) + 4096:
        u, inv = np.unique(keys, return_inverse=True)
        vals = np.array([mapping.get(k, default) for k in u.tolist()], dtype=float)
        return vals[inv]
    # dense ids (entities, hosts): a table indexed by id
    table = np.full(hi + 1, default, dtype=float)
    if mapping:
        ks = np.fromiter(mapping.keys(), np.int64, len(mapping))
        vs = np.fromiter(mapping.values(), float, len(mapping))
        inside = (ks >= 0) & (ks <= hi)
        table[ks[inside]] = vs[inside]
    return table[keys]


def distinct_count(inv: np.ndarray, ent: np.ndarray, mask: np.ndarray, n: int) -> np.ndarray:
    """Per group: how many distinct entities have a row with ``mask`` set."""
    if not mask.any():
        return np.zeros(n, np.int64)
    m = int(ent.max()) + 2
    key = inv[mask].astype(np.int64) * m + (ent[mask] + 1)
    if n * m <= 8 * len(key) + 2**20:  # pairs counted on a table of all (group, entity) pairs
        present = np.zeros(n * m, bool)
        present[key] = True
        return present.reshape(n, m).sum(1)
    return np.bincount(np.unique(key) // m, minlength=n)


def per_key_minute(keys: np.ndarray, t: np.ndarray, idx: np.ndarray, score: np.ndarray) -> np.ndarray:
    """Of the rows ``idx``, one per key and minute: the highest-scoring row speaks for it."""
    grp = keys[idx] * 10**7 + np.floor(t[idx] / 60).astype(np.int64)
    order = np.lexsort((-score[idx], grp))
    first = np.ones(len(order), bool)
    first[1:] = grp[order][1:] != grp[order][:-1]
    return idx[order[first]]


def raise_latest(last: np.ndarray, ent: np.ndarray, t: np.ndarray) -> np.ndarray:
    """``last`` (per entity id: its latest time, -inf where none) grown to hold every id of ``ent``
    and raised to ``t`` there (a new array where it grew)."""
    if len(ent) and int(ent.max()) >= len(last):
        last = np.concatenate([last, np.full(int(ent.max()) + 1 - len(last), -np.inf)])
    np.maximum.at(last, ent, t)
    return last


def latest_at(last: np.ndarray, ent: np.ndarray) -> np.ndarray:
    """Per id of ``ent``: its time in ``last`` (see ``raise_latest``), -inf beyond it."""
    out = np.full(len(ent), -np.inf)
    known = ent < len(last)
    out[known] = last[ent[known]]
    return out
