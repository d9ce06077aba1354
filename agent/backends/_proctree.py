"""A small ``/proc``-shaped tree (``<pid>/environ``, ``<pid>/cgroup``) for recorded and simulated
GPU processes, so that job attribution (:func:`gpufleet.agent.jobs.resolve_job`) runs unchanged on them."""

from __future__ import annotations

import shutil
import tempfile
import weakref
from pathlib import Path


class ProcTree:
    def __init__(self):
        self._root: Path | None = None
        self._written: dict[int, tuple] = {}

    @property
    def root(self) -> str:
        if self._root is None:
            self._root = Path(tempfile.mkdtemp(prefix="gpufleet-proc-"))
            weakref.finalize(self, shutil.rmtree, self._root, True)
        return str(self._root)

    def set(self, pid: int, environ: dict[str, str] | None = None, cgroup: str | None = None) -> None:
        """Write one process's environment and cgroup text (only when they changed)."""
        key = (tuple(sorted((environ or {}).items())), cgroup)
        if self._written.get(pid) == key:
            return
        d = Path(self.root) / str(pid)
        d.mkdir(exist_ok=True)
        env = b"".join(f"{k}={v}".encode() + b"\0" for k, v in (environ or {}).items())
        (d / "environ").write_bytes(env)
        (d / "cgroup").write_text(cgroup or "0::/\n")
        self._written[pid] = key
