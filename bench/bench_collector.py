"""CPU cost of the GPU collector per GPU poll (``time.process_time``, all threads).

On the sim backend (8 H200-like GPUs, 18 NVLink links each, read every poll or on the default
30 s NVLink cadence with one poll a second) and on a recorded H200. The sim
backend's own work (building its NVML answers from the node state) is measured apart, so the
collector's share is the difference. On hardware the driver's own CPU time comes on top
(about 5 ms per 12-value poll on an H200, see the reference notes).
"""

from __future__ import annotations

import time
from pathlib import Path

from gpufleet.agent.backends.recorded import RecordedBackend
from gpufleet.agent.backends.sim import SimBackend, TinyNode
from gpufleet.agent.collectors.gpu import GpuCollector

ROOT = Path(__file__).resolve().parent.parent
H200 = ROOT / "tests" / "fixtures" / "recordings" / "h200" / "nvml_dump.json"


def _cost(collector, polls: int, slow_every: int, n_gpus: int, t_start: float = 4000.0) -> float:
    """Mean CPU seconds per GPU poll over ``polls`` polls, one in ``slow_every`` slow."""
    clock = [0.0]
    collector._clock = lambda: clock[0]
    collector.slow_interval_s = slow_every - 0.5
    collector.collect(int(t_start * 1e9))  # first poll: probing, threads, caches
    c0 = time.process_time()
    for i in range(polls):
        clock[0] += 1.0
        collector.collect(int((t_start + 1 + i) * 1e9))
    return (time.process_time() - c0) / (polls * n_gpus)


def _sim_snapshot_cost(polls: int) -> float:
    b = SimBackend(TinyNode(t0=0.0))
    b.begin_poll(int(4000e9))
    c0 = time.process_time()
    for i in range(polls):
        b.begin_poll(int((4001 + i) * 1e9))
    return (time.process_time() - c0) / (polls * 8)


def run(quick: bool) -> list[dict]:
    polls = 30 if quick else 300
    rows = []
    sim_only = _sim_snapshot_cost(polls)
    for nvlink, every in ((True, 0.0), (True, 30.0), (False, 0.0)):
        c = GpuCollector(SimBackend(TinyNode(t0=0.0)), nvlink=nvlink, nvlink_interval_s=every)
        total = _cost(c, polls, slow_every=10, n_gpus=8)
        c.close()
        label = ("with 18 NVLink links" + (f", links every {every:g} polls" if every else ", every poll")
                 if nvlink else "no NVLink")
        rows.append({"benchmark": "collector", "metric": f"CPU per GPU poll, sim backend, {label}",
                     "value": total * 1e6, "unit": "µs", "target": "< 1000",
                     "note": f"8 GPUs, {polls} polls, slow tier 1 in 10; includes the sim backend"})
        rows.append({"benchmark": "collector", "metric": f"  of which collector, {label}",
                     "value": (total - sim_only) * 1e6, "unit": "µs", "target": "< 1000",
                     "note": f"sim backend snapshot alone: {sim_only * 1e6:.0f} µs per GPU"})
    c = GpuCollector(RecordedBackend(H200))
    rec = _cost(c, polls, slow_every=10, n_gpus=1)
    c.close()
    rows.append({"benchmark": "collector", "metric": "CPU per GPU poll, recorded H200",
                 "value": rec * 1e6, "unit": "µs", "target": "< 1000",
                 "note": "nvml_dump.json; NVLink NotSupported (cached after the first poll)"})
    c = GpuCollector(RecordedBackend(H200))
    rec_fast = _cost(c, polls, slow_every=10**9, n_gpus=1)
    c.close()
    rows.append({"benchmark": "collector", "metric": "CPU per GPU poll, recorded H200, fast tier only",
                 "value": rec_fast * 1e6, "unit": "µs", "target": "< 1000", "note": ""})
    return rows


if __name__ == "__main__":
    for r in run(quick=False):
        print(f"{r['metric']:<55} {r['value']:>9.1f} {r['unit']}  {r['note']}")
