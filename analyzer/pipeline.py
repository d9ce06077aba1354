"""Batch and online analysis: parsed rows -> time windows -> detectors -> incident engine.

Rows are buffered until the data's watermark (latest timestamp seen) is ``lateness_seconds``
past a window's end; then that window is cut, the detectors learn from it and score it, and
the engine turns their hits into incidents. Rows arriving later than that are dropped and
counted (``late_points``), and so are rows stamped more than ``max_future_seconds`` after the
wall clock (``future_points``): one absurd timestamp never drags the watermark ahead.
Memory is bounded by window + lateness + context, not by the history.

Time is bounded: after a stream's data stops, empty windows are walked for ``EMPTY_WALK_SECONDS``
(a GPU that stopped reporting is noticed there); past that the next window starts at the stream's
next data. A stray point at timestamp 1 costs a few windows, never the 56 years up to the data.
"""

from __future__ import annotations

import functools
import math
import time
import zlib
from dataclasses import dataclass

import numpy as np
from gpufleet.analyzer.config import Config
from gpufleet.analyzer.detectors import REGISTRY, build
from gpufleet.analyzer.engine import Engine
from gpufleet.analyzer.frame import Registry, Table, Window
from gpufleet.analyzer.jobs import JobLog
from gpufleet.analyzer.parse import Parser, Rows

# wide measurements: of these only the fields some detector reads (its ``fields``) are converted, the
# rest of a row is tokenized, never converted; every other measurement is converted whole
SELECTIVE = ("gpu", "host", "bmc_sensor")
OWN_FIELDS = {"gpu": ("job_id",)}  # fields the pipeline reads itself: the job ids (incidents' ``jobs``)


def fields() -> dict[str, set[str] | None]:
    """The parser's field list, derived from the registry: per wide measurement, the fields the
    registered detectors (and the pipeline) read."""
    out: dict[str, set[str] | None] = {m: set(OWN_FIELDS.get(m, ())) for m in SELECTIVE}
    for cls in REGISTRY.values():
        for m, names in cls.fields.items():
            if m in SELECTIVE:
                out[m].update(names)
    return out


FIELDS = fields()  # as the registry holds at import (the analyzer derives its own when built)
# rows of a measurement worth reading only when one of these tags contains one of the words (case
# aside): of a node's ~100 BMC sensors the cooling model reads the inlet temperature and the fans
TAG_WORD = {"bmc_sensor": (("sensor", "sensor_type"), ("inlet", "fan"))}
# bmc_fan: the bmc_sensor rows of fan sensors, a stream of their own (a host's inlet and fan rows
# share a timestamp, and a table keeps one row per host and time)
STREAMS = ("gpu", "gpu_nvlink", "gpu_event", "gpu_canary", "host", "bmc_sensor", "bmc_fan")
MEASUREMENTS = {
    "gpu": "gpu",
    "gpu_nvlink": "link",
    "gpu_event": "gpu",
    "gpu_canary": "gpu",
    "host": "host",
    "bmc_sensor": "host",
    "bmc_fan": "host",
}


EMPTY_WALK_SECONDS = 3600.0  # empty windows walked after a stream's last data before skipping to the next


