"""GPM in the GPU collector: the recorded H200 (gpm_probe.json) and the simulated node."""

from __future__ import annotations

import json
import threading
import time

import pynvml
import pytest
from gpufleet.agent.backends.recorded import RecordedBackend
from gpufleet.agent.backends.sim import SimBackend, TinyNode
from gpufleet.agent.collectors.gpu import GpuCollector

from tests.conftest import FIXTURES

GPM_REC = FIXTURES / "recordings" / "h200" / "gpm_probe.json"


def _replay(c: GpuCollector, polls: int, step: float = 1.0):
    """The collector's gpu rows over ``polls`` polls ``step`` s apart (recorded rows advance per poll)."""
    clock = [1000.0]
    c._clock = lambda: clock[0]
    out = []
    for i in range(polls):
        rows = c.collect(int((1000 + i * step) * 1e9))
        out.append(next(s.fields for s in rows if s.measurement == "gpu"))
        clock[0] += step
    return out


def test_gpm_tells_apart_what_utilization_cannot_on_the_recorded_h200():
    """Three workloads at 16-100 % utilization: GEMM (tensor), device copy (DRAM), tiny kernels (idle SMs)."""
    doc = json.loads(GPM_REC.read_text())
    phases = {p.split()[2]: float(p.split()[0]) for p in doc["phases"] if " start " in p}
    b = RecordedBackend(GPM_REC)
    c = GpuCollector(b)
    rows = _replay(c, len(doc["rows"]))
    c.close()
    assert b.gpm_live == 0  # both samples freed on close
    t = [r["t"] for r in doc["rows"]]

    def during(name, end):
        return [rows[i] for i in range(len(t)) if phases[name] + 2 < t[i] <= end - 0.5]

    gemm = during("gemm", phases["copy"])
    copy = during("copy", phases["tiny"])
    tiny = during("tiny", phases["tiny"] + 12)
    assert gemm and copy and tiny
    assert all(r["utilization_gpu_ratio"] >= 0.98 for r in gemm + copy)
    assert all(r["tensor_active_ratio"] > 0.9 and r["dram_active_ratio"] < 0.2 for r in gemm)
    assert all(r["tensor_active_ratio"] < 0.01 and r["dram_active_ratio"] > 0.85 for r in copy)
    assert all(r["utilization_gpu_ratio"] >= 0.13 and r["sm_active_ratio"] < 0.001 for r in tiny)
    assert all("sm_active_ratio" not in rows[0] for _ in (0,))  # first poll: one sample, no interval
    assert all("nvlink_tx_bytes_per_second" not in r for r in rows)  # no NVLink on this VM: not 0


def test_polls_closer_than_100_ms_read_no_gpm_and_keep_the_older_sample():
    b = RecordedBackend(GPM_REC)
    c = GpuCollector(b)
    clock = [1000.0]
    c._clock = lambda: clock[0]
    calls = []
    real = b.nvmlGpmSampleGet
    b.nvmlGpmSampleGet = lambda h, s: (calls.append(clock[0]), real(h, s))[1]
    c.collect(int(1000e9))
    clock[0] += 0.05
    f = next(s.fields for s in c.collect(int(1000.05e9)) if s.measurement == "gpu")
    assert "sm_active_ratio" not in f and calls == [1000.0]
    clock[0] += 0.06  # 110 ms after the first sample
    f = next(s.fields for s in c.collect(int(1000.11e9)) if s.measurement == "gpu")
    assert "sm_active_ratio" in f and len(calls) == 2
    assert b.gpm_live == 2  # the last sample and one spare, reused: not one per poll
    for i in range(5):
        clock[0] += 1
        c.collect(int((1001 + i) * 1e9))
    assert b.gpm_live == 2
    c.close()
    assert b.gpm_live == 0


def test_gpm_absent_where_not_supported_and_never_asked_again():
    from tests.conftest import FIXTURES as F

    b = RecordedBackend(F / "recordings" / "h200" / "nvml_dump.json")  # recorded without GPM
    asked = []
    real = b.nvmlGpmQueryDeviceSupport
    b.nvmlGpmQueryDeviceSupport = lambda h: (asked.append(1), real(h))[1]
    rows = _replay(GpuCollector(b), 4)
    assert len(asked) == 1
    gpm = ("sm_active_ratio", "tensor_active_ratio", "dram_active_ratio")
    assert not any(k in r for r in rows for k in gpm)
    assert b.gpm_live == 0


class _Watch(SimBackend):
    """A sim backend that records how many GPM calls run at once (each takes a little while)."""

    def __init__(self, node):
        super().__init__(node)
        self.inside = 0
        self.most = 0
        self.guard = threading.Lock()

    calls_seen = 0

    def _enter(self):
        with self.guard:
            _Watch.calls_seen += 1
            self.inside += 1
            self.most = max(self.most, self.inside)
        time.sleep(0.002)
        with self.guard:
            self.inside -= 1

    def nvmlGpmSampleGet(self, handle, sample):
        self._enter()
        return super().nvmlGpmSampleGet(handle, sample)

    def nvmlGpmMetricsGet(self, req):
        self._enter()
        return super().nvmlGpmMetricsGet(req)


