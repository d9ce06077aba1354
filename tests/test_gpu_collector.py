"""The NVML collector on recordings of real GPUs and on the simulated node."""

from __future__ import annotations

import threading
import time

import pynvml
import pytest
from gpufleet.agent import config as agent_config
from gpufleet.agent.backends import get_backend
from gpufleet.agent.backends.recorded import RecordedBackend
from gpufleet.agent.backends.sim import SimBackend, TinyNode
from gpufleet.agent.collectors import CollectorUnavailable
from gpufleet.agent.collectors.gpu import SLOW_FIELD_IDS, GpuCollector

from tests.conftest import FIXTURES

REC = FIXTURES / "recordings"
# whole-GPU recordings (the GPM probe records GPM beside a few values only: see tests/test_gpm.py)
RECORDINGS = [p for p in sorted(REC.rglob("*.json")) + sorted(REC.rglob("*.xml")) if p.stem != "gpm_probe"]


class Clock:
    """A settable monotonic clock for tier and retry timing."""

    def __init__(self):
        self.t = 1000.0

    def __call__(self):
        return self.t


def poll(path, **kw):
    c = GpuCollector(RecordedBackend(path), **kw)
    try:
        return c.collect(1_795_000_000_000_000_000)
    finally:
        c.close()


def gpu_rows(samples):
    return [s for s in samples if s.measurement == "gpu"]


def test_all_recordings_are_here():
    # 4 NVML dumps (3 H200, 1 H100) + 14 nvidia-smi logs (12 models + the H200 + the H100)
    assert len(RECORDINGS) == 18
    assert len({p.relative_to(REC) for p in RECORDINGS}) == 18


@pytest.mark.parametrize("path", RECORDINGS, ids=lambda p: p.name)
def test_every_recording_gives_a_valid_poll(path):
    samples = poll(path)
    rows = gpu_rows(samples)
    assert len(rows) >= 1
    for s in rows:
        assert s.tags["uuid"].startswith("GPU-") and s.tags["gpu"] == "0" and s.tags["model"]
        assert s.fields["up"] == 1 and s.fields["health_code"] == 0
        assert s.fields["temperature_gpu_celsius"] > 0
        assert s.fields["clock_memory_mhz"] > 0
        assert all(v is not None for v in s.fields.values())
        assert s.time_ns == 1_795_000_000_000_000_000


def test_h200_idle_values():
    (s,) = gpu_rows(poll(REC / "h200" / "nvml_dump.json"))
    f = s.fields
    assert s.tags["model"] == "NVIDIA H200"
    assert f["temperature_gpu_celsius"] == 38
    assert round(f["power_watts"], 1) == 79.3
    assert f["power_instant_watts"] == pytest.approx(83.556)
    assert f["clock_memory_mhz"] == 3201 and f["clock_sm_mhz"] == 345 and f["clock_sm_max_mhz"] == 1980
    assert f["power_limit_watts"] == 700.0
    assert (f["temperature_slowdown_celsius"], f["temperature_shutdown_celsius"],
            f["temperature_max_operating_celsius"], f["temperature_memory_max_celsius"]) == (89, 95, 87, 95)
    assert f["temperature_memory_celsius"] == 38
    assert f["energy_joules_total"] == pytest.approx(2556.94)
    assert f["clock_event_reasons"] == 1 and f["clock_event_idle"] == 1 and f["clock_event_sw_power_cap"] == 0
    assert f["pcie_link_gen"] == 5 and f["pcie_link_width"] == 16 and f["pcie_replay_total"] == 1
    assert f["utilization_gpu_ratio"] == 0.0
    assert f["mig_mode"] == 0
    # NotSupported on this GPU: absent, never 0
    for absent in ("fan_speed_ratio", "retired_pages_sbe", "retired_pages_dbe", "retired_pages_pending",
                   "memory_used_bytes", "job_id"):
        assert absent not in f


def test_h200_nvidia_smi_log_agrees():
    (s,) = gpu_rows(poll(REC / "h200" / "nvsmi_q.xml"))
    f = s.fields
    assert f["temperature_gpu_celsius"] == 38 and f["clock_memory_mhz"] == 3201
    assert f["power_watts"] == pytest.approx(79.17) and f["power_limit_watts"] == 700.0
    assert f["memory_total_bytes"] == 143771 * 2**20
    # this schema gives thresholds only relative to the T.Limit: the absolute ones are absent
    assert "temperature_slowdown_celsius" not in f


