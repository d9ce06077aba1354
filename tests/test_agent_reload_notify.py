"""systemd's reload protocol, read from a real notify socket (a unix datagram socket)."""

from __future__ import annotations

import signal
import time

import pytest

from tests.agent_support import NotifySocket, start_agent, stop_agent, wait_for


@pytest.mark.slow
def test_reload_sends_reloading_with_monotonic_usec_then_ready_accepted_or_rejected(tmp_path):
    notify = NotifySocket(tmp_path)
    sock_path = notify.path
    cfg = tmp_path / "agent.toml"
    good = (f'[agent]\nbackend = "sim"\ninterval = 1\nhost = "n1"\ncollectors = ["gpu"]\n'
            f'[file]\ndir = "{tmp_path / "lp"}"\n')
    cfg.write_text(good)
    proc = start_agent(tmp_path, "--config", str(cfg), env={"NOTIFY_SOCKET": sock_path})
    msgs, drain = notify.msgs, notify.drain

    def reload_messages(start: int) -> tuple[dict, int]:
        """The RELOADING=1 datagram after ``start`` (as key=value) and the index of the READY=1 after it."""
        i = next(k for k in range(start, len(msgs)) if "RELOADING=1" in msgs[k].split("\n"))
        fields = dict(line.split("=", 1) for line in msgs[i].split("\n"))
        ready = next(k for k in range(i + 1, len(msgs)) if "READY=1" in msgs[k].split("\n"))
        return fields, ready

    try:
        assert wait_for(lambda: any("READY=1" in m for m in drain()), 20)
        for text, outcome in ((good + "[bogus]\n", "reload rejected"),  # rejected: the old config stays
                              (good.replace('"n1"', '"n2"'), "configuration reloaded")):
            start = len(drain())
            cfg.write_text(text)
            t_sent = time.clock_gettime_ns(time.CLOCK_MONOTONIC) // 1000
            proc.send_signal(signal.SIGHUP)

            def reloaded(start=start):
                drain()
                try:
                    reload_messages(start)
                    return True
                except StopIteration:
                    return False

            assert wait_for(reloaded, 10), msgs[start:]
            fields, ready = reload_messages(start)
            # MONOTONIC_USEC: CLOCK_MONOTONIC in µs, taken when the reload began (same clock here)
            usec = int(fields["MONOTONIC_USEC"])
            assert t_sent <= usec <= t_sent + 5_000_000
            assert f"STATUS={outcome}" in msgs[ready]
            assert proc.poll() is None
        assert stop_agent(proc) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
        notify.close()


def test_a_notify_socket_nobody_reads_never_blocks_the_agent(tmp_path):
    import socket

    from gpufleet.agent.notify import Notifier

    path = str(tmp_path / "notify")
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as rx:
        rx.bind(path)  # bound, never read: its queue fills after a few hundred datagrams
        n = Notifier(path)
        t = time.monotonic()
        sent = [n.status("x" * 200) for _ in range(5000)]
        n.close()
    assert time.monotonic() - t < 5
    assert sent[0] and not all(sent), "the first go through, the overflow is dropped, not waited on"
