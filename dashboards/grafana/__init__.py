"""Generated Grafana dashboards (JSON); regenerate with python -m gpufleet.dashboards.generate."""
