"""Batch and online analysis: parsed rows -> time windows -> detectors -> incident engine.

Rows are buffered until the data's watermark (latest timestamp seen) is ``lateness_seconds``
past a window's end; then that window is cut, the detectors learn from it and score it, and
the engine turns their hits into incidents. Rows stamped more than ``max_future_seconds`` after
the wall clock are dropped and counted (``future_points``): one absurd timestamp never drags the
watermark ahead.

Event time per host: rows of a host that land behind its stream's cursor (a node cut off whose
agent drains its spool, a slow gateway) are not dropped. They wait in a late buffer and are
analysed in that host's own time (:meth:`Analyzer._late_cut`), in windows of their own: the host's
rows, with the peers' rows still held (``peers_hold_seconds``) and the host's own context; hits
are kept for the late hosts only and reach the engine with their true times (an incident found
that way says so: ``evidence.arrived_late``). A late window of a host is analysed once the host's
own data is ``lateness_seconds`` past its end, its complete windows once its rows stop growing
for a cycle (online), all of them after two.
Rows more than ``late_bound_seconds`` behind the cursor are not held: with a store they are
listed for re-reading (``reread``), without one they are dropped, counted per host and reported
as an ``analysis_gap`` record (host, from, to, rows, why). Rows inside what their own host has
already analysed (duplicates, a host's own reordering beyond the grace) are counted
(``late_points``) and recorded (an informational ``analysis_gap`` per host and stretch); a
part of a host's backlog older than what its late windows analysed (it landed after them) is
analysed in late windows of its own. Memory is bounded by window +
lateness + context + the peers held.

Time is bounded: after a stream's data stops, empty windows are walked for ``EMPTY_WALK_SECONDS``
(a GPU that stopped reporting is noticed there); past that the next window starts at the stream's
next data. A stray point at timestamp 1 costs a few windows, never the 56 years up to the data.
"""

from __future__ import annotations

import dataclasses
import functools
import math
import os
import time
import zlib
from dataclasses import dataclass

import numpy as np
from gpufleet.analyzer.config import Config
from gpufleet.analyzer.detectors import REGISTRY, build
from gpufleet.analyzer.detectors.base import Hits
from gpufleet.analyzer.engine import Engine
from gpufleet.analyzer.frame import Registry, Table, Window
from gpufleet.analyzer.groupby import latest_at, raise_latest
from gpufleet.analyzer.jobs import JobLog
from gpufleet.analyzer.parse import Parser, Rows

from gpufleet.hosts import safe as safe_host

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
BMC_STREAMS = ("bmc_sensor", "bmc_fan")  # what a GPU window reads of its hosts' BMC (inlet, fans)
MEASUREMENTS = {
    "gpu": "gpu",
    "gpu_nvlink": "link",
    "gpu_event": "gpu",
    "gpu_canary": "gpu",
    "host": "host",
    "bmc_sensor": "host",
    "bmc_fan": "host",
}


# streams whose counters are differenced (frame.Table.increase): a GPU or link gone silent while its
# node reports keeps its last row as context, for up to late_bound_seconds, so the step over its gap
# is seen when it returns
ANCHORED = ("gpu", "gpu_nvlink")
# the Window attribute that holds each stream's table
WINDOW_TABLE = {"gpu": "gpu", "gpu_nvlink": "nvlink", "gpu_event": "event", "gpu_canary": "canary",
                "host": "host", "bmc_sensor": "bmc"}
NEW = "\x00new"  # a late window's own column: 1 where a row is the window's to analyse, not context
EMPTY_WALK_SECONDS = 3600.0  # empty windows walked after a stream's last data before skipping to the next


@dataclass
class _Block:
    ent: np.ndarray
    t: np.ndarray  # ns
    cols: dict
    text: dict
    late: bool = False  # held as peers: rows a late window analysed (see Analyzer._keep_held)

    # earliest and latest t, found when first asked (a window's joined rows never are)
    @functools.cached_property
    def tmin(self) -> int:
        return int(self.t.min()) if len(self.t) else 0

    @functools.cached_property
    def tmax(self) -> int:
        return int(self.t.max()) if len(self.t) else -1

    @functools.cached_property
    def nbytes(self) -> int:
        arrays = (self.ent, self.t, *self.cols.values(), *self.text.values())
        return sum(a.nbytes if a.strides[0] else a.itemsize for a in arrays)  # a broadcast value: one


def shard_of(host: str, n: int) -> int:
    """Stable shard of a host: crc32 of its name modulo the shard count."""
    return zlib.crc32(host.encode()) % n


COPIES = "inside what the host had analysed already (copies, or its own rows reordered beyond the grace)"


