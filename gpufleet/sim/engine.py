"""Generate a fleet: telemetry.lp.gz (catalogue schema), truth.jsonl, manifest.json.

The fleet advances in chunks of steps; inside a chunk the physics steps are numpy operations
over every GPU, and rows are formatted column-wise with templates built from the catalogue
(byte-identical to :func:`gpufleet.lineprotocol.encode` with fields in catalogue order).
A writer thread compresses (zlib releases the GIL), so formatting and gzip share two cores.
"""

from __future__ import annotations

import gzip
import json
import os
import platform
import queue
import shutil
import threading
from collections.abc import Callable
from pathlib import Path

import numpy as np

from gpufleet import __version__, catalogue
from gpufleet.errors import GpufleetError
from gpufleet.lineprotocol import encode, escape_key, format_value, head
from gpufleet.records import Record, to_rfc3339
from gpufleet.sim import activity, faults
from gpufleet.sim.activity import FIELDS as ACTIVITY_FIELDS
from gpufleet.sim.fleet import Fleet
from gpufleet.sim.physics import (
    HW_POWER_BRAKE,
    HW_SLOWDOWN,
    HW_THERMAL,
    IDLE,
    SW_POWER_CAP,
    SW_THERMAL,
    SYNC_BOOST,
)
from gpufleet.sim.state import GOOD_DIGEST, PCIE_ERRORS, SimState

NOT_ON_H200 = {"retired_pages_sbe", "retired_pages_dbe", "retired_pages_pending", "fan_speed_ratio"}
FLAGS = {
    "clock_event_idle": IDLE,
    "clock_event_sw_power_cap": SW_POWER_CAP,
    "clock_event_hw_slowdown": HW_SLOWDOWN,
    "clock_event_sync_boost": SYNC_BOOST,
    "clock_event_sw_thermal": SW_THERMAL,
    "clock_event_hw_thermal": HW_THERMAL,
    "clock_event_hw_power_brake": HW_POWER_BRAKE,
}
NVLINK_FIELDS = (
    "up",
    "crc_flit_errors_total",
    "crc_data_errors_total",
    "replay_errors_total",
    "recovery_errors_total",
    "tx_data_bytes_total",
    "rx_data_bytes_total",
)


# What the physics reports per GPU and step, before gpu_values() turns it into catalogue fields.
SENSOR_KEYS = (
    "utilization_gpu",
    "utilization_memory",
    "power",
    "power_instant",
    "temperature_gpu",
    "temperature_memory",
    "clock_sm",
    "reasons",
    "phase",
    "strag",
    "limit",
)


def template(fields: list[tuple[str, str]]) -> str:
    """'%s name=%r,other=%di%s %d\\n' for (name, type) pairs; strings come pre-formatted with their comma."""
    s, first = "%s ", True
    for name, typ in fields:
        if typ == "string":
            s += "%s"
            continue
        s += ("" if first else ",") + escape_key(name) + "=" + ("%r" if typ == "float" else "%di")
        first = False
    return s.replace("%", "%%").replace("%%s", "%s").replace("%%r", "%r").replace("%%d", "%d") + " %d\n"


# every gpu field the simulator produces; catalogue fields outside this set stay absent
SIM_GPU_FIELDS = {
    "utilization_gpu_ratio",
    "utilization_memory_ratio",
    "memory_used_bytes",
    "memory_total_bytes",
    "power_watts",
    "power_instant_watts",
    "power_limit_watts",
    "energy_joules_total",
    "temperature_gpu_celsius",
    "temperature_memory_celsius",
    "temperature_slowdown_celsius",
    "temperature_shutdown_celsius",
    "temperature_max_operating_celsius",
    "temperature_memory_max_celsius",
    "clock_sm_mhz",
    "clock_memory_mhz",
    "clock_sm_max_mhz",
    "performance_state",
    "clock_event_reasons",
    *FLAGS,
    "throttle_sw_power_cap_ns_total",
    "throttle_sw_thermal_ns_total",
    "throttle_hw_thermal_ns_total",
    "throttle_hw_power_brake_ns_total",
    "pcie_link_gen",
    "pcie_link_gen_max",
    "pcie_link_width",
    "pcie_link_width_max",
    "pcie_replay_total",
    "ecc_corrected_volatile_total",
    "ecc_uncorrected_volatile_total",
    "ecc_corrected_aggregate_total",
    "ecc_uncorrected_aggregate_total",
    "remapped_rows_correctable",
    "remapped_rows_uncorrectable",
    "remapped_rows_pending",
    "remapped_rows_failure",
    "up",
    "health_code",
    "process_count",
    "job_id",
    "mig_mode",
    "mig_device_count",
    *ACTIVITY_FIELDS,
    *PCIE_ERRORS,
}


