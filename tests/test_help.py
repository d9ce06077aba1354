"""Help that teaches: every command's --help ends with examples that parse, -V prints the version."""

from __future__ import annotations

import shlex

import click
import pytest

from gpufleet import __version__
from gpufleet.cli import EXAMPLES, cli, main


def _leaves():
    out = []

    def walk(cmd, path):
        if isinstance(cmd, click.Group):
            ctx = click.Context(cmd)
            for name in cmd.list_commands(ctx):
                walk(cmd.get_command(ctx, name), f"{path} {name}".strip())
        else:
            out.append((path, cmd))

    walk(cli, "")
    return out


LEAVES = _leaves()


def test_every_command_has_examples():
    assert {p for p, _ in LEAVES} == set(EXAMPLES)


@pytest.mark.parametrize("path,cmd", LEAVES, ids=[p for p, _ in LEAVES])
def test_help_ends_with_examples_that_parse(path, cmd):
    text = cmd.get_help(click.Context(cmd, info_name=path.split()[-1]))
    assert "Examples:" in text and text.index("Examples:") > text.index("--help")
    for example in EXAMPLES[path]:
        words = shlex.split(example)
        assert words[: 1 + len(path.split())] == ["gpufleet", *path.split()], example
        assert example in text
        # the example's options and arguments are the command's own (parsed, not run)
        cmd.make_context(path.split()[-1], words[1 + len(path.split()):])


def test_analyze_help_lists_the_sink_types():
    from gpufleet.analyzer.alerting import REGISTRY

    cmd = dict(LEAVES)["analyze"]
    text = " ".join(cmd.get_help(click.Context(cmd, info_name="analyze")).split())
    assert "TYPE: " + ", ".join(sorted(REGISTRY)) in text


@pytest.mark.parametrize("flag", ["-V", "--version"])
def test_version_flag(flag, capsys):
    assert main([flag]) == 0
    assert capsys.readouterr().out.strip() == f"gpufleet, version {__version__}"
