"""Event time per host: data that lands late is analysed in its own host's time, never dropped
without a record; one writer's clock, or the analyzer's, delays no other host's pages.

The fleets are the simulator's (``gpufleet sim``), replayed into the online loop on a clock of
their own (tests/arrival.py): every row lands when the arrival order says, the loop cycles every
poll, and its incidents are compared with the batch analysis of the same file."""

from __future__ import annotations

import json
import re
import time

import numpy as np
import pytest
from gpufleet.analyzer.config import Config
from gpufleet.analyzer.online import Checkpoint, Clock, Online
from gpufleet.analyzer.pipeline import Analyzer
from hypothesis import HealthCheck, Phase, example, given, settings
from hypothesis import strategies as st

from gpufleet.cli import main
from tests.arrival import FakeClock, batch, differ, in_order, lines_of, open_twice, replay, within

POLL = 30.0  # the loop's poll (and the tolerance on starts): few cycles, a fast test


@pytest.fixture(scope="module")
def fleet(tmp_path_factory):
    out = tmp_path_factory.mktemp("evtime") / "sim"
    assert main(["sim", "--nodes", "4", "--duration", "45m", "--step", "10s", "--seed", "7",
                 "--scenario", "mixed", "--out", str(out), "--no-progress"]) == 0
    path = out / "telemetry.lp.gz"
    lines = lines_of(path)
    want = batch(path)
    # every row on time: online finds what batch finds, though its windows are a poll, not five
    # minutes (each row is learned from once: a baseline's rows do not depend on the window); the
    # residual every other order must match (none)
    ontime = replay(lines, lambda t, _h, _i: t + 1.0, poll=POLL)
    ontime.an.finish()
    residual = _differ(want, ontime.an.incidents())
    assert residual == ([], []), residual
    return lines, want, min(t for t, _h, _l in lines) / 1e9, residual


def _differ(a, b):
    return differ(a, b, POLL)


def _once(recs):
    twice = open_twice(recs)
    assert not twice, f"an open incident twice: {twice}"


@pytest.mark.slow
def test_a_node_cut_off_for_30_minutes_is_analysed_in_its_own_time(fleet):
    """gpu0003 is cut off for 30 minutes and its spool drains at once: none of its rows is dropped,
    its faults (a DBE storm, a power brake, a lost GPU, PCIe replays, cooling) are found with their
    true starts, say that they were found late, and the node's silence is one record."""
    lines, want, t0, residual = fleet
    cut, back = t0 + 600, t0 + 2400

    def arrive(t, host, _i):
        return back + 1.0 if host == b"gpu0003" and cut <= t < back else t + 1.0

    online = replay(lines, arrive, poll=POLL)
    an = online.an
    an.finish()
    got = an.incidents()
    assert within(_differ(want, got), residual), (_differ(want, got), residual)
    _once(got)
    assert an.late_rows > 9000 and an.dropped_rows == 0 and an.late_points == 0
    late = [r for r in got if r.evidence.get("arrived_late")]
    assert {r.host for r in late} == {"gpu0003"}
    assert {r.kind for r in late} >= {"memory_errors", "power_brake", "gpu_lost", "pcie_degradation"}
    for r in late:
        # found when the spool drained, i.e. long after it began: said in the page's words
        assert r.evidence["found_after_seconds"] >= back - r.start - 1
        assert "its data arrived late" in r.summary
    stopped = [r for r in got if r.kind == "node_stopped_reporting"]
    assert [(r.host, r.start) for r in stopped] == [("gpu0003", pytest.approx(cut, abs=10))]
    assert stopped[0].end == pytest.approx(back, abs=2 * POLL)
    assert not [r for r in got if r.kind == "analysis_gap"]


@pytest.mark.slow
def test_beyond_the_bound_without_a_store_is_a_gap_record(fleet):
    """With a bound of 10 minutes and no store, a host 30 minutes late loses the rows beyond it, and
    says so: counted, logged, and one analysis_gap record with host, range, rows and why."""
    lines, _want, t0, _residual = fleet
    cut, back = t0 + 600, t0 + 2400

    def arrive(t, host, _i):
        return back + 1.0 if host == b"gpu0001" and cut <= t < back else t + 1.0

    said = []
    online = replay(lines, arrive, poll=POLL, lateness=600.0,
                    after=lambda o, _now: said.extend(o.an.said))
    an = online.an
    gaps = [r for r in an.incidents() if r.kind == "analysis_gap"]
    assert len(gaps) == 1 and an.dropped_rows > 0
    g = gaps[0]
    assert g.host == "gpu0001" and g.evidence["rows"] == an.dropped_rows
    assert g.start == pytest.approx(cut, abs=10) and g.end < back - 600 + POLL
    assert "analysis gap: host gpu0001, from 20" in g.summary and f"{an.dropped_rows} rows" in g.summary
    assert "late bound" in g.summary
    # the notifier's state and --out read it back (a record of the analysis, not a fault kind)
    import json

    from gpufleet.records import Record

    assert Record.from_dict(json.loads(g.to_json())).summary == g.summary


@st.composite
def arrivals(draw):
    """An arrival order within the bound: hosts cut off and draining at once (one hours late,
    several at the same time), bodies of any size, rows sent twice."""
    hosts = [b"gpu0001", b"gpu0002", b"gpu0003", b"gpu0004"]
    late = draw(st.lists(st.sampled_from(hosts), min_size=1, max_size=3, unique=True))
    cuts = {}
    for h in late:
        start = draw(st.integers(0, 1800))
        length = draw(st.integers(60, 2700))
        cuts[h] = (start, length, draw(st.integers(0, 120)))  # drains a little after it is back
    dup = draw(st.floats(0, 0.02))
    burst = draw(st.sampled_from([200, 1000, 5000]))
    seed = draw(st.integers(0, 2**16))
    return cuts, dup, burst, seed


# a few orders per run (each replays the fleet: ~10 s), the same ones every run; no shrinking (a
# failing order is printed whole: it is small)
@settings(max_examples=3, deadline=None, derandomize=True, phases=[Phase.explicit, Phase.generate],
          suppress_health_check=list(HealthCheck))
@given(arrivals())
# gpu0003 cut off 5 min in, for 38 min: its backlog was learned against the baselines its peers
# froze meanwhile, not those they had then, and its degrading heatsink paged as throttling
@example(order=({b"gpu0003": (310, 2315, 13)}, 0.012314647826344538, 1000, 46958))
# cut off 27 min to the fleet's end, its backlog landing after everything else: judged with its
# peers only where their rows are held longer than peers_hold_seconds (its heatsink 50 s late)
@example(order=({b"gpu0003": (1603, 1685, 58)}, 0.002216490134849363, 1000, 5847))
# gpu0001 cut off 40 min, gpu0002 for 16 min of the same time: each the other's peer there, only
# where rows analysed in a late window are held as peers too (gpu0001's heatsink 100 s late)
@example(order=({b"gpu0001": (444, 2399, 104), b"gpu0002": (1600, 980, 83)}, 0.0066749185980842654, 200,
                48578))
