"""Convert the real H200 trace (``reference/h200/trace.csv``, 10 Hz NVML samples) into the schema.

One ``gpu`` row per sample in the catalogue's fields and units: ratios from percent, watts
from milliwatts, joules from millijoules, bytes from MiB, the clock-event bitmask plus its
decoded flags. The trace's own time column becomes offsets from ``start`` (an arbitrary
fixed epoch). Thresholds and the power limit are the ones the same GPU reported
(slowdown 89 °C, shutdown 95 °C, max operating 87 °C, memory max 95 °C, limit 700 W).
"""

from __future__ import annotations

import csv
from pathlib import Path

from gpufleet.lineprotocol import encode

START_NS = 1_795_000_000 * 10**9  # 2026-11-18, any fixed instant will do
TAGS = {
    "host": "h200-ref",
    "gpu": "0",
    "model": "NVIDIA H200",
    "uuid": "GPU-00000000-0000-0000-0000-000000000000",
    "cluster": "ref",
    "rack": "ref1",
}
FLAGS = {
    "clock_event_idle": 0x1,
    "clock_event_sw_power_cap": 0x4,
    "clock_event_hw_slowdown": 0x8,
    "clock_event_sync_boost": 0x10,
    "clock_event_sw_thermal": 0x20,
    "clock_event_hw_thermal": 0x40,
    "clock_event_hw_power_brake": 0x80,
}


def convert(csv_path: str | Path, start_ns: int = START_NS) -> list[str]:
    out = []
    with open(csv_path, newline="") as f:
        for row in csv.DictReader(f):
            t_ns = start_ns + int(round(float(row["t"]) * 1e9))
            reasons = int(row["clk_reasons"])
            fields = {
                "utilization_gpu_ratio": int(row["util_gpu"]) / 100,
                "utilization_memory_ratio": int(row["util_mem"]) / 100,
                "memory_used_bytes": int(row["mem_used_mib"]) * 2**20,
                "power_watts": int(row["power_mw"]) / 1000,
                "power_instant_watts": int(row["power_instant_mw"]) / 1000,
                "power_limit_watts": 700.0,
                "energy_joules_total": int(row["energy_mj"]) / 1000,
                "temperature_gpu_celsius": int(row["temp_c"]),
                "temperature_memory_celsius": int(row["mem_temp_c"]),
                "temperature_slowdown_celsius": 89,
                "temperature_shutdown_celsius": 95,
                "temperature_max_operating_celsius": 87,
                "temperature_memory_max_celsius": 95,
                "clock_sm_mhz": int(row["clk_sm_mhz"]),
                "clock_memory_mhz": int(row["clk_mem_mhz"]),
                "clock_sm_max_mhz": 1980,
                "performance_state": int(row["pstate"]),
                "clock_event_reasons": reasons,
                "up": 1,
                "health_code": 0,
            }
            fields.update({k: int(bool(reasons & bit)) for k, bit in FLAGS.items()})
            out.append(encode("gpu", TAGS, fields, t_ns))
    return out


def main(argv=None) -> int:  # pragma: no cover - a conversion helper
    import sys

    args = argv if argv is not None else sys.argv[1:]
    src, dst = args[0], args[1]
    Path(dst).write_text("\n".join(convert(src)) + "\n")
    return 0
