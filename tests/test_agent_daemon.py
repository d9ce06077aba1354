"""The daemon as a process: sd_notify, SIGHUP reload, SIGTERM within 5 s, an isolated failing collector."""

from __future__ import annotations

import signal
import time

import pytest

from tests.agent_support import NotifySocket, read_lp_dir, start_agent, stop_agent, wait_for


@pytest.mark.slow
def test_notify_reload_stop_and_failing_collector(tmp_path):
    notify = NotifySocket(tmp_path)
    sock_path = notify.path
    cfg = tmp_path / "agent.toml"
    cfg.write_text(f'[agent]\nbackend = "sim"\ninterval = 1\nhost = "n1"\n'
                   f'collectors = ["gpu", "host", "tests.agent_support:Broken"]\n'
                   f'[file]\ndir = "{tmp_path / "lp"}"\n')
    proc = start_agent(tmp_path, "--config", str(cfg), env={"NOTIFY_SOCKET": sock_path})
    msgs, drain = notify.msgs, notify.drain

    try:
        assert wait_for(lambda: any("WATCHDOG=1" in m for m in drain()), 20)
        assert any(m.startswith("READY=1") for m in msgs)
        assert msgs.index(next(m for m in msgs if m.startswith("READY=1"))) < len(msgs)
        cfg.write_text(cfg.read_text() + "[bogus]\n")  # invalid: rejected, the old config keeps running
        proc.send_signal(signal.SIGHUP)
        time.sleep(1.5)
        n = len(drain())
        assert proc.poll() is None and wait_for(lambda: len(drain()) > n and "WATCHDOG=1" in msgs[-1], 5)
        cfg.write_text(cfg.read_text().replace("[bogus]\n", "").replace('host = "n1"', 'host = "n2"'))
        proc.send_signal(signal.SIGHUP)
        assert wait_for(lambda: any(p.tags.get("host") == "n2" for p in read_lp_dir(tmp_path / "lp")), 8)
        t0 = time.monotonic()
        rc = stop_agent(proc)
        assert rc == 0 and time.monotonic() - t0 < 5.0
        drain()
    finally:
        if proc.poll() is None:
            proc.kill()
        notify.close()
    assert any("STOPPING=1" in m for m in msgs)
    assert any("STATUS=tick" in m for m in msgs)
    log = (tmp_path / "agent.log").read_text()
    assert "reload rejected" in log and "bogus" in log and "configuration reloaded" in log
    points = read_lp_dir(tmp_path / "lp")
    col = {(p.tags["collector"], p.fields["success"]) for p in points
           if p.measurement == "gpufleet_collector"}
    assert ("broken", 0) in col and ("gpu", 1) in col and ("host", 1) in col
    assert any(p.measurement == "gpu" for p in points)


@pytest.mark.slow
def test_sigterm_with_backend_down_exits_within_5s(tmp_path):
    from tests.servers import free_port

    proc = start_agent(tmp_path, "--backend", "sim", "--interval", "1", "--exporter", "influx",
                       "--influx-url", f"http://127.0.0.1:{free_port()}", "--spool-dir", str(tmp_path / "sp"))
    time.sleep(3.0)
    t0 = time.monotonic()
    assert stop_agent(proc) == 0
    assert time.monotonic() - t0 < 5.5
    from gpufleet.agent.spool import Spool

    assert Spool(tmp_path / "sp").points > 0  # kept for the next start
