"""Which job or pod uses a GPU, from the GPU's processes and ``/proc``.

NVML lists the compute processes on each GPU (``nvmlDeviceGetComputeRunningProcesses``); this
module maps their PIDs to the scheduler's unit of work:

- **Slurm**: ``SLURM_JOB_ID`` (or the older ``SLURM_JOBID``) in ``/proc/<pid>/environ``; when the
  environment is unreadable (another user's process and an unprivileged agent), the ``job_<id>``
  component of the cgroup path (cgroup v1 ``/slurm/uid_<u>/job_<id>/step_<s>`` and v2
  ``/system.slice/slurmstepd.scope/job_<id>/step_<s>``), which ``/proc/<pid>/cgroup`` shows to anyone.
- **Kubernetes**: the pod UID from the cgroup path, in both cgroup-driver spellings:
  cgroupfs ``/kubepods/burstable/pod<uid>/<container>`` and systemd
  ``/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod<uid_with_underscores>.slice/...``.
  The namespace is taken where it can be derived: ``POD_NAMESPACE`` in the environment (downward
  API) or the service-account namespace file seen through ``/proc/<pid>/root``.

The job id is high-cardinality: the GPU collector writes it as the ``job_id`` *field*, never as a
tag. ``JobInfo.tags(keys)`` gives only the low-cardinality labels an operator asked for
(scheduler, namespace, partition, user).

PIDs are host PIDs: an agent in a container needs the host PID namespace (``hostPID: true``) and
the host's ``/proc`` (``proc_root``) for this to find anything.
"""

from __future__ import annotations

import os
import re
from collections import Counter
from dataclasses import dataclass

from gpufleet.errors import ConfigError

# Labels an operator may turn into tags: each has a handful of values per fleet.
TAG_KEYS = ("scheduler", "namespace", "partition", "user")

_SLURM_CG = re.compile(r"/job_(\d+)(?:/|$)")
_SLURM_STEP_CG = re.compile(r"/job_\d+/step_([A-Za-z0-9_]+)")
_K8S_CG = re.compile(
    r"kubepods.*?[/-]pod([0-9a-fA-F]{8}[-_][0-9a-fA-F]{4}[-_][0-9a-fA-F]{4}[-_][0-9a-fA-F]{4}[-_][0-9a-fA-F]{12})"
)
_K8S_QOS = re.compile(r"kubepods[-/.](?:slice/kubepods-)?(burstable|besteffort)")
_SA_NAMESPACE = "var/run/secrets/kubernetes.io/serviceaccount/namespace"


@dataclass(frozen=True, slots=True)
class JobInfo:
    """The unit of work behind a process. ``job_id`` is the Slurm job id or the pod UID."""

    scheduler: str  # "slurm" | "kubernetes"
    job_id: str
    namespace: str | None = None
    partition: str | None = None
    user: str | None = None
    step: str | None = None
    qos: str | None = None

    def tags(self, keys) -> dict[str, str]:
        """The low-cardinality labels named in ``keys`` (a subset of TAG_KEYS), where known."""
        bad = [k for k in keys if k not in TAG_KEYS]
        if bad:
            raise ConfigError(f"job tag {bad[0]!r} is not one of {', '.join(TAG_KEYS)}")
        out = {}
        for k in keys:
            v = getattr(self, k)
            if v:
                out[f"job_{k}" if k != "scheduler" else "scheduler"] = v
        return out


def check_tag_keys(keys) -> tuple[str, ...]:
    """Validate an operator's ``job_tags`` option (list of TAG_KEYS) and return it as a tuple."""
    if keys is None:
        return ()
    if isinstance(keys, str):
        keys = [k.strip() for k in keys.split(",") if k.strip()]
    keys = tuple(keys)
    for k in keys:
        if k not in TAG_KEYS:
            raise ConfigError(f"job tag {k!r} is not one of {', '.join(TAG_KEYS)}")
    return keys


def _read(path: str) -> bytes | None:
    try:
        with open(path, "rb") as f:
            return f.read(1 << 20)
    except OSError:  # gone, permission denied, not a process
        return None


