"""Notifier behaviour against a local HTTP receiver: once, in order, grouped, retried, persisted."""

from __future__ import annotations

import dataclasses
import logging
import time

from gpufleet.analyzer.alerting import Notifier, load_sinks

from gpufleet.records import to_rfc3339
from tests.alerting_receiver import T0, Receiver, fast, incident


def webhook(rx, **kw):
    return load_sinks([fast({"type": "webhook", "url": rx.url + "/hook"}, **kw)], [])


def events(rx):
    return [(r["json"]["key"], r["json"]["status"]) for r in rx.requests if r.get("status") == 200]


def test_firing_then_resolved_once_in_order_and_fast(tmp_path):
    with Receiver() as rx:
        n = Notifier(webhook(rx), tmp_path / "state.db")
        try:
            inc = incident(id="inc-1")
            t = time.monotonic()
            assert n.update([inc], now=T0) == 1
            got = rx.wait_for(1)
            assert got and got[0]["t"] - t < 2.0, "incident -> first delivery attempt must be under 2 s"
            for _ in range(3):  # the analyzer passes the same incident on every pass
                assert n.update([inc], now=T0 + 10) == 0
            assert n.update([dataclasses.replace(inc, end=T0 + 120)], now=T0 + 130) == 1
            assert n.flush(5)
        finally:
            n.close()
    assert events(rx) == [("inc-1", "firing"), ("inc-1", "resolved")]
    assert rx.requests[1]["json"]["ends_at"] == to_rfc3339(T0 + 120)


def test_node_wide_fault_pages_once_and_resolves_when_all_members_end(tmp_path):
    incs = [incident(kind="cooling_degradation", gpu=g, start=T0 + g, severity="warning") for g in range(8)]
    with Receiver() as rx:
        with Notifier(webhook(rx), tmp_path / "s.db") as n:
            assert n.update(incs, now=T0 + 10) == 1
            assert n.flush(5)
            fired = rx.requests[0]["json"]
            assert fired["status"] == "firing" and fired["gpus"] == list(range(8))
            assert fired["summary"].startswith("node01 GPUs 0-7 runs hotter")
            assert "(8 incidents)" in fired["summary"]
            ended = [dataclasses.replace(i, end=T0 + 100) for i in incs]
            n.update(ended[:7], now=T0 + 110)
            n.flush(5)
            assert len(rx.requests) == 1, "no resolve while one member is still active"
            n.update(ended, now=T0 + 120)
            assert n.flush(5)
        # a different host, or the same host much later, is another page
        with Notifier(webhook(rx), tmp_path / "s.db") as n:
            n.update([incident(kind="cooling_degradation", host="node02"),
                      incident(kind="cooling_degradation", start=T0 + 3600)], now=T0 + 3600)
            assert n.flush(5)
    statuses = [r["json"]["status"] for r in rx.requests]
    assert statuses == ["firing", "resolved", "firing", "firing"]


def test_already_ended_incidents_page_then_resolve(tmp_path):
    with Receiver() as rx, Notifier(webhook(rx), tmp_path / "s.db") as n:
        n.update([incident(end=T0 + 60, id="a"), incident(kind="sdc", gpu=1, start=T0 + 5, id="b")],
                 now=T0 + 100)
        assert n.flush(5)
    assert events(rx) == [("a", "firing"), ("b", "firing"), ("a", "resolved")]


def test_restart_neither_repages_nor_loses_a_pending_resolve(tmp_path):
    state = tmp_path / "state.db"
    inc = incident()  # no id: a key derived from kind/host/gpu/start
    with Receiver() as rx:
        n = Notifier(webhook(rx), state)
        n.update([inc], now=T0)
        assert n.flush(5)
        n.close()
        port = rx.port
    # receiver down: the resolve cannot go out before the analyzer stops
    n = Notifier(webhook(rx), state)
    n.update([inc], now=T0 + 5)
    n.update([dataclasses.replace(inc, end=T0 + 60)], now=T0 + 70)
    left = n.close(timeout=0.3)
    assert left == {"webhook": 1}
    with Receiver(port=port) as rx2:
        rx2.requests.clear()
        n = Notifier(webhook(rx2), state)
        n.update([dataclasses.replace(inc, end=T0 + 60)], now=T0 + 80)
        assert n.flush(10)
        n.close()
    assert [r["json"]["status"] for r in rx.requests] == ["firing"]
    assert [r["json"]["status"] for r in rx2.requests if r["status"] == 200] == ["resolved"]
    assert rx2.requests[0]["json"]["key"] == f"thermal_throttle:node01:3:-:{to_rfc3339(T0)}"


