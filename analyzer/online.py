"""Online analysis: one loop for ``--follow`` (pull from InfluxDB) and ``--listen`` (pushed writes).

Every ``poll`` seconds the loop takes in what arrived (a pull of ``[cursor, now - grace)``, or
the rows the listener queued), tells the analyzer that wall-clock time ``now`` has come, and
delivers: incidents written back to InfluxDB (measurement ``incident``), to ``--out``, and to
the notifier (whose SQLite outbox pages each incident group once, across restarts).

Windows are ``poll`` long and a point may arrive up to ``grace`` after its timestamp; a window
is analysed once ``now - grace`` has passed its end, so a fault is paged about two polls after
its data lands. A host whose rows land later than that (cut off, then its spool drains) is
analysed in its own time as they land (event time per host: gpufleet.analyzer.pipeline), up to
``lateness`` behind; an incident found that way keeps its true start and says how long after it
began it was found. Rows further behind are read back from InfluxDB when there is one, else
dropped and reported as an ``analysis_gap`` record. ``now`` is the wall clock paced by the
monotonic clock (:class:`Clock`): a step of the analyzer's clock freezes no window, and rows a
writer stamps ahead of it move no other host's windows.

Restart: a checkpoint file beside the notifier state records how far the analysis has been
delivered. On start the gap since then is caught up through the pull path at batch speed
(batch-size windows, large requests), starting early enough to rebuild the detectors' context
and every incident the notifier still has firing; incidents found again keep their id and are
not paged again, incidents that happened while the analyzer was down are paged now.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any

import click
from gpufleet.analyzer.engine import summary_line
from gpufleet.analyzer.pipeline import Analyzer

from gpufleet.errors import GpufleetError
from gpufleet.logs import escape

MAX_REWIND = 86400.0  # the longest stretch a restart re-reads to find still-firing incidents again
PEERS_HOLD = 600.0  # online default: analysed rows held as peers and context for a host that comes back
PEERS_HOLD_BYTES = 256 << 20  # ... and older ones, up to the late bound, while they fit in this much
# --follow: how far behind its cursor a poll looks for rows written late (as far as late rows find
# their peers held, PEERS_HOLD), in buckets of how long, at most how often (s)
LATE_LOOKBACK = PEERS_HOLD
LATE_BUCKET = 60
LATE_CHECK_EVERY = 60.0
# a read-back (a host's gap, rows beyond the late bound) goes in reads of at most READ_BACK_STEP
# of its data, after each cycle's on-time output, for at most READ_BACK_SHARE of a poll per cycle:
# late data never delays on-time pages by more than that
READ_BACK_STEP = 600
READ_BACK_SHARE = 0.5


def _say(msg: str) -> None:
    """One line on stderr; host names and other telemetry values in it are escaped."""
    click.echo(f"gpufleet analyze: {escape(msg)}", err=True)


class Checkpoint:
    """``{"done_ns": T}``: everything before T has been analysed and handed to the outputs."""

    def __init__(self, path: str | Path | None):
        self.path = Path(path) if path else None

    def load(self) -> int | None:
        if self.path is None or not self.path.is_file():
            return None
        try:
            return int(json.loads(self.path.read_text())["done_ns"])
        except (OSError, ValueError, KeyError, TypeError):
            _say(f"{self.path}: unreadable checkpoint, ignored")
            return None

    def save(self, done_ns: int) -> None:
        if self.path is None:
            return
        tmp = self.path.with_name(self.path.name + ".tmp")
        try:
            tmp.write_text(json.dumps({"done_ns": int(done_ns)}))
            os.replace(tmp, self.path)
        except OSError as exc:
            raise GpufleetError(f"checkpoint {self.path}: {exc.strerror}") from None


class Clock:
    """The loop's "now": the wall clock, paced by the monotonic clock. A wall clock that steps away
    from the monotonic pace (an operator, a VM resumed, a bad NTP answer) is not followed until it
    has stayed there ``settle`` seconds: a short step neither freezes the windows (ahead) nor stalls
    them (back); a lasting correction is taken (counted in ``steps``)."""

    def __init__(self, wall=time.time, mono=time.monotonic, settle: float = 60.0, tolerance: float = 1.0):
        self.wall, self.mono, self.settle, self.tolerance = wall, mono, settle, tolerance
        self._anchor = (wall(), mono())
        self._off_since: float | None = None
        self.steps = 0

    def __call__(self) -> float:
        w, m = self.wall(), self.mono()
        est = self._anchor[0] + (m - self._anchor[1])
        if abs(w - est) <= self.tolerance:
            self._off_since = None
            self._anchor = (w, m)  # follows the wall clock's slow corrections
            return w
        if self._off_since is None:
            self._off_since = m
            _say(f"the wall clock stepped {w - est:+.1f}s; the analysis keeps the monotonic pace")
        if m - self._off_since >= self.settle:  # a lasting step: the wall clock was set right
            self._anchor, self._off_since = (w, m), None
            self.steps += 1
            return w
        return est


class Online:
    """The analyzer, its outputs and its position in time; driven by :meth:`cycle`."""

    def __init__(self, cfg, shard, influx, notifier, out_path, checkpoint: Checkpoint, poll: float,
                 grace: float, lateness: float | None = None, clock: Clock | None = None):
        self.cfg = cfg
        self.influx = influx
        self.notifier = notifier
        self.out_path = out_path
        self.checkpoint = checkpoint
        self.poll = poll
        self.grace = grace
        self.batch_window = cfg.analyzer["window_seconds"]
        self.online_window = min(self.batch_window, max(poll, 1.0))
        backlog_lateness = cfg.analyzer["lateness_seconds"]  # a backlog is cut as a file is
        cfg.analyzer["lateness_seconds"] = grace
        if lateness is not None:
            cfg.analyzer["late_bound_seconds"] = lateness
        cfg.analyzer["peers_hold_seconds"] = cfg.analyzer.get("peers_hold_seconds") or PEERS_HOLD
        cfg.analyzer["peers_hold_bytes"] = cfg.analyzer.get("peers_hold_bytes") or PEERS_HOLD_BYTES
        self.clock = clock or Clock()
        self.an = Analyzer(cfg, shard)
        self.an.window = self.online_window  # batch-size windows only while catching up
        self.an.backlog_lateness = backlog_lateness
        self.an.now_ns = int(self.clock() * 1e9)  # the loop's clock, from before the first rows land
        self.an.store = influx is not None  # rows beyond the bound are read back, not dropped
        self.an.horizon_ns = self._horizon()
        self.written: dict[str, str] = {}
        self.first_out: dict[str, float] = {}  # incident id -> when it was first delivered
        self.cursor: int | None = None  # pull mode: everything before it has been read
        self.rows_in = 0
        self.write_failing = False
        self._others: tuple[float, list[str] | None] = (-1e18, None)
        # --follow: the rows read in the last LATE_LOOKBACK, per measurement [(latest ns, sid, t)],
        # from where reading began; per (measurement, host, bucket) the count InfluxDB gave last
        self._held: dict[str, list[tuple[int, Any, Any]]] = {}  # (latest ns, sid, t arrays)
        self._read_from: int | None = None
        self._counted: dict[tuple[str, str, int], int] = {}
        self._checked = -1e18
        self.late_writes = 0  # rows found written behind the cursor (and read back)
        # per range being read back, keyed (host, to ns): (from ns, rows so far, a late write)
        self._reading: dict[tuple[str, int], tuple[int, int, bool]] = {}

    # ------------------------------------------------------------------ where to start
    def start_ns(self, since: float | None, now_ns: int) -> int:
        """Where reading starts: from the checkpoint (rewound to rebuild context and the incidents
        still firing), else ``since`` ago, else one window ago."""
        done = self.checkpoint.load()
        if done is None:
            back = since if since is not None else self.online_window
            return now_ns - int(back * 1e9)
        back = self.cfg.analyzer["context_seconds"] + self.batch_window
        start = done - int(back * 1e9)
        firing = self.notifier.firing_since() if self.notifier is not None else None
        if firing is not None:
            start = min(start, int((firing - back) * 1e9))
        return max(start, done - int(MAX_REWIND * 1e9))

    # ------------------------------------------------------------------ input
    def read(self, upto_ns: int, since: float | None = None) -> int:
        """Pull [cursor, upto) from InfluxDB (the first time: from :meth:`start_ns`); a gap longer
        than a batch window is read at batch speed (large requests, batch-size windows) and
        delivered as it goes. Returns the rows read."""
        from gpufleet.analyzer.sources import ahead, pull

        if self.cursor is None:
            self.cursor = self.start_ns(since, int(self.clock() * 1e9))
        if self._read_from is None:
            self._read_from = self.cursor
        if upto_ns <= self.cursor:
            return 0
        t0 = time.monotonic()
        start = self.cursor
        catching = upto_ns - start > self.batch_window * 1e9
        window = self.batch_window if catching else self.online_window
        self.an.window = window
        n = 0
        before = self._host_latest()
        try:
            batches = pull(self.influx, self.an.wanted(), start, upto_ns, self.an.parser.series,
                           int(window * 1e9), words=self.an.tag_words(), not_hosts=self._not_mine())
            for _a, b, rows in ahead(batches) if catching else batches:
                n += sum(len(r) for r in rows.values())
                self._hold(rows, b)
                self.an.horizon_ns = self._horizon()
                self.an.feed_rows(rows)
                self.cursor = b
                if catching:
                    self.deliver(b)
            self.cursor = upto_ns
            if not catching:
                self._back_again(before, start)
                self._late_writes()
        finally:
            self.an.window = self.online_window
            self.rows_in += n
        if catching:
            took = time.monotonic() - t0
            _say(f"caught up {(upto_ns - start) / 1e9:.0f}s of data ({n} rows) in {took:.1f}s")
        return n

    def _host_latest(self):
        """Per host id: the latest GPU row received (s), -inf where none."""
        import numpy as np

        an = self.an
        n = len(an.recv_t)
        latest = np.full(len(an.reg.hosts), -np.inf)
        np.maximum.at(latest, np.asarray(an.reg.gpu_node[:n], np.int64), an.recv_t)
        return latest

    def _back_again(self, before, start_ns: int) -> None:
        """``--follow``: a host that was quiet before this read and has rows in it may have written
        its gap late (its spool drained into InfluxDB with the old stamps, behind the cursor): that
        host's gap is queued to be read back (:meth:`read_back`) and analysed in its own time. Only
        the gap, after its last row read: no row is analysed twice."""
        after = self._host_latest()
        for h in range(min(len(before), len(after))):
            last = before[h]
            if after[h] > last and last < start_ns / 1e9 - self.an.quiet_after and last > -1e18:
                self.an.reread.append((self.an.reg.hosts[h], int(last * 1e9) + 1000, int(start_ns)))

    def _hold(self, rows: dict, upto_ns: int) -> None:
        """Keep the (series, time) of the rows read in the last ``LATE_LOOKBACK``: what a count
        is compared with, and what a read-back leaves out (read already)."""
        import numpy as np

        lo = upto_ns - int(LATE_LOOKBACK * 1e9)
        for m, r in rows.items():
            if len(r):
                self._held.setdefault(m, []).append((int(r.t.max()), np.asarray(r.sid, np.int64),
                                                     np.asarray(r.t, np.int64)))
        for m, chunks in self._held.items():
            if chunks and chunks[0][0] < lo:
                self._held[m] = [c for c in chunks if c[0] >= lo]

    def _unread(self, rows: dict, a: int, b: int) -> dict:
        """``rows`` (read back from [a, b)) less those read already."""
        import numpy as np

        out = {}
        for m, r in rows.items():
            seen: set[tuple[int, int]] = set()
            for _top, sid, t in self._held.get(m, ()):
                pick = (t >= a) & (t < b) & np.isin(sid, r.sid)
                seen.update(zip(sid[pick].tolist(), t[pick].tolist(), strict=True))
            if seen:
                keep = np.array([k not in seen for k in zip(r.sid.tolist(), r.t.tolist(), strict=True)], bool)
                r = r.take(keep)
            if len(r):
                out[m] = r
        return out

    def _late_writes(self) -> None:
        """``--follow``: rows written to InfluxDB behind the cursor (a stream of a host delayed, a
        part of a batch retried), up to ``LATE_LOOKBACK`` back. Every ``LATE_CHECK_EVERY`` one
        count query per measurement, by host and ``LATE_BUCKET``, is compared with the rows read;
        where InfluxDB holds more, that host's bucket is queued to be read back (the late path of a
        reappearing host's gap) and only the rows not read already are analysed."""
        import numpy as np

        now = self.clock()
        if now - self._checked < LATE_CHECK_EVERY or self.influx is None:
            return
        hi, began = self.cursor, self._read_from
        if hi is None or began is None:
            return
        lo = max(hi - int(LATE_LOOKBACK * 1e9), began)
        if hi <= lo:
            return
        step = int(LATE_BUCKET * 1e9)
        # InfluxDB unreachable: raised as the pull's own error (the loop retries with backoff);
        # the check runs again on the next read, over the same lookback
        an = self.an
        there = self.influx.counts(an.wanted(), lo, hi, LATE_BUCKET, an.tag_words(), self._not_mine())
        self._checked = now
        series = self.an.parser.series
        read: dict[tuple[str, str, int], int] = {}
        for m, chunks in self._held.items():
            for _top, sid, t in chunks:
                pick = (t >= lo) & (t < hi)
                if not pick.any():
                    continue
                both = np.stack([sid[pick], t[pick] // step * step])
                pairs, k = np.unique(both, axis=1, return_counts=True)
                for s_, b_, n_ in zip(pairs[0].tolist(), pairs[1].tolist(), k.tolist(), strict=True):
                    key = (m, series.written(s_).get("host", ""), b_)
                    read[key] = read.get(key, 0) + n_
        grew: dict[str, list[tuple[int, int]]] = {}
        for key, c in there.items():
            if c > max(read.get(key, 0), self._counted.get(key, 0)):
                _m, host, b = key
                grew.setdefault(host, []).append((max(b, lo), min(b + step, hi)))
            self._counted[key] = c
        self._counted = {k: v for k, v in self._counted.items() if k[2] + step > lo}
        for host, spans in grew.items():
            spans.sort()
            merged = [list(spans[0])]
            for a, z in spans[1:]:
                if a <= merged[-1][1]:
                    merged[-1][1] = max(merged[-1][1], z)
                else:
                    merged.append([a, z])
            for a, z in merged:
                self.an.reread.append((host, a, z))
                self._reading[(host, z)] = (a, 0, True)

    def read_back(self, budget: float | None = None) -> int:
        """Read the queued ranges (host, from, to) back from InfluxDB, analysed in their host's own
        time (rows beyond the late bound, a reappearing host's gap, rows written late), in reads of
        at most ``READ_BACK_STEP`` of data. With a ``budget`` (s), no further read starts once it is
        spent (one read at least): the rest stays queued for the next cycle. Returns the rows
        analysed."""
        an = self.an
        n = 0
        step = int(READ_BACK_STEP * 1e9)
        until = None if budget is None else time.monotonic() + budget
        while an.reread and self.influx is not None:
            host, a, b = an.reread[0]
            first, got, late = self._reading.get((host, b), (a, 0, False))
            z = min(b, a + step)
            bound, an.bound = an.bound, float("inf")  # read back: analysed however far behind
            try:
                rows = self.influx.query(an.wanted(), a, z, an.parser.series, an.tag_words(), host=host)
                rows = self._unread(rows, a, z)  # no row analysed twice
                k = sum(len(r) for r in rows.values())
                if k:
                    n += k
                    got += k
                    self.late_writes += k if late else 0
                    self._hold(rows, self.cursor or z)
                    an.feed_rows(rows)
            finally:
                an.bound = bound
            if z < b:
                an.reread[0] = (host, z, b)
                self._reading[(host, b)] = (first, got, late)
            else:
                an.reread.pop(0)
                self._reading.pop((host, b), None)
                _say(f"{host}: read back {got} rows of {(b - first) / 1e9:.0f}s behind the analysis "
                     "from InfluxDB")
            if until is not None and time.monotonic() >= until:
                break
        self.rows_in += n
        return n

    def _horizon(self, rows: dict | None = None) -> int | None:
        """Rows stamped after this move no stream's watermark (a writer whose clock runs ahead
        delays nobody else's windows), unless most of the fleet is stamped ahead (a replay, a
        generated fleet: analysed in batch-size windows, see :meth:`_size_windows`): judged by the
        latest row of each GPU, three quarters of them ahead."""
        import numpy as np

        now = self.clock()
        h = now + self.grace + self.online_window
        recv = self.an.recv_t
        seen = recv[np.isfinite(recv)] if len(recv) else recv
        if not len(seen) and rows and len(rows.get("gpu", ())):
            seen = rows["gpu"].t / 1e9  # the first rows: judged by themselves
        if len(seen) and 4 * np.count_nonzero(seen > h) > 3 * len(seen):  # three quarters of the fleet ahead
            return None
        return int(h * 1e9)

    def _not_mine(self) -> list[str] | None:
        """Other shards' hosts, asked InfluxDB again every minute (a host that appears meanwhile
        is read and left to the analyzer's own shard filter, never missed)."""
        from gpufleet.analyzer.sources import TYPES_TTL

        if self.an.shard is None:
            return None
        t, hosts = self._others
        if time.monotonic() - t > TYPES_TTL:
            hosts = self.an.not_mine(self.influx.tag_values("host"))
            self._others = (time.monotonic(), hosts)
        return hosts

    def feed(self, rows: dict, not_before_ns: int | None = None) -> None:
        """Pushed rows. ``not_before_ns``: where a catch-up read to; of the rows stamped before it,
        those it read are dropped (analysed already), and those it did not (written to the store
        after it read their time: an agent's batch in flight, a write retried) are analysed, late
        where the analysis has passed their time."""
        if not_before_ns is not None:
            before = {m: r.take(r.t < not_before_ns) for m, r in rows.items()
                      if len(r) and int(r.t.min()) < not_before_ns}
            since = min((int(r.t.min()) for r in before.values()), default=not_before_ns)
            unread = self._unread(before, since, not_before_ns)
            rows = {m: (r if int(r.t.min()) >= not_before_ns else r.take(r.t >= not_before_ns))
                    for m, r in rows.items() if len(r)}
            if unread:
                self.feed(unread)
        n = sum(len(r) for r in rows.values())
        if n:
            self.rows_in += n
            self.an.horizon_ns = h = self._horizon(rows)
            # sized by the data these rows take the watermark to (the first rows of a fleet stamped
            # ahead of the clock are cut in batch-size windows too); a writer's stamps past the
            # horizon move no watermark, so they size no window either
            top = max(int(r.t.max()) for r in rows.values() if len(r))
            self._size_windows(max(int(self.clock() * 1e9), top if h is None else min(top, h)))
            self.an.feed_rows(rows)

    # ------------------------------------------------------------------ output
    def deliver(self, upto_ns: int) -> None:
        """Analyse what ``upto`` completes and hand new and changed incidents to every output."""
        from gpufleet.analyzer.store import incident_lines

        from gpufleet import records

        an = self.an
        an.horizon_ns = self._horizon()
        self._size_windows(upto_ns)
        an.advance_clock(upto_ns / 1e9)
        an.engine.advance(upto_ns / 1e9 - self.grace)
        for line in an.said:
            _say(line)
        an.said.clear()
        incs = an.incidents() + an.engine.absorbed
        changed = [r for r in incs if self.written.get(r.id) != _state(r)]
        now = self.clock()
        for r in changed:
            if r.id not in self.written:
                _found_late(r, now, self.poll + self.grace)
                self.first_out.setdefault(r.id, now)
        # delivered before its backlog landed, which then moved its start back: found when delivered
        late = [r for r in incs if r.id in self.written and r.evidence.get("arrived_late")
                and "found_after_seconds" not in r.evidence] if an.late_rows else []
        for r in late:
            _found_late(r, self.first_out.get(r.id, now), self.poll + self.grace)
        changed += [r for r in late if "found_after_seconds" in r.evidence]
        if self.notifier is not None:
            self.notifier.update(incs, now)
        if self.out_path and changed:
            records.write(self.out_path, an.incidents())
        if self.influx is not None and changed:
            try:  # the write-back failing stops no other output: it is tried again next cycle
                self.influx.write(incident_lines(changed))
            except GpufleetError as exc:
                if not self.write_failing:
                    _say(f"incident write-back: {exc}; retrying every poll")
                self.write_failing = True
                changed = []
            else:
                if self.write_failing:
                    _say("incident write-back: delivering again")
                self.write_failing = False
        for r in changed:
            self.written[r.id] = _state(r)
        # then what is queued to be read back, for a share of the poll (its incidents go out on
        # the next cycle); the checkpoint stays before what is still queued, so a restart reads it
        if an.reread and self.influx is not None:
            try:
                self.read_back(budget=READ_BACK_SHARE * self.poll)
            except GpufleetError as exc:
                _say(f"read-back: {exc}; tried again next cycle")
        done = upto_ns - int(self.grace * 1e9)
        self.checkpoint.save(min([done, *(a for _h, a, _b in an.reread)]))

    def _size_windows(self, upto_ns: int) -> None:
        """Windows of a poll while the data arrives live; batch-size windows otherwise:

        - a whole batch window waits to be cut (a backlog: a catch-up, a burst of pushed writes,
          agents' spools replaying): that data is late already;
        - the data runs ahead of the wall clock by more than the grace and a poll (a replay or a
          generated fleet stamped from now on, a clock set ahead): no poll-sized window of it
          is due sooner than its data's own time passes, and none can be paged sooner (a clock
          that far ahead makes the other writers' points late anyway: it is no live stream).

        Either way a window's fixed cost is paid once per batch window instead of once per poll."""
        an = self.an
        wm = max([upto_ns, *an.stream_wm.values()]) / 1e9
        starts = [v for v in an.window_start.values() if v is not None]
        backlog = bool(starts) and wm - self.grace - min(starts) >= self.batch_window
        ahead = wm - self.clock() > self.grace + self.online_window
        an.window = self.batch_window if backlog or ahead else self.online_window

    def wait(self, wake=None) -> None:
        """Sleep until the next window is due (its end + grace, a little after): cycles run in
        step with the windows, so a point waits at most a window and the grace. ``wake`` (a
        :class:`threading.Event`) ends the sleep early: pushed data waiting in bulk."""
        w = self.online_window
        now = self.clock()
        due = (int((now - self.grace) // w) + 1) * w + self.grace + 0.05
        pause = min(max(0.0, due - now), self.poll + 0.05)
        if wake is None:
            time.sleep(pause)
        else:
            wake.wait(pause)

    def gauges(self) -> dict:
        an = self.an
        return {"rows_total": self.rows_in, "gpu_samples_total": an.gpu_samples, "windows_total": an.windows,
                "late_points_total": an.late_points, "late_rows_analysed_total": an.late_rows,
                "gap_rows_dropped_total": an.dropped_rows, "clock_steps_total": self.clock.steps,
                "incidents": len(an.incidents()), "bad_lines_total": an.parser.stats.bad_lines,
                "unsafe_host_series_total": an.parser.series.unsafe_series,
                # data queued to be read back from the store (a host's gap, rows beyond the bound)
                "read_back_queued_seconds": sum(b - a for _h, a, b in an.reread) / 1e9}

    def close(self) -> None:
        if self.notifier is not None:
            left = self.notifier.close()
            if any(left.values()):
                _say(f"{sum(left.values())} notifications stay queued for the next start")


def _state(r) -> str:
    return "resolved" if r.end is not None else "firing"


def _found_late(r, now: float, due: float) -> None:
    """An incident found in data that landed late, later than on-time data would have paged it,
    says so once: ``evidence.found_after_seconds``, which its summary, alerts and page then name
    (its start stays the truth)."""
    if not r.evidence.get("arrived_late") or "found_after_seconds" in r.evidence:
        return
    after = now - r.start
    if after > due:
        r.evidence["found_after_seconds"] = round(after, 1)
        r.summary = summary_line(r)


def follow(online: Online, since: float | None) -> None:
    """``--follow``: catch up from the checkpoint (or ``since``), then pull every poll."""
    from gpufleet.analyzer.sources import backoff

    attempt = 0
    checked = False
    while True:
        try:
            if not checked:
                online.influx.check()
                checked = True
            now = int(online.clock() * 1e9)
            online.read(now - int(online.grace * 1e9), since)
            online.deliver(now)
            if attempt:
                _say("InfluxDB reachable again")
            attempt = 0
            online.wait()
        except GpufleetError as exc:
            wait = backoff(attempt)
            _say(f"{exc}; retrying in {wait:.0f}s")
            attempt += 1
            checked = False
            time.sleep(wait)


def listen(online: Online, listener, since: float | None) -> None:
    """``--listen``: receive writes; with InfluxDB, first catch up the gap since the checkpoint.

    The listener takes writes from the start; while the catch-up reads InfluxDB they wait in its
    queue (429 once it is full). Then the loop takes the queue every poll, and early when a chunk's
    worth waits (``Listener.ready``). Catch-up rounds repeat until one ends within a poll of now, and
    none refused a write meanwhile; of the rows queued meanwhile older than where the last round
    read to, those it read are dropped, the rest are analysed, and so is every later write, whatever
    its stamp (a host's backlog is analysed in its own time). An InfluxDB that cannot be read ends the
    catch-up (said once): the writes that arrive are analysed without it.
    """
    listener.start()
    _say(f"listening on {listener.address[0]}:{listener.address[1]}")
    handoff = None
    if online.influx is not None:
        try:
            online.influx.check()
            while True:
                busy = listener.counters["refused_busy"]
                t0 = time.monotonic()
                online.read(int(online.clock() * 1e9) - int(online.grace * 1e9), since)
                if time.monotonic() - t0 < online.poll and listener.counters["refused_busy"] == busy:
                    break
        except GpufleetError as exc:
            # what arrives is analysed all the same; the gap InfluxDB would have filled is not
            _say(f"catch-up: {exc}; analysing what arrives from now on")
        handoff = online.cursor
    refused = listener.counters["refused_busy"]
    while True:
        for rows in listener.take():
            online.feed(rows, handoff)
        if listener.counters["refused_busy"] > refused:  # writes turned away: no node's silence
            refused = listener.counters["refused_busy"]
            online.an.deaf(online.clock())
        # later writes are analysed whatever their stamps (a backlog stamped before the catch-up's
        # end was not in what it read); a copy of a row already analysed is counted, not analysed
        handoff = None
        online.deliver(int(online.clock() * 1e9))
        online.wait(listener.ready)
