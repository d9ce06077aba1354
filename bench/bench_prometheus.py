"""Prometheus exporter benchmarks: what the scrape endpoint costs the agent.

- per-tick CPU of an agent with the ``prometheus`` exporter beside one without (file exporter
  both), ticks alternated so both see the same machine load; sim backend, 8 GPUs x 18 NVLink
  links, NVLink rows every ``gpu.nvlink_interval`` (30 s) at 1 s ticks;
- agent CPU per scrape of that 8-GPU node (``names`` gpufleet, dcgm, both): the agent process's
  CPU time (all threads: the HTTP server's and its handler's) while a client in another process
  makes one scrape, after a new tick each time (the tick's own CPU not counted), NVLink rows
  read on the first tick and held after it.
"""

from __future__ import annotations

import subprocess
import sys
import tempfile
import time
from pathlib import Path

CLIENT = """
import sys, requests
s = requests.Session()
url = sys.argv[1]
for line in sys.stdin:
    r = s.get(url if line.strip() == "go" else url.rsplit("/", 1)[0] + "/", timeout=30)
    sys.stdout.write(f"{r.status_code} {len(r.content)}\\n")
    sys.stdout.flush()
"""


def _agent(tmp: Path, exporters, names: str = "gpufleet"):
    from gpufleet.agent import config
    from gpufleet.agent.daemon import Agent

    doc = {"agent": {"backend": "sim", "interval": 1, "exporters": list(exporters), "host": "bench"},
           "file": {"dir": str(tmp / "lp")}, "prometheus": {"listen": "127.0.0.1:0", "names": names}}
    ag = Agent(config.validate(doc))
    clock = [0.0]
    for c in ag.collectors:
        if getattr(c, "name", "") == "gpu":
            c._clock = lambda: clock[0]
    return ag, clock


def _tick_cpu(tmp: Path, ticks: int) -> list[dict]:
    agents = [_agent(tmp / "off", ["file"]), _agent(tmp / "on", ["file", "prometheus"])]
    cpu = [0.0, 0.0]
    export = 0.0
    t = time.time_ns() - (ticks + 1) * 10**9
    for i in range(ticks + 1):
        for k, (ag, clock) in enumerate(agents):
            clock[0] = float(i)
            c = time.process_time()
            ag.tick(t + i * 10**9)
            if i:  # the first tick builds the caches
                cpu[k] += time.process_time() - c
                if k:
                    export += ag.prom.export_cpu_seconds
    for ag, _ in agents:
        ag.close(0)
    off, on = (c / ticks * 1e3 for c in cpu)
    note = f"{ticks} ticks alternated; sim, 8 GPUs x 18 links, NVLink rows every 30 s at 1 s ticks"
    return [{"benchmark": "prometheus", "metric": "CPU per tick, file exporter", "value": off, "unit": "ms",
             "note": note},
            {"benchmark": "prometheus", "metric": "CPU per tick, file + prometheus", "value": on,
             "unit": "ms",
             "note": "names = gpufleet"},
            {"benchmark": "prometheus", "metric": "  of which the prometheus exporter's snapshot",
             "value": export / ticks * 1e3, "unit": "ms"},
            {"benchmark": "prometheus", "metric": "per-tick CPU with / without", "value": on / off,
             "unit": "ratio", "target": "<= 1.10"}]


def _scrape_cpu(tmp: Path, names: str, scrapes: int) -> dict:
    ag, clock = _agent(tmp / names, ["prometheus"], names)
    try:
        t = time.time_ns()
        ag.tick(t)  # every tier: the NVLink rows held from here on
        clock[0] = 1.0
        ag.tick(t + 10**9)
        url = f"http://127.0.0.1:{ag.prom.port}/metrics"
        client = subprocess.Popen([sys.executable, "-c", CLIENT, url], stdin=subprocess.PIPE,
                                  stdout=subprocess.PIPE, text=True)
        try:
            client.stdin.write("go\n")  # warm up: connection, handler thread
            client.stdin.flush()
            size = int(client.stdout.readline().split()[1])
            cpu = 0.0
            for i in range(scrapes):
                clock[0] = 2.0 + i  # a new tick before each scrape (its CPU is not counted)
                ag.tick(t + (2 + i) * 10**9)
                time.sleep(0.05)
                c = time.process_time()  # from here the main thread waits: the server's threads work
                client.stdin.write("go\n")
                client.stdin.flush()
                code = client.stdout.readline().split()[0]
                cpu += time.process_time() - c
                assert code == "200", code
            cpu /= scrapes
            floor = 0.0
            for _ in range(scrapes):  # the same round trip for GET / (a one-line answer)
                time.sleep(0.02)
                c = time.process_time()
                client.stdin.write("root\n")
                client.stdin.flush()
                client.stdout.readline()
                floor += time.process_time() - c
            floor /= scrapes
        finally:
            client.stdin.close()
            client.wait(10)
        series = sum(1 for line in ag.prom.render().decode().splitlines() if not line.startswith("#"))
    finally:
        ag.close(0)
    return {"benchmark": "prometheus", "metric": f"agent CPU per scrape, 8 GPUs, names = {names}",
            "value": cpu * 1e3, "unit": "ms", "target": "<= 2",
            "note": f"{series} series, {size / 1024:.0f} KiB; {scrapes} scrapes, a tick before each; "
                    f"GET / (one line) costs {floor * 1e3:.2f} ms the same way"}


def run(quick: bool) -> list[dict]:
    rows = []
    with tempfile.TemporaryDirectory() as d:
        tmp = Path(d)
        rows += _tick_cpu(tmp, 15 if quick else 60)
        for names in ("gpufleet", "dcgm", "both"):
            rows.append(_scrape_cpu(tmp, names, 10 if quick else 50))
    return rows
