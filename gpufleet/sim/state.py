"""The evolving state of a set of simulated GPUs: physics, error counters, links, health, events.

:class:`SimState` is shared by the fleet generator (all GPUs, fixed steps) and by
:class:`gpufleet.sim.node.SimNode` (one node, whatever steps the agent's polls make).
"""

from __future__ import annotations

import hashlib

import numpy as np

from gpufleet.sim.activity import apply_waits, link_rates, link_share
from gpufleet.sim.fleet import Fault, Fleet
from gpufleet.sim.physics import Physics

N_ERR = 4  # nvlink counters: crc_flit, crc_data, replay, recovery
# PCIe link error counters: (healthy background per minute, errors per PCIe replay of a failing
# link). The background is the since-load mean of a healthy H200 (driver loaded ~7.1 h before
# ../shared/reference/h200/gpm_probe.json: field 169 = 1,587, 175-177 = 221/283/215, 178 = 15,
# 183 = 106); the H100 recording's counts (169 = 793, 175-177 = 18/18/15) are of the same order.
PCIE_ERRORS = {
    "pcie_l0_to_recovery_total": (3.7, 1 / 16),  # a retrain when the replay number rolls over
    "pcie_receiver_errors_total": (0.52, 1.0),
    "pcie_bad_tlp_total": (0.66, 0.5),
    "pcie_naks_sent_total": (0.5, 0.5),
    "pcie_naks_received_total": (0.0, 1.0),  # each replay answers a NAK from the link partner
    "pcie_bad_dllp_total": (0.035, 0.05),
    "pcie_lane_errors_total": (0.25, 0.3),
}
_PCIE_BG = np.array([v[0] for v in PCIE_ERRORS.values()]) / 60.0
_PCIE_PER_REPLAY = np.array([v[1] for v in PCIE_ERRORS.values()])

XID_TEXT = {
    48: "DBE (Double Bit Error) ECC Error",
    63: "Row Remapper: New row marked for remapping, reset gpu to activate.",
    64: "Row Remapper: Failed to mark row for remapping",
    74: "NVLink: fatal error detected on link {link}",
    79: "GPU has fallen off the bus.",
    92: "High single-bit ECC error rate",
    94: "Contained: SM (0x1). RST: No, D-RST: No",
    95: "Uncontained: LTC TAG (0x2,0x0). RST: Yes, D-RST: No",
}
GOOD_DIGEST = hashlib.sha256(b"gpufleet-canary-4096-fp32").hexdigest()


