"""Agent benchmarks: export throughput into InfluxDB 1.6.7 vs a raw POST, CPU per GPU per tick, RSS.

- throughput: the influx sender draining a spool of real agent lines (batches of 5000, gzip)
  into a local InfluxDB 1.6.7, next to a raw ``requests`` POST of the same lines in the same run;
- CPU per GPU per tick with the sim backend (8 GPUs, 18 NVLink links each, read every
  ``gpu.nvlink_interval``), file + influx exporters on, split into collection / OpenTelemetry SDK /
  encoding+export (process CPU time, all threads), and apart for ticks with and without NVLink rows;
- the same ticks with a second InfluxDB-protocol destination (``[influx.analyzer]``, its own
  spool) beside the first, timed alternately with the one-destination agent in the same run;
- RSS of a real ``gpufleet agent run`` process with 8 simulated GPUs.
"""

from __future__ import annotations

import gzip
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import requests


def _agent(tmp: Path, url: str, nvlink_interval: float | None = None, second: bool = False):
    from gpufleet.agent import config
    from gpufleet.agent.daemon import Agent

    doc = {"agent": {"backend": "sim", "interval": 1, "exporters": ["file", "influx"], "host": "bench"},
           "influx": {"url": url, "db": "bench"},
           "file": {"dir": str(tmp / "lp")}, "spool": {"dir": str(tmp / "spool")}}
    if second:
        doc["agent"]["exporters"].append("influx.analyzer")
        doc["influx"]["analyzer"] = {"url": url, "db": "bench2"}
    if nvlink_interval is not None:
        doc["gpu"] = {"nvlink_interval": nvlink_interval}
    ag = Agent(config.validate(doc))
    # the GPU collector's cadences (slow tier, NVLink) follow the simulated tick time, not the wall clock
    clock = [0.0]
    for c in ag.collectors:
        if getattr(c, "name", "") == "gpu":
            c._clock = lambda: clock[0]
    return ag, clock


def _spool_lines(tmp: Path, url: str, ticks: int) -> list[str]:
    """Real agent lines for the throughput test: NVLink rows on every tick (wide GPU rows and
    narrow link rows, as a node with gpu.nvlink_interval = 0 writes them)."""
    ag, clock = _agent(tmp / "data", url, nvlink_interval=0)
    out = ag.outputs[0]  # the [influx] destination
    out.sender.stop_event.set()
    t = time.time_ns() - (ticks + 1) * 10**9
    for i in range(ticks + 1):
        clock[0] = float(i)
        ag.tick(t + i * 10**9)
    lines = out.spool.read_batch(10**9)[0]
    ag.close(0)
    return lines


def _second_destination(tmp: Path, url: str, ticks: int) -> list[dict]:
    """CPU per GPU per tick with one and with two influx destinations, ticks alternated so that
    both see the same machine load; the senders are stopped (the tick alone is timed)."""
    agents = [_agent(tmp / f"d{n}", url, second=n == 2) for n in (1, 2)]
    for ag, _ in agents:
        for out in ag.outputs:
            out.sender.stop_event.set()
    cpu = [0.0, 0.0]
    t = time.time_ns() - (ticks + 1) * 10**9
    for i in range(ticks + 1):
        for k, (ag, clock) in enumerate(agents):
            clock[0] = float(i)
            c = time.process_time()
            ag.tick(t + i * 10**9)
            if i:  # the first tick builds the caches
                cpu[k] += time.process_time() - c
    for ag, _ in agents:
        ag.close(0)
    one, two = (c / ticks / 8 * 1e3 for c in cpu)
    return [{"benchmark": "agent", "metric": "CPU per GPU per tick, one influx destination", "value": one,
             "unit": "ms", "note": f"{ticks} ticks, alternated with the next row"},
            {"benchmark": "agent", "metric": "CPU per GPU per tick, two (+ [influx.analyzer])", "value": two,
             "unit": "ms", "note": "the lines are encoded once; one more spool append per tick"}]