class Analyzer:
    def __init__(self, config: Config | None = None, shard: tuple[int, int] | None = None):
        self.config = config or Config()
        a = self.config.analyzer
        self.window = a["window_seconds"]
        self.context = a["context_seconds"]
        self.lateness = a["lateness_seconds"]
        self.poll = a["poll_seconds"]
        self.max_future = a["max_future_seconds"]
        self.bound = a.get("late_bound_seconds", 86400.0)
        self.hold = a.get("peers_hold_seconds", 0.0)
        self.hold_bytes = a.get("peers_hold_bytes", 0)
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
        # event time per host (see the module docstring)
        self.late: dict[str, list[_Block]] = {m: [] for m in MEASUREMENTS}  # rows behind the cursor
        self.late_ctx: dict[str, _Block | None] = {m: None for m in MEASUREMENTS}
        self.hist: dict[str, list[_Block]] = {m: [] for m in MEASUREMENTS}  # analysed rows held as peers
        self.let_go: dict[str, int] = {}  # stream -> the latest row (ns) of its held rows let go
        self.held_bytes = 0
        self.held_oldest = 2**62  # the latest row of the oldest block held (ns)
        # (stream, host id) -> the stretches of its rows analysed in late windows, [from, to] (s), in
        # order, rows no more than a few polls apart one stretch: a row landing inside one is a copy
        self.late_spans: dict[tuple[str, int], list[list[float]]] = {}
        # stream -> per host id, the current stretch of its rows analysed in time (from, to: s); and
        # (stream, host id) -> its earlier stretches (closed by a gap): see _analysed
        self.covered: dict[str, tuple[np.ndarray, np.ndarray]] = {}
        self.closed: dict[tuple[str, int], list[tuple[float, float]]] = {}
        # per stream, per entity: its latest row analysed in time, and in a late window (s). A row
        # inside a stretch its host analysed but newer than its own entity's rows there was never
        # analysed: the rest of a poll whose rows came in two bodies, the second after the stretch
        # was cut (an agent cut off mid-write, a spool drained slowly), is no copy
        self.ent_last: dict[str, np.ndarray] = {}
        self.late_last: dict[str, np.ndarray] = {}
        self.join = 3 * self.poll  # rows further apart than this leave a gap
        self.every: dict[str, float] = {}  # stream -> its rows' interval (s), where seen: see _joins
        self.late_wm: dict[tuple[str, int], int] = {}  # (stream, host id) -> latest late row (ns)
        self._late_grew: set[tuple[str, int]] = set()  # late rows arrived since the last clock tick
        self._late_idle: dict[tuple[str, int], int] = {}  # clock ticks since they last grew
        self._late_since: dict[tuple[str, int], float] = {}  # the tick (s) at which they last grew
        self.late_rows = 0  # rows analysed in their own host's time after landing behind the cursor
        self.late_per_host: dict[str, int] = {}  # host -> its rows behind what it had analysed (dropped)
        self.store = False  # a store to re-read from: rows beyond the bound are listed in ``reread``
        self.reread: list[tuple[str, int, int]] = []  # (host, from ns, to ns) to read back from the store
        self.notes: list = []  # analysis_gap / node_stopped_reporting records (gpufleet.records.Record)
        self._gaps: dict[tuple[str, str], object] = {}  # (host, why) -> its latest open gap record
        self.dropped_rows = 0  # rows beyond the bound with no store to re-read them from
        self.said: list[str] = []  # lines for the operator's log (the online loop prints and clears them)
        self.now_ns: int | None = None  # online: the loop's clock (None: batch, no wall clock)
        self.recv_t = np.zeros(0)  # per GPU: the latest row received (s), whatever its path
        self.heard = np.zeros(0)  # per GPU: the loop's clock tick (s) by which its latest row landed
        self._fresh = np.zeros(0, bool)  # per GPU: a row landed since the last tick
        self.deaf_until = -math.inf  # online: until when (s) the feed may have lost writes (see deaf)
        self._stopped: dict[int, object] = {}  # host id -> its open node_stopped_reporting record
        self.quiet_after = max(60.0, 6 * self.poll)
        self.horizon_ns: int | None = None  # online: rows after this do not move a stream's watermark
        # online: the fleet's data as a whole landing far behind the clock (see _event_clock)
        self.data_top = -(2**62)  # ns: the newest row that moved a watermark (the data's own time)
        self._top_judged = -(2**62)
        self._rows_ticked = (0, 0)  # (rows at the last clock tick, ticks since a row last landed)
        self.backlog = 0.0  # how far behind the clock the newest row landed (s), past quiet_after
        self.backlog_lateness = self.lateness  # how late a row of a backlog may land (data time)

    # ------------------------------------------------------------------ input
    def wanted(self) -> dict[str, set[str] | None]:
        """What to read from a store: measurement -> the fields some detector reads (None: all),
        the list the parser converts."""
        return {m: self.fields.get(m) for m in MEASUREMENTS}

    def not_mine(self, hosts) -> list[str] | None:
        """Of ``hosts``, those another shard analyses (None: unsharded, every host is mine)."""
        if self.shard is None:
            return None
        i, n = self.shard  # the shard of the name the rows are analysed under (gpufleet.hosts)
        return [h for h in hosts if shard_of(safe_host(h), n) != i]

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
                    self._add("bmc_fan", fb)
                    if fan.all():
                        continue
                    ent, r = ent[~fan], r.take(~fan)
                    value = value[~fan]
                cols = {"inlet": value}
                text = {}
            blk = _Block(ent, r.t.astype(np.int64), cols, text)
            self.rows += len(r)
            if m == "gpu":
                self.gpu_samples += len(r)
                self._received(blk)
            self._add(m, blk)
            self.t_first = min(self.t_first, blk.tmin)
        self._judge_backlog()
        self._cut(final=False)

    def _add(self, m: str, blk: _Block) -> None:
        """Buffer a stream's rows: those behind its cursor go to the late buffer (their host's own
        time), the rest move the stream's watermark (online: up to ``horizon_ns``, so that one
        writer's clock set ahead drags no other host's windows)."""
        ws = self.window_start.get(m)
        pending = [h for (mm, h) in self.late_wm if mm == m]
        if ws is not None and (pending or blk.tmin < int(ws * 1e9)):
            # behind the cursor, or of a host whose late rows are still pending (its rows are
            # analysed in its own time order: the engine sees its hits in order)
            behind = blk.t < int(ws * 1e9)
            if pending:
                behind |= self._hosts_mask(pending)[self.host_of(m, blk.ent)]
            if behind.any():
                self._add_late(m, _sub(blk, behind))
            if behind.all():
                return
            blk = _sub(blk, ~behind)
        self.buffer[m].append(blk)
        top = blk.tmax
        if self.horizon_ns is not None and top > self.horizon_ns:
            ok = blk.t <= self.horizon_ns
            top = int(blk.t[ok].max()) if ok.any() else -(2**62)
        self.stream_wm[m] = max(self.stream_wm.get(m, -(2**62)), top)
        self.data_top = max(self.data_top, top)

    def _received(self, blk: _Block) -> None:
        """Per GPU, the latest row received (any path): a node whose GPUs all went quiet."""
        n = len(self.reg.gpu_host)
        if len(self.recv_t) < n:
            more = n - len(self.recv_t)
            self.recv_t = np.concatenate([self.recv_t, np.full(more, -np.inf)])
            self.heard = np.concatenate([self.heard, np.full(more, -np.inf)])
            self._fresh = np.concatenate([self._fresh, np.zeros(more, bool)])
        t = blk.t / 1e9
        # rows in time order within a block as a rule: the last assignment per GPU is its latest row
        self.recv_t[blk.ent] = np.maximum(self.recv_t[blk.ent], t)
        self._fresh[blk.ent] = True

    # ------------------------------------------------------------------ event time per host
    def host_of(self, m: str, ent: np.ndarray) -> np.ndarray:
        """Host id per row of stream ``m`` (entity ids of its kind)."""
        kind = MEASUREMENTS[m]
        if kind == "host":
            return ent
        node = self.reg.node_array()
        if kind == "gpu":
            return node[ent]
        return node[self.reg.link_arrays()[0][ent]]

    def _hosts_mask(self, hosts) -> np.ndarray:
        """Host id -> whether it is one of ``hosts`` (a look-up per row, not a set test)."""
        mask = np.zeros(len(self.reg.hosts), bool)
        mask[list(hosts)] = True
        return mask

    def _add_late(self, m: str, blk: _Block) -> None:
        hosts = self.host_of(m, blk.ent)
        cursor = self.window_start[m]
        bound_ns = int((cursor - self.bound) * 1e9) if math.isfinite(self.bound) else -(2**62)
        keep = np.ones(len(blk.t), bool)
        for h in np.unique(hosts).tolist():
            idx = np.flatnonzero(hosts == h)
            t = blk.t[idx]
            # inside what this host has analysed already (a copy, a reorder); a part of its backlog
            # older than what its late windows analysed (landing after it) is analysed still
            e = blk.ent[idx]
            drop = self._copies(m, h, e, t) | self._late_copies(m, h, e, t)
            if drop.any():
                drop[drop] = self._held_copies(m, e[drop], t[drop])
            if drop.any():
                name = self.reg.hosts[h]
                self.late_points += int(drop.sum())
                self.late_per_host[name] = self.late_per_host.get(name, 0) + int(drop.sum())
                self._gap(h, t[drop], COPIES, "info")
            old = (t < bound_ns) & ~drop
            if old.any():
                self._beyond(h, t[old], "more than the late bound behind the analysis")
                drop |= old
            keep[idx[drop]] = False
            t = t[~drop]
            if len(t):
                self.late_wm[(m, h)] = max(self.late_wm.get((m, h), -(2**62)), int(t.max()))
                self._late_grew.add((m, h))
        if not keep.all():
            blk = _sub(blk, keep)
        if len(blk.t):
            self.late[m].append(blk)

    def _beyond(self, h: int, t: np.ndarray, why: str) -> None:
        """Rows of host ``h`` that cannot be analysed from memory: re-read from the store, or
        dropped and reported (one ``analysis_gap`` record per host and stretch)."""
        if self.store:
            self.reread.append((self.reg.hosts[h], int(t.min()), int(t.max()) + 1))
            return
        self.dropped_rows += len(t)
        self._gap(h, t, why, "warning")

    def _gap(self, h: int, t: np.ndarray, why: str, severity: str) -> None:
        """Host ``h``'s rows at ``t`` (ns) are not analysed: one ``analysis_gap`` record per host,
        reason and stretch (rows within ``quiet_after`` of its end extend it), said once in the
        log. ``info``: never paged (rows inside what the host has analysed: copies as a rule)."""
        from gpufleet.records import Record, to_rfc3339

        name = self.reg.hosts[h]
        t1, t2 = int(t.min()), int(t.max())
        rec = self._gaps.get((name, why))
        if rec is not None and t1 / 1e9 <= rec.end + self.quiet_after:
            rec.end = max(rec.end, t2 / 1e9)
            rec.evidence["rows"] += len(t)
            rec.start = min(rec.start, t1 / 1e9)
        else:
            rec = Record(kind="analysis_gap", host=name, gpu=None, link=None, start=t1 / 1e9, end=t2 / 1e9,
                         severity=severity, rack=self.reg.host_rack[h], cluster=self.reg.host_cluster[h])
            rec.evidence = {"rows": len(t), "why": why}
            self._gaps[(name, why)] = rec
            self.notes.append(rec)
        rec.summary = (f"analysis gap: host {name}, from {to_rfc3339(rec.start)} to {to_rfc3339(rec.end)}, "
                       f"{rec.evidence['rows']} rows, {why}")
        from gpufleet.analyzer.engine import incident_id

        rec.id = incident_id(Record(kind=rec.kind, host=name, gpu=None, link=None, start=rec.start, end=None,
                                    severity=severity, rack=rec.rack, cluster=rec.cluster))
        if rec.evidence["rows"] == len(t):
            self.said.append(rec.summary)  # a new gap: the online loop logs it once

    def _late_cut(self, final: bool) -> None:
        """Analyse late rows in their own host's time: per window of the grid, the late rows of the
        hosts that are ready, with the peers' rows still held and the hosts' own context."""
        # the host-level streams first: their rows are the gpu late windows' context
        for m in ("host", "bmc_sensor", "bmc_fan", *(x for x in STREAMS if MEASUREMENTS[x] != "host")):
            if not self.late[m]:
                continue
            blk = _concat(self.late[m])
            hosts = self.host_of(m, blk.ent)
            w = self.window
            wide = self.config.analyzer["window_seconds"]
            if blk.tmax - blk.tmin >= wide * 1e9:  # a backlog: analysed at batch speed
                w = wide
            cursor = self.window_start.get(m) or 0.0
            uh = np.unique(hosts)
            ready = np.empty(len(uh))
            for i, h in enumerate(uh.tolist()):
                idle = self._late_idle.get((m, h), 0)
                if final or idle >= 2:  # its rows stopped growing two cycles ago: all of them are due
                    ready[i] = np.inf if final else cursor
                elif idle == 1 and (m, h) not in self._late_grew:  # a cycle ago: its complete windows
                    ready[i] = min(cursor, self.late_wm[(m, h)] / 1e9)
                else:
                    ready[i] = min(cursor, self.late_wm[(m, h)] / 1e9 - self.lateness)
                if MEASUREMENTS[m] != "host" and not final:
                    # nor past the host's late BMC rows landed so far (the inlet of its GPUs' time)
                    for k in BMC_STREAMS:
                        if (k, h) in self.late_wm:
                            ready[i] = min(ready[i], self.late_wm[(k, h)] / 1e9)
            r = ready[np.searchsorted(uh, hosts)]
            win = np.floor(blk.t / 1e9 / w)
            due = (win + 1) * w <= r
            if due.any():
                now = _sub(blk, due)
                self.late[m] = [_sub(blk, ~due)] if not due.all() else []
                nwin = win[due]
                for k in np.unique(nwin).tolist():
                    sel = nwin == k
                    self._late_window(m, k * w, (k + 1) * w, _sub(now, sel))
            else:
                self.late[m] = [blk]
            # a host whose late rows left are all at or after the cursor has caught up: they go
            # back to the stream's own windows
            rest = self.late[m][0] if self.late[m] else None
            rest_hosts = self.host_of(m, rest.ent) if rest is not None else np.zeros(0, np.int64)
            cur_ns = int(cursor * 1e9)
            for h in [h for (mm, h) in list(self.late_wm) if mm == m]:
                mine = rest_hosts == h
                if not mine.any():
                    self.late_wm.pop((m, h), None)
                elif int(rest.t[mine].min()) >= cur_ns:
                    self.buffer[m].append(_sub(rest, mine))
                    rest = _sub(rest, ~mine)
                    rest_hosts = rest_hosts[~mine]
                    self.late_wm.pop((m, h), None)
            self.late[m] = [rest] if rest is not None and len(rest.t) else []

    def _held(self, m: str, lo: float, hi: float, hosts: set[int], peers: bool = True
              ) -> tuple[_Block | None, bool]:
        """Analysed rows of stream ``m`` still held with ``lo <= t < hi``, but those the late
        windows of ``hosts`` analysed (their own context, ``late_ctx``, holds those); ``peers``
        False: the rows of ``hosts`` alone (no other host's are taken, let alone widened). With
        whether rows of other hosts are held there."""
        lo_ns, hi_ns = int(lo * 1e9), int(hi * 1e9)
        parts, mask, others = [], None, False
        for b in self.hist[m]:
            if b.tmax < lo_ns or b.tmin >= hi_ns:
                continue
            take = (b.t >= lo_ns) & (b.t < hi_ns)
            if b.late or not peers or not others:
                mask = self._hosts_mask(hosts) if mask is None else mask
                mine = mask[self.host_of(m, b.ent)]
                others = others or bool((take & ~mine).any())
                if b.late:
                    take &= ~mine
                if not peers:
                    take &= mine
            parts.append(_sub(b, take))
        return _widened(_concat(parts)), others

    def _late_table(self, m: str, start: float, end: float, cur: _Block | None, hosts: set[int],
                    read: bool):
        """A late window's table: held rows of ``[start - context, end)``, the late hosts' own
        context and their rows; the late hosts' own earlier held rows are context only. The peers'
        rows only where ``read`` (a detector of the stream reads them); (table, peers held)."""
        held, peers = self._held(m, start - self.context, end, hosts, peers=read)
        ctx = self.late_ctx.get(m)
        if ctx is not None:
            ctx = _sub(ctx, (ctx.t >= int((start - self.context) * 1e9)) & (ctx.t < int(start * 1e9)))
        # new rows: the late rows and the peers' rows of the window; the late hosts' own held rows
        # and their context are context only (analysed already)
        if held is not None and len(held.t):
            own = self._hosts_mask(hosts)[self.host_of(m, held.ent)]
            held = _Block(held.ent, held.t, {**held.cols, NEW: (~own).astype(float)}, held.text)
        if ctx is not None and len(ctx.t):
            ctx = _Block(ctx.ent, ctx.t, {**ctx.cols, NEW: np.zeros(len(ctx.t))}, ctx.text)
        if cur is not None and len(cur.t):
            cur_new = _Block(cur.ent, cur.t, {**cur.cols, NEW: np.ones(len(cur.t))}, cur.text)
        else:
            cur_new = cur
        parts = [p for p in (held, ctx, cur_new) if p is not None and len(p.t)]
        if cur is not None and len(cur.t):
            keep = cur.t >= int((end - self.context) * 1e9)
            old = self.late_ctx.get(m)
            if old is not None:
                old = _sub(old, old.t >= int((end - self.context) * 1e9))
            self.late_ctx[m] = _concat([old, _sub(cur, keep)])
        blk = _concat(parts)
        if blk is None:
            tab = Table.empty()
            tab.new = np.zeros(0, bool)
            return tab, peers
        tab = Table.build(blk.ent, blk.t, blk.cols, blk.text)
        flag = tab.cols.pop(NEW)
        tab.new = (tab.t >= start) & (flag == 1.0)
        return tab, peers

    def _late_window(self, m: str, start: float, end: float, cur: _Block) -> None:
        of = self.host_of(m, cur.ent)
        hosts = set(np.unique(of).tolist())
        for h in hosts:
            # from its first row to just after its last, not the window's end: a row of a sparse
            # stream landing later inside a window cut early (its host idle a while) is analysed;
            # nor across a gap in its rows (a batch of them held back, landing later: its backlog)
            t = np.unique(cur.t[of == h]) / 1e9
            cut = np.flatnonzero(np.diff(t) > self._joins(m))
            for lo, hi in zip([t[0], *t[cut + 1]], [*t[cut], t[-1]], strict=True):
                self._late_span(m, h, float(lo), min(end, float(hi) + 1e-6))
        self._mark(self.late_last, m, cur.ent, cur.t / 1e9)
        self.late_rows += len(cur.t)
        if m in ("bmc_sensor", "bmc_fan", "host"):
            # read through the gpu stream's late windows (cut after these): held as context for them
            self.late_ctx[m] = _concat([self.late_ctx.get(m), cur])
            self._trim_host_ctx(m)
            self._keep_held(m, [cur], late=True)
            return
        reads = {d.peer_rows for d in self.detectors if m in d.tables}  # who reads the peers' rows
        tab, peers = self._late_table(m, start, end, cur, hosts, read=True in reads)
        of_late = self._hosts_mask(hosts)
        empty = Table.empty()
        empty.new = np.zeros(0, bool)
        tables = {k: empty for k in WINDOW_TABLE}
        tables[m] = tab
        self._grow_last_seen()
        last_seen = self.last_seen.copy()
        fan = None
        if m == "gpu":
            if len(tab):
                last = np.flatnonzero(np.append(tab.ent[1:] != tab.ent[:-1], True))
                g = tab.ent[last]
                node = self.reg.node_array()
                mine = of_late[node[g]]
                # the late hosts' GPUs as of this window's end (the main path may be past it)
                theirs = of_late[node]
                last_seen[theirs & (last_seen >= start)] = -np.inf
                last_seen[g[mine]] = np.maximum(last_seen[g[mine]], tab.t[last][mine])
                self.last_seen[g[mine]] = np.maximum(self.last_seen[g[mine]], tab.t[last][mine])
            lo_ns, hi_ns = int((start - self.context) * 1e9), int(end * 1e9)
            for k in BMC_STREAMS:
                held, _peers = self._held(k, start - self.context, end, hosts)
                lc = self.late_ctx.get(k)
                if lc is not None:
                    lc = _sub(lc, (lc.t >= lo_ns) & (lc.t < hi_ns))
                # and the late hosts' BMC rows of the window their own stream has not cut yet, late
                # (its late windows wait on their own readiness) or in time (the BMC stream's cursor
                # behind the GPU stream's: a host's BMC rows written after its GPU rows), and its
                # context there: the inlet of the GPUs' own time (a table keeps one row per time)
                pending = [
                    _sub(b, (b.t >= lo_ns) & (b.t < hi_ns) & of_late[self.host_of(k, b.ent)])
                    for b in (*self.late[k], *self.buffer[k], self.ctx.get(k))
                    if b is not None and b.tmax >= lo_ns and b.tmin < hi_ns
                ]
                blk = _concat([held, lc, *pending])
                t = Table.empty() if blk is None else Table.build(blk.ent, blk.t, blk.cols, blk.text)
                t.new = t.t >= start
                if k == "bmc_sensor":
                    tables[k] = t
                else:
                    fan = t
        node_of, rack_of = self.reg.arrays()
        w = Window(start, end, self.reg, tables["gpu"], tables["gpu_nvlink"], tables["gpu_event"],
                   tables["gpu_canary"], tables["host"], tables["bmc_sensor"], node_of, rack_of, last_seen,
                   late_hosts=frozenset(hosts), grid=self.config.analyzer["window_seconds"])
        if m == "gpu":
            w.fan = fan
            job = tab.text.get("job_id")
            new = w.fresh()  # the late hosts' own rows
            self.jobs.add(tab.ent[new], tab.t[new], job[new] if job is not None else None)
        # a detector that judges a GPU by its own rows (peer_rows False) is given the late hosts'
        # rows alone: the peers' rows, analysed in time already, would cost it a fleet's window
        # and pass through its state (latches, trailing sums) a second time
        alone = w
        if peers and reads == {True, False}:  # (with no reader of them the table has no peers' rows)
            mine = of_late[self.host_of(m, tab.ent)]
            alone = dataclasses.replace(w, **{WINDOW_TABLE[m]: tab.subset(mine)})
        rack_names = list(dict.fromkeys(r for r in self.reg.host_rack if r is not None))
        for det in self.detectors:
            if m not in det.tables:
                continue
            hits = self._hits(det, w if det.peer_rows else alone, fit=getattr(det, "fit_late", False))
            if hits is None:
                continue
            self.engine.add(_only_hosts(hits, hosts), self.reg, rack_names, late=True,
                            no_peers=not peers and getattr(det, "peers", False))
        self._keep_held(m, [cur], late=True)
        if m == "gpu":
            for k in BMC_STREAMS:
                self._trim_host_ctx(k, hosts, end)
        self.windows += 1

    def _trim_host_ctx(self, m: str, hosts: set[int] = frozenset(), end: float = math.inf) -> None:
        """A late host's host-level rows (BMC) are the context of its gpu late windows, which are
        cut after them: a backlog's BMC windows all run before its first gpu window. Each host's
        are kept until the gpu stream's analysis of that host has passed them (its oldest gpu row
        still late, else the gpu stream's cursor; ``hosts``: up to ``end``, their gpu late window
        just analysed), less the context, a window and the grace."""
        old = self.late_ctx.get(m)
        if old is None or not len(old.t):
            return
        cursor = self.window_start.get("gpu")
        upto = np.full(len(self.reg.hosts), -np.inf if cursor is None else cursor)
        for b in self.late["gpu"]:
            np.minimum.at(upto, self.host_of("gpu", b.ent), b.t / 1e9)
        at = list(hosts)
        upto[at] = np.minimum(upto[at], end)
        margin = self.context + self.config.analyzer["window_seconds"] + self.lateness
        keep = old.t / 1e9 >= upto[self.host_of(m, old.ent)] - margin
        if not keep.all():
            self.late_ctx[m] = _sub(old, keep)

    def _analysed(self, m: str, tab: Table) -> None:
        """Per host, the stretches of stream ``m`` analysed in time (``covered``): rows no more than
        a few polls apart are one stretch. A row of the host landing later inside one is a copy (or
        the host's own reordering), not backlog; one in a gap between stretches is backlog."""
        new = tab.in_window()
        if not len(tab) or not new.any():
            return
        ent, t = tab.ent[new], tab.t[new]
        first = np.flatnonzero(np.append(True, ent[1:] != ent[:-1]))
        last = np.append(first[1:] - 1, len(ent) - 1)
        hosts = self.host_of(m, ent[first])
        n = len(self.reg.hosts)
        lo, hi = np.full(n, np.inf), np.full(n, -np.inf)
        np.minimum.at(lo, hosts, t[first])
        np.maximum.at(hi, hosts, t[last])
        self._mark(self.ent_last, m, ent[last], t[last])
        cov = self.covered.get(m)
        if cov is None or len(cov[0]) < n:
            a = np.full(n, np.inf)
            z = np.full(n, -np.inf)
            if cov is not None:
                a[: len(cov[0])], z[: len(cov[1])] = cov
            cov = self.covered[m] = (a, z)
        a, z = cov
        holes = self._holes(m, ent, t)
        has = np.flatnonzero(np.isfinite(lo))
        gap = lo[has] - z[has] > self._joins(m)
        for h in has[gap].tolist():
            if np.isfinite(z[h]):  # a gap in the host's rows: the stretch before it is closed
                self._close(m, h, a[h], z[h])
            a[h] = lo[h]
        for h, t0, t1 in holes:  # a gap inside the window closes one too
            self._close(m, h, a[h], t0)
            a[h] = t1
        z[has] = np.maximum(z[has], hi[has])

    def _close(self, m: str, h: int, a: float, z: float) -> None:
        """Host ``h``'s stretch ``[a, z]`` of stream ``m`` ended in a gap; stretches further behind
        the stream's cursor than the late bound are let go (rows that old are never analysed here)."""
        spans = self.closed.setdefault((m, h), [])
        spans.append((a, z))
        if len(spans) > 64 and math.isfinite(self.bound):
            floor = (self.window_start.get(m) or z) - self.bound
            spans[:] = [x for x in spans if x[1] >= floor]

    def _holes(self, m: str, ent: np.ndarray, t: np.ndarray) -> list[tuple[int, float, float]]:
        """Per host, the gaps between its rows (``ent``, ``t`` s, in entity and time order) with
        none of its rows inside, longer than ``_joins``: ``(host, last row before, first row
        after)``, in host and time order. A batch of a host's rows held back lands there later: its
        backlog, not copies of what was analysed around it."""
        d = np.diff(t)[ent[1:] == ent[:-1]]
        d = d[d > 0]
        if len(d) >= 8:  # the stream's own interval, from an entity's rows in a row
            self.every[m] = float(np.median(d))
        join = self._joins(m)
        if not (d > join).any():  # (no entity's rows with a gap: none)
            return []
        hosts = self.host_of(m, ent)
        order = np.lexsort((t, hosts))
        hs, ts = hosts[order], t[order]
        at = np.flatnonzero((hs[1:] == hs[:-1]) & (np.diff(ts) > join))
        return list(zip(hs[at].tolist(), ts[at].tolist(), ts[at + 1].tolist(), strict=True))

    def _joins(self, m: str) -> float:
        """Rows of stream ``m`` further apart than this leave a gap: ``join``, or two and a half of
        the stream's own intervals where it is polled less often (NVLink's 30 s: two polls missing
        are a gap, a late poll is none)."""
        return max(self.join, 2.5 * self.every.get(m, 0.0))

    def _late_span(self, m: str, h: int, lo: float, hi: float) -> None:
        """Host ``h``'s rows of stream ``m`` in ``[lo, hi]`` were analysed in a late window."""
        spans = self.late_spans.setdefault((m, h), [])
        join = self._joins(m)
        if spans and spans[-1][0] <= lo <= spans[-1][1] + join:  # the next window, as a rule
            spans[-1][1] = max(spans[-1][1], hi)
            return
        spans.append([lo, hi])
        spans.sort()
        merged = [spans[0]]
        for a, z in spans[1:]:
            if a <= merged[-1][1] + join:
                merged[-1][1] = max(merged[-1][1], z)
            else:
                merged.append([a, z])
        self.late_spans[(m, h)] = merged

    def _held_copies(self, m: str, ent: np.ndarray, t: np.ndarray) -> np.ndarray:
        """Of rows (entities, ns) a stretch takes for copies, those that are: where the analysed
        rows of their time are still held, a row is a copy only if one of them has its entity and
        time (a poll split across two bodies at the edge of a held-back batch is not); older ones
        (and a stream not held) keep the stretch's word."""
        out = t <= self.let_go.get(m, -(2**62) if self._holds(m) else 2**62)
        lo, hi = int(t.min()), int(t.max())
        held = [b for b in self.hist[m] if b.tmax >= lo and b.tmin <= hi]
        if out.all() or not held:
            return out

        def key(e: np.ndarray, x: np.ndarray) -> np.ndarray:  # entity and µs since lo in one int
            return (e.astype(np.int64) << 37) | ((x - lo) // 1000)

        at = [(b.t >= lo) & (b.t <= hi) for b in held]
        seen = np.concatenate([key(b.ent[k], b.t[k]) for b, k in zip(held, at, strict=True)])
        return out | np.isin(key(ent, t), seen)

    def _late_copies(self, m: str, h: int, ent: np.ndarray, t: np.ndarray) -> np.ndarray:
        """Which of host ``h``'s late rows (entities, ns) lie inside a stretch its late windows
        analysed, at or before their entity's own latest row analysed there."""
        spans = self.late_spans.get((m, h))
        out = np.zeros(len(t), bool)
        if not spans:
            return out
        lo = np.array([a for a, _z in spans])
        hi = np.array([z for _a, z in spans])
        ts = t / 1e9
        i = np.searchsorted(lo, ts + 1e-6, side="right") - 1
        ok = i >= 0
        out[ok] = ts[ok] <= hi[i[ok]] + 1e-6
        return out & self._reached(self.late_last, m, ent, t)

    @staticmethod
    def _mark(store: dict[str, np.ndarray], m: str, ent: np.ndarray, t: np.ndarray) -> None:
        """Entities ``ent`` of stream ``m`` were analysed up to ``t`` (s): ``ent_last``, ``late_last``."""
        store[m] = raise_latest(store.get(m, np.zeros(0)), ent, t)

    @staticmethod
    def _reached(store: dict[str, np.ndarray], m: str, ent: np.ndarray, t: np.ndarray) -> np.ndarray:
        """Which rows (entities, ns) are at or before their entity's latest row analysed."""
        return t / 1e9 <= latest_at(store.get(m, np.zeros(0)), ent) + 1e-6

    def _copies(self, m: str, h: int, ent: np.ndarray, t: np.ndarray) -> np.ndarray:
        """Which of host ``h``'s late rows (entities, ns) lie inside a stretch already analysed in
        time, at or before their entity's own latest row analysed."""
        cov = self.covered.get(m)
        out = np.zeros(len(t), bool)
        if cov is None or h >= len(cov[0]):
            return out
        eps = 1e-6
        ts = t / 1e9
        stretches = [(cov[0][h], cov[1][h]), *self.closed.get((m, h), [])]
        for a, z in stretches:
            if np.isfinite(a):
                out |= (ts >= a - eps) & (ts <= z + eps)
        return out & self._reached(self.ent_last, m, ent, t)

    def _grow_last_seen(self) -> None:
        n_gpu = len(self.reg.gpu_host)
        if len(self.last_seen) < n_gpu:
            self.last_seen = np.concatenate([self.last_seen, np.full(n_gpu - len(self.last_seen), -np.inf)])

    def _holds(self, m: str) -> bool:
        """Whether stream ``m``'s analysed rows are held (``_keep_held``): not in a batch run, nor
        the ``host`` stream's (no late window reads them)."""
        return self.hold > 0 and m != "host"

    def _keep_held(self, m: str, cur: list[_Block], front: float | None = None, late: bool = False) -> None:
        """Hold a window's analysed rows for the late rows of other hosts (their peers): each
        stream's for ``peers_hold_seconds`` behind its cursor, and older ones (never more than the
        late bound behind) while every stream's held rows fit in ``peers_hold_bytes``, the oldest
        let go first. ``late``: a late window's rows, held as well (a host cut off over the same
        hours as another is its peer there, as in batch). Not the ``host`` stream's: a late window
        reads the peers' gpu, link and BMC rows only. ``front``: the stream's new cursor."""
        if not self._holds(m):
            return
        for b in cur:
            if len(b.t):
                b = _compact(b, late)
                self.hist[m].append(b)
                self.held_bytes += b.nbytes
                self.held_oldest = min(self.held_oldest, b.tmax)
        fronts = {**self.window_start, **({m: front} if front is not None else {})}
        reach = max(self.hold, self.bound)
        floor = {k: int((at - self.hold) * 1e9) for k, at in fronts.items() if at is not None}
        oldest = {k: int((fronts[k] - reach) * 1e9) if math.isfinite(reach) else -(2**62) for k in floor}
        if not floor or (self.held_bytes <= self.hold_bytes and self.held_oldest >= min(oldest.values())):
            return
        # let go down to 7/8 of the budget: a held window's worth over it is not a pass over all
        over = self.held_bytes - self.hold_bytes * 7 // 8
        gone = set()
        lapsed = [(b.tmax, k, b) for k in floor for b in self.hist[k] if b.tmax < floor[k]]
        for tmax, k, b in sorted(lapsed, key=lambda x: x[0]):  # the oldest first
            if over > 0 or tmax < oldest[k]:
                gone.add(id(b))
                over -= b.nbytes
                self.held_bytes -= b.nbytes
                self.let_go[k] = max(self.let_go.get(k, -(2**62)), tmax)
        for k in floor:
            self.hist[k] = [b for b in self.hist[k] if id(b) not in gone]
        self.held_oldest = min((b.tmax for k in self.hist for b in self.hist[k]), default=2**62)

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
            lateness = self._lateness()
            while True:
                start = self.window_start[m]
                end = start + self.window
                if not final and wm - lateness < end:
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
                    last = wm if final else wm - lateness - self.window
                    target = math.floor(min(nxt / 1e9 if nxt is not None else math.inf, last)
                                        / self.window) * self.window
                    if target > start:
                        self.window_start[m] = target
                        continue
                self._process(m, start, end)
                self.window_start[m] = end
        self._late_cut(final)
        self._host_progress()
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
        be in by now are analysed even if no newer point arrived (a quiet stream, a lost GPU), and
        so are a late host's rows once they stop growing."""
        if self.now_ns is not None and now - self.now_ns / 1e9 > self.quiet_after / 2:
            self.deaf(now)  # the loop stalled: writes meanwhile may have been refused or dropped
        self.now_ns = int(now * 1e9)
        self._judge_backlog()
        clock = self._event_clock(now)
        for m in list(self.stream_wm) if clock is not None else ():
            self.stream_wm[m] = max(self.stream_wm[m], int(clock * 1e9))
        self._cut(final=False)
        for k in self.late_wm:  # cycles since a late host's rows last grew
            # ticks a grace apart: the loop may tick many times a poll (it wakes early while
            # bodies wait), and a late host landing a row every few bodies has not stopped
            if k in self._late_grew:
                self._late_idle[k], self._late_since[k] = 0, now
            elif now - self._late_since.get(k, now) >= self.lateness * (self._late_idle.get(k, 0) + 1) - 1e-6:
                self._late_idle[k] = self._late_idle.get(k, 0) + 1
        self._late_idle = {k: v for k, v in self._late_idle.items() if k in self.late_wm}
        self._late_since = {k: v for k, v in self._late_since.items() if k in self.late_wm}
        self._late_grew.clear()
        self._quiet_nodes(now)

    def _judge_backlog(self) -> None:
        """Online: whether the fleet's newest row landed more than ``quiet_after`` behind the clock
        (judged when it lands, by the loop's last tick): no host of the fleet is live, the data is
        a stored backlog arriving (a fleet replayed into the store as fast as possible, every
        agent's spool draining at once). A stream that stops landing keeps the last judgement."""
        if self.now_ns is not None and self.data_top > self._top_judged:
            self._top_judged = self.data_top
            lag = (self.now_ns - self.data_top) / 1e9
            self.backlog = lag if lag > self.quiet_after else 0.0

    def _lateness(self) -> float:
        """How late (data time) a row may land before its window is cut: a backlog's rows up to
        ``backlog_lateness``, but no more than the backlog is behind the clock (a fleet whose
        clocks all run minutes behind, or an analyzer that fell minutes behind live data, waits
        minutes, not the batch lateness)."""
        if not self.backlog:
            return self.lateness
        return max(self.lateness, min(self.backlog_lateness, self.backlog))

    def _event_clock(self, now: float) -> float | None:
        """How far the clock moves every stream's watermark (what should be in by now; None: not
        at all). Live data: to ``now`` (a feed that stops leaves the windows cut on time, and what
        lands later is late, analysed in its host's own time). A backlog (:meth:`_judge_backlog`):
        not at all while its rows land: windows are cut on the data's own pace, as a file is, so
        that no host is "behind the analysis" only because the wall clock is ahead of the whole
        fleet, and rows may land up to :meth:`_lateness` (data time) out of order (one body of
        a store's subscription holds minutes of each measurement in turn). Once no row has landed
        for two ticks, the backlog is in: every window holding its rows is cut."""
        rows, quiet = self._rows_ticked
        self._rows_ticked = (self.rows, 0 if self.rows > rows else quiet + 1)
        if not self.backlog:
            return now
        if self._rows_ticked[1] < 2:
            return None
        return min(now, self.data_top / 1e9 + self._lateness() + self.window)

    def _host_progress(self) -> None:
        """Online: per host, the latest of its GPU rows analysed; its incidents resolve by its own
        time (a node cut off keeps them open until its rows say otherwise), within the bound."""
        if self.now_ns is None or not len(self.last_seen):
            return
        n_hosts = len(self.reg.hosts)
        hp = np.full(n_hosts, -np.inf)
        node = np.asarray(self.reg.gpu_node, np.int64)[: len(self.last_seen)]
        np.maximum.at(hp, node, self.last_seen[: len(node)])
        self.engine.host_progress = hp
        self.engine.host_bound = self.bound

    def deaf(self, now: float) -> None:
        """Online: writes up to ``now`` may not have reached the feed though their nodes sent them
        (the loop stalled, the listener refused some, a subscription dropped them): no node is
        judged silent over that time; each gets ``quiet_after`` from here to be heard again."""
        self.deaf_until = max(self.deaf_until, now)

    def _quiet_nodes(self, now: float) -> None:
        """Online: a node is one ``node_stopped_reporting`` record (the node, its agent or its
        network: not a GPU fault) when, while others report, none of its GPUs' rows landed for
        ``quiet_after`` of the loop's clock during which the feed could hear it (:meth:`deaf`),
        and its newest row is ``quiet_after`` behind the fleet's newest (capped by the clock; a
        backlog replayed at once is judged by its own time). A node draining a backlog is heard,
        however old its rows. Resolved when rows newer than its silence land."""
        from gpufleet.records import Record, to_rfc3339

        n = len(self.recv_t)
        if not n:
            return
        self.heard[self._fresh] = now
        self._fresh[:] = False
        node = np.asarray(self.reg.gpu_node[:n], np.int64)
        latest = np.full(len(self.reg.hosts), -np.inf)
        np.maximum.at(latest, node, self.recv_t)
        heard = np.full(len(self.reg.hosts), -np.inf)
        np.maximum.at(heard, node, self.heard)
        front = min(now, float(latest.max()))
        since = now - self.quiet_after
        live = (np.maximum(heard, self.deaf_until) >= since) | (latest >= front - self.quiet_after)
        for h, rec in list(self._stopped.items()):
            if latest[h] > rec.start:
                self.engine.host_gaps[h][-1][1] = float(latest[h])  # (its silence, in data time)
                rec.end = now
                rec.evidence["quiet_seconds"] = round(now - rec.start, 1)
                rec.summary = (f"{rec.host}: node stopped reporting from {to_rfc3339(rec.start)}; reporting "
                               f"again, its rows since then analysed as they arrive")
                del self._stopped[h]
        if not (heard >= since).any():
            return  # the whole fleet quiet: the feed or the analyzer's input, not a node
        quiet = np.flatnonzero(np.isfinite(latest) & ~live)
        for h in quiet.tolist():
            if h in self._stopped or latest[h] < now - self.bound:
                continue
            from gpufleet.analyzer.engine import incident_id

            name = self.reg.hosts[h]
            rec = Record(kind="node_stopped_reporting", host=name, gpu=None, link=None,
                         start=float(latest[h]), end=None, severity="warning", rack=self.reg.host_rack[h],
                         cluster=self.reg.host_cluster[h])
            rec.summary = (f"{name}: node stopped reporting (no row from any of its GPUs since "
                           f"{to_rfc3339(rec.start)}: the node, its agent or its network, not a GPU fault)")
            rec.evidence = {"signals": ["absence"], "quiet_after_seconds": self.quiet_after}
            rec.id = incident_id(rec)
            self._stopped[h] = rec
            self.notes.append(rec)
            gaps = self.engine.host_gaps.setdefault(h, [])
            gaps[:] = [*gaps[-7:], [float(latest[h]), math.inf]]

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
                if late.any():  # behind the cursor: analysed in its host's own time
                    self._add_late(m, _sub(b, late))
                take = inw & ~late
            else:
                take = inw & (b.t >= lo_ns)
            if take.any():
                cur.append(_sub(b, take))
            if consume and (~inw).any():
                rest.append(_sub(b, ~inw))
        if consume:
            self.buffer[m] = rest
            self._keep_held(m, cur, end)
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
            if m in ANCHORED:  # a silent entity's last row: its counters' step over the gap is judged
                keep = _anchored(blk, keep, int((end - self.bound) * 1e9), functools.partial(self.host_of, m))
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
        self._analysed(m, tab)
        empty = Table.empty()
        empty.new = np.zeros(0, bool)
        tables = {k: empty for k in WINDOW_TABLE}
        tables[m] = tab
        self._grow_last_seen()
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
            grid=self.config.analyzer["window_seconds"],
        )
        if m == "gpu":
            w.fan = fan
        rack_names = list(dict.fromkeys(r for r in self.reg.host_rack if r is not None))
        for det in self.detectors:
            if m not in det.tables:
                continue
            hits = self._hits(det, w, fit=True)
            if hits is not None:
                self.engine.add(hits, self.reg, rack_names)
        self.windows += 1

    def _hits(self, det, w: Window, fit: bool) -> Hits | None:
        """``det``'s hits on window ``w`` (fitted to it first where ``fit``). A detector that raises
        on a window leaves that window unanalysed for its kind, and says so: one ``analysis_gap``
        record of the fleet (its kind, the windows, the error; later failures within
        ``quiet_after`` extend it) and one log line; every other detector and window goes on.
        With ``GPUFLEET_STRICT`` set (the tests) it raises."""
        try:
            if fit:
                det.fit(w)
            return det.detect(w)
        except Exception as exc:
            if os.environ.get("GPUFLEET_STRICT"):
                raise
            self._unanalysed(det.kind, w, f"{type(exc).__name__}: {str(exc)[:200]}")
            return None

    def _unanalysed(self, kind: str, w: Window, error: str) -> None:
        from gpufleet.analyzer.engine import incident_id

        from gpufleet.records import Record, to_rfc3339

        rec = self._gaps.get(("", kind))
        if rec is not None and w.start <= rec.end + self.quiet_after:
            rec.start, rec.end = min(rec.start, w.start), max(rec.end, w.end)
            rec.evidence["windows"] += 1
        else:
            rec = Record(kind="analysis_gap", host=None, gpu=None, link=None, start=w.start, end=w.end,
                         severity="warning")
            rec.evidence = {"detector": kind, "windows": 1, "error": error,
                            "why": f"the {kind} detector failed on these windows"}
            rec.id = incident_id(rec)
            self._gaps[("", kind)] = rec
            self.notes.append(rec)
            self.said.append(f"analysis gap: the {kind} detector failed on the window from "
                             f"{to_rfc3339(w.start)}: {error}; its later windows go on")
        rec.summary = (f"analysis gap: {kind} not analysed from {to_rfc3339(rec.start)} to "
                       f"{to_rfc3339(rec.end)} ({rec.evidence['windows']} windows): its detector failed "
                       f"({rec.evidence['error']})")

    def incidents(self):
        """The engine's incidents, each with the job ids on its GPUs during it (``jobs``), and the
        analysis's own records (``analysis_gap``, ``node_stopped_reporting``)."""
        recs = self.engine.incidents()
        self.jobs.annotate(recs + self.engine.absorbed, self.reg.gpu_host, self.reg.gpu_index)
        return recs + self.notes if self.notes else recs