@dataclass
class _Block:
    ent: np.ndarray
    t: np.ndarray  # ns
    cols: dict
    text: dict

    # earliest and latest t, found when first asked (a window's joined rows never are)
    @functools.cached_property
    def tmin(self) -> int:
        return int(self.t.min()) if len(self.t) else 0

    @functools.cached_property
    def tmax(self) -> int:
        return int(self.t.max()) if len(self.t) else -1


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
        self.max_future = a["max_future_seconds"]
        self.shard = shard
        self.fields = fields()  # what the parser converts, derived from the registry when built
        self.parser = Parser(set(MEASUREMENTS), self.fields)
        self.reg = Registry()
        self.detectors = build(self.config.detectors, self.poll)
        self.engine = Engine(
            self.config.detectors, self.config.engine["absorb_seconds"], self.config.engine["fold"]
        )
        self.buffer: dict[str, list[_Block]] = {m: [] for m in MEASUREMENTS}
        self.ctx: dict[str, _Block | None] = {m: None for m in MEASUREMENTS}
        self.window_start: dict[str, float | None] = {}
        self.stream_wm: dict[str, int] = {}
        self.online = False
        self.late_points = 0
        self.future_points = 0  # stamped beyond max_future_seconds after the wall clock: dropped
        self.rows = 0
        self.t_first = 2**62  # ns: the earliest row kept (the summary line's time span)
        self.last_data: dict[str, float] = {}  # per stream: end of the last window that held rows
        self.gpu_samples = 0
        self.windows = 0
        self.last_seen = np.zeros(0)
        self._sid_keep: dict[int, bool] = {}
        self._keep_flags = np.zeros(0, np.int8)  # per series id: 1 keep, 0 drop, -1 not seen yet
        self._sid_extra: dict[int, dict] = {}
        self.jobs = JobLog()  # job ids per GPU over time, for the incidents' ``jobs``

    # ------------------------------------------------------------------ input
    def wanted(self) -> dict[str, set[str] | None]:
        """What to read from a store: measurement -> the fields some detector reads (None: all),
        the list the parser converts."""
        return {m: self.fields.get(m) for m in MEASUREMENTS}

    def not_mine(self, hosts) -> list[str] | None:
        """Of ``hosts``, those another shard analyses (None: unsharded, every host is mine)."""
        if self.shard is None:
            return None
        i, n = self.shard
        return [h for h in hosts if shard_of(h, n) != i]

    @staticmethod
    def tag_words() -> dict[str, tuple[tuple[str, ...], tuple[str, ...]]]:
        """Per measurement, tags of which one must contain one of the words for a row to be read."""
        return dict(TAG_WORD)

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
            horizon = time.time_ns() + int(self.max_future * 1e9)
            if int(r.t.max()) > horizon:  # absurdly in the future: counted, never the stream's time
                ok = r.t <= horizon
                self.future_points += int(len(r) - ok.sum())
                r = r.take(ok)
                if not len(r):
                    continue
            ent = self.reg.entity(r, series, MEASUREMENTS[m])
            cols, text = dict(r.num), dict(r.text)
            if m == "gpu_event":
                text["type"] = self._per_series(r.sid, lambda x: x.get("type"), object)
            if m == "bmc_sensor":
                fan = self._per_series(r.sid, lambda x: x.get("sensor") == "fan", bool)
                value = cols.get("value", np.full(len(r), np.nan))
                if fan.any():
                    state = cols.get("state_code", np.full(len(r), np.nan))
                    t = r.t.astype(np.int64)
                    fb = _Block(ent[fan], t[fan], {"fan_rpm": value[fan], "fan_state": state[fan]}, {})
                    self.buffer["bmc_fan"].append(fb)
                    self.stream_wm["bmc_fan"] = max(self.stream_wm.get("bmc_fan", -(2**62)), fb.tmax)
                    if fan.all():
                        continue
                    ent, r = ent[~fan], r.take(~fan)
                    value = value[~fan]
                cols = {"inlet": value}
                text = {}
            blk = _Block(ent, r.t.astype(np.int64), cols, text)
            self.buffer[m].append(blk)
            self.rows += len(r)
            if m == "gpu":
                self.gpu_samples += len(r)
            self.stream_wm[m] = max(self.stream_wm.get(m, -(2**62)), blk.tmax)
            self.t_first = min(self.t_first, blk.tmin)
        self._cut(final=False)

    def _per_series(self, sids: np.ndarray, fn, dtype) -> np.ndarray:
        """Per row: ``fn`` of its series' extra labels (``_sid_extra``), called once per series."""
        u, inv = np.unique(sids, return_inverse=True)
        return np.array([fn(self._sid_extra.get(s, {})) for s in u.tolist()], dtype=dtype)[inv]

    def _keep(self, r: Rows, series, m: str):
        """Row mask for this shard and measurement (None: keep all)."""
        sids = r.sid
        flags = self._keep_flags
        if len(flags) > int(sids.max()):
            # every series seen before: one table look-up per row
            f = flags[sids]
            if (f == 1).all():
                return None
            if (f >= 0).all():
                return f == 1
        u = np.unique(sids)
        need = False
        for s in u.tolist():
            if s not in self._sid_keep:
                tags = series.tags[s]
                ok = True
                if self.shard is not None:
                    ok = shard_of(tags.get("host", ""), self.shard[1]) == self.shard[0]
                if m in TAG_WORD:
                    keys, words = TAG_WORD[m]
                    ok = ok and any(w in tags.get(k, "").lower() for k in keys for w in words)
                if m == "bmc_sensor":
                    name = (tags.get("sensor", "") + " " + tags.get("sensor_type", "")).lower()
                    unit = tags.get("unit", "C").upper()
                    inlet = "inlet" in name and unit.startswith("C")
                    fan = "fan" in name
                    ok = ok and (inlet or fan)
                    self._sid_extra[s] = {"sensor": "fan" if fan and not inlet else "inlet"}
                if m == "gpu_event":
                    self._sid_extra[s] = {"type": tags.get("type")}
                self._sid_keep[s] = ok
            need |= not self._sid_keep[s]
        if int(u[-1]) >= len(flags):
            flags = np.concatenate([flags, np.full(int(u[-1]) + 1 - len(flags), -1, np.int8)])
        flags[u] = [self._sid_keep[s] for s in u.tolist()]
        self._keep_flags = flags
        if not need:
            return None
        flags = np.array([self._sid_keep[s] for s in u.tolist()])
        return flags[np.searchsorted(u, sids)]

    # ------------------------------------------------------------------ windows
    # Each measurement is its own stream with its own window cursor: files may hold one
    # measurement after another (an export), an agent's file interleaves them; both work.
    def _cut(self, final: bool) -> None:
        for m in STREAMS:
            blocks = self.buffer[m]
            wm_ns = self.stream_wm.get(m)
            if wm_ns is None:
                if not blocks:
                    continue
                wm_ns = max(int(b.t.max()) for b in blocks if len(b.t))
            wm = wm_ns / 1e9
            if self.window_start.get(m) is None:
                if not blocks:
                    continue
                tmin = min(int(b.t.min()) for b in blocks if len(b.t)) / 1e9
                self.window_start[m] = math.floor(tmin / self.window) * self.window
                self.last_data[m] = self.window_start[m]
            walk = max(EMPTY_WALK_SECONDS, 4 * self.window)
            while True:
                start = self.window_start[m]
                end = start + self.window
                if not final and wm - self.lateness < end:
                    break
                if final and start > wm:
                    break
                blocks = self.buffer[m]
                nxt = min((b.tmin for b in blocks if len(b.t)), default=None)
                if nxt is not None and nxt < end * 1e9:
                    self.last_data[m] = end
                elif start >= self.last_data[m] + walk and self.ctx.get(m) is None:
                    # nothing to analyse for a while: the next window starts at the next data (or
                    # at the last window that may be cut now, for a stream that went quiet)
                    last = wm if final else wm - self.lateness - self.window
                    target = math.floor(min(nxt / 1e9 if nxt is not None else math.inf, last)
                                        / self.window) * self.window
                    if target > start:
                        self.window_start[m] = target
                        continue
                self._process(m, start, end)
                self.window_start[m] = end
        if final:
            self.engine.progress.clear()
            self.engine.advance(max(self.stream_wm.values(), default=0) / 1e9)
        else:
            # hand the engine what every stream has analysed so far: its queue stays short (a stream
            # that shows up later, e.g. events at the end of an export, arrives as late hits), and
            # how far each kind's own streams are: a kind's incident is quiet only up to there
            done = [self.window_start[m] for m in self.window_start if self.window_start[m] is not None]
            for det in self.detectors:
                own = [self.window_start.get(m) for m in det.tables]
                self.engine.progress[det.kind] = min((s for s in own if s is not None), default=-math.inf)
            if done:
                self.engine.advance(min(done))

    def advance_clock(self, now: float) -> None:
        """Online mode: wall-clock time ``now`` (seconds) has passed; windows whose data should all
        be in by now are analysed even if no newer point arrived (a quiet stream, a lost GPU)."""
        for m in list(self.stream_wm):
            self.stream_wm[m] = max(self.stream_wm[m], int(now * 1e9))
        self._cut(final=False)

    def finish(self) -> None:
        self._cut(final=True)

    def _table(
        self, m: str, start: float, end: float, consume: bool = True, build: bool = True
    ) -> Table | None:
        """The rows of ``[start, end)`` plus context as a table; ``consume``: move the stream past
        the window (rows before it are late, the context is kept); ``build``: False just consumes."""
        end_ns, start_ns = int(end * 1e9), int(start * 1e9)
        ctx_from = int((end - self.context) * 1e9)
        blocks = self.buffer[m]
        cur, rest = [], []
        lo_ns = start_ns if consume else int((start - self.context) * 1e9)
        for b in blocks:
            # most blocks lie wholly inside the window or wholly after it: no row masks, no copies
            if b.tmin >= end_ns:
                if consume:
                    rest.append(b)
                continue
            if b.tmin >= lo_ns and b.tmax < end_ns:
                cur.append(b)
                continue
            inw = b.t < end_ns
            if consume:
                late = b.t < start_ns
                self.late_points += int(late.sum())
                take = inw & ~late
            else:
                take = inw & (b.t >= lo_ns)
            if take.any():
                cur.append(_sub(b, take))
            if consume and (~inw).any():
                rest.append(_sub(b, ~inw))
        if consume:
            self.buffer[m] = rest
        ctx = self.ctx.get(m)
        blk = _concat(([ctx] if ctx is not None else []) + cur)
        if blk is None:
            tab = Table.empty()
            tab.new = np.zeros(0, bool)
            if consume:
                self.ctx[m] = None
            return tab
        if consume:
            keep = blk.t >= ctx_from
            self.ctx[m] = _sub(blk, keep) if keep.any() else None
        if not build:
            return None
        tab = Table.build(blk.ent, blk.t, blk.cols, blk.text)
        tab.new = tab.t >= start
        return tab

    def _process(self, m: str, start: float, end: float) -> None:
        if m in ("bmc_sensor", "bmc_fan", "host"):
            # inlet readings reach the gpu stream's cooling model through the buffer and context
            self._table(m, start, end, build=False)
            return
        tab = self._table(m, start, end)
        empty = Table.empty()
        empty.new = np.zeros(0, bool)
        tables = {k: empty for k in ("gpu", "gpu_nvlink", "gpu_event", "gpu_canary", "host", "bmc_sensor")}
        tables[m] = tab
        n_gpu = len(self.reg.gpu_host)
        if len(self.last_seen) < n_gpu:
            self.last_seen = np.concatenate([self.last_seen, np.full(n_gpu - len(self.last_seen), -np.inf)])
        if m == "gpu":
            if len(tab):
                # rows in (entity, time) order: an entity's last row is its latest
                last = np.flatnonzero(np.append(tab.ent[1:] != tab.ent[:-1], True))
                g = tab.ent[last]
                self.last_seen[g] = np.maximum(self.last_seen[g], tab.t[last])
                job = tab.text.get("job_id")
                new = tab.in_window()
                self.jobs.add(tab.ent[new], tab.t[new], job[new] if job is not None else None)
            tables["bmc_sensor"] = self._table("bmc_sensor", start, end, consume=False)
            fan = self._table("bmc_fan", start, end, consume=False)
        node_of, rack_of = self.reg.arrays()
        w = Window(
            start,
            end,
            self.reg,
            tables["gpu"],
            tables["gpu_nvlink"],
            tables["gpu_event"],
            tables["gpu_canary"],
            tables["host"],
            tables["bmc_sensor"],
            node_of,
            rack_of,
            self.last_seen.copy(),
            seq=self.windows,
        )
        if m == "gpu":
            w.fan = fan
        rack_names = list(dict.fromkeys(r for r in self.reg.host_rack if r is not None))
        for det in self.detectors:
            if m not in det.tables:
                continue
            det.fit(w)
            hits = det.detect(w)
            self.engine.add(hits, self.reg, rack_names)
        self.windows += 1

    def incidents(self):
        """The engine's incidents, each with the job ids on its GPUs during it (``jobs``)."""
        recs = self.engine.incidents()
        self.jobs.annotate(recs + self.engine.absorbed, self.reg.gpu_host, self.reg.gpu_index)
        return recs


