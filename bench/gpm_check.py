"""One-minute check of GPM and the profiling-grade signals on a real GPU; prints one JSON line.

    PYTHONPATH=. python3 bench/gpm_check.py [--gpus N] [--polls N]

Read-only toward the GPU (NVML getters and GPM samples only). For every GPU (at most ``--gpus``):
GPM support, MIG mode, the cost of ``nvmlGpmSampleGet`` and of ``nvmlGpmMetricsGet`` for the
collector's metric set with each metric's return code and value, the thermal margin, and the
cost and answers of the field-value batches (fast, slow, per-link NVLink throughput, the PCIe
byte counters). Then the collector's CPU per GPU poll (fast tier) with GPM on and off, and the
bare NVML floor of the same signal set (``bench/bench_gpm.py``), polls 0.15 s apart. Runs in
about 20 s on one GPU.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))


def _ms(fn, *args, n: int = 5):
    """(median ms, last answer or error string) of ``n`` calls."""
    import pynvml

    out, times = None, []
    for _ in range(n):
        t0 = time.perf_counter()
        try:
            out = fn(*args)
        except pynvml.NVMLError as exc:
            out = f"error: {exc}"
        times.append((time.perf_counter() - t0) * 1e3)
    return round(statistics.median(times), 4), out


def _fields(handle, ids):
    import pynvml
    from gpufleet.agent.collectors.gpu import field_values

    ms, got = _ms(pynvml.nvmlDeviceGetFieldValues, handle, ids, n=3)
    if isinstance(got, str):
        return {"ms": ms, "error": got}
    ans = {}
    for req, (fid, ret, val) in zip(ids, field_values(got), strict=True):
        key = f"{fid}" if not isinstance(req, tuple) else f"{req[0]}@{req[1]}"
        ans[key] = [ret, val] if ret == 0 else [ret]
    return {"ms": ms, "answers": ans}


def gpu_report(i: int) -> dict:
    import pynvml
    from gpufleet.agent.collectors.gpu import _GPM_IDS, FIELD_IDS, GPM_METRICS, SLOW_FIELD_IDS

    h = pynvml.nvmlDeviceGetHandleByIndex(i)
    r: dict = {"index": i, "name": str(pynvml.nvmlDeviceGetName(h))}
    try:
        r["mig_mode"] = list(pynvml.nvmlDeviceGetMigMode(h))
    except pynvml.NVMLError as exc:
        r["mig_mode"] = f"error: {exc}"
    ms, sup = _ms(pynvml.nvmlGpmQueryDeviceSupport, h, n=3)
    r["gpm_support_ms"] = ms
    r["gpm_supported"] = sup if isinstance(sup, str) else int(sup.isSupportedDevice)
    if r["gpm_supported"] == 1:
        s1, s2 = pynvml.nvmlGpmSampleAlloc(), pynvml.nvmlGpmSampleAlloc()
        try:
            r["gpm_sample_ms"] = _ms(pynvml.nvmlGpmSampleGet, h, s1, n=10)[0]
            req = pynvml.c_nvmlGpmMetricsGet_t()
            req.version, req.numMetrics = pynvml.NVML_GPM_METRICS_GET_VERSION, len(_GPM_IDS)
            for k, mid in enumerate(_GPM_IDS):
                req.metrics[k].metricId = mid
            costs = []
            for _ in range(4):
                time.sleep(0.15)
                pynvml.nvmlGpmSampleGet(h, s2)
                req.sample1, req.sample2 = s1, s2
                t0 = time.perf_counter()
                try:
                    pynvml.nvmlGpmMetricsGet(req)
                except pynvml.NVMLError as exc:
                    r["gpm_metrics_error"] = str(exc)
                    break
                costs.append(round((time.perf_counter() - t0) * 1e3, 4))
                s1, s2 = s2, s1
            r["gpm_metrics_ms"] = costs
            ms_ = req.metrics
            r["gpm_metrics"] = {GPM_METRICS[mid]: [int(ms_[k].nvmlReturn), round(ms_[k].value, 3)]
                                for k, mid in enumerate(_GPM_IDS)}
        finally:
            pynvml.nvmlGpmSampleFree(s1)
            pynvml.nvmlGpmSampleFree(s2)
    margin = getattr(pynvml, "nvmlDeviceGetMarginTemperature", None)
    ms, v = _ms(margin, h) if margin else (None, "binding lacks it")
    r["margin_temperature"] = {"ms": ms, "value": v if isinstance(v, (int, str)) else str(v)}
    r["fields_fast"] = _fields(h, list(FIELD_IDS))
    r["fields_slow"] = _fields(h, list(SLOW_FIELD_IDS))
    r["fields_pcie_bytes"] = _fields(h, [197, 198])  # NVML_FI_DEV_PCIE_COUNT_TX/RX_BYTES (32-bit)
    links = []
    for link in range(18):
        try:
            pynvml.nvmlDeviceGetNvLinkState(h, link)
            links.append(link)
        except pynvml.NVMLError:
            pass
    r["nvlink_links"] = links
    if links:
        r["fields_nvlink_throughput"] = _fields(h, [(fid, link) for link in links for fid in (138, 139)])
    return r


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--gpus", type=int, default=8, help="at most this many GPUs (default 8)")
    ap.add_argument("--polls", type=int, default=15, help="collector polls per mode (default 15)")
    a = ap.parse_args()
    t_start = time.perf_counter()
    out: dict = {"check": "gpm"}
    try:
        import pynvml

        pynvml.nvmlInit()
    except Exception as exc:  # noqa: BLE001 - one line, whatever the reason
        print(json.dumps({"check": "gpm", "error": f"NVML not available: {exc}"}))
        return 1
    try:
        out["driver"] = str(pynvml.nvmlSystemGetDriverVersion())
        out["nvml_binding"] = getattr(pynvml, "__version__", None)
        n = min(pynvml.nvmlDeviceGetCount(), a.gpus)
        out["gpus"] = [gpu_report(i) for i in range(n)]
        from gpufleet.agent.backends.nvml import NvmlBackend

        from bench.bench_gpm import bare_cpu, collector_cpu

        cpu = {}
        modes = (("collector_gpm_off", collector_cpu, False), ("collector_gpm_on", collector_cpu, True),
                 ("bare_gpm_on", bare_cpu, True), ("bare_gpm_off", bare_cpu, False))
        for key, fn, gpm in modes:
            try:
                cpu[key] = round(fn(NvmlBackend(), a.polls, gpm, gap_s=0.15) * 1e3, 4)
            except Exception as exc:  # noqa: BLE001 - report and go on
                cpu[key] = f"error: {type(exc).__name__}: {exc}"
        out["cpu_ms_per_gpu_poll"] = cpu
        need = ("collector_gpm_on", "bare_gpm_on", "collector_gpm_off")
        if all(isinstance(cpu.get(k), float) for k in need):
            out["fast_tier_over_bare_floor_gpm_on"] = round(cpu["collector_gpm_on"] / cpu["bare_gpm_on"], 3)
            out["gpm_added_cpu_ms"] = round(cpu["collector_gpm_on"] - cpu["collector_gpm_off"], 4)
    except Exception as exc:  # noqa: BLE001 - the line must come out
        out["error"] = f"{type(exc).__name__}: {exc}"
    finally:
        try:
            pynvml.nvmlShutdown()
        except Exception:  # noqa: BLE001
            pass
    out["wall_s"] = round(time.perf_counter() - t_start, 1)
    print(json.dumps(out, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
