"""The ``action`` sink: run a configured command when an incident fires (and, optionally, resolves).

Remediation through the scheduler: the shipped examples drain a Slurm node
(``scontrol update NodeName={host} State=DRAIN Reason=...``) and cordon a Kubernetes node
(``kubectl cordon {host}``); see packaging/examples/ and docs/alerting.md.

Rules pick the command per incident kind and severity (the first rule that matches wins)::

    [[sink]]
    type = "action"
    dry_run = false          # default true: log and record what would run, run nothing
    max_per_hour = 4         # safety valve: at most 4 commands per hour, fleet-wide
    timeout = 20             # deadline per command (s); a hanging command is killed
    resume = true            # run resolve_command when the incident resolves

    [[sink.rule]]
    kinds = ["sdc", "gpu_lost", "memory_errors"]      # default: every kind
    severities = ["critical"]                          # default: ["critical"]
    command = ["scontrol", "update", "NodeName={host}", "State=DRAIN", "Reason=gpufleet: {kind} {where}"]
    resolve_command = ["scontrol", "update", "NodeName={host}", "State=RESUME"]

A command is an argument list, run without a shell: ``{name}`` placeholders in each argument
are filled from the alert by name only (``key``, ``status``, ``kind``, ``severity``, ``host``,
``gpu``, ``gpus``, ``link``, ``cluster``, ``rack``, ``where``, ``title``, ``action``,
``runbook_url``, ``jobs``, ``start``, ``page_url``), so incident text can never become shell
syntax. The same values are in the environment as ``GPUFLEET_<NAME>``. An argument whose
placeholder has no value (``{gpu}`` on a node incident) makes the command fail before it runs.

Every command (run, dry-run, suppressed by the rate limit, failed) is logged on one line and
recorded in the notifier's state (``Notifier.actions()``). A failing, hanging or missing
command, or a node the scheduler does not know, is a failed delivery of this sink only: the
other sinks page as usual, and the resolve of a firing that was not carried out is skipped
(nothing to undo). Failures are not retried: a person looks at them.

The rate limit counts the commands of this sink (run or dry-run) in the last hour, in the
state file, so a restart does not reset it. With analyzer shards each shard has its own
state: give each ``max_per_hour / shards``.
"""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import time

from gpufleet.analyzer.alerting.actions import render
from gpufleet.analyzer.alerting.base import Alert, Outcome, Sink, register

from gpufleet.errors import ConfigError
from gpufleet.records import KINDS, SEVERITIES, to_rfc3339

log = logging.getLogger("gpufleet.alerting")

OPTION_KEYS = {"dry_run", "max_per_hour", "timeout", "resume", "rule"}
RULE_KEYS = {"kinds", "severities", "command", "resolve_command"}
OUTPUT_MAX = 500


def alert_values(alert: Alert) -> dict:
    """Placeholder values of an alert: strings, None where absent."""
    from gpufleet.analyzer.alerting.actions import where

    v = {"key": alert.key, "status": alert.status, "kind": alert.kind, "severity": alert.severity,
         "host": alert.host, "gpu": alert.gpu, "link": alert.link, "cluster": alert.cluster,
         "rack": alert.rack, "where": where(alert), "title": alert.title or alert.summary,
         "action": alert.action, "runbook_url": alert.runbook_url, "start": to_rfc3339(alert.start),
         "page_url": alert.page_url,
         "gpus": ",".join(map(str, alert.gpus)) or None, "jobs": ",".join(alert.jobs) or None}
    return {k: (None if x is None or x == "" else str(x)) for k, x in v.items()}


def _argv(label: str, key: str, value) -> list[str]:
    if not isinstance(value, list) or not value or not all(isinstance(a, str) and a for a in value):
        raise ConfigError(f"{label}: {key} must be a non-empty list of strings (an argument list, "
                          f"run without a shell)")
    return value


def _names(label: str, key: str, value, allowed) -> list[str]:
    if not isinstance(value, list) or not all(isinstance(x, str) for x in value):
        raise ConfigError(f"{label}: {key} must be a list of strings")
    bad = [x for x in value if x not in allowed]
    if bad:
        raise ConfigError(f"{label}: {key}: unknown {bad[0]!r} (one of {', '.join(allowed)})")
    return value


def check_options(label: str, spec: dict) -> dict:
    """The action sink's own keys, validated; a ConfigError names the sink and the key."""
    rules = spec.get("rule")
    if not isinstance(rules, list) or not rules or not all(isinstance(r, dict) for r in rules):
        raise ConfigError(f"{label}: needs at least one [[sink.rule]] with a command")
    out_rules = []
    for i, r in enumerate(rules, 1):
        rl = f"{label} rule #{i}"
        unknown = set(r) - RULE_KEYS
        if unknown:
            raise ConfigError(f"{rl}: unknown key(s) {', '.join(sorted(unknown))}")
        if "command" not in r:
            raise ConfigError(f"{rl}: missing command")
        out_rules.append({
            "kinds": _names(rl, "kinds", r.get("kinds", list(KINDS)), KINDS),
            "severities": _names(rl, "severities", r.get("severities", ["critical"]), SEVERITIES),
            "command": _argv(rl, "command", r["command"]),
            "resolve_command": _argv(rl, "resolve_command", r["resolve_command"])
            if "resolve_command" in r else None,
        })
    opts = {"rules": out_rules}
    for k, default in (("dry_run", True), ("resume", False)):
        v = spec.get(k, default)
        if not isinstance(v, bool):
            raise ConfigError(f"{label}: {k} must be true or false")
        opts[k] = v
    mph = spec.get("max_per_hour", 10)
    if not isinstance(mph, int) or isinstance(mph, bool) or mph < 0:
        raise ConfigError(f"{label}: max_per_hour must be a whole number >= 0 (0: never run a command)")
    opts["max_per_hour"] = mph
    return opts


