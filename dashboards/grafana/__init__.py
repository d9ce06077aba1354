"""Generated Grafana dashboards (JSON); regenerate with python -m dashboards.generate."""
