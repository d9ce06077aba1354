"""The ``gpufleet`` command: one entry point, subcommands loaded lazily.

Each subcommand lives beside the code it drives (``gpufleet.agent.cli``, ``gpufleet.analyzer.cli``, ...) and
is imported only when used, so ``gpufleet agent`` never imports the analyzer's heavy
dependencies.
"""

from __future__ import annotations

import importlib
import sys

import click

from gpufleet import __version__
from gpufleet.errors import GpufleetError

# name -> "module:attribute" of a click command or group
SUBCOMMANDS = {
    "agent": ("gpufleet.agent.cli:agent", "Run the node agent or print one poll."),
    "canary": ("gpufleet.agent.canary_cli:canary", "Run the SDC canary once (job boundaries, drills)."),
    "sim": ("gpufleet.sim.cli:sim", "Generate a synthetic fleet with injected faults."),
    "replay": ("gpufleet.sim.cli:replay", "Load a simulated fleet into InfluxDB."),
    "analyze": ("gpufleet.analyzer.cli:analyze", "Detect incidents in fleet telemetry."),
    "eval": ("gpufleet.analyzer.cli:eval_cmd", "Score incidents against ground truth."),
    "report": ("gpufleet.analyzer.alerting.cli:report", "Write HTML incident pages with plots."),
    "actions": ("gpufleet.analyzer.alerting.cli:actions",
                "List what the action sink ran, dry-ran, refused and undone."),
    "dashboards": ("gpufleet.dashboards.cli:dashboards", "Export Grafana dashboards and provisioning."),
    "demo": ("gpufleet.demo:demo", "Run the whole pipeline on a synthetic fleet."),
}


# Examples shown at the end of each command's --help (a test parses every one of them)
EXAMPLES = {
    "agent once": ["gpufleet agent once",
                   "gpufleet agent once --backend recorded:nvml_dump.json --format lp"],
    "agent run": ["gpufleet agent run --config /etc/gpufleet/agent.toml",
                  "gpufleet agent run --backend sim --exporter file --file-dir /tmp/gpufleet"],
    "agent check": ["gpufleet agent check --config /etc/gpufleet/agent.toml"],
    "actions": ["gpufleet actions --state /var/lib/gpufleet/notifier.db --since 24h",
                "gpufleet actions --state notifier.db --status refused --json"],
    "agent resend-rejected": ["gpufleet agent resend-rejected --config /etc/gpufleet/agent.toml"],
    "canary": ["gpufleet canary --gpu 0 --json", "gpufleet canary --gpu cpu --engine numpy"],
    "sim": ["gpufleet sim --scenario mixed --nodes 4 --duration 6h --out fleet"],
    "replay": ["gpufleet replay fleet --influx-url http://localhost:8086 --influx-db gpufleet",
               "gpufleet replay fleet --influx-url http://localhost:8086 --influx-api v2 "
               "--influx-bucket gpufleet --influx-org ops --influx-token-file token"],
    "analyze": ["gpufleet analyze --input fleet/telemetry.lp.gz --out incidents.jsonl",
                "gpufleet analyze --influx-url http://localhost:8086 --influx-db gpufleet --since 6h "
                "--sink console --sink slack=https://hooks.slack.com/services/XXX --state notifier.db",
                "gpufleet analyze --config /etc/gpufleet/analyzer.toml --follow"],
    "eval": ["gpufleet eval --truth fleet/truth.jsonl --incidents incidents.jsonl"],
    "report": ["gpufleet report --incidents incidents.jsonl --input fleet/telemetry.lp.gz --out pages",
               "gpufleet report --incidents incidents.jsonl --input fleet/ --out pages --state notifier.db"],
    "dashboards export": ["gpufleet dashboards export --out /tmp/grafana --influx-url http://influxdb:8086 "
                          "--influx-db gpufleet"],
    "dashboards generate": ["gpufleet dashboards generate --check"],
    "dashboards preview": ["gpufleet dashboards preview --influx-url http://localhost:8086 "
                           "--start 2026-11-20T00:00:00Z --end 2026-11-20T06:00:00Z --out /tmp/img"],
    "demo": ["gpufleet demo", "gpufleet demo --nodes 2 --duration 2h --out /tmp/demo --sink console"],
}


def _with_examples(cmd: click.Command, path: str) -> click.Command:
    """Attach the examples of ``path`` (and of its subcommands) to their --help, once."""
    if isinstance(cmd, click.Group):
        if not getattr(cmd, "_gpufleet_examples", False):  # a group may load its commands lazily
            load = cmd.get_command
            cmd.get_command = lambda ctx, name: (  # type: ignore[method-assign,assignment]
                None if (sub := load(ctx, name)) is None else _with_examples(sub, f"{path} {name}"))
            cmd._gpufleet_examples = True  # type: ignore[attr-defined]
    elif path in EXAMPLES and not cmd.epilog:
        cmd.epilog = "\b\nExamples:\n" + "\n".join(f"  {e}" for e in EXAMPLES[path])
    return cmd


class LazyGroup(click.Group):
    def list_commands(self, ctx):
        return sorted(SUBCOMMANDS)

    def get_command(self, ctx, name):
        if name not in SUBCOMMANDS:
            return None
        target, help_text = SUBCOMMANDS[name]
        module, attr = target.split(":")
        try:
            return _with_examples(getattr(importlib.import_module(module), attr), name)
        except (ImportError, AttributeError) as exc:
            # A missing optional dependency (e.g. the analyzer extra on a lean node)
            missing = getattr(exc, "name", None) or str(exc)
            from gpufleet.extras import message

            line = message(getattr(exc, "name", None), name)

            @click.command(name=name, help=help_text, context_settings={"ignore_unknown_options": True})
            @click.argument("args", nargs=-1, type=click.UNPROCESSED)
            def unavailable(args):
                raise GpufleetError(line or (
                    f"'gpufleet {name}' is not available here ({missing}); "
                    "install the matching extra, e.g. pip install 'gpufleet[all]'"
                ))

            return unavailable


@click.group(cls=LazyGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, "-V", "--version", prog_name="gpufleet")
def cli():
    """gpufleet: observability for GPU fleets."""


def main(argv: list[str] | None = None) -> int:
    from gpufleet import logs

    logs.setup()  # every log line escaped (gpufleet.logs); the agent sets its own format
    try:
        cli.main(args=argv, prog_name="gpufleet", standalone_mode=False)
    except GpufleetError as exc:
        click.echo(f"gpufleet: error: {logs.escape(str(exc))}", err=True)
        return exc.exit_code
    except click.exceptions.Exit as exc:
        return exc.exit_code
    except click.Abort:
        click.echo("gpufleet: aborted", err=True)
        return 130
    except click.ClickException as exc:
        exc.show()
        return exc.exit_code
    except ModuleNotFoundError as exc:  # an optional dependency this installation lacks
        from gpufleet.extras import command_of, message

        line = message(exc.name, command_of(sys.argv[1:] if argv is None else argv))
        if line is None:
            raise
        click.echo(f"gpufleet: error: {line}", err=True)
        return 2
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:
        return 0
    return 0


if __name__ == "__main__":
    sys.exit(main())
