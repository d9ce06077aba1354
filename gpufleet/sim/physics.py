"""GPU physics, vectorised over the fleet: power, clocks, temperatures, reason bits, counters.

Calibrated on one real H200 SXM (``../shared/reference/h200/trace.csv``, docs/calibration.md):

- power: ``P = P_base + D * r**ALPHA`` with ``r`` the SM clock as a share of its maximum and
  ``D`` the phase's dynamic power at full clock (per-GPU efficiency spread). When ``P`` at full
  clock exceeds the power limit, the clock drops until ``P`` sits just under the limit and
  reason 0x4 (SW power cap) is set: compute-bound work runs at ~690 W and 1470-1530 MHz. That
  is healthy.
- GPU temperature: ``T = T_base + g * (R_FAST * ema(P - W_MEM * util_mem, TAU_FAST)
  + R_SLOW * ema(P, TAU_SLOW))`` where ``T_base`` follows the rack inlet and ``g`` is the
  cooling factor (1 = healthy; a degrading heatsink or a failing fan raises it). Memory
  temperature follows memory traffic within a second and power with a slow (~30 s) lag.
- Steps may be long (10 s): exponential responses are solved exactly over the step, and the
  thermal controller is solved for the power that keeps the temperature at the SW thermal
  target. The throttle-time counters integrate the throttled share of each step.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

# clock-event reason bits (NVML)
IDLE, SW_POWER_CAP, HW_SLOWDOWN, SYNC_BOOST = 0x1, 0x4, 0x8, 0x10
SW_THERMAL, HW_THERMAL, HW_POWER_BRAKE = 0x20, 0x40, 0x80

# workload phases: code -> (name, util_gpu %, util_mem %, dynamic watts at full clock, busy)
PHASES = (
    ("idle", 0.0, 0.0, 0.0),  # no process: deep idle, 345 MHz, reason 0x1
    ("setup", 0.0, 0.0, 0.0),  # a process holds the GPU, no kernels: clocked-up idle
    ("compute", 100.0, 25.0, 1158.0),  # compute-bound GEMM: power-capped
    ("memory", 100.0, 100.0, 444.0),  # memory-bound: full clock, ~566 W
    ("comm", 62.0, 18.0, 230.0),  # communication waits
    ("checkpoint", 4.0, 3.0, 14.0),  # checkpoint stall
    ("eval", 88.0, 45.0, 520.0),  # evaluation
    ("collective_wait", 100.0, 5.0, 150.0),  # spinning in a collective for peers (gpufleet.sim.activity)
)
PHASE_CODE = {p[0]: i for i, p in enumerate(PHASES)}
_UTIL = np.array([p[1] for p in PHASES])
_UMEM = np.array([p[2] for p in PHASES])
_DYN = np.array([p[3] for p in PHASES])


@dataclass(frozen=True)
class GpuModel:
    """One GPU model's constants (defaults: NVIDIA H200 SXM, as measured)."""

    name: str = "NVIDIA H200"
    memory_total_bytes: int = 143771 * 1024 * 1024
    memory_idle_bytes: int = 615 * 1024 * 1024
    memory_context_bytes: int = 5495 * 1024 * 1024
    power_limit: float = 700.0
    cap_margin: float = 9.0  # the power controller holds the 1 s average ~9 W under the limit
    p_deep_idle: float = 79.4
    p_clocked_idle: float = 122.0
    f_max: int = 1980
    f_idle: int = 345
    f_step: int = 15
    mem_clock: int = 3201
    alpha: float = 2.5
    sw_thermal_min_ratio: float = 0.40  # lowest clock share the SW thermal controller uses
    hw_slowdown_ratio: float = 0.20  # clock share under HW slowdown (thermal or brake)
    t_slowdown: int = 89
    t_shutdown: int = 95
    t_max_operating: int = 87
    t_mem_max: int = 95
    t_sw_target: float = 87.0
    # GPU temperature: T = inlet + T_OFFSET + g * (R_FAST * ema_fast(P - W_MEM*umem) + R_SLOW * ema_slow(P))
    t_offset: float = 9.2
    r_fast: float = 0.0363
    tau_fast: float = 0.3
    w_mem: float = 1.67
    r_slow: float = 0.0064
    tau_slow: float = 60.0
    # memory temperature: Tm = inlet + TM_OFFSET + g*(RM_P*ema(P, TAU_MEM) + RM_U*ema(umem, TAU_FAST)
    #                                                 + RM_F*ema(P, TAU_MEM_FAST))
    tm_offset: float = 11.2
    rm_p: float = 0.0108
    rm_u: float = 0.127
    rm_f: float = 0.00989
    tau_mem: float = 30.0
    tau_mem_fast: float = 1.0
    pcie_gen: int = 5
    pcie_width: int = 16
    nvlinks: int = 18
    dyn_scale: float = 1.0  # a phase's dynamic power at full clock, as a share of the H200's