def read_environ(pid: int, proc_root: str = "/proc") -> dict[str, str] | None:
    """The process's environment at exec time, or None when unreadable."""
    raw = _read(os.path.join(proc_root, str(pid), "environ"))
    if raw is None:
        return None
    env = {}
    for item in raw.split(b"\0"):
        k, sep, v = item.partition(b"=")
        if sep and k:
            env[k.decode("utf-8", "replace")] = v.decode("utf-8", "replace")
    return env


def parse_cgroup(text: str) -> JobInfo | None:
    """The job named by a ``/proc/<pid>/cgroup`` text (v1 or v2 lines), or None."""
    paths = []
    for line in text.splitlines():
        parts = line.split(":", 2)
        if len(parts) == 3:
            paths.append(parts[2])
    for p in paths:
        m = _K8S_CG.search(p)
        if m:
            q = _K8S_QOS.search(p)
            return JobInfo("kubernetes", m.group(1).replace("_", "-").lower(),
                           qos=q.group(1) if q else "guaranteed")
    for p in paths:
        m = _SLURM_CG.search(p)
        if m:
            s = _SLURM_STEP_CG.search(p)
            u = re.search(r"/uid_(\d+)/", p)
            return JobInfo("slurm", m.group(1), step=s.group(1) if s else None,
                           user=u.group(1) if u else None)
    return None


def job_info_pid(pid: int, proc_root: str = "/proc") -> JobInfo | None:
    """The job of one process: environment first (Slurm, downward API), then its cgroup."""
    env = read_environ(pid, proc_root)
    cg_raw = _read(os.path.join(proc_root, str(pid), "cgroup"))
    cg = parse_cgroup(cg_raw.decode("utf-8", "replace")) if cg_raw else None
    if env:
        jid = env.get("SLURM_JOB_ID") or env.get("SLURM_JOBID")
        if jid and jid.strip().isdigit():
            return JobInfo("slurm", jid.strip(),
                           partition=env.get("SLURM_JOB_PARTITION") or None,
                           user=env.get("SLURM_JOB_USER") or (cg.user if cg else None),
                           step=env.get("SLURM_STEP_ID") or (cg.step if cg else None))
    if cg is None:
        return None
    if cg.scheduler == "kubernetes":
        ns = (env or {}).get("POD_NAMESPACE")
        if not ns:
            raw = _read(os.path.join(proc_root, str(pid), "root", _SA_NAMESPACE))
            ns = raw.decode("utf-8", "replace").strip() if raw else None
        if ns:
            return JobInfo("kubernetes", cg.job_id, namespace=ns, qos=cg.qos)
    return cg


def job_info(pids, proc_root: str = "/proc") -> JobInfo | None:
    """The job using a GPU, from its process ids: the one most of its processes belong to.

    Ties go to the job of the lowest PID (the launcher usually starts first). None when no
    process belongs to a recognised job (or the processes are gone).
    """
    infos = [(pid, i) for pid in sorted(set(int(p) for p in pids))
             if (i := job_info_pid(pid, proc_root)) is not None]
    if not infos:
        return None
    counts = Counter((i.scheduler, i.job_id) for _, i in infos)
    best = max(counts.values())
    for _, i in infos:
        if counts[(i.scheduler, i.job_id)] == best:
            return i
    return None  # unreachable


def resolve_job(pids: list[int], proc_root: str = "/proc") -> str | None:
    """The job id (Slurm job id or Kubernetes pod UID) of the GPU's processes, or None."""
    info = job_info(pids, proc_root)
    return info.job_id if info else None


def job_tags(pids, keys, proc_root: str = "/proc") -> dict[str, str]:
    """The operator-chosen low-cardinality job tags (``keys`` from TAG_KEYS) for a GPU's processes.

    ``keys`` empty (the default everywhere) gives {}: no job tag at all unless the operator asks.
    """
    keys = check_tag_keys(keys)
    if not keys:
        return {}
    info = job_info(pids, proc_root)
    return info.tags(keys) if info else {}
