"""The telemetry catalogue (``catalogue.toml``): the single source of metric truth.

Everything that names a metric -- OpenTelemetry instruments, the InfluxDB mapping, the
simulator, the analyzer, dashboards and ``docs/schema.md`` -- reads it from here.
"""

from __future__ import annotations

import tomllib
from dataclasses import dataclass, field
from functools import cache
from importlib import resources

KINDS = {"gauge", "counter", "updowncounter", "info", "event"}
TYPES = {"float", "int", "string"}
TIERS = {"fast", "slow", "event"}

# Tags every measurement carries (operator labels such as cluster/rack come on top).
IDENTITY_TAGS = {
    "gpu": ("host", "gpu", "uuid", "model"),
    "gpu_nvlink": ("host", "gpu", "uuid", "model", "link"),
    "gpu_event": ("host", "gpu", "uuid", "model", "type", "source"),
    "gpu_canary": ("host", "gpu", "uuid", "model"),
    "bmc_sensor": ("host", "sensor", "sensor_type", "unit"),
    "bmc": ("host",),
    "host": ("host",),
    "gpufleet_collector": ("host", "collector"),
    "gpufleet_agent": ("host", "exporter"),
    "gpufleet_canary": ("host", "gpu", "uuid", "model"),
}
OPERATOR_TAGS = ("cluster", "rack")


@dataclass(frozen=True)
class Metric:
    measurement: str
    field: str
    otel: str
    kind: str
    unit: str
    type: str
    tier: str
    source: str
    description: str
    scale: float = 1.0
    attributes: dict[str, str] = field(default_factory=dict)

    @property
    def key(self) -> tuple[str, str]:
        return (self.measurement, self.field)

    @property
    def python_type(self) -> type:
        return {"float": float, "int": int, "string": str}[self.type]


class CatalogueError(ValueError):
    pass


def parse(data: dict) -> list[Metric]:
    """Validate a parsed catalogue document and return its metrics, in file order."""
    metrics: list[Metric] = []
    seen: set[tuple[str, str]] = set()
    for i, raw in enumerate(data.get("metric", [])):
        try:
            m = Metric(**raw)
        except TypeError as exc:
            raise CatalogueError(f"metric #{i}: {exc}") from None
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
        seen.add(m.key)
        metrics.append(m)
    return metrics


@cache
def load() -> tuple[Metric, ...]:
    text = resources.files("gpufleet").joinpath("catalogue.toml").read_text()
    return tuple(parse(tomllib.loads(text)))


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
