"""Grafana dashboards generated from the metric catalogue (dashboards as code, plain data): which
dashboards there are, and writing them as JSON.

Four dashboards over InfluxQL (the query language InfluxDB 1.x, 2.x and 3.x all answer):
``fleet-overview``, ``node``, ``gpu`` and ``incidents``, each built by its module in
:mod:`gpufleet.dashboards.boards`. Every field a query names is looked up in
``gpufleet/catalogue.toml`` (a renamed field fails generation, :mod:`gpufleet.dashboards.influxql`),
units come from the catalogue's UCUM units (:mod:`gpufleet.dashboards.grafana_units`), and the GPU
dashboard shows every numeric ``gpu`` field of the catalogue. ``build_all()`` returns the
dashboards; ``python -m gpufleet.dashboards.generate`` rewrites ``dashboards/grafana/*.json`` (the
committed files are this module's output; ``python -m gpufleet.regen --check`` checks them).
"""

from __future__ import annotations

import json
import sys
from collections.abc import Callable
from pathlib import Path

from gpufleet.dashboards.boards import fleet_overview, gpu, incidents, node

GRAFANA_DIR = Path(__file__).resolve().parent / "grafana"
BUILDERS: dict[str, Callable[[], dict]] = {
    "fleet-overview": fleet_overview.build,
    "node": node.build,
    "gpu": gpu.build,
    "incidents": incidents.build,
}


def build_all() -> dict[str, dict]:
    return {name: build() for name, build in BUILDERS.items()}


def dumps(dash: dict) -> str:
    """A dashboard's JSON text, as committed."""
    return json.dumps(dash, indent=2, ensure_ascii=False) + "\n"


def write(out: Path, dashboards: dict[str, dict] | None = None) -> list[Path]:
    out.mkdir(parents=True, exist_ok=True)
    paths = []
    for name, dash in (dashboards or build_all()).items():
        p = out / f"{name}.json"
        p.write_text(dumps(dash))
        paths.append(p)
    return paths


if __name__ == "__main__":
    for p in write(Path(sys.argv[1]) if len(sys.argv) > 1 else GRAFANA_DIR):
        print(p)
