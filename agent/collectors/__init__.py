"""Collectors: one module per telemetry source, each registering itself with ``@register``.

``load(name)`` imports the module of one collector (``gpufleet.agent.collectors.<name>``) and returns
its class from the registry, so a node only imports what its configuration uses.

A collector whose source does not exist on this node (no NVIDIA driver, no BMC) raises
:class:`CollectorUnavailable` from ``collect()`` with a one-line reason; the agent logs it and
carries on with its other sources.
"""

from __future__ import annotations

import importlib

from gpufleet.agent.model import REGISTRY

from gpufleet.errors import GpufleetError


class CollectorUnavailable(GpufleetError):
    """The collector's source is not present on this node (one-line reason)."""


def load(name: str):
    """The collector class registered as ``name``, importing ``gpufleet.agent.collectors.<name>``."""
    if name not in REGISTRY:
        try:
            importlib.import_module(f"gpufleet.agent.collectors.{name}")
        except ModuleNotFoundError as exc:
            if exc.name == f"gpufleet.agent.collectors.{name}":
                raise GpufleetError(f"unknown collector {name!r}") from None
            raise GpufleetError(
                f"collector {name!r} needs {exc.name} (pip install 'gpufleet[agent]')") from None
    if name not in REGISTRY:
        raise GpufleetError(f"unknown collector {name!r}")
    return REGISTRY[name]
