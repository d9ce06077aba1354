"""A real single-node Slurm for tests: munged + slurmctld + slurmd in a temp dir on free ports.

Debian's ``slurm-wlm`` (22.05) and ``munge``; see /work/shared/notes/real-servers.md. The
cluster has one node (this host's short name, address 127.0.0.1) in one default partition.
``Prolog``/``Epilog`` (and any other ``slurm.conf`` line) are configurable, so a test can run
its own hook scripts at job start/end. Clients (``srun``, ``sinfo``, ``scontrol``) must see
``SLURM_CONF``: use :meth:`Slurm.env` or :meth:`Slurm.run`.

Usage::

    with Slurm(tmp_path / "slurm", epilog=script) as slurm:
        slurm.run(["srun", "-N1", "true"])
        slurm.wait_for(lambda: marker.exists())

Daemons run in the foreground (``-D``) as our own children in their own session, and stop
with SIGTERM, then SIGKILL. Needs root (``SlurmUser=root``); tests skip where the binaries
are missing (``./run test`` installs them).
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import time
from pathlib import Path

BINARIES = ("munged", "slurmctld", "slurmd", "srun", "sinfo", "scontrol")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def available() -> bool:
    """True when munge and Slurm are installed and we may run them (root)."""
    return all(shutil.which(b) for b in BINARIES) and os.geteuid() == 0


def skip_unless_slurm():
    """As :func:`tests.servers.skip_unless` for munge + Slurm (installed, and root to run them)."""
    import pytest

    return pytest.mark.needs("slurm")


class Slurm:
    """munged + slurmctld + slurmd in ``tmp``; a context manager; ``stop()`` is idempotent.

    ``prolog``/``epilog``: paths of executable scripts (run as root by slurmd at job start/end,
    with ``SLURM_JOB_ID``, ``SLURMD_NODENAME``, ...). ``extra``: more ``slurm.conf`` lines
    (e.g. ``["PrologFlags=Alloc"]``). ``cpus``: the node's CPU count as Slurm sees it.
    ``more_nodes``: a hostlist of extra nodes in the partition (``gpu[001-005]``), at 127.0.0.1
    with no slurmd: they show as down, and ``scontrol update`` drains and resumes them.
    """

    def __init__(self, tmp: Path, *, prolog: str | os.PathLike | None = None,
                 epilog: str | os.PathLike | None = None, extra: list[str] | tuple = (),
                 cpus: int = 2, partition: str = "gpu", more_nodes: str | None = None):
        self.tmp = Path(tmp)
        self.tmp.mkdir(parents=True, exist_ok=True)
        self.node = socket.gethostname().split(".")[0]
        self.partition = partition
        self.ctld_port = free_port()
        self.slurmd_port = free_port()
        self.conf = self.tmp / "slurm.conf"
        self.munge_sock = self.tmp / "munge.sock"
        self.procs: dict[str, subprocess.Popen] = {}
        t = self.tmp
        lines = [
            "ClusterName=lab",
            f"SlurmctldHost={self.node}(127.0.0.1)",
            f"SlurmctldPort={self.ctld_port}",
            f"SlurmdPort={self.slurmd_port}",
            "AuthType=auth/munge",
            "CredType=cred/munge",
            f"AuthInfo=socket={self.munge_sock}",
            "ProctrackType=proctrack/linuxproc",
            "TaskPlugin=task/none",
            "JobAcctGatherType=jobacct_gather/none",
            "AccountingStorageType=accounting_storage/none",
            "JobCompType=jobcomp/none",
            "MpiDefault=none",
            "SlurmUser=root",
            "SlurmdUser=root",
            "ReturnToService=2",
            "SchedulerType=sched/backfill",
            "SelectType=select/cons_tres",
            f"SlurmctldPidFile={t}/slurmctld.pid",
            f"SlurmdPidFile={t}/slurmd.pid",
            f"SlurmdSpoolDir={t}/spool",
            f"StateSaveLocation={t}/state",
            f"SlurmctldLogFile={t}/slurmctld.log",
            f"SlurmdLogFile={t}/slurmd.log",
            "SlurmctldDebug=info",
            "SlurmdDebug=info",
            "InactiveLimit=0",
            "KillWait=5",
            "MinJobAge=300",
        ]
        if prolog:
            lines.append(f"Prolog={Path(prolog).resolve()}")
        if epilog:
            lines.append(f"Epilog={Path(epilog).resolve()}")
        lines += list(extra)
        lines.append(f"NodeName={self.node} NodeAddr=127.0.0.1 CPUs={cpus} RealMemory=1000 State=UNKNOWN")
        if more_nodes:
            lines.append(f"NodeName={more_nodes} NodeAddr=127.0.0.1 CPUs=2 RealMemory=1000 State=UNKNOWN")
        members = f"{self.node},{more_nodes}" if more_nodes else self.node
        lines.append(f"PartitionName={partition} Nodes={members} Default=YES MaxTime=INFINITE State=UP")
        (t / "spool").mkdir(exist_ok=True)
        (t / "state").mkdir(exist_ok=True)
        self.conf.write_text("\n".join(lines) + "\n")

    # -- environment for clients -------------------------------------------------------------
    def env(self, base: dict | None = None) -> dict:
        env = dict(os.environ if base is None else base)
        env["SLURM_CONF"] = str(self.conf)
        return env

    def run(self, argv: list[str], timeout: float = 60, check: bool = True,
            env: dict | None = None) -> subprocess.CompletedProcess:
        """Run a Slurm client (``srun``, ``sinfo``, ``scontrol``, ...) against this cluster."""
        return subprocess.run(argv, env=self.env(env), capture_output=True, text=True,
                              timeout=timeout, check=check, stdin=subprocess.DEVNULL)

    def node_state(self) -> str:
        r = self.run(["sinfo", "-h", "-N", "-n", self.node, "-o", "%T"], check=False, timeout=10)
        return r.stdout.strip().lower() if r.returncode == 0 else ""

    def wait_for(self, cond, timeout: float = 30.0, every: float = 0.1) -> bool:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if cond():
                return True
            time.sleep(every)
        return bool(cond())

    def logs(self) -> str:
        out = []
        for name in ("munge.log", "slurmctld.log", "slurmd.log"):
            p = self.tmp / name
            if p.exists():
                out.append(f"--- {name}\n" + p.read_text(errors="replace")[-3000:])
        return "\n".join(out)

    # -- lifecycle --------------------------------------------------------------------------
    def _spawn(self, name: str, argv: list[str]) -> subprocess.Popen:
        logf = open(self.tmp / f"{name}.out", "ab")
        p = subprocess.Popen(argv, stdout=logf, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                             env=self.env(), start_new_session=True)
        logf.close()
        self.procs[name] = p
        return p

    def start(self, timeout: float = 30.0) -> Slurm:
        t = self.tmp
        key = t / "munge.key"
        if not key.exists():
            key.write_bytes(os.urandom(1024))
            key.chmod(0o400)
        # munged daemonizes unless -F; run it in the foreground so we own its pid
        self._spawn("munged", ["munged", "-F", "--force", f"--key-file={key}", f"--socket={self.munge_sock}",
                               f"--pid-file={t}/munge.pid", f"--log-file={t}/munge.log",
                               f"--seed-file={t}/munge.seed"])
        try:
            if not self.wait_for(self.munge_sock.exists, timeout=10):
                raise RuntimeError("munged did not create its socket")
            self._spawn("slurmctld", ["slurmctld", "-D", "-i", "-f", str(self.conf)])
            self._spawn("slurmd", ["slurmd", "-D", "-f", str(self.conf), "-N", self.node])
            if not self.wait_for(lambda: self._dead() is None and self.node_state() in ("idle", "idle~"),
                                 timeout=timeout, every=0.25):
                dead = self._dead()
                raise RuntimeError(f"slurm node not idle after {timeout}s"
                                   f"{f' ({dead} exited)' if dead else ''}: {self.logs()}")
        except BaseException:
            self.stop()
            raise
        return self

    def _dead(self) -> str | None:
        for name, p in self.procs.items():
            if p.poll() is not None:
                return name
        return None

    def stop(self) -> None:
        for name in ("slurmd", "slurmctld", "munged"):
            p = self.procs.pop(name, None)
            if p is None or p.poll() is not None:
                continue
            p.send_signal(signal.SIGTERM)
            try:
                p.wait(10)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait(5)

    def __enter__(self) -> Slurm:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()
