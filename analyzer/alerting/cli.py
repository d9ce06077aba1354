"""``gpufleet report``: HTML incident pages with plots from incidents and telemetry; ``gpufleet
actions``: the action sink's audit trail from the notifier's state."""

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


# action_log status -> (words shown, the --status group it belongs to)
ACTION_WORDS = {
    ("firing", "ok"): ("run", "run"),
    ("resolved", "ok"): ("undone", "undone"),
    ("firing", "dry-run"): ("dry-run", "dry-run"),
    ("resolved", "dry-run"): ("dry-run (undo)", "dry-run"),
    ("firing", "suppressed"): ("refused (rate)", "refused"),
    ("firing", "refused-budget"): ("refused (budget)", "refused"),
    ("firing", "refused-verify"): ("refused (verification)", "refused"),
    ("firing", "refused-unsafe"): ("refused (unsafe name)", "refused"),
    ("resolved", "refused-unsafe"): ("not undone (unsafe name)", "not-undone"),
    ("resolved", "not-undone"): ("not undone (node taken over)", "not-undone"),
}
STATUS_GROUPS = ("run", "dry-run", "refused", "undone", "not-undone", "failed")


def read_actions(state_paths) -> list[dict]:
    """The action logs of these notifier state files, oldest first (read-only: never creates one)."""
    import json
    import sqlite3
    from pathlib import Path

    from gpufleet.errors import ConfigError

    rows = []
    for p in state_paths:
        if not Path(p).is_file():
            raise ConfigError(f"--state {p}: no such state file (the analyzer's --state; default "
                              f"gpufleet-analyzer-notifier.db in its working directory)")
        try:
            db = sqlite3.connect(f"file:{Path(p).resolve()}?mode=ro", uri=True, timeout=10)
            try:
                cur = db.execute("SELECT sink, grp, action, at, status, argv, rc, seconds, output, detail "
                                 "FROM action_log ORDER BY id")
                cols = [c[0] for c in cur.description]
                got = [dict(zip(cols, r, strict=True)) for r in cur.fetchall()]
            finally:
                db.close()
        except sqlite3.Error as exc:
            raise ConfigError(f"--state {p}: not a notifier state file ({exc})") from None
        for r in got:
            r["state"] = str(p)
            r["argv"] = json.loads(r["argv"]) if r["argv"] else None
            words, group = ACTION_WORDS.get((r["action"], r["status"]), (r["status"], r["status"]))
            r["what"], r["group"] = words, group if group in STATUS_GROUPS else "failed"
        rows += got
    rows.sort(key=lambda r: r["at"])
    return rows


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

    from gpufleet.errors import ConfigError
    from gpufleet.records import to_rfc3339
    from gpufleet.units import parse_duration

    rows = read_actions(state_paths or ["gpufleet-analyzer-notifier.db"])
    if since:
        cut = time.time() - parse_duration(since, "--since", ConfigError)
        rows = [r for r in rows if r["at"] >= cut]
    if groups:
        rows = [r for r in rows if r["group"] in groups]
    for r in rows:
        if as_json:
            click.echo(json.dumps({k: r[k] for k in ("at", "what", "group", "sink", "grp", "action", "status",
                                                     "argv", "rc", "seconds", "detail", "output", "state")}))
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
