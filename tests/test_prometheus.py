"""The prometheus exporter: GET /metrics in both formats, dcgm-exporter names, a real
VictoriaMetrics scraping simulated agents, a recorded real GPU served under dcgm names."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import requests
from gpufleet.agent import config
from gpufleet.agent.daemon import Agent
from prometheus_client.openmetrics.parser import text_string_to_metric_families as om_families
from prometheus_client.parser import text_string_to_metric_families

from gpufleet import catalogue, dcgm_doc
from gpufleet.errors import ConfigError
from gpufleet.lineprotocol import parse_line
from tests.conftest import FIXTURES, ROOT
from tests.servers import VictoriaMetrics, free_port, skip_unless

H100 = FIXTURES / "recordings" / "h100" / "nvml_dump.json"
GPU_LABELS = {"gpu", "UUID", "device", "modelName", "Hostname"}


def make_agent(tmp: Path, names: str = "both", backend: str = "sim", exporters=("file", "prometheus")):
    doc = {"agent": {"backend": backend, "interval": 1, "exporters": list(exporters), "host": "n1"},
           "labels": {"cluster": "c1"},
           "file": {"dir": str(tmp / "lp"), "compress": False},
           "prometheus": {"listen": "127.0.0.1:0", "names": names}}
    ag = Agent(config.validate(doc))
    clock = [0.0]  # the GPU collector's cadences (slow tier, NVLink) follow this clock
    for c in ag.collectors:
        if getattr(c, "name", "") == "gpu":
            c._clock = lambda: clock[0]
    return ag, clock


def scrape(ag: Agent, openmetrics: bool = False) -> requests.Response:
    headers = {"Accept": "application/openmetrics-text; version=1.0.0"} if openmetrics else {}
    r = requests.get(f"http://127.0.0.1:{ag.prom.port}/metrics", headers=headers, timeout=10)
    assert r.status_code == 200
    return r


def samples(text: str) -> list:
    """Every sample of the text format, under the name it has on the wire (prometheus_client's
    parser appends ``_total`` to a counter's samples that lack it, as dcgm-exporter's do)."""
    out = []
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            if fam.type == "counter" and fam.name.startswith("DCGM_") and s.name == fam.name + "_total":
                s = s._replace(name=fam.name)
            out.append(s)
    return out


# ---------------------------------------------------------------------------- config
def test_config_keys_and_bad_values_name_the_key():
    cfg = config.validate({"agent": {"exporters": ["prometheus"]}})
    assert cfg["prometheus"] == {"listen": "127.0.0.1:9400", "names": "gpufleet"}
    assert "prometheus" in config.exporter_classes()
    for bad, key in (({"listen": "9400"}, "prometheus.listen"), ({"listen": "h:70000"}, "prometheus.listen"),
                     ({"listen": "[::1]9400"}, "prometheus.listen"),
                     ({"names": "nvidia"}, "prometheus.names")):
        with pytest.raises(ConfigError, match=f"'{key}'"):
            config.validate({"agent": {"exporters": ["prometheus"]}, "prometheus": bad})
    assert config.parse_listen("[::1]:9400") == ("::1", 9400)


@pytest.mark.slow
def test_a_port_in_use_is_one_line_and_exit_2(tmp_path):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        conf = tmp_path / "agent.toml"
        conf.write_text(f'[agent]\nbackend = "sim"\nexporters = ["prometheus"]\ncollectors = ["gpu"]\n'
                        f'[prometheus]\nlisten = "127.0.0.1:{port}"\n')
        proc = subprocess.run([sys.executable, "-m", "gpufleet", "agent", "run", "--config", str(conf)],
                              capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert proc.returncode == 2, proc.stderr
    # (the start's INFO lines, one per collector, may come first: the error is one line)
    err = [ln for ln in proc.stderr.splitlines() if ln.strip() and " INFO " not in ln]
    assert len(err) == 1 and "prometheus.listen" in err[0] and "cannot listen" in err[0], proc.stderr
    assert "Traceback" not in proc.stderr


# ---------------------------------------------------------------------------- the endpoint
@pytest.mark.slow
def test_both_formats_parse_and_gpufleet_names_are_the_influx_series(tmp_path):
    """names = "both": the text format and OpenMetrics parse with prometheus_client's parsers;
    the gpufleet names and labels are exactly the line protocol's <measurement>_<field> and tags
    (what a VictoriaMetrics fed by the influx exporter stores); slow-tier values and NVLink rows
    stay on a tick that does not read them."""
    ag, clock = make_agent(tmp_path)
    try:
        t0 = time.time_ns()
        ag.tick(t0)  # first poll: every tier
        clock[0] = 1.0
        ag.tick(t0 + 10**9)  # fast tier only
        r = scrape(ag)
        assert r.headers["Content-Type"] == "text/plain; version=0.0.4; charset=utf-8"
        got = samples(r.text)
        om = scrape(ag, openmetrics=True)
        assert om.headers["Content-Type"].startswith("application/openmetrics-text; version=1.0.0")
        om_samples = [s for fam in om_families(om.text) for s in fam.samples]
        assert {(s.name, tuple(sorted(s.labels.items()))) for s in om_samples} == \
            {(s.name, tuple(sorted(s.labels.items()))) for s in got}

        # the line protocol of both ticks, as numbers per (series name, tags)
        lp = {}
        for f in sorted((tmp_path / "lp").rglob("*.lp")):
            for line in f.read_text().splitlines():
                p = parse_line(line)
                for k, v in p.fields.items():
                    if isinstance(v, (int, float)) and not isinstance(v, bool):
                        lp[(f"{p.measurement}_{k}", tuple(sorted(p.tags.items())))] = v
        prom = {(s.name, tuple(sorted(s.labels.items()))): s.value for s in got
                if not s.name.startswith("DCGM_") and not s.name.endswith("_info")}
        assert set(prom) == set(lp)
        assert all(prom[k] == pytest.approx(lp[k]) for k in prom)
        names = {k[0] for k in prom}
        assert {"gpu_memory_total_bytes", "gpu_nvlink_crc_flit_errors_total", "gpu_temperature_gpu_celsius",
                "gpu_memory_free_bytes"} <= names
        fams = {f.name: f.type for f in text_string_to_metric_families(r.text)}
        assert fams["gpu_ecc_corrected_volatile"] == "counter"
        assert fams["gpu_temperature_gpu_celsius"] == "gauge"
        assert fams["DCGM_FI_DEV_PCIE_REPLAY_COUNTER"] == "counter"
        assert "# TYPE DCGM_FI_DEV_PCIE_REPLAY_COUNTER unknown" in om.text  # no _total: not an OM counter

        # dcgm names: one series per GPU with dcgm-exporter's labels
        temp = [s for s in got if s.name == "DCGM_FI_DEV_GPU_TEMP"]
        assert sorted(int(s.labels["gpu"]) for s in temp) == list(range(8))
        assert all(GPU_LABELS <= set(s.labels) and s.labels["Hostname"] == "n1"
                   and s.labels["device"] == f"nvidia{s.labels['gpu']}" for s in temp)
        flit = [s for s in got if s.name == "DCGM_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL"]
        assert len(flit) == 8 and "link" not in flit[0].labels  # summed over the links
        util = {s.labels["gpu"]: s.value for s in got if s.name == "DCGM_FI_DEV_GPU_UTIL"}
        gf = {s.labels["gpu"]: s.value for s in got if s.name == "gpu_utilization_gpu_ratio"}
        assert util == {g: int(v * 100 + 1e-6) for g, v in gf.items()}
        jobs = {s.labels.get("hpc_job") for s in temp}
        busy = {s.labels["gpu"] for s in got if s.name == "gpu_job_id_info"}
        assert busy
        assert {s.labels.get("hpc_job") is not None for s in temp if s.labels["gpu"] in busy} == {True}
        assert jobs - {None}
    finally:
        ag.close(0)


class CountingBackend:
    """Wraps the sim backend and counts every NVML call made through it."""

    def __init__(self, inner):
        self.inner, self.calls = inner, 0

    def __getattr__(self, name):
        attr = getattr(self.inner, name)
        if callable(attr) and name.startswith("nvml"):
            def counted(*a, **k):
                self.calls += 1
                return attr(*a, **k)
            return counted
        return attr


@pytest.mark.slow
def test_scrapes_never_touch_nvml_and_a_stalled_scraper_never_stalls_the_loop(tmp_path):
    ag, clock = make_agent(tmp_path, names="dcgm", exporters=("prometheus",))
    try:
        gpu = next(c for c in ag.collectors if getattr(c, "name", "") == "gpu")
        counting = CountingBackend(gpu.backend)
        gpu.backend = counting
        t0 = time.time_ns()
        ag.tick(t0)
        before = counting.calls
        assert before > 0
        # a client that connects and never finishes its request
        stalled = socket.create_connection(("127.0.0.1", ag.prom.port))
        stalled.sendall(b"GET /metrics HTTP/1.1\r\nHost: x\r\n")
        bodies, errors = [], []

        def hammer():
            try:
                for _ in range(5):
                    bodies.append(scrape(ag).text)
            except Exception as exc:  # noqa: BLE001 - reported below
                errors.append(exc)

        threads = [threading.Thread(target=hammer) for _ in range(8)]
        for th in threads:
            th.start()
        for th in threads:
            th.join(60)
        assert not errors and len(bodies) == 40
        assert counting.calls == before  # 40 scrapes, no NVML call
        assert all(len(samples(b)) == len(samples(bodies[0])) for b in bodies)
        t = time.monotonic()
        clock[0] = 1.0
        ag.tick(t0 + 10**9)  # the loop goes on beside the stalled connection
        assert time.monotonic() - t < 5
        assert counting.calls > before
        stalled.close()
        # a snapshot swap under scrapes: every scrape sees one whole tick (8 GPU temperatures)
        for i in range(2, 6):
            clock[0] = float(i)
            ag.tick(t0 + i * 10**9)
            assert len([s for s in samples(scrape(ag).text) if s.name == "DCGM_FI_DEV_GPU_TEMP"]) == 8
        assert requests.get(f"http://127.0.0.1:{ag.prom.port}/nope", timeout=5).status_code == 404
    finally:
        ag.close(0)


@pytest.mark.slow
def test_a_reloaded_agent_serves_again_on_the_same_port(tmp_path):
    """SIGHUP builds a new Agent after closing the old one: the port is free again at once."""
    port = free_port()
    for n in range(2):
        doc = {"agent": {"backend": "sim", "interval": 1, "exporters": ["prometheus"], "host": f"n{n}"},
               "prometheus": {"listen": f"127.0.0.1:{port}", "names": "dcgm"}}
        ag = Agent(config.validate(doc))
        try:
            ag.tick(time.time_ns())
            assert {s.labels["Hostname"] for s in samples(scrape(ag).text)} == {f"n{n}"}
        finally:
            ag.close(0)
    with pytest.raises(requests.ConnectionError):
        requests.get(f"http://127.0.0.1:{port}/metrics", timeout=5)


def test_held_values_outlive_the_slowest_collector_rows():
    """The hold is twice the longest gap between two rows of one series that any collector
    declares (``slowest_rows``: gpu's nvlink_interval, canary's status_every) plus one tick."""
    from types import SimpleNamespace

    from gpufleet.agent.pipeline.prometheus import PrometheusExporter

    for text, hold in (('[gpu]\nnvlink_interval = "5m"\n', 2 * 300 + 10),
                       ('[canary]\nstatus_every = "2m"\n', 2 * 120 + 10),
                       ("", 2 * 60 + 10)):
        cfg = config.parse_text(text)
        exp = PrometheusExporter.build(cfg["prometheus"], SimpleNamespace(cfg=cfg, interval=10.0))
        assert exp.hold_ns == hold * 10**9, text


def test_held_values_stay_while_their_gpu_is_reported_and_no_longer():
    """Slow-tier values are served between the polls that read them; a GPU no longer reported
    takes all its series along; a held value older than hold_s goes too (never stale forever)."""
    from gpufleet.agent.model import Sample
    from gpufleet.agent.pipeline import Pipeline
    from gpufleet.agent.pipeline.prometheus import PrometheusExporter

    exp = PrometheusExporter("127.0.0.1:0", "both", hold_s=30)
    pipe = Pipeline("n1", {}, [exp])

    def tick(t_s: int, gpus, slow: bool):
        rows = []
        for g in gpus:
            f = {"temperature_gpu_celsius": 40 + g}
            if slow:
                f["memory_total_bytes"] = 2**30 * (g + 1)
            rows.append(Sample("gpu", {"gpu": str(g), "uuid": f"GPU-{g}", "model": "M"}, f, t_s * 10**9))
        pipe.observe(rows)
        pipe.collect(t_s * 10**9)
        return {(s.name, s.labels.get("gpu")): s.value for s in samples(exp.render().decode())}

    try:
        got = tick(0, (0, 1), slow=True)
        assert got[("DCGM_FI_DEV_FB_TOTAL", "1")] == 2048 and got[("gpu_memory_total_bytes", "0")] == 2**30
        got = tick(10, (0, 1), slow=False)  # a fast poll: the slow values are still served
        assert got[("DCGM_FI_DEV_FB_TOTAL", "1")] == 2048 and got[("DCGM_FI_DEV_GPU_TEMP", "1")] == 41
        # a job-tag change: the GPU's row has new tags; its slow poll leaves no series of the old ones
        pipe.observe([Sample("gpu", {"gpu": "0", "uuid": "GPU-0", "model": "M", "user": "u2"},
                             {"temperature_gpu_celsius": 40, "memory_total_bytes": 2**30}, 15 * 10**9),
                      Sample("gpu", {"gpu": "1", "uuid": "GPU-1", "model": "M"},
                             {"temperature_gpu_celsius": 41, "memory_total_bytes": 2**31}, 15 * 10**9)])
        pipe.collect(15 * 10**9)
        total = [s for s in samples(exp.render().decode()) if s.name == "gpu_memory_total_bytes"]
        assert sorted((s.labels["gpu"], s.labels.get("user")) for s in total) == [("0", "u2"), ("1", None)]
        got = tick(20, (0,), slow=False)  # GPU 1 no longer reported: every series of it goes
        assert {g for _, g in got} == {"0"} and got[("DCGM_FI_DEV_FB_TOTAL", "0")] == 1024
        got = tick(50, (0,), slow=False)  # read 35 s ago, hold_s 30: gone, never stale forever
        assert ("DCGM_FI_DEV_FB_TOTAL", "0") not in got and ("gpu_memory_total_bytes", "0") not in got
        assert got[("DCGM_FI_DEV_GPU_TEMP", "0")] == 40
    finally:
        pipe.shutdown()


# ---------------------------------------------------------------------------- a recorded real GPU
def test_recorded_h100_served_as_dcgm_gives_what_nvml_answered(tmp_path):
    """The H100 recording through names = "dcgm": each value is what its NVML answer implies in
    dcgm-exporter's unit (mW -> W, bytes -> MiB rounded down, mJ, MHz, %)."""
    dump = json.loads(H100.read_text())
    calls, args, fields = dump["calls"], dump["args"], dump["fields"]
    mem = calls["nvmlDeviceGetMemoryInfo"]["value"]
    util = calls["nvmlDeviceGetUtilizationRates"]["value"]
    want = {
        "DCGM_FI_DEV_GPU_TEMP": args["nvmlDeviceGetTemperature(0)"]["value"],
        "DCGM_FI_DEV_MEMORY_TEMP": fields["NVML_FI_DEV_MEMORY_TEMP"]["value"],
        "DCGM_FI_DEV_POWER_USAGE": calls["nvmlDeviceGetPowerUsage"]["value"] / 1000,
        "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION": fields["NVML_FI_DEV_TOTAL_ENERGY_CONSUMPTION"]["value"],
        "DCGM_FI_DEV_FB_USED": mem["used"] // 2**20,
        "DCGM_FI_DEV_FB_FREE": mem["free"] // 2**20,
        "DCGM_FI_DEV_FB_TOTAL": mem["total"] // 2**20,
        "DCGM_FI_DEV_SM_CLOCK": args["nvmlDeviceGetClockInfo(1)"]["value"],
        "DCGM_FI_DEV_MEM_CLOCK": args["nvmlDeviceGetClockInfo(2)"]["value"],
        "DCGM_FI_DEV_GPU_UTIL": util["gpu"],
        "DCGM_FI_DEV_MEM_COPY_UTIL": util["memory"],
        "DCGM_FI_DEV_PCIE_REPLAY_COUNTER": calls["nvmlDeviceGetPcieReplayCounter"]["value"],
    }
    ag, _ = make_agent(tmp_path, names="dcgm", backend=f"recorded:{H100}", exporters=("prometheus",))
    try:
        ag.tick(time.time_ns())
        text = scrape(ag).text
    finally:
        ag.close(0)
    got = {s.name: s for s in samples(text)}
    for name, value in want.items():
        assert name in got, name
        assert got[name].value == pytest.approx(value), name
        assert got[name].labels["UUID"] == calls["nvmlDeviceGetUUID"]["value"]
        assert got[name].labels["modelName"] == calls["nvmlDeviceGetName"]["value"] == "NVIDIA H100 80GB HBM3"
    # integers where DCGM's fields are int64, W as a float
    assert "DCGM_FI_DEV_FB_USED{" in text and f"}} {mem['used'] // 2**20}\n" in text
    assert f"}} {calls['nvmlDeviceGetPowerUsage']['value'] / 1000!r}\n" in text
    # no NVLink on this H100, no XID seen: those names are absent, never 0
    assert "DCGM_FI_DEV_XID_ERRORS" not in got and "DCGM_FI_PROF_NVLINK_TX_BYTES" not in got
    assert all(n.startswith("DCGM_FI_") for n in got)


