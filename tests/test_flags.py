"""One flag name per concept: the old spellings still work for one release, with a warning."""

from __future__ import annotations

import click
import pytest
from click.testing import CliRunner

from gpufleet.cli import main as gpufleet_main
from gpufleet.flags import Renamed


@click.command()
@click.option("--influx-db", "db", cls=Renamed, old=["--db"], default="gpufleet")
@click.option("--influx-token-file", "token_file", cls=Renamed, old=["--token-file"])
def toy(db, token_file):
    click.echo(f"db={db} token_file={token_file}")


def test_new_names_silent_old_names_warn():
    r = CliRunner().invoke(toy, ["--influx-db", "a", "--influx-token-file", "t"])
    assert r.exit_code == 0 and r.stdout == "db=a token_file=t\n" and r.stderr == ""
    r = CliRunner().invoke(toy, ["--db", "b", "--token-file", "u"])
    assert r.exit_code == 0 and r.stdout == "db=b token_file=u\n"
    assert "--db is deprecated" in r.stderr and "use --influx-db" in r.stderr
    assert "--token-file is deprecated" in r.stderr
    r = CliRunner().invoke(toy, [])
    assert r.exit_code == 0 and r.stdout == "db=gpufleet token_file=None\n" and r.stderr == ""


def test_both_spellings_is_a_usage_error():
    r = CliRunner().invoke(toy, ["--db", "b", "--influx-db", "a"])
    assert r.exit_code == 2 and "same option" in r.stderr


def test_help_shows_only_the_new_names():
    r = CliRunner().invoke(toy, ["--help"])
    assert "--influx-db" in r.stdout and "--db" not in r.stdout.replace("--influx-db", "")


@pytest.mark.parametrize("argv,new", [
    (["analyze", "--influx-url", "http://127.0.0.1:9", "--db", "x", "--since", "1h"], "--influx-db"),
    (["replay", "/nonexistent", "--influx-url", "http://127.0.0.1:9", "--token-file", "/x", "--bucket", "b",
      "--org", "o", "--influx-api", "v2"], "--influx-token-file"),
])
def test_real_subcommands_accept_the_old_names(argv, new, capsys):
    gpufleet_main(argv)  # fails later (nothing listens), after the flags were parsed
    err = capsys.readouterr().err
    assert f"use {new}" in err and "no such option" not in err.lower()


def test_every_subcommand_uses_the_one_name_per_concept():
    from gpufleet.cli import cli

    # the concepts and their one spelling; an option spelt another way is a second name
    forbidden = {"--db", "--bucket", "--org", "--token-file", "--url", "--user"}
    seen = []

    names = []

    def walk(cmd, path):
        names.append(path)
        for p in cmd.params:
            seen.extend((path, o) for o in getattr(p, "opts", []) if o in forbidden)
        if isinstance(cmd, click.Group):
            ctx = click.Context(cmd)
            for name in cmd.list_commands(ctx):
                walk(cmd.get_command(ctx, name), f"{path} {name}")

    walk(cli, "gpufleet")
    assert "gpufleet agent run" in names and "gpufleet dashboards preview" in names
    assert not seen, seen