def test_receiver_down_then_back_gets_everything_once_in_order(tmp_path):
    rx = Receiver()
    sinks = webhook(rx)
    with Notifier(sinks, tmp_path / "s.db") as n:
        incs = [incident(gpu=g, kind=k, start=T0 + g, id=f"i{g}")
                for g, k in enumerate(["sdc", "gpu_lost", "memory_errors"])]
        n.update(incs, now=T0)
        n.update([dataclasses.replace(incs[0], end=T0 + 30)], now=T0 + 30)
        time.sleep(1.0)  # several failed attempts with backoff while down
        assert n.pending() == {"webhook": 4}
        rx.start()
        try:
            assert n.flush(5)
        finally:
            rx.stop()
    assert events(rx) == [("i0", "firing"), ("i1", "firing"), ("i2", "firing"), ("i0", "resolved")]
    assert len(rx.requests) == 4


def test_5xx_is_retried_with_backoff(tmp_path):
    answers = iter([503, 500])
    rx = Receiver(lambda req: (next(answers, 200), {}, b"busy"))
    with rx, Notifier(webhook(rx), tmp_path / "s.db") as n:
        n.update([incident(id="x")], now=T0)
        assert n.flush(5)
    assert [r["status"] for r in rx.requests] == [503, 500, 200]
    gaps = [b["t"] - a["t"] for a, b in zip(rx.requests, rx.requests[1:], strict=False)]
    assert gaps[0] >= 0.02 and gaps[1] >= gaps[0] * 0.5  # exponential, jittered (0.5..1 x)
    assert len({r["headers"]["x-gpufleet-event"] for r in rx.requests}) == 1


def test_429_honours_retry_after(tmp_path):
    answers = iter([(429, {"Retry-After": "1"})])
    rx = Receiver(lambda req: (*next(answers, (200, {})), b""))
    with rx, Notifier(webhook(rx), tmp_path / "s.db") as n:
        n.update([incident(id="x")], now=T0)
        assert n.flush(5)
    assert [r["status"] for r in rx.requests] == [429, 200]
    assert rx.requests[1]["t"] - rx.requests[0]["t"] >= 0.95  # not the 0.05 s backoff


def test_400_is_given_up_and_logged_not_retried(tmp_path, caplog):
    rx = Receiver(lambda req: (400, {}, b'{"error":"bad field severity"}') if req["json"]["key"] == "bad"
                  else (200, {}, b"ok"))
    caplog.set_level(logging.INFO, "gpufleet.alerting")
    with rx, Notifier(webhook(rx), tmp_path / "s.db") as n:
        n.update([incident(id="bad"), incident(id="good", gpu=5, kind="sdc", start=T0 + 1)], now=T0)
        assert n.flush(5)
        time.sleep(0.3)
        assert [o["state"] for o in n.outbox("webhook")] == ["failed", "sent"]
        n.update([dataclasses.replace(incident(id="bad"), end=T0 + 9)], now=T0 + 10)
        assert n.flush(5)
        # the resolve of a firing that never got through is not sent
        assert [o["state"] for o in n.outbox("webhook")] == ["failed", "sent", "skipped"]
    assert [r["json"]["key"] for r in rx.requests] == ["bad", "good"]
    assert "HTTP 400" in caplog.text and "bad field severity" in caplog.text


def test_slow_receiver_times_out_and_is_retried(tmp_path):
    calls = []

    def slow_first(req):
        calls.append(req)
        if len(calls) == 1:
            time.sleep(1.2)
        return 200, {}, b"ok"

    with Receiver(slow_first) as rx, Notifier(webhook(rx, timeout=0.3), tmp_path / "s.db") as n:
        t = time.monotonic()
        n.update([incident(id="slow")], now=T0)
        assert n.flush(5)
        assert time.monotonic() - t < 1.1, "the timeout cut the slow attempt short"
        assert n.outbox("webhook")[0]["attempts"] == 2
    # both attempts carry the same event id so the receiver can drop the duplicate
    assert {r["headers"]["x-gpufleet-event"] for r in calls} == {"slow:firing"}


