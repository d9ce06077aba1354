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
    "dashboards": ("gpufleet.dashboards.cli:dashboards", "Export Grafana dashboards and provisioning."),
    "demo": ("gpufleet.demo:demo", "Run the whole pipeline on a synthetic fleet."),
}


class LazyGroup(click.Group):
    def list_commands(self, ctx):
        return sorted(SUBCOMMANDS)

    def get_command(self, ctx, name):
        if name not in SUBCOMMANDS:
            return None
        target, help_text = SUBCOMMANDS[name]
        module, attr = target.split(":")
        try:
            return getattr(importlib.import_module(module), attr)
        except (ImportError, AttributeError) as exc:
            # A missing optional dependency (e.g. the analyzer extra on a lean node)
            missing = getattr(exc, "name", None) or str(exc)

            @click.command(name=name, help=help_text, context_settings={"ignore_unknown_options": True})
            @click.argument("args", nargs=-1, type=click.UNPROCESSED)
            def unavailable(args):
                raise GpufleetError(
                    f"'gpufleet {name}' is not available here ({missing}); "
                    "install the matching extra, e.g. pip install 'gpufleet[all]'"
                )

            return unavailable


@click.group(cls=LazyGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, "-V", "--version", prog_name="gpufleet")
def cli():
    """gpufleet: observability for GPU fleets."""


def main(argv: list[str] | None = None) -> int:
    try:
        cli.main(args=argv, prog_name="gpufleet", standalone_mode=False)
    except GpufleetError as exc:
        click.echo(f"gpufleet: error: {exc}", err=True)
        return exc.exit_code
    except click.exceptions.Exit as exc:
        return exc.exit_code
    except click.Abort:
        click.echo("gpufleet: aborted", err=True)
        return 130
    except click.ClickException as exc:
        exc.show()
        return exc.exit_code
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:
        return 0
    return 0


if __name__ == "__main__":
    sys.exit(main())