H200 = GpuModel()
# Other generations, from their public specifications (NVIDIA's data sheets: board power, memory,
# boost and memory clocks, PCIe generation, NVLink count) and scaled from the measured H200 where
# a specification says nothing (idle power, thermal resistance: an A100 SXM4 under a 400 W GEMM
# sits at ~65 °C with a 24 °C inlet, a steeper °C per W than the H200's 700 W heatsink)
H100 = GpuModel(
    name="NVIDIA H100 80GB HBM3",
    memory_total_bytes=81559 * 1024 * 1024,
    memory_idle_bytes=590 * 1024 * 1024,
    p_deep_idle=71.0,
    p_clocked_idle=116.0,
    mem_clock=2619,
    t_slowdown=89,
    t_shutdown=92,
    t_max_operating=87,
    r_fast=0.0375,
    r_slow=0.0066,
    dyn_scale=0.97,
)
A100 = GpuModel(
    name="NVIDIA A100-SXM4-80GB",
    memory_total_bytes=81920 * 1024 * 1024,
    memory_idle_bytes=4 * 1024 * 1024,
    memory_context_bytes=3030 * 1024 * 1024,
    power_limit=400.0,
    cap_margin=6.0,
    p_deep_idle=58.0,
    p_clocked_idle=84.0,
    f_max=1410,
    f_idle=210,
    mem_clock=1593,
    t_slowdown=89,
    t_shutdown=92,
    t_max_operating=85,
    t_sw_target=85.0,
    t_offset=8.0,
    r_fast=0.068,
    r_slow=0.012,
    rm_p=0.018,
    pcie_gen=4,
    nvlinks=12,
    dyn_scale=0.58,
)
MODELS = {m.name: m for m in (H200, H100, A100)}
_ALIASES = {"h200": H200, "h100": H100, "a100": A100}


def model_named(name: str) -> GpuModel | None:
    """A known model by its NVML name or a short alias (h200, h100, a100); None if unknown."""
    return MODELS.get(name) or _ALIASES.get(str(name).lower())


class Stacked:
    """Several models' constants per GPU: each field an array over the GPUs (a scalar where every
    GPU has the same value), so :class:`Physics` steps a mixed fleet as one. Time constants must
    agree (they enter as scalars)."""

    def __init__(self, models: list[GpuModel], which: np.ndarray):
        which = np.asarray(which, dtype=np.int64)
        self.models, self.which = list(models), which
        for f in GpuModel.__dataclass_fields__:
            vals = [getattr(m, f) for m in models]
            if all(v == vals[0] for v in vals):
                setattr(self, f, vals[0])
            elif f.startswith("tau"):
                raise ValueError(f"models differ in {f}: not supported")
            elif f == "name":
                self.name = np.array(vals, dtype=object)[which]
            else:
                setattr(self, f, np.asarray(vals)[which])

    def subset(self, idx: np.ndarray) -> Stacked:
        return Stacked(self.models, self.which[np.asarray(idx, dtype=np.int64)])


