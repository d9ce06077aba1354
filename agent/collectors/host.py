"""Host collector (psutil): measurement ``host``, one row per node per poll.

CPU utilization is the busy share of CPU time between two polls; the first poll has no
previous reading, so it leaves the field out unless ``first_sample_s`` > 0 (then it waits that
long for one, as ``gpufleet agent once`` does).
"""

from __future__ import annotations

import os
import time

import psutil
from gpufleet.agent.model import Node, Sample, register


@register("host")
class HostCollector:
    name = "host"
    needs_nvml = False
    measurements = ("host",)
    options = ()  # no section of its own

    @classmethod
    def describe(cls, table: dict, node: Node) -> tuple[str, str]:
        return "on", "CPU, memory, disks and network of this host"

    def __init__(self, *, slow_interval_s: float = 60.0, first_sample_s: float = 0.0, clock=time.monotonic):
        self.slow_interval_s = float(slow_interval_s)
        self.first_sample_s = float(first_sample_s)
        self._clock = clock
        self._next_slow = 0.0
        self._last = psutil.cpu_times()
        self._last_t = clock()
        self._boot = psutil.boot_time()
        self._first = True

    def _cpu_ratio(self) -> float | None:
        now = self._clock()
        if self._first:
            self._first = False
            wait = self.first_sample_s - (now - self._last_t)
            if wait > 0:
                time.sleep(wait)
                now = self._clock()
        cur = psutil.cpu_times()
        prev, prev_t, self._last, self._last_t = self._last, self._last_t, cur, now
        if now - prev_t < 0.05:  # too short for the kernel's 10 ms tick accounting
            return None
        total = _total(cur) - _total(prev)
        if total <= 0:
            return None
        return min(max((_busy(cur) - _busy(prev)) / total, 0.0), 1.0)

    def collect(self, now_ns: int | None = None) -> list[Sample]:
        if now_ns is None:
            now_ns = time.time_ns()
        f: dict[str, object] = {}
        cpu = self._cpu_ratio()
        if cpu is not None:
            f["cpu_utilization_ratio"] = cpu
        vm = psutil.virtual_memory()
        f["memory_used_bytes"] = int(vm.total - vm.available)
        now = self._clock()
        if now >= self._next_slow:
            self._next_slow = now + self.slow_interval_s
            f["memory_total_bytes"] = int(vm.total)
        try:
            f["load1"], f["load5"], f["load15"] = (float(x) for x in os.getloadavg())
        except OSError:
            pass
        f["uptime_seconds"] = max(now_ns / 1e9 - self._boot, 0.0)
        return [Sample("host", {}, f, now_ns)]

    def close(self) -> None:
        pass


def _total(t) -> float:
    # guest time is already counted in user/nice on Linux
    return sum(t) - getattr(t, "guest", 0.0) - getattr(t, "guest_nice", 0.0)


def _busy(t) -> float:
    return _total(t) - t.idle - getattr(t, "iowait", 0.0)