# ---------------------------------------------------------------------------- a real scraper
FAULTS = """name = "dcgm-alerts"
[fleet]
nodes = 1
gpus_per_node = 8
[workload]
busy = 1.0
[[fault]]
kind = "memory_errors"
mode = "dbe"
host = "gpu0001"
gpu = 2
onset = "30s"
growth = "1m"
[[fault]]
kind = "thermal_throttle"
mode = "heatsink"
host = "gpu0001"
gpu = 5
onset = "10s"
severity = 3.0
"""

# Dashboard 12239 ("NVIDIA DCGM Exporter Dashboard", dcgm-exporter's grafana/dcgm-exporter-dashboard.json):
# every panel's expression and its template queries, $Hostname and $gpu as "All" (.*)
DASHBOARD_12239 = [
    'max(DCGM_FI_DEV_GPU_TEMP{Hostname=~".*", gpu=~".*"}) by (Hostname, gpu, uuid)',
    'avg(DCGM_FI_DEV_GPU_TEMP{Hostname=~".*", gpu=~".*"})',
    'max(DCGM_FI_DEV_POWER_USAGE{Hostname=~".*", gpu=~".*"}) by (Hostname, gpu, uuid)',
    'sum(max(DCGM_FI_DEV_POWER_USAGE{Hostname=~".*", gpu=~".*"}) by (gpu))',
    'max(DCGM_FI_DEV_SM_CLOCK{Hostname=~".*", gpu=~".*"} * 1000000) by (Hostname, UUID, gpu)',
    'max(DCGM_FI_PROF_GR_ENGINE_ACTIVE{Hostname=~".*", gpu=~".*"}) '
    'by (Hostname, gpu, GPU_I_ID, GPU_I_PROFILE)',
    'max(DCGM_FI_PROF_PIPE_TENSOR_ACTIVE{Hostname=~".*", gpu=~".*"}) '
    'by (Hostname, gpu, GPU_I_ID, GPU_I_PROFILE)',
    'max(DCGM_FI_DEV_FB_USED{Hostname=~".*", gpu=~".*"}) by (Hostname, gpu, GPU_I_ID, GPU_I_PROFILE)',
    'DCGM_FI_DEV_FB_FREE',  # label_values(DCGM_FI_DEV_FB_FREE, Hostname) / (..., gpu)
    # the panels of its earlier revisions
    'DCGM_FI_DEV_GPU_UTIL{gpu=~".*"}',
    'DCGM_FI_DEV_MEM_COPY_UTIL',
]
# the usual dcgm-exporter alert rules: temperature, XID, ECC (and the row remapper behind a DBE)
ALERT_RULES = [
    "DCGM_FI_DEV_GPU_TEMP > 80",
    "DCGM_FI_DEV_XID_ERRORS > 0",
    "DCGM_FI_DEV_XID_ERRORS != 0",
    "DCGM_FI_DEV_ECC_DBE_VOL_TOTAL > 0",
    "increase(DCGM_FI_DEV_ECC_SBE_VOL_TOTAL[1m]) > 0 or DCGM_FI_DEV_ECC_SBE_VOL_TOTAL > 0",
    "DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS > 0",
    "DCGM_FI_DEV_ROW_REMAP_PENDING > 0",
]


