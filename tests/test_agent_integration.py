"""The agent's parts together on a simulated fleet's clock: the sim backend follows the tick's time,
one NVML backend is shared by gpu/xid/canary, XID events and canary verdicts come from the node,
collector sections in the config, job tags, and the kernel-log fallback of the XID collector."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
from gpufleet.agent import config
from gpufleet.agent.backends.sim import SimBackend, TinyNode
from gpufleet.agent.collectors.canary import CanaryCollector
from gpufleet.agent.collectors.gpu import GpuCollector
from gpufleet.agent.collectors.xid import XidCollector

from gpufleet.errors import ConfigError
from tests.agent_support import ROOT, agent_cmd

T0 = 1_795_000_000.0  # the fleet's clock: days before the wall clock


class FleetNode:
    """A node on a fleet clock starting at T0: GPU 1 is lost from T0+100 until T0+120 (``lost``),
    GPU 1's canary fails from T0+300, and ``events`` holds (t, gpu, xid, message)."""

    def __init__(self, n=2):
        self.t0 = T0
        self.n = n
        self.events: list = []
        self.seen: list[float] = []
        self.lost = (T0 + 100, T0 + 120)
        self.tiny = TinyNode(n_gpus=n, t0=T0 - 3600)

    def gpus(self, t):
        self.seen.append(t)
        out = self.tiny.gpus(t)
        for s in out:
            s["nvlink"] = s["nvlink"][:2]
            if s["index"] == 1 and self.lost[0] <= t < self.lost[1]:
                s["health"] = "lost"
        return out

    def canary(self, index, t):
        if index == 1 and t >= T0 + 300:
            return 0, 17, "bad" * 21 + "x"
        return 1, 0, "good" * 16


def ns(t):
    return int(t * 1e9)


def by_gpu(samples, measurement="gpu"):
    return {s.tags["gpu"]: s for s in samples if s.measurement == measurement}


def test_a_gpu_lost_mid_run_is_seen_at_its_time_and_retried_on_the_fleet_clock():
    node = FleetNode()
    b = SimBackend(node)
    c = GpuCollector(b, retry_s=30)
    try:
        first = by_gpu(c.collect(ns(T0 + 10)))
        assert first["1"].fields["up"] == 1  # healthy at the start: not quarantined from a wall-clock probe
        assert min(node.seen) >= T0  # the node was never asked at wall-clock time
        lost = by_gpu(c.collect(ns(T0 + 110)))
        assert lost["1"].fields == {"up": 0, "health_code": 2} and lost["0"].fields["up"] == 1
        # back at T0+120, but retried only 30 s of fleet time after the loss, whatever the wall clock says
        assert by_gpu(c.collect(ns(T0 + 130)))["1"].fields["up"] == 0
        assert by_gpu(c.collect(ns(T0 + 140)))["1"].fields["up"] == 1
    finally:
        c.close()


def test_slow_tier_and_nvlink_follow_the_fleet_clock():
    c = GpuCollector(SimBackend(FleetNode()), nvlink_interval_s=30)
    try:
        links, slow = [], []
        for k in range(8):  # polls 10 s of fleet time apart, run back to back in wall time
            s = c.collect(ns(T0 + 10 * k))
            links.append(sum(1 for x in s if x.measurement == "gpu_nvlink"))
            slow.append("power_limit_watts" in by_gpu(s)["0"].fields)
        assert links == [4, 0, 0, 4, 0, 0, 4, 0]
        assert slow == [True, False, False, False, False, False, True, False]
        # time going backwards (a replay from the start) restarts the cadences
        s = c.collect(ns(T0))
        assert "power_limit_watts" in by_gpu(s)["0"].fields and by_gpu(s, "gpu_nvlink")
    finally:
        c.close()


def test_job_tags_on_every_gpu_row():
    t = 3600.0 + 100.0  # TinyNode: every GPU busy with a Slurm job
    c = GpuCollector(SimBackend(TinyNode(n_gpus=2, t0=0.0)), job_tags=["scheduler"])
    try:
        rows = [by_gpu(c.collect(ns(t + 10 * k))) for k in range(3)]
        for r in rows:  # the tag stays on fast polls too: one series per GPU
            assert r["0"].tags["scheduler"] == "slurm"
        assert rows[0]["0"].fields["job_id"] == "4006" and "job_id" not in rows[1]["0"].fields
    finally:
        c.close()
    c = GpuCollector(SimBackend(TinyNode(n_gpus=1, t0=0.0)))
    try:
        assert "scheduler" not in by_gpu(c.collect(ns(t)))["0"].tags  # none unless asked for
    finally:
        c.close()
    with pytest.raises(ConfigError, match="job_id"):
        GpuCollector(SimBackend(TinyNode(n_gpus=1)), job_tags=["job_id"])
    with pytest.raises(ConfigError, match="'gpu.job_tags'"):
        config.parse_text('[gpu]\njob_tags = ["job_id"]\n')


