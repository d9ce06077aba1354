"""Host collector (psutil) against what the kernel reports."""

from __future__ import annotations

import os
import time

import psutil
from gpufleet.agent.collectors.host import HostCollector


class Clock:
    def __init__(self):
        self.t = time.monotonic()

    def __call__(self):
        return self.t


def test_host_row():
    c = HostCollector()
    (s,) = c.collect()
    f = s.fields
    assert s.measurement == "host" and s.tags == {}
    assert f["memory_total_bytes"] == psutil.virtual_memory().total
    assert 0 < f["memory_used_bytes"] < f["memory_total_bytes"]
    assert abs(f["load1"] - os.getloadavg()[0]) < 2.0
    assert abs(f["uptime_seconds"] - (time.time() - psutil.boot_time())) < 5
    assert "cpu_utilization_ratio" not in f  # no earlier reading to compare with yet


def test_cpu_ratio_sees_a_busy_core():
    c = HostCollector()
    end = time.perf_counter() + 0.4
    x = 0
    while time.perf_counter() < end:  # one core busy
        x += 1
    (s,) = c.collect()
    ratio = s.fields["cpu_utilization_ratio"]
    assert 0.8 / psutil.cpu_count() <= ratio <= 1.0


def test_first_sample_waits_when_asked():
    c = HostCollector(first_sample_s=0.1)
    t0 = time.monotonic()
    (s,) = c.collect()
    assert time.monotonic() - t0 >= 0.09
    assert 0.0 <= s.fields["cpu_utilization_ratio"] <= 1.0


def test_memory_total_on_the_slow_cadence():
    clock = Clock()
    c = HostCollector(slow_interval_s=60, clock=clock)
    assert "memory_total_bytes" in c.collect()[0].fields
    clock.t += 1
    assert "memory_total_bytes" not in c.collect()[0].fields
    clock.t += 60
    assert "memory_total_bytes" in c.collect()[0].fields
