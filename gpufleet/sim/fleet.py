"""The fleet's fixed parts, drawn once from the seed: topology, spreads, job schedule, faults.

Everything here is a pure function of (scenario, seed, size, duration, step), so the file
generator and :class:`gpufleet.sim.node.SimNode` see the same fleet.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from gpufleet.errors import GpufleetError
from gpufleet.sim.physics import H200, PHASE_CODE, GpuModel, Stacked, model_named
from gpufleet.sim.scenario import FaultSpec, Scenario

RACK_INLET_RISE_C = 12.0  # a rack-scope cooling fault at severity 1 raises the rack's inlet this much
HGX_BUS = (0x18, 0x2A, 0x3A, 0x5D, 0x9A, 0xAB, 0xBA, 0xDB, 0x1B, 0x2B, 0x3B, 0x5E, 0x9B, 0xAC, 0xBB, 0xDC)

IDLE, SETUP, COMPUTE, MEMORY, COMM, CKPT, EVAL = (
    PHASE_CODE[k] for k in ("idle", "setup", "compute", "memory", "comm", "checkpoint", "eval")
)


@dataclass
class Fault:
    """One injected fault, resolved to a target and times (seconds from the run start)."""

    kind: str
    mode: str
    scope: str  # gpu | link | node | rack
    node: int | None
    gpu: int | None  # global GPU index
    link: int | None
    rack: int | None
    onset: float
    end: float | None  # None: lasts to the end of the run
    growth: float
    severity: float
    probability: float = 0.5
    params: dict = field(default_factory=dict)

    def ramp(self, t: np.ndarray) -> np.ndarray:
        """0 before onset, rising linearly to 1 over ``growth``, 0 again after ``end``."""
        x = np.clip((t - self.onset) / max(self.growth, 1e-9), 0.0, 1.0)
        x = np.where(t < self.onset, 0.0, x)
        if self.end is not None:
            x = np.where(t >= self.end, 0.0, x)
        return x

    def active(self, t: np.ndarray) -> np.ndarray:
        a = t >= self.onset
        if self.end is not None:
            a &= t < self.end
        return a


class Fleet:
    """Topology, per-GPU spreads, the job schedule and the resolved faults of one simulated fleet."""

    def __init__(
        self,
        scenario: Scenario,
        seed: int,
        duration: float,
        step: float,
        nodes: int | None = None,
        gpus_per_node: int | None = None,
        model: GpuModel = H200,
    ):
        if nodes is not None and nodes < 1:
            raise GpufleetError(f"--nodes must be at least 1, got {nodes}")
        if gpus_per_node is not None and not 1 <= gpus_per_node <= 16:
            raise GpufleetError(f"--gpus-per-node must be 1..16, got {gpus_per_node}")
        if not duration > 0:
            raise GpufleetError("duration must be positive")
        if not step > 0 or step > duration:
            raise GpufleetError(f"step must be positive and at most the duration, got {step}")
        self.scenario = scenario
        self.seed = int(seed)
        self.model = model
        self.duration = float(duration)
        self.step = float(step)
        self.n_steps = int(round(self.duration / self.step))
        self.start = float(scenario.fleet["start"])
        self.n_nodes = int(nodes if nodes is not None else scenario.fleet["nodes"])
        self.gpn = int(gpus_per_node if gpus_per_node is not None else scenario.fleet["gpus_per_node"])
        self.n = self.n_nodes * self.gpn
        npr = int(scenario.fleet["nodes_per_rack"])
        rpc = int(scenario.fleet["racks_per_cluster"])
        rng = np.random.default_rng(np.random.SeedSequence([self.seed, 0x5EED]))
        self.node_rack = np.arange(self.n_nodes) // npr
        self.n_racks = int(self.node_rack[-1]) + 1
        self.rack_cluster = np.arange(self.n_racks) // rpc
        self.hosts = [f"gpu{i + 1:04d}" for i in range(self.n_nodes)]
        self.racks = [f"r{i + 1:03d}" for i in range(self.n_racks)]
        self.clusters = [f"sim{c + 1}" for c in range(int(self.rack_cluster[-1]) + 1)]
        self.host_index = {h: i for i, h in enumerate(self.hosts)}
        self.rack_index = {r: i for i, r in enumerate(self.racks)}
        self.gpu_node = np.repeat(np.arange(self.n_nodes), self.gpn)
        self.gpu_local = np.tile(np.arange(self.gpn), self.n_nodes)
        self.gpu_rack = self.node_rack[self.gpu_node]
        words = rng.integers(0, 2**32, size=(self.n, 4), dtype=np.uint64)
        self.uuids = [
            f"GPU-{int(w[0]):08x}-{int(w[1]) >> 16:04x}-{int(w[1]) & 0xFFFF:04x}-"
            f"{int(w[2]) >> 16:04x}-{int(w[2]) & 0xFFFF:04x}{int(w[3]):08x}"
            for w in words
        ]
        self.pci = [f"00000000:{HGX_BUS[i % len(HGX_BUS)]:02X}:00.0" for i in range(self.gpn)]
        # manufacturing spread and shared cooling
        self.eff = np.clip(rng.normal(1.0, 0.02, self.n), 0.94, 1.06)
        self.g_gpu = np.clip(rng.lognormal(0.0, 0.04, self.n), 0.9, 1.12)
        self.g_node = np.clip(rng.normal(1.0, 0.03, self.n_nodes), 0.92, 1.08)
        self.inlet_rack = rng.normal(0.0, 1.0, self.n_racks)
        self.inlet_phase = rng.uniform(0, 2 * np.pi)
        # slow inlet drift per rack: a few random-walk knots across the run
        knots = max(2, int(self.duration / 3600) + 2)
        self.drift_t = np.linspace(0, self.duration, knots)
        self.drift = np.cumsum(
            rng.normal(0, scenario.nuisances["inlet_drift_c"] / 2, (knots, self.n_racks)), 0
        )
        self._generations(np.random.default_rng(np.random.SeedSequence([self.seed, 0x6E4E])))
        self._schedule(np.random.default_rng(np.random.SeedSequence([self.seed, 0x10B5])))
        self.faults: list[Fault] = []
        self.notes: list[str] = []
        self._faults(np.random.default_rng(np.random.SeedSequence([self.seed, 0xFA17])))
        self._nuisances(np.random.default_rng(np.random.SeedSequence([self.seed, 0x2015])))
        self._site_life(np.random.default_rng(np.random.SeedSequence([self.seed, 0x0BE5])))

    # -- generations ----------------------------------------------------------------------------
    def _generations(self, rng: np.random.Generator) -> None:
        """Which GPU model each node has: ``fleet.generations`` = [[model, share of nodes], ...]
        places each other generation on whole racks where the fleet has several (a contiguous run of
        nodes otherwise); the rest are ``fleet.model``. ``pm``: the per-GPU constants (the model
        itself where the fleet has one)."""
        models = [self.model]
        which = np.zeros(self.n_nodes, dtype=np.int64)
        free = np.ones(self.n_nodes, dtype=bool)
        for name, share in self.scenario.fleet.get("generations", []):
            m = model_named(name)
            if m is None:
                raise GpufleetError(f"fleet.generations: unknown GPU model {name!r}")
            k = min(int(round(share * self.n_nodes)), int(free.sum()))
            if k <= 0:
                continue
            if m not in models:
                models.append(m)
            npr = int(self.scenario.fleet["nodes_per_rack"])
            starts = [i for i in range(0, self.n_nodes, npr) if free[i]] or [int(np.flatnonzero(free)[0])]
            at = int(starts[int(rng.integers(0, len(starts)))])
            for i in list(range(at, self.n_nodes)) + list(range(0, at)):
                if k == 0:
                    break
                if free[i]:
                    which[i], free[i], k = models.index(m), False, k - 1
        self.models = models
        self.node_model = which
        self.gpu_model = which[self.gpu_node]
        self.pm = self.model if len(models) == 1 else Stacked(models, self.gpu_model)

    def model_of(self, g: int) -> GpuModel:
        """The model of global GPU ``g``."""
        return self.models[int(self.gpu_model[g])]

    def constants(self, idx: np.ndarray):
        """Per-GPU model constants of GPUs ``idx`` (the model itself where the fleet has one)."""
        return self.pm if len(self.models) == 1 else self.pm.subset(idx)

    # -- site life (nuisances with no truth) ------------------------------------------------------
    def _site_life(self, rng: np.random.Generator) -> None:
        """Operator power caps, maintenance drains, job restarts and warm racks, drawn from their own
        stream (a scenario without them is the fleet it was)."""
        nu = self.scenario.nuisances
        d = self.duration
        faulty_racks = {f.rack for f in self.faults if f.scope == "rack"}
        # (node, t0, t1, share of the model's power limit)
        self.power_caps = []
        for _ in range(int(nu.get("power_caps", 0))):
            node = int(rng.integers(0, self.n_nodes))
            t0 = float(rng.uniform(0.05, 0.6)) * d
            t1 = t0 + float(rng.uniform(0.3, 0.6)) * d
            self.power_caps.append((node, t0, t1, float(rng.uniform(0.6, 0.8))))
        # (node, t0, t1): no job, idle. A drained node shows none of the faults that show under load
        # only (a straggler, a slow heatsink): drains land on nodes without a fault
        self.drains = []
        faulty = {f.node for f in self.faults if f.node is not None}
        free = [i for i in range(self.n_nodes) if i not in faulty and self.node_rack[i] not in faulty_racks]
        for _ in range(int(nu.get("drains", 0))):
            if not free:
                break
            node = int(free[int(rng.integers(0, len(free)))])
            t0 = float(rng.uniform(0.05, 0.8)) * d
            self.drains.append((node, t0, t0 + float(rng.uniform(1800, 3 * 3600))))
        self.restarts = []  # (job, t0, t1): every GPU of the job idle together, then setup again
        jobs = [j for j, v in self.jobs.items() if v["end"] - v["start"] > 1800]
        for _ in range(int(nu.get("job_restarts", 0))):
            if not jobs:
                break
            j = int(jobs[int(rng.integers(0, len(jobs)))])
            v = self.jobs[j]
            t0 = float(rng.uniform(v["start"] + 600, v["end"] - 900))
            self.restarts.append((j, t0, t0 + float(rng.uniform(120, 600))))
        calm = [r for r in range(self.n_racks) if r not in faulty_racks]
        # a warm rack: warm from the start, or from a step (a cooler's setpoint, a door, a neighbour's
        # exhaust) of a few minutes somewhere in the run's first half, then steady
        self.warm = np.zeros(self.n_racks)
        self.warm_from = np.full(self.n_racks, -300.0)
        for _ in range(int(nu.get("warm_racks", 0))):
            if not calm:
                break
            r = int(calm.pop(int(rng.integers(0, len(calm)))))
            self.warm[r] = float(nu.get("warm_rack_c", 5.0)) * float(rng.uniform(0.8, 1.2))
            self.warm_from[r] = -300.0 if rng.uniform() < 0.5 else float(rng.uniform(0.1, 0.5)) * d

    def limit_at(self, idx: np.ndarray, t: float):
        """The power limit (W) of GPUs ``idx`` at run time ``t``, or None where no operator changed it."""
        caps = [c for c in getattr(self, "power_caps", ()) if c[1] <= t < c[2]]
        if not caps:
            return None
        m = self.constants(idx)
        lim = np.broadcast_to(np.asarray(m.power_limit, float), (len(idx),)).copy()
        node = self.gpu_node[idx]
        for nd, _a, _b, share in caps:
            lim[node == nd] = np.round(lim[node == nd] * share / 25) * 25
        return lim

    # -- time ------------------------------------------------------------------------------
    def _at(self, value: float) -> float:
        """Scenario time: >= 0 seconds from start, < 0 a share of the run."""
        return -value * self.duration if value < 0 else value

    def inlet(self, t: np.ndarray) -> np.ndarray:
        """Inlet °C per rack at run times ``t``: shape (len(t), racks)."""
        nu = self.scenario.nuisances
        t = np.asarray(t, dtype=float)
        day = nu["inlet_diurnal_c"] * np.sin(2 * np.pi * (self.start + t) / 86400 + self.inlet_phase)
        drift = np.stack([np.interp(t, self.drift_t, self.drift[:, r]) for r in range(self.n_racks)], 1)
        out = nu["inlet_c"] + self.inlet_rack[None, :] + day[:, None] + drift
        warm = getattr(self, "warm", None)
        if warm is not None and warm.any():
            since = getattr(self, "warm_from", np.full(self.n_racks, -300.0))
            out = out + warm[None, :] * np.clip((t[:, None] - since[None, :]) / 300.0, 0.0, 1.0)
        for f in getattr(self, "faults", ()):
            if f.kind == "cooling_degradation" and f.scope == "rack":
                out[:, f.rack] += RACK_INLET_RISE_C * f.severity * f.ramp(t)
        return out

    # -- workload ----------------------------------------------------------------------------
    def _schedule(self, rng: np.random.Generator) -> None:
        """Place multi-node jobs on nodes with idle gaps; each job has one phase timeline.

        Per node: ``seg_t`` (segment start times), ``seg_phase``, ``seg_job`` (0: none) arrays.
        """
        wl = self.scenario.workload
        lo, hi = (h * 3600 for h in wl["job_hours"])
        # jobs shorter than the run make sense only at the run's scale
        lo, hi = min(lo, self.duration / 3), min(hi, self.duration)
        busy = wl["busy"]
        mean_job = (lo + hi) / 2
        gap_mean = mean_job * (1 - busy) / max(busy, 1e-6) if busy < 1 else 0.0
        idle_windows = [(self._at(s), self._at(s) + d) for s, d in wl["fleet_idle"]]
        free = rng.uniform(0, min(gap_mean, 600) if busy > 0 else 0, self.n_nodes)
        segs: list[list[tuple[float, int, int]]] = [[(0.0, IDLE, 0)] for _ in range(self.n_nodes)]
        self.jobs: dict[int, dict] = {}
        job_id = 41000 + int(rng.integers(0, 1000))
        if busy <= 0:
            free[:] = self.duration
        sizes = [s for s in wl["job_nodes"] if s <= self.n_nodes] or [1]
        while free.min() < self.duration:
            k = int(rng.choice(sizes))
            order = np.lexsort((np.arange(self.n_nodes), free))[:k]
            start = float(free[order].max()) + (rng.exponential(gap_mean) if gap_mean > 0 else 0.0)
            length = float(rng.uniform(lo, hi))
            for w0, w1 in idle_windows:
                if start < w1 and start + length > w0:
                    if start >= w0:
                        start = w1 + rng.uniform(0, 300)
                    else:
                        length = w0 - start
            end = min(start + length, self.duration + 1)
            job_id += 1
            if start < self.duration and end - start > 60:
                timeline = self._job_phases(rng, start, end)
                mem = int(rng.uniform(0.35, 0.92) * self.model.memory_total_bytes)
                self.jobs[job_id] = {"nodes": [int(i) for i in order], "start": start, "end": end, "mem": mem}
                for i in order:
                    segs[i].extend((t, ph, job_id) for t, ph in timeline)
                    segs[i].append((end, IDLE, 0))
            free[order] = max(end, float(free[order].max())) + 1.0
        self.seg_t, self.seg_phase, self.seg_job = [], [], []
        for s in segs:
            s.sort(key=lambda x: x[0])
            self.seg_t.append(np.array([x[0] for x in s]))
            self.seg_phase.append(np.array([x[1] for x in s], dtype=np.int8))
            self.seg_job.append(np.array([x[2] for x in s], dtype=np.int64))
        self.job_mem = {j: v["mem"] for j, v in self.jobs.items()}

    @staticmethod
    def _job_phases(rng: np.random.Generator, start: float, end: float) -> list[tuple[float, int]]:
        """A job's phase timeline: setup, training (compute with comm waits, memory-bound
        passages, periodic checkpoints and evaluations), teardown."""
        out = [(start, SETUP)]
        t = start + rng.uniform(20, 90)
        next_ckpt = t + rng.uniform(1200, 2400)
        next_eval = t + rng.uniform(3000, 6000)
        while t < end - 30:
            if t >= next_ckpt:
                out.append((t, CKPT))
                t += rng.uniform(40, 150)
                next_ckpt = t + rng.uniform(1200, 2400)
            elif t >= next_eval:
                out.append((t, EVAL))
                t += rng.uniform(120, 420)
                next_eval = t + rng.uniform(3000, 6000)
            else:
                u = rng.uniform()
                if u < 0.72:
                    out.append((t, COMPUTE))
                    t += rng.uniform(120, 900)
                elif u < 0.87:
                    out.append((t, COMM))
                    t += rng.uniform(10, 60)
                else:
                    out.append((t, MEMORY))
                    t += rng.uniform(30, 240)
        out = [(a, p) for a, p in out if a < end - 20]
        out.append((max(end - 20, start + 1), SETUP))
        return out

    def phase_at(self, node: int, t: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(phase codes, job ids) of one node at run times ``t``."""
        i = np.searchsorted(self.seg_t[node], t, side="right") - 1
        i = np.clip(i, 0, None)
        phase, job = self.seg_phase[node][i], self.seg_job[node][i]
        drains = [w for w in getattr(self, "drains", ()) if w[0] == node]
        restarts = getattr(self, "restarts", ())
        if drains or restarts:
            t = np.asarray(t, dtype=float)
            off = np.zeros(phase.shape, dtype=bool)
            for _nd, a, b in drains:
                off |= (t >= a) & (t < b)
            for j, a, b in restarts:
                off |= (job == j) & (t >= a) & (t < b)
                # back from the restart: the job sets up again for a minute
                back = (job == j) & (t >= b) & (t < b + 60) & (phase > 1)
                phase = np.where(back, PHASE_CODE["setup"], phase)
            phase = np.where(off, IDLE, phase).astype(self.seg_phase[node].dtype)
            job = np.where(off, 0, job)
        return phase, job

    # -- faults ------------------------------------------------------------------------------
    def _faults(self, rng: np.random.Generator) -> None:
        used_gpus: set[int] = set()
        used_nodes: set[int] = set()
        used_racks: set[int] = set()
        gpu_order = [int(x) for x in rng.permutation(self.n)]
        node_order = [int(x) for x in rng.permutation(self.n_nodes)]
        rack_order = [int(x) for x in rng.permutation(self.n_racks)]
        # the widest scopes first, so a rack or node fault still finds a fault-free rack or node
        rank = {"rack": 0, "node": 1, "node_idle": 1}
        for spec in sorted(self.scenario.faults, key=lambda s: rank.get(s.mode or "", 2)):
            scope = {"node": "node", "node_idle": "node", "rack": "rack"}.get(spec.mode, "gpu")
            if spec.kind == "nvlink_degradation":
                scope = "link"
            for _ in range(spec.count):
                target = self._target(
                    spec, scope, rng, gpu_order, node_order, rack_order, used_gpus, used_nodes, used_racks
                )
                if target is None:
                    self.notes.append(f"{spec.kind}/{spec.mode}: fleet too small for another target; skipped")
                    break
                node, gpu, rack = target
                self.faults.append(self._resolve(spec, scope, node, gpu, rack, rng))
        for f in self.faults:
            if f.mode == "node_idle":
                self._idle_from(f.node, max(0.0, f.onset - 1800.0))

    def _idle_from(self, node: int, t0: float) -> None:
        """The node runs no job from ``t0`` on (drained, or simply not scheduled)."""
        keep = self.seg_t[node] < t0
        self.seg_t[node] = np.append(self.seg_t[node][keep], t0)
        self.seg_phase[node] = np.append(self.seg_phase[node][keep], np.int8(IDLE))
        self.seg_job[node] = np.append(self.seg_job[node][keep], 0)

    def _target(
        self,
        spec: FaultSpec,
        scope,
        rng,
        gpu_order,
        node_order,
        rack_order,
        used_gpus,
        used_nodes,
        used_racks,
    ):
        if spec.rack is not None or scope == "rack":
            if spec.rack is not None:
                if spec.rack not in self.rack_index:
                    raise GpufleetError(f"fault {spec.kind}: no rack {spec.rack!r} in this fleet")
                r = self.rack_index[spec.rack]
            else:
                free = [
                    r
                    for r in rack_order
                    if r not in used_racks
                    and not any(self.node_rack[nd] == r for nd in used_nodes)
                    and not any(self.gpu_rack[g] == r for g in used_gpus)
                ]
                if not free:
                    return None
                r = free[0]
            used_racks.add(r)
            return None, None, r
        if spec.host is not None:
            if spec.host not in self.host_index:
                raise GpufleetError(f"fault {spec.kind}: no host {spec.host!r} in this fleet")
            node = self.host_index[spec.host]
        else:
            node = None
        if scope == "node":
            if node is None:
                free = [
                    nd
                    for nd in node_order
                    if nd not in used_nodes
                    and self.node_rack[nd] not in used_racks
                    and not any(self.gpu_node[g] == nd for g in used_gpus)
                ]
                if not free:
                    return None
                node = free[0]
            used_nodes.add(node)
            return node, None, int(self.node_rack[node])
        if spec.gpu is not None:
            if spec.gpu >= self.gpn:
                raise GpufleetError(f"fault {spec.kind}: gpu {spec.gpu} but nodes have {self.gpn} GPUs")
            if node is None:
                node = int(rng.integers(0, self.n_nodes))
            g = node * self.gpn + spec.gpu
        else:
            cands = [
                g
                for g in gpu_order
                if g not in used_gpus
                and self.gpu_node[g] not in used_nodes
                and self.gpu_rack[g] not in used_racks
                and (node is None or self.gpu_node[g] == node)
            ]
            if not cands:
                return None
            g = cands[0]
        used_gpus.add(g)
        return int(self.gpu_node[g]), g, int(self.gpu_rack[g])

    def _resolve(self, spec: FaultSpec, scope, node, gpu, rack, rng) -> Fault:
        d = self.duration
        if spec.onset is None:
            lo, hi = 0.1 * d, 0.5 * d
        else:
            lo, hi = self._at(spec.onset[0]), self._at(spec.onset[1])
        onset = round(float(rng.uniform(min(lo, hi), max(lo, hi))), 3)
        growth_default = {
            "cooling_degradation": 0.35,
            "nvlink_degradation": 0.3,
            "memory_errors": 0.1,
            "pcie_degradation": 0.05,
            "power_brake": 0.0,
        }.get(spec.kind, 0.0)
        growth = spec.growth if spec.growth is not None else growth_default * d
        if spec.kind == "cooling_degradation" and scope == "node" and spec.growth is None:
            growth = 0.05 * d
        end = onset + spec.duration if spec.duration is not None else None
        if spec.kind in ("gpu_lost",):
            end = None
        link = None
        if spec.kind == "nvlink_degradation":
            link = spec.link if spec.link is not None else int(rng.integers(0, self.model.nvlinks))
            if len(self.models) > 1:
                link %= self.model_of(gpu).nvlinks
        f = Fault(
            kind=spec.kind,
            mode=spec.mode or "",
            scope=scope,
            node=node,
            gpu=gpu,
            link=link,
            rack=rack,
            onset=onset,
            end=end,
            growth=growth,
            severity=spec.severity,
            probability=spec.probability if spec.probability is not None else 0.6,
        )
        stop = end if end is not None else d
        if spec.kind == "power_brake":
            eps, t = [], onset
            while t < stop:
                length = float(rng.uniform(20, 120))
                eps.append((t, min(t + length, stop)))
                t += length + float(rng.uniform(180, 900)) / max(spec.severity, 0.1)
            f.params["episodes"] = eps
        if spec.kind == "memory_errors":
            f.params["sbe_rate"] = float(rng.uniform(0.5, 3.0)) * spec.severity  # per second in the storm
            f.params["escalate_at"] = onset + max(growth, self.step)
        if spec.kind == "pcie_degradation":
            f.params["rate"] = float(rng.uniform(15, 60)) * spec.severity  # replays per second
            f.params["width"] = 8 if spec.severity < 2 else 4
            f.params["gen"] = 4 if spec.severity < 2 else 3
        if spec.kind == "sdc":
            f.params["digest_salt"] = int(rng.integers(0, 2**31))
        return f

    # -- nuisances ---------------------------------------------------------------------------
    def _nuisances(self, rng: np.random.Generator) -> None:
        """Driver reloads, agent restarts, late batches and nodes joining/leaving: (node, t0, t1)."""
        nu = self.scenario.nuisances
        d = self.duration

        # nuisances land on any node, faulty ones included: a driver reload resets a degrading link's
        # counters, an agent restart hides a fault's minutes, as in a real fleet
        calm = list(range(self.n_nodes))

        def pick() -> int | None:
            return int(calm[int(rng.integers(0, len(calm)))]) if calm else None

        def events(count, lo, hi):
            out = []
            for _ in range(count):
                node = pick()
                if node is None:
                    break
                t0 = float(rng.uniform(0.05 * d, 0.95 * d))
                out.append((node, t0, t0 + float(rng.uniform(lo, hi))))
            return sorted(out)

        self.driver_reloads = events(nu["driver_reloads"], 30, 90)
        self.agent_restarts = events(nu["agent_restarts"], 10, 60)
        self.late_batches = events(nu["late_batches"], 60, 600)
        churn = []
        # a node that is not there has no fault to find: churn only where no fault is
        faulty = {f.node for f in self.faults if f.node is not None}
        faulty_racks = {f.rack for f in self.faults if f.scope == "rack"}
        away = [i for i in calm if i not in faulty and self.node_rack[i] not in faulty_racks]
        for _ in range(nu["node_churn"]):
            if not away:
                break
            node = int(away[int(rng.integers(0, len(away)))])
            if rng.uniform() < 0.5:
                churn.append((node, 0.0, float(rng.uniform(0.1, 0.5)) * d))  # present, then leaves
            else:
                churn.append((node, float(rng.uniform(0.5, 0.95)) * d, d + 1))  # joins late
        self.churn = churn
