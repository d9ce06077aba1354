"""One flag name per concept across subcommands, with the old spellings kept for one release.

The names: ``--influx-url``, ``--influx-api``, ``--influx-db``, ``--influx-bucket``,
``--influx-org``, ``--influx-token-file``, ``--influx-user``. An option declared with
``cls=Renamed, old=("--db",)`` also accepts its old spelling, hidden from ``--help``, and says
on stderr that the spelling is deprecated; giving both spellings is a usage error (exit 2).
"""

from __future__ import annotations

import click

_ABSENT = object()


def _given(opts, key: str) -> bool:
    v = opts.get(key, _ABSENT)
    return v is not _ABSENT and type(v).__name__ != "Sentinel"  # click >= 8.2 marks absent as UNSET


class Renamed(click.Option):
    """A click option that still accepts its ``old`` spellings, with a deprecation warning."""

    def __init__(self, *args, old: tuple[str, ...] | list[str] = (), **kwargs):
        super().__init__(*args, **kwargs)
        self.old = tuple(old)

    @property
    def _old_dest(self) -> str:
        return f"{self.name}__deprecated_spelling"

    def add_to_parser(self, parser, ctx: click.Context) -> None:
        super().add_to_parser(parser, ctx)
        if self.old:
            parser.add_option(obj=self, opts=self.old, dest=self._old_dest, action="store", nargs=self.nargs)

    def consume_value(self, ctx: click.Context, opts):
        if _given(opts, self._old_dest):
            new, old = self.opts[0], "/".join(self.old)
            if _given(opts, self.name):
                raise click.UsageError(f"{new} and {old} are the same option: give {new} only", ctx)
            click.echo(f"warning: {old} is deprecated and goes in the next release: use {new}", err=True)
            opts = {**opts, self.name: opts[self._old_dest]}
        return super().consume_value(ctx, opts)
