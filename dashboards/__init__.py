"""gpufleet dashboards."""
