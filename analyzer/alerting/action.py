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

Before a command runs, in this order (each refusal is recorded, logged on one line, and a failed
delivery, so nothing is undone later; the other sinks get a page saying what was refused, why,
and the command to run by hand):

- **unsafe name**: the incident's host (whatever placeholders the command uses), and any
  ``{host}``, ``{cluster}`` or ``{rack}`` it uses, must be one plain node name
  (:mod:`gpufleet.hosts`); an unsafe host tag reaches here only as its ``unsafe:`` display name.
- **rate**: ``max_per_hour`` (above).
- **verification**: the rule's optional ``verify`` command (``resolve_verify`` before the
  resolve command) must exit 0 and, when ``verify_expect`` (``resolve_verify_expect``) is
  given, its output must match that regular expression (``re.search``; placeholders are filled
  escaped; write a literal brace as ``{{``). The shipped Slurm rule checks that ``scontrol show
  node -o {host}`` describes exactly that one node, not drained already, and, before resuming,
  that the drain reason is still this incident's: a node a person drained is never resumed.
  ``resume = true`` needs a ``resolve_verify`` on every rule with a ``resolve_command``.
- **disruption budget**: at most ``budget_nodes`` distinct nodes (default 2) and at most
  ``budget_percent`` % of a cluster or rack (default 5, never less than one node) within
  ``budget_window`` seconds (default 3600), across every analyzer process sharing the ledger
  file ``budget_ledger`` (default: ``remediation-budget.jsonl`` beside the state file); see
  :mod:`gpufleet.analyzer.alerting.budget`. The first refusal in a window pages a person once
  ("remediation budget exhausted"). A dry run keeps its own ledger (``<ledger>.dry-run``): its
  log shows what the budget would refuse, and the live budget stays whole.
"""

from __future__ import annotations

import logging
import os
import re
import signal
import subprocess
import time
import unicodedata
from pathlib import Path

from gpufleet.analyzer.alerting.actions import PAGE_KINDS, catalogue, render, runbook_url
from gpufleet.analyzer.alerting.base import Alert, Outcome, Sink, register
from gpufleet.analyzer.alerting.budget import Ledger

from gpufleet import hosts
from gpufleet.errors import ConfigError
from gpufleet.options import Option
from gpufleet.records import KINDS, SEVERITIES, to_rfc3339

log = logging.getLogger("gpufleet.alerting")

LOG_LEVELS = {"ok": logging.INFO, "dry-run": logging.INFO, "ran-before": logging.WARNING}  # else ERROR
RULE_KEYS = {"kinds", "severities", "command", "resolve_command", "verify", "verify_expect",
             "resolve_verify", "resolve_verify_expect"}
OUTPUT_MAX = 500
VALUE_MAX = 1000
NAME_KEYS = ("host", "cluster", "rack")  # placeholders that name scheduler objects: plain names only


class Unsafe(ValueError):
    """A value that would name more, or other, than one node."""


def clean(text: str) -> str:
    """``text`` with control and format characters escaped (``\\x00``, ``\\n``, ``\\u202e``),
    at most VALUE_MAX characters: safe in an argument, the environment and one log line."""
    if text.isprintable() and len(text) <= VALUE_MAX:
        return text
    out = "".join(ascii(c)[1:-1] if unicodedata.category(c)[0] in "CZ" and c != " " else c
                  for c in text[:VALUE_MAX])
    return out if len(text) <= VALUE_MAX else out + "..."


def alert_values(alert: Alert) -> dict:
    """Placeholder values of an alert: strings, None where absent."""
    from gpufleet.analyzer.alerting.actions import where

    v = {"key": alert.key, "status": alert.status, "kind": alert.kind, "severity": alert.severity,
         "host": alert.host, "gpu": alert.gpu, "link": alert.link, "cluster": alert.cluster,
         "rack": alert.rack, "where": where(alert), "title": alert.title or alert.summary,
         "action": alert.action, "runbook_url": alert.runbook_url, "start": to_rfc3339(alert.start),
         "page_url": alert.page_url,
         "gpus": ",".join(map(str, alert.gpus)) or None, "jobs": ",".join(alert.jobs) or None}
    return {k: (None if x is None or x == "" else clean(str(x))) for k, x in v.items()}


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


def check_rules(label: str, opts: dict) -> dict:
    """The action sink's keywords from its validated options: its ``[[sink.rule]]`` tables checked
    (what the key's type cannot say); a ConfigError names the sink, the rule and the key."""
    out_rules = []
    for i, r in enumerate(opts.pop("rule"), 1):
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
        for cmd, expect in (("verify", "verify_expect"), ("resolve_verify", "resolve_verify_expect")):
            out_rules[-1][cmd] = _argv(rl, cmd, r[cmd]) if cmd in r else None
            pattern = r.get(expect)
            if pattern is not None:
                if cmd not in r:
                    raise ConfigError(f"{rl}: {expect} needs {cmd}")
                if not isinstance(pattern, str):
                    raise ConfigError(f"{rl}: {expect} must be a string (a regular expression)")
                try:
                    re.compile(render(pattern, _SAMPLE) or "")
                except re.error as exc:
                    raise ConfigError(f"{rl}: {expect}: not a regular expression: {exc}") from None
                if render(pattern, _SAMPLE) is None:
                    raise ConfigError(f"{rl}: {expect}: unknown placeholder (write a literal brace as "
                                      f"{{{{ or }}}})")
            out_rules[-1][expect] = pattern
    if not out_rules:
        raise ConfigError(f"{label}: needs at least one [[sink.rule]] with a command")
    for i, r in enumerate(out_rules, 1):
        if opts["resume"] and r["resolve_command"] is not None and r["resolve_verify"] is None:
            raise ConfigError(f"{label} rule #{i}: resume = true needs resolve_verify: a resolve undoes "
                              f"nothing before a check that the node is still held for this incident "
                              f"(a person may have drained it since)")
    return {**opts, "rules": out_rules, "budget_ledger": opts["budget_ledger"] or None}


_SAMPLE = {k: "x" for k in ("key", "status", "kind", "severity", "host", "gpu", "link", "cluster", "rack",
                            "where", "title", "action", "runbook_url", "start", "page_url", "gpus", "jobs")}


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
    acts = True
    needs_url = False
    delivery_defaults = {"rate_limit": None, "timeout": 30.0}  # timeout: the command's deadline
    options = (
        Option("rule", "tables", [], "at least one `[[sink.rule]]` table: `kinds`, `severities`, "
               "`command`, `resolve_command`, `verify`, `verify_expect`, `resolve_verify`, "
               "`resolve_verify_expect` (see below)"),
        Option("dry_run", "bool", True, "log and record what would run; run nothing"),
        Option("resume", "bool", False, "a resolved incident runs its rule's resolve_command"),
        Option("max_per_hour", "int", 10, "commands per hour at most; 0: never run a command", 0),
        Option("budget_nodes", "int", 2, "nodes held at once at most; 0: never act", 0),
        Option("budget_percent", "float", 5.0, "share of the fleet held at once at most", 0.0, 100.0,
               lo_open=True),
        Option("budget_window", "duration", 3600.0, "the budget's window", 0.0, lo_open=True),
        Option("budget_ledger", "path", "", "the budget's ledger file; empty: beside the notifier's state"),
    )

    @classmethod
    def configure(cls, label: str, kwargs: dict) -> dict:
        return check_rules(label, kwargs)

    def __init__(self, name="action", url="", delivery=None, rules=(), dry_run: bool = True,
                 resume: bool = False, max_per_hour: int = 10, budget_nodes: int = 2,
                 budget_percent: float = 5.0, budget_window: float = 3600.0,
                 budget_ledger: str | None = None, **options):
        super().__init__(name, url, delivery, **options)
        self.rules = list(rules)
        self.dry_run = dry_run
        self.resume = resume
        self.max_per_hour = max_per_hour
        self.budget = (budget_nodes, budget_percent, budget_window, budget_ledger)
        self.ledger: Ledger | None = None
        self.notifier = None
        self.recent = lambda since: 0  # commands since a time; the notifier binds its state

    def secrets(self) -> list[str]:
        return []

    def __repr__(self) -> str:
        return f"<ActionSink {self.name} {'dry-run' if self.dry_run else 'live'}>"

    def bind(self, notifier) -> None:
        self.notifier = notifier
        self.recent = lambda since: notifier.count_actions(self.name, since)
        nodes, percent, window, path = self.budget
        path = Path(path) if path else Path(notifier.store.path).parent / "remediation-budget.jsonl"
        if self.dry_run:  # a dry run keeps its own ledger: it shows what the budget would refuse
            path = path.with_name(path.name + ".dry-run")
        self.ledger = Ledger(path, nodes, percent, window)

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
        return self.fill(template, alert)

    def fill(self, template: list[str], alert: Alert) -> list[str]:
        """``template`` filled from ``alert``; raises :class:`Unsafe` when the alert's host, or a
        ``{host}``/``{cluster}``/``{rack}`` the template uses, is not one plain node name, and
        ValueError naming a placeholder with no value."""
        if alert.host is not None and alert.host.startswith(hosts.UNSAFE_PREFIX):
            raise Unsafe(f"host {hosts.shown(alert.host)} stands for a host tag quarantined at ingest "
                         f"(not a plain node name); nothing is run for it")
        if alert.host is not None and not hosts.is_plain(alert.host):
            raise Unsafe(f"host {hosts.shown(alert.host)} is not a plain node name "
                         f"({hosts.problem(alert.host)}); nothing is run for it")
        vals = alert_values(alert)
        argv = []
        for a in template:
            for name in NAME_KEYS:
                if "{" + name in a and vals.get(name) is not None and not hosts.is_plain(vals[name]):
                    raise Unsafe(f"{name} {hosts.shown(vals[name])} is not a plain name "
                                 f"({hosts.problem(vals[name])}); nothing is run for it")
            s = render(a, vals)
            if s is None:
                raise ValueError(f"argument {a!r} has a placeholder with no value for this incident")
            argv.append(s)
        return argv

    def deliver(self, alert: Alert) -> Outcome:
        if alert.kind in PAGE_KINDS:
            return Outcome("sent", "a page of this sink's own")
        what = (f"{alert.status} {alert.kind} on {hosts.shown(alert.host or alert.rack or 'fleet')} "
                f"({hosts.shown(alert.key)})")
        firing = alert.status == "firing"
        try:
            argv = self.render(alert)
        except Unsafe as exc:
            return self._refuse("refused-unsafe", alert, what, None, str(exc))
        except ValueError as exc:
            return self._done("failed", what, None, str(exc))
        if argv is None:
            return Outcome("sent", "no rule for this incident")
        if firing and (self.max_per_hour == 0 or self.recent(time.time() - 3600) >= self.max_per_hour):
            return self._done("suppressed", what, argv,
                              f"rate limit reached: max_per_hour = {self.max_per_hour} commands in "
                              f"the last hour; not run")
        if self.dry_run:
            if firing:
                d = self._claim(alert)
                if not d.ok:
                    return self._done("refused-budget", what, argv, d.why + " (dry run: not run either way)")
            return self._done("dry-run", what, argv, "dry_run = true; not run")
        rule = self.rule_for(alert)
        check = rule["verify"] if firing else rule["resolve_verify"]
        if check is not None:
            why = self._verify(check, rule["verify_expect" if firing else "resolve_verify_expect"], alert)
            if why:
                if not firing:
                    return self._done("not-undone", what, argv, f"resolve_verify: {why}; the node is left as "
                                      "it is (a person may have taken it over)")
                earlier = self.ledger and self.ledger.acted_for(alert.host or "", alert.key, sink=self.name)
                if earlier:  # our own command, started before a restart, got there first
                    when = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(earlier["t"]))
                    return self._done("ran-before", what, argv,
                                      f"verify: {why}; this sink started this incident's command at {when} "
                                      f"(process {earlier.get('pid', '?')}, before a restart): the node's "
                                      "state is that command's outcome; not run again")
                return self._refuse("refused-verify", alert, what, argv, f"verify: {why}")
        if firing:
            d = self._claim(alert)
            if not d.ok:
                if d.page:
                    self._page_budget(alert, argv, d.why)
                return self._done("refused-budget", what, argv, d.why + "; run it by hand if it must be")
        return self._run(what, argv, alert)

    def _claim(self, alert: Alert):
        sizes = self.notifier.group_sizes(alert.cluster, alert.rack) if self.notifier else {}
        if self.ledger is None:
            from gpufleet.analyzer.alerting.budget import Decision

            return Decision(True)
        return self.ledger.claim(alert.host or "", alert.cluster, alert.rack, sizes, sink=self.name,
                                 key=alert.key)

    def _verify(self, template: list[str], expect: str | None, alert: Alert) -> str:
        """Why the verification fails ("" when it passes)."""
        argv = self.fill(template, alert)
        rc, out, why = self._exec(argv, alert)
        text = out.decode("utf-8", "replace")
        shown = " ".join(text.split())[-200:]
        if why:
            return f"{' '.join(argv)}: {why}"
        if rc != 0:
            return f"{' '.join(argv)} exited {rc}: {hosts.shown(shown, 200) or 'no output'}"
        if expect is not None:
            pattern = render(expect, {k: None if v is None else re.escape(v)
                                      for k, v in alert_values(alert).items()})
            if pattern is None or not re.search(pattern, text):
                return (f"{' '.join(argv)}: its output does not match verify_expect "
                        f"({hosts.shown(shown, 200) or 'no output'})")
        return ""

    def _exec(self, argv: list[str], alert: Alert) -> tuple[int | None, bytes, str]:
        """(exit status, output, why it did not finish: "" when it did)."""
        env = dict(os.environ)
        env.update({f"GPUFLEET_{k.upper()}": v for k, v in alert_values(alert).items() if v is not None})
        try:
            proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                    stderr=subprocess.STDOUT, env=env, start_new_session=True)
        except OSError as exc:
            why = "command not found" if isinstance(exc, FileNotFoundError) else exc.strerror
            return None, b"", f"{argv[0]}: {why}"
        try:
            out, _ = proc.communicate(timeout=self.delivery.timeout)
        except subprocess.TimeoutExpired:
            try:
                os.killpg(proc.pid, signal.SIGKILL)  # the command and whatever it started
            except ProcessLookupError:
                pass
            out = _reap(proc)
            if proc.returncode == 0:  # it finished; a process it left behind held the output open
                return 0, out, ""
            return None, out, f"timed out after {self.delivery.timeout:g} s; killed"
        return proc.returncode, out or b"", ""

    def _run(self, what: str, argv: list[str], alert: Alert) -> Outcome:
        t0 = time.monotonic()
        rc, out, why = self._exec(argv, alert)
        took = time.monotonic() - t0
        if why:
            if rc is None and not out and "timed out" not in why:
                return self._done("failed", what, argv, why)
            return self._done("failed", what, argv, why, took, output=out)
        if rc != 0:
            return self._done("failed", what, argv, f"exit status {rc}", took, rc, out)
        return self._done("ok", what, argv, "", took, 0, out)

    def _refuse(self, status: str, alert: Alert, what: str, argv, why: str) -> Outcome:
        out = self._done(status, what, argv, why)
        if alert.status == "firing" and self.notifier is not None:
            cmd = " ".join(argv) if argv else "(none: the incident names no single node)"
            self.notifier.page(Alert(
                key=f"action-refused:{alert.key}", status="firing", kind="remediation_refused",
                severity=alert.severity, start=time.time(), host=alert.host, cluster=alert.cluster,
                rack=alert.rack, incidents=[alert.key],
                title=f"Remediation refused for {hosts.shown(alert.key)}: {why}",
                summary=f"Remediation refused for {hosts.shown(alert.key)}",
                description=f"action sink {self.name} refused to act on {what}: {why}. Command: {cmd}",
                action=catalogue()["kind"]["remediation_refused"]["action"],
                runbook_url=self._runbook("remediation_refused")))
        return out

    def _page_budget(self, alert: Alert, argv: list[str], why: str) -> None:
        if self.notifier is None:
            return
        self.notifier.page(Alert(
            key=f"remediation-budget:{int(time.time())}", status="firing", kind="remediation_budget",
            severity="critical", start=time.time(), cluster=alert.cluster, rack=alert.rack,
            incidents=[alert.key],
            title="Remediation budget exhausted: the analyzer has stopped draining nodes",
            summary="Remediation budget exhausted",
            description=f"action sink {self.name}: {why}. Refused: {' '.join(argv)} "
                        f"(for {hosts.shown(alert.key)}); later refusals are not paged again in this window.",
            action=catalogue()["kind"]["remediation_budget"]["action"],
            runbook_url=self._runbook("remediation_budget")))

    def _runbook(self, kind: str) -> str | None:
        """The runbook of one of this sink's own pages, where the notifier links runbooks."""
        return runbook_url(kind, getattr(self.notifier, "runbook_base_url", None))

    def _done(self, status: str, what: str, argv, detail: str, seconds: float | None = None,
              rc: int | None = None, output: bytes | None = None) -> Outcome:
        text = (output or b"").decode("utf-8", "replace").strip()[-OUTPUT_MAX:]
        cmd = " ".join(argv) if argv else "-"
        line = f"action {self.name}: {what}: {status}: {cmd}"
        if detail:
            line += f" ({detail})"
        if text and status != "ok":
            line += f": {' '.join(text.split())}"
        line = clean(line)
        log.log(LOG_LEVELS.get(status, logging.ERROR), "%s", line)
        record = {"status": status, "argv": argv, "rc": rc, "output": text, "detail": detail,
                  "seconds": None if seconds is None else round(seconds, 3)}
        return Outcome("sent" if status in ("ok", "dry-run", "ran-before") else "failed", detail or status,
                       record=record)
