"""Which jobs ran on which GPU when: the ``gpu.job_id`` field -> job ids on an incident.

The agent writes the job on each GPU (Slurm job id or pod UID, see ``agent/jobs.py``) as the
``job_id`` field of its slow tier (every ``slow_every`` polls, ~60 s). :class:`JobLog` keeps,
per GPU, the span in which each job id was seen; :meth:`JobLog.annotate` sets an incident's
``jobs`` to the ids whose span meets the incident's time on its GPU (a node incident: every GPU
of the node; a rack incident: none, that would name half the fleet). Spans are widened by
``slack_seconds`` on both sides, as the field is sampled, not continuous.

Memory stays bounded: spans that ended ``keep_seconds`` before the newest data are dropped, and
at most ``per_gpu`` jobs are kept per GPU (the latest).
"""

from __future__ import annotations

import numpy as np

from gpufleet.records import Record


class JobLog:
    def __init__(self, keep_seconds: float = 7 * 86400.0, per_gpu: int = 64, slack_seconds: float = 90.0):
        self.keep = keep_seconds
        self.per_gpu = per_gpu
        self.slack = slack_seconds
        self.spans: dict[int, dict[str, list[float]]] = {}
        self.newest = -np.inf
        self._pruned = -np.inf

    def add(self, ent: np.ndarray, t: np.ndarray, job: np.ndarray | None) -> None:
        """Rows of the gpu table (sorted by entity, then time): GPU id, time (s), job id or None."""
        if job is None or not len(ent):
            return
        has = job != None  # noqa: E711 - elementwise on an object array
        if not has.any():
            return
        e, tt, j = ent[has], t[has], job[has]
        # one segment per run of the same (GPU, job): a GPU holds one or two jobs per window
        cut = np.ones(len(e), bool)
        cut[1:] = (e[1:] != e[:-1]) | (j[1:] != j[:-1])
        starts = np.flatnonzero(cut)
        ends = np.append(starts[1:], len(e)) - 1
        gids, ids = e[starts].tolist(), j[starts].tolist()
        for g, job_id, lo, hi in zip(gids, ids, tt[starts].tolist(), tt[ends].tolist(), strict=True):
            jobs = self.spans.setdefault(g, {})
            span = jobs.get(job_id)
            if span is None:
                jobs[str(job_id)] = [lo, hi]
                if len(jobs) > self.per_gpu:
                    del jobs[min(jobs, key=lambda k: jobs[k][1])]
            else:
                span[0], span[1] = min(span[0], lo), max(span[1], hi)
        self.newest = max(self.newest, float(tt.max()))
        if self.newest - self._pruned > 3600:
            self._prune()

    def _prune(self) -> None:
        old = self.newest - self.keep
        for gid in list(self.spans):
            jobs = self.spans[gid]
            for k in [k for k, (_, hi) in jobs.items() if hi < old]:
                del jobs[k]
            if not jobs:
                del self.spans[gid]
        self._pruned = self.newest

    def jobs(self, gids, start: float, end: float | None) -> list[str]:
        """Job ids seen on ``gids`` in ``[start, end]`` (end None: still open), in first-seen order."""
        hi = np.inf if end is None else end
        found: dict[str, float] = {}
        for g in gids:
            for k, (a, b) in self.spans.get(g, {}).items():
                if a - self.slack <= hi and b + self.slack >= start:
                    found[k] = min(found.get(k, np.inf), a)
        return sorted(found, key=lambda k: (found[k], k))

    def annotate(self, recs: list[Record], gpu_host: list[str], gpu_index: list[int | None]) -> None:
        """Set ``jobs`` of each record from its GPU's (node's) spans; rack incidents stay empty."""
        if not self.spans:
            return
        by_host: dict[str, list[tuple[int | None, int]]] = {}
        for gid in self.spans:
            if gid < len(gpu_host):
                by_host.setdefault(gpu_host[gid], []).append((gpu_index[gid], gid))
        for r in recs:
            if r.host is None:
                continue
            gids = [gid for idx, gid in by_host.get(r.host, ()) if r.gpu is None or idx == r.gpu]
            if gids:
                r.jobs = self.jobs(gids, r.start, r.end)