def test_h200_under_load_with_a_slurm_job():
    (s,) = gpu_rows(poll(REC / "h200" / "nvml_dump_busy.json"))
    f = s.fields
    assert f["clock_event_reasons"] == 0x4
    assert f["clock_event_sw_power_cap"] == 1
    assert f["clock_event_idle"] == 0 and f["clock_event_hw_thermal"] == 0
    assert f["power_watts"] == pytest.approx(689.959)
    assert f["throttle_sw_power_cap_ns_total"] == 11968576224
    assert f["utilization_gpu_ratio"] == pytest.approx(0.99)
    assert f["process_count"] == 1
    assert f["job_id"] == "4242"
    (s,) = gpu_rows(poll(REC / "h200" / "nvml_dump_after.json"))
    assert s.fields["process_count"] == 0 and "job_id" not in s.fields
    assert s.fields["clock_event_idle"] == 1


def test_a100_mig_and_remapped_rows():
    (s,) = gpu_rows(poll(REC / "nvidia-smi-xml" / "a100-sxm4-v12.xml"))
    f = s.fields
    assert s.tags["model"] == "NVIDIA A100-SXM4-80GB"
    assert f["mig_mode"] == 1 and f["mig_device_count"] == 4
    # remapped rows and utilization are N/A in MIG mode: absent
    assert not any(k.startswith("remapped_rows") for k in f)
    assert "utilization_gpu_ratio" not in f
    assert f["temperature_memory_celsius"] == 44 and f["power_limit_watts"] == 500.0
    (s,) = gpu_rows(poll(REC / "nvidia-smi-xml" / "a10g.xml"))
    assert [s.fields[f"remapped_rows_{k}"] for k in ("correctable", "uncorrectable", "pending", "failure")] \
        == [0, 0, 0, 0]
    assert "mig_mode" not in s.fields  # N/A on an A10G


def test_na_fields_are_absent():
    (s,) = gpu_rows(poll(REC / "nvidia-smi-xml" / "gtx-1070-ti.xml"))
    assert "power_watts" not in s.fields and "temperature_memory_celsius" not in s.fields
    assert s.fields["fan_speed_ratio"] == 1.0
    (s,) = gpu_rows(poll(REC / "nvidia-smi-xml" / "tesla-t4.xml"))
    assert s.fields["retired_pages_sbe"] == 0 and s.fields["retired_pages_pending"] == 0
    assert "fan_speed_ratio" not in s.fields and "temperature_memory_celsius" not in s.fields


class Counting(RecordedBackend):
    """A recorded backend that counts the calls the collector makes."""

    def __init__(self, path):
        super().__init__(path)
        self.calls: dict[str, int] = {}
        self.field_requests: list[list[int]] = []

    def answer(self, func, handle, *args):
        self.calls[func] = self.calls.get(func, 0) + 1
        return super().answer(func, handle, *args)

    def nvmlDeviceGetFieldValues(self, handle, fieldIds):
        self.field_requests.append(list(fieldIds))
        return super().nvmlDeviceGetFieldValues(handle, fieldIds)


def test_query_gate_remembers_what_is_not_supported():
    b = Counting(REC / "h200" / "nvml_dump.json")
    clock = Clock()
    c = GpuCollector(b, clock=clock, slow_interval_s=10)
    for _ in range(3):
        c.collect()
        clock.t += 11  # every poll slow
    assert b.calls["nvmlDeviceGetFanSpeed"] == 1  # NotSupported once, never asked again
    assert b.calls["nvmlDeviceGetRetiredPages"] == 2  # sbe and dbe, once each
    assert b.calls["nvmlDeviceGetNvLinkState"] == 18  # links probed on the first poll only
    assert b.calls["nvmlDeviceGetPowerUsage"] == 3
    fast = [r for r in b.field_requests if 74 in r]
    slow = [r for r in b.field_requests if 169 in r]
    assert sorted(fast[0]) == [74, 82, 83, 186, 269, 270, 271]
    assert fast[1] == fast[0]  # all of these are supported on the H200
    assert len(fast) == len(slow) == 3  # every poll is slow here: one batch of each
    assert sorted(slow[0]) == sorted(SLOW_FIELD_IDS) and slow[2] == slow[0]
    assert b.calls["nvmlDeviceGetMarginTemperature"] == 3  # fast tier
    c.close()