@pytest.mark.slow
def test_online_equals_batch_whatever_the_arrival_order(fleet, order):
    """The same data gives the same incidents (kind, host, GPU, link, start within one poll)
    however it lands."""
    lines, want, t0, residual = fleet
    online = in_order(lines, t0, order, POLL)
    got = online.an.incidents()
    assert within(_differ(want, got), residual), (order, _differ(want, got), residual)
    _once(got)
    assert online.an.dropped_rows == 0


def _dbe_fleet(dbe: int, seconds: int = 300) -> list:
    """Hosts a and b, 2 GPUs each, a row a second from T; b's GPU 1 has a DBE at T + ``dbe``."""
    lines = []
    for s in range(seconds):
        for h in ("a", "b"):
            for g in range(2):
                e = int(h == "b" and g == 1 and s >= dbe)
                lines.append(((T + s) * 10**9, h.encode(), (
                    f"gpu,host={h},gpu={g} up=1i,power_watts=300,ecc_uncorrected_volatile_total={e}i "
                    f"{(T + s) * 10**9}").encode()))
    return lines


@pytest.mark.parametrize("late", [False, True], ids=["fleet-backlog", "host-backlog"])
def test_a_batch_of_a_host_s_rows_held_back_inside_one_window_is_analysed_when_it_lands(late):
    """b's rows of 420-480 s (its DBE at 450 among them) are held back and land a minute after the
    rest: a gap inside one window of b's rows, not copies of what was analysed around it; with
    them the row of b's GPU 1 at 419 s, the rest of a poll whose other row was analysed (a body
    cut mid-poll). Whether the fleet's rows all land at once ahead of their time (a replay:
    analysed in five-minute windows, b in time with a; the held rows a minute later) or a is on
    time and b's rows land at 900 s (b's five-minute late windows; the held rows at 960 s), the
    hole lies inside one window; the held rows are analysed when they land: no analysis_gap
    record, the DBE's incident takes its true start, one incident."""
    lines = _dbe_fleet(450, seconds=900)

    def arrive(t, host, i):
        held = host == b"b" and (420 <= t - T < 480 or (t - T == 419 and b"gpu=1" in lines[i][2]))
        if not late:
            return T + (60.5 if held else 0.5)
        if host == b"b":
            return T + (960.5 if held else 900.5)
        return t + 0.5

    an = replay(lines, arrive, poll=1.0).an
    assert [r for r in an.incidents() if r.kind == "analysis_gap"] == []
    got = [r for r in an.incidents() if r.kind == "memory_errors"]
    assert [(r.host, r.gpu, r.start) for r in got] == [("b", 1, T + 450)], got
    assert an.late_points == 0 and an.dropped_rows == 0 and an.late_rows >= 2 * 60


def test_one_gpu_s_rows_landing_late_among_its_host_s_on_time_rows_are_analysed():
    """b's GPU 1 rows of 200-260 s (its DBE at 230) land at 400 s, GPU 0's on time: inside the
    stretch b has analysed, yet no row of GPU 1 at their times was (the held rows say so): its
    backlog, analysed in b's own time, the DBE paged with its true start; no analysis_gap."""
    lines = _dbe_fleet(230, seconds=500)

    def arrive(t, host, i):
        return T + 400.5 if host == b"b" and 200 <= t - T < 260 and b"gpu=1" in lines[i][2] else t + 0.5

    an = replay(lines, arrive, poll=1.0).an
    got = [(r.kind, r.host, r.gpu, r.start) for r in an.incidents()]
    assert got == [("memory_errors", "b", 1, T + 230)], got
    assert an.late_rows == 60 and an.late_points == 0


def test_a_short_node_cut_whose_rows_land_after_its_live_rows_keeps_one_incident_with_its_true_start(
        tmp_path):
    """gpu b is cut off for 2 minutes (less than the context) and has a DBE inside the cut; its rows
    after the cut land on time, the cut's own rows 10 s later (a writer that sends its live rows
    before its backlog). At reconnection the counter's step over the gap pages at once (the
    error happened somewhere in the gap: ``over_gap_seconds``); when the backlog lands it is
    analysed in b's own time, and the same incident, not a second one, takes the true start,
    the first hit's evidence from the backlog, and says it was found late (``arrived_late``,
    ``found_after_seconds``: from its start to when it was first delivered)."""
    cut, back, dbe, land = 100, 220, 150, 230
    lines = _dbe_fleet(dbe)

    def arrive(t, host, _i):
        return T + land + 0.5 if host == b"b" and cut <= t - T < back else t + 0.5

    first = {}

    def after(o, now):
        for r in o.an.incidents():
            first.setdefault((r.kind, r.host, r.gpu), (now, r.start))

    from gpufleet.analyzer.alerting import Notifier

    with Notifier([], tmp_path / "state.db") as notifier:
        online = replay(lines, arrive, poll=1.0, after=after, notifier=notifier)
        alerts = [json.loads(a) for (a,) in notifier.store.db.execute("SELECT alert FROM grp")]
    an = online.an
    got = [r for r in an.incidents() if r.kind == "memory_errors"]
    assert [(r.host, r.gpu) for r in got] == [("b", 1)], got
    r = got[0]
    paged, start = first[("memory_errors", "b", 1)]
    assert back <= paged - T <= back + 3 and start == T + back  # paged at reconnection, over the gap
    assert r.start == T + dbe and r.end is None  # the backlog's true start, the same incident
    assert r.evidence["arrived_late"] is True
    assert r.evidence["found_after_seconds"] == pytest.approx(paged - r.start, abs=0.1)
    assert "over_gap_seconds" not in r.evidence["first"] and r.evidence["first"]["new_dbe"] == 1
    assert "found 1 min after it began: its data arrived late" in r.summary
    assert online.written[r.id] == "firing"
    # the notifier's alert (what the next re-post and the resolve send) says the same
    alert = next(a for a in alerts if a["kind"] == "memory_errors")
    assert alert["start"] == r.start and "found 1 min after it began" in alert["description"]
    assert an.late_rows == 2 * (back - cut) and an.dropped_rows == 0 and an.late_points == 0
    stopped = [x for x in an.incidents() if x.kind == "node_stopped_reporting"]
    assert [(x.host, x.start) for x in stopped] == [("b", T + cut - 1)] and stopped[0].end is not None


