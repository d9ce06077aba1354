"""``gpufleet report``: HTML incident pages with plots from incidents and telemetry; ``gpufleet
actions``: the action sink's audit trail from the notifier's state."""

from __future__ import annotations

import click
from gpufleet.analyzer.alerting.audit import STATUS_GROUPS

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
@click.option("--state", "state_paths", multiple=True, type=click.Path(dir_okay=False),
              help="notifier state file(s) (the analyzer's --state; repeat for shards): each page shows "
                   "what the action sink ran, refused and undone for its incident, and why")
@click.option("--progress/--no-progress", default=None, help="Progress bar (default: on a terminal).")
def report(incidents_path, data, out_dir, page_base_url, runbook_base_url, state_paths, progress):
    """Write a self-contained HTML page per incident, plus index.html."""
    import time

    from gpufleet.analyzer.alerting.audit import read_actions
    from gpufleet.analyzer.alerting.pages import write_pages

    t0 = time.monotonic()
    acts = read_actions(state_paths)  # a wrong --state fails before any page is written
    incs = records.read(incidents_path)
    paths = write_pages(incs, data, out_dir, page_base_url=page_base_url, runbook_base_url=runbook_base_url,
                        progress=progress, actions=acts)
    click.echo(f"wrote {len(paths) - 1} incident page(s) and {paths[-1]} in {time.monotonic() - t0:.1f} s")


@click.command(name="actions")
@click.option("--state", "state_paths", multiple=True, type=click.Path(dir_okay=False),
              help="notifier state file(s) (the analyzer's --state; repeat for shards) "
                   "[default: gpufleet-analyzer-notifier.db]")
@click.option("--status", "groups", multiple=True, type=click.Choice(STATUS_GROUPS),
              help="only these: run, dry-run, refused (rate, budget, verification, unsafe name), undone, "
                   "not-undone (a resolve that left the node alone), failed")
@click.option("--since", help="only the last DURATION (e.g. 24h)")
@click.option("--json", "as_json", is_flag=True, help="one JSON object per line")
def actions(state_paths, groups, since, as_json):
    """What the action sink ran, dry-ran, refused and undone: incident, time, command, output.

    A refused command is printed shell-quoted, to be run by hand where a person decides it must."""
    import json
    import shlex
    import time

    from gpufleet.analyzer.alerting.action import clean
    from gpufleet.analyzer.alerting.audit import DEFAULT_STATE, read_actions

    from gpufleet.errors import ConfigError
    from gpufleet.records import to_rfc3339
    from gpufleet.units import parse_duration

    rows = read_actions(state_paths or [DEFAULT_STATE])
    if since:
        cut = time.time() - parse_duration(since, "--since", ConfigError)
        rows = [r for r in rows if r["at"] >= cut]
    if groups:
        rows = [r for r in rows if r["group"] in groups]
    for r in rows:
        if as_json:
            keys = ("at", "what", "group", "sink", "grp", "incidents", "action", "status", "argv", "rc",
                    "seconds", "detail", "output", "state")
            click.echo(json.dumps({k: r[k] for k in keys}))
            continue
        cmd = shlex.join(r["argv"]) if r["argv"] else "-"
        line = f"{to_rfc3339(r['at'])}  {r['what']:<28} {clean(r['grp'])}  [{r['sink']}]  {clean(cmd)}"
        click.echo(line)
        if r["detail"]:
            click.echo(f"    why: {clean(r['detail'])}")
        if r["output"]:
            click.echo(f"    output: {clean(' '.join(r['output'].split()))}")
    if not rows and not as_json:
        click.echo("no actions recorded" + (" matching" if groups or since else ""), err=True)
