"""The Slurm hook against a real single-node Slurm (tests/slurm.py): a job runs with ``srun``,
the shipped Epilog (packaging/slurm/epilog.sh) runs ``gpufleet canary`` (the CPU engine here: no
GPU), the result goes through the drop directory into a running agent's output."""

from __future__ import annotations

import shutil
import sys
import time
from pathlib import Path

from tests.agent_support import start_agent, stop_agent
from tests.conftest import ROOT
from tests.slurm import Slurm, skip_unless_slurm

HOOKS = ROOT / "packaging" / "slurm"


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
    ran = tmp_path / "hooks.ran"
    wrappers = {}
    for hook in ("prolog", "epilog"):
        # slurmd runs Prolog/Epilog with a bare environment: the wrapper names the settings, then
        # runs the shipped hook unchanged
        w = wrappers[hook] = tmp_path / hook
        w.write_text(
            "#!/bin/sh\n"
            f"export GPUFLEET={gpufleet_command()} GPUFLEET_CANARY_DROP={drop}\n"
            f"export GPUFLEET_CANARY_STATE={state}\n"
            "export GPUFLEET_CANARY_ENGINE=numpy GPUFLEET_CANARY_TIMEOUT=60\n"
            f"{HOOKS / (hook + '.sh')}\nrc=$?\necho \"{hook} $SLURM_JOB_ID $rc\" >> {ran}\nexit $rc\n")
        w.chmod(0o755)
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
        with Slurm(tmp_path / "slurm", prolog=wrappers["prolog"], epilog=wrappers["epilog"]) as slurm:
            r = slurm.run(["srun", "-N1", "-n1", "sh", "-c", "echo job $SLURM_JOB_ID"], timeout=60)
            job = r.stdout.split()[-1]
            assert slurm.wait_for(lambda: ran.exists() and len(ran.read_text().splitlines()) == 2,
                                  timeout=60), slurm.logs()
            assert ran.read_text().splitlines() == [f"prolog {job} 0", f"epilog {job} 0"]
            # the results reach the agent's output: two more gpu_canary rows, the drop dir emptied
            assert slurm.wait_for(lambda: len(canary_lines(out)) >= 3, timeout=30), (
                canary_lines(out), list(drop.iterdir()), (tmp_path / "agent.log").read_text()[-3000:])
        lines = canary_lines(out)
        assert len(lines) == 3 and all("passed=1i" in ln and "checks=1i" in ln for ln in lines)
        assert all("host=slurmnode" in ln and "gpu=cpu" in ln for ln in lines)
        assert list(drop.iterdir()) == []
        # the prolog's and the epilog's checks, after the agent's own
        t = sorted(int(ln.rsplit(" ", 1)[1]) for ln in lines)
        assert t[0] < t[1] < t[2]
        status = [ln for p in sorted(out.glob("*.lp")) for ln in p.read_text().splitlines()
                  if ln.startswith("gpufleet_canary,") and "drop_files_total" in ln]
        assert status  # the node row counts the dropped files
    finally:
        assert stop_agent(agent) == 0
