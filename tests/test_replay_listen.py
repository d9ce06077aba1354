"""A stored fleet replayed into a real InfluxDB 1.6.7 as fast as possible, an InfluxDB
SUBSCRIPTION forwarding every write to ``gpufleet analyze --listen``: the fleet's rows are stamped
days before the analyzer's wall clock and land minutes of data per second, so the whole fleet is
"late" by the wall clock. Event time follows the data (gpufleet.analyzer.pipeline): every row is
analysed, none is dropped, and ``gpufleet eval`` scores the incidents against the simulator's
truth (one page per fault) like the batch analysis of the same file."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time

import pytest
import requests

from gpufleet import records
from gpufleet.cli import main
from tests.agent_support import ROOT, wait_for
from tests.arrival import EXCLUDE, batch, lines_of, replay, same
from tests.servers import InfluxDB1, answers_ping, free_port, skip_unless

pytestmark = [skip_unless("influxd")]

POLL = 2.0


def gauges(url: str) -> dict[str, float]:
    text = requests.get(url + "/metrics", timeout=5).text
    return {k: float(v) for k, v in re.findall(r"^gpufleet_analyzer_(\w+) (\S+)$", text, re.M)}


def score(capsys, fleet, incidents) -> dict:
    capsys.readouterr()
    assert main(["eval", "--truth", str(fleet / "truth.jsonl"), "--incidents", str(incidents), "--json"]) == 0
    return json.loads(capsys.readouterr().out)


@pytest.fixture(scope="module")
def small(tmp_path_factory):
    out = tmp_path_factory.mktemp("backlog") / "sim"
    assert main(["sim", "--nodes", "4", "--duration", "45m", "--step", "10s", "--seed", "7",
                 "--scenario", "mixed", "--out", str(out), "--no-progress"]) == 0
    return out / "telemetry.lp.gz"


@pytest.mark.parametrize("speed", [60.0, 600.0])
def test_a_fleet_landing_days_behind_the_clock_is_analysed_as_a_file(small, speed):
    """The online loop's clock is a week after the fleet's data, which lands ``speed`` times faster
    than it was written, in bodies of 5000 lines (each holding minutes of one measurement, then of
    the next): cut on the data's own pace, with the batch lateness, it gives the batch analysis'
    incidents, no row late or dropped; once nothing lands for two polls every window is cut."""
    lines = lines_of(small)
    t0 = min(t for t, _h, _l in lines) / 1e9
    week = 7 * 86400.0
    online = replay(lines, lambda t, _h, _i: t0 + week + (t - t0) / speed, poll=2.0)
    an = online.an
    assert an.backlog
    assert (an.late_points, an.late_rows, an.dropped_rows, an.future_points) == (0, 0, 0, 0)
    assert same(batch(small), an.incidents(), 10.0) == ([], [])
    assert not [r for r in an.incidents() if r.kind in EXCLUDE]


@pytest.mark.slow
def test_a_fleet_replayed_through_a_subscription_is_found_as_in_batch(tmp_path, capsys):
    fleet = tmp_path / "fleet"
    assert main(["sim", "--scenario", "mixed", "--nodes", "8", "--duration", "2h", "--seed", "3",
                 "--out", str(fleet), "--no-progress"]) == 0
    assert main(["analyze", "--input", str(fleet / "telemetry.lp.gz"),
                 "--out", str(tmp_path / "batch.jsonl")]) == 0
    batch = score(capsys, fleet, tmp_path / "batch.jsonl")
    gpu_rows = json.loads((fleet / "manifest.json").read_text())["telemetry"]["lines"]["gpu"]

    token = "replay-listen-token"
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    out = tmp_path / "online.jsonl"
    with InfluxDB1(tmp_path / "influx") as db:
        db.create_db("fleet")
        db.query(f"CREATE SUBSCRIPTION \"gpufleet\" ON \"fleet\".\"autogen\" DESTINATIONS ALL "
                 f"'http://gpufleet:{token}@127.0.0.1:{port}'")
        log = open(tmp_path / "analyze.log", "wb")
        an = subprocess.Popen([sys.executable, "-m", "gpufleet", "analyze", "--listen", f"127.0.0.1:{port}",
                               "--poll", f"{POLL:g}s", "--out", str(out)],
                              stdout=log, stderr=subprocess.STDOUT, cwd=ROOT,
                              env=dict(os.environ, GPUFLEET_LISTEN_TOKEN=token), start_new_session=True)
        try:
            assert answers_ping(url, 60), (tmp_path / "analyze.log").read_text()
            t0 = time.monotonic()
            assert main(["replay", str(fleet), "--influx-url", db.url, "--influx-db", "fleet",
                         "--as-fast-as-possible", "--no-progress"]) == 0
            took = time.monotonic() - t0
            # every GPU row forwarded and analysed; then the last windows close on the data's own pace
            assert wait_for(lambda: gauges(url).get("gpu_samples_total") == gpu_rows, 60), gauges(url)
            assert wait_for(lambda: gauges(url)["listen_queue_bytes"] == 0, 30)
            settled = []

            def done():
                g = gauges(url)
                settled.append((g["windows_total"], g["incidents"]))
                return len(settled) > 3 and len(set(settled[-3:])) == 1 and out.is_file()

            assert wait_for(done, 60, step=POLL), settled
            g = gauges(url)
        finally:
            an.send_signal(signal.SIGTERM)
            an.wait(30)
            log.close()
    said = (tmp_path / "analyze.log").read_text()
    # none dropped, none behind what its host had analysed, no analysis gap
    assert g["gap_rows_dropped_total"] == 0 and g["late_points_total"] == 0, (g, said[-2000:])
    assert "analysis gap" not in said
    online = score(capsys, fleet, out)
    print(f"replayed {sum(json.loads((fleet / 'manifest.json').read_text())['telemetry']['lines'].values())} "
          f"lines in {took:.1f}s; batch recall {batch['recall']} precision {batch['precision']}; "
          f"online recall {online['recall']} precision {online['precision']}")
    assert online["recall"] >= 0.9, online["per_kind"]
    assert online["precision"] >= 0.9, online["per_kind"]
    assert online["recall"] >= batch["recall"] and online["duplicates"] == 0
    # and the same incidents as the batch analysis: kind, host, GPU, link, start within a poll
    assert same(records.read(tmp_path / "batch.jsonl"), records.read(out), 10.0) == ([], [])


def test_a_late_host_landing_every_few_ticks_loses_no_row(small):
    """The fleet is stamped an hour ahead of the loop's clock (batch-size windows, as a replay
    stamped from now on), which ticks more often than the grace; gpu0003 lands 20 minutes late, a
    row every few ticks (its NVLink rows every 30 s, its canary rows minutes apart). It has not
    stopped landing until a grace passes without a row, and a late window cut while it was idle
    takes the rows that land in it afterwards: none of its rows is dropped as behind what it
    analysed (8,253 were), and the incidents are the on-time run's."""
    lines = lines_of(small)
    t0 = min(t for t, _h, _l in lines) / 1e9

    def arrive(t, host, _i):
        return t - 3600 + (1200.0 if host == b"gpu0003" and t >= t0 + 300 else 1.0)

    ontime = replay(lines, lambda t, _h, _i: t - 3600 + 1.0, poll=5.0, grace=30.0)
    late = replay(lines, arrive, poll=5.0, grace=30.0)
    for o in (ontime, late):
        o.an.finish()
    assert late.an.window == 300.0  # batch-size windows: a late window holds minutes of rows
    assert late.an.late_rows > 10000 and late.an.late_points == 0 and late.an.dropped_rows == 0
    # the same incidents, starts within a poll, but for the heat-sink fault of gpu0003 GPU 5, which
    # the cooling model's per-window fit dates, and whose throttling folds into it or not, by the
    # windows its rows fell in (the residual of tests/test_event_time.py)
    a, b = same(ontime.an.incidents(), late.an.incidents(), 10.0)
    assert {(r.kind, r.host, r.gpu) for r in a + b} <= {("cooling_degradation", "gpu0003", 5),
                                                        ("thermal_throttle", "gpu0003", 5)}, (a, b)