def test_rate_limit_per_sink_delays_not_drops(tmp_path):
    with Receiver() as rx:
        sinks = webhook(rx, rate_limit=120, burst=2)  # 2 per second after a burst of 2
        with Notifier(sinks, tmp_path / "s.db", group_window=0) as n:
            n.update([incident(gpu=g, id=f"g{g}") for g in range(4)], now=T0)
            assert n.flush(5)
    t = [r["t"] for r in rx.requests]
    assert len(t) == 4
    assert t[1] - t[0] < 0.3 and t[3] - t[0] >= 0.9


def test_secrets_never_reach_the_logs(tmp_path, caplog, monkeypatch):
    caplog.set_level(logging.DEBUG)
    secret, token = "hmac-secret-Zq9", "T0000/B0000/XXXXtokenXXXX"
    (tmp_path / "secret").write_text(secret + "\n")
    monkeypatch.setenv("SLACK_URL", f"http://127.0.0.1:1/services/{token}")
    sinks = load_sinks([fast({"type": "webhook", "url": f"http://127.0.0.1:1/in/{token}",
                              "secret_file": str(tmp_path / "secret")}),
                        fast({"type": "slack", "url_env": "SLACK_URL"})], [])
    n = Notifier(sinks, tmp_path / "s.db")
    n.update([incident(id="x")], now=T0)
    time.sleep(0.5)
    text = caplog.text + "".join(repr(s) for s in sinks)
    text += str(n.outbox("webhook")) + str(n.outbox("slack"))
    t = time.monotonic()
    assert n.close(timeout=0.3) == {"webhook": 1, "slack": 1}
    assert time.monotonic() - t < 2.0, "close() is bounded even while a sink is down"
    assert "attempt 1 failed" in caplog.text
    assert secret not in text and token not in text


def test_an_incident_that_takes_in_a_paged_one_is_its_update_not_a_second_page(tmp_path):
    # online, an acute heat-sink loss throttles at once (paged); the cooling incident opens minutes
    # later, folds the throttling as its impact, and the throttling record ends (absorbed)
    throttle = incident(kind="thermal_throttle", id="thr", start=T0)
    cooling = incident(kind="cooling_degradation", id="cool", start=T0 - 30, severity="warning",
                       evidence={"impact": [{"kind": "thermal_throttle", "id": "thr"}]})
    other = incident(kind="cooling_degradation", id="other", gpu=5, start=T0 - 30, severity="warning",
                     evidence={"impact": [{"kind": "thermal_throttle", "id": "never-paged"}]})
    with Receiver() as rx, Notifier(webhook(rx), tmp_path / "s.db") as n:
        n.update([throttle], now=T0 + 10)
        assert n.flush(5)
        n.update([dataclasses.replace(throttle, end=T0 + 600), cooling], now=T0 + 700)
        assert n.flush(5)
        assert events(rx) == [("thr", "firing")], "the cooling incident must not page again"
        n.update([dataclasses.replace(cooling, end=T0 + 3000)], now=T0 + 3100)
        n.update([other], now=T0 + 3100)  # what it folded never paged: a page of its own
        assert n.flush(5)
    assert events(rx) == [("thr", "firing"), ("thr", "resolved"), ("other", "firing")]
    assert rx.requests[1]["json"]["incidents"] == ["thr", "cool"]


def test_informational_records_never_reach_a_sink(tmp_path):
    """A setting or the room (severity info) is written, never paged; a fault beside it pages once."""
    note = incident(kind="power_limit_below_peers", gpu=None, severity="info", id="note",
                    evidence={"peak": {"setting": "power limit 500 W (peers 700 W)"}})
    room = incident(kind="inlet_above_room", host=None, gpu=None, severity="info", id="room")
    fault = incident(kind="sdc", gpu=3, id="fault")
    with Receiver() as rx, Notifier(webhook(rx), tmp_path / "s.db") as n:
        assert n.update([note, room, fault], now=T0 + 10) == 1
        assert n.update([dataclasses.replace(note, end=T0 + 60), room, fault], now=T0 + 70) == 0
        assert n.flush(5)
    assert events(rx) == [("fault", "firing")]
