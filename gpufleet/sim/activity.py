"""GPM activity of simulated GPUs, derived in one place from state the simulator already has, and
the collective-wait nuisance.

- **Per workload phase**, the shares an H200 showed (``../shared/reference/h200/gpm_probe.json``):
  a bf16 GEMM runs SM 96 %, tensor 93 %, DRAM 16 %, occupancy 14 %; a device copy SM 98 %,
  tensor 0, DRAM 88 %, occupancy 79 %; idle is 0. Communication, checkpoint and evaluation
  phases take values between.
- **Lockstep jobs**: a job's GPUs meet at every collective, so a GPU slowed to a share ``s`` of
  its speed (a straggler) makes each peer compute ``s_min / s`` of the time and wait the rest.
  Waiting is NCCL spinning on a few SMs: utilization stays at 100 %, SM activity ~3 %, tensor 0.
  The straggler itself computes all the time: its peers show it waiting.
- **Collective-wait nuisance** (scenario ``nuisances.collective_waits``, episodes per run): for
  10-30 min all GPUs of a busy node's job but one wait in a collective (phase
  ``collective_wait``: utilization 100 %, little power, clocks up) while that one computes at the
  power cap: a pipeline stage or rank with more work, a data-loader stall. Healthy; no truth
  record. To clock and power alone the computing GPU looks like a slow outlier.
- **Thermal margin**: degrees to the slowdown temperature, ``t_slowdown - 1 - T`` (the H200 said
  51 at 39 °C idle and 30 at 57 °C under GEMM, slowdown 89 °C).
- **PCIe and NVLink rates** follow the phase (all-reduce traffic while computing, none idle).
- **Per-link NVLink traffic** (:func:`link_rates`): the GPU's NVLink rate striped evenly over its
  links (an NVSwitch board), each link within a few per cent of its siblings; a degrading link
  (``link_share``) carries less as its errors grow (replays and retraining eat its bandwidth) and
  nothing once down.
"""

from __future__ import annotations

import numpy as np

from gpufleet.sim.physics import PHASE_CODE

WAIT = PHASE_CODE["collective_wait"]
_LOCKSTEP = np.zeros(len(PHASE_CODE), dtype=bool)
for _p in ("compute", "memory", "eval"):
    _LOCKSTEP[PHASE_CODE[_p]] = True
_MIB = 2**20
# phase -> (SM, occupancy, tensor, DRAM shares; PCIe tx, rx MiB/s; NVLink each way B/s)
_BY_PHASE = {
    "idle": (0.0, 0.0, 0.0, 0.0, 0.3, 0.07, 0.0),
    "setup": (0.0, 0.0, 0.0, 0.0, 0.3, 0.07, 0.0),
    "compute": (0.96, 0.14, 0.93, 0.16, 4.3, 12.5, 40e9),
    "memory": (0.98, 0.79, 0.0, 0.88, 10.2, 31.9, 10e9),
    "comm": (0.08, 0.02, 0.0, 0.05, 2.0, 2.0, 150e9),
    "checkpoint": (0.02, 0.01, 0.0, 0.03, 900.0, 40.0, 0.0),
    "eval": (0.80, 0.20, 0.60, 0.30, 6.0, 20.0, 20e9),
    "collective_wait": (0.03, 0.01, 0.0, 0.01, 0.3, 0.3, 2e9),
}
_TABLE = np.zeros((len(PHASE_CODE), 7))
for _name, _row in _BY_PHASE.items():
    _TABLE[PHASE_CODE[_name]] = _row
_WAIT_ROW = _TABLE[WAIT]
FIELDS = ("sm_active_ratio", "sm_occupancy_ratio", "tensor_active_ratio", "dram_active_ratio",
          "pcie_tx_bytes_per_second", "pcie_rx_bytes_per_second",
          "nvlink_tx_bytes_per_second", "nvlink_rx_bytes_per_second", "temperature_margin_celsius")


