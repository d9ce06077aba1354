"""``gpufleet dashboards``: export the Grafana dashboards and provisioning, regenerate, preview."""

from __future__ import annotations

import difflib
from pathlib import Path

import click

from gpufleet.errors import GpufleetError
from gpufleet.flags import Renamed


@click.group()
def dashboards():
    """Grafana dashboards over InfluxQL, generated from the metric catalogue."""


@dashboards.command("export")
@click.option(
    "--out",
    "out",
    required=True,
    type=click.Path(file_okay=False, path_type=Path),
    help="Directory to write dashboards/ and provisioning/ into.",
)
@click.option(
    "--influx",
    type=click.Choice(["1", "2", "3"]),
    default="1",
    show_default=True,
    help="InfluxDB major version: 1 = database + user/password, 2/3 = InfluxQL with a token.",
)
@click.option("--datasource", default="gpufleet-influxdb", show_default=True, help="Data source name.")
@click.option("--datasource-uid", default="gpufleet-influxdb", show_default=True, help="Data source uid.")
@click.option(
    "--influx-url", "url", cls=Renamed, old=["--url"], default="http://localhost:8086", show_default=True,
    help="InfluxDB URL as Grafana sees it.",
)
@click.option(
    "--influx-db",
    "db",
    cls=Renamed,
    old=["--db"],
    default="gpufleet",
    show_default=True,
    help="Database (1.x), DBRP-mapped database (2.x) or database (3.x).",
)
@click.option("--influx-user", "user", cls=Renamed, old=["--user"], default="grafana", show_default=True,
              help="InfluxDB 1.x user.")
@click.option("--org-id", type=int, default=1, show_default=True, help="Grafana organisation id.")
@click.option("--folder", default="gpufleet", show_default=True, help="Grafana folder for the dashboards.")
@click.option(
    "--dashboards-path",
    default="/var/lib/grafana/dashboards/gpufleet",
    show_default=True,
    help="Where Grafana will find the dashboard JSON files.",
)
@click.option(
    "--min-interval",
    default="10s",
    show_default=True,
    help="Data source minimum interval (the agent's poll period).",
)
def export_cmd(
    out, influx, datasource, datasource_uid, url, db, user, org_id, folder, dashboards_path, min_interval
):
    """Write the dashboards and provisioning files with these names filled in.

    Secrets are not written: Grafana reads GPUFLEET_INFLUX_PASSWORD (1.x) or GPUFLEET_INFLUX_TOKEN
    (2.x/3.x) from its environment.
    """
    from gpufleet.dashboards.export import Settings, export

    s = Settings(
        datasource=datasource,
        uid=datasource_uid,
        influx=influx,
        url=url,
        db=db,
        user=user,
        org_id=org_id,
        folder=folder,
        dashboards_path=dashboards_path,
        min_interval=min_interval,
    )
    for p in export(out, s):
        click.echo(str(p))


@dashboards.command("generate")
@click.option("--check", is_flag=True, help="Fail if the committed JSON differs from the generator's output.")
def generate_cmd(check):
    """Rewrite dashboards/grafana/*.json from the catalogue (or check that they are current)."""
    from gpufleet.dashboards import generate

    if not check:
        for p in generate.write(generate.GRAFANA_DIR):
            click.echo(str(p))
        return
    stale = []
    for name, dash in generate.build_all().items():
        path = generate.GRAFANA_DIR / f"{name}.json"
        want = generate.dumps(dash)
        have = path.read_text() if path.is_file() else ""
        if have != want:
            stale.append(name)
            diff = difflib.unified_diff(
                have.splitlines(), want.splitlines(), str(path), "generated", lineterm=""
            )
            click.echo("\n".join(list(diff)[:40]), err=True)
    if stale:
        raise GpufleetError(f"dashboards out of date: {', '.join(stale)} (run: gpufleet dashboards generate)")
    click.echo("dashboards are current")


@dashboards.command("preview")
@click.option("--influx-url", required=True, help="InfluxDB URL holding a fleet's telemetry.")
@click.option("--influx-db", "db", cls=Renamed, old=["--db"], default="gpufleet", show_default=True)
@click.option("--from-ms", type=int, required=True, help="Range start (epoch ms).")
@click.option("--to-ms", type=int, required=True, help="Range end (epoch ms).")
@click.option("--node", default=None, help="Host for the Node dashboard (default: the first).")
@click.option("--gpu", default=None, help="HOST/INDEX for the GPU dashboard (default: the first).")
@click.option("--out", "out", required=True, type=click.Path(file_okay=False, path_type=Path))
def preview_cmd(influx_url, db, from_ms, to_ms, node, gpu, out):
    """Render a PNG per dashboard from the same queries Grafana would run."""
    from gpufleet.dashboards.preview import render_all
    from gpufleet.dashboards.runner import influx_query_fn

    if to_ms <= from_ms:
        raise GpufleetError("--to-ms must be after --from-ms")
    sel: dict[str, dict] = {}
    if node:
        sel["node"] = {"host": node}
    if gpu:
        host, sep, index = gpu.rpartition("/")
        if not sep or not host or not index.isdigit():
            raise GpufleetError(f"--gpu {gpu!r}: expected HOST/INDEX, e.g. node-01/3")
        sel["gpu"] = {"host": host, "gpu": index}
    for p in render_all(influx_query_fn(influx_url, db), from_ms, to_ms, out, sel):
        click.echo(str(p))
