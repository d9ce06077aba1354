"""The telemetry catalogue (``catalogue.toml``): the single source of metric truth.

Everything that names a metric -- OpenTelemetry instruments, the InfluxDB mapping, the
simulator, the analyzer, dashboards and ``docs/schema.md`` -- reads it from here.
"""

from __future__ import annotations

import tomllib
from dataclasses import dataclass, field
from functools import cache
from importlib import resources

from gpufleet.errors import GpufleetError

KINDS = {"gauge", "counter", "updowncounter", "info", "event"}
# Measurements whose fields the GPU collector reads as the catalogue says (``call``, ``field_id``,
# ``bit_of``, ``read``): every entry of these names how it is read.
READ_MEASUREMENTS = ("gpu", "gpu_nvlink")
TYPES = {"float", "int", "string"}
TIERS = {"fast", "slow", "nvlink", "event"}

OPERATOR_TAGS = ("cluster", "rack")


@dataclass(frozen=True)
class Measurement:
    """One ``[measurement.NAME]`` table: identity tags, what a row is, who writes it.

    ``fields`` (``(name, type, unit, description)``) is given only for measurements written
    by the analyzer; the agent's fields are its ``[[metric]]`` entries.
    """

    name: str
    tags: tuple[str, ...]
    rows: str
    writer: str = "agent"
    fields: tuple[tuple[str, str, str, str], ...] = ()


def _document() -> dict:
    return tomllib.loads(resources.files("gpufleet").joinpath("catalogue.toml").read_text())


def _measurements(doc: dict) -> dict[str, Measurement]:
    out = {}
    for name, raw in doc.get("measurement", {}).items():
        fields = tuple((f["name"], f["type"], f["unit"], f["description"]) for f in raw.get("fields", ()))
        out[name] = Measurement(name, tuple(raw["tags"]), raw.get("rows", ""), raw.get("writer", "agent"),
                                fields)
    return out


MEASUREMENTS: dict[str, Measurement] = _measurements(_document())
# Tags every row of an agent measurement carries (operator labels such as cluster/rack come on top).
IDENTITY_TAGS = {m.name: m.tags for m in MEASUREMENTS.values() if m.writer == "agent"}


@dataclass(frozen=True)
class Metric:
    measurement: str
    field: str
    otel: str
    kind: str
    unit: str
    type: str
    tier: str
    description: str
    source: str = ""
    scale: float = 1.0
    attributes: dict[str, str] = field(default_factory=dict)
    # How the GPU collector reads it (measurements in READ_MEASUREMENTS; see catalogue.toml)
    call: str = ""
    args: tuple = ()
    member: str | int | None = None
    count: bool = False
    field_id: str = ""
    bit_of: str = ""
    mask: int = 0
    read: str = ""
    gpm_metric: str = ""
    needs_nvlink: bool = False
    # dcgm-exporter name, type, unit, scale, sum, match, note (see catalogue.toml); {} when none
    dcgm: dict = field(default_factory=dict)

    @property
    def key(self) -> tuple[str, str]:
        return (self.measurement, self.field)

    @property
    def python_type(self) -> type:
        return {"float": float, "int": int, "string": str}[self.type]

    @property
    def reader(self) -> str:
        """How the GPU collector reads it: a named reader (``read``), ``field`` (a field value of
        the tier's ``nvmlDeviceGetFieldValues`` batch), ``bit`` (a flag of another field) or
        ``call`` (one NVML call); "" for measurements the catalogue does not drive."""
        if self.read:
            return self.read
        if self.field_id:
            return "field"
        if self.bit_of:
            return "bit"
        return "call" if self.call else ""

    @property
    def origin(self) -> str:
        """Where the value comes from, in words (``docs/schema.md``'s source column)."""
        parts = []
        if self.field_id:
            scope = " per link" if self.measurement == "gpu_nvlink" else ""
            parts.append(f"field value {self.field_id}{scope}")
        if self.call:
            member = f".{self.member}" if isinstance(self.member, str) else (
                f"[{self.member}]" if self.member is not None else "")
            call = f"{self.call}({', '.join(self.args)}){member}" + (" (length)" if self.count else "")
            parts.append(f"or {call}" if self.field_id else call)
        if self.bit_of:
            parts.append(f"bit {self.mask:#x} of {self.bit_of}")
        if self.gpm_metric:
            parts.append(f"nvmlGpmMetricsGet {self.gpm_metric}")
        if self.source:
            parts.append(f"({self.source})" if parts else self.source)
        return " ".join(parts)


class CatalogueError(ValueError):
    pass


