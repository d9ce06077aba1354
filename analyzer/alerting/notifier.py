"""The notifier: incidents in, one firing and one resolved notification per incident group per sink out.

``Notifier.update(incidents, now)`` is cheap and never blocks on the network: it records what
changed in a small SQLite state file (an outbox per sink) and wakes one worker thread per sink.
Each worker delivers its sink's outbox strictly in order (a sink that was down receives what it
missed, oldest first), with a per-attempt timeout, exponential backoff with jitter on timeouts,
connection errors, 5xx and 429 (``Retry-After`` honoured), a give-up on any other 4xx (logged
with the response) and a token-bucket rate limit. Because the outbox is on disk, a restart
neither pages again nor loses a pending resolve.

Grouping: an incident of the same kind on the same host (and cluster) that starts within
``group_window`` seconds of an open group's start joins that group instead of paging again, so
a node-wide fault pages once. An incident that took in one already paged (a node incident
absorbing its GPUs', a cooling incident folding the throttling it caused) joins that page's group:
online, throttling pages first and the cooling incident found minutes later is its update. The
group resolves when every member has ended.
"""

from __future__ import annotations

import json
import logging
import random
import sqlite3
import threading
import time
from collections.abc import Iterable
from pathlib import Path

from gpufleet.analyzer.alerting.base import Alert, Outcome, Sink

from gpufleet.errors import ConfigError
from gpufleet.net import RETRY_AFTER_MAX, backoff_delay
from gpufleet.records import Record, from_rfc3339, to_rfc3339

log = logging.getLogger("gpufleet.alerting")

SCHEMA = """
CREATE TABLE IF NOT EXISTS incident (
    key TEXT PRIMARY KEY, grp TEXT NOT NULL, ended INTEGER NOT NULL DEFAULT 0, end_t REAL,
    record TEXT NOT NULL);
CREATE INDEX IF NOT EXISTS incident_grp ON incident(grp);
CREATE TABLE IF NOT EXISTS grp (
    key TEXT PRIMARY KEY, kind TEXT NOT NULL, host TEXT, cluster TEXT, start REAL NOT NULL,
    status TEXT NOT NULL, alert TEXT NOT NULL, updated REAL NOT NULL);
CREATE INDEX IF NOT EXISTS grp_open ON grp(status, kind, host);
CREATE TABLE IF NOT EXISTS outbox (
    seq INTEGER PRIMARY KEY AUTOINCREMENT, sink TEXT NOT NULL, grp TEXT NOT NULL,
    action TEXT NOT NULL, alert TEXT NOT NULL, state TEXT NOT NULL DEFAULT 'pending',
    attempts INTEGER NOT NULL DEFAULT 0, next_at REAL NOT NULL DEFAULT 0, created REAL NOT NULL,
    done_at REAL, last_error TEXT, UNIQUE (sink, grp, action));
CREATE INDEX IF NOT EXISTS outbox_todo ON outbox(sink, state, seq);
CREATE TABLE IF NOT EXISTS action_log (
    id INTEGER PRIMARY KEY AUTOINCREMENT, sink TEXT NOT NULL, grp TEXT NOT NULL, action TEXT NOT NULL,
    at REAL NOT NULL, status TEXT NOT NULL, argv TEXT, rc INTEGER, seconds REAL, output TEXT, detail TEXT);
CREATE INDEX IF NOT EXISTS action_log_recent ON action_log(sink, at);
"""


def incident_key(r: Record) -> str:
    """The incident's id, or a stable key derived from what it is and when it started."""
    if r.id:
        return str(r.id)
    parts = [r.kind, r.host or "-", "-" if r.gpu is None else str(r.gpu),
             "-" if r.link is None else str(r.link), to_rfc3339(r.start)]
    return ":".join(parts)


def _taken(r: Record) -> list[str]:
    """Ids of the incidents ``r`` took in: narrower ones it absorbed, throttling it folded."""
    ev = r.evidence or {}
    return [str(k) for k in (*ev.get("absorbed", ()), *(x.get("id") for x in ev.get("impact", ())))]


