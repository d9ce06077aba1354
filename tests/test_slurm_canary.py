"""The Slurm hook against a real single-node Slurm (tests/slurm.py): a job runs with ``srun``,
the shipped Epilog (packaging/slurm/epilog.sh) runs ``gpufleet canary`` (the CPU engine here: no
GPU), the result goes through the drop directory into a running agent's output."""

from __future__ import annotations

import shutil
import sys
import time
from pathlib import Path

from tests.conftest import ROOT
from tests.slurm import Slurm, skip_unless_slurm
from tests.test_agent_support import start_agent, stop_agent

EPILOG = ROOT / "packaging" / "slurm" / "epilog.sh"


def gpufleet_command() -> str:
    exe = Path(sys.executable).parent / "gpufleet"
    return str(exe) if exe.exists() else shutil.which("gpufleet") or str(exe)


def canary_lines(out: Path) -> list[str]:
    return [ln for p in sorted(out.glob("*.lp")) for ln in p.read_text().splitlines()
            if ln.startswith("gpu_canary,")]


@skip_unless_slurm()
def test_epilog_delivers_a_canary_result_through_a_real_slurm_job(tmp_path):
    drop, state, out = tmp_path / "drop", tmp_path / "state", tmp_path / "out"
    drop.mkdir()
    ran = tmp_path / "epilog.ran"
    wrapper = tmp_path / "epilog"
    # slurmd runs the Epilog with a bare environment: the wrapper names the settings, then runs
    # the shipped hook unchanged
    wrapper.write_text(
        "#!/bin/sh\n"
        f"export GPUFLEET={gpufleet_command()} GPUFLEET_CANARY_DROP={drop} GPUFLEET_CANARY_STATE={state}\n"
        "export GPUFLEET_CANARY_ENGINE=numpy GPUFLEET_CANARY_TIMEOUT=60\n"
        f"{EPILOG}\nrc=$?\necho \"$SLURM_JOB_ID $rc\" >> {ran}\nexit $rc\n")
    wrapper.chmod(0o755)
    conf = tmp_path / "agent.toml"
    conf.write_text(
        '[agent]\ninterval = "1s"\ncollectors = ["canary"]\nexporters = ["file"]\nhost = "slurmnode"\n'
        f'[file]\ndir = "{out}"\ncompress = false\n'
        f'[canary]\nengine = "numpy"\ninterval = "24h"\ndrop_dir = "{drop}"\nstate_dir = "{state}"\n')
    agent = start_agent(tmp_path, "--config", str(conf))
    try:
        deadline = time.monotonic() + 60
        while len(canary_lines(out)) < 1 and time.monotonic() < deadline:  # the agent's own first check
            assert agent.poll() is None, (tmp_path / "agent.log").read_text()
            time.sleep(0.2)
        assert len(canary_lines(out)) == 1
        with Slurm(tmp_path / "slurm", epilog=wrapper) as slurm:
            r = slurm.run(["srun", "-N1", "-n1", "sh", "-c", "echo job $SLURM_JOB_ID"], timeout=60)
            job = r.stdout.split()[-1]
            assert slurm.wait_for(lambda: ran.exists(), timeout=60), slurm.logs()
            assert ran.read_text().split() == [job, "0"]
            # the result reaches the agent's output: a second gpu_canary row, the drop dir emptied
            assert slurm.wait_for(lambda: len(canary_lines(out)) >= 2, timeout=30)
        lines = canary_lines(out)
        assert len(lines) == 2 and all("passed=1i" in ln and "checks=1i" in ln for ln in lines)
        assert "host=slurmnode" in lines[1] and "gpu=cpu" in lines[1]
        assert list(drop.iterdir()) == []
        # its time is the epilog's check, after the agent's own
        t = [int(ln.rsplit(" ", 1)[1]) for ln in lines]
        assert t[1] > t[0]
        status = [ln for p in sorted(out.glob("*.lp")) for ln in p.read_text().splitlines()
                  if ln.startswith("gpufleet_canary,") and "drop_files_total" in ln]
        assert status  # the node row counts the dropped files
    finally:
        assert stop_agent(agent) == 0
