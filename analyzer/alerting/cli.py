"""``gpufleet report``: HTML incident pages with plots from incidents and telemetry."""

from __future__ import annotations

import click

from gpufleet import records


@click.command(name="report")
@click.option("--incidents", "incidents_path", required=True, type=click.Path(dir_okay=False),
              help="Incidents (JSON lines), e.g. the analyzer's --out file.")
@click.option("--input", "data", required=True, type=click.Path(),
              help="Telemetry: a .lp/.lp.gz file or a directory of them.")
@click.option("--out", "out_dir", required=True, type=click.Path(file_okay=False),
              help="Directory for the pages and index.html.")
@click.option("--page-base-url", default=None, help="URL the pages are served under (shown on pages).")
@click.option("--runbook-base-url", default=None, envvar="GPUFLEET_RUNBOOK_BASE_URL",
              help="URL of the runbooks (docs/runbooks/); pages link <URL>/<kind>.md.")
@click.option("--progress/--no-progress", default=None, help="Progress bar (default: on a terminal).")
def report(incidents_path, data, out_dir, page_base_url, runbook_base_url, progress):
    """Write a self-contained HTML page per incident, plus index.html."""
    import time

    from gpufleet.analyzer.alerting.pages import write_pages

    t0 = time.monotonic()
    incs = records.read(incidents_path)
    paths = write_pages(incs, data, out_dir, page_base_url=page_base_url, runbook_base_url=runbook_base_url,
                        progress=progress)
    click.echo(f"wrote {len(paths) - 1} incident page(s) and {paths[-1]} in {time.monotonic() - t0:.1f} s")