def test_slow_tier_cadence():
    clock = Clock()
    c = GpuCollector(RecordedBackend(REC / "h200" / "nvml_dump.json"), clock=clock, slow_interval_s=60)
    first = gpu_rows(c.collect())[0].fields
    clock.t += 5
    second = gpu_rows(c.collect())[0].fields
    clock.t += 60
    third = gpu_rows(c.collect())[0].fields
    for f in (first, third):
        assert f["power_limit_watts"] == 700.0 and f["process_count"] == 0
    assert "power_limit_watts" not in second and "temperature_slowdown_celsius" not in second
    assert second["power_watts"] == first["power_watts"]  # fast set every poll
    c.close()


def test_sim_node_poll():
    c = GpuCollector(get_backend("sim", sim_node=TinyNode(t0=0.0)))
    t = 3600.0 + 100.0  # 100 s into the busy part of the cycle
    samples = c.collect(int(t * 1e9))
    rows = gpu_rows(samples)
    assert [s.tags["gpu"] for s in rows] == [str(i) for i in range(8)]
    f = rows[0].fields
    assert f["clock_event_sw_power_cap"] == 1 and 680 < f["power_watts"] < 700
    assert f["process_count"] == 1 and f["job_id"] == "4006"  # resolved through /proc environ
    links = [s for s in samples if s.measurement == "gpu_nvlink"]
    assert len(links) == 8 * 18 and {s.fields["up"] for s in links} == {1}
    assert links[0].tags["link"] == "0" and links[0].tags["gpu"] == "0"
    c.close()


def test_clock_event_reasons_decoded():
    class Node:
        def gpus(self, t):
            return [{"index": 0, "uuid": "GPU-0", "model": "M", "health": "up",
                     "clock_event_reasons": 0x4 | 0x8 | 0x40 | 0x80 | 0x100}]

    c = GpuCollector(get_backend("sim", sim_node=Node()))
    (s,) = c.collect(0)
    f = s.fields
    assert (f["clock_event_sw_power_cap"], f["clock_event_hw_slowdown"], f["clock_event_hw_thermal"],
            f["clock_event_hw_power_brake"]) == (1, 1, 1, 1)
    assert (f["clock_event_idle"], f["clock_event_sw_thermal"], f["clock_event_sync_boost"]) == (0, 0, 0)
    assert f["clock_event_reasons"] == 0x1CC
    c.close()


def test_lost_and_stale_gpus_do_not_stop_the_others():
    node = TinyNode(t0=0.0, lost=[3], stale=[5])
    clock = Clock()
    c = GpuCollector(SimBackend(node), clock=clock, retry_s=30)
    rows = gpu_rows(c.collect(int(4000e9)))
    by = {s.tags["gpu"]: s.fields for s in rows}
    assert by["3"] == {"up": 0, "health_code": 2}
    assert by["5"] == {"up": 0, "health_code": 1}
    for i in (0, 1, 2, 4, 6, 7):
        assert by[str(i)]["up"] == 1 and "power_watts" in by[str(i)]
    # the GPU comes back: reported down until its retry, then up again
    node.lost.clear()
    clock.t += 10
    assert {s.tags["gpu"]: s.fields for s in gpu_rows(c.collect(int(4010e9)))}["3"]["health_code"] == 2
    clock.t += 30
    back = {s.tags["gpu"]: s.fields for s in gpu_rows(c.collect(int(4040e9)))}["3"]
    assert back["up"] == 1 and back["health_code"] == 0 and "temperature_gpu_celsius" in back
    c.close()


class Hanging(SimBackend):
    """GPU 5's power read blocks until released: an NVML call that hangs on one GPU."""

    def __init__(self, node):
        super().__init__(node)
        self.release = threading.Event()

    def nvmlDeviceGetPowerUsage(self, handle):
        if handle.index == 5:
            self.release.wait(30)
        return self.answer("nvmlDeviceGetPowerUsage", handle)


def test_a_hanging_gpu_is_stale_and_does_not_delay_the_others():
    clock = Clock()
    b = Hanging(TinyNode(t0=0.0))
    c = GpuCollector(b, clock=clock, deadline_s=0.3, retry_s=5)
    try:
        t0 = time.monotonic()
        rows = gpu_rows(c.collect(int(4000e9)))
        assert time.monotonic() - t0 < 2.0
        by = {s.tags["gpu"]: s.fields for s in rows}
        assert by["5"] == {"up": 0, "health_code": 1}
        assert all(by[str(i)]["up"] == 1 for i in range(8) if i != 5)
        # still hung: the next poll does not wait for it at all
        t0 = time.monotonic()
        by = {s.tags["gpu"]: s.fields for s in gpu_rows(c.collect(int(4001e9)))}
        assert time.monotonic() - t0 < 0.25 and by["5"]["health_code"] == 1
        b.release.set()
        time.sleep(0.05)
        clock.t += 10
        by = {s.tags["gpu"]: s.fields for s in gpu_rows(c.collect(int(4010e9)))}
        assert by["5"]["up"] == 1 and "power_watts" in by["5"]
    finally:
        b.release.set()
        c.close()