def gpu_fields(tier: set[str]) -> list[tuple[str, str]]:
    return [
        (m.field, m.type)
        for m in catalogue.fields("gpu")
        if m.tier in tier and m.field in SIM_GPU_FIELDS and m.field not in NOT_ON_H200
    ]


def xid_catalogue() -> dict[int, dict]:
    """The XID catalogue (severity, action per code): :func:`gpufleet.catalogue.xids`."""
    return catalogue.xids()


def _steps(every, step: float) -> int:
    """A cadence in steps: an int is steps, a float seconds (rounded to whole steps, at least 1)."""
    if isinstance(every, int):
        return max(1, every)
    return max(1, int(round(float(every) / step)))


class Writer:
    """gzip (mtime 0, no name: byte-identical output) fed by a queue from a background thread."""

    def __init__(self, path: Path, level: int = 3):
        self.f = open(path, "wb")
        self.gz = gzip.GzipFile(filename="", fileobj=self.f, mode="wb", compresslevel=level, mtime=0)
        self.q: queue.Queue = queue.Queue(maxsize=4)
        self.err: BaseException | None = None
        self.bytes = 0
        self.t = threading.Thread(target=self._run, daemon=True)
        self.t.start()

    def _run(self):
        while True:
            item = self.q.get()
            if item is None:
                return
            try:
                if self.err is None:
                    self.gz.write(item)
            except BaseException as exc:  # surfaced by write()/close()
                self.err = exc

    def write(self, text: str) -> None:
        if self.err:
            raise GpufleetError(f"cannot write telemetry: {self.err}")
        data = text.encode()
        self.bytes += len(data)
        self.q.put(data)

    def close(self) -> None:
        self.q.put(None)
        self.t.join()
        self.gz.close()
        self.f.close()
        if self.err:
            raise GpufleetError(f"cannot write telemetry: {self.err}")