class Physics:
    """State of ``n`` GPUs; :meth:`step` advances them by ``dt`` seconds under given inputs."""

    def __init__(self, n: int, model: GpuModel = H200, inlet0: np.ndarray | float = 25.0):
        self.n = n
        self.m = model
        inlet0 = np.broadcast_to(np.asarray(inlet0, dtype=float), (n,)).copy()
        p0 = np.broadcast_to(np.asarray(model.p_deep_idle, dtype=float), (n,)).copy()
        self.xf = p0.copy()  # ema_fast(P - W_MEM*umem)
        self.xs = p0.copy()  # ema_slow(P)
        self.xmp = p0.copy()  # ema_mem(P)
        self.xmu = np.zeros(n)  # ema_mem(umem)
        self.xmf = p0.copy()  # ema_fast(P) for memory temperature
        self.pavg = p0.copy()  # driver's ~1 s power average
        self.temp = inlet0 + model.t_offset + model.r_fast * p0 + model.r_slow * p0
        self.energy_j = np.zeros(n)  # lifetime energy (J)
        self.t_cap = np.zeros(n)  # lifetime throttle seconds per reason
        self.t_swth = np.zeros(n)
        self.t_hwth = np.zeros(n)
        self.t_brake = np.zeros(n)

    def step(
        self,
        dt: float,
        phase: np.ndarray,
        eff: np.ndarray,
        g: np.ndarray,
        inlet: np.ndarray,
        brake: np.ndarray,
        strag: np.ndarray,
        rng: np.random.Generator,
        limit: np.ndarray | None = None,
        slow_mem: np.ndarray | None = None,
    ) -> dict[str, np.ndarray]:
        """Advance by ``dt`` with constant inputs; return the sample at the end of the step.

        phase: phase codes; eff: dynamic-power factor (manufacturing spread, ~1); g: cooling
        factor (1 healthy); inlet: inlet air °C; brake: external power brake active; strag:
        clock share a gray-failing GPU can reach (1 healthy); limit: the power limit an operator set
        (None: the model's); slow_mem: share of its work a GPU slowed by something other than its SM
        clock gets done (1 healthy: its memory, its interconnect), which draws that much less
        dynamic power at a normal clock. Values are float arrays, not yet quantised: the caller
        rounds to NVML's integer units.
        """
        m = self.m
        n = self.n
        phase = np.asarray(phase)
        util = _UTIL[phase]
        umem = _UMEM[phase]
        dyn = _DYN[phase] * eff
        if not (isinstance(m.dyn_scale, float) and m.dyn_scale == 1.0):
            dyn = dyn * m.dyn_scale
        idle = phase == 0
        pbase = np.where(idle, m.p_deep_idle, m.p_clocked_idle)
        cap = (m.power_limit if limit is None else limit) - m.cap_margin
        with np.errstate(divide="ignore", invalid="ignore"):
            r_cap = np.where(dyn > 0, ((cap - pbase) / np.maximum(dyn, 1e-9)) ** (1.0 / m.alpha), 1.0)
        capped = r_cap < 1.0
        ratio = np.minimum(r_cap, 1.0)
        ratio = np.where(strag < 1.0, ratio * strag, ratio)
        capped &= strag >= 1.0
        if slow_mem is not None:
            # stalled on something other than its SM clock: the clock its peers run, less work done
            # per cycle, less power (under the limit: no power-cap reason)
            dyn = dyn * slow_mem
            capped &= slow_mem >= 1.0
        p_dem = pbase + dyn * ratio**m.alpha

        # power brake: an external signal forces HW slowdown regardless of temperature
        ratio_b = np.minimum(ratio, m.hw_slowdown_ratio)
        p_brake = pbase + dyn * ratio_b**m.alpha
        p_dem = np.where(brake, p_brake, p_dem)
        ratio = np.where(brake, ratio_b, ratio)
        capped &= ~brake

        # thermal: the temperature at the end of the step is linear in the step's power
        ef = math.exp(-dt / m.tau_fast)
        es = math.exp(-dt / m.tau_slow)
        base = inlet + m.t_offset
        a = base + g * (m.r_fast * (-m.w_mem * umem * (1 - ef) + self.xf * ef) + m.r_slow * self.xs * es)
        b = g * (m.r_fast * (1 - ef) + m.r_slow * (1 - es))
        t_start = self.temp
        t_end_dem = a + b * p_dem
        hot = t_end_dem > m.t_sw_target
        p_allow = (m.t_sw_target - a) / b
        p_min_sw = pbase + dyn * m.sw_thermal_min_ratio**m.alpha
        p_hw = pbase + dyn * m.hw_slowdown_ratio**m.alpha
        sw = hot & (dyn > 0) & ~brake
        p_sw = np.maximum(p_allow, p_min_sw)
        p_end = np.where(sw, np.minimum(p_dem, p_sw), p_dem)
        t_end = a + b * p_end
        hw = sw & (t_end >= m.t_slowdown)
        p_end = np.where(hw, p_hw, p_end)
        t_end = a + b * p_end
        # share of the step spent throttled: when the unthrottled response crosses the target
        span = np.maximum(t_end_dem - t_start, 1e-9)
        share = np.where(t_start >= m.t_sw_target, 1.0, np.clip((t_end_dem - m.t_sw_target) / span, 0, 1))
        share = np.where(sw, share, 0.0)
        hw_share = np.where(hw, np.clip((t_end_dem - m.t_slowdown) / span, 0.05, 1.0), 0.0)
        p_step = (1 - share) * p_dem + share * p_end
        ratio_end = np.where(
            sw, np.clip(((p_end - pbase) / np.maximum(dyn, 1e-9)) ** (1 / m.alpha), 0, 1), ratio
        )
        sw_end = sw & (p_end < p_dem - 0.5)
        capped_end = capped & ~sw_end

        # state updates (exact exponential responses over the step)
        pdie = p_end - m.w_mem * umem
        self.xf = pdie + (self.xf - pdie) * ef
        self.xs = p_end + (self.xs - p_end) * es
        em = math.exp(-dt / m.tau_mem)
        emf = math.exp(-dt / m.tau_mem_fast)
        self.xmp = p_end + (self.xmp - p_end) * em
        self.xmu = umem + (self.xmu - umem) * ef
        self.xmf = p_end + (self.xmf - p_end) * emf
        self.temp = base + g * (m.r_fast * self.xf + m.r_slow * self.xs)
        tmem = inlet + m.tm_offset + g * (m.rm_p * self.xmp + m.rm_u * self.xmu + m.rm_f * self.xmf)
        ea = math.exp(-dt / 0.5)
        self.pavg = p_end + (self.pavg - p_end) * ea
        self.energy_j += p_step * dt
        self.t_cap += np.where(capped, dt * (1 - share), 0.0)
        self.t_swth += share * dt
        self.t_hwth += hw_share * dt
        self.t_brake += np.where(brake, dt, 0.0)

        # what NVML would say at the end of the step
        reasons = np.zeros(n, dtype=np.int64)
        reasons |= np.where(idle, IDLE, 0)
        reasons |= np.where(capped_end, SW_POWER_CAP, 0)
        reasons |= np.where(sw_end, SW_THERMAL, 0)
        reasons |= np.where(hw, HW_THERMAL | HW_SLOWDOWN, 0)
        reasons |= np.where(brake, HW_POWER_BRAKE | HW_SLOWDOWN, 0)
        ratio_end = np.where(hw, m.hw_slowdown_ratio, ratio_end)
        clock = np.where(idle, m.f_idle * 1.0, ratio_end * m.f_max)
        busy = util > 0
        jitter = rng.integers(-1, 2, n) * m.f_step
        clock = np.where(capped_end, clock + jitter, clock)
        clock = np.clip(np.round(clock / m.f_step) * m.f_step, m.f_idle, m.f_max)
        # utilisation drops a little when clocks are held down by something other than the cap
        slow = np.clip(ratio_end / np.maximum(ratio, 1e-9), 0, 1)
        util_g = np.where(
            busy, np.clip(util * np.where(strag < 1, 0.93, 1.0) + rng.normal(0, 0.6, n), 0, 100), 0
        )
        util_m = np.where(busy, np.clip(umem * np.where(busy, slow, 1) + rng.normal(0, 0.6, n), 0, 100), 0)
        noise_p = np.where(busy, 1.2, 0.05)
        power = np.maximum(self.pavg + rng.normal(0, 1, n) * noise_p, 1.0)
        power_inst = np.maximum(p_end + rng.normal(0, 1, n) * np.where(busy, 16.0, 0.4), 1.0)
        # throttling as the physics has it (ground truth, never read from a counter or a reason bit):
        # the die held at the thermal controller's target (or at slowdown) with its clock, hence its
        # power, cut below what the load and the power limit would draw
        thermal_cut = (sw_end | hw) & (self.temp >= m.t_sw_target - 0.5) & (p_end < p_dem - 0.5)
        return {
            "thermal_cut": thermal_cut,
            "hw_cut": hw & thermal_cut,
            "utilization_gpu": util_g,
            "utilization_memory": util_m,
            "power": power,
            "power_instant": power_inst,
            "energy_j": self.energy_j.copy(),
            "temperature_gpu": self.temp + rng.normal(0, 0.15, n),
            "temperature_memory": tmem + rng.normal(0, 0.15, n),
            "clock_sm": clock,
            "reasons": reasons,
            "t_cap": self.t_cap.copy(),
            "t_swth": self.t_swth.copy(),
            "t_hwth": self.t_hwth.copy(),
            "t_brake": self.t_brake.copy(),
            "phase": phase.astype(np.float64),  # as run (after the collective-wait nuisance)
            "strag": strag.copy() if slow_mem is None else strag * slow_mem,  # share of its speed
            "limit": np.broadcast_to(
                np.asarray(m.power_limit if limit is None else limit, float), (n,)
            ).copy(),
        }
