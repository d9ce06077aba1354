"""Compare the simulator's single-GPU response with the real H200 trace (docs/calibration.md).

``python -m gpufleet.sim.calibration [TRACE] [--plot docs/img/calibration.png]`` runs one
simulated GPU at the trace's own 0.1 s cadence through the trace's phase schedule (idle,
clocked-up idle, bf16 GEMM, device-memory copy, idle) and prints the fit errors. matplotlib is
imported only for the plot.
"""

from __future__ import annotations

import argparse
import csv
import sys
from pathlib import Path

import numpy as np

from gpufleet.sim.physics import H200, PHASE_CODE, Physics

DEFAULT_TRACE = Path(__file__).resolve().parents[2].parent / "shared" / "reference" / "h200" / "trace.csv"
COLUMNS = (
    "t",
    "util_gpu",
    "util_mem",
    "power_mw",
    "power_instant_mw",
    "energy_mj",
    "temp_c",
    "mem_temp_c",
    "clk_sm_mhz",
    "clk_reasons",
)


def load_trace(path: str | Path) -> dict[str, np.ndarray]:
    """The trace's numeric columns (lines starting with '#' are provenance comments)."""
    with open(path) as f:
        rows = list(csv.DictReader(line for line in f if not line.startswith("#")))
    return {c: np.array([float(r[c]) for r in rows]) for c in COLUMNS}


def phases_of(tr: dict[str, np.ndarray]) -> np.ndarray:
    """The workload phase the trace was in at each sample, from what it was doing."""
    ph = np.full(len(tr["t"]), PHASE_CODE["setup"])
    ph[tr["clk_sm_mhz"] <= 400] = PHASE_CODE["idle"]
    ph[(tr["util_gpu"] >= 50) & (tr["util_mem"] < 50)] = PHASE_CODE["compute"]
    ph[(tr["util_gpu"] >= 50) & (tr["util_mem"] >= 50)] = PHASE_CODE["memory"]
    return ph


def simulate(tr: dict[str, np.ndarray], inlet: float = 25.0, seed: int = 0) -> dict[str, np.ndarray]:
    """One simulated GPU over the trace's timeline and phases (sample i covers (t[i-1], t[i]])."""
    t = tr["t"]
    ph = phases_of(tr)
    phys = Physics(1, H200, inlet)
    # start from the trace's own idle steady state
    rng = np.random.default_rng(seed)
    one = np.ones(1)
    for _ in range(600):
        phys.step(1.0, ph[:1], one, one, np.array([inlet]), np.zeros(1, bool), one, rng)
    out: dict[str, list] = {
        k: []
        for k in (
            "power",
            "power_instant",
            "temperature_gpu",
            "temperature_memory",
            "clock_sm",
            "reasons",
            "energy_j",
        )
    }
    prev = t[0] - 0.1
    for i in range(len(t)):
        dt = max(t[i] - prev, 1e-3)
        prev = t[i]
        # the phase that ran during (t[i-1], t[i]]: the trace's label at t[i] describes the last 0.1 s
        o = phys.step(dt, ph[i : i + 1], one, one, np.array([inlet]), np.zeros(1, bool), one, rng)
        for k in out:
            out[k].append(float(o[k][0]))
    res = {k: np.array(v) for k, v in out.items()}
    res["temperature_gpu"] = np.rint(res["temperature_gpu"])
    res["temperature_memory"] = np.rint(res["temperature_memory"])
    res["phase"] = ph
    return res


def errors(tr: dict[str, np.ndarray], sim: dict[str, np.ndarray]) -> dict[str, float]:
    """RMSE of power (1 s average), GPU and memory temperature, SM clock; steady-state means."""
    ph = sim["phase"]

    def rmse(a, b, sel=slice(None)):
        return float(np.sqrt(np.mean((np.asarray(a)[sel] - np.asarray(b)[sel]) ** 2)))

    gemm = ph == PHASE_CODE["compute"]
    mem = ph == PHASE_CODE["memory"]
    settled_gemm = gemm & (np.roll(gemm, 20) & np.roll(gemm, 10))
    settled_mem = mem & (np.roll(mem, 20) & np.roll(mem, 10))
    return {
        "power_rmse_w": rmse(tr["power_mw"] / 1000, sim["power"]),
        "temperature_gpu_rmse_c": rmse(tr["temp_c"], sim["temperature_gpu"]),
        "temperature_memory_rmse_c": rmse(tr["mem_temp_c"], sim["temperature_memory"]),
        "clock_sm_rmse_mhz": rmse(tr["clk_sm_mhz"], sim["clock_sm"]),
        "gemm_power_w": float(np.mean(sim["power"][settled_gemm])),
        "gemm_power_real_w": float(np.mean(tr["power_mw"][settled_gemm] / 1000)),
        "gemm_clock_mhz": float(np.mean(sim["clock_sm"][settled_gemm])),
        "gemm_clock_real_mhz": float(np.mean(tr["clk_sm_mhz"][settled_gemm])),
        "memory_power_w": float(np.mean(sim["power"][settled_mem])),
        "memory_power_real_w": float(np.mean(tr["power_mw"][settled_mem] / 1000)),
        "energy_error_share": float(
            (sim["energy_j"][-1] - sim["energy_j"][0]) / ((tr["energy_mj"][-1] - tr["energy_mj"][0]) / 1000)
            - 1
        ),
    }


def plot(tr, sim, path: str | Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    t = tr["t"]
    fig, ax = plt.subplots(3, 1, figsize=(9, 8), sharex=True)
    ax[0].plot(t, tr["power_mw"] / 1000, label="H200 power (1 s avg)", color="k", lw=1)
    ax[0].plot(t, sim["power"], label="simulated", color="tab:red", lw=1, ls="--")
    ax[0].axhline(H200.power_limit, color="grey", lw=0.6, ls=":")
    ax[0].set_ylabel("W")
    ax[0].legend(loc="upper right", fontsize=8)
    ax[1].plot(t, tr["temp_c"], label="H200 GPU temp", color="k", lw=1)
    ax[1].plot(t, sim["temperature_gpu"], label="simulated GPU", color="tab:red", lw=1, ls="--")
    ax[1].plot(t, tr["mem_temp_c"], label="H200 memory temp", color="tab:blue", lw=1)
    ax[1].plot(t, sim["temperature_memory"], label="simulated memory", color="tab:cyan", lw=1, ls="--")
    ax[1].set_ylabel("°C")
    ax[1].legend(loc="upper right", fontsize=8)
    ax[2].plot(t, tr["clk_sm_mhz"], label="H200 SM clock", color="k", lw=1)
    ax[2].plot(t, sim["clock_sm"], label="simulated", color="tab:red", lw=1, ls="--")
    ax[2].set_ylabel("MHz")
    ax[2].set_xlabel("s")
    ax[2].legend(loc="lower right", fontsize=8)
    fig.suptitle("Simulated H200 vs the real trace (idle, GEMM at the power cap, memory copy, idle)")
    fig.tight_layout()
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("trace", nargs="?", default=str(DEFAULT_TRACE))
    ap.add_argument("--plot", help="write the comparison plot here (PNG)")
    args = ap.parse_args(argv)
    tr = load_trace(args.trace)
    sim = simulate(tr)
    for k, v in errors(tr, sim).items():
        print(f"{k:28s} {v:10.3f}")
    if args.plot:
        plot(tr, sim, args.plot)
    return 0


if __name__ == "__main__":
    sys.exit(main())