def _only_hosts(hits: Hits, hosts: set[int]) -> Hits:
    """The hits on ``hosts`` (a late window's own hosts: the peers' were found in their own time)."""
    if not len(hits):
        return hits
    keep = np.isin(np.asarray(hits.host, np.int64), list(hosts))
    if keep.all():
        return hits
    idx = np.flatnonzero(keep)

    def part(a):
        return None if a is None else np.asarray(a)[idx]

    ev = [hits.evidence[i] for i in idx.tolist()] if len(hits.evidence) else []
    return Hits(hits.kind, part(hits.host), part(hits.gpu), part(hits.link), part(hits.t), part(hits.score),
                part(hits.critical), ev, part(hits.rack), part(hits.began), part(hits.sustain))


def _anchored(b: _Block, keep: np.ndarray, floor_ns: int, host_of) -> np.ndarray:
    """``keep`` plus, of each entity with no kept row whose host has one (a GPU or link silent
    while its node reports: a gap in its data), its latest row at or after ``floor_ns``. A node
    silent as a whole is left to event time: its rows may still come, late (see Online)."""
    if not len(b.ent):
        return keep
    seen = np.zeros(int(b.ent.max()) + 1, bool)
    seen[b.ent[keep]] = True
    cand = np.flatnonzero(~seen[b.ent] & (b.t >= floor_ns))
    if not len(cand):
        return keep
    live = np.unique(host_of(np.flatnonzero(seen)))
    cand = cand[np.isin(host_of(b.ent[cand]), live)]
    if not len(cand):
        return keep
    order = cand[np.lexsort((b.t[cand], b.ent[cand]))]
    last = np.append(b.ent[order][1:] != b.ent[order][:-1], True)
    out = keep.copy()
    out[order[last]] = True
    return out


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