def _start_agent(tmp: Path, name: str, port: int, env: dict, sim_node: str = "") -> subprocess.Popen:
    conf = tmp / f"{name}.toml"
    node = f'sim_node = "{sim_node}"\n' if sim_node else ""
    conf.write_text(f'[agent]\nbackend = "sim"\n{node}host = "{name}"\ninterval = "1s"\n'
                    'collectors = ["gpu", "xid"]\nexporters = ["prometheus"]\n'
                    f'[xid]\nkmsg = ""\nstate_dir = "{tmp}/xid-{name}"\n'
                    f'[prometheus]\nlisten = "127.0.0.1:{port}"\nnames = "dcgm"\n')
    return subprocess.Popen([sys.executable, "-m", "gpufleet", "agent", "run", "--config", str(conf)],
                            cwd=ROOT, env=env, stdout=subprocess.DEVNULL,
                            stderr=open(tmp / f"{name}.log", "wb"))


@skip_unless("victoria-metrics")
def test_victoriametrics_scrapes_dcgm_names_dashboard_12239_and_alert_rules_answer(tmp_path):
    """Two simulated nodes scraped by a real VictoriaMetrics every second: a steady one (the sim
    backend's own node) and one of a simulated fleet with a double-bit error (XID 48) and a
    heat-sink failure. One series per GPU and name with dcgm-exporter's labels; every panel of
    dashboard 12239 and every usual alert rule returns data."""
    scenario = tmp_path / "faults.toml"
    scenario.write_text(FAULTS)
    env = {**os.environ, "GPUFLEET_SIM_SCENARIO": str(scenario), "GPUFLEET_SIM_SPEED": "60",
           "GPUFLEET_SIM_DURATION": "2h", "PYTHONPATH": str(ROOT)}
    ports = {"steady": free_port(), "gpu0001": free_port()}
    procs = [_start_agent(tmp_path, "steady", ports["steady"], env),
             _start_agent(tmp_path, "gpu0001", ports["gpu0001"], env, sim_node="gpu0001")]
    try:
        with VictoriaMetrics(tmp_path / "vm", scrape=[f"127.0.0.1:{p}" for p in ports.values()]) as vm:
            deadline = time.monotonic() + 120
            missing = DASHBOARD_12239 + ALERT_RULES
            while time.monotonic() < deadline and missing:
                time.sleep(1)
                missing = [q for q in DASHBOARD_12239 + ALERT_RULES if not vm.query(q)]
                assert all(p.poll() is None for p in procs), [(tmp_path / f"{n}.log").read_text()[-2000:]
                                                              for n in ports]
            assert not missing, missing
            for name in ("DCGM_FI_DEV_GPU_TEMP", "DCGM_FI_DEV_POWER_USAGE", "DCGM_FI_DEV_GPU_UTIL"):
                series = vm.query(name)
                for host in ports:
                    mine = [s["metric"] for s in series if s["metric"]["Hostname"] == host]
                    assert sorted(int(m["gpu"]) for m in mine) == list(range(8)), (name, host, mine)
                    assert all(GPU_LABELS <= set(m) and m["UUID"].startswith("GPU-") and m["modelName"]
                               for m in mine)
            hot = vm.query("DCGM_FI_DEV_GPU_TEMP > 80")
            assert {(s["metric"]["Hostname"], s["metric"]["gpu"]) for s in hot} == {("gpu0001", "5")}
            xid = vm.query("DCGM_FI_DEV_XID_ERRORS > 0")
            assert {(s["metric"]["Hostname"], s["metric"]["gpu"]) for s in xid} == {("gpu0001", "2")}
            assert xid[0]["value"][1] == "63"  # the last of the DBE's XIDs 48, 94, 63
            dbe = vm.query("DCGM_FI_DEV_ECC_DBE_VOL_TOTAL > 0")
            assert {(s["metric"]["Hostname"], s["metric"]["gpu"]) for s in dbe} == {("gpu0001", "2")}
    finally:
        for p in procs:
            p.terminate()
        for p in procs:
            try:
                p.wait(20)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait(5)