def values(fl, rng: np.random.Generator, A: dict, jobs: np.ndarray) -> dict[str, np.ndarray]:
    """Catalogue field -> (C, n) array, from the physics' per-GPU ``phase``, ``strag`` and
    ``temperature_gpu`` (``A``) and the GPUs' job ids."""
    phase = A["phase"].astype(np.int64)
    strag = A["strag"]
    row = _TABLE[phase]  # (C, n, 7)
    # lockstep: each GPU computes s_min / s of the time, the slowest GPU of its job sets s_min
    frac = np.ones(phase.shape)
    lock = _LOCKSTEP[phase] & (jobs > 0)
    if (lock & (strag < 1.0)).any():
        for j in np.unique(jobs[lock & (strag < 1.0)]):
            inj = lock & (jobs == j)
            s_min = np.where(inj, strag, np.inf).min(axis=1, keepdims=True)
            frac = np.where(inj, np.minimum(s_min / strag, 1.0), frac)
    row = row * frac[..., None] + _WAIT_ROW * (1.0 - frac[..., None])
    noise = rng.normal(0.0, 0.004, phase.shape)
    busy = row[..., 0] > 0
    out = {}
    for i, name in enumerate(FIELDS[:4]):
        v = row[..., i] + np.where(busy, noise, 0.0) if i in (0, 2) else row[..., i]
        out[name] = np.round(np.clip(v, 0.0, 1.0), 4)
    out["pcie_tx_bytes_per_second"] = np.round(row[..., 4] * _MIB, 1)
    out["pcie_rx_bytes_per_second"] = np.round(row[..., 5] * _MIB, 1)
    links = fl.model.nvlinks if hasattr(fl.model, "nvlinks") else 18
    nv = np.where(links > 0, row[..., 6], 0.0)
    out["nvlink_tx_bytes_per_second"] = np.round(nv, 0)
    out["nvlink_rx_bytes_per_second"] = np.round(nv, 0)
    m = A.get("_m", fl.pm if phase.shape[1] == fl.n else fl.model)
    margin = m.t_slowdown - 1 - np.rint(A["temperature_gpu"])
    out["temperature_margin_celsius"] = margin.astype(np.int64)
    return out


def link_rates(phase: np.ndarray, nvlinks: int, rng: np.random.Generator) -> np.ndarray:
    """Bytes per second each way on every link, (GPUs, links), of GPUs in workload ``phase``."""
    per_link = _TABLE[phase.astype(np.int64), 6] / max(nvlinks, 1)
    return per_link[:, None] * (1.0 + rng.normal(0.0, 0.02, (len(phase), nvlinks)))


def link_share(x: float, up: bool) -> float:
    """Share of its siblings' traffic a degrading link carries ``x`` growth periods after its
    onset: all of it at the onset, half by x ~ 0.4 (when replays begin), a tenth from x = 0.75."""
    return float(np.clip(1.0 - 1.2 * x, 0.1, 1.0)) if up else 0.0


def episodes(fl) -> list[tuple[int, int, float, float]]:
    """The run's collective-wait episodes: (node, local GPU that keeps computing, t0, t1) in run
    seconds, drawn once per fleet from its seed."""
    got = getattr(fl, "_collective_waits", None)
    if got is None:
        count = int(fl.scenario.nuisances.get("collective_waits", 0))
        rng = np.random.default_rng(np.random.SeedSequence([fl.seed, 0xC011]))
        per_node = int(np.max(fl.gpu_local)) + 1
        got = []
        for _ in range(count):
            node = int(rng.integers(0, fl.n_nodes))
            t0 = float(rng.uniform(0.05, 0.9)) * fl.duration
            got.append((node, int(rng.integers(0, per_node)), t0, t0 + float(rng.uniform(600, 1800))))
        fl._collective_waits = got
    return got


def apply_waits(fl, idx: np.ndarray, t: float, phase: np.ndarray) -> np.ndarray:
    """``phase`` of GPUs ``idx`` at run time ``t`` with the collective-wait episodes applied."""
    eps = episodes(fl)
    if not eps:
        return phase
    for node, keep, t0, t1 in eps:
        if t0 <= t < t1:
            sel = (fl.gpu_node[idx] == node) & (fl.gpu_local[idx] != keep) & _LOCKSTEP[phase]
            if sel.any():
                phase = np.where(sel, WAIT, phase).astype(phase.dtype)
    return phase