def _compact(b: _Block, late: bool) -> _Block:
    """A block to hold (``Analyzer._keep_held``) in less memory, its values unchanged: a column of
    one value is that value broadcast (no memory), a column whose every value float32 holds exactly
    is float32, entity ids are int32; a copy, so no larger array it was cut from stays alive.
    :func:`_widened` gives the rows back as the rest of the pipeline has them."""

    def small(v: np.ndarray) -> np.ndarray:
        if not len(v) or v.dtype != np.float64:
            return v.copy()
        bits = v.view(np.uint64)
        if (bits == bits[0]).all():  # bit for bit: NaN is NaN, -0.0 stays -0.0
            return np.broadcast_to(v[0], v.shape)
        with np.errstate(over="ignore"):  # beyond float32's range: inf, unequal, kept float64
            f = v.astype(np.float32)
        # exact, bit for bit, in one pass (NaN and -0.0 included)
        return f if (f.astype(np.float64).view(np.uint64) == bits).all() else v.copy()

    return _Block(b.ent.astype(np.int32), b.t.copy(), {k: small(v) for k, v in b.cols.items()},
                  {k: v.copy() for k, v in b.text.items()}, late=late)


def _widened(b: _Block | None) -> _Block | None:
    """Held rows (:func:`_compact`) as the pipeline has its rows: float64 values in arrays of
    their own, int64 entities."""
    if b is None:
        return None
    cols = {k: v.astype(np.float64) if v.dtype == np.float32 or not v.strides[0] else v
            for k, v in b.cols.items()}
    return _Block(b.ent.astype(np.int64), b.t, cols, b.text, late=b.late)


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
