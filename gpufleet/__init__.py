"""gpufleet: observability for GPU fleets (agent, analyzer, simulator, dashboards)."""

__version__ = "0.1.0"
