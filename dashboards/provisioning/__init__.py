"""Provisioning templates for Grafana (data files, read by dashboards.provisioning)."""
