"""A node cut off from the fleet's InfluxDB for 2 minutes, live: three real agents (sim backend, wall
clock, 1 s polls, influx exporter with a spool) write into a real InfluxDB 1.6.7; gpu0002 reaches it
only through a TCP proxy this test holds, which it closes for the cut (the node's writes are refused,
as across a dead link) and opens again. The agent spools meanwhile and drains on its own. Inside the
cut gpu0002 has an uncorrectable ECC error, an XID 79 and a power brake; the connected gpu0001 has a
DBE too (the control). One analyzer is fed by an InfluxDB SUBSCRIPTION (``--listen``), another pulls
(``--follow``); each pages through its own real Alertmanager.

Both must drop no row, page the cut node's three faults once each with their true starts (marked
``arrived_late``), and page the control DBE on time, within two polls of its row landing."""

from __future__ import annotations

import os
import re
import socket
import subprocess
import threading
import time

import pytest
import requests

from gpufleet import records
from tests.agent_support import compare, read_lp_dir, start_agent, stop_agent, wait_for
from tests.alerting_receiver import Receiver
from tests.servers import Alertmanager, InfluxDB1, free_port, skip_unless
from tests.test_online_live import AlertSeen, analyzer  # the same analyzer process and alert watch

pytestmark = [skip_unless("influxd"), skip_unless("prometheus-alertmanager")]

POLL = 1.0
WARM, CUT = 15, 120  # seconds of fleet time before the cut, and its length
# the cut node's faults (fleet seconds), all inside [WARM, WARM + CUT), and the connected node's
DBE_AT, XID_AT, BRAKE_AT, CONTROL_AT = 35, 60, 85, 50
SCENARIO = f"""name = "cut"
[fleet]
nodes = 3
gpus_per_node = 4
[workload]
busy = 1.0
[nuisances]
background_sbe_per_gpu_day = 0
pcie_replays_per_gpu_hour = 0
nvlink_crc_per_link_hour = 0
nvlink_crc_bursts_per_link_day = 0
nvlink_replays_per_link_day = 0
[[fault]]
kind = "memory_errors"
mode = "dbe"
host = "gpu0002"
gpu = 1
onset = "{DBE_AT}s"
growth = "1s"
[[fault]]
kind = "gpu_lost"
mode = "xid79"
host = "gpu0002"
gpu = 3
onset = "{XID_AT}s"
[[fault]]
kind = "power_brake"
mode = "episodes"
host = "gpu0002"
gpu = 2
onset = "{BRAKE_AT}s"
duration = "25s"
[[fault]]
kind = "memory_errors"
mode = "dbe"
host = "gpu0001"
gpu = 0
onset = "{CONTROL_AT}s"
growth = "1s"
"""


class Link:
    """A TCP proxy in front of InfluxDB, the cut node's only way there. :meth:`cut` stops listening
    and closes every open connection (a connect is then refused); :meth:`mend` listens again on the
    same port."""

    def __init__(self, target_port: int):
        self.port, self.target = free_port(), target_port
        self.lock, self.conns, self.srv = threading.Lock(), [], None
        self.mend()

    def mend(self) -> None:
        s = socket.socket()
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        s.bind(("127.0.0.1", self.port))
        s.listen(16)
        self.srv = s
        threading.Thread(target=self._accept, args=(s,), daemon=True).start()

    def _accept(self, s: socket.socket) -> None:
        while True:
            try:
                c, _ = s.accept()
            except OSError:
                return
            try:
                u = socket.create_connection(("127.0.0.1", self.target), timeout=5)
                u.settimeout(None)
            except OSError:
                c.close()
                continue
            with self.lock:
                self.conns += [c, u]
            for a, b in ((c, u), (u, c)):
                threading.Thread(target=self._pipe, args=(a, b), daemon=True).start()

    @staticmethod
    def _pipe(a: socket.socket, b: socket.socket) -> None:
        try:
            while data := a.recv(65536):
                b.sendall(data)
        except OSError:
            pass
        finally:
            for x in (a, b):
                try:
                    x.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass

    def cut(self) -> None:
        try:
            self.srv.shutdown(socket.SHUT_RDWR)  # wakes the accepting thread
        except OSError:
            pass
        self.srv.close()
        with self.lock:
            conns, self.conns = self.conns, []
        for x in conns:
            try:
                x.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            x.close()


