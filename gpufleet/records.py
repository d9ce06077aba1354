"""Truth and incident records: one JSON object per line, one shape for both.

The simulator writes ground truth in this shape, the analyzer writes incidents in it, and
``gpufleet eval`` compares the two. This is a public contract (docs/faults.md).
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path

from gpufleet.errors import GpufleetError
from gpufleet.times import parse_time, to_rfc3339  # noqa: F401 (to_rfc3339: re-exported)

KINDS = (
    "thermal_throttle",
    "cooling_degradation",
    "power_brake",
    "nvlink_degradation",
    "pcie_degradation",
    "memory_errors",
    "sdc",
    "canary_unchecked",
    "gpu_lost",
    "straggler",
    "power_limit_below_peers",
    "inlet_above_room",
)
# informational records (severity "info"): a setting or the room worth telling someone, not a fault.
# Never sent to a sink (the notifier drops them), never scored as pages by ``gpufleet eval``, never
# injected by the simulator
INFO_KINDS = ("power_limit_below_peers", "inlet_above_room")
FAULT_KINDS = tuple(k for k in KINDS if k not in INFO_KINDS)
# records the online analysis writes about its own input, not faults (gpufleet.analyzer.pipeline)
ANALYSIS_KINDS = ("analysis_gap", "node_stopped_reporting")
SEVERITIES = ("critical", "warning", "info")


def from_rfc3339(s: str | None) -> float | None:
    """:func:`gpufleet.times.parse_time` that lets None through (a record's open end)."""
    return None if s is None else parse_time(s)


@dataclass
class Record:
    """A fault (truth) or an incident. Times are seconds since the epoch (UTC)."""

    kind: str
    host: str | None
    gpu: int | None
    link: int | None
    start: float
    end: float | None
    severity: str
    impact_at: float | None = None
    detail: str = ""
    # incident-only (optional in truth files)
    id: str | None = None
    summary: str | None = None
    cluster: str | None = None
    rack: str | None = None
    evidence: dict = field(default_factory=dict)
    # job ids (Slurm job id, pod UID) on the affected GPUs during the incident, from ``gpu.job_id``
    jobs: list[str] = field(default_factory=list)

    def to_json(self) -> str:
        d = asdict(self)
        for k in ("start", "end", "impact_at"):
            d[k] = to_rfc3339(d[k])
        keep = ("gpu", "link", "end", "impact_at")  # always present, null when unknown
        d = {k: v for k, v in d.items() if v not in (None, {}, "", []) or k in keep}
        return json.dumps(d, sort_keys=False, separators=(",", ":"))

    @classmethod
    def from_dict(cls, d: dict) -> Record:
        if d.get("kind") not in KINDS and d.get("kind") not in ANALYSIS_KINDS:
            raise ValueError(f"unknown kind {d.get('kind')!r}")
        if d.get("severity") not in SEVERITIES:
            raise ValueError(f"unknown severity {d.get('severity')!r}")
        known = set(cls.__dataclass_fields__)
        kw = {k: v for k, v in d.items() if k in known}
        for k in ("start", "end", "impact_at"):
            kw[k] = from_rfc3339(kw.get(k))
        if kw.get("start") is None:
            raise ValueError("missing start")
        for k in ("gpu", "link"):
            if kw.get(k) is not None:
                kw[k] = int(kw[k])
        if "jobs" in kw:
            kw["jobs"] = [str(j) for j in kw["jobs"] or []]
        kw.setdefault("host", None)
        kw.setdefault("gpu", None)
        kw.setdefault("link", None)
        kw.setdefault("end", None)
        return cls(**kw)


def read(path: str | Path) -> list[Record]:
    """Read a JSON-lines record file; a malformed line is a GpufleetError naming the line."""
    path = Path(path)
    if not path.is_file():
        raise GpufleetError(f"{path}: no such file")
    out = []
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError:
        raise GpufleetError(f"{path}: not a JSON-lines record file (not UTF-8 text)") from None
    except OSError as exc:
        raise GpufleetError(f"{path}: cannot read: {exc.strerror or exc}") from None
    for n, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        try:
            out.append(Record.from_dict(json.loads(line)))
        except (ValueError, TypeError, AttributeError, KeyError) as exc:
            raise GpufleetError(f"{path}:{n}: malformed record: {exc}") from None
    return out


def write(path: str | Path, records) -> None:
    path = Path(path)
    tmp = path.with_suffix(path.suffix + ".tmp")
    with tmp.open("w") as f:
        for r in records:
            f.write(r.to_json() + "\n")
    tmp.replace(path)