def _sub(b: _Block, mask) -> _Block:
    idx = np.flatnonzero(mask)
    if len(idx) == len(mask):
        return b
    if len(idx) and idx[-1] - idx[0] + 1 == len(idx):  # one run of rows: views, not copies
        s = slice(int(idx[0]), int(idx[-1]) + 1)
        return _Block(
            b.ent[s], b.t[s], {k: v[s] for k, v in b.cols.items()}, {k: v[s] for k, v in b.text.items()}
        )
    # the rows' indices found once, then each column taken by them (not a mask scan per column)
    return _Block(
        b.ent.take(idx),
        b.t.take(idx),
        {k: v.take(idx) for k, v in b.cols.items()},
        {k: v.take(idx) for k, v in b.text.items()},
    )


def _concat(parts: list[_Block]) -> _Block | None:
    parts = [p for p in parts if p is not None and len(p.t)]
    if not parts:
        return None
    if len(parts) == 1:
        return parts[0]
    cols = {
        k: np.concatenate([p.cols[k] if k in p.cols else np.full(len(p.t), np.nan) for p in parts])
        for k in dict.fromkeys(k for p in parts for k in p.cols)
    }
    text = {
        k: np.concatenate(
            [p.text[k] if k in p.text else np.full(len(p.t), None, dtype=object) for p in parts]
        )
        for k in dict.fromkeys(k for p in parts for k in p.text)
    }
    return _Block(np.concatenate([p.ent for p in parts]), np.concatenate([p.t for p in parts]), cols, text)
