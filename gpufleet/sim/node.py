"""One node of a simulated fleet, live: the node-state source of the agent's ``sim`` backend.

``SimNode(host, seed=0, scenario="mixed")`` builds the same fleet as ``gpufleet sim`` with
those parameters (same topology, jobs and faults) and plays the node ``host``: the sim
timeline starts when the object is built and advances with the ``t`` passed to
:meth:`SimNode.gpus` (seconds since the epoch), times ``speed``. Sensor noise comes from the
node's own random stream, so values differ sample by sample from a file run, but the node's
workload and faults are the fleet's.

``SimNode.from_host(host)`` reads ``GPUFLEET_SIM_SEED``, ``GPUFLEET_SIM_SCENARIO``,
``GPUFLEET_SIM_NODES``, ``GPUFLEET_SIM_GPUS_PER_NODE``, ``GPUFLEET_SIM_DURATION``,
``GPUFLEET_SIM_STEP``, ``GPUFLEET_SIM_SPEED`` and ``GPUFLEET_SIM_T0`` (epoch seconds of sim time 0)
from the environment (defaults 0, mixed, the scenario's size or enough to hold ``host``, 8, 6h,
10s, 1, now).
"""

from __future__ import annotations

import os
import re
import time

import numpy as np

from gpufleet.errors import GpufleetError
from gpufleet.sim import scenario as scen
from gpufleet.sim.engine import NVLINK_FIELDS, SENSOR_KEYS, SIM_GPU_FIELDS, gpu_values
from gpufleet.sim.fleet import Fleet
from gpufleet.sim.state import SimState
from gpufleet.sim.units import parse_duration

MAX_SUBSTEP = 10.0


