"""What collectors produce and how they are registered.

A collector is one module under ``agent/collectors/`` with a class that has a ``name`` and a
``collect(now_ns)`` method returning ``Sample`` rows; it registers itself with ``@register``.
It declares its own facts on the class, and the agent derives the rest from them:
``options`` (its config section ``[NAME]``: a tuple of :class:`gpufleet.options.Option`, passed to
the constructor as keywords; the config's validation, its secret keys and the docs' option table
come from it), ``needs_nvml`` (it reads NVML through the agent's one shared backend, passed as
``backend``) and ``measurements`` (the catalogue measurements it writes).
Field names and units are the catalogue's (``gpufleet/catalogue.toml``): collectors convert
units once, at the edge. A value that is missing or "not supported" is simply not in
``fields`` (never 0).
"""

from __future__ import annotations

from collections.abc import Callable
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


class Collector(Protocol):
    name: str
    options: ClassVar[tuple[Option, ...]]  # its [NAME] section; () = none
    needs_nvml: ClassVar[bool]
    measurements: ClassVar[tuple[str, ...]]

    def collect(self, now_ns: int) -> list[Sample]:
        """Read the source once. Raise on failure; the loop times and isolates each collector."""
        ...

    def close(self) -> None: ...


REGISTRY: dict[str, Callable[..., Collector]] = {}


def register(name: str):
    """Class decorator: make a collector constructible by name from the agent config."""

    def deco(cls):
        cls.name = name
        for attr, default in (("options", ()), ("needs_nvml", False), ("measurements", ())):
            if not hasattr(cls, attr):  # a collector that declares none of these has no section
                setattr(cls, attr, default)
        REGISTRY[name] = cls
        return cls

    return deco
