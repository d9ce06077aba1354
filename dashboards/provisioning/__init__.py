"""Provisioning templates for Grafana (data files, read by gpufleet.dashboards.provisioning)."""