class SimState:
    """State of the GPUs ``idx`` (global indices) of ``fleet``; :meth:`step` advances them."""

    def __init__(self, fleet: Fleet, idx: np.ndarray):
        self.fleet = fleet
        self.idx = np.asarray(idx, dtype=np.int64)
        n = self.n = len(self.idx)
        m = fleet.constants(self.idx)
        self.m = m
        self.nvlinks = max(x.nvlinks for x in fleet.models)
        self.pos = {int(g): k for k, g in enumerate(self.idx)}
        self.faults = [f for f in fleet.faults if self._touches(f)]
        inlet0 = fleet.inlet(np.array([0.0]))[0][fleet.gpu_rack[self.idx]]
        self.phys = Physics(n, m, inlet0)
        # the driver was loaded days before the run: counters start from history
        hist = np.random.default_rng(np.random.SeedSequence([fleet.seed, 0xC0DE])).uniform(1, 20, fleet.n)[
            self.idx
        ]
        self.phys.energy_j += hist * 86400 * 310.0
        self.phys.t_cap += hist * 86400 * 0.4
        self.eff = fleet.eff[self.idx]
        self.g0 = fleet.g_gpu[self.idx] * fleet.g_node[fleet.gpu_node[self.idx]]
        # lifetime counters (the driver's volatile counters = lifetime - offset at the last reload)
        self.pcie = np.zeros(n, dtype=np.int64)
        self.sbe = np.zeros(n, dtype=np.int64)
        self.dbe = np.zeros(n, dtype=np.int64)
        self.sbe_agg0 = np.asarray(
            np.random.default_rng(np.random.SeedSequence([fleet.seed, 0xA66])).poisson(3.0, fleet.n)[
                self.idx
            ],
            dtype=np.int64,
        )
        self.remap_corr = np.zeros(n, dtype=np.int64)
        self.remap_unc = np.zeros(n, dtype=np.int64)
        self.remap_pending = np.zeros(n, dtype=np.int64)
        self.remap_fail = np.zeros(n, dtype=np.int64)
        self.off = {k: np.zeros(n) for k in ("energy", "cap", "swth", "hwth", "brake")}
        self.off_i = {k: np.zeros(n, dtype=np.int64) for k in ("pcie", "sbe", "dbe")}
        self.width = np.full(n, m.pcie_width, dtype=np.int64)
        self.gen = np.full(n, m.pcie_gen, dtype=np.int64)
        self.lost = np.zeros(n, dtype=bool)
        # NVLink: only links with a fault carry state; every other link is up with zero counters
        self.links: dict[tuple[int, int], dict] = {}
        for f in self.faults:
            if f.kind == "nvlink_degradation":
                self.links[(self.pos[f.gpu], f.link)] = {
                    "life": np.zeros(N_ERR, dtype=np.int64),
                    "off": np.zeros(N_ERR, dtype=np.int64),
                    "up": 1,
                    "fault": f,
                }
        self.done: set[tuple[int, str]] = set()  # one-shot events already fired
        self.first: dict[int, float] = {}  # id(fault) -> first time its signature showed
        self.bg_sbe = fleet.scenario.nuisances["background_sbe_per_gpu_day"] / 86400.0
        # what healthy links do: sporadic CRC errors (a few bursts), rare replays; PCIe replays
        nu = fleet.scenario.nuisances
        self.link_bg = np.zeros((n, self.nvlinks, N_ERR), dtype=np.int64)  # lifetime background counts
        self.link_bg_off = np.zeros_like(self.link_bg)
        self.bg_rates = (
            (0, nu["nvlink_crc_per_link_hour"] / 3600.0, 0),
            (1, nu["nvlink_crc_per_link_hour"] * 0.3 / 3600.0, 0),
            (0, nu["nvlink_crc_bursts_per_link_day"] / 86400.0, 10),  # a burst: 3..10 errors at once
            (2, nu["nvlink_replays_per_link_day"] / 86400.0, 0),
        )
        self.bg_pcie = nu["pcie_replays_per_gpu_hour"] / 3600.0
        # PCIe link errors since the driver loaded (the same history as the energy counter), then
        # the background: each GPU at 0.3-2x the recorded mean, plus bursts (two a GPU-day) of up
        # to a few hundred (the H200 gained 253 L0->recovery in one quarter hour)
        hrng = np.random.default_rng(np.random.SeedSequence([fleet.seed, 0x9C1E]))
        self.pcie_err_bg = _PCIE_BG[None, :] * hrng.uniform(0.3, 2.0, (fleet.n, 1))[self.idx]
        self.pcie_err = np.round(self.pcie_err_bg * (hist * 86400)[:, None]).astype(np.int64)
        self.pcie_err_off = np.zeros_like(self.pcie_err)
        # draws of their own: the other signals stay what they were without these counters
        first = int(self.idx[:1].sum())
        self.link_rng = np.random.default_rng(np.random.SeedSequence([fleet.seed, 0x11AC, first]))
        # NVLink bytes each way per link since the driver loaded (a week of traffic before the run)
        self.link_bytes = hrng.uniform(0, 7 * 86400 * 2e9, (fleet.n, self.nvlinks))[self.idx]
        self.link_bytes_off = np.zeros_like(self.link_bytes)

    def _touches(self, f: Fault) -> bool:
        fl = self.fleet
        if f.gpu is not None:
            return int(f.gpu) in self.pos
        if f.scope == "node":
            return any(fl.gpu_node[g] == f.node for g in self.idx)
        if f.scope == "rack":
            return any(fl.gpu_rack[g] == f.rack for g in self.idx)
        return False

    def _gpus_of(self, f: Fault) -> np.ndarray:
        fl = self.fleet
        if f.gpu is not None:
            return np.array([self.pos[int(f.gpu)]])
        if f.scope == "node":
            return np.nonzero(fl.gpu_node[self.idx] == f.node)[0]
        return np.nonzero(fl.gpu_rack[self.idx] == f.rack)[0]

    def driver_reload(self) -> None:
        """Volatile counters restart from zero; a pending row remap is applied."""
        p = self.phys
        self.off["energy"] = p.energy_j.copy()
        self.off["cap"], self.off["swth"] = p.t_cap.copy(), p.t_swth.copy()
        self.off["hwth"], self.off["brake"] = p.t_hwth.copy(), p.t_brake.copy()
        self.off_i["pcie"], self.off_i["sbe"], self.off_i["dbe"] = (
            self.pcie.copy(),
            self.sbe.copy(),
            self.dbe.copy(),
        )
        self.remap_pending[:] = 0
        for st in self.links.values():
            st["off"] = st["life"].copy()
        self.link_bg_off = self.link_bg.copy()
        self.pcie_err_off = self.pcie_err.copy()
        self.link_bytes_off = self.link_bytes.copy()

    def reload_gpus(self, sel: np.ndarray) -> None:
        """Driver reload on some GPUs only (a node's): offsets of those GPUs move."""
        p = self.phys
        for k, arr in (
            ("energy", p.energy_j),
            ("cap", p.t_cap),
            ("swth", p.t_swth),
            ("hwth", p.t_hwth),
            ("brake", p.t_brake),
        ):
            self.off[k][sel] = arr[sel]
        for k, arr in (("pcie", self.pcie), ("sbe", self.sbe), ("dbe", self.dbe)):
            self.off_i[k][sel] = arr[sel]
        self.remap_pending[sel] = 0
        for (k, _), st in self.links.items():
            if sel[k]:
                st["off"] = st["life"].copy()
        self.link_bg_off[sel] = self.link_bg[sel]
        self.pcie_err_off[sel] = self.pcie_err[sel]
        self.link_bytes_off[sel] = self.link_bytes[sel]

    def step(
        self,
        t: float,
        dt: float,
        phase: np.ndarray,
        inlet: np.ndarray,
        rng: np.random.Generator,
        events: list | None = None,
        jobs: np.ndarray | None = None,
    ) -> dict:
        """Advance to run time ``t`` (seconds since the run start) over ``dt``.

        ``phase``/``inlet`` are the GPUs' workload phase codes and inlet °C over the step.
        XIDs that fire are appended to ``events`` as (t, local gpu, code, message, job).
        """
        n = self.n
        g = self.g0.copy()
        brake = np.zeros(n, dtype=bool)
        strag = np.ones(n)
        slow_mem = None
        inlet = inlet.copy()
        t0 = t - dt
        tt = np.array([t])
        for f in self.faults:
            if not f.active(tt)[0] and f.kind not in ("memory_errors", "gpu_lost", "pcie_degradation"):
                continue
            sel = self._gpus_of(f)
            k = f.kind
            if k == "cooling_degradation":
                r = f.ramp(tt)[0]
                if f.scope == "rack":
                    pass  # the rack's inlet itself rises (Fleet.inlet)
                elif f.scope == "node":
                    g[sel] *= 1.0 + 1.1 * f.severity * r
                else:
                    g[sel] *= 1.0 + 1.1 * f.severity * r
            elif k == "thermal_throttle":
                g[sel] *= 1.0 + 1.5 * f.severity
            elif k == "power_brake":
                if any(a <= t < b for a, b in f.params["episodes"]):
                    brake[sel] = True
            elif k == "straggler" and f.mode == "slow_memory":
                slow_mem = np.ones(n) if slow_mem is None else slow_mem
                slow_mem[sel] = 1.0 - 0.15 * f.severity
            elif k == "straggler":
                strag[sel] = 1.0 - 0.13 * f.severity
            elif k == "gpu_lost":
                if t >= f.onset and not self.lost[sel[0]]:
                    self.lost[sel] = True
                    if events is not None:
                        events.append((f.onset, int(sel[0]), 79, XID_TEXT[79], None))
            elif k == "memory_errors":
                self._memory(f, int(sel[0]), t0, t, dt, rng, events, jobs)
            elif k == "pcie_degradation":
                self._pcie(f, int(sel[0]), t, dt, rng)
            elif k == "nvlink_degradation":
                self._nvlink(f, int(sel[0]), t, dt, rng, events)
        phase = apply_waits(self.fleet, self.idx, t, phase)  # the collective-wait nuisance
        self._background(dt, rng)
        self._link_traffic(t, dt, phase, self.link_rng)
        if self.bg_sbe > 0:
            hits = rng.random(n) < self.bg_sbe * dt
            if hits.any():
                self.sbe += hits
        limit = self.fleet.limit_at(self.idx, t)
        out = self.phys.step(dt, phase, self.eff, g, inlet, brake, strag, rng, limit, slow_mem)
        out["lost"] = self.lost.copy()
        return out

    # -- fault counters -------------------------------------------------------------------------
    def _memory(self, f: Fault, k: int, t0: float, t: float, dt: float, rng, events, jobs) -> None:
        if t < f.onset or (f.end is not None and t0 >= f.end):
            return
        rate = f.params["sbe_rate"]
        if (k, "mem0") not in self.done:
            self.done.add((k, "mem0"))
            self.sbe[k] += 1  # the first corrected error marks the onset
        if f.mode == "sbe_storm":
            # bursts of corrected errors: three minutes on, three off
            if int((t - f.onset) // 180) % 2 == 0:
                self.sbe[k] += rng.poisson(rate * min(dt, t - f.onset + 1e-9))
            self._xid_once(f, k, 92, f.onset, events, jobs)
            return
        esc = f.params["escalate_at"]
        if t < esc:
            self.sbe[k] += rng.poisson(0.2 * rate * min(dt, t - f.onset + 1e-9))
            return
        if (k, "esc") in self.done:
            return
        self.done.add((k, "esc"))
        if f.mode == "remap_pending":
            self.remap_corr[k] += 1
            self.remap_pending[k] = 1
            self._xid(esc, k, 63, events, jobs)
        elif f.mode == "remap_failed":
            self.remap_fail[k] = 1
            self._xid(esc, k, 64, events, jobs)
        elif f.mode in ("dbe", "uncontained"):
            self.dbe[k] += 1
            self.remap_unc[k] += 1
            self.remap_pending[k] = 1
            self._xid(esc, k, 48, events, jobs)
            if f.mode == "dbe":
                self._xid(esc + 0.003, k, 94, events, jobs)
                self._xid(esc + 0.007, k, 63, events, jobs)
            else:
                self._xid(esc + 0.004, k, 95, events, jobs)

    def _xid(self, when, k, code, events, jobs) -> None:
        if events is not None:
            job = int(jobs[k]) if jobs is not None and jobs[k] else None
            events.append((when, k, code, XID_TEXT[code], job))

    def _xid_once(self, f, k, code, when, events, jobs) -> None:
        if (k, f"xid{code}") not in self.done:
            self.done.add((k, f"xid{code}"))
            self._xid(when, k, code, events, jobs)

    def _pcie(self, f: Fault, k: int, t: float, dt: float, rng) -> None:
        if not f.active(np.array([t]))[0]:
            if f.mode != "replay_storm" and f.end is not None and t >= f.end:
                mk = self.fleet.model_of(int(self.idx[k]))
                self.width[k], self.gen[k] = mk.pcie_width, mk.pcie_gen
            return
        if f.mode == "replay_storm":
            r = f.params["rate"] * max(f.ramp(np.array([t]))[0], 0.05)
            replays = rng.poisson(r * dt)
            self.pcie[k] += replays
            self.pcie_err[k] += self.link_rng.poisson(replays * _PCIE_PER_REPLAY)  # the errors behind them
        elif f.mode == "width":
            self.width[k] = f.params["width"]
        elif f.mode == "gen":
            self.gen[k] = f.params["gen"]

    def _nvlink(self, f: Fault, k: int, t: float, dt: float, rng, events) -> None:
        st = self.links[(k, f.link)]
        if t < f.onset or not st["up"]:
            return
        # CRC rate grows exponentially from ~0.05/s; replays follow CRC bursts, recoveries follow
        # replays, and the link goes down at onset + growth when severity >= 1.
        x = (t - f.onset) / max(f.growth, 1e-9)
        crc = 0.05 * np.exp(7.5 * min(x, 1.0)) * f.severity
        inc = np.zeros(N_ERR, dtype=np.int64)
        inc[0] = rng.poisson(crc * dt)
        inc[1] = rng.poisson(crc * dt * 0.3)
        if x > 0.25:
            inc[2] = rng.poisson(crc * dt * 0.05)
        if x > 0.6:
            inc[3] = rng.poisson(max(crc * dt * 0.002, 0.02))
        if x <= 0.25 and (k, "nv0") not in self.done and inc[0] == 0:
            inc[0] = 1  # make the onset visible in the first step
        self.done.add((k, "nv0"))
        st["life"] += inc
        if inc[2] or inc[3]:
            st.setdefault("first_replay", t)
        if f.severity >= 1 and x >= 1.0:
            st["up"] = 0
            st["down_at"] = t
            if events is not None:
                events.append((t, k, 74, XID_TEXT[74].format(link=f.link), None))

    def _link_traffic(self, t: float, dt: float, phase: np.ndarray, rng) -> None:
        """NVLink bytes over ``dt``: the phase's traffic on every link, less on degrading links."""
        rate = link_rates(phase, self.link_bytes.shape[1], rng)
        for (k, link), st in self.links.items():
            f = st["fault"]
            if t >= f.onset:
                rate[k, link] *= link_share((t - f.onset) / max(f.growth, 1e-9), bool(st["up"]))
        self.link_bytes += rate * dt

    # -- views --------------------------------------------------------------------------------
    def counters(self) -> dict[str, np.ndarray]:
        """The driver's counters as NVML reports them now (volatile ones since the last reload)."""
        p = self.phys
        return {
            "energy_j": p.energy_j - self.off["energy"],
            "throttle_sw_power_cap_ns_total": np.round((p.t_cap - self.off["cap"]) * 1e9).astype(np.int64),
            "throttle_sw_thermal_ns_total": np.round((p.t_swth - self.off["swth"]) * 1e9).astype(np.int64),
            "throttle_hw_thermal_ns_total": np.round((p.t_hwth - self.off["hwth"]) * 1e9).astype(np.int64),
            "throttle_hw_power_brake_ns_total": np.round((p.t_brake - self.off["brake"]) * 1e9).astype(
                np.int64
            ),
            "pcie_replay_total": self.pcie - self.off_i["pcie"],
            "ecc_corrected_volatile_total": self.sbe - self.off_i["sbe"],
            "ecc_uncorrected_volatile_total": self.dbe - self.off_i["dbe"],
            "ecc_corrected_aggregate_total": self.sbe + self.sbe_agg0,
            "ecc_uncorrected_aggregate_total": self.dbe.copy(),
            "remapped_rows_correctable": self.remap_corr.copy(),
            "remapped_rows_uncorrectable": self.remap_unc.copy(),
            "remapped_rows_pending": self.remap_pending.copy(),
            "remapped_rows_failure": self.remap_fail.copy(),
            "pcie_link_gen": self.gen.copy(),
            "pcie_link_width": self.width.copy(),
            **{f: self.pcie_err[:, i] - self.pcie_err_off[:, i] for i, f in enumerate(PCIE_ERRORS)},
        }

    def _background(self, dt: float, rng: np.random.Generator) -> None:
        """Healthy links' and PCIe links' background errors over ``dt`` (a few events fleet-wide:
        drawn as one Poisson count and spread over random links, not one draw per link)."""
        flat = self.link_bg.reshape(-1)
        cells = self.link_bg.shape[0] * self.link_bg.shape[1]
        for col, rate, burst in self.bg_rates:
            k = rng.poisson(rate * dt * cells) if rate > 0 else 0
            if k:
                where = rng.integers(0, cells, k) * N_ERR + col
                np.add.at(flat, where, rng.integers(3, burst + 1, k) if burst else 1)
        k = rng.poisson(self.bg_pcie * dt * self.n) if self.bg_pcie > 0 else 0
        if k:
            np.add.at(self.pcie, rng.integers(0, self.n, k), 1)
        r2 = self.link_rng
        self.pcie_err += r2.poisson(self.pcie_err_bg * dt)
        k = r2.poisson(2 / 86400 * dt * self.n)
        if k:  # bursts: a few hundred L0->recovery and tens of errors at once
            where = r2.integers(0, self.n, k)
            self.pcie_err[where] += r2.poisson(_PCIE_BG * 60 * r2.uniform(10, 60, (k, 1)))

    def link_counts(self) -> np.ndarray:
        """Every link's counters as the driver reports them now: (GPU, link, crc_flit, crc_data,
        replay, recovery, tx bytes, rx bytes), background plus the faulty links' own."""
        v = self.link_bg - self.link_bg_off
        for (k, link), st in self.links.items():
            v[k, link] += st["life"] - st["off"]
        b = self._bytes()
        return np.concatenate([v, b[..., None], b[..., None]], axis=2)

    def _bytes(self) -> np.ndarray:
        """Bytes each way per link since the driver loaded, in NVML's KiB steps."""
        return (np.floor((self.link_bytes - self.link_bytes_off) / 1024) * 1024).astype(np.int64)

    def link_up(self) -> np.ndarray:
        up = np.ones(self.link_bg.shape[:2], dtype=np.int64)
        for (k, link), st in self.links.items():
            up[k, link] = int(st["up"])
        return up

    def link_rows(self, k: int) -> list[tuple[int, ...]]:
        """(link, up, crc_flit, crc_data, replay, recovery, tx bytes, rx bytes) for every link of
        local GPU ``k``."""
        v = self.link_bg[k] - self.link_bg_off[k]
        b = self._bytes()[k]
        out = []
        for link in range(self.fleet.model_of(int(self.idx[k])).nvlinks):
            st = self.links.get((k, link))
            c = v[link] + (st["life"] - st["off"] if st is not None else 0)
            up = int(st["up"]) if st is not None else 1
            out.append((link, up, int(c[0]), int(c[1]), int(c[2]), int(c[3]), int(b[link]), int(b[link])))
        return out

    def canary(self, k: int, t: float, rng: np.random.Generator) -> tuple[int, int, str]:
        """(passed, mismatches, digest) of a known-answer check on local GPU ``k`` at run time ``t``."""
        for f in self.faults:
            if (
                f.kind == "sdc"
                and f.gpu is not None
                and self.pos[int(f.gpu)] == k
                and f.active(np.array([t]))[0]
            ):
                if rng.random() < f.probability:
                    self.first.setdefault(id(f), t)
                    mism = int(rng.integers(1, 4096))
                    bad = hashlib.sha256(f"{f.params['digest_salt']}:{mism}".encode()).hexdigest()
                    return 0, mism, bad
        return 1, 0, GOOD_DIGEST