def firing(rx, host: str, gpu: str | None, kind: str) -> list:
    return [a for r in rx.requests for a in r["json"]["alerts"]
            if a["status"] == "firing" and a["labels"].get("host") == host and a["labels"].get("gpu") == gpu
            and kind in (a["labels"].get("kind"), a["labels"].get("alertname"))]


def first_time(db, q: str) -> float | None:
    """The time (s) of the first row a query answers, None while none."""
    series = db.query(q, db="fleet", epoch="ns")["results"][0].get("series")
    return series[0]["values"][0][0] / 1e9 if series else None


@pytest.mark.slow
def test_a_node_cut_off_for_two_minutes_loses_nothing_and_pages_its_faults_with_true_starts(tmp_path):
    token = "cut-listen-token"
    port = free_port()
    (tmp_path / "cut.toml").write_text(SCENARIO)
    # the xid collector on NVML's event set (the sim backend plays the node's XIDs through it)
    (tmp_path / "agent.toml").write_text('[agent]\ncollectors = ["gpu", "host", "xid"]\n'
                                         '[xid]\nkmsg = ""\nstate_dir = ""\n'
                                         '[influx]\nbackoff_max = "2s"\n')  # back within 2 s of the link
    t0 = time.time() + 4  # the agents' interpreters start meanwhile
    sim_env = {"GPUFLEET_SIM_SCENARIO": str(tmp_path / "cut.toml"), "GPUFLEET_SIM_T0": f"{t0:.3f}",
               "GPUFLEET_SIM_STEP": "1s", "GPUFLEET_SIM_DURATION": "10m", "GPUFLEET_SIM_SEED": "3"}
    env = dict(os.environ, GPUFLEET_LISTEN_TOKEN=token)
    hosts = ("gpu0001", "gpu0002", "gpu0003")
    with InfluxDB1(tmp_path / "influx") as db, Receiver() as rx_l, Receiver() as rx_f, \
            Alertmanager(tmp_path / "am-l", rx_l.url + "/hook") as am_l, \
            Alertmanager(tmp_path / "am-f", rx_f.url + "/hook") as am_f:
        db.create_db("fleet")
        db.query(f"CREATE SUBSCRIPTION \"gpufleet\" ON \"fleet\".\"autogen\" DESTINATIONS ALL "
                 f"'http://gpufleet:{token}@127.0.0.1:{port}'")
        link = Link(int(db.url.rsplit(":", 1)[1]))
        agents = [start_agent(tmp_path, "--config", str(tmp_path / "agent.toml"), "--backend", "sim",
                              "--sim-node", h, "--host", h, "--interval", "1s",
                              "--exporter", "influx", "--exporter", "file",
                              "--file-dir", str(tmp_path / f"lp-{h}"),
                              "--influx-url", f"http://127.0.0.1:{link.port}" if h == "gpu0002" else db.url,
                              "--influx-db", "fleet", "--spool-dir", str(tmp_path / f"spool-{h}"),
                              env=sim_env, log=f"agent-{h}.log")
                  for h in hosts]
        listen = ["--listen", f"127.0.0.1:{port}", "--influx-url", db.url, "--influx-db", "fleet"]
        follow = ["--follow", "--influx-url", db.url, "--influx-db", "fleet", "--since", "1m"]
        procs = {"listen": analyzer(tmp_path, "listen", listen, am_l.url, env),
                 "follow": analyzer(tmp_path, "follow", follow, am_f.url, env)}
        seen = {"listen": AlertSeen(am_l), "follow": AlertSeen(am_f)}
        for t in seen.values():
            t.start()
        rx = {"listen": rx_l, "follow": rx_f}

        def said():
            return {n: (tmp_path / f"{n}.out").read_text()[-3000:] for n in procs}

        try:
            time.sleep(max(0.0, t0 + WARM - time.time()))
            link.cut()
            cut_at = time.time()
            # the control: the connected node's DBE, paged by both within two polls of landing
            q_control = ("SELECT first(ecc_uncorrected_volatile_total) FROM gpu WHERE "
                         "ecc_uncorrected_volatile_total > 0 AND host = 'gpu0001' AND gpu = '0'")
            landed = wait_for(lambda: first_time(db, q_control) and time.time(), CONTROL_AT + 30, step=0.1)
            assert landed, said()
            c = ("gpu0001", "0")
            assert wait_for(lambda: c in seen["listen"].seen and c in seen["follow"].seen, 20), said()
            lat = {n: round(s.seen[c] - landed, 2) for n, s in seen.items()}
            print("control DBE: landing -> Alertmanager holds the alert:", lat)
            assert all(v <= 2 * POLL + 1.0 for v in lat.values()), lat  # 1 s of slack: 2 shared cores
            # nothing of the cut node landed meanwhile
            assert first_time(db, "SELECT first(ecc_uncorrected_volatile_total) FROM gpu WHERE "
                                  "ecc_uncorrected_volatile_total > 0 AND host = 'gpu0002'") is None
            time.sleep(max(0.0, cut_at + CUT - time.time()))
            assert first_time(db, f"SELECT * FROM gpu WHERE host = 'gpu0002' AND time > {int(cut_at + 2)}s "
                                  "LIMIT 1") is None, "the cut let rows through"
            link.mend()
            mended = time.time()
            q_back = f"SELECT * FROM gpu WHERE host = 'gpu0002' AND time > {int(cut_at + 2)}s LIMIT 1"
            assert wait_for(lambda: first_time(db, q_back), 30, step=0.1), "the spool did not drain"
            drained = time.time()  # the cut's first rows are readable in InfluxDB
            # the spool drains; both analyzers page the cut node's three faults
            want = [("gpu0002", "1", "memory_errors"), ("gpu0002", "3", "gpu_lost"),
                    ("gpu0002", "2", "power_brake")]

            def paged():
                return all(firing(rx[n], *w) for n in rx for w in want)

            assert wait_for(paged, 60, step=0.5), (
                {n: [(w, len(firing(rx[n], *w))) for w in want] for n in rx}, said())
            print(f"the cut's rows landed {drained - mended:.1f}s after the link came back; "
                  f"its faults paged by both {time.time() - drained:.1f}s after that")
            assert wait_for(lambda: all((h, g) in s.seen for h, g, _k in want for s in seen.values()), 10)
            print("backlog landing -> Alertmanager holds the alert:",
                  {n: {k: round(s.seen[(h, g)] - drained, 1) for h, g, k in want} for n, s in seen.items()})
            time.sleep(3 * POLL)
            # the agents stop (their spools delivered); the listener then has analysed every GPU row
            # they wrote, once: none dropped, none twice. A batch the cut broke off in flight may
            # have reached InfluxDB and been sent again from the spool: the subscription forwards
            # both copies, and the second is counted in late_points_total, not analysed.
            for p in agents:
                stop_agent(p, 20)
            gpu_rows = sum(1 for h in hosts for pt in read_lp_dir(tmp_path / f"lp-{h}")
                           if pt.measurement == "gpu")

            def gauges():
                text = requests.get(f"http://127.0.0.1:{port}/metrics", timeout=5).text
                return {k: float(v) for k, v in re.findall(r"^gpufleet_analyzer_(\w+) (\S+)$", text, re.M)}

            wait_for(lambda: gauges()["gpu_samples_total"] == gpu_rows, 30, step=0.5)
            g = gauges()
            print(f"listener ({gpu_rows} GPU rows written):", {k: g.get(k) for k in (
                "gap_rows_dropped_total", "late_points_total", "late_rows_analysed_total",
                "gpu_samples_total")})
            assert g["gpu_samples_total"] == gpu_rows and g["gap_rows_dropped_total"] == 0, g
            assert g["late_rows_analysed_total"] > 0, g  # the cut node's backlog was analysed, late
        finally:
            for t in seen.values():
                t.stop.set()
            for p in procs.values():
                if p.poll() is None:
                    p.terminate()
                    try:
                        p.wait(15)
                    except subprocess.TimeoutExpired:
                        p.kill()
                        p.wait(5)
            for p in agents:
                stop_agent(p, 20)
            link.cut()
        # every row each agent wrote (its file exporter) is in InfluxDB, the cut node's included
        for h in hosts:
            n = compare(read_lp_dir(tmp_path / f"lp-{h}"), db, "fleet")
            assert n > 0
            print(f"{h}: {n} rows in InfluxDB, each as written")
        where = "host = 'gpu0002' AND gpu ="
        truth = {
            "memory_errors": first_time(db, "SELECT first(ecc_uncorrected_volatile_total) FROM gpu WHERE "
                                            f"ecc_uncorrected_volatile_total > 0 AND {where} '1'"),
            "gpu_lost": first_time(db, f"SELECT first(code) FROM gpu_event WHERE code = 79 AND {where} '3'"),
            "power_brake": first_time(db, "SELECT first(clock_event_hw_power_brake) FROM gpu WHERE "
                                          f"clock_event_hw_power_brake > 0 AND {where} '2'"),
        }
        onset = {"memory_errors": DBE_AT, "gpu_lost": XID_AT, "power_brake": BRAKE_AT}
        for k, t in truth.items():
            # the first row showing each fault is the sim's onset (an XID row carries its event's own
            # time, stamped to the ms), or the next 1 s tick (a DBE escalates one step after its
            # onset): within 2 s, and inside the cut
            assert t is not None and -0.01 <= t - (t0 + onset[k]) <= 2 * POLL + 0.5, (k, t, t0 + onset[k])
            assert cut_at < t < mended, (k, t, cut_at, mended)
    for n in procs:
        out = (tmp_path / f"{n}.out").read_text()
        assert "analysis gap" not in out, out[-3000:]
        incs = records.read(tmp_path / f"{n}.jsonl")
        for host, gpu, kind in want:
            got = [r for r in incs if r.kind == kind and r.host == host and r.gpu == int(gpu)]
            assert len(got) == 1, (n, kind, got)
            r = got[0]
            # the start is the first row showing it: within one poll (+0.5 s: the agent's tick phase)
            assert abs(r.start - truth[kind]) <= POLL + 0.5, (n, kind, r.start, truth[kind])
            assert r.evidence.get("arrived_late") is True, (n, kind, r.evidence)
            # and says it was found late: it could not be found before the link came back
            assert r.evidence.get("found_after_seconds", 0) >= mended - r.start - 1, (n, kind, r.evidence)
            assert len(firing(rx[n], host, gpu, kind)) >= 1
        # paged once each: every firing notification of one fault names the same alert
        for w in want:
            assert len({a["fingerprint"] for a in firing(rx[n], *w)}) == 1, (n, w)
        ctl = [r for r in incs if r.kind == "memory_errors" and r.host == "gpu0001" and r.gpu == 0]
        assert len(ctl) == 1 and not ctl[0].evidence.get("arrived_late"), (n, ctl)
        # the cut node's silence is one record, from its last row before the cut until it came back
        quiet = [r for r in incs if r.kind == "node_stopped_reporting"]
        assert [r.host for r in quiet] == ["gpu0002"], (n, quiet)
        assert cut_at - 2 * POLL <= quiet[0].start <= cut_at and quiet[0].end is not None, (n, quiet, cut_at)
        assert not [r for r in incs if r.host == "gpu0003"], (n, incs)  # the healthy node: nothing