def _reap(proc: subprocess.Popen) -> bytes:
    """Output of a killed command; a daemon it started in another session may keep the pipe open,
    so the pipe is read for at most 2 s more."""
    try:
        out, _ = proc.communicate(timeout=2)
        return out or b""
    except subprocess.TimeoutExpired:
        proc.stdout.close()
        proc.wait()
        return b""


@register
class ActionSink(Sink):
    """Runs a command per incident; see the module docstring. ``delivery.timeout`` is the
    command's deadline."""

    type = "action"

    def __init__(self, name="action", url="", delivery=None, rules=(), dry_run: bool = True,
                 resume: bool = False, max_per_hour: int = 10, **options):
        super().__init__(name, url, delivery, **options)
        self.rules = list(rules)
        self.dry_run = dry_run
        self.resume = resume
        self.max_per_hour = max_per_hour
        self.recent = lambda since: 0  # commands since a time; the notifier binds its state

    def secrets(self) -> list[str]:
        return []

    def __repr__(self) -> str:
        return f"<ActionSink {self.name} {'dry-run' if self.dry_run else 'live'}>"

    def bind(self, notifier) -> None:
        self.recent = lambda since: notifier.count_actions(self.name, since)

    def rule_for(self, alert: Alert) -> dict | None:
        for r in self.rules:
            if alert.kind in r["kinds"] and alert.severity in r["severities"]:
                return r
        return None

    def render(self, alert: Alert) -> list[str] | None:
        """The argument list this alert runs (None: no rule, or no resume); raises ValueError
        naming a placeholder that has no value."""
        rule = self.rule_for(alert)
        if rule is None:
            return None
        template = rule["command"] if alert.status == "firing" else rule["resolve_command"]
        if template is None or (alert.status == "resolved" and not self.resume):
            return None
        vals = alert_values(alert)
        argv = []
        for a in template:
            s = render(a, vals)
            if s is None:
                raise ValueError(f"argument {a!r} has a placeholder with no value for this incident")
            argv.append(s)
        return argv

    def deliver(self, alert: Alert) -> Outcome:
        what = f"{alert.status} {alert.kind} on {alert.host or alert.rack or 'fleet'} ({alert.key})"
        try:
            argv = self.render(alert)
        except ValueError as exc:
            return self._done("failed", what, None, str(exc))
        if argv is None:
            return Outcome("sent", "no rule for this incident")
        if alert.status == "firing":
            if self.max_per_hour == 0 or self.recent(time.time() - 3600) >= self.max_per_hour:
                return self._done("suppressed", what, argv,
                                  f"rate limit reached: max_per_hour = {self.max_per_hour} commands in "
                                  f"the last hour; not run")
        if self.dry_run:
            return self._done("dry-run", what, argv, "dry_run = true; not run")
        env = dict(os.environ)
        env.update({f"GPUFLEET_{k.upper()}": v for k, v in alert_values(alert).items() if v is not None})
        t0 = time.monotonic()
        try:
            proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                    stderr=subprocess.STDOUT, env=env, start_new_session=True)
        except OSError as exc:
            why = "command not found" if isinstance(exc, FileNotFoundError) else exc.strerror
            return self._done("failed", what, argv, f"{argv[0]}: {why}")
        try:
            out, _ = proc.communicate(timeout=self.delivery.timeout)
        except subprocess.TimeoutExpired:
            try:
                os.killpg(proc.pid, signal.SIGKILL)  # the command and whatever it started
            except ProcessLookupError:
                pass
            out = _reap(proc)
            if proc.returncode == 0:  # it finished; a process it left behind held the output open
                return self._done("ok", what, argv, "", time.monotonic() - t0, 0, out)
            return self._done("failed", what, argv, f"timed out after {self.delivery.timeout:g} s; killed",
                              time.monotonic() - t0, output=out)
        took = time.monotonic() - t0
        if proc.returncode != 0:
            return self._done("failed", what, argv, f"exit status {proc.returncode}", took,
                              proc.returncode, out)
        return self._done("ok", what, argv, "", took, 0, out)

    def _done(self, status: str, what: str, argv, detail: str, seconds: float | None = None,
              rc: int | None = None, output: bytes | None = None) -> Outcome:
        text = (output or b"").decode("utf-8", "replace").strip()[-OUTPUT_MAX:]
        cmd = " ".join(argv) if argv else "-"
        line = f"action {self.name}: {what}: {status}: {cmd}"
        if detail:
            line += f" ({detail})"
        if text and status != "ok":
            line += f": {' '.join(text.split())}"
        (log.info if status in ("ok", "dry-run") else log.error)("%s", line)
        record = {"status": status, "argv": argv, "rc": rc, "output": text, "detail": detail,
                  "seconds": None if seconds is None else round(seconds, 3)}
        return Outcome("sent" if status in ("ok", "dry-run") else "failed", detail or status, record=record)