class Generator:
    """Runs one fleet and writes its directory."""

    def __init__(self, fleet: Fleet, level: int = 3):
        self.fl = fleet
        self.level = level
        fl = fleet
        self.state = SimState(fl, np.arange(fl.n))
        self.rng = np.random.default_rng(np.random.SeedSequence([fl.seed, 0xD1CE]))
        self.step_ns = int(round(fl.step * 1e9))
        self.start_ns = int(round(fl.start * 1e9))
        tel = fl.scenario.telemetry
        self.slow_every = _steps(tel["slow_every"], fl.step)
        self.link_every = _steps(tel["nvlink_full_every"], fl.step)
        self.canary_steps = max(1, int(round(tel["canary_every"] / fl.step)))
        self.missing = float(tel["missing_rate"])
        self.counts: dict[str, int] = {}
        self.first_thr = np.full(fl.n, np.inf)
        self.last_thr = np.full(fl.n, -np.inf)
        self.hw_thr = np.zeros(fl.n, dtype=bool)
        self.events: list = []  # (t, gpu, code, message, job)
        self.pending: list[tuple[float, str, int]] = []  # late rows: (due run time, text, count)
        # tag heads
        tags = []
        for g in range(fl.n):
            node = int(fl.gpu_node[g])
            rack = int(fl.gpu_rack[g])
            tags.append(
                {
                    "host": fl.hosts[node],
                    "gpu": str(int(fl.gpu_local[g])),
                    "uuid": fl.uuids[g],
                    "model": fl.model_of(g).name,
                    "cluster": fl.clusters[int(fl.rack_cluster[rack])],
                    "rack": fl.racks[rack],
                }
            )
        self.gpu_tags = tags
        self.gpu_head = [head("gpu", t) for t in tags]
        self.node_tags = [
            {
                "host": fl.hosts[i],
                "cluster": fl.clusters[int(fl.rack_cluster[fl.node_rack[i]])],
                "rack": fl.racks[int(fl.node_rack[i])],
            }
            for i in range(fl.n_nodes)
        ]
        self.host_head = [head("host", t) for t in self.node_tags]
        self.bmc_head = [head("bmc", t) for t in self.node_tags]
        self.inlet_head = [
            head("bmc_sensor", {**t, "sensor": "Inlet Temp", "sensor_type": "Temperature", "unit": "C"})
            for t in self.node_tags
        ]
        self.fan_head = [
            head("bmc_sensor", {**t, "sensor": "FAN1", "sensor_type": "Fan", "unit": "RPM"})
            for t in self.node_tags
        ]
        self.t_fast = template(gpu_fields({"fast"}))
        self.t_full = template(gpu_fields({"fast", "slow"}))
        self.f_fast = [f for f, _ in gpu_fields({"fast"})]
        self.f_full = [f for f, _ in gpu_fields({"fast", "slow"})]
        self.t_lost = "%s up=0i,health_code=2i %d\n"
        self.link_head = [
            [head("gpu_nvlink", {**tags[g], "link": str(k)}) for k in range(fl.model_of(g).nvlinks)]
            for g in range(fl.n)
        ]
        self.t_link = "%s " + ",".join(f"{k}=%di" for k in NVLINK_FIELDS) + " %d\n"
        self.t_host = (
            "%s cpu_utilization_ratio=%r,memory_used_bytes=%di,memory_total_bytes=%di,"
            "load1=%r,load5=%r,load15=%r,uptime_seconds=%r %d\n"
        )
        self.t_sensor = "%s value=%r,state_code=%di %d\n"
        self.t_bmc = "%s power_watts=%r %d\n"
        self.boot = np.random.default_rng(np.random.SeedSequence([fl.seed, 0xB007])).uniform(
            2 * 86400, 40 * 86400, fl.n_nodes
        )
        self.xids = xid_catalogue()
        self.sdc_gpus = {int(f.gpu) for f in fl.faults if f.kind == "sdc"}

    # -- per-chunk inputs ----------------------------------------------------------------------
    def _node_masks(self, ts: np.ndarray):
        """(present, gpu_ok, late) per (step, node) from churn, agent restarts, reloads, misses."""
        fl = self.fl
        C = len(ts)
        present = np.ones((C, fl.n_nodes), dtype=bool)
        gpu_ok = np.ones((C, fl.n_nodes), dtype=bool)
        late = np.zeros((C, fl.n_nodes), dtype=bool)
        for node, t0, t1 in fl.churn:
            present[:, node] &= (ts >= t0) & (ts < t1)
        for node, t0, t1 in fl.agent_restarts:
            present[:, node] &= ~((ts >= t0) & (ts < t1))
        for node, t0, t1 in fl.driver_reloads:
            gpu_ok[:, node] &= ~((ts >= t0) & (ts < t1))
        for node, t0, t1 in fl.late_batches:
            late[:, node] |= (ts >= t0) & (ts < t1)
        if self.missing > 0:
            present &= self.rng.random((C, fl.n_nodes)) >= self.missing
        return present, gpu_ok, late

    def run(self, out: Path, progress: Callable[[int], None] | None = None) -> dict:
        fl = self.fl
        writer = Writer(out / "telemetry.lp.gz", self.level)
        try:
            # at most 32k GPU-samples and 10 min of fleet time per chunk: a chunk is written measurement
            # by measurement, so a reader sees the streams at most 10 min apart, as an agent's
            # file is (at a 60 s poll 32k samples of 128 GPUs would be 4 h of gpu rows first)
            chunk = max(1, min(fl.n_steps, 32768 // max(fl.n, 1), int(600 // fl.step)))
            k = 0
            while k < fl.n_steps:
                c = min(chunk, fl.n_steps - k)
                self._chunk(k, c, writer)
                k += c
                if progress:
                    progress(c)
            for _, text, cnt in self.pending:
                writer.write(text)
                self.counts["late"] = self.counts.get("late", 0) + cnt
            self.pending = []
        finally:
            writer.close()
        return {"bytes_uncompressed": writer.bytes}

    def _chunk(self, k0: int, C: int, writer: Writer) -> None:
        fl = self.fl
        st = self.state
        n = fl.n
        ks = np.arange(k0 + 1, k0 + C + 1)
        ts = ks * fl.step
        tns = self.start_ns + ks.astype(np.int64) * self.step_ns
        phase_n = np.empty((C, fl.n_nodes), dtype=np.int8)
        job_n = np.empty((C, fl.n_nodes), dtype=np.int64)
        for i in range(fl.n_nodes):
            phase_n[:, i], job_n[:, i] = fl.phase_at(i, ts - fl.step / 2)
        inlet_r = fl.inlet(ts)
        present, gpu_ok, late = self._node_masks(ts)
        # reloads take effect at the end of their window
        reload_at = {}
        for node, _t0, t1 in fl.driver_reloads:
            j = int(np.searchsorted(ts, t1))
            if j < C and ts[j] >= t1 and (j == 0 or ts[j - 1] < t1):
                reload_at.setdefault(j, []).append(node)
        phase = phase_n[:, fl.gpu_node]
        jobs = job_n[:, fl.gpu_node]
        inlet = inlet_r[:, fl.gpu_rack]
        A = {key: np.empty((C, n)) for key in SENSOR_KEYS}
        A["reasons"] = np.empty((C, n), dtype=np.int64)
        cnt_keys = list(st.counters())
        B = {key: np.empty((C, n), dtype=np.float64 if key == "energy_j" else np.int64) for key in cnt_keys}
        lost = np.empty((C, n), dtype=bool)
        link_snap: dict[int, tuple[np.ndarray, np.ndarray]] = {}  # chunk step -> (counts, up) at emission
        for c in range(C):
            for node in reload_at.get(c, ()):
                st.reload_gpus(fl.gpu_node == node)
            evs: list = []
            o = st.step(float(ts[c]), fl.step, phase[c], inlet[c], self.rng, evs, jobs[c])
            for key in SENSOR_KEYS:
                A[key][c] = o[key]
            cn = st.counters()
            for key in cnt_keys:
                B[key][c] = cn[key]
            lost[c] = o["lost"]
            # throttling truth from the physics (die at its thermal limit, clock cut), never from
            # the throttle counters or reason bits the detector reads
            hit = o["thermal_cut"]
            if hit.any():
                self.first_thr = np.where(hit, np.minimum(self.first_thr, ts[c]), self.first_thr)
                self.last_thr = np.where(hit, ts[c], self.last_thr)
                self.hw_thr |= o["hw_cut"]
            for ev in evs:
                self.events.append(ev)
            if ks[c] % self.link_every == 0:
                link_snap[c] = (st.link_counts(), st.link_up())
        # -- rows ---------------------------------------------------------------------------
        node_p = present[:, fl.gpu_node]
        gok = gpu_ok[:, fl.gpu_node]
        gpu_missing = (
            self.rng.random((C, n)) < self.missing / 4 if self.missing > 0 else np.zeros((C, n), bool)
        )
        row_ok = node_p & gok & ~gpu_missing
        is_late = late[:, fl.gpu_node]
        full_step = ((ks % self.slow_every) == 0) | (ks == 1)
        V = gpu_values(self.fl, self.rng, A, B, phase, jobs)
        now_parts, late_parts = [], []
        for want_late, parts in ((False, now_parts), (True, late_parts)):
            sel_base = row_ok & (is_late if want_late else ~is_late)
            if not sel_base.any():
                continue
            # normal rows (both variants, then put back in (time, gpu) order)
            lines: list[str] = []
            order: list[np.ndarray] = []
            for full in (False, True):
                mask = sel_base & ~lost & (full_step[:, None] if full else ~full_step[:, None])
                ci, gi = np.nonzero(mask)
                if len(ci) == 0:
                    continue
                names = self.f_full if full else self.f_fast
                tmpl = self.t_full if full else self.t_fast
                cols = [[self.gpu_head[g] for g in gi.tolist()]]
                for f in names:
                    v = V[f]
                    cols.append(
                        v[ci, gi].tolist()
                        if isinstance(v, np.ndarray)
                        else [v[c][g] for c, g in zip(ci.tolist(), gi.tolist(), strict=True)]
                    )
                cols.append(tns[ci].tolist())
                lines.extend([tmpl % row for row in zip(*cols, strict=True)])
                order.append(ci * n + gi)
            ci, gi = np.nonzero(sel_base & lost)
            if len(ci):
                lines.extend(
                    [
                        self.t_lost % (self.gpu_head[g], t)
                        for g, t in zip(gi.tolist(), tns[ci].tolist(), strict=True)
                    ]
                )
                order.append(ci * n + gi)
            if lines:
                idx = np.argsort(np.concatenate(order), kind="stable")
                parts.append("".join([lines[i] for i in idx.tolist()]))
                self._count("gpu", len(lines))
            parts.append(self._links(tns, sel_base & ~lost, link_snap))
            parts.append(self._canary(ks, ts, tns, sel_base & ~lost))
            parts.append(self._nodes(ts, tns, present & (late if want_late else ~late), phase_n, inlet_r, A))
        # events: the kernel log is read by the agent when it runs; an event of a missing poll
        # still arrives with its own timestamp (it was logged), so events are always written
        parts_ev = []
        for t, g, code, msg, job in self.events:
            parts_ev.extend(self._event_lines(t, g, code, msg, job))
        self.events = []
        writer.write("".join(now_parts) + "".join(parts_ev))
        if late_parts:
            text = "".join(late_parts)
            self.pending.append((float(ts[-1]) + float(self.rng.uniform(60, 600)), text, text.count("\n")))
        due = [p for p in self.pending if p[0] <= ts[-1]]
        for p in due:
            writer.write(p[1])
            self._count("late", p[2])
        self.pending = [p for p in self.pending if p[0] > ts[-1]]

    def _event_lines(self, t: float, g: int, code: int, msg: str, job: int | None) -> list[str]:
        """One XID as the agent reports it: one row, the kernel-log line's (source=kmsg: the agent
        folds the NVML event of the same XID, seen a moment later, into it); a DBE also raises
        NVML's ecc_dbe event."""
        pci = "0000:" + self.fl.pci[int(self.fl.gpu_local[g])][9:14].lower()
        info = self.xids.get(code, {})
        sev = {k: info[k] for k in ("severity", "action") if info.get(k)}
        kmsg: dict[str, object] = {"code": code}
        if job:
            kmsg["pid"] = 20000 + job % 40000
            kmsg["process"] = "python3"
        kmsg["message"] = msg
        kmsg.update(sev)
        kmsg["pci_bus_id"] = pci
        t_ms = int(round(t * 1000))
        lag_ms = 40 + (g * 37 + code * 11 + t_ms) % 400  # the event thread's wait loop
        rows = [("xid", "kmsg", kmsg, t_ms)]
        if code == 48:
            rows.append(
                ("ecc_dbe", "nvml", {"message": "NVML event ecc_dbe", "pci_bus_id": pci}, t_ms + lag_ms + 1)
            )
        out = []
        for etype, source, fields, ms in rows:
            tags = {**self.gpu_tags[g], "type": etype, "source": source}
            out.append(encode("gpu_event", tags, fields, self.start_ns + ms * 1_000_000) + "\n")
        self._count("gpu_event", len(out))
        return out

    def _count(self, key: str, n: int) -> None:
        self.counts[key] = self.counts.get(key, 0) + n

    def _links(self, tns, ok, snap) -> str:
        """Every link of every reporting GPU at the agent's NVLink cadence (gpu.nvlink_interval)."""
        out = []
        rows = 0
        for c, (counts, up) in snap.items():
            t = int(tns[c])
            gs = np.nonzero(ok[c])[0]
            if not len(gs):
                continue
            v = counts[gs].tolist()  # (one conversion per snapshot, not one per link)
            u = up[gs].tolist()
            tmpl = self.t_link
            heads = self.link_head
            out.extend(
                tmpl % (heads[g][li], u[j][li], *v[j][li], t)
                for j, g in enumerate(gs.tolist())
                for li in range(len(heads[g]))
            )
            rows += sum(len(heads[g]) for g in gs.tolist())
        self._count("gpu_nvlink", rows)
        return "".join(out)

    def _canary(self, ks, ts, tns, ok) -> str:
        fl = self.fl
        out = []
        cs, gs = np.nonzero(((ks[:, None] + np.arange(fl.n)[None, :] * 7) % self.canary_steps == 0) & ok)
        for c, g in zip(cs.tolist(), gs.tolist(), strict=True):
            checks, failed = 1, 0
            if g in self.sdc_gpus:
                passed, mism, digest = self.state.canary(g, float(ts[c]), self.rng)
                # the agent's policy: a failed check is rechecked at once, up to CONFIRM times
                failed = int(not passed)
                while failed and checks <= CONFIRM and (checks == failed):
                    checks += 1
                    failed += int(not self.state.canary(g, float(ts[c]), self.rng)[0])
            else:
                passed, mism, digest = 1, 0, GOOD_DIGEST
            dur = round(0.0029 + float(self.rng.gamma(4.0, 0.0002)), 6)
            fields = {"passed": passed, "mismatches": mism, "duration_seconds": dur, "digest": digest,
                      "checks": checks, "checks_failed": failed}
            out.append(encode("gpu_canary", self.gpu_tags[g], fields, int(tns[c]) - 2_000_000_000) + "\n")
        self._count("gpu_canary", len(out))
        return "".join(out)

    def _nodes(self, ts, tns, present, phase_n, inlet_r, A) -> str:
        fl = self.fl
        ci, ni = np.nonzero(present)
        if len(ci) == 0:
            return ""
        busy = phase_n[ci, ni] > 1
        cpu = np.round(np.where(busy, 0.35, 0.02) + self.rng.uniform(0, 0.08, len(ci)), 4)
        load = np.round(np.where(busy, 24.0, 0.4) + self.rng.uniform(0, 2.0, len(ci)), 2)
        total = 2 * 1024**4
        memu = (np.where(busy, 0.42, 0.03) * total).astype(np.int64) + self.rng.integers(0, 2**30, len(ci))
        up = np.round(self.boot[ni] + ts[ci], 2)
        tn = tns[ci].tolist()
        nl = ni.tolist()
        rows = [
            self.t_host % (self.host_head[n], c_, m_, total, l1, l1 * 0.97, l1 * 0.9, u, t)
            for n, c_, m_, l1, u, t in zip(
                nl, cpu.tolist(), memu.tolist(), load.tolist(), up.tolist(), tn, strict=True
            )
        ]
        inlet = np.round(inlet_r[ci, fl.node_rack[ni]])
        state = np.where(inlet >= 42, 2, np.where(inlet >= 35, 1, 0))
        rows += [
            self.t_sensor % (self.inlet_head[n], v, s, t)
            for n, v, s, t in zip(nl, inlet.tolist(), state.tolist(), tn, strict=True)
        ]
        fan = self._fan(ts, ci, ni)
        rows += [
            self.t_sensor % (self.fan_head[n], v, 0 if v > 3000 else 2, t)
            for n, v, t in zip(nl, fan.tolist(), tn, strict=True)
        ]
        gpu_p = A["power"].reshape(len(ts), fl.n_nodes, fl.gpn).sum(2)[ci, ni]
        bmc = np.round(gpu_p + 1850.0 + self.rng.normal(0, 15, len(ci)))
        rows += [self.t_bmc % (self.bmc_head[n], v, t) for n, v, t in zip(nl, bmc.tolist(), tn, strict=True)]
        self._count("host", len(ci))
        self._count("bmc_sensor", 2 * len(ci))
        self._count("bmc", len(ci))
        return "".join(rows)

    def _fan(self, ts, ci, ni) -> np.ndarray:
        rpm = np.full(len(ci), 9800.0)
        for f in self.fl.faults:
            if f.kind == "cooling_degradation" and f.scope == "node":
                sel = ni == f.node
                if sel.any():
                    rpm[sel] *= 1.0 - 0.85 * np.clip(f.ramp(ts[ci[sel]]) * f.severity, 0, 1)
        return np.round(rpm / 120) * 120 + self.rng.integers(-1, 2, len(ci)) * 120.0


def gpu_values(
    fl: Fleet, rng: np.random.Generator, A: dict, B: dict, phase: np.ndarray, jobs: np.ndarray
) -> dict:
    """Catalogue field -> values (arrays in NVML's quantisation)."""
    C, n = phase.shape
    m = fl.model if len(fl.models) == 1 else (fl.pm if n == fl.n else A.get("_m", fl.pm))
    reasons = A["reasons"]
    mem = np.where(phase == 0, m.memory_idle_bytes, 0).astype(np.int64)
    has_job = jobs > 0
    if has_job.any():
        jm = np.vectorize(lambda j: fl.job_mem.get(int(j), m.memory_context_bytes), otypes=[np.int64])(
            jobs[has_job]
        )
        jit = (rng.integers(-64, 65, size=jm.shape) * 1024 * 1024).astype(np.int64)
        setup = phase[has_job] == 1
        if len(fl.models) > 1:  # a job's share of memory on a GPU with less of it
            total = np.broadcast_to(np.asarray(m.memory_total_bytes), (C, n))[has_job]
            jm = np.minimum(jm, (total * 0.92).astype(np.int64))
        ctx = np.broadcast_to(np.asarray(m.memory_context_bytes), (C, n))[has_job]
        mem[has_job] = np.where(setup, ctx, jm + jit)
    V: dict[str, object] = {
        "utilization_gpu_ratio": np.rint(A["utilization_gpu"]) / 100,
        "utilization_memory_ratio": np.rint(A["utilization_memory"]) / 100,
        "memory_used_bytes": mem,
        "memory_total_bytes": np.full((C, n), m.memory_total_bytes, dtype=np.int64),
        "power_watts": np.rint(A["power"] * 1000) / 1000,
        "power_instant_watts": np.rint(A["power_instant"] * 1000) / 1000,
        "power_limit_watts": A["limit"] if "limit" in A else np.full((C, n), float(m.power_limit)),
        "energy_joules_total": np.floor(B["energy_j"] * 1000) / 1000,
        "temperature_gpu_celsius": np.rint(A["temperature_gpu"]).astype(np.int64),
        "temperature_memory_celsius": np.rint(A["temperature_memory"]).astype(np.int64),
        "temperature_slowdown_celsius": np.full((C, n), m.t_slowdown, dtype=np.int64),
        "temperature_shutdown_celsius": np.full((C, n), m.t_shutdown, dtype=np.int64),
        "temperature_max_operating_celsius": np.full((C, n), m.t_max_operating, dtype=np.int64),
        "temperature_memory_max_celsius": np.full((C, n), m.t_mem_max, dtype=np.int64),
        "clock_sm_mhz": A["clock_sm"].astype(np.int64),
        "clock_memory_mhz": np.full((C, n), m.mem_clock, dtype=np.int64),
        "clock_sm_max_mhz": np.full((C, n), m.f_max, dtype=np.int64),
        "performance_state": np.zeros((C, n), dtype=np.int64),
        "clock_event_reasons": reasons,
        "pcie_link_gen_max": np.full((C, n), m.pcie_gen, dtype=np.int64),
        "pcie_link_width_max": np.full((C, n), m.pcie_width, dtype=np.int64),
        "up": np.ones((C, n), dtype=np.int64),
        "health_code": np.zeros((C, n), dtype=np.int64),
        "process_count": has_job.astype(np.int64),
        "mig_mode": np.zeros((C, n), dtype=np.int64),
        "mig_device_count": np.zeros((C, n), dtype=np.int64),
    }
    for f, bit in FLAGS.items():
        V[f] = ((reasons & bit) > 0).astype(np.int64)
    for key, arr in B.items():
        if key != "energy_j":
            V[key] = arr
    V.update(activity.values(fl, rng, A, jobs))  # GPM activity, bandwidth, thermal margin
    jid = [["" if j == 0 else "," + "job_id=" + format_value(str(j)) for j in row] for row in jobs.tolist()]
    V["job_id"] = jid
    return V


CONFIRM = 2  # rechecks after a failed canary check (the agent's canary.confirm default)


def truth(fleet: Fleet, gen: Generator) -> list[Record]:
    """Ground truth: one record per injected fault, what it says beyond its target and times from
    its kind (:mod:`gpufleet.sim.faults`), plus thermal_throttle per GPU that throttled with no
    injected cause (a cooling fault's throttling is its ``impact_at``)."""
    fl = fleet
    st = gen.state
    t0 = fl.start
    recs: list[Record] = []
    end_run = fl.duration

    def ident(f):
        node = f.node
        return {
            "host": fl.hosts[node] if node is not None else None,
            "gpu": int(fl.gpu_local[f.gpu]) if f.gpu is not None else None,
            "link": f.link,
            "cluster": fl.clusters[int(fl.rack_cluster[f.rack])],
            "rack": fl.racks[f.rack],
        }

    seen = faults.Seen(start=t0, state=st, first_throttle=gen.first_thr, hw_throttle=gen.hw_thr)
    thermal_gpus: dict[int, object] = {}
    for f in fl.faults:
        kind = faults.REGISTRY[f.kind]
        if kind.explains_throttling:
            for g in st._gpus_of(f).tolist():
                thermal_gpus[g] = f
        said = kind.truth(f, seen)
        end = t0 + f.end if f.end is not None and f.end < end_run else None
        recs.append(
            Record(
                kind=said.kind or f.kind,
                start=t0 + f.onset,
                end=end,
                severity=said.severity,
                impact_at=said.impact_at,
                detail=said.detail,
                **ident(f),
            )
        )
    # throttling as it happened, per GPU, where no injected cooling fault caused it (that
    # throttling is the cooling fault's impact: its record's impact_at, one page, not a second)
    for g in np.nonzero(np.isfinite(gen.first_thr))[0].tolist():
        node = int(fl.gpu_node[g])
        rack = int(fl.gpu_rack[g])
        f = thermal_gpus.get(g)
        if f is not None and gen.first_thr[g] >= f.onset - 60:
            continue
        first, last = float(gen.first_thr[g]), float(gen.last_thr[g])
        end = t0 + last if last < end_run - 600 else None
        cause = "no injected fault (load and inlet)"
        recs.append(
            Record(
                kind="thermal_throttle",
                host=fl.hosts[node],
                gpu=int(fl.gpu_local[g]),
                link=None,
                start=t0 + first,
                end=end,
                severity="critical" if gen.hw_thr[g] else "warning",
                impact_at=t0 + first,
                detail=cause,
                cluster=fl.clusters[int(fl.rack_cluster[rack])],
                rack=fl.racks[rack],
            )
        )
    recs.sort(key=lambda r: (r.start, r.kind, r.host or "", -1 if r.gpu is None else r.gpu))
    return recs


def prepare_out(out: str | Path) -> tuple[Path, Path]:
    """(final dir, temp dir beside it). The final dir may exist only empty or as an earlier sim output."""
    out = Path(out)
    if out.exists():
        if not out.is_dir():
            raise GpufleetError(f"{out}: exists and is not a directory")
        if any(out.iterdir()) and not (out / "manifest.json").is_file():
            raise GpufleetError(f"{out}: exists, is not empty and is not a simulator output")
    parent = out.parent if str(out.parent) else Path(".")
    if not parent.exists():
        try:
            parent.mkdir(parents=True)
        except OSError as exc:
            raise GpufleetError(f"{out}: cannot create output directory: {exc.strerror}") from None
    tmp = parent / f".{out.name}.tmp-{os.getpid()}"
    try:
        if tmp.exists():
            shutil.rmtree(tmp)
        tmp.mkdir()
    except OSError as exc:
        raise GpufleetError(f"{out}: cannot write output directory: {exc.strerror}") from None
    return out, tmp


def generate(fleet: Fleet, out: str | Path, progress: bool | None = None, level: int = 3) -> dict:
    """Simulate ``fleet`` and write DIR/telemetry.lp.gz, truth.jsonl, manifest.json atomically."""
    final, tmp = prepare_out(out)
    try:
        gen = Generator(fleet, level=level)
        bar = None
        total = fleet.n_steps
        if progress is None:
            progress = fleet.n * fleet.n_steps > 2_000_000
        if progress:
            from tqdm import tqdm

            bar = tqdm(total=total, unit="step", desc=f"sim {fleet.n} GPUs", disable=None)
        try:
            stats = gen.run(tmp, bar.update if bar else None)
        finally:
            if bar:
                bar.close()
        recs = truth(fleet, gen)
        with (tmp / "truth.jsonl").open("w") as f:
            for r in recs:
                f.write(r.to_json() + "\n")
        manifest = build_manifest(fleet, gen, recs, stats)
        (tmp / "manifest.json").write_text(json.dumps(manifest, indent=2, sort_keys=True) + "\n")
        if final.exists():
            shutil.rmtree(final)
        tmp.rename(final)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return manifest


def build_manifest(fl: Fleet, gen: Generator, recs: list[Record], stats: dict) -> dict:
    sc = fl.scenario
    t0 = fl.start

    def ev(lst):
        return [
            {"host": fl.hosts[n], "start": to_rfc3339(t0 + a), "end": to_rfc3339(t0 + min(b, fl.duration))}
            for n, a, b in lst
        ]

    site = {
        "power_caps": [
            {**e, "limit_share": round(c[3], 3)}
            for e, c in zip(ev([c[:3] for c in fl.power_caps]), fl.power_caps, strict=True)
        ],
        "drains": ev(fl.drains),
        "job_restarts": [
            {"job": j, "start": to_rfc3339(t0 + a), "end": to_rfc3339(t0 + b)} for j, a, b in fl.restarts
        ],
        "warm_racks": {
            fl.racks[r]: {
                "celsius": round(float(fl.warm[r]), 2),
                "from": to_rfc3339(t0 + max(0.0, float(fl.warm_from[r]))),
            }
            for r in np.flatnonzero(fl.warm).tolist()
        },
    }
    out = {
        "format": "gpufleet-sim/1",
        "generator": {"gpufleet": __version__, "numpy": np.__version__, "python": platform.python_version()},
        "seed": fl.seed,
        "scenario": {
            "name": sc.name,
            "description": sc.description,
            "source": sc.source if sc.source.startswith("scenario ") else Path(sc.source).name,
        },
        "start": to_rfc3339(t0),
        "end": to_rfc3339(t0 + fl.n_steps * fl.step),
        "duration_seconds": fl.duration,
        "step_seconds": fl.step,
        "steps": fl.n_steps,
        "fleet": {
            "nodes": fl.n_nodes,
            "gpus_per_node": fl.gpn,
            "gpus": fl.n,
            "racks": fl.n_racks,
            "clusters": fl.clusters,
            "model": fl.model.name,
            "nvlinks_per_gpu": fl.model.nvlinks,
            **({"models": {fl.hosts[i]: fl.models[int(w)].name for i, w in enumerate(fl.node_model.tolist())
                           if w}} if len(fl.models) > 1 else {}),
            "hosts": fl.hosts,
        },
        "telemetry": {
            "file": "telemetry.lp.gz",
            "precision": "ns",
            "slow_every_steps": gen.slow_every,
            "nvlink_full_every_steps": gen.link_every,
            "canary_every_steps": gen.canary_steps,
            "lines": dict(sorted((k, v) for k, v in gen.counts.items() if k != "late")),
            "late_lines": gen.counts.get("late", 0),
            "bytes_uncompressed": stats["bytes_uncompressed"],
        },
        "truth": {
            "file": "truth.jsonl",
            "records": len(recs),
            "by_kind": dict(
                sorted({k: sum(r.kind == k for r in recs) for k in {r.kind for r in recs}}.items())
            ),
        },
        "nuisances": {
            "driver_reloads": ev(fl.driver_reloads),
            "agent_restarts": ev(fl.agent_restarts),
            "late_batches": ev(fl.late_batches),
            "node_churn": ev(fl.churn),
            "missing_rate": gen.missing,
        },
        "jobs": len(fl.jobs),
        "notes": fl.notes,
    }
    # site life where the scenario has it (a manifest without it is the one it was)
    out["nuisances"].update({k: v for k, v in site.items() if v})
    return out