def test_a_fault_whose_host_was_cut_off_mid_run_keeps_its_true_start_when_its_live_rows_land_first():
    """b's GPU 1 throttles from 100 s to 400 s (a run that pages after 180 s); b is cut off from
    200 s to 300 s, its rows after the cut landing on time and the cut's own rows at 320 s. Online
    the run before the cut (100 s) ends at the gap when the live rows come, shorter than the dwell;
    the backlog then fills that gap, and the fault is one incident from 100 s, as in batch (not
    from 200 s, where the backlog's hits alone would date it)."""
    cut, back, land = 200, 300, 320
    lines = []
    for s in range(500):
        for h in ("a", "b"):
            for g in range(2):
                hot = int(h == "b" and g == 1 and 100 <= s < 400)
                lines.append(((T + s) * 10**9, h.encode(), (
                    f"gpu,host={h},gpu={g} up=1i,power_watts=300,clock_event_sw_thermal={hot}i "
                    f"{(T + s) * 10**9}").encode()))
    cfg = Config()
    cfg.detectors["thermal_throttle"]["dwell_seconds"] = 180.0

    def arrive(t, host, _i):
        return T + land + 0.5 if host == b"b" and cut <= t - T < back else t + 0.5

    def throttled(recs):
        return [(r.host, r.gpu, r.start - T) for r in recs if r.kind == "thermal_throttle"]

    with_cut = replay(lines, arrive, poll=1.0, cfg=cfg).an
    on_time = replay(lines, lambda t, _h, _i: t + 0.5, poll=1.0, cfg=cfg).an
    assert throttled(on_time.incidents()) == [("b", 1, 100)]
    assert throttled(with_cut.incidents()) == [("b", 1, 100)]
    assert with_cut.late_rows == 2 * (back - cut) and with_cut.dropped_rows == 0


def test_a_backlog_landing_newest_part_first_is_analysed_whole():
    """b's cut (100-220 s, a DBE at 130 s) drains in two parts, the newer one (160-220 s) first and
    the older one 20 s later, after the newer one was analysed in late windows: the older part is
    analysed too (not counted as behind what b has analysed), and the incident takes its start."""
    def arrive(t, host, _i):
        s = t - T
        if host == b"b" and 160 <= s < 220:
            return T + 230.5
        if host == b"b" and 100 <= s < 160:
            return T + 250.5
        return t + 0.5

    an, got = _whole(130, arrive)
    assert got[0].evidence["arrived_late"] is True and "over_gap_seconds" not in got[0].evidence["first"]
    assert an.late_rows == 2 * 120


def _whole(dbe: int, arrive):
    """The DBE fleet replayed in ``arrive``'s order at 1 s polls: b's DBE paged once with its
    true start, every row analysed (none dropped, none taken for a copy); (analyzer, incident)."""
    an = replay(_dbe_fleet(dbe), arrive, poll=1.0).an
    got = [r for r in an.incidents() if r.kind == "memory_errors"]
    assert [(r.host, r.gpu, r.start) for r in got] == [("b", 1, T + dbe)], got
    assert an.late_points == 0 and an.dropped_rows == 0
    assert not [r for r in an.incidents() if r.kind == "analysis_gap"]
    return an, got


def test_a_backlog_whose_poll_is_split_across_two_bodies_is_analysed_whole():
    """b's cut (100-220 s, a DBE at 150 s) drains in bodies that split one poll: its rows of
    100-160 s land at 230 s but GPU 1's row of 160 s, the last line of that poll, lands with the
    next body 10 s later, after the first was analysed in late windows (b idle meanwhile). That row
    is the rest of the poll, not a copy of it: analysed, nothing counted late or dropped."""
    def arrive(t, host, i):
        s = t - T
        if host == b"b" and 100 <= s <= 160 and not (s == 160 and i % 2 == 1):
            return T + 230.5
        if host == b"b" and 100 <= s < 220:
            return T + 240.5
        return t + 0.5

    an, _ = _whole(150, arrive)
    assert an.late_rows == 2 * 120


def test_a_node_cut_off_mid_write_has_the_rest_of_that_poll_analysed_with_its_backlog():
    """b is cut off while it writes its poll of 100 s: GPU 0's row of it lands and is analysed on
    time, GPU 1's lands with b's backlog (101-230 s) at 230 s, oldest first as its agent sends it.
    That row is the rest of the poll, never analysed: not a copy of GPU 0's. (A writer that sends
    its live rows before its backlog has GPU 1 analysed past 100 s already: the row is then taken
    for its own row reordered, and said in an info record.)"""
    def arrive(t, host, i):
        s = t - T
        if host == b"b" and (100 < s < 230 or (s == 100 and i % 2 == 1)):
            return T + 230.5
        return t + 0.5

    an, _ = _whole(150, arrive)
    assert an.late_rows > 2 * 119


def test_a_node_draining_its_backlog_slowly_is_one_stopped_reporting_record():
    """b is cut off for 5 minutes (100-400 s); from 410 s its spool drains slowly, oldest first,
    its live rows queued behind the backlog (a minute of rows every 30 s of wall time, caught up at
    720 s): b reports again from 410 s, though its newest rows stay minutes behind the clock while
    it drains. Its silence is one record, closed when it came back, not a second one for the drain;
    host a, on time throughout, has none."""
    def arrive(t, host, _i):
        s = t - T
        return max(t + 0.5, T + 410 + (s - 100) / 2) if host == b"b" and s >= 100 else t + 0.5

    an = replay(_dbe_fleet(150, seconds=800), arrive, poll=1.0).an
    stopped = [(r.host, r.start, r.end) for r in an.incidents() if r.kind == "node_stopped_reporting"]
    assert len(stopped) == 1 and stopped[0][:2] == ("b", T + 99), stopped
    assert T + 410 <= stopped[0][2] <= T + 412, stopped
    got = [r for r in an.incidents() if r.kind == "memory_errors"]
    assert [(r.host, r.start) for r in got] == [("b", T + 150)] and an.dropped_rows == 0


def test_an_analyzer_stall_is_no_node_s_silence():
    """The loop stalls for 100 s (a long analysis): hosts a and b's writes meanwhile were refused
    upstream (lost to the feed, as a subscription drops them) and their next ones land a second
    after the loop wakes; host c's were queued and are taken at once. That is the analyzer's
    deafness, not a and b stopping: no record for them. When c stops for real later, it is one
    record."""
    now = FakeClock(T)
    online = _loop(now, 1.0)
    for s in [*range(200), *range(300, 600)]:
        if s == 300:  # the stall's rows: c's landed, a's and b's did not
            for k in range(200, 300):
                online.feed(online.an.parser.feed(_rows("c", T + k)))
        now.t = T + s + 0.5
        for h in ("a", "b", "c"):
            if (s < 400 if h == "c" else s != 300):
                online.feed(online.an.parser.feed(_rows(h, T + s)))
        online.deliver(int(online.clock() * 1e9))
    stopped = [(r.host, r.start) for r in online.an.incidents() if r.kind == "node_stopped_reporting"]
    assert stopped == [("c", T + 399)], stopped