# ---------------------------------------------------------------------------- the generated table
def test_dcgm_doc_lists_every_name():
    text = dcgm_doc.render()  # (docs/dcgm.md is kept current by tests/test_regen.py)
    for name in catalogue.dcgm_names():
        assert f"| `{name}` |" in text
    for name in catalogue.dcgm_not_served():
        assert f"| `{name}` |" in text
    assert not set(catalogue.dcgm_names()) & set(catalogue.dcgm_not_served())
    # every name of dcgm-exporter's default counter list is either served or listed as not served
    default_counters = {  # dcgm-exporter's default-counters.csv and dcp-metrics-included.csv
        "DCGM_FI_DEV_SM_CLOCK", "DCGM_FI_DEV_MEM_CLOCK", "DCGM_FI_DEV_MEMORY_TEMP",
        "DCGM_FI_DEV_GPU_TEMP", "DCGM_FI_DEV_POWER_USAGE", "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION",
        "DCGM_FI_DEV_PCIE_TX_THROUGHPUT", "DCGM_FI_DEV_PCIE_RX_THROUGHPUT",
        "DCGM_FI_DEV_PCIE_REPLAY_COUNTER", "DCGM_FI_DEV_GPU_UTIL", "DCGM_FI_DEV_MEM_COPY_UTIL",
        "DCGM_FI_DEV_ENC_UTIL", "DCGM_FI_DEV_DEC_UTIL", "DCGM_FI_DEV_XID_ERRORS",
        "DCGM_FI_DEV_POWER_VIOLATION", "DCGM_FI_DEV_THERMAL_VIOLATION",
        "DCGM_FI_DEV_SYNC_BOOST_VIOLATION", "DCGM_FI_DEV_BOARD_LIMIT_VIOLATION",
        "DCGM_FI_DEV_LOW_UTIL_VIOLATION", "DCGM_FI_DEV_RELIABILITY_VIOLATION", "DCGM_FI_DEV_FB_FREE",
        "DCGM_FI_DEV_FB_USED", "DCGM_FI_DEV_ECC_SBE_VOL_TOTAL", "DCGM_FI_DEV_ECC_DBE_VOL_TOTAL",
        "DCGM_FI_DEV_ECC_SBE_AGG_TOTAL", "DCGM_FI_DEV_ECC_DBE_AGG_TOTAL", "DCGM_FI_DEV_RETIRED_SBE",
        "DCGM_FI_DEV_RETIRED_DBE", "DCGM_FI_DEV_RETIRED_PENDING",
        "DCGM_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL",
        "DCGM_FI_DEV_NVLINK_CRC_DATA_ERROR_COUNT_TOTAL", "DCGM_FI_DEV_NVLINK_REPLAY_ERROR_COUNT_TOTAL",
        "DCGM_FI_DEV_NVLINK_RECOVERY_ERROR_COUNT_TOTAL", "DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL",
        "DCGM_FI_DEV_VGPU_LICENSE_STATUS", "DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS",
        "DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS", "DCGM_FI_DEV_ROW_REMAP_FAILURE",
        "DCGM_FI_DEV_FB_RESERVED", "DCGM_FI_DRIVER_VERSION", "DCGM_FI_PROF_GR_ENGINE_ACTIVE",
        "DCGM_FI_PROF_SM_ACTIVE", "DCGM_FI_PROF_SM_OCCUPANCY", "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE",
        "DCGM_FI_PROF_DRAM_ACTIVE", "DCGM_FI_PROF_PIPE_FP64_ACTIVE", "DCGM_FI_PROF_PIPE_FP32_ACTIVE",
        "DCGM_FI_PROF_PIPE_FP16_ACTIVE", "DCGM_FI_PROF_PCIE_TX_BYTES", "DCGM_FI_PROF_PCIE_RX_BYTES",
    }
    assert default_counters <= set(catalogue.dcgm_names()) | set(catalogue.dcgm_not_served())