def default_summary(r: Record) -> str:
    where = r.host or "fleet"
    if r.gpu is not None:
        where += f" GPU {r.gpu}"
    if r.link is not None:
        where += f" link {r.link}"
    return f"{r.kind.replace('_', ' ')} on {where}"


def _ranges(nums: list[int]) -> str:
    out, i = [], 0
    while i < len(nums):
        j = i
        while j + 1 < len(nums) and nums[j + 1] == nums[j] + 1:
            j += 1
        out.append(str(nums[i]) if i == j else f"{nums[i]}-{nums[j]}")
        i = j + 1
    return ",".join(out)


class TokenBucket:
    """``rate`` tokens per minute, at most ``burst`` saved up; None = unlimited."""

    def __init__(self, rate: float | None, burst: int):
        self.rate = rate / 60.0 if rate else None
        self.burst = max(1, burst)
        self.tokens = float(self.burst)
        self.t = time.monotonic()

    def delay(self) -> float:
        """0 and one token taken, or the seconds until a token is there."""
        if self.rate is None:
            return 0.0
        now = time.monotonic()
        self.tokens = min(self.burst, self.tokens + (now - self.t) * self.rate)
        self.t = now
        if self.tokens >= 1:
            self.tokens -= 1
            return 0.0
        return (1 - self.tokens) / self.rate


class Store:
    """SQLite state: incidents seen, incident groups, and one ordered outbox per sink."""

    def __init__(self, path: str | Path):
        self.path = Path(path)
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self.db = sqlite3.connect(self.path, check_same_thread=False, isolation_level=None, timeout=10)
            self.db.execute("PRAGMA journal_mode=WAL")
            self.db.execute("PRAGMA synchronous=NORMAL")
            self.db.executescript(SCHEMA)
        except (OSError, sqlite3.Error) as exc:
            raise ConfigError(f"alert state {self.path}: {exc}") from None
        self.lock = threading.RLock()

    def close(self):
        with self.lock:
            self.db.close()


