"""``gpufleet agent once``: one poll printed as a table, JSON or line protocol; bad input -> exit 2."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from gpufleet.cli import main
from gpufleet.lineprotocol import parse_line
from tests.conftest import FIXTURES, ROOT

REC = FIXTURES / "recordings"
RECORDINGS = sorted(REC.rglob("*.json")) + sorted(REC.rglob("*.xml"))


def run(capsys, *args):
    rc = main(["agent", "once", *args])
    out, err = capsys.readouterr()
    return rc, out, err


@pytest.mark.parametrize("path", RECORDINGS, ids=lambda p: p.name)
def test_json_for_every_recording(capsys, path):
    rc, out, err = run(capsys, "--backend", f"recorded:{path}", "--format", "json", "--host", "node-a")
    assert rc == 0, err
    samples = json.loads(out)
    gpus = [s for s in samples if s["measurement"] == "gpu"]
    assert len(gpus) >= 1
    assert gpus[0]["tags"]["host"] == "node-a" and gpus[0]["fields"]["up"] == 1
    assert {s["measurement"] for s in samples} >= {"gpu", "host", "gpufleet_collector"}
    self_rows = {s["tags"]["collector"]: s["fields"]["success"] for s in samples
                 if s["measurement"] == "gpufleet_collector"}
    assert self_rows == {"gpu": 1, "host": 1}


def test_line_protocol_parses_back(capsys):
    rc, out, _ = run(capsys, "--backend", f"recorded:{REC / 'h200' / 'nvml_dump.json'}", "--format", "lp",
                     "--host", "node-a")
    assert rc == 0
    points = [parse_line(line) for line in out.splitlines()]
    (gpu,) = [p for p in points if p.measurement == "gpu"]
    assert gpu.tags == {"host": "node-a", "gpu": "0", "uuid": "GPU-5e1f0a2c-7d31-4b58-9c2e-0000000a0200",
                        "model": "NVIDIA H200"}
    assert gpu.fields["temperature_gpu_celsius"] == 38 and gpu.fields["power_limit_watts"] == 700.0


def test_table_for_the_sim_node(capsys):
    rc, out, _ = run(capsys, "--backend", "sim")
    assert rc == 0
    assert "# gpu\n" in out and "# gpu_nvlink" in out and "# host" in out
    header = next(line for line in out.splitlines() if line.startswith("field "))
    assert header.split()[2:] == [f"gpu={i}" for i in range(8)]
    assert any(line.startswith("temperature_gpu_celsius ") and " Cel " in line for line in out.splitlines())


def test_no_driver_prints_the_host_and_exits_1_unless_allowed(capsys):
    import pynvml

    try:
        pynvml.nvmlInit()
        pynvml.nvmlShutdown()
        pytest.skip("this machine has an NVIDIA driver")  # only where a GPU is present
    except pynvml.NVMLError:
        pass
    # "proves NVML access": without it the poll is still printed, then one line and exit 1
    rc, out, err = run(capsys, "--backend", "nvml", "--format", "json")
    assert rc == 1
    assert err.count("\n") == 1 and err.startswith("gpufleet: error: no GPU read: NVML is not available")
    assert "--allow-no-gpu" in err
    samples = json.loads(out)
    assert [s for s in samples if s["measurement"] == "host"]
    assert {s["tags"]["collector"]: s["fields"]["success"] for s in samples
            if s["measurement"] == "gpufleet_collector"} == {"gpu": 0, "host": 1}
    # the exception, asked for: the same poll, a warning, exit 0
    rc, out2, err = run(capsys, "--backend", "nvml", "--format", "json", "--allow-no-gpu")
    assert rc == 0
    assert err.count("\n") == 1 and err.startswith("gpufleet: warning: gpu: NVML is not available")
    assert {s["measurement"] for s in json.loads(out2)} == {s["measurement"] for s in samples}


@pytest.mark.parametrize("args, words", [
    (["--backend", "cuda"], "unknown backend 'cuda'"),
    (["--backend", "recorded:/no/such.json"], "no such file"),
    (["--backend", "sim", "--format", "csv"], "unknown format 'csv'"),
])
def test_bad_input_is_one_line_and_exit_2(capsys, args, words):
    rc, out, err = run(capsys, *args)
    assert rc == 2 and out == ""
    assert err.startswith("gpufleet: error:") and words in err and err.count("\n") == 1


def test_garbled_recording(capsys, tmp_path):
    p = tmp_path / "dump.json"
    p.write_text('{"calls": {')
    rc, _, err = run(capsys, "--backend", f"recorded:{p}")
    assert rc == 2 and "garbled JSON" in err and err.count("\n") == 1


def test_run_without_the_daemon_module(capsys, monkeypatch):
    monkeypatch.setitem(sys.modules, "gpufleet.agent.daemon", None)  # the module cannot be imported
    rc = main(["agent", "run", "--config", "x.toml"])
    _, err = capsys.readouterr()
    assert rc == 2 and err.startswith("gpufleet: error: 'gpufleet agent run' is not available")
    assert err.count("\n") == 1


def test_console_script_exit_code():
    p = subprocess.run([sys.executable, "-m", "gpufleet", "agent", "once", "--backend", "bogus"],
                       capture_output=True, text=True, cwd=ROOT, timeout=60)
    assert p.returncode == 2
    assert p.stderr.strip().splitlines() == [
        "gpufleet: error: unknown backend 'bogus'; expected nvml | sim | recorded:PATH"]
