"""A small fleet with faults, in the catalogue schema, for dashboard previews and tests.

Four nodes in two clusters (4 GPUs each, a few NVLink links per GPU), 10 s polls, with:
power-capped load and idle gaps (healthy clock events), one GPU whose cooling fails until it
throttles (thermal bits, throttle-time counters), one NVLink link with growing CRC/replay
errors, one GPU with an uncorrectable ECC error and XID 48, one GPU that falls off the bus
(XID 79, then its rows stop), BMC sensors, host rows, and the analyzer's ``incident`` rows.
Deterministic for a given seed. ``gpufleet sim`` is the realistic generator; this one only
needs to exercise every dashboard panel.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

from gpufleet import catalogue
from gpufleet.lineprotocol import encode

NODES = (
    ("east", "r01", "node-e01"),
    ("east", "r01", "node-e02"),
    ("east", "r02", "node-e03"),
    ("west", "r11", "node-w01"),
)


@dataclass(frozen=True)
class Faults:
    thermal: tuple[str, int] = ("node-e02", 2)
    nvlink: tuple[str, int, int] = ("node-e02", 1, 2)
    ecc: tuple[str, int] = ("node-w01", 3)
    lost: tuple[str, int] = ("node-e01", 0)


FAULTS = Faults()


def _clamp(x: float, lo: float, hi: float) -> float:
    return max(lo, min(hi, x))


def lines(
    start_ns: int, duration_s: int = 1800, step_s: int = 10, gpus: int = 4, links: int = 4, seed: int = 7
) -> list[str]:
    """Line protocol (ns precision) for the sample fleet from ``start_ns``."""
    rng = random.Random(seed)
    out: list[str] = []
    steps = duration_s // step_s
    add = out.append
    f = FAULTS
    state: dict[tuple[str, int], dict] = {}
    for _cluster, _rack, host in NODES:
        for g in range(gpus):
            state[(host, g)] = {
                "temp": 38.0,
                "mtemp": 42.0,
                "energy": 1.0e6 * (g + 1),
                "thr": {},
                "ecc": 0,
                "sbe": 0,
                "links": [0] * links,
                "link_bytes": [0] * links,
            }
    for s in range(steps):
        t = start_ns + s * step_s * 1_000_000_000
        frac = s / steps
        for n, (cluster, rack, host) in enumerate(NODES):
            ops = {"cluster": cluster, "rack": rack, "host": host}
            busy = not (0.40 <= frac < 0.50 and n % 2 == 0)  # an idle gap on half the nodes
            node_power = 0.0
            for g in range(gpus):
                st = state[(host, g)]
                uuid = f"GPU-{n:02d}{g:02d}aaaa-0000-4000-8000-00000000{n:02d}{g:02d}"
                tags = {**ops, "gpu": str(g), "uuid": uuid, "model": "NVIDIA H200"}
                if (host, g) == f.lost and frac >= 2 / 3:
                    continue  # fell off the bus: no more rows
                thermal_fault = (host, g) == f.thermal and frac >= 0.5
                if busy:
                    power, sm, util = 690.0 + rng.uniform(-8, 6), rng.randint(1470, 1530), 0.97
                    cap = 1
                else:
                    power, sm, util, cap = 81.0 + rng.uniform(-2, 2), 345, 0.0, 0
                resistance = 0.04 + (0.16 * (frac - 0.5) if thermal_fault else 0.0)
                # the driver holds the die near its slowdown temperature by cutting clocks and power
                allowed = (89.5 - 30.0) / resistance
                throttled = busy and power > allowed
                ratio = allowed / power if throttled else 1.0
                if throttled:
                    power, sm, cap = allowed, int(sm * ratio), 0
                target = 30.0 + power * resistance
                st["temp"] += (target - st["temp"]) * 0.6
                st["mtemp"] += (st["temp"] + 4 - st["mtemp"]) * 0.3
                temp = round(st["temp"] + rng.uniform(-0.5, 0.5))
                sw_thermal = 1 if throttled else 0
                hw_thermal = 1 if throttled and ratio < 0.85 else 0
                st["energy"] += power * step_s
                thr = st["thr"]
                for reason, on in (
                    ("sw_power_cap", cap),
                    ("sw_thermal", sw_thermal),
                    ("hw_thermal", hw_thermal),
                    ("hw_power_brake", 0),
                ):
                    thr[reason] = thr.get(reason, 0) + (
                        int(step_s * 1e9 * rng.uniform(0.8, 1.0)) if on else 0
                    )
                reasons = (0x1 if not busy else 0) | (0x4 * cap) | (0x20 * sw_thermal) | (0x40 * hw_thermal)
                if (host, g) == f.ecc and frac >= 0.3 and st["ecc"] == 0:
                    st["ecc"] = 1
                    add(
                        encode(
                            "gpu_event",
                            {**tags, "type": "xid", "source": "kmsg"},
                            {
                                "code": 48,
                                "pid": 4242,
                                "process": "python3",
                                "message": "DBE (double bit error) ECC error",
                            },
                            t + 3_000_000_000,
                        )
                    )
                if (host, g) == f.ecc:
                    st["sbe"] += rng.randint(0, 3)
                if (host, g) == f.lost and abs(frac - 2 / 3) < 1 / steps:
                    add(
                        encode(
                            "gpu_event",
                            {**tags, "type": "xid", "source": "kmsg"},
                            {"code": 79, "message": "GPU has fallen off the bus."},
                            t - 5_000_000_000,
                        )
                    )
                fields = {
                    "utilization_gpu_ratio": util,
                    "utilization_memory_ratio": util * 0.55,
                    "memory_used_bytes": int(120e9 if busy else 1e9),
                    "memory_total_bytes": 143_771_336_704,
                    "power_watts": round(power, 2),
                    "power_instant_watts": round(power + rng.uniform(-20, 20), 2),
                    "power_limit_watts": 700.0,
                    "energy_joules_total": round(st["energy"], 3),
                    "temperature_gpu_celsius": temp,
                    "temperature_memory_celsius": round(st["mtemp"]),
                    "temperature_slowdown_celsius": 89,
                    "temperature_shutdown_celsius": 95,
                    "temperature_max_operating_celsius": 87,
                    "temperature_memory_max_celsius": 95,
                    "clock_sm_mhz": sm,
                    "clock_memory_mhz": 2619,
                    "clock_sm_max_mhz": 1980,
                    "performance_state": 0,
                    "clock_event_reasons": reasons,
                    "clock_event_idle": 0 if busy else 1,
                    "clock_event_sw_power_cap": cap,
                    "clock_event_hw_slowdown": hw_thermal,
                    "clock_event_sync_boost": 0,
                    "clock_event_sw_thermal": sw_thermal,
                    "clock_event_hw_thermal": hw_thermal,
                    "clock_event_hw_power_brake": 0,
                    "throttle_sw_power_cap_ns_total": thr["sw_power_cap"],
                    "throttle_sw_thermal_ns_total": thr["sw_thermal"],
                    "throttle_hw_thermal_ns_total": thr["hw_thermal"],
                    "throttle_hw_power_brake_ns_total": thr["hw_power_brake"],
                    "pcie_link_gen": 5,
                    "pcie_link_gen_max": 5,
                    "pcie_link_width": 16,
                    "pcie_link_width_max": 16,
                    "pcie_replay_total": 0,
                    "ecc_corrected_volatile_total": st["sbe"],
                    "ecc_uncorrected_volatile_total": st["ecc"],
                    "ecc_corrected_aggregate_total": st["sbe"] + 12,
                    "ecc_uncorrected_aggregate_total": st["ecc"],
                    "remapped_rows_correctable": 0,
                    "remapped_rows_uncorrectable": st["ecc"],
                    "remapped_rows_pending": st["ecc"],
                    "remapped_rows_failure": 0,
                    "up": 1,
                    "health_code": 0,
                    "process_count": 1 if busy else 0,
                    "job_id": "4242" if busy else None,
                    # GPM as an H200 showed it under a bf16 GEMM (gpm_probe.json); 0 at idle
                    "sm_active_ratio": round(0.95 * ratio + rng.uniform(-0.01, 0.01), 4) if busy else 0.0,
                    "sm_occupancy_ratio": 0.14 if busy else 0.0,
                    "tensor_active_ratio": round(0.92 * ratio + rng.uniform(-0.01, 0.01), 4) if busy else 0.0,
                    "dram_active_ratio": 0.16 if busy else 0.0,
                    "pcie_tx_bytes_per_second": 4.3 * 2**20 if busy else 0.3 * 2**20,
                    "pcie_rx_bytes_per_second": 12.5 * 2**20 if busy else 0.07 * 2**20,
                    "nvlink_tx_bytes_per_second": links * 6.5e9 if busy else 0.0,
                    "nvlink_rx_bytes_per_second": links * 6.5e9 if busy else 0.0,
                    "temperature_margin_celsius": 88 - temp,
                    "perf_policy_low_utilization_ns_total": 0,
                    "pcie_l0_to_recovery_total": 325 + s // 30,
                }
                unknown = set(fields) - {m.field for m in catalogue.fields("gpu")}
                assert not unknown, unknown
                for m in catalogue.fields("gpu"):  # signals added to the catalogue later: a plain zero
                    if m.field not in fields and m.type != "string":
                        fields[m.field] = 0 if m.type == "int" else 0.0
                add(encode("gpu", tags, fields, t))
                node_power += power
                if s % 30 == 5:
                    add(
                        encode(
                            "gpu_canary",
                            tags,
                            {
                                "passed": 1,
                                "mismatches": 0,
                                "duration_seconds": round(rng.uniform(0.7, 0.9), 3),
                                "digest": "9f2c41d0",
                            },
                            t,
                        )
                    )
                for link in range(links):
                    lk = st["links"]
                    if (host, g, link) == f.nvlink and frac >= 0.25:
                        lk[link] += int(1 + 40 * (frac - 0.25))
                    st["link_bytes"][link] += int(6.5e9 * step_s) if busy else 0
                    add(
                        encode(
                            "gpu_nvlink",
                            {**tags, "link": str(link)},
                            {
                                "up": 1,
                                "crc_flit_errors_total": lk[link],
                                "crc_data_errors_total": lk[link] // 3,
                                "replay_errors_total": lk[link] // 5,
                                "recovery_errors_total": lk[link] // 50,
                                "tx_data_bytes_total": st["link_bytes"][link],
                                "rx_data_bytes_total": st["link_bytes"][link],
                            },
                            t,
                        )
                    )
            inlet = 24.0 + 2.0 * frac + rng.uniform(-0.3, 0.3)
            for sensor, stype, unit, value in (
                ("Inlet Temp", "temperature", "C", round(inlet, 1)),
                ("Exhaust Temp", "temperature", "C", round(inlet + 18 + node_power / 400, 1)),
                ("Fan1", "fan", "RPM", float(9000 + rng.randint(-200, 200))),
                ("PSU1 Power", "power_supply", "W", round(node_power / 2 + 600, 0)),
            ):
                add(
                    encode(
                        "bmc_sensor",
                        {**ops, "sensor": sensor, "sensor_type": stype, "unit": unit},
                        {"value": value, "state_code": 0},
                        t,
                    )
                )
            add(encode("bmc", ops, {"power_watts": round(node_power + 1200, 0), "sel_entries": 14}, t))
            add(
                encode(
                    "host",
                    ops,
                    {
                        "cpu_utilization_ratio": round(_clamp(0.35 + rng.uniform(-0.1, 0.1), 0, 1), 3),
                        "memory_used_bytes": int(600e9),
                        "memory_total_bytes": int(2048e9),
                        "load1": 42.0,
                        "load5": 40.0,
                        "load15": 38.0,
                        "uptime_seconds": 86400.0 + s * step_s,
                    },
                    t,
                )
            )
    out.extend(incident_lines(start_ns, duration_s))
    return out


def incident_lines(start_ns: int, duration_s: int) -> list[str]:
    """The analyzer's ``incident`` rows for the sample faults (time = incident start)."""
    sec = 1_000_000_000
    f = FAULTS
    where = {host: (cluster, rack) for cluster, rack, host in NODES}

    def at(frac: float) -> int:
        return start_ns + int(duration_s * frac) * sec

    th_host, th_gpu = f.thermal
    nv_host, nv_gpu, nv_link = f.nvlink
    rows = [
        (
            "inc-0001",
            "thermal_throttle",
            "critical",
            th_host,
            th_gpu,
            None,
            at(0.79),
            None,
            f"GPU {th_gpu} on {th_host} is thermally throttled (SW/HW thermal slowdown) at 89 °C",
        ),
        (
            "inc-0002",
            "cooling_degradation",
            "warning",
            th_host,
            th_gpu,
            None,
            at(0.60),
            at(0.79),
            f"GPU {th_gpu} on {th_host} runs hotter than its peers",
        ),
        (
            "inc-0003",
            "nvlink_degradation",
            "warning",
            nv_host,
            nv_gpu,
            nv_link,
            at(0.30),
            None,
            f"NVLink {nv_link} of GPU {nv_gpu} on {nv_host}: CRC errors growing",
        ),
        (
            "inc-0004",
            "memory_errors",
            "critical",
            f.ecc[0],
            f.ecc[1],
            None,
            at(0.30),
            None,
            f"GPU {f.ecc[1]} on {f.ecc[0]}: uncorrectable ECC error, XID 48",
        ),
        (
            "inc-0005",
            "gpu_lost",
            "critical",
            f.lost[0],
            f.lost[1],
            None,
            at(2 / 3),
            None,
            f"GPU {f.lost[1]} on {f.lost[0]} fell off the bus (XID 79)",
        ),
    ]
    out = []
    for iid, kind, sev, host, gpu, link, start, end, summary in rows:
        fields = {
            "id": iid,
            "summary": summary,
            "gpu": gpu,
            "link": link,
            "state": "resolved" if end else "firing",
        }
        if end:
            fields["end_ns"] = end
        fields["duration_seconds"] = ((end or start_ns + duration_s * sec) - start) / sec
        cluster, rack = where[host]
        tags = {"kind": kind, "severity": sev, "cluster": cluster, "rack": rack, "host": host}
        out.append(encode("incident", tags, fields, start))
    return out