def run(quick: bool) -> list[dict]:
    from tests.servers import InfluxDB1

    rows = []
    ticks = 10 if quick else 60
    with tempfile.TemporaryDirectory() as d:
        tmp = Path(d)
        with InfluxDB1(tmp / "influx") as srv:
            srv.create_db("bench")
            srv.create_db("raw")
            ag, clock = _agent(tmp, srv.url)
            spool, sender = ag.outputs[0].spool, ag.outputs[0].sender  # the [influx] destination
            sender.stop_event.set()  # measure the tick alone; drain afterwards
            t = time.time_ns() - ticks * 10**9
            ag.tick(t)
            parts = ("collect", "otel", "encode_export")
            split = dict.fromkeys(parts, 0.0)
            per_tick = []  # (CPU seconds, SDK data points) of every tick
            c0 = time.process_time()
            for i in range(ticks):
                clock[0] = float(i + 1)
                c = time.process_time()
                ag.tick(t + (i + 1) * 10**9)
                per_tick.append((time.process_time() - c, ag.pipeline.points))
                for k in parts:
                    split[k] += ag.cpu_timing[k]
            cpu = (time.process_time() - c0) / ticks / 8
            link_ticks = [c for c, n in per_tick if n > 600]
            plain_ticks = [c for c, n in per_tick if n <= 600]
            cadence = (f"NVLink rows (gpu.nvlink_interval {ag.cfg['gpu']['nvlink_interval']:g} s) on "
                       f"{len(link_ticks)} of {ticks} ticks at a 1 s interval")
            for k in parts:
                rows.append({"benchmark": "agent", "metric": f"CPU per GPU per tick: {k}",
                             "value": split[k] / ticks / 8 * 1e3, "unit": "ms",
                             "note": "process CPU, mean over the run; sim backend, 8 GPUs x 18 links"})
            rows.append({"benchmark": "agent", "metric": "CPU per GPU per tick: total", "value": cpu * 1e3,
                         "unit": "ms", "target": "<= 0.5", "note": f"file + influx exporters; {cadence}"})
            for label, got in (("ticks with NVLink rows", link_ticks),
                               ("ticks without NVLink rows", plain_ticks)):
                if got:
                    rows.append({"benchmark": "agent", "metric": f"  CPU per GPU per tick, {label}",
                                 "value": sum(got) / len(got) / 8 * 1e3, "unit": "ms",
                                 "note": f"{len(got)} ticks"})
            pts = sum(n for _, n in per_tick)
            rows.append({"benchmark": "agent", "metric": "OpenTelemetry SDK per data point (CPU)",
                         "value": split["otel"] / pts * 1e6, "unit": "us",
                         "note": f"{pts / ticks:.0f} data points per tick on average "
                                 f"({max(n for _, n in per_tick)} with NVLink rows)"})
            # throughput: make a large spool of real lines, drain it, then raw POST the same lines
            lines = []
            spool.ack(spool.read_batch(10**9)[1], spool.points)  # the timed ticks' lines: not sent
            base = _spool_lines(tmp, srv.url, ticks)
            reps = 3 if quick else 12
            for r in range(reps):
                shift = (r + 1) * 10**12
                for ln in base:
                    head, fields, ts = ln.rsplit(" ", 2)
                    lines.append(f"{head} {fields} {int(ts) - shift}")
            all_lines = base + lines
            for i in range(0, len(all_lines), 5000):
                spool.append(all_lines[i:i + 5000])
            nfields = sum(ln.rsplit(" ", 2)[1].count("=") for ln in spool.read_batch(10**9)[0])
            t0 = time.perf_counter()
            while sender.step() != "empty":
                pass
            dt_agent = time.perf_counter() - t0
            t0 = time.perf_counter()
            for i in range(0, len(all_lines), 5000):
                body = gzip.compress(("\n".join(all_lines[i:i + 5000]) + "\n").encode(), 1)
                r = requests.post(srv.url + "/write", params={"db": "raw", "precision": "ns"}, data=body,
                                  headers={"Content-Encoding": "gzip"}, timeout=60)
                assert r.status_code == 204, r.text
            dt_raw = time.perf_counter() - t0
            ag.close(0)
            rows.append({"benchmark": "agent", "metric": "export throughput (spool -> InfluxDB 1.6.7)",
                         "value": nfields / dt_agent, "unit": "field values/s", "target": ">= 500000",
                         "note": f"{len(all_lines)} lines, NVLink rows on every tick"})
            rows.append({"benchmark": "agent", "metric": "raw requests POST of the same lines",
                         "value": nfields / dt_raw, "unit": "field values/s"})
            rows.append({"benchmark": "agent", "metric": "exporter / raw POST", "value": dt_raw / dt_agent,
                         "unit": "ratio"})
            rows.extend(_second_destination(tmp, srv.url, ticks))
        # RSS of a real agent process
        proc = subprocess.Popen([sys.executable, "-m", "gpufleet", "agent", "run", "--backend", "sim",
                                 "--interval", "1", "--exporter", "file", "--file-dir", str(tmp / "lp2")],
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        time.sleep(4 if quick else 15)
        rss = 0
        for line in Path(f"/proc/{proc.pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                rss = int(line.split()[1]) / 1024
        proc.terminate()
        proc.wait(10)
        rows.append({"benchmark": "agent", "metric": "RSS of agent run, 8 simulated GPUs", "value": rss,
                     "unit": "MB", "target": "<= 60"})
    return rows
