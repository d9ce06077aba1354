"""NVML backends: spec parsing, recorded replay (real H200 dumps, nvidia-smi XML), the simulator."""

from __future__ import annotations

import pynvml
import pytest
from gpufleet.agent.backends import get_backend
from gpufleet.agent.backends.recorded import RecordedBackend
from gpufleet.agent.backends.sim import SimBackend, TinyNode

from gpufleet.errors import GpufleetError
from tests.conftest import FIXTURES

REC = FIXTURES / "recordings"
H200 = REC / "h200" / "nvml_dump.json"
BUSY = REC / "h200" / "nvml_dump_busy.json"
XML = REC / "nvidia-smi-xml"


def test_specs():
    assert get_backend("sim").name == "sim"
    assert get_backend(f"recorded:{H200}").name == "recorded"
    assert get_backend("nvml").name == "nvml"  # nvidia-ml-py imports without a driver


@pytest.mark.parametrize("spec, words", [
    ("", "empty backend"),
    ("cuda", "unknown backend 'cuda'"),
    ("recorded:", "needs a path"),
    ("recorded:/no/such/file.json", "no such file"),
])
def test_bad_specs(spec, words):
    with pytest.raises(GpufleetError, match=words):
        get_backend(spec)


@pytest.mark.parametrize("content, words", [
    (b'{"calls": {"nvmlDeviceGetName": ', "garbled JSON"),
    (b'{"something": 1}', "no 'calls' section"),
    (b"<nvidia_smi_log><gpu><uuid>x</uuid>", "garbled XML"),
    (b"<html></html>", "not an nvidia-smi"),
    (b"<nvidia_smi_log></nvidia_smi_log>", "holds no GPU"),
    (b"GPU 0: NVIDIA H200", "neither an NVML dump"),
    (b'{"calls": {"nvmlDeviceGetName": 5}}', "malformed entry"),
])
def test_garbled_recordings(tmp_path, content, words):
    p = tmp_path / "rec"
    p.write_bytes(content)
    with pytest.raises(GpufleetError, match=words):
        get_backend(f"recorded:{p}")


def test_h200_dump_answers_what_it_recorded():
    b = RecordedBackend(H200)
    b.nvmlInit()
    assert b.nvmlDeviceGetCount() == 1
    h = b.nvmlDeviceGetHandleByIndex(0)
    assert b.nvmlDeviceGetName(h) == "NVIDIA H200"
    assert b.nvmlDeviceGetPowerUsage(h) == 79306  # mW, as NVML gives it
    assert b.nvmlDeviceGetEnforcedPowerLimit(h) == 700000
    assert b.nvmlDeviceGetTemperature(h, pynvml.NVML_TEMPERATURE_GPU) == 38
    assert b.nvmlDeviceGetClockInfo(h, pynvml.NVML_CLOCK_MEM) == 3201
    assert b.nvmlDeviceGetTemperatureThreshold(h, pynvml.NVML_TEMPERATURE_THRESHOLD_SLOWDOWN) == 89
    u = b.nvmlDeviceGetUtilizationRates(h)
    assert isinstance(u, pynvml.c_nvmlUtilization_t) and (u.gpu, u.memory) == (0, 0)
    # what the GPU refused is refused again, as the real pynvml error with its value
    with pytest.raises(pynvml.NVMLError_NotSupported) as exc:
        b.nvmlDeviceGetFanSpeed(h)
    assert exc.value.value == pynvml.NVML_ERROR_NOT_SUPPORTED
    with pytest.raises(pynvml.NVMLError_NotSupported):
        b.nvmlDeviceGetNvLinkState(h, 0)
    with pytest.raises(pynvml.NVMLError_FunctionNotFound):
        b.nvmlDeviceGetBBXTimeData_v1(h)
    # a call the dump did not record at all: NotSupported too
    with pytest.raises(pynvml.NVMLError_NotSupported):
        b.nvmlDeviceGetMemoryInfo(h)
    with pytest.raises(pynvml.NVMLError_InvalidArgument):
        b.nvmlDeviceGetHandleByIndex(1)


def test_field_values_are_real_structures():
    b = RecordedBackend(H200)
    h = b.nvmlDeviceGetHandleByIndex(0)
    vals = b.nvmlDeviceGetFieldValues(h, [82, 186, 74, 170])
    assert isinstance(vals[0], pynvml.c_nvmlFieldValue_t)
    assert (vals[0].fieldId, vals[0].nvmlReturn, vals[0].value.uiVal) == (82, 0, 38)
    assert vals[1].value.uiVal == 83556  # instant power, mW
    assert vals[2].nvmlReturn == 0 and vals[2].value.ullVal == 0
    assert vals[3].nvmlReturn == pynvml.NVML_ERROR_NOT_SUPPORTED  # C2C link count on this VM


def test_busy_dump_args_and_processes():
    b = RecordedBackend(BUSY)
    h = b.nvmlDeviceGetHandleByIndex(0)
    assert b.nvmlDeviceGetCurrentClocksEventReasons(h) == 0x4  # SW power cap under GEMM
    assert b.nvmlDeviceGetTemperature(h, 0) == 60
    assert b.nvmlDeviceGetClockInfo(h, pynvml.NVML_CLOCK_SM) == 1560
    assert b.nvmlDeviceGetFieldValues(h, [74])[0].value.ullVal == 11968576224
    procs = b.nvmlDeviceGetComputeRunningProcesses(h)
    assert [p.pid for p in procs] == [415]
    with open(f"{b.proc_root}/415/environ", "rb") as f:
        environ = f.read()
    assert b"SLURM_JOB_ID=4242" in environ


