"""``gpufleet dashboards``: export the Grafana dashboards and provisioning, regenerate, preview."""

from __future__ import annotations

import difflib
from pathlib import Path

import click

from gpufleet.errors import ConfigError, GpufleetError
from gpufleet.flags import influx_options


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
@click.option("--datasource", default="gpufleet-influxdb", show_default=True, help="Data source name.")
@click.option("--datasource-uid", default="gpufleet-influxdb", show_default=True, help="Data source uid.")
@influx_options(defaults={"api": "v1", "url": "http://localhost:8086", "db": "gpufleet", "user": "grafana"})
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
    out, datasource, datasource_uid, influx, org_id, folder, dashboards_path, min_interval
):
    """Write the dashboards and provisioning files with these names filled in.

    --influx-url is the URL as Grafana sees it; --influx-api v1 provisions a database with a user
    and password, v2/v3 InfluxQL with a token. Secrets are not written: Grafana reads
    GPUFLEET_INFLUX_PASSWORD (v1) or GPUFLEET_INFLUX_TOKEN (v2/v3) from its environment.
    """
    from gpufleet.dashboards.export import Settings, export

    influx.refuse(["password_file", "token_file"], "secrets are not written into provisioning: Grafana "
                  "reads GPUFLEET_INFLUX_PASSWORD or GPUFLEET_INFLUX_TOKEN from its environment")
    influx.refuse(["bucket", "org"], "the dashboards query InfluxQL: give --influx-db (for v2: the "
                  "bucket's DBRP-mapped database)")
    s = Settings(
        datasource=datasource,
        uid=datasource_uid,
        influx=influx.api[1:],
        url=influx.url,
        db=influx.db,
        user=influx.user,
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
@influx_options(defaults={"db": "gpufleet"}, required=("url",))
@click.option("--start", required=True, help="Range start (RFC 3339 or epoch seconds), as analyze --start.")
@click.option("--end", required=True, help="Range end (RFC 3339 or epoch seconds).")
@click.option("--node", default=None, help="Host for the Node dashboard (default: the first).")
@click.option("--gpu", default=None, help="HOST/INDEX for the GPU dashboard (default: the first).")
@click.option("--out", "out", required=True, type=click.Path(file_okay=False, path_type=Path))
def preview_cmd(influx, start, end, node, gpu, out):
    """Render a PNG per dashboard from the same queries Grafana would run."""
    from gpufleet.dashboards.preview import render_all
    from gpufleet.dashboards.runner import influx_query_fn

    from gpufleet.times import parse_time

    influx.refuse(["user", "password_file", "bucket", "org"], "preview queries InfluxQL with "
                  "--influx-db and, where the server needs one, --influx-token-file")
    influx_url, db = influx.url, influx.db
    token = influx.secrets().get("token")
    try:
        from_ms, to_ms = (int(parse_time(v, f) * 1000) for v, f in ((start, "--start"), (end, "--end")))
    except GpufleetError as exc:
        raise ConfigError(str(exc)) from None
    if to_ms <= from_ms:
        raise ConfigError("--end must be after --start")
    sel: dict[str, dict] = {}
    if node:
        sel["node"] = {"host": node}
    if gpu:
        host, sep, index = gpu.rpartition("/")
        if not sep or not host or not index.isdigit():
            raise GpufleetError(f"--gpu {gpu!r}: expected HOST/INDEX, e.g. node-01/3")
        sel["gpu"] = {"host": host, "gpu": index}
    for p in render_all(influx_query_fn(influx_url, db, token), from_ms, to_ms, out, sel):
        click.echo(str(p))