def test_one_gpm_call_at_a_time_across_gpus_and_collectors():
    b1, b2 = _Watch(TinyNode(t0=0.0)), _Watch(TinyNode(t0=0.0))
    shared = threading.Lock()
    b2.guard = b1.guard = shared  # one count over both backends (two collectors, one process)
    b2._enter = b1._enter
    cs = [GpuCollector(b1, nvlink=False), GpuCollector(b2, nvlink=False)]
    done = []
    threads = [threading.Thread(target=lambda c=c: done.append(len(_replay(c, 4)))) for c in cs]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    for c in cs:
        c.close()
    assert done == [4, 4]
    assert b1.most == 1 and b1.calls_seen >= 2 * 8 * 4  # 8 GPUs per collector, a sample each poll


def test_lost_gpu_frees_its_samples_and_starts_afresh():
    node = TinyNode(n_gpus=2, t0=0.0)
    b = SimBackend(node)
    c = GpuCollector(b, nvlink=False, retry_s=1.0)
    _replay(c, 3)
    assert b.gpm_live == 4  # two per GPU
    node.lost = {1}
    clock = [2000.0]
    c._clock = lambda: clock[0]
    rows = c.collect(int(2000e9))
    assert next(s for s in rows if s.tags["gpu"] == "1").fields["health_code"] == 2
    node.lost = set()
    clock[0] += 2
    f = [s.fields for s in c.collect(int(2002e9)) if s.tags["gpu"] == "1"][0]
    assert f["health_code"] == 0 and "sm_active_ratio" not in f  # a fresh first sample
    assert b.gpm_live == 3  # GPU 0's two, GPU 1's new one; the lost handle's samples freed
    clock[0] += 1
    f = [s.fields for s in c.collect(int(2003e9)) if s.tags["gpu"] == "1"][0]
    assert "sm_active_ratio" in f
    c.close()
    assert b.gpm_live == 0


def test_sim_gpm_follows_the_workload_and_nvlink_rates_need_links():
    b = SimBackend(TinyNode(n_gpus=1, t0=0.0))
    busy = _replay(GpuCollector(b), 3)[-1]
    assert busy["utilization_gpu_ratio"] > 0.9 and busy["tensor_active_ratio"] > 0.9
    assert busy["nvlink_tx_bytes_per_second"] > 1e11
    c = GpuCollector(SimBackend(TinyNode(n_gpus=1, t0=0.0)))
    rows = _replay(c, 3, step=30.0)  # idle after 420 s of each 600 s cycle: not reached; check margin
    assert all(r["temperature_margin_celsius"] == 88 - r["temperature_gpu_celsius"] for r in rows)
    assert pynvml.NVML_GPM_METRIC_SM_UTIL == 2  # the metric ids the recordings are keyed by


@pytest.mark.slow
def test_gpm_check_prints_one_json_line_on_the_recorded_h200(tmp_path):
    """bench/gpm_check.py (for a real GPU) end to end, with pynvml's calls answered by the recorded
    H200 GPM probe in a child process: one JSON line with every section, within its time budget."""
    import subprocess
    import sys

    from tests.conftest import ROOT

    code = f"""
import runpy, sys
import pynvml
from gpufleet.agent.backends.recorded import RecordedBackend
b = RecordedBackend({str(GPM_REC)!r})
for n in dir(pynvml):
    if n.startswith("nvml") and callable(getattr(pynvml, n)):
        try:
            setattr(pynvml, n, getattr(b, n))
        except AttributeError:
            pass
pynvml.nvmlSystemGetDriverVersion = lambda: "recorded"
sys.argv = ["gpm_check", "--polls", "3"]
runpy.run_path({str(ROOT / "bench" / "gpm_check.py")!r}, run_name="__main__")
"""
    r = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    (line,) = r.stdout.strip().splitlines()
    out = json.loads(line)
    g = out["gpus"][0]
    assert g["gpm_supported"] == 1 and len(g["gpm_metrics_ms"]) == 4
    assert set(g["gpm_metrics"]) >= {"sm_active_ratio", "tensor_active_ratio", "dram_active_ratio"}
    assert g["fields_slow"]["answers"]["169"] == [0, 1587]  # the recorded L0 -> recovery count
    assert g["fields_pcie_bytes"]["answers"]["197"][0] == 0
    cpu = out["cpu_ms_per_gpu_poll"]
    assert all(isinstance(cpu[k], float) for k in ("collector_gpm_on", "collector_gpm_off", "bare_gpm_on"))
    assert "fast_tier_over_bare_floor_gpm_on" in out and out["wall_s"] < 60