def test_xml_conversions_to_nvml_units():
    b = RecordedBackend(XML / "a100-sxm4-v12.xml")
    h = b.nvmlDeviceGetHandleByIndex(0)
    assert b.nvmlDeviceGetPowerUsage(h) == 67030
    assert b.nvmlDeviceGetEnforcedPowerLimit(h) == 500000
    assert b.nvmlDeviceGetMemoryInfo(h).total == 81920 * 2**20
    assert b.nvmlDeviceGetMigMode(h) == [1, 1]
    assert b.nvmlDeviceGetMaxMigDeviceCount(h) == 4
    with pytest.raises(pynvml.NVMLError_NotSupported):  # remapped_rows: N/A in MIG mode
        b.nvmlDeviceGetRemappedRows(h)
    with pytest.raises(pynvml.NVMLError_NotSupported):  # utilization N/A
        b.nvmlDeviceGetUtilizationRates(h)
    b = RecordedBackend(XML / "rtx-4000-sff-ada-v13.xml")
    h = b.nvmlDeviceGetHandleByIndex(0)
    assert b.nvmlDeviceGetFieldValues(h, [74])[0].value.ullVal == 4251825415 * 1000  # µs -> ns
    assert b.nvmlDeviceGetRemappedRows(h) == (0, 0, 0, 0)
    assert b.nvmlDeviceGetFanSpeed(h) == 30
    assert b.nvmlDeviceGetPerformanceState(h) == 8
    assert b.nvmlDeviceGetCurrentClocksEventReasons(h) == 0x1
    assert len(b.nvmlDeviceGetComputeRunningProcesses(h)) == 2  # C and C+G, not G


def test_xml_file_with_several_gpus(tmp_path):
    """Two real recordings combined into one log, as nvidia-smi writes it for a multi-GPU node."""
    import xml.etree.ElementTree as ET

    a = ET.parse(XML / "tesla-t4.xml").getroot()
    b = ET.parse(XML / "a10g.xml").getroot()
    for g in b.findall("gpu"):
        a.append(g)
    p = tmp_path / "two.xml"
    ET.ElementTree(a).write(p)
    be = RecordedBackend(p)
    assert be.nvmlDeviceGetCount() == 2
    names = [be.nvmlDeviceGetName(be.nvmlDeviceGetHandleByIndex(i)) for i in range(2)]
    assert names == ["Tesla T4", "NVIDIA A10G"]


def test_sim_converts_state_to_nvml_units():
    node = TinyNode(t0=1_000_000.0)
    b = SimBackend(node)
    t = 1_000_000.0 + 3600.0
    b.begin_poll(int(t * 1e9))
    state = node.gpus(t)[2]
    h = b.nvmlDeviceGetHandleByIndex(2)
    assert b.nvmlDeviceGetCount() == 8
    assert b.nvmlDeviceGetPowerUsage(h) == round(state["power_watts"] * 1000)
    assert b.nvmlDeviceGetUtilizationRates(h).gpu == round(state["utilization_gpu_ratio"] * 100)
    assert b.nvmlDeviceGetFieldValues(h, [83])[0].value.ullVal == round(state["energy_joules_total"] * 1000)
    assert b.nvmlDeviceGetNvLinkState(h, 17) == 1
    with pytest.raises(pynvml.NVMLError_NotSupported):
        b.nvmlDeviceGetFanSpeed(h)  # SXM boards have no fan of their own


def test_sim_health_raises_real_errors():
    b = SimBackend(TinyNode(lost=[1], stale=[2]))
    b.begin_poll()
    with pytest.raises(pynvml.NVMLError_GpuIsLost):
        b.nvmlDeviceGetTemperature(b.nvmlDeviceGetHandleByIndex(1), 0)
    with pytest.raises(pynvml.NVMLError_Unknown):
        b.nvmlDeviceGetPowerUsage(b.nvmlDeviceGetHandleByIndex(2))


def test_sim_accepts_any_source_and_rejects_others():
    class OneGpu:
        def gpus(self, t):
            return [{"index": 0, "uuid": "GPU-x", "model": "M", "health": "up", "power_watts": 12.5}]

    b = get_backend("sim", sim_node=OneGpu())
    b.begin_poll(0)
    assert b.nvmlDeviceGetPowerUsage(b.nvmlDeviceGetHandleByIndex(0)) == 12500
    with pytest.raises(GpufleetError, match="no gpus"):
        get_backend("sim", sim_node=object())


def test_sim_source_with_numpy_values_and_nan():
    """A source backed by numpy arrays (as the full simulator is): exact integers, NaN = absent."""
    import numpy as np

    class NumpyNode:
        def gpus(self, t):
            return [{"index": np.int64(0), "uuid": "GPU-n", "model": "M", "health": "up",
                     "power_watts": np.float64(512.25), "fan_speed_ratio": np.float64("nan"),
                     "throttle_sw_power_cap_ns_total": np.int64(2**60 + 1),
                     "nvlink": [{"up": np.int64(1), "crc_flit_errors_total": np.int64(3)}]}]

    b = get_backend("sim", sim_node=NumpyNode())
    b.begin_poll(0)
    h = b.nvmlDeviceGetHandleByIndex(0)
    assert b.nvmlDeviceGetPowerUsage(h) == 512250
    assert b.nvmlDeviceGetFieldValues(h, [74])[0].value.ullVal == 2**60 + 1
    assert b.nvmlDeviceGetNvLinkErrorCounter(h, 0, pynvml.NVML_NVLINK_ERROR_DL_CRC_FLIT) == 3
    with pytest.raises(pynvml.NVMLError_NotSupported):
        b.nvmlDeviceGetFanSpeed(h)