def test_no_driver_is_one_clear_message():
    class NoDriver(SimBackend):
        pass

    b = NoDriver(TinyNode())
    b.init_error = pynvml.NVML_ERROR_DRIVER_NOT_LOADED
    clock = Clock()
    c = GpuCollector(b, clock=clock, retry_s=60)
    with pytest.raises(CollectorUnavailable, match="NVML is not available .*Driver Not Loaded") as exc:
        c.collect()
    assert "\n" not in str(exc.value)
    b.init_error = None
    clock.t += 10
    with pytest.raises(CollectorUnavailable):  # not retried before retry_s
        c.collect()
    clock.t += 60
    assert len(gpu_rows(c.collect())) == 8  # the driver came back
    c.close()


def test_real_nvml_fails_cleanly_or_polls():
    c = GpuCollector("nvml")
    try:
        pynvml.nvmlInit()
        pynvml.nvmlShutdown()
        has_driver = True
    except pynvml.NVMLError:
        has_driver = False
    if has_driver:  # on a GPU node: a real poll
        assert all(s.fields["up"] in (0, 1) for s in gpu_rows(c.collect()))
    else:
        with pytest.raises(CollectorUnavailable, match="no NVIDIA driver"):
            c.collect()
    c.close()


def test_field_values_read_in_bulk_agree_with_the_structures():
    from gpufleet.agent.collectors.gpu import field_values

    T = pynvml
    cases = [(T.NVML_VALUE_TYPE_DOUBLE, "dVal", -2.5e-3),
             (T.NVML_VALUE_TYPE_UNSIGNED_INT, "uiVal", 4_000_000_000),
             (T.NVML_VALUE_TYPE_UNSIGNED_LONG, "ulVal", 2**40 + 3),
             (T.NVML_VALUE_TYPE_UNSIGNED_LONG_LONG, "ullVal", 2**64 - 1),
             (T.NVML_VALUE_TYPE_SIGNED_LONG_LONG, "sllVal", -(2**62)),
             (T.NVML_VALUE_TYPE_SIGNED_INT, "siVal", -7),
             (T.NVML_VALUE_TYPE_UNSIGNED_SHORT, "usVal", 65535)]
    arr = (T.c_nvmlFieldValue_t * (len(cases) + 1))()
    for i, (vtype, member, value) in enumerate(cases):
        arr[i].fieldId, arr[i].scopeId, arr[i].valueType, arr[i].nvmlReturn = 100 + i, i, vtype, 0
        arr[i].value.ullVal = 0xFFFFFFFFFFFFFFFF  # garbage in the bytes a narrow member leaves alone
        setattr(arr[i].value, member, value)
    arr[len(cases)].fieldId, arr[len(cases)].nvmlReturn = 999, T.NVML_ERROR_NOT_SUPPORTED
    bulk = field_values(arr)
    assert bulk == field_values(list(arr))  # the per-attribute path
    assert bulk == [(100 + i, 0, v) for i, (_, _, v) in enumerate(cases)] + [(999, 3, None)]


class LinkNode(TinyNode):
    """Distinct NVLink counters per link, link 3 down."""

    def gpus(self, t):
        out = super().gpus(t)
        for s in out:
            for link, ls in enumerate(s["nvlink"]):
                ls.update(up=int(link != 3), crc_flit_errors_total=1000 * s["index"] + link,
                          crc_data_errors_total=link + 1, replay_errors_total=2 * link,
                          recovery_errors_total=link // 2, tx_data_bytes_total=1024 * (link + 1),
                          rx_data_bytes_total=2048 * (link + 1))
        return out


class CountingSim(SimBackend):
    def __init__(self, node, link_fields=True):
        super().__init__(node)
        self.calls: dict[str, int] = {}
        self.link_fields = link_fields

    def answer(self, func, handle, *args):
        self.calls[func] = self.calls.get(func, 0) + 1
        return super().answer(func, handle, *args)

    def nvmlDeviceGetFieldValues(self, handle, fieldIds):
        self.calls["fields"] = self.calls.get("fields", 0) + 1
        if not self.link_fields and any(isinstance(f, tuple) or f < 74 or 95 < f < 120 for f in fieldIds):
            raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_SUPPORTED)
        return super().nvmlDeviceGetFieldValues(handle, fieldIds)