class SimNode:
    """gpus(t): one dict per GPU (``gpu`` fields, index, uuid, model, pci_bus_id, health, nvlink)."""

    def __init__(
        self,
        host: str,
        seed: int = 0,
        scenario: str = "mixed",
        nodes: int | None = None,
        gpus_per_node: int | None = None,
        duration: float | str = "6h",
        step: float | str = "10s",
        speed: float = 1.0,
        t0: float | None = None,
    ):
        sc = scen.load(scenario)
        dur = parse_duration(duration, "duration")
        stp = parse_duration(step, "step")
        if not speed > 0:
            raise GpufleetError(f"speed must be positive, got {speed!r}")
        self.fleet = Fleet(sc, seed=seed, duration=dur, step=stp, nodes=nodes, gpus_per_node=gpus_per_node)
        if host not in self.fleet.host_index:
            raise GpufleetError(
                f"{host!r} is not a host of the simulated fleet "
                f"({self.fleet.hosts[0]}..{self.fleet.hosts[-1]})"
            )
        self.host = host
        self.node = self.fleet.host_index[host]
        self.idx = np.nonzero(self.fleet.gpu_node == self.node)[0]
        self._seed = seed
        self._reset()
        self.speed = float(speed)
        self.t0 = time.time() if t0 is None else float(t0)
        self._rack = int(self.fleet.node_rack[self.node])
        self._reloads = [r for r in self.fleet.driver_reloads if r[0] == self.node]

    @classmethod
    def from_host(cls, host: str) -> SimNode:
        """A node configured from ``GPUFLEET_SIM_*`` environment variables (see the module doc)."""
        env = os.environ
        scenario = env.get("GPUFLEET_SIM_SCENARIO", "mixed")
        try:
            seed = int(env.get("GPUFLEET_SIM_SEED", "0"))
            speed = float(env.get("GPUFLEET_SIM_SPEED", "1"))
            nodes = int(env["GPUFLEET_SIM_NODES"]) if env.get("GPUFLEET_SIM_NODES") else None
            gpn = int(env["GPUFLEET_SIM_GPUS_PER_NODE"]) if env.get("GPUFLEET_SIM_GPUS_PER_NODE") else None
            t0 = float(env["GPUFLEET_SIM_T0"]) if env.get("GPUFLEET_SIM_T0") else None
        except ValueError as exc:
            raise GpufleetError(f"bad GPUFLEET_SIM_* setting: {exc}") from None
        if nodes is None:
            m = re.fullmatch(r"gpu(\d{4,})", host)
            if m:
                nodes = max(int(m.group(1)), int(scen.load(scenario).fleet["nodes"]))
        return cls(
            host,
            seed=seed,
            scenario=scenario,
            nodes=nodes,
            gpus_per_node=gpn,
            duration=env.get("GPUFLEET_SIM_DURATION", "6h"),
            step=env.get("GPUFLEET_SIM_STEP", "10s"),
            speed=speed,
            t0=t0,
        )

    def sim_time(self, t: float) -> float:
        """Epoch seconds -> seconds on the sim timeline."""
        return max(0.0, (float(t) - self.t0) * self.speed)

    def _advance(self, target: float) -> dict:
        fl = self.fleet
        out = None
        # at most ~360 sub-steps per call: a long jump is stepped coarsely (the physics is exact)
        substep = max(MAX_SUBSTEP, (target - self.sim_t) / 360)
        while self.sim_t < target - 1e-9 or out is None:
            dt = min(substep, target - self.sim_t) if target > self.sim_t else 1e-3
            t = self.sim_t + dt
            phase, jobs = fl.phase_at(self.node, np.array([t - dt / 2]))
            phase = np.repeat(phase, len(self.idx))
            jobs = np.repeat(jobs, len(self.idx))
            inlet = np.repeat(fl.inlet(np.array([t]))[0][self._rack], len(self.idx))
            evs: list = []
            for _node, _a, b in self._reloads:
                if self.sim_t < b <= t:  # the driver came back: volatile counters restart
                    self.state.reload_gpus(np.ones(len(self.idx), dtype=bool))
            o = self.state.step(t, dt, phase, inlet, self.rng, evs, jobs)
            for when, k, code, msg, _job in evs:
                self.events.append((self.t0 + when / self.speed, int(fl.gpu_local[self.idx[k]]), code, msg))
            self.sim_t = t
            out = (o, phase, jobs)
        return out

    def _reset(self) -> None:
        """Back to the start of the timeline (same node, same faults, same noise stream)."""
        self.state = SimState(self.fleet, self.idx)
        self.rng = np.random.default_rng(np.random.SeedSequence([self._seed, 0x40DE, self.node]))
        self.sim_t = 0.0
        self.events: list[tuple[float, int, int, str]] = []  # (epoch seconds, gpu index, xid, message)
        self._last: list[dict] | None = None

    def gpus(self, t: float) -> list[dict]:
        target = self.sim_time(t)
        if target < self.sim_t - 1e-6:
            # time went backwards (e.g. a probe at wall-clock time before the first poll on the
            # fleet's clock): replay the timeline from its start, deterministically
            self._reset()
        if self._last is not None and target <= self.sim_t + 1e-9:
            return [dict(d) for d in self._last]
        o, phase, jobs = self._advance(target)
        fl = self.fleet
        st = self.state
        A = {k: o[k][None, :] for k in SENSOR_KEYS}
        A["_m"] = fl.constants(self.idx)
        B = {k: v[None, :] for k, v in st.counters().items()}
        V = gpu_values(fl, self.rng, A, B, phase[None, :], jobs[None, :])
        reloading = any(a <= self.sim_t < b for _n, a, b in self._reloads)
        out = []
        for k, g in enumerate(self.idx.tolist()):
            local = int(fl.gpu_local[g])
            d: dict = {
                "index": local,
                "uuid": fl.uuids[g],
                "model": fl.model_of(g).name,
                "pci_bus_id": fl.pci[local],
                "health": "lost" if o["lost"][k] else "stale" if reloading else "up",
            }
            for name in SIM_GPU_FIELDS:
                if name in ("up", "health_code", "job_id"):
                    continue
                v = V.get(name)
                if isinstance(v, np.ndarray):
                    d[name] = v[0, k].item()
            if jobs[k]:
                d["job_id"] = str(int(jobs[k]))
            d["nvlink"] = [dict(zip(NVLINK_FIELDS, vals, strict=True)) for _link, *vals in st.link_rows(k)]
            out.append(d)
        self._last = out
        return [dict(d) for d in out]

    def canary(self, index: int, t: float) -> tuple[int, int, str]:
        """(passed, mismatches, digest) of a known-answer check on GPU ``index`` at epoch ``t``."""
        return self.state.canary(index, self.sim_time(t), self.rng)
