"""BMC sensors, XID events, canary results and job ids through the agent's pipeline into InfluxDB.

Real peers: ipmi_sim (BMC), a kernel-log file, the sim NVML backend with its /proc tree, the
OpenTelemetry pipeline with the line-protocol exporter, and InfluxDB 1.6.7 queried back.
"""

from __future__ import annotations

import time

from gpufleet.agent.backends.sim import SimBackend, TinyNode
from gpufleet.agent.collectors.canary import CanaryCollector
from gpufleet.agent.collectors.ipmi import IpmiCollector
from gpufleet.agent.collectors.xid import XidCollector
from gpufleet.agent.jobs import resolve_job
from gpufleet.agent.pipeline import Pipeline
from gpufleet.agent.pipeline.lineprotocol import LineProtocolExporter

from gpufleet import catalogue
from tests.ipmisim import IpmiSim
from tests.servers import skip_unless


class Lines:
    def __init__(self):
        self.lines: list[str] = []

    def write(self, lines):
        self.lines.extend(lines)


def check_schema(samples):
    """Every field a collector emits is in the catalogue for its measurement; tags are identity tags."""
    known = {(m.measurement, m.field) for m in catalogue.load()}
    for s in samples:
        for f in s.fields:
            assert (s.measurement, f) in known, (s.measurement, f)
        assert set(s.tags) <= set(catalogue.tags(s.measurement)), (s.measurement, s.tags)


@skip_unless("ipmi_sim")
@skip_unless("influxd")
def test_all_sources_into_influxdb(tmp_path, influxdb):
    t = 500.0  # TinyNode: GPUs idle at t=500, so the canary may run
    backend = SimBackend(TinyNode(n_gpus=2, t0=0.0))
    backend.begin_poll(int(t * 1e9))
    log = tmp_path / "kern.log"
    log.write_text("")
    sink = Lines()
    pipe = Pipeline("node-17", {"cluster": "c1"}, [LineProtocolExporter([sink])])
    with IpmiSim(tmp_path / "bmc") as bmc:
        ipmi = IpmiCollector(**bmc.lan_args(), workarounds="opensesspriv", sel_every=1)
        xid = XidCollector(backend=backend, nvml_events=False, kmsg=str(log))
        canary = CanaryCollector(backend=backend, engine="numpy", standin=True, size=64, clock=lambda: t,
                                 wait=60)
        try:
            time.sleep(0.5)
            with log.open("a") as f:  # GPU 1 of the sim node sits at PCI 00000000:28:00.0
                f.write("Apr  3 01:05:00 node-17 kernel: NVRM: Xid (PCI:0000:28:00): 48, pid=4242, "
                        "name=python3, An uncorrectable double bit error (DBE) has been detected\n")
            now = time.time_ns()
            samples = ipmi.collect(now) + xid.collect(now) + canary.collect(now)
        finally:
            ipmi.close()
            xid.close()
            canary.close()
    check_schema(samples)
    pipe.observe(samples)
    pipe.collect(now)
    pipe.shutdown()
    influxdb.create_db("t")
    influxdb.write("t", "\n".join(sink.lines) + "\n")

    def q(sql):
        res = influxdb.query(sql, db="t")["results"][0]
        return res.get("series", [])

    s = q('SELECT "value", "state_code" FROM "bmc_sensor" WHERE "sensor" = \'Inlet Temp\'')
    assert s and s[0]["values"][0][1:] == [24.0, 0]
    tags = q('SHOW TAG VALUES FROM "bmc_sensor" WITH KEY = "unit"')[0]["values"]
    assert {v[1] for v in tags} == {"C", "RPM", "W", "V"}
    s = q('SELECT "sel_entries" FROM "bmc" WHERE "host" = \'node-17\' AND "cluster" = \'c1\'')
    assert s[0]["values"][0][1] == 3
    s = q('SELECT "code", "pid", "process", "severity", "action", "gpu", "uuid" FROM "gpu_event" '
          'WHERE "type" = \'xid\' AND "source" = \'kmsg\'')
    row = s[0]["values"][0]
    assert row[1:] == [48, 4242, "python3", "critical", "WORKFLOW_XID_48", "1",
                       "GPU-5e1f0a2c-7d31-4b58-9c2e-0000000a0201"]
    s = q('SELECT "passed", "mismatches", "digest" FROM "gpu_canary" GROUP BY "gpu"')
    assert len(s) == 2 and all(x["values"][0][1] == 1 and len(x["values"][0][3]) == 64 for x in s)


def test_job_id_from_the_sim_backend_proc_tree():
    # the sim backend synthesises /proc for its GPU processes: the GPU collector's job lookup path
    t = 100.0  # both GPUs busy with a job
    backend = SimBackend(TinyNode(n_gpus=2, t0=0.0))
    backend.begin_poll(int(t * 1e9))
    h = backend.nvmlDeviceGetHandleByIndex(0)
    pids = [p.pid for p in backend.nvmlDeviceGetComputeRunningProcesses(h)]
    assert pids
    assert resolve_job(pids, proc_root=backend.proc_root) == "4000"