def _links(samples):
    return {(s.tags["gpu"], s.tags["link"]): s.fields for s in samples if s.measurement == "gpu_nvlink"}


@pytest.mark.parametrize("link_fields", [True, False])
def test_nvlink_counters_batched_in_field_values_with_the_per_call_fallback(link_fields):
    b = CountingSim(LinkNode(n_gpus=2, t0=0.0), link_fields=link_fields)
    c = GpuCollector(b, clock=Clock(), slow_interval_s=1e9, nvlink_interval_s=0)
    first = _links(c.collect(int(4000e9)))  # probe: one call per link and counter
    b.calls.clear()
    second = _links(c.collect(int(4000e9)))
    want = {(str(g), str(link)): {"up": int(link != 3), "crc_flit_errors_total": 1000 * g + link,
                                  "crc_data_errors_total": link + 1, "replay_errors_total": 2 * link,
                                  "recovery_errors_total": link // 2,
                                  # scoped field values only: absent where the batch is refused
                                  **({"tx_data_bytes_total": 1024 * (link + 1),
                                      "rx_data_bytes_total": 2048 * (link + 1)} if link_fields else {})}
            for g in range(2) for link in range(18)}
    assert first == want and second == want
    if link_fields:  # links 0..11 in the batch; 12..17 have no per-link field ids
        assert b.calls.get("nvmlDeviceGetNvLinkState", 0) == 0
        assert b.calls["nvmlDeviceGetNvLinkErrorCounter"] == 2 * 6 * 4
        assert b.calls["fields"] == 2 * 2  # the GPU's own fields and the links', per GPU
    else:  # not supported: every link read one call each, and the batch is not asked again
        assert b.calls["nvmlDeviceGetNvLinkState"] == 2 * 18
        assert b.calls["nvmlDeviceGetNvLinkErrorCounter"] == 2 * 18 * 4
        b.calls.clear()
        assert _links(c.collect(int(4000e9))) == want
        assert b.calls["fields"] == 2  # the GPU's own fields only
    c.close()


def test_nvlink_rows_on_their_own_cadence():
    clock = Clock()
    c = GpuCollector(SimBackend(LinkNode(n_gpus=2, t0=0.0)), clock=clock,
                     **agent_config.collector_options(agent_config.validate({"gpu": {"nvlink_interval": 30}}),
                                                      "gpu"))
    assert c.nvlink_interval_s == 30.0
    seen = []
    for _ in range(7):  # polls 10 s apart: links on the first poll, then every 30 s
        samples = c.collect(int(4000e9 + clock.t * 1e9))
        seen.append(len(_links(samples)))
        assert len(gpu_rows(samples)) == 2  # the GPU rows every poll
        clock.t += 10
    c.close()
    assert seen == [36, 0, 0, 36, 0, 0, 36]


def test_a_counter_answered_as_a_double_is_absent_not_misread(monkeypatch, caplog):
    """nvidia-ml-py 12.575.51 and 13.580.65 number the clock-event reasons 251-253; the real H100
    (driver 580.159, recorded) answers 251 as a double (power smoothing enabled: 0.0) and the
    reasons at 269-271. An id whose answer's type contradicts the catalogue is left out."""
    from gpufleet.agent.collectors import gpu as gpumod

    sw = next(k for k, v in gpumod.FIELD_IDS.items() if v == "throttle_sw_thermal_ns_total")
    ids = {k: v for k, v in gpumod.FIELD_IDS.items() if k != sw}
    monkeypatch.setattr(gpumod, "FIELD_IDS", {**ids, 251: "throttle_sw_thermal_ns_total"})
    c = GpuCollector(RecordedBackend(REC / "h100" / "nvml_dump.json"), clock=Clock())
    with caplog.at_level("WARNING", logger="gpufleet.agent"):
        first = gpu_rows(c.collect())[0].fields
        second = gpu_rows(c.collect())[0].fields
    for f in (first, second):
        assert "throttle_sw_thermal_ns_total" not in f
        assert f["throttle_hw_thermal_ns_total"] == 0  # the neighbours, answered as counters, stay
    assert caplog.text.count("does not match this driver") == 1
    c.close()