def test_xid_events_of_the_node_arrive_through_nvml_event_sets_at_their_own_time():
    node = FleetNode()
    b = SimBackend(node)
    b.nvmlInit()
    x = XidCollector(backend=b, kmsg="")
    try:
        assert x.nvml_status == "registered"
        node.events.append((T0 + 12.5, 1, 48, "DBE (Double Bit Error) ECC Error"))
        node.events.append((T0 + 25.0, 0, 79, "GPU has fallen off the bus."))
        b.begin_poll(ns(T0 + 20))  # the second event is still in the future
        rows: list = []
        deadline = time.monotonic() + 5
        while len(rows) < 2 and time.monotonic() < deadline:
            rows += x.collect(ns(T0 + 20))
            time.sleep(0.01)
        got = sorted((r.time_ns, r.tags["type"], r.tags["gpu"], r.fields.get("code")) for r in rows)
        assert got == [(ns(T0 + 12.5), "ecc_dbe", "1", None), (ns(T0 + 12.5), "xid", "1", 48)]
        assert all(r.tags["source"] == "nvml" and r.tags["uuid"].startswith("GPU-") for r in rows)
        b.begin_poll(ns(T0 + 30))
        deadline = time.monotonic() + 5
        rows = []
        while not rows and time.monotonic() < deadline:
            rows = x.collect(ns(T0 + 30))
            time.sleep(0.01)
        assert [(r.time_ns, r.fields["code"], r.fields["severity"]) for r in rows] == [
            (ns(T0 + 25), 79, "critical")]
    finally:
        x.close()


def test_canary_reports_the_nodes_verdicts_on_the_fleet_clock():
    node = FleetNode()
    b = SimBackend(node)
    b.nvmlInit()
    c = CanaryCollector(backend=b, interval=300, busy_size=256, busy_backoff=300)
    assert c.engine_name == "sim" and [d["label"] for d in c.devices] == ["0", "1"]
    seen = {}
    for k in range(0, 70):  # 700 s of fleet time, polls 10 s apart
        t = T0 + 10 * k
        b.begin_poll(ns(t))
        for s in (s for s in c.collect(ns(t)) if s.measurement == "gpu_canary"):
            seen.setdefault(s.tags["gpu"], []).append((round(s.time_ns / 1e9 - T0), s.fields["passed"],
                                                       s.fields["mismatches"]))
    # every 300 s of fleet time (busy GPUs too, with busy_size); GPU 1 lost at T0+100..120 is skipped
    assert [x[0] for x in seen["0"]] == [0, 300, 600]
    assert seen["0"][-1][1:] == (1, 0)
    assert [x[0] for x in seen["1"]] == [0, 300, 600] and seen["1"][1][1:] == (0, 17)
    c.close()
    c = CanaryCollector(backend=b, interval=300, busy_size=256, busy_backoff=300)
    b.begin_poll(ns(T0 + 110))  # GPU 1 lost now: no check, no row, the other GPU checked
    assert [s.tags["gpu"] for s in c.collect(ns(T0 + 110)) if s.measurement == "gpu_canary"] == ["0"]
    assert c.skipped["1"] == "GPU lost"


def test_config_sections_of_the_collectors():
    cfg = config.parse_text('[ipmi]\nhost = "10.1.2.3"\ndeadline = "2s"\n[xid]\nkmsg = ""\n'
                            '[canary]\ninterval = "5m"\nduty = 0.01\n')
    assert config.collector_options(cfg, "ipmi")["bmc_host"] == "10.1.2.3"
    assert config.collector_options(cfg, "ipmi")["deadline"] == 2.0
    assert config.collector_options(cfg, "canary")["interval"] == 300.0
    assert config.collector_options(cfg, "xid")["kmsg"] == ""
    for text, key in (('[xid]\nbogus = 1\n', "xid.bogus"), ('[canary]\nduty = "x"\n', "canary.duty"),
                      ('[ipmi]\nport = 0\n', "ipmi.port"), ('[canary]\nsize = 8\n', "canary.size"),
                      ('[canary]\nengine = "gpu"\n', "canary.engine"), ('[xid]\nreplay = 1\n', "xid.replay"),
                      ('[ipmi]\nbackoff_min = "10m"\nbackoff_max = "1m"\n', "ipmi.backoff_min")):
        with pytest.raises(ConfigError, match=f"'{key}'"):
            config.parse_text(text)
    d = config.load(None)
    assert d["spool"]["dir"].startswith("/var/lib/gpufleet-agent/")
    assert d["file"]["dir"].startswith("/var/lib/gpufleet-agent/")
    assert d["canary"]["state_dir"].startswith("/var/lib/gpufleet-agent/")


@pytest.mark.slow
def test_bad_collector_section_is_one_line_exit_2(tmp_path):
    p = tmp_path / "agent.toml"
    p.write_text('[canary]\nidle_util = "busy"\n')
    r = subprocess.run(agent_cmd("--config", str(p)), capture_output=True, text=True, cwd=ROOT, timeout=60)
    assert r.returncode == 2 and "Traceback" not in r.stderr
    assert r.stderr.strip().count("\n") == 0 and "'canary.idle_util'" in r.stderr


