"""Hand-made fleet telemetry for the detector tests and the tests built on them: ``fleet()``
writes a small fleet's line protocol (optionally with one fault), ``analyse()`` runs it through
the batch analyzer."""

from __future__ import annotations

import numpy as np
from gpufleet.analyzer.config import Config
from gpufleet.analyzer.pipeline import Analyzer

from gpufleet.lineprotocol import encode

T0 = 1_795_000_000
STEP = 10


def fleet(nodes=4, gpus=4, steps=480, links=2, fault=None, seed=0, t0=T0) -> bytes:
    """A small healthy fleet under steady load (one job per node), with one optional fault.

    ``fault`` = (kind, node, gpu, step at which it starts); gpu None: every GPU of the node.
    """
    rng = np.random.default_rng(seed)
    out = []
    kind, fnode, fgpu, fstep = fault or (None, -1, -1, 10**9)
    offset = rng.normal(0, 1.0, (nodes, gpus))
    counters = {}
    for s in range(steps):
        t = (t0 + s * STEP) * 10**9
        load = (s // 60) % 4 != 3  # 30 min of work, 10 min idle, repeated
        for n in range(nodes):
            for g in range(gpus):
                on = kind is not None and n == fnode and fgpu in (None, g) and s >= fstep
                if kind == "gpu_lost" and on and s > fstep:
                    continue
                p = 690 + rng.normal(0, 2) if load else 80 + rng.normal(0, 0.5)
                clock = 1500 if load else 345
                reasons = 0x4 if load else 0x1
                temp = 25 + 0.05 * p + offset[n, g] + rng.normal(0, 0.3)
                c = counters.setdefault((n, g), {"sbe": 0, "dbe": 0, "replay": 0, "thr": 0, "brake": 0})
                f = {
                    "utilization_gpu_ratio": 1.0 if load else 0.0,
                    "power_watts": round(p, 2),
                    "temperature_gpu_celsius": int(round(temp)),
                    "clock_sm_mhz": clock,
                    "temperature_slowdown_celsius": 89,
                    "pcie_link_gen": 5,
                    "pcie_link_gen_max": 5,
                    "pcie_link_width": 16,
                    "pcie_link_width_max": 16,
                    "up": 1,
                    "health_code": 0,
                    "job_id": f"job{n}" if load else None,
                }
                if on and kind == "thermal_throttle" and load:
                    f["temperature_gpu_celsius"] = 88
                    reasons |= 0x40
                    c["thr"] += STEP * 10**9
                    f["clock_sm_mhz"] = 1100
                if on and kind == "cooling_degradation":
                    f["temperature_gpu_celsius"] = int(round(temp + min(12.0, (s - fstep) * 0.1)))
                if on and kind == "power_brake":
                    reasons |= 0x80
                    c["brake"] += STEP * 10**9
                if on and kind == "pcie_degradation":
                    c["replay"] += 300
                if on and kind == "memory_errors":
                    c["dbe"] += 1 if s == fstep else 0
                if on and kind == "straggler" and load:
                    f["clock_sm_mhz"] = 1300
                    f["power_watts"] = round(p * 0.85, 2)
                if on and kind == "gpu_lost":
                    f["health_code"] = 2
                    f["up"] = 0
                f.update(
                    {
                        "clock_event_reasons": reasons,
                        "throttle_hw_thermal_ns_total": c["thr"],
                        "throttle_hw_power_brake_ns_total": c["brake"],
                        "pcie_replay_total": c["replay"],
                        "ecc_corrected_volatile_total": c["sbe"],
                        "ecc_uncorrected_volatile_total": c["dbe"],
                    }
                )
                tags = {
                    "host": f"node{n}",
                    "gpu": str(g),
                    "model": "NVIDIA H200",
                    "cluster": "c1",
                    "rack": f"r{n // 2}",
                }
                out.append(encode("gpu", tags, f, t))
                for li in range(links):
                    crc = (s - fstep) * 5 if on and kind == "nvlink_degradation" and li == 1 else 0
                    out.append(
                        encode(
                            "gpu_nvlink",
                            {**tags, "link": str(li)},
                            {
                                "up": 1,
                                "crc_flit_errors_total": crc,
                                "replay_errors_total": 0,
                                "recovery_errors_total": 0,
                            },
                            t,
                        )
                    )
                if s % 30 == 5:
                    bad = on and kind == "sdc"
                    out.append(
                        encode(
                            "gpu_canary",
                            tags,
                            {"passed": 0 if bad else 1, "mismatches": 17 if bad else 0},
                            t + 10**8,
                        )
                    )
                if on and s == fstep and kind == "gpu_lost":
                    out.append(encode("gpu_event", {**tags, "type": "xid"}, {"code": 79}, t))
    return ("\n".join(out) + "\n").encode()


def analyse(data: bytes, config: Config | None = None):
    an = Analyzer(config or Config())
    an.feed_bytes(data)
    an.finish()
    return an