def parse(data: dict) -> list[Metric]:
    """Validate a parsed catalogue document and return its metrics, in file order."""
    metrics: list[Metric] = []
    seen: set[tuple[str, str]] = set()
    for i, raw in enumerate(data.get("metric", [])):
        try:
            m = Metric(**{**raw, "args": tuple(raw.get("args", ()))})
        except TypeError as exc:
            raise CatalogueError(f"metric #{i}: {exc}") from None
        if m.measurement in READ_MEASUREMENTS and not m.reader:
            raise CatalogueError(f"{m.measurement}.{m.field}: says neither call, field_id, bit_of nor read")
        if m.measurement not in READ_MEASUREMENTS and not m.source:
            raise CatalogueError(f"{m.measurement}.{m.field}: no source")
        if m.kind not in KINDS:
            raise CatalogueError(f"{m.measurement}.{m.field}: unknown kind {m.kind!r}")
        if m.type not in TYPES:
            raise CatalogueError(f"{m.measurement}.{m.field}: unknown type {m.type!r}")
        if m.tier not in TIERS:
            raise CatalogueError(f"{m.measurement}.{m.field}: unknown tier {m.tier!r}")
        if m.measurement not in IDENTITY_TAGS:
            raise CatalogueError(f"{m.measurement}.{m.field}: measurement has no identity tags")
        if m.key in seen:
            raise CatalogueError(f"{m.measurement}.{m.field}: declared twice")
        if m.dcgm:
            _check_dcgm(m)
        seen.add(m.key)
        metrics.append(m)
    return metrics


DCGM_KEYS = {"name", "type", "unit", "scale", "sum", "match", "note", "value"}


def _check_dcgm(m: Metric) -> None:
    d = m.dcgm
    where = f"{m.measurement}.{m.field}: dcgm"
    if set(d) - DCGM_KEYS or not {"name", "type", "unit"} <= set(d):
        raise CatalogueError(f"{where}: keys are name, type, unit and optionally scale, sum, match, value, "
                             "note")
    if d.get("value", "int") not in ("int", "float"):
        raise CatalogueError(f"{where}: value is int or float")
    if not str(d["name"]).startswith("DCGM_FI_") or d["type"] not in ("gauge", "counter"):
        raise CatalogueError(f"{where}: a DCGM_FI_* name and type gauge or counter")
    if d.get("sum") not in (None, "link") or (d.get("sum") and m.measurement != "gpu_nvlink"):
        raise CatalogueError(f"{where}: sum = \"link\" is for gpu_nvlink fields")
    if m.kind == "event" and not d.get("match"):
        raise CatalogueError(f"{where}: an event field needs match (the tags of the events it serves)")


@cache
def dcgm_names() -> dict[str, Metric]:
    """dcgm-exporter name -> the catalogue entry served as it (prometheus exporter, names = "dcgm")."""
    out: dict[str, Metric] = {}
    for m in load():
        if m.dcgm:
            if m.dcgm["name"] in out:
                raise CatalogueError(f"{m.dcgm['name']}: served by two entries")
            out[m.dcgm["name"]] = m
    return out


@cache
def dcgm_not_served() -> dict[str, str]:
    """dcgm-exporter names gpufleet does not serve -> why (``[dcgm_not_served]``)."""
    return dict(_document().get("dcgm_not_served", {}))


@cache
def otel_identity() -> dict[str, dict[str, str]]:
    """``[otel_identity]``: OpenTelemetry attribute -> {"tag": T} | {"value": V} | {"template": S}."""
    out = {}
    for k, spec in _document().get("otel_identity", {}).items():
        if not isinstance(spec, dict) or len(spec) != 1 or not {"tag", "value", "template"} >= set(spec):
            raise CatalogueError(f"otel_identity.{k}: one of tag, value or template")
        out[k] = dict(spec)
    return out


@cache
def load() -> tuple[Metric, ...]:
    return tuple(parse(_document()))


@cache
def by_key() -> dict[tuple[str, str], Metric]:
    return {m.key: m for m in load()}


@cache
def fields(measurement: str) -> tuple[Metric, ...]:
    """The catalogue entries of one measurement, in catalogue order."""
    return tuple(m for m in load() if m.measurement == measurement)


def measurements() -> tuple[str, ...]:
    return tuple(dict.fromkeys(m.measurement for m in load()))


def tags(measurement: str) -> tuple[str, ...]:
    return IDENTITY_TAGS[measurement] + OPERATOR_TAGS


@cache
def xids() -> dict[int, dict]:
    """The XID catalogue (``xid_catalogue.toml``, NVIDIA's Xid catalog): code -> {name, mnemonic,
    severity, action, investigate?, secondary?, description?}; read by the agent's XID collector,
    the simulator and the analyzer's actions.

    A catalogue that is missing or unreadable is an error (an incomplete installation), never an
    empty table: XIDs would lose their severities without a word.
    """
    try:
        doc = tomllib.loads(resources.files("gpufleet").joinpath("xid_catalogue.toml").read_text())
        return {int(k): v for k, v in doc.get("xid", {}).items()}
    except (OSError, ValueError) as exc:
        raise GpufleetError(f"XID catalogue gpufleet/xid_catalogue.toml: cannot read it ({exc}); "
                            "the installation is incomplete") from None


def incident() -> Measurement:
    """The ``incident`` measurement the analyzer writes back (its tags and fields)."""
    return MEASUREMENTS["incident"]