def test_copies_of_rows_already_analysed_are_one_info_record_not_a_page():
    """b's rows of 100-160 s land a second time at 300 s (a batch sent again after its answer was
    lost): not analysed twice, and not left unsaid: counted, and one informational analysis_gap
    record for b (never paged) with their stretch and count."""
    lines = _dbe_fleet(150, seconds=400)
    again = [x for x in lines if x[1] == b"b" and 100 <= x[0] // 10**9 - T < 160]

    def arrive(t, host, i):
        return T + 300.5 if i >= len(lines) else t + 0.5

    an = replay(lines + again, arrive, poll=1.0).an
    gaps = [r for r in an.incidents() if r.kind == "analysis_gap"]
    assert [(r.host, r.severity, r.start, r.end, r.evidence["rows"]) for r in gaps] == [
        ("b", "info", T + 100, T + 159, len(again))], gaps
    assert "copies" in gaps[0].evidence["why"] and an.late_points == len(again) and an.dropped_rows == 0
    got = [r for r in an.incidents() if r.kind == "memory_errors"]
    assert [(r.host, r.start) for r in got] == [("b", T + 150)]


# ---------------------------------------------------------------- clocks
T = 1_795_100_000


def _loop(clock, poll: float, influx=None) -> Online:
    """The online loop on ``clock`` (a FakeClock for both wall and monotonic time, or a Clock),
    poll and grace ``poll``, reading ``influx`` where given."""
    if isinstance(clock, FakeClock):
        clock = Clock(wall=clock, mono=clock)
    return Online(Config(), None, influx, None, None, Checkpoint(None), poll, poll, clock=clock)


def _rows(host: str, t: int, xid: bool = False) -> bytes:
    out = [f"gpu,host={host},gpu={g} up=1i,health_code=0i,power_watts=300 {t * 10**9}" for g in range(2)]
    if xid:
        out.append(f"gpu_event,host={host},gpu=0,type=xid code=79i {t * 10**9}")
    return ("\n".join(out) + "\n").encode()


def _pages_within(online, now: FakeClock, steps, xid_at: int, ahead: int = 0) -> float | None:
    """Run the loop a second per poll; host a on time (an XID 79 at ``xid_at``), host b stamped
    ``ahead`` seconds ahead; returns the seconds from the XID to its incident (None: none)."""
    for s in steps:
        now.t = T + s + 0.5
        online.feed(online.an.parser.feed(_rows("a", T + s, xid=T + s == xid_at)))
        online.feed(online.an.parser.feed(_rows("b", T + s + ahead)))
        online.deliver(int(online.clock() * 1e9))
        if any(r.kind == "gpu_lost" and r.host == "a" for r in online.an.incidents()):
            return now.t - xid_at
    return None


@pytest.mark.slow
def test_a_writer_stamping_the_future_delays_no_other_host():
    """Host b's clock runs 2 h ahead: the poll-sized windows stay, and host a's XID 79 is found
    within two polls."""
    now = FakeClock(T)
    online = _loop(now, 1.0)
    took = _pages_within(online, now, range(120), T + 60, ahead=7200)
    assert took is not None and took <= 2.0 + 0.5, took
    assert online.an.window == 1.0


@pytest.mark.slow
def test_a_step_of_the_analyzer_s_clock_freezes_no_window():
    """The analyzer's wall clock steps 2 h ahead for 8 s: the loop keeps the monotonic pace, and an
    XID 79 inside the step is found within two polls."""
    wall = FakeClock(T)
    mono = FakeClock(0.0)
    clock = Clock(wall=lambda: wall.t + (7200 if 60 <= mono.t < 68 else 0), mono=lambda: mono.t)
    online = _loop(clock, 1.0)
    found = None
    for s in range(120):
        wall.t, mono.t = T + s + 0.5, s + 0.5
        online.feed(online.an.parser.feed(_rows("a", T + s, xid=s == 62)))
        online.feed(online.an.parser.feed(_rows("b", T + s)))
        online.deliver(int(clock() * 1e9))
        if found is None and any(r.kind == "gpu_lost" for r in online.an.incidents()):
            found = s - 62
    assert found is not None and found <= 2, found
    assert online.an.late_points == 0 and online.an.late_rows == 0


# ---------------------------------------------------------------- --follow
@pytest.mark.skipif(__import__("shutil").which("influxd") is None, reason="needs influxd")
@pytest.mark.slow
def test_follow_reads_back_a_reappearing_host_s_gap(tmp_path):
    """``--follow`` reads ``[cursor, now - grace)`` each poll; host b is cut off, then its spool
    drains into InfluxDB with the old stamps, behind the cursor. When b reappears its gap is read
    back and analysed in its own time: the XID 79 inside the gap is found with its true start;
    nothing is read twice."""
    from gpufleet.analyzer.sources import Influx

    from tests.servers import InfluxDB1

    t0 = T
    with InfluxDB1(tmp_path / "influx") as db:
        db.create_db("fleet")
        now = FakeClock(t0)
        online = _loop(now, 10.0, Influx(db.url, "fleet"))
        held = []
        for s in range(0, 900, 10):
            t = t0 + s
            db.write("fleet", _rows("a", t))
            gap = 200 <= s < 500
            (held.append if gap else lambda b: db.write("fleet", b))(_rows("b", t, xid=s == 300))
            if s == 500:  # b is back: its spool drains with the old stamps, behind the cursor
                db.write("fleet", b"".join(held))
            now.t = t + 10.5
            online.read(int((now.t - 10) * 1e9), since=30)
            online.deliver(int(now.t * 1e9))
        got = [r for r in online.an.incidents() if r.kind == "gpu_lost"]
        assert [(r.host, r.gpu) for r in got] == [("b", 0)], got
        assert abs(got[0].start - (t0 + 300)) <= 10
        assert online.an.late_points == 0
        assert online.an.gpu_samples == 2 * 2 * 90  # every row read once
        stopped = [r for r in online.an.incidents() if r.kind == "node_stopped_reporting"]
        assert [r.host for r in stopped] == ["b"] and stopped[0].end is not None


@pytest.mark.skipif(__import__("shutil").which("influxd") is None, reason="needs influxd")
@pytest.mark.slow
def test_listen_analyses_rows_written_while_its_catch_up_read_their_time(tmp_path):
    """The listener's catch-up reads InfluxDB up to a cursor while writes wait in its queue, and
    drops the queued rows it read (the subscription forwards every write). Host b's last two
    seconds were in flight as it read (an agent's batch landing late, as on a loaded node): in
    InfluxDB after the read, stamped before the cursor, forwarded after it. They are analysed, not
    taken for rows the catch-up read; those are dropped: every row analysed once."""
    from gpufleet.analyzer.sources import Influx

    from tests.servers import InfluxDB1

    def rows(h: str, a: int, b: int) -> bytes:
        return b"".join(_rows(h, T + s) for s in range(a, b))

    with InfluxDB1(tmp_path / "influx") as db:
        db.create_db("fleet")
        db.write("fleet", rows("a", 0, 60) + rows("b", 0, 58))
        now = FakeClock(T + 61)
        online = _loop(now, 1.0, Influx(db.url, "fleet"))
        online.read(int((now.t - online.grace) * 1e9), since=120)  # the catch-up: up to T + 60
        handoff = online.cursor
        assert handoff == (T + 60) * 10**9 and online.an.gpu_samples == 2 * (60 + 58)
        db.write("fleet", rows("b", 58, 60))  # b's batch in flight lands
        # what the subscription forwarded meanwhile: a's last rows (read already) and b's batch
        online.feed(online.an.parser.feed(rows("a", 50, 60) + rows("b", 58, 60)), handoff)
        for s in range(60, 80):  # on time again
            now.t = T + s + 1.5
            online.feed(online.an.parser.feed(rows("a", s, s + 1) + rows("b", s, s + 1)))
            online.deliver(int(now.t * 1e9))
        an = online.an
        an.finish()
        assert an.gpu_samples == 2 * 2 * 80, an.gpu_samples  # each row once: none dropped, none twice
        assert an.late_points == 0 and an.dropped_rows == 0
        assert not [r for r in an.incidents() if r.kind == "analysis_gap"]


@pytest.mark.skipif(__import__("shutil").which("influxd") is None, reason="needs influxd")
@pytest.mark.slow
def test_a_long_read_back_waits_for_the_on_time_pages_and_goes_a_step_per_cycle(tmp_path, monkeypatch):
    """Host b is quiet for 25 minutes and its spool drains into InfluxDB as a's XID 79 lands on
    time. The cycle's on-time incident goes out first; b's gap is then read back a step
    (``READ_BACK_STEP``) per cycle when the cycle's share is spent, the checkpoint kept before
    what is still queued. b's XID inside the gap is found with its true start, and every row is
    analysed once."""
    from gpufleet.analyzer import online as online_mod
    from gpufleet.analyzer.sources import Influx

    from tests.servers import InfluxDB1

    monkeypatch.setattr(online_mod, "READ_BACK_SHARE", 0.0)  # one read per cycle
    t0 = T
    with InfluxDB1(tmp_path / "influx") as db:
        db.create_db("fleet")
        now = FakeClock(t0)
        ck = Checkpoint(tmp_path / "checkpoint.json")
        online = Online(Config(), None, Influx(db.url, "fleet"), None, None, ck, 10.0, 10.0,
                        clock=Clock(wall=now, mono=now))
        held, queued, back = [], [], 1700
        for s in range(0, 2000, 10):
            t = t0 + s
            db.write("fleet", _rows("a", t, xid=s == back))
            gap = 200 <= s < back
            (held.append if gap else lambda b: db.write("fleet", b))(_rows("b", t, xid=s == 900))
            if s == back:  # b is back: its spool drains with the old stamps, behind the cursor
                db.write("fleet", b"".join(held))
            now.t = t + 10.5
            online.read(int((now.t - 10) * 1e9), since=30)
            online.deliver(int(now.t * 1e9))
            if online.an.reread:
                left = online.gauges()["read_back_queued_seconds"]
                queued.append((s, left, ck.load(), online.an.reread[0][1]))
            if s == back + 10:  # a's XID, on time, went out before b's gap was read back whole
                out = {r.host for r in online.an.incidents()
                       if r.kind == "gpu_lost" and r.id in online.written}
                assert out == {"a"}, out
        # 25 minutes of b in reads of READ_BACK_STEP, one per cycle: queued for two more cycles
        assert [q[0] for q in queued] == [back, back + 10], queued
        assert all(done <= first for _s, _n, done, first in queued), queued
        assert queued[0][1] > queued[1][1] > 0 and online.gauges()["read_back_queued_seconds"] == 0
        got = {r.host: r for r in online.an.incidents() if r.kind == "gpu_lost"}
        assert sorted(got) == ["a", "b"] and got["b"].id in online.written
        assert abs(got["b"].start - (t0 + 900)) <= 10 and got["b"].evidence.get("arrived_late")
        assert online.an.late_points == 0
        assert online.an.gpu_samples == 2 * 2 * 200  # every row read once
        assert ck.load() == int((now.t - 10) * 1e9)  # nothing queued: the checkpoint is the cursor's


@pytest.mark.skipif(__import__("shutil").which("influxd") is None, reason="needs influxd")
@pytest.mark.slow
def test_follow_finds_rows_written_behind_its_cursor_by_a_host_that_never_went_quiet(tmp_path):
    """Hosts a and b write their gpu rows on time; b's event stream is delayed (its XID 79s at
    300 s and 310 s land in InfluxDB 100 s and 160 s later, behind the cursor, the first again
    after that) while b never goes quiet. The count of b's recent rows grows, that bucket is read
    back and only the new rows are analysed, in b's own time: each XID is paged once with its true
    start, marked as found late. Host a's XID, on time, is paged as before. Every row is analysed
    once."""
    from gpufleet.analyzer.sources import Influx

    from tests.servers import InfluxDB1

    t0 = T
    with InfluxDB1(tmp_path / "influx") as db:
        db.create_db("fleet")
        now = FakeClock(t0)
        online = _loop(now, 10.0, Influx(db.url, "fleet"))
        for s in range(0, 900, 10):
            t = t0 + s
            db.write("fleet", _rows("a", t, xid=s == 100))
            db.write("fleet", _rows("b", t))
            late = {400: (0, 300), 470: (1, 310), 500: (0, 300)}  # the last: the first again (a copy)
            if s in late:  # b's event rows, held by a spool, land with their own stamps
                g, at = late[s]
                line = f"gpu_event,host=b,gpu={g},type=xid code=79i {(t0 + at) * 10**9}\n"
                db.write("fleet", line.encode())
            now.t = t + 10.5
            online.read(int((now.t - 10) * 1e9), since=30)
            online.deliver(int(now.t * 1e9))
        got = sorted((r for r in online.an.incidents() if r.kind == "gpu_lost"), key=lambda r: r.host)
        assert [(r.host, r.gpu) for r in got] == [("a", 0), ("b", 0), ("b", 1)], got
        a, b0, b1 = got
        assert abs(a.start - (t0 + 100)) <= 10 and not a.evidence.get("arrived_late")
        for b, at in ((b0, 300), (b1, 310)):
            assert abs(b.start - (t0 + at)) <= 10, b.start - t0
            assert b.evidence.get("arrived_late"), b.evidence
            assert b.evidence.get("found_after_seconds", 0) >= 90, b.evidence
        # the late rows only: not the bucket's rows read already, nor the first XID when the
        # bucket grew again, nor its copy (InfluxDB keeps one point per series and time)
        assert online.late_writes == 2
        assert online.an.late_points == 0
        assert online.an.gpu_samples == 2 * 2 * 90  # every gpu row analysed once
        assert online.rows_in == 2 * 2 * 90 + 3


# ---------------------------------------------------------------- --listen after its catch-up
@pytest.mark.slow
@pytest.mark.skipif(__import__("shutil").which("influxd") is None, reason="needs influxd")
def test_listen_analyses_a_backlog_stamped_before_its_catch_up_ended(tmp_path):
    """``--listen --influx-url`` catches up from InfluxDB on start, then takes writes. Host b was
    cut off before the analyzer started; after the catch-up, b's spool drains (written to InfluxDB,
    forwarded by the subscription) with stamps from before where the catch-up read to. Those rows
    are analysed in b's own time like any backlog: none dropped, its XID 79 found with its true
    start. Only what was queued while the catch-up read, and so was read by it, is left out."""
    import subprocess
    import sys

    import requests

    from gpufleet import records
    from tests.agent_support import ROOT, wait_for
    from tests.servers import InfluxDB1, free_port

    now = int(time.time())
    cut, xid = now - 90, now - 60

    def rows(h: str, a: int, b: int, xid_at: int | None = None) -> bytes:
        return b"".join(_rows(h, t, xid=t == xid_at) for t in range(a, b))

    with InfluxDB1(tmp_path / "influx") as db:
        db.create_db("fleet")
        db.write("fleet", rows("a", now - 180, now) + rows("b", now - 180, cut))
        port = free_port()
        cmd = [sys.executable, "-m", "gpufleet", "analyze", "--listen", f"127.0.0.1:{port}", "--influx-url",
               db.url, "--influx-db", "fleet", "--since", "5m", "--poll", "1s", "--grace", "1s",
               "--state", str(tmp_path / "state.db"), "--out", str(tmp_path / "out.jsonl")]
        proc = subprocess.Popen(cmd, stdout=open(tmp_path / "an.out", "ab"), stderr=subprocess.STDOUT,
                                cwd=ROOT, start_new_session=True)
        url = f"http://127.0.0.1:{port}"

        def gauges():
            try:
                text = requests.get(url + "/metrics", timeout=5).text
            except requests.RequestException:
                return {}
            return {k: float(v) for k, v in re.findall(r"^gpufleet_analyzer_(\w+) (\S+)$", text, re.M)}

        def post(body: bytes) -> None:
            r = requests.post(url + "/write", params={"db": "fleet"}, data=body, timeout=10)
            assert r.status_code == 204, r.text

        try:
            before = 2 * (180 + cut - (now - 180))  # a's and b's GPU rows read by the catch-up
            assert wait_for(lambda: gauges().get("rows_total", 0) >= before, 60, step=0.2), (
                gauges(), (tmp_path / "an.out").read_text())
            for _ in range(4):  # both hosts live again, on time; b's backlog not landed yet
                t = int(time.time())
                live = rows("a", t, t + 1) + rows("b", t, t + 1)
                db.write("fleet", live)
                post(live)
                time.sleep(max(0.0, t + 1 - time.time()))
            backlog = rows("b", cut, now, xid_at=xid)  # the spool drains, oldest first
            db.write("fleet", backlog)
            post(backlog)
            want = before + 4 * 4 + 2 * (now - cut)

            def found():
                incs = records.read(tmp_path / "out.jsonl") if (tmp_path / "out.jsonl").exists() else []
                return [r for r in incs if r.kind == "gpu_lost"]

            assert wait_for(lambda: found() and gauges().get("gpu_samples_total") == want, 30, step=0.5), (
                {k: v for k, v in gauges().items() if not k.startswith("listen")}, want, found(),
                (tmp_path / "an.out").read_text()[-2000:])
            got = found()
            assert [(r.host, r.gpu) for r in got] == [("b", 0)] and abs(got[0].start - xid) <= 1, got
            g = gauges()
            assert g["gap_rows_dropped_total"] == 0 and g["late_points_total"] == 0, g
        finally:
            proc.terminate()
            try:
                proc.wait(15)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(5)


def test_a_run_its_host_s_progress_ended_goes_on_when_the_next_late_hits_follow_it():
    """A GPU's run of hits (0-440 s; a 600 s dwell) is ended by its host's progress before the
    host's next hits land (a late window of another stream took the host past it); hits from 450 s,
    10 s after it, go on with it as in time order: one incident from 0 s, not one from 450 s."""
    import numpy as np
    from gpufleet.analyzer.detectors.base import Hits
    from gpufleet.analyzer.engine import Engine
    from gpufleet.analyzer.frame import Registry

    reg = Registry()
    g = reg.gpu({"host": "a", "gpu": "0"})
    eng = Engine({"cooling_degradation": {"dwell_seconds": 600.0, "gap_seconds": 120.0,
                                          "resolve_seconds": 3600.0}})

    def hits(ts):
        n = len(ts)
        return Hits("cooling_degradation", np.zeros(n, np.int64), np.full(n, g), np.full(n, -1),
                    np.asarray(ts, float), np.ones(n), np.zeros(n, bool))

    eng.add(hits(range(0, 450, 10)), reg, [])
    eng.advance(440.0)
    eng.host_progress = np.array([700.0])
    eng.advance(700.0)  # the host's progress is past the run's gap: the run ends, unpaged
    assert eng.incidents() == []
    eng.add(hits(range(450, 1100, 10)), reg, [], late=True)
    eng.advance(1100.0)
    got = [(r.kind, r.host, r.gpu, r.start) for r in eng.incidents()]
    assert got == [("cooling_degradation", "a", 0, 0.0)]


@pytest.mark.slow
def test_online_learns_the_cooling_baselines_batch_learns(fleet):
    """Windows a poll long learn each GPU's cooling baselines and each model's slope as batch's
    five-minute windows do: the same rows, against the same whole-minute common mode, with the
    state as of the same batch window (the hosts batch itself counted copies of are left out)."""
    lines, *_ = fleet
    an = Analyzer()
    an.feed_bytes(b"\n".join(line for _t, _h, line in lines) + b"\n")
    an.finish()
    online = replay(lines, lambda t, _h, _i: t + 1.0, poll=POLL)
    online.an.finish()

    def learned(a):
        det = next(d for d in a.detectors if d.kind == "cooling_degradation")
        reg = a.reg
        names = {m: reg.model_name(m) for m in det.slopes_}
        out = {("slope", names[m]): v for m, v in det.slopes_.items()}
        for band in ("", "lo_", "hi_"):
            for e, v in getattr(det, f"offset_{band}").items():
                if reg.gpu_host[e] not in an.late_per_host:
                    out[(band, reg.gpu_host[e], int(reg.gpu_index[e]))] = v
        return out

    want, got = learned(an), learned(online.an)
    assert len(want) > 3 * 16 and set(got) == set(want)
    assert all(abs(got[k] - want[k]) < 1e-6 for k in want), sorted(
        (k, want[k], got[k]) for k in want if abs(got[k] - want[k]) >= 1e-6)[:5]


def _held_after(budget: int) -> Analyzer:
    """Two hosts 20 min in time order through the batch path, 1-minute windows, rows held 60 s
    and, past that, while they fit in ``budget`` bytes."""
    cfg = Config()
    cfg.analyzer.update(window_seconds=60.0, lateness_seconds=10.0, peers_hold_seconds=60.0,
                        peers_hold_bytes=budget)
    an = Analyzer(cfg)
    for s in range(0, 1200, 10):
        an.feed_bytes(_rows("a", T + s) + _rows("b", T + s))
    return an


def test_analysed_rows_are_held_past_peers_hold_only_while_they_fit_the_budget():
    """``peers_hold_seconds`` is a floor; older rows stay, the oldest let go first, while all the
    rows held fit in ``peers_hold_bytes`` (so a host cut off longer is judged with its peers)."""
    def held(an):
        blocks = [b for m in an.hist for b in an.hist[m]]
        assert an.held_bytes == sum(b.nbytes for b in blocks)  # the count kept is what is held
        gpu = [b for b in an.hist["gpu"]]
        return min(b.tmin for b in gpu) / 1e9 - T, max(b.tmax for b in gpu) / 1e9 - T, an.held_bytes

    cursor = _held_after(0).window_start["gpu"] - T
    first, last, none = held(_held_after(0))
    assert cursor - 60 <= first < cursor and last == cursor - 10  # the floor only
    first, last, everything = held(_held_after(1 << 30))
    assert first == 0 and last == cursor - 10  # all of it
    first, last, some = held(_held_after(everything // 2))
    assert none < some <= everything // 2 and 60 < first < cursor - 60 and last == cursor - 10


def test_rows_held_for_peers_take_less_memory_and_read_back_unchanged():
    """A held block keeps a column of one value as that value, one float32 holds exactly as
    float32, entity ids as int32; the rows read back are the rows held, float64 and int64 in
    arrays of their own."""
    from gpufleet.analyzer.pipeline import _Block, _compact, _widened

    rng = np.random.default_rng(3)
    n = 1000
    cols = {
        "one": np.full(n, 7.0),
        "none": np.full(n, np.nan),
        "temp": rng.integers(30, 90, n).astype(float),
        "gaps": np.where(rng.random(n) < 0.3, np.nan, rng.integers(0, 10, n).astype(float)),
        "ratio": rng.random(n),
        "bytes": 2.0**40 + np.arange(n),
        "zeros": np.where(np.arange(n) % 2, 0.0, -0.0),  # not one value, bit for bit
        "huge": np.full(n, 1e300) + np.arange(n) * 1e290,  # beyond float32's range
    }
    b = _Block(rng.integers(0, 500, n), np.arange(n, dtype=np.int64) * 10**9, cols,
               {"job": np.array(["j1", None] * (n // 2), dtype=object)})
    held = _compact(b, late=True)
    # int32 ids and int64 times, two values, two float32 and two float64 columns, the text's pointers
    assert held.late and held.nbytes == 12 * n + 2 * 8 + 3 * 4 * n + 3 * 8 * n + 8 * n < 0.65 * b.nbytes
    assert held.cols["one"].strides == (0,) and held.cols["none"].strides == (0,)
    assert held.cols["temp"].dtype == np.float32 and held.cols["gaps"].dtype == np.float32
    assert held.cols["ratio"].dtype == np.float64 and held.cols["bytes"].dtype == np.float64
    assert held.cols["zeros"].dtype == np.float32 and held.cols["huge"].dtype == np.float64
    back = _widened(held)
    assert back.ent.dtype == np.int64 and np.array_equal(back.ent, b.ent) and np.array_equal(back.t, b.t)
    for k, v in cols.items():
        got = back.cols[k]
        assert got.dtype == np.float64 and got.flags.writeable and np.array_equal(got, v, equal_nan=True), k
        assert np.array_equal(np.signbit(got), np.signbit(v)), k
    assert list(back.text["job"]) == list(b.text["job"])


def test_a_long_backlog_s_gpu_windows_see_its_own_bmc_rows(fleet, monkeypatch):
    """A backlog's gpu late windows see the host's own inlet readings of their time (the cooling
    model takes the inlet out), however the BMC stream's own late windows stand: all of them cut
    before the first gpu window (a backlog's host-level streams go first), or not cut yet, or its
    rows landing behind. Only the first window, cut before any of the host's late BMC rows has
    landed (they come a body later here), cannot wait for them: nothing says they will come."""
    from gpufleet.analyzer import pipeline

    lines, _want, t0, _residual = fleet
    seen = []
    made = pipeline.Window

    def spy(*a, **k):
        w = made(*a, **k)
        if w.late_hosts and len(w.gpu):
            b, g = w.bmc, w.gpu
            mine = np.isin(b.ent, list(w.late_hosts)) & (b.t >= w.start) & (b.t < w.end)
            own = np.isin(w.node_of[g.ent], list(w.late_hosts)) & (g.t >= w.start) & (g.t < w.end)
            # the polls of the window with gpu rows of the late host, and those with its inlet
            seen.append((w.start, set(np.round(g.t[own]).tolist()), set(np.round(b.t[mine]).tolist())))
        return w

    monkeypatch.setattr(pipeline, "Window", spy)

    def arrive(t, host, _i):  # gpu0003 cut off 30 minutes, its spool drained as it is back
        return t0 + 2430.0 if host == b"gpu0003" and t0 + 600 <= t < t0 + 2400 else t + 1.0

    online = replay(lines, arrive, poll=POLL, burst=1000)
    assert online.an.dropped_rows == 0 and len(seen) > 3
    missing = [(round(s - t0), len(g - b)) for s, g, b in seen[1:] if g - b]
    assert not missing, missing


@pytest.mark.slow
def test_a_late_nvlink_window_holds_its_late_host_s_rows_alone(fleet, monkeypatch):
    """No NVLink detector reads the peers' rows (each link is judged against its own GPU's links
    and the rates learned on time): a late NVLink window's table holds the late host's rows alone,
    while its gpu late windows hold the peers' rows of their time (cooling judges against them)."""
    from gpufleet.analyzer import pipeline

    lines, _want, t0, _residual = fleet
    hosts_in: dict[str, list[set[int]]] = {"gpu": [], "nvlink": []}
    made = pipeline.Window

    def spy(*a, **k):
        w = made(*a, **k)
        if w.late_hosts:
            if len(w.nvlink):
                gpu = w.reg.link_arrays()[0][w.nvlink.ent]
                hosts_in["nvlink"].append(set(w.node_of[gpu].tolist()) - w.late_hosts)
            if len(w.gpu):
                hosts_in["gpu"].append(set(w.node_of[w.gpu.ent].tolist()) - w.late_hosts)
        return w

    monkeypatch.setattr(pipeline, "Window", spy)

    def arrive(t, host, _i):  # gpu0002 cut off 10 minutes, its spool drained as it is back
        return t0 + 1230.0 if host == b"gpu0002" and t0 + 600 <= t < t0 + 1200 else t + 1.0

    online = replay(lines, arrive, poll=POLL)
    assert online.an.late_rows > 0 and online.an.dropped_rows == 0
    assert hosts_in["nvlink"] and not any(hosts_in["nvlink"]), hosts_in["nvlink"]
    assert any(hosts_in["gpu"])  # the peers are there where a detector reads them


def _pcie_fleet(minutes: int = 40, per_poll: int = 12) -> list:
    """Hosts a and b, 2 GPUs each, a row every 10 s from T, loaded at PCIe gen 5 x16; a's GPU 0
    takes ``per_poll`` receiver errors every poll: 72 a minute, below the 120 that page."""
    lines = []
    for s in range(0, minutes * 60, 10):
        for h in ("a", "b"):
            for g in range(2):
                n = (s // 10) * per_poll if (h, g) == ("a", 0) else 0
                lines.append(((T + s) * 10**9, h.encode(), (
                    f"gpu,host={h},gpu={g} up=1i,power_watts=300,utilization_gpu_ratio=0.9,"
                    f"pcie_link_gen=5i,pcie_link_gen_max=5i,pcie_link_width=16i,pcie_link_width_max=16i,"
                    f"pcie_receiver_errors_total={n}i {(T + s) * 10**9}").encode()))
    return lines


@pytest.mark.parametrize("late", [False, True])
def test_a_late_host_s_window_does_not_count_its_peers_rows_twice(late):
    """a's GPU 0 takes PCIe errors at 72 a minute, steadily, under the bar of 120 over 10 min:
    never a page, on time or while b's rows of minutes 10-19 land 9 minutes late (b's late
    windows hold a's rows of that time as peers; a's errors there are not counted a second time)."""
    def arrive(t, host, _i):
        if late and host == b"b" and 600 <= t - T < 1140:
            return T + 1150.0
        return t + 1.0

    an = replay(_pcie_fleet(), arrive, poll=10.0).an
    an.finish()
    assert (an.late_rows > 100) == late and an.dropped_rows == 0
    assert [(r.kind, r.host, r.gpu) for r in an.incidents() if r.kind == "pcie_degradation"] == []


@pytest.mark.slow
def test_which_minutes_a_warm_rack_s_gpus_near_their_limits_does_not_depend_on_the_window(tmp_path):
    """The chaos fleet of seed 23 has a rack whose inlet runs 8 °C above the room, steadily, while
    its GPUs come near their slowdown temperature in some minutes: the note says so the same
    way in batch (five-minute windows) and online (windows a poll long), since the minutes near
    the limits are judged per minute, not per window."""
    out = tmp_path / "sim"
    assert main(["sim", "--nodes", "8", "--duration", "2h", "--seed", "23", "--scenario", "chaos",
                 "--out", str(out), "--no-progress"]) == 0
    path = out / "telemetry.lp.gz"

    def notes(recs):
        return [(r.kind, r.evidence["first"]["setting"]) for r in recs if r.kind == "inlet_above_room"]

    online = replay(lines_of(path), lambda t, _h, _i: t + 1.0, poll=POLL)
    online.an.finish()
    want = notes(batch(path))
    assert want == [("inlet_above_room", "rack r002 inlet 8 °C above the room")]
    assert notes(online.an.incidents()) == want


def test_a_late_host_s_gpus_are_judged_with_its_inlet_landed_in_time(monkeypatch):
    """Host b's GPU rows of minute 10 land after a's of minute 25 (behind the GPU cursor: late),
    its BMC inlet rows of that minute in time, with a's (the BMC stream's cursor behind the GPU
    stream's, as a node's BMC rows written after its GPU rows). b's late window reads that inlet,
    still in the BMC stream's buffer: the cooling model takes the room's air out of its GPUs'
    temperature (no inlet read as NaN)."""
    from gpufleet.analyzer.detectors.cooling_degradation import CoolingDegradation

    def rows(host, kind, lo, hi):
        out = []
        for s in range(lo, hi, 10):
            ns = (T + s) * 10**9
            if kind == "gpu":
                out += [f"gpu,host={host},gpu={g} up=1i,power_watts=300,temperature_gpu_celsius=50i {ns}"
                        for g in range(2)]
            else:
                out.append(f"bmc_sensor,host={host},sensor=Inlet\\ Temp,sensor_type=Temperature,unit=C "
                           f"value=24.0,state_code=0i {ns}")
        return out

    def in_time(*parts):
        return sorted((x for p in parts for x in p), key=lambda x: int(x.rsplit(" ", 1)[1]))

    order = [in_time(*(rows(h, k, 0, 600) for h in "ab" for k in ("gpu", "bmc"))),
             rows("a", "gpu", 600, 1560), rows("a", "bmc", 600, 700), rows("b", "bmc", 600, 700),
             rows("b", "gpu", 600, 800),  # (b's window of minute 10 is due: its rows passed its end)
             in_time(rows("a", "bmc", 700, 1560), rows("b", "bmc", 700, 1560), rows("b", "gpu", 800, 1560))]
    seen = []
    inlet = CoolingDegradation._inlet

    def spy(self, window):
        got = inlet(self, window)
        tab = window.gpu
        mine = (np.isin(window.node_of[tab.ent], list(window.late_hosts or ())) & tab.in_window()
                & (tab.t >= T + 600) & (tab.t < T + 700))
        seen.append(got[mine])
        return got

    monkeypatch.setattr(CoolingDegradation, "_inlet", spy)
    cfg = Config()
    cfg.analyzer.update(lateness_seconds=30.0)
    an = Analyzer(cfg)
    for part in order:
        an.feed_bytes(("\n".join(part) + "\n").encode())
    an.finish()
    got = np.concatenate(seen)
    assert len(got) == 20, "b's rows of minute 10 were not analysed late, each once"
    assert (got == 24.0).all(), got


def test_a_fault_across_its_node_s_silence_is_one_incident_when_its_live_rows_land_first():
    """b's GPU 1 throttles thermally all along. b is cut off for 70 minutes (longer than the
    hour thermal throttling takes to resolve); its live rows land first, its backlog after. The
    silence was no data, not a quiet fault: one incident, as in batch, not a second page."""
    lines = []
    for s in range(0, 6000, 10):
        ns = (T + s) * 10**9
        for h in ("a", "b"):
            for g in range(2):
                hot = int(h == "b" and g == 1)
                lines.append((ns, h.encode(), (
                    f"gpu,host={h},gpu={g} up=1i,power_watts=650,power_limit_watts=700,"
                    f"utilization_gpu_ratio=1,clock_event_hw_thermal={hot}i,temperature_gpu_celsius="
                    f"{88 if hot else 60}i,temperature_slowdown_celsius=90i {ns}").encode()))
    cut, back = T + 600, T + 600 + 4200

    def arrive(t, host, _i):
        return back + 120.0 if host == b"b" and cut <= t < back else t + 1.0

    def throttling(recs):
        return [(r.host, r.gpu, round(r.start)) for r in recs if r.kind == "thermal_throttle"]

    want = [("b", 1, T)]
    path_lines = "\n".join(x.decode() for _t, _h, x in lines) + "\n"
    an = Analyzer()
    an.feed_bytes(path_lines.encode())
    an.finish()
    assert throttling(an.incidents()) == want
    online = replay(lines, arrive, poll=10.0)
    online.an.finish()
    got = online.an.incidents()
    assert [r.host for r in got if r.kind == "node_stopped_reporting"] == ["b"]  # the silence was seen
    assert throttling(got) == want, throttling(got)
