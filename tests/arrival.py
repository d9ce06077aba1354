"""Replaying a fleet's line protocol into the online loop in a chosen arrival order, on a clock of
its own (the data's time), for the event-time tests: what the analyzer makes of data that lands
late, in bursts, twice, from a host whose clock runs ahead."""

from __future__ import annotations

import gzip
import random
import re
from pathlib import Path

from gpufleet.analyzer.config import Config
from gpufleet.analyzer.online import Checkpoint, Clock, Online

HOST = re.compile(rb"[ ,]host=([^, ]+)")
EXCLUDE = ("analysis_gap", "node_stopped_reporting")  # the online loop's own records: no faults


def lines_of(path: str | Path) -> list[tuple[int, bytes, bytes]]:
    """(timestamp ns, host, line) per line of a line-protocol file."""
    data = Path(path).read_bytes()
    if str(path).endswith(".gz"):
        data = gzip.decompress(data)
    out = []
    for line in data.splitlines():
        if not line or line.startswith(b"#"):
            continue
        m = HOST.search(line)
        out.append((int(line.rsplit(b" ", 1)[1]), m.group(1) if m else b"", line))
    return out


class FakeClock:
    def __init__(self, t: float):
        self.t = t

    def __call__(self) -> float:
        return self.t


def replay(lines, arrive, poll: float = 10.0, grace: float | None = None, cfg: Config | None = None,
           lateness: float | None = None, influx=None, burst: int = 5000, after=None,
           notifier=None) -> Online:
    """Each line lands at ``arrive(t_seconds, host, index)`` (seconds; None: never); the loop runs a
    cycle every ``poll`` seconds of its own clock, taking what landed since the last cycle in
    bodies of at most ``burst`` lines (in landing order), as ``--listen`` does. ``after(online,
    now)`` runs after each cycle; ``notifier`` (gpufleet.analyzer.alerting.Notifier) takes the
    incidents as the loop delivers them. Returns the loop, its analysis finished at the end."""
    grace = poll if grace is None else grace
    landing = []
    for i, (t, host, line) in enumerate(lines):
        a = arrive(t / 1e9, host, i)
        if a is not None:
            landing.append((a, i, line))
    landing.sort()
    start = min(a for a, _i, _l in landing)
    now = FakeClock(start)
    online = Online(cfg or Config(), None, influx, notifier, None, Checkpoint(None), poll, grace, lateness,
                    clock=Clock(wall=now, mono=now))
    j = 0
    end = max(a for a, _i, _l in landing) + 3 * poll
    c = start
    while c <= end:
        now.t = c
        body = []
        while j < len(landing) and landing[j][0] <= c:
            body.append(landing[j][2])
            j += 1
            if len(body) >= burst:
                online.feed(online.an.parser.feed(b"\n".join(body) + b"\n"))
                body = []
        if body:
            online.feed(online.an.parser.feed(b"\n".join(body) + b"\n"))
        online.deliver(int(c * 1e9))
        if after is not None:
            after(online, c)
        c += poll
    return online


def in_order(lines, t0: float, order, poll: float = 10.0) -> Online:
    """``lines`` replayed (:func:`replay`) in an arrival ``order`` of the property test's shape,
    ``(cuts, dup, burst, seed)``: per host cut off, ``(start, length, drain)`` seconds from ``t0``
    (its rows of the cut land together ``drain`` seconds after it); a share ``dup`` of the rows
    sent twice, each copy a poll or two after the row; bodies of ``burst`` lines; ``seed`` draws
    the copies. Its analysis finished."""
    cuts, dup, burst, seed = order
    rng = random.Random(seed)
    copies = [lines[i] for i in range(len(lines)) if rng.random() < dup]
    n = len(lines)

    def arrive(t, host, i):
        c = cuts.get(host)
        a = t + 1.0
        if c is not None and t0 + c[0] <= t < t0 + c[0] + c[1]:
            a = t0 + c[0] + c[1] + c[2] + 1.0
        return a + (poll * rng.choice((1, 2)) if i >= n else 0.0)  # a copy lands a poll or two late

    online = replay(lines + copies, arrive, poll=poll, burst=burst)
    online.an.finish()
    return online


def fault(r) -> tuple:
    """What an incident is of: (kind, host, GPU, link)."""
    return r.kind, r.host, r.gpu, r.link


def keys(recs, poll: float = 10.0) -> list[tuple]:
    """Incidents as (kind, host, GPU, link, start rounded to a poll), the faults only."""
    return sorted((*fault(r), round(r.start / poll))
                  for r in recs if r.kind not in EXCLUDE)


def batch(path) -> list:
    from gpufleet.analyzer.pipeline import Analyzer
    from gpufleet.analyzer.sources import read_chunks

    an = Analyzer()
    for chunk in read_chunks(path):
        an.feed_bytes(chunk)
    an.finish()
    return an.incidents()


def same(a, b, poll: float = 10.0) -> tuple[list, list]:
    """Incidents of ``a`` with no match in ``b`` and of ``b`` with none in ``a``: the same kind,
    host, GPU and link, starts within one poll."""
    left = [r for r in a if r.kind not in EXCLUDE]
    right = [r for r in b if r.kind not in EXCLUDE]
    only_a = []
    for r in left:
        m = next((o for o in right if fault(o) == fault(r)
                  and abs(o.start - r.start) <= poll), None)
        if m is None:
            only_a.append(r)
        else:
            right.remove(m)
    return only_a, right


def differ(a, b, poll: float = 10.0) -> tuple[list, list]:
    """:func:`same` as keys: (kind, host, GPU, link, start) of ``a``'s unmatched incidents and
    (kind, host, GPU, link, start in polls) of ``b``'s."""
    x, y = same(a, b, poll)
    return ([(*fault(r), round(r.start)) for r in x],
            [(*fault(r), round(r.start / poll)) for r in y])


def within(diff, residual) -> bool:
    """Online differs from batch at most where it does with every row on time (``residual``)."""
    return set(diff[0]) <= set(residual[0]) and set(diff[1]) <= set(residual[1])


def open_twice(recs) -> list:
    """The faults (kind, host, GPU, link) with more than one open incident."""
    k = [fault(r) for r in recs if r.kind not in EXCLUDE and r.end is None]
    return sorted({x for x in k if k.count(x) > 1})