def test_daemon_shares_one_backend_between_xid_and_canary(tmp_path, monkeypatch):
    from gpufleet.agent.daemon import Agent

    for k, v in {"GPUFLEET_SIM_NODES": "1", "GPUFLEET_SIM_GPUS_PER_NODE": "2", "GPUFLEET_SIM_DURATION": "1h",
                 "GPUFLEET_SIM_T0": str(T0)}.items():
        monkeypatch.setenv(k, v)
    cfg = config.apply_overrides(config.load(None), backend="sim", sim_node="gpu0001", file_dir=str(tmp_path))
    cfg = config.validate({**cfg, "agent": {**cfg["agent"], "collectors": ["xid", "canary"]},
                           "xid": {"kmsg": ""}, "canary": {"interval": 300.0, "busy_size": 256,
                                                            "state_dir": ""}})
    a = Agent(cfg)
    try:
        xid, canary = a.collectors
        assert xid.backend is canary.backend is a.backend and a.backend.name == "sim"
        assert xid.nvml_status == "registered" and canary.engine_name == "sim"
        assert canary.interval == 300.0  # the section's interval, not the agent's poll interval
        for k in range(1, 4):
            assert a.tick(ns(T0 + 10 * k))
        assert a.backend.t == T0 + 30  # the node follows the ticks
    finally:
        a.close()
    text = "".join(p.read_text() for p in tmp_path.glob("*.lp"))
    assert text.count("gpu_canary,") == 2


_CHILD = """
import logging, sys
logging.basicConfig(level=logging.WARNING, format="%(message)s")
from gpufleet.agent.backends.sim import SimBackend
from tests.test_agent_integration import FleetNode
from gpufleet.agent.collectors.xid import XidCollector
b = SimBackend(FleetNode()); b.nvmlInit()
x = XidCollector(backend=b, kmsg=sys.argv[1])
print("SOURCE", x.source.kind if x.source else None, x.nvml_status)
print("ROWS", len(x.collect(0)))
x.close()
"""


@pytest.mark.slow
def test_unreadable_kernel_log_falls_back_to_the_journal_then_to_nvml_events_only(tmp_path):
    kmsg = tmp_path / "kmsg"
    kmsg.write_text("")
    os.chmod(kmsg, 0)  # read refused: EACCES, as /dev/kmsg is to an agent without CAP_SYSLOG
    # root reads anything: drop every capability for the child (a sandboxed service is in that state)
    wrap = [shutil.which("setpriv") or "setpriv", "--bounding-set=-all", "--inh-caps=-all"] \
        if os.geteuid() == 0 else []
    logs = [str(kmsg)]
    if wrap and Path("/proc/sys/kernel/dmesg_restrict").read_text().strip() == "1":
        logs.append("/dev/kmsg")  # the real thing: EPERM without CAP_SYSLOG
    bare = tmp_path / "bin"
    bare.mkdir()
    for log in logs:
        for name, path in (("journal", os.environ["PATH"]), ("none", str(bare))):
            if name == "journal" and not shutil.which("journalctl"):
                continue
            r = subprocess.run([*wrap, sys.executable, "-c", _CHILD, log], capture_output=True, text=True,
                               cwd=ROOT, env=dict(os.environ, PATH=path), timeout=60)
            assert r.returncode == 0, r.stderr
            out, err = r.stdout, r.stderr
            if name == "journal":
                assert "SOURCE journal registered" in out
                assert err.count("\n") == 1 and "reading the kernel log from the journal" in err
            else:  # neither: the NVML events carry on
                assert "SOURCE None registered" in out and "ROWS 0" in out
                assert err.count("\n") == 1 and "NVML events only" in err


def test_agents_sharing_a_file_directory_leave_each_others_segments_alone(tmp_path):
    from gpufleet.agent.pipeline.filesink import FileSink

    a = FileSink(tmp_path, "gpu0001")
    a.write(["gpu,host=gpu0001 up=1i 1"])
    other = tmp_path / "gpufleet-gpu0001-b-20261120T000000Z.lp"  # a host whose name starts alike
    other.write_bytes(b"gpu,host=gpu0001-b up=1i 1\ngpu,host=gpu0001-b up=")  # still being written
    b = FileSink(tmp_path, "gpu0002")  # a second agent starts while the first is mid-segment
    b.write(["gpu,host=gpu0002 up=1i 1"])
    a.write(["gpu,host=gpu0001 up=1i 2"])
    a.close()
    b.close()
    (mine,) = tmp_path.glob("gpufleet-gpu0001-2*.lp")
    assert mine.read_text() == "gpu,host=gpu0001 up=1i 1\ngpu,host=gpu0001 up=1i 2\n"  # not gzipped away
    assert other.read_bytes().endswith(b"up=")  # another host's torn tail is not cut
    FileSink(tmp_path, "gpu0001").close()  # its own restart closes (gzips) its own old segment
    assert not mine.exists() and mine.with_suffix(".lp.gz").exists() and other.exists()
