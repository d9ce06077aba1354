"""The action sink's audit trail, read back from notifier state files: what ``gpufleet actions``
prints and what an incident page shows under "Remediation".

Read-only: a state file is opened with SQLite's ``mode=ro`` and never created. Each row of a
state file's ``action_log`` (see :mod:`gpufleet.analyzer.alerting.notifier`) comes back as a dict
with its columns plus ``what`` (the words a person reads: ``refused (budget)``), ``group`` (the
``gpufleet actions --status`` group it belongs to), ``state`` (the file it came from) and
``incidents`` (the keys of the incidents of its group, as that state file knows them; the group's
own key once the group has been pruned).
"""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path

from gpufleet.errors import ConfigError

# action_log (action, status) -> (words shown, the --status group it belongs to)
ACTION_WORDS = {
    ("firing", "ok"): ("run", "run"),
    ("resolved", "ok"): ("undone", "undone"),
    ("firing", "ran-before"): ("run (before a restart)", "run"),
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
DEFAULT_STATE = "gpufleet-analyzer-notifier.db"


def read_actions(state_paths) -> list[dict]:
    """The action logs of these notifier state files, oldest first (read-only: never creates one);
    a missing or foreign file is a ConfigError naming it."""
    rows = []
    for p in state_paths:
        if not Path(p).is_file():
            raise ConfigError(f"--state {p}: no such state file (the analyzer's --state; default "
                              f"{DEFAULT_STATE} in its working directory)")
        try:
            db = sqlite3.connect(f"file:{Path(p).resolve()}?mode=ro", uri=True, timeout=10)
            try:
                cur = db.execute("SELECT sink, grp, action, at, status, argv, rc, seconds, output, detail "
                                 "FROM action_log ORDER BY id")
                cols = [c[0] for c in cur.description]
                got = [dict(zip(cols, r, strict=True)) for r in cur.fetchall()]
                members: dict[str, list[str]] = {}
                for grp, key in db.execute("SELECT grp, key FROM incident WHERE grp IN "
                                           "(SELECT grp FROM action_log) ORDER BY rowid"):
                    members.setdefault(grp, []).append(key)
            finally:
                db.close()
        except sqlite3.Error as exc:
            raise ConfigError(f"--state {p}: not a notifier state file ({exc})") from None
        for r in got:
            r["state"] = str(p)
            r["argv"] = json.loads(r["argv"]) if r["argv"] else None
            r["incidents"] = members.get(r["grp"]) or [r["grp"]]
            words, group = ACTION_WORDS.get((r["action"], r["status"]), (r["status"], r["status"]))
            r["what"], r["group"] = words, group if group in STATUS_GROUPS else "failed"
        rows += got
    rows.sort(key=lambda r: r["at"])
    return rows


def by_incident(rows: list[dict]) -> dict[str, list[dict]]:
    """``rows`` of :func:`read_actions` under each incident key they acted for, oldest first."""
    out: dict[str, list[dict]] = {}
    for r in rows:
        for k in r["incidents"]:
            out.setdefault(k, []).append(r)
    return out
