"""What collectors produce and how they are registered.

A collector is one module under ``agent/collectors/`` with a class that has a ``name`` and a
``collect(now_ns)`` method returning ``Sample`` rows; it registers itself with ``@register``.
It declares its own facts on the class, and the agent derives the rest from them:
``options`` (its config section ``[NAME]``: a tuple of :class:`gpufleet.options.Option`, passed to
the constructor as keywords; the config's validation, its secret keys and the docs' option table
come from it), ``needs_nvml`` (it reads NVML through the agent's one shared backend, passed as
``backend``), ``measurements`` (the catalogue measurements it writes), and what its status line
says (``gpufleet agent check``, the agent's start; :mod:`gpufleet.agent.status` loops over the
registry): ``unavailable(table)`` (why its source is not on this node, so it is not started),
``describe(table, node)`` (on or unavailable, and what it reads) and ``slowest_rows(table)`` (the
longest gap between two of its rows of one series: the Prometheus exporter holds values that long).
Field names and units are the catalogue's (``gpufleet/catalogue.toml``): collectors convert
units once, at the edge. A value that is missing or "not supported" is simply not in
``fields`` (never 0).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import ClassVar, Protocol

from gpufleet.options import Option

STATE_DIR = "/var/lib/gpufleet-agent"  # the systemd unit's StateDirectory: the one place it may write


@dataclass(slots=True)
class Sample:
    """One wide row: a measurement, its identity tags, catalogue fields, a timestamp (ns).

    ``host`` and operator labels (cluster, rack, ...) are added by the pipeline, not here.
    """

    measurement: str
    tags: dict[str, str]
    fields: dict[str, object]
    time_ns: int
    extra: dict[str, object] = field(default_factory=dict)  # not exported; for tests and logs


@dataclass(frozen=True, slots=True)
class Node:
    """What the agent knows of its node when a collector describes itself: ``gpus``, the GPUs NVML
    shows (None: NVML did not answer or no listed collector reads it, ``nvml_error`` says why);
    ``interval``: the agent's poll interval in seconds."""

    gpus: int | None
    nvml_error: str | None
    interval: float


class Collector(Protocol):
    name: str
    options: ClassVar[tuple[Option, ...]]  # its [NAME] section; () = none
    needs_nvml: ClassVar[bool]
    measurements: ClassVar[tuple[str, ...]]

    @classmethod
    def unavailable(cls, table: dict) -> str | None:
        """Why its source is not on this node (one line; it is then not started), or None.
        ``table``: its validated section ({} when it has none)."""
        ...

    @classmethod
    def describe(cls, table: dict, node: Node) -> tuple[str, str]:
        """Its status when listed and available: ``("on", what it reads)``, or
        ``("unavailable", why)`` for a source that may come back while the agent runs."""
        ...

    @classmethod
    def slowest_rows(cls, table: dict) -> float | None:
        """Seconds between its rows of one series at the slowest (None: every tick)."""
        ...

    def collect(self, now_ns: int) -> list[Sample]:
        """Read the source once. Raise on failure; the loop times and isolates each collector."""
        ...

    def close(self) -> None: ...


REGISTRY: dict[str, type[Collector]] = {}


def _available(cls, table: dict) -> str | None:
    return None


def _describe(cls, table: dict, node: Node) -> tuple[str, str]:
    return "on", f"writes {', '.join(cls.measurements)}" if cls.measurements else "site collector"


def _every_tick(cls, table: dict) -> float | None:
    return None


DEFAULTS = (("options", ()), ("needs_nvml", False), ("measurements", ()),
            ("unavailable", classmethod(_available)), ("describe", classmethod(_describe)),
            ("slowest_rows", classmethod(_every_tick)))


def register(name: str):
    """Class decorator: make a collector constructible by name from the agent config; a fact the
    class does not declare gets its default (no section, no NVML, always available, ...)."""

    def deco(cls):
        cls.name = name
        for attr, default in DEFAULTS:
            if not hasattr(cls, attr):
                setattr(cls, attr, default)
        REGISTRY[name] = cls
        return cls

    return deco


class Exporter:
    """An exporter of the agent (one module under ``agent/pipeline/``), registered by name with
    ``@register_exporter``; ``agent.exporters`` lists the names. Its facts on the class:

    ``options``: its config section ``[NAME]`` (:class:`gpufleet.options.Option`); ``lines``: True
    when :meth:`build` gives a line-protocol sink (``write(lines)``, ``close()``) that the one
    line-protocol encoder feeds, False when it gives an OpenTelemetry ``MetricExporter`` the
    pipeline's reader calls; ``spooled``: the agent builds it itself, once per destination, each
    with its own disk spool (``influx``, ``influx.NAME``); ``identity``: its readers want the
    OpenTelemetry semantic conventions' ``hw.*`` identity on GPU points (the pipeline adds them
    only when a listed exporter asks: they cost the SDK ~17 % of a tick).
    """

    name: ClassVar[str] = ""
    options: ClassVar[tuple[Option, ...]] = ()
    lines: ClassVar[bool] = False
    spooled: ClassVar[bool] = False
    identity: ClassVar[bool] = False

    @classmethod
    def check_active(cls, table: dict) -> None:
        """What its section's key ranges cannot say, checked when it is listed (ConfigError)."""

    @classmethod
    def build(cls, table: dict, agent) -> object:
        """The running part from its validated section; ``agent``: the building agent (``host``,
        ``interval``, ``cfg``)."""
        raise NotImplementedError

    @classmethod
    def describe(cls, table: dict) -> str:
        """Where it sends, in words, for its ``exporter NAME: ...`` line (``gpufleet agent check``)."""
        return "on"

    @classmethod
    def open_part(cls, part) -> None:
        """Called once the pipeline is up (a server starts listening)."""

    @classmethod
    def close_part(cls, part) -> None:
        """Called when the agent closes, after the pipeline's shutdown (a line sink: ``close()``)."""
        if cls.lines:
            part.close()


EXPORTERS: dict[str, type[Exporter]] = {}


def register_exporter(name: str):
    """Class decorator: make an exporter constructible by name from ``agent.exporters``."""

    def deco(cls):
        cls.name = name
        EXPORTERS[name] = cls
        return cls

    return deco
