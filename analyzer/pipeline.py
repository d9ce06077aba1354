"""Batch and online analysis: parsed rows -> time windows -> detectors -> incident engine.

Rows are buffered until the data's watermark (latest timestamp seen) is ``lateness_seconds``
past a window's end; then that window is cut, the detectors learn from it and score it, and
the engine turns their hits into incidents. Rows arriving later than that are dropped and
counted. Memory is bounded by window + lateness + context, not by the history.
"""

from __future__ import annotations

import math
import zlib
from dataclasses import dataclass

import numpy as np

from analyzer.config import Config
from analyzer.detectors import build
from analyzer.engine import Engine
from analyzer.frame import Registry, Table, Window
from analyzer.parse import Parser, Rows

MEASUREMENTS = {"gpu": "gpu", "gpu_nvlink": "link", "gpu_event": "gpu", "gpu_canary": "gpu",
                "host": "host", "bmc_sensor": "host"}


@dataclass
class _Block:
    ent: np.ndarray
    t: np.ndarray  # ns
    cols: dict
    text: dict


def shard_of(host: str, n: int) -> int:
    """Stable shard of a host: crc32 of its name modulo the shard count."""
    return zlib.crc32(host.encode()) % n


class Analyzer:
    def __init__(self, config: Config | None = None, shard: tuple[int, int] | None = None):
        self.config = config or Config()
        a = self.config.analyzer
        self.window = a["window_seconds"]
        self.context = a["context_seconds"]
        self.lateness = a["lateness_seconds"]
        self.poll = a["poll_seconds"]
        self.shard = shard
        self.parser = Parser(set(MEASUREMENTS))
        self.reg = Registry()
        self.detectors = build(self.config.detectors, self.poll)
        self.engine = Engine(self.config.detectors, self.config.engine["absorb_seconds"],
                             self.config.engine["fold"])
        self.buffer: dict[str, list[_Block]] = {m: [] for m in MEASUREMENTS}
        self.ctx: dict[str, _Block | None] = {m: None for m in MEASUREMENTS}
        self.window_start: float | None = None
        self.watermark_ns = -(2**62)
        self.late_points = 0
        self.rows = 0
        self.gpu_samples = 0
        self.windows = 0
        self.last_seen = np.zeros(0)
        self._sid_keep: dict[int, bool] = {}
        self._sid_extra: dict[int, dict] = {}

    # ------------------------------------------------------------------ input
    def feed_bytes(self, data: bytes) -> None:
        self.feed_rows(self.parser.feed(data))

    def feed_rows(self, rows: dict[str, Rows], series=None) -> None:
        series = series or self.parser.series
        for m, r in rows.items():
            if m not in MEASUREMENTS or not len(r):
                continue
            keep = self._keep(r, series, m)
            if keep is not None:
                r = r.take(keep)
                if not len(r):
                    continue
            ent = self.reg.entity(r, series, MEASUREMENTS[m])
            cols, text = dict(r.num), dict(r.text)
            if m == "gpu_event":
                text["type"] = np.array([self._sid_extra.get(s, {}).get("type") for s in r.sid.tolist()],
                                        dtype=object)
            if m == "bmc_sensor":
                cols = {"inlet": cols.get("value", np.full(len(r), np.nan))}
                text = {}
            self.buffer[m].append(_Block(ent, r.t.astype(np.int64), cols, text))
            self.rows += len(r)
            if m == "gpu":
                self.gpu_samples += len(r)
            self.watermark_ns = max(self.watermark_ns, int(r.t.max()))
        self._cut(final=False)

    def _keep(self, r: Rows, series, m: str):
        """Row mask for this shard and measurement (None: keep all)."""
        sids = r.sid
        u = np.unique(sids)
        need = False
        for s in u.tolist():
            if s not in self._sid_keep:
                tags = series.tags[s]
                ok = True
                if self.shard is not None:
                    ok = shard_of(tags.get("host", ""), self.shard[1]) == self.shard[0]
                if m == "bmc_sensor":
                    name = (tags.get("sensor", "") + " " + tags.get("sensor_type", "")).lower()
                    ok = ok and "inlet" in name and tags.get("unit", "C").upper().startswith("C")
                if m == "gpu_event":
                    self._sid_extra[s] = {"type": tags.get("type")}
                self._sid_keep[s] = ok
            need |= not self._sid_keep[s]
        if not need:
            return None
        flags = np.array([self._sid_keep[s] for s in u.tolist()])
        return flags[np.searchsorted(u, sids)]

    # ------------------------------------------------------------------ windows
    def _cut(self, final: bool) -> None:
        if self.watermark_ns < -(2**61):
            return
        wm = self.watermark_ns / 1e9
        if self.window_start is None:
            tmin = min((int(b.t.min()) for bl in self.buffer.values() for b in bl if len(b.t)), default=None)
            if tmin is None:
                return
            self.window_start = math.floor(tmin / 1e9 / self.window) * self.window
        while True:
            end = self.window_start + self.window
            if not final and wm - self.lateness < end:
                break
            if final and self.window_start > wm:
                break
            self._process(self.window_start, end)
            self.window_start = end

    def finish(self) -> None:
        self._cut(final=True)

    def _process(self, start: float, end: float) -> None:
        end_ns, start_ns, ctx_ns = int(end * 1e9), int(start * 1e9), int((start - self.context) * 1e9)
        tables = {}
        for m in MEASUREMENTS:
            blocks = self.buffer[m]
            cur, rest = [], []
            for b in blocks:
                inw = b.t < end_ns
                late = b.t < start_ns
                self.late_points += int(late.sum())
                take = inw & ~late
                if take.any():
                    cur.append(_sub(b, take))
                if (~inw).any():
                    rest.append(_sub(b, ~inw))
            self.buffer[m] = rest
            ctx = self.ctx[m]
            parts = ([ctx] if ctx is not None else []) + cur
            blk = _concat(parts)
            if blk is None:
                tables[m] = Table.empty()
                tables[m].new = np.zeros(0, bool)
                self.ctx[m] = None
                continue
            tab = Table.build(blk.ent, blk.t, blk.cols, blk.text)
            tab.new = tab.t >= start
            tables[m] = tab
            keep = blk.t >= ctx_ns + int(self.window * 1e9)
            self.ctx[m] = _sub(blk, keep) if keep.any() else None
        n_gpu = len(self.reg.gpu_host)
        if len(self.last_seen) < n_gpu:
            self.last_seen = np.concatenate([self.last_seen, np.full(n_gpu - len(self.last_seen), -np.inf)])
        g = tables["gpu"]
        if len(g):
            np.maximum.at(self.last_seen, g.ent, g.t)
        node_of, rack_of = self.reg.arrays()
        w = Window(start, end, self.reg, tables["gpu"], tables["gpu_nvlink"], tables["gpu_event"],
                   tables["gpu_canary"], tables["host"], tables["bmc_sensor"], node_of, rack_of,
                   self.last_seen.copy())
        rack_names = list(dict.fromkeys(r for r in self.reg.host_rack if r is not None))
        for det in self.detectors:
            det.fit(w)
            hits = det.detect(w)
            self.engine.add(hits, self.reg, rack_names)
        self.engine.advance(min(end, self.watermark_ns / 1e9))
        self.windows += 1

    def incidents(self):
        return self.engine.incidents()


def _sub(b: _Block, mask) -> _Block:
    return _Block(b.ent[mask], b.t[mask], {k: v[mask] for k, v in b.cols.items()},
                  {k: v[mask] for k, v in b.text.items()})


def _concat(parts: list[_Block]) -> _Block | None:
    parts = [p for p in parts if p is not None and len(p.t)]
    if not parts:
        return None
    if len(parts) == 1:
        return parts[0]
    n = [len(p.t) for p in parts]
    cols = {}
    for k in dict.fromkeys(k for p in parts for k in p.cols):
        cols[k] = np.concatenate([p.cols.get(k, np.full(m, np.nan)) for p, m in zip(parts, n, strict=True)])
    text = {}
    for k in dict.fromkeys(k for p in parts for k in p.text):
        text[k] = np.concatenate([p.text.get(k, np.full(m, None, dtype=object)) for p, m in zip(parts, n, strict=True)])
    return _Block(np.concatenate([p.ent for p in parts]), np.concatenate([p.t for p in parts]), cols, text)