class Notifier:
    """Deliver incidents to sinks; see the module docstring.

    ``sinks``: from :func:`gpufleet.analyzer.alerting.load_sinks`. ``state_path``: the SQLite state file.
    ``page_base_url``: alerts link to ``<base>/<page name>`` (the incident pages' layout).
    ``runbook_base_url``: runbook links are ``<base>/<kind>.md`` (default: see
    :func:`gpufleet.analyzer.alerting.actions.runbook_base`).
    """

    def __init__(self, sinks: list[Sink], state_path: str | Path, page_base_url: str | None = None,
                 *, group_window: float = 300.0, retention: float = 30 * 86400.0,
                 runbook_base_url: str | None = None):
        self.sinks = list(sinks)
        self.page_base_url = page_base_url.rstrip("/") if page_base_url else None
        self.runbook_base_url = runbook_base_url
        self.group_window = group_window
        self.retention = retention
        self.store = Store(state_path)
        # () -> iterable of (host, rack, cluster) this analyzer knows: the sizes the action sink's
        # disruption budget takes a percentage of (None: unknown, the percentage is not applied)
        self.fleet = None
        self._stopping = threading.Event()
        self._deadline = float("inf")
        for s in self.sinks:
            s.bind(self)
        self._workers = [_Worker(self, s) for s in self.sinks]
        for w in self._workers:
            w.start()

    # -- incidents in ------------------------------------------------------------------
    def known(self, incidents: Iterable[Record]) -> int:
        """How many of ``incidents`` this notifier's state has already seen (paged before)."""
        keys = {incident_key(r) for r in incidents}
        with self.store.lock:
            seen = {k for (k,) in self.store.db.execute("SELECT key FROM incident")}
        return len(keys & seen)

    def update(self, incidents: Iterable[Record], now: float | None = None) -> int:
        """Record new and ended incidents; returns how many notifications were queued."""
        now = time.time() if now is None else float(now)
        wall = time.time()  # delivery bookkeeping runs on the wall clock, whatever ``now`` is
        db = self.store.db
        queued = 0
        with self.store.lock:
            db.execute("BEGIN IMMEDIATE")
            try:
                changed: set[str] = set()
                created: list[str] = []
                incidents = list(incidents)
                # id of an incident taken into a wider one -> that one's key (the taker goes first)
                taker = {k: incident_key(r) for r in incidents for k in _taken(r)}
                for r in sorted(incidents, key=lambda r: (incident_key(r) in taker, r.start)):
                    g, new = self._record(r, now, taker.get(incident_key(r)))
                    if g:
                        changed.add(g)
                    if new:
                        created.append(g)
                for g in changed:
                    self._refresh_group(g, now)
                names = [s.name for s in self.sinks]
                firing = db.execute("SELECT key, alert FROM grp WHERE status='firing' "
                                    "ORDER BY start").fetchall()
                active = {k for k, _ in firing}
                # groups that opened and ended within this update still page once, then resolve
                for g in created:
                    if g not in active:
                        d = json.loads(db.execute("SELECT alert FROM grp WHERE key=?", (g,)).fetchone()[0])
                        d.update(status="firing", end=None)
                        firing.append((g, json.dumps(d)))
                firing.sort(key=lambda kv: json.loads(kv[1])["start"])
                for key, alert in firing:
                    for name in names:
                        queued += db.execute(
                            "INSERT OR IGNORE INTO outbox (sink, grp, action, alert, created) "
                            "VALUES (?, ?, 'firing', ?, ?)", (name, key, alert, wall)).rowcount
                for g in changed:
                    key, status, alert = db.execute("SELECT key, status, alert FROM grp WHERE key=?",
                                                    (g,)).fetchone()
                    if status == "firing":
                        db.execute("UPDATE outbox SET alert=? WHERE grp=? AND action='firing' "
                                   "AND state='pending'", (alert, key))
                        continue
                    for (name,) in db.execute("SELECT sink FROM outbox WHERE grp=? AND action='firing'",
                                              (key,)).fetchall():
                        queued += db.execute(
                            "INSERT OR IGNORE INTO outbox (sink, grp, action, alert, created) "
                            "VALUES (?, ?, 'resolved', ?, ?)", (name, key, alert, wall)).rowcount
                self._prune(now)
                db.execute("COMMIT")
            except BaseException:
                db.execute("ROLLBACK")
                raise
        for w in self._workers:
            w.wake.set()
        return queued

    def _record(self, r: Record, now: float, taker: str | None = None) -> tuple[str | None, bool]:
        """Insert or update one incident: (its group's key when something changed, group is new).
        ``taker``: the key of the incident that took this one in, if any."""
        db = self.store.db
        key = incident_key(r)
        row = db.execute("SELECT grp, ended, json_extract(record, '$.start') FROM incident WHERE key=?",
                         (key,)).fetchone()
        if row is not None:
            grp, ended, start = row
            if r.end is not None and not ended:
                db.execute("UPDATE incident SET ended=1, end_t=?, record=? WHERE key=?",
                           (r.end, r.to_json(), key))
                return grp, False
            if not ended and start is not None and r.start < (from_rfc3339(start) or r.start):
                # its backlog landed after it was paged: the true start (and "found N min after it
                # began") go out with the next re-post and the resolve
                db.execute("UPDATE incident SET record=? WHERE key=?", (r.to_json(), key))
                return grp, False
            return None, False
        grp = self._continued(r, taker)
        if grp is None and r.host is not None and self.group_window > 0:
            # an open group: same kind/host/cluster, started nearby, some member still active then
            hit = db.execute(
                "SELECT key FROM grp WHERE status='firing' AND kind=? AND host=? AND cluster IS ? "
                "AND abs(start - ?) <= ? AND EXISTS (SELECT 1 FROM incident i WHERE i.grp=grp.key "
                "AND (i.ended=0 OR i.end_t >= ?)) ORDER BY start LIMIT 1",
                (r.kind, r.host, r.cluster, r.start, self.group_window, r.start)).fetchone()
            grp = hit[0] if hit else None
        if grp is None:
            grp = key
            db.execute("INSERT OR IGNORE INTO grp (key, kind, host, cluster, start, status, alert, updated) "
                       "VALUES (?, ?, ?, ?, ?, 'firing', '{}', ?)",
                       (grp, r.kind, r.host, r.cluster, r.start, now))
        db.execute("INSERT INTO incident (key, grp, ended, end_t, record) VALUES (?, ?, ?, ?, ?)",
                   (key, grp, int(r.end is not None), r.end, r.to_json()))
        return grp, grp == key

    def _continued(self, r: Record, taker: str | None) -> str | None:
        """The firing group a new incident ``r`` belongs to as one fault: that of an incident it
        took in (``r`` is that page's update), or of the incident that took it in (a throttling
        folded into a cooling incident already paged is that page's evidence, not a page)."""
        for k in [*_taken(r), *([taker] if taker else [])]:
            hit = self.store.db.execute(
                "SELECT i.grp FROM incident i JOIN grp g ON g.key = i.grp "
                "WHERE i.key = ? AND g.status = 'firing'", (k,)).fetchone()
            if hit:
                return hit[0]
        return None

    def _refresh_group(self, grp: str, now: float) -> None:
        db = self.store.db
        rows = db.execute("SELECT key, record, ended FROM incident WHERE grp=? ORDER BY rowid",
                          (grp,)).fetchall()
        members = [(k, Record.from_dict(json.loads(rec)), ended) for k, rec, ended in rows]
        status = db.execute("SELECT status FROM grp WHERE key=?", (grp,)).fetchone()[0]
        if status == "firing" and all(e for _, _, e in members):
            status = "resolved"
        alert = self.build_alert(grp, [m for _, m, _ in members], status)
        db.execute("UPDATE grp SET status=?, alert=?, updated=? WHERE key=?",
                   (status, json.dumps(alert.to_dict()), now, grp))

    def build_alert(self, grp: str, members: list[Record], status: str) -> Alert:
        from gpufleet.analyzer.alerting.actions import guide, where
        from gpufleet.analyzer.alerting.pages import page_name

        first = members[0]
        gpus = sorted({m.gpu for m in members if m.gpu is not None})
        links = sorted({m.link for m in members if m.link is not None})
        ends = [m.end for m in members]
        place = None
        if len(members) > 1 and len(gpus) > 1:
            place = f"{first.host or where(first)} GPUs {_ranges(gpus)}"
        g = guide(first, self.runbook_base_url, place)
        title = g.title if len(members) == 1 else f"{g.title} ({len(members)} incidents)"
        technical = first.summary or default_summary(first)
        description = technical if not first.detail else f"{technical}. {first.detail}"
        if len(members) > 1:
            description += " Members: " + "; ".join(m.summary or default_summary(m) for m in members[:20])
        jobs = sorted({j for m in members for j in m.jobs}, key=lambda j: (len(j), j))
        page_url = f"{self.page_base_url}/{page_name(incident_key(first))}" if self.page_base_url else None
        return Alert(
            key=grp, status=status, kind=first.kind, severity=first.severity,
            start=min(m.start for m in members),
            end=max(ends) if status == "resolved" and all(e is not None for e in ends) else None,
            host=first.host, gpu=first.gpu, link=first.link, gpus=gpus, links=links,
            cluster=first.cluster, rack=first.rack, summary=title, description=description,
            page_url=page_url, incidents=[incident_key(m) for m in members], evidence=first.evidence,
            title=title, impact=g.impact, action=g.action, runbook_url=g.runbook_url, jobs=jobs,
        )

    def _prune(self, now: float) -> None:
        """Forget groups resolved (and delivered everywhere) longer than ``retention`` ago."""
        db = self.store.db
        old = [k for (k,) in db.execute(
            "SELECT key FROM grp WHERE status='resolved' AND updated < ? AND NOT EXISTS "
            "(SELECT 1 FROM outbox o WHERE o.grp=grp.key AND o.state='pending') LIMIT 1000",
            (now - self.retention,)).fetchall()]
        for k in old:
            db.execute("DELETE FROM outbox WHERE grp=?", (k,))
            db.execute("DELETE FROM incident WHERE grp=?", (k,))
            db.execute("DELETE FROM grp WHERE key=?", (k,))
        # the sinks' own pages (page(): a refused action, a spent budget) have no group
        db.execute("DELETE FROM outbox WHERE state!='pending' AND created < ? AND NOT EXISTS "
                   "(SELECT 1 FROM grp WHERE grp.key=outbox.grp)", (time.time() - self.retention,))

    def page(self, alert: Alert) -> bool:
        """Send ``alert`` (a page of the sinks' own: a refused action, an exhausted budget) to
        every sink but the action sinks, once per key; False when that key was paged before."""
        doc = json.dumps(alert.to_dict())
        wall = time.time()
        queued = 0
        with self.store.lock:
            for s in self.sinks:
                if s.acts:
                    continue
                queued += self.store.db.execute(
                    "INSERT OR IGNORE INTO outbox (sink, grp, action, alert, created) "
                    "VALUES (?, ?, 'firing', ?, ?)", (s.name, alert.key, doc, wall)).rowcount
        for w in self._workers:
            w.wake.set()
        return queued > 0

    def group_sizes(self, cluster: str | None, rack: str | None) -> dict:
        """How many hosts this analyzer knows in ``cluster`` and in ``rack`` (absent: unknown)."""
        if self.fleet is None:
            return {}
        try:
            members = list(self.fleet())
        except Exception:  # noqa: BLE001 - a registry read racing the analysis: sizes unknown
            return {}
        out = {}
        if cluster is not None:
            out["cluster"] = len({h for h, _r, c in members if c == cluster})
        if rack is not None:
            out["rack"] = len({h for h, r, _c in members if r == rack})
        return out

    # -- introspection and shutdown ------------------------------------------------------
    def pending(self) -> dict[str, int]:
        """Notifications not yet delivered (nor given up), per sink."""
        with self.store.lock:
            rows = self.store.db.execute(
                "SELECT sink, count(*) FROM outbox WHERE state='pending' GROUP BY sink").fetchall()
        names = {s.name for s in self.sinks}
        return {s: n for s, n in rows if s in names}

    def firing_since(self) -> float | None:
        """The start of the oldest incident group still firing (None: none is)."""
        with self.store.lock:
            row = self.store.db.execute("SELECT min(start) FROM grp WHERE status='firing'").fetchone()
        return row[0] if row else None

    def outbox(self, sink: str) -> list[dict]:
        """The sink's notifications, oldest first (for tests and ``status`` output)."""
        with self.store.lock:
            cur = self.store.db.execute(
                "SELECT seq, grp, action, state, attempts, last_error FROM outbox WHERE sink=? ORDER BY seq",
                (sink,))
            cols = [c[0] for c in cur.description]
            return [dict(zip(cols, row, strict=True)) for row in cur.fetchall()]

    def record_action(self, sink: str, grp: str, action: str, rec: dict) -> None:
        """Keep what an action sink did (run, dry-run, suppressed, failed) in the state file."""
        with self.store.lock:
            self.store.db.execute(
                "INSERT INTO action_log (sink, grp, action, at, status, argv, rc, seconds, output, detail) "
                "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                (sink, grp, action, time.time(), rec.get("status"), json.dumps(rec.get("argv")),
                 rec.get("rc"), rec.get("seconds"), rec.get("output"), rec.get("detail")))

    def count_actions(self, sink: str, since: float) -> int:
        """Commands an action sink ran or would have run (dry-run) for firings since ``since``
        (refusals ran nothing and count for nothing)."""
        with self.store.lock:
            return self.store.db.execute(
                "SELECT count(*) FROM action_log WHERE sink=? AND action='firing' AND at>=? "
                "AND status IN ('ok', 'dry-run', 'failed') AND argv!='null'", (sink, since)).fetchone()[0]

    def actions(self, sink: str | None = None) -> list[dict]:
        """The action log, oldest first: sink, grp, action, at, status, argv, rc, seconds, output, detail."""
        with self.store.lock:
            cur = self.store.db.execute(
                "SELECT sink, grp, action, at, status, argv, rc, seconds, output, detail FROM action_log "
                "WHERE ? IS NULL OR sink=? ORDER BY id", (sink, sink))
            cols = [c[0] for c in cur.description]
            rows = [dict(zip(cols, row, strict=True)) for row in cur.fetchall()]
        for r in rows:
            r["argv"] = json.loads(r["argv"]) if r["argv"] else None
        return rows

    def flush(self, timeout: float = 10.0) -> bool:
        """Wait until every live sink's outbox is delivered or given up; False on timeout."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if not self.pending():
                return True
            time.sleep(0.02)
        return not self.pending()

    def close(self, timeout: float = 5.0) -> dict[str, int]:
        """Deliver what can be delivered within ``timeout`` s, then stop; returns what is left.

        What is left stays in the state file and goes out on the next start. An action sink's
        command already running is waited for (up to its verification's and its own deadline):
        the process never exits with a command of its running unrecorded.
        """
        self._deadline = time.monotonic() + timeout
        self._stopping.set()
        for w in self._workers:
            w.wake.set()
        for w in self._workers:
            extra = 2 * (w.sink.delivery.timeout + 2.5) if w.sink.acts else 0.0
            w.join(max(0.0, self._deadline - time.monotonic()) + 0.5 + extra)
        left = self.pending()
        if not any(w.is_alive() for w in self._workers):
            for s in self.sinks:
                s.close()
            self.store.close()
        return left

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


class _Worker(threading.Thread):
    """Delivers one sink's outbox in order; re-posts active alerts where the sink asks for it."""

    def __init__(self, notifier: Notifier, sink: Sink):
        super().__init__(name=f"gpufleet-sink-{sink.name}", daemon=True)
        self.n = notifier
        self.sink = sink
        self.wake = threading.Event()
        self.bucket = TokenBucket(sink.delivery.rate_limit, sink.delivery.burst)
        self.last_repost = 0.0

    def run(self):
        try:
            self.loop()
        except Exception as exc:  # never let one sink take the process down
            log.error("sink %s: worker stopped: %s", self.sink.name, self.sink.redact(repr(exc)))
        finally:
            if self.sink.acts:  # the others may be waiting for its last pages
                for w in self.n._workers:
                    w.wake.set()

    def _acting(self) -> bool:
        """An acting sink's worker is still delivering: it may yet queue a page for this sink."""
        return not self.sink.acts and any(w.sink.acts and w.is_alive() for w in self.n._workers)

    def _sleep(self, seconds: float) -> None:
        if self.n._stopping.is_set():
            seconds = min(seconds, max(0.0, self.n._deadline - time.monotonic()))
        self.wake.wait(max(0.0, seconds))
        self.wake.clear()

    def _next(self):
        with self.n.store.lock:
            return self.n.store.db.execute(
                "SELECT seq, grp, action, alert, attempts, next_at, created FROM outbox "
                "WHERE sink=? AND state='pending' ORDER BY seq LIMIT 1", (self.sink.name,)).fetchone()

    def _set(self, seq: int, **cols) -> None:
        sets = ", ".join(f"{k}=?" for k in cols)
        with self.n.store.lock:
            self.n.store.db.execute(f"UPDATE outbox SET {sets} WHERE seq=?", (*cols.values(), seq))

    def loop(self):
        n, sink, d = self.n, self.sink, self.sink.delivery
        while True:
            stopping = n._stopping.is_set()
            if stopping and time.monotonic() >= n._deadline:
                return
            acting = stopping and self._acting()  # asked before the read: a page it queued is seen
            row = self._next()
            now = time.time()
            if row is None and acting:
                self._sleep(1.0)  # its page() wakes this worker
                continue
            if row is None:
                if stopping:
                    return
                if sink.repost_interval and now - self.last_repost >= sink.repost_interval:
                    self.repost(now)
                    continue
                wait = sink.repost_interval - (now - self.last_repost) if sink.repost_interval else 3600
                self._sleep(min(wait, 3600))
                continue
            seq, grp, action, alert_json, attempts, next_at, created = row
            if next_at > now:
                if stopping and time.monotonic() + (next_at - now) > n._deadline:
                    return
                self._sleep(next_at - now)
                continue
            if now - created > d.give_up_after:
                log.error("sink %s: giving up on %s %s after %d attempts over %.0f s",
                          sink.name, action, grp, attempts, now - created)
                self._set(seq, state="failed", done_at=now, last_error="gave up (too old)")
                continue
            if action == "resolved" and self._firing_failed(grp):
                self._set(seq, state="skipped", done_at=now, last_error="firing was not delivered")
                continue
            wait = self.bucket.delay()
            if wait > 0:
                self._sleep(wait)
                continue
            alert = Alert.from_dict(json.loads(alert_json))
            try:
                out = sink.deliver(alert)
            except Exception as exc:  # a sink bug is a failed attempt, not a dead worker
                out = Outcome("retry", sink.redact(f"{type(exc).__name__}: {exc}"))
            attempts += 1
            now = time.time()
            if out.record is not None:
                n.record_action(sink.name, grp, action, out.record)
            if out.status == "sent":
                self._set(seq, state="sent", attempts=attempts, done_at=now, last_error=None)
                if attempts > 1:
                    log.info("sink %s: %s %s delivered after %d attempts", sink.name, action, grp, attempts)
            elif out.status == "failed":
                self._set(seq, state="failed", attempts=attempts, done_at=now, last_error=out.detail)
                if out.record is None:  # an action sink has logged its own line
                    log.error("sink %s: %s %s rejected, not retried: %s", sink.name, action, grp, out.detail)
            else:
                delay = backoff_delay(attempts, d.backoff, d.backoff_max)
                if out.retry_after is not None:
                    delay = min(out.retry_after, RETRY_AFTER_MAX) + random.uniform(0, 0.05 * d.backoff)
                self._set(seq, attempts=attempts, next_at=now + delay, last_error=out.detail)
                (log.warning if attempts == 1 or attempts % 10 == 0 else log.info)(
                    "sink %s: %s %s attempt %d failed (%s); retrying in %.1f s",
                    sink.name, action, grp, attempts, out.detail, delay)

    def _firing_failed(self, grp: str) -> bool:
        with self.n.store.lock:
            row = self.n.store.db.execute(
                "SELECT state FROM outbox WHERE sink=? AND grp=? AND action='firing'",
                (self.sink.name, grp)).fetchone()
        return row is not None and row[0] in ("failed", "skipped")

    def repost(self, now: float) -> None:
        with self.n.store.lock:
            rows = self.n.store.db.execute(
                "SELECT g.alert FROM outbox o JOIN grp g ON g.key=o.grp WHERE o.sink=? AND "
                "o.action='firing' AND o.state='sent' AND g.status='firing' ORDER BY o.seq",
                (self.sink.name,)).fetchall()
        self.last_repost = now
        alerts = [Alert.from_dict(json.loads(a)) for (a,) in rows]
        if not alerts:
            return
        try:
            out = self.sink.repost(alerts)
        except Exception as exc:
            out = Outcome("retry", self.sink.redact(f"{type(exc).__name__}: {exc}"))
        if out.status != "sent":
            log.warning("sink %s: re-posting %d active alerts failed: %s", self.sink.name, len(alerts),
                        out.detail)
            # try again soon rather than a whole interval later
            self.last_repost = now - self.sink.repost_interval + min(self.sink.delivery.backoff_max, 5.0)
