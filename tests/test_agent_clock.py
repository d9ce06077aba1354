"""The agent's clocks: ticks are scheduled on the monotonic clock and rows stamped with the wall
clock, so a step back of the wall clock (60 s, then more than 120 s, which the watchdog would
turn into a restart) skips no tick and no watchdog ping. The clocks are injected: the machine's
clock is never changed."""

from __future__ import annotations

import threading
import time

import pytest
from gpufleet.agent import config as agent_config
from gpufleet.agent.daemon import Daemon
from gpufleet.agent.notify import Notifier

from tests.agent_support import NotifySocket, read_lp_dir


@pytest.mark.slow
def test_a_wall_clock_stepping_back_misses_no_tick_and_no_watchdog_ping(tmp_path):
    cfg = tmp_path / "agent.toml"
    cfg.write_text(f'[agent]\nbackend = "sim"\ninterval = 1\nhost = "n1"\ncollectors = ["gpu"]\n'
                   f'[file]\ndir = "{tmp_path / "lp"}"\n')
    notify = NotifySocket(tmp_path)
    t0 = time.monotonic()
    steps = [(1.5, 60), (3.5, 180)]  # (seconds into the run, seconds the wall clock steps back)

    def wall_ns() -> int:
        back = sum(s for at, s in steps if time.monotonic() - t0 >= at)
        return time.time_ns() - back * 10**9

    daemon = Daemon(lambda: agent_config.load(cfg), notifier=Notifier(notify.path), wall_ns=wall_ns)
    run_s = 6.4
    stopper = threading.Timer(run_s, daemon._on_stop, args=(None, None))
    stopper.start()
    try:
        assert daemon.run() == 0
    finally:
        stopper.cancel()
        msgs = notify.drain()
        notify.close()
    ticks = daemon.agent.ticks
    assert ticks >= int(run_s) - 1, ticks  # one per second all along: 6 or 7 (none lost at a step)
    pings = sum(1 for m in msgs if m.startswith("WATCHDOG=1"))
    assert pings == ticks
    in_order = [p.time for p in read_lp_dir(tmp_path / "lp") if p.measurement == "gpu"]
    seq = list(dict.fromkeys(in_order))  # each tick's stamp, in the order written
    assert len(seq) == ticks
    # the rows carry the wall clock: it went back 60 s, then 180 s (less the second between ticks)
    diffs = [round((b - a) / 1e9) for a, b in zip(seq, seq[1:], strict=False)]
    # (a tick late by a second on a loaded machine shortens a step's difference by one)
    back = sorted(d for d in diffs if d < 0)
    assert len(back) == 2 and -181 <= back[0] <= -178 and -61 <= back[1] <= -58, diffs
    assert all(d == 1 for d in diffs if d > 0), diffs
