"""One flag vocabulary: every subcommand that talks to InfluxDB takes the same ``--influx-*``
flags from one definition (gpufleet.flags.INFLUX), and docs/operations.md's table says them."""

from __future__ import annotations

import re
from pathlib import Path

import click
import pytest

from gpufleet.cli import cli
from gpufleet.cli import main as gpufleet_main
from gpufleet.flags import INFLUX

ROOT = Path(__file__).resolve().parent.parent
INFLUX_COMMANDS = ("analyze", "replay", "demo", "dashboards export", "dashboards preview", "agent run",
                   "agent resend-rejected")


def _command(path: str) -> click.Command:
    cmd = cli
    for name in path.split():
        cmd = cmd.get_command(click.Context(cmd), name)
    return cmd


def _help(path: str) -> str:
    return _command(path).get_help(click.Context(_command(path), info_name=path.split()[-1]))


def _docs_table() -> list[tuple[str, str]]:
    text = (ROOT / "docs" / "operations.md").read_text()
    block = text.split("<!-- influx-flags", 1)[1].split("<!-- /influx-flags -->", 1)[0]
    return re.findall(r"^\| `(--influx-[a-z-]+)` \| (.+?) \|$", block, re.M)


def test_the_docs_table_is_the_one_definition():
    assert _docs_table() == [(flag, text) for _, flag, text in INFLUX]


@pytest.mark.parametrize("path", INFLUX_COMMANDS)
def test_every_influx_command_takes_every_flag_with_the_same_help(path):
    cmd = _command(path)
    opts = {o: p for p in cmd.params for o in getattr(p, "opts", [])}
    text = " ".join(_help(path).split())
    for _, flag, meaning in INFLUX:
        assert flag in opts, f"gpufleet {path}: no {flag}"
        assert " ".join(meaning.split()) in text, f"gpufleet {path} --help: {flag} says otherwise"


def test_no_command_spells_an_influx_concept_another_way():
    """Walk every command: an option about the store is one of the eight (the agent's overrides
    included), never an old spelling, and the time range is --start/--end."""
    known = {flag for _, flag, _ in INFLUX}
    forbidden = {"--db", "--bucket", "--org", "--token-file", "--url", "--user", "--influx", "--from-ms",
                 "--to-ms"}
    bad, names = [], []

    def walk(cmd, path):
        names.append(path)
        for p in cmd.params:
            for o in getattr(p, "opts", []):
                if o in forbidden or (o.startswith("--influx") and o not in known):
                    bad.append((path, o))
        if isinstance(cmd, click.Group):
            ctx = click.Context(cmd)
            for name in cmd.list_commands(ctx):
                walk(cmd.get_command(ctx, name), f"{path} {name}")

    walk(cli, "gpufleet")
    assert "gpufleet agent run" in names and "gpufleet dashboards preview" in names
    assert not bad, bad


@pytest.mark.parametrize("argv,says", [
    (["analyze", "--influx-url", "http://127.0.0.1:9", "--influx-db", "x", "--since", "1h",
      "--influx-org", "o"], "--influx-org: analyze reads with InfluxQL"),
    (["analyze", "--influx-url", "http://127.0.0.1:9", "--influx-db", "x", "--since", "1h",
      "--influx-api", "v2"], "--influx-api v2 needs --influx-token-file"),
    (["demo", "--influx-url", "http://127.0.0.1:9", "--influx-token-file", "/x"],
     "--influx-token-file: the demo"),
    (["dashboards", "export", "--out", "/tmp/x", "--influx-token-file", "/x"], "secrets are not written"),
    (["analyze", "--db", "x"], "No such option '--db'"),
])
def test_a_flag_a_command_cannot_use_is_one_line_and_exit_2(argv, says, capsys):
    assert gpufleet_main(argv) == 2
    err = capsys.readouterr().err
    assert says in err and "Traceback" not in err


def test_analyze_reads_influxdb_with_a_token(tmp_path, capsys):
    """--influx-token-file reaches the server as Authorization: Token (a real HTTP server records it)."""
    import http.server
    import threading

    seen = []

    class H(http.server.BaseHTTPRequestHandler):
        def do_GET(self):  # noqa: N802
            seen.append(self.headers.get("Authorization"))
            self.send_response(401)
            self.end_headers()

        do_POST = do_GET  # noqa: N815

        def log_message(self, *a):
            pass

    srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), H)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    tok = tmp_path / "token"
    tok.write_text("s3cr3t-token\n")
    try:
        rc = gpufleet_main(["analyze", "--influx-url", f"http://127.0.0.1:{srv.server_port}",
                            "--influx-api", "v2", "--influx-db", "fleet", "--influx-token-file", str(tok),
                            "--since", "1h"])
    finally:
        srv.shutdown()
        srv.server_close()
    err = capsys.readouterr().err
    assert rc != 0 and "s3cr3t" not in err
    assert "Token s3cr3t-token" in seen


def test_the_agents_flags_set_its_influx_keys(tmp_path):
    """``agent run``'s --influx-* flags are the [influx] keys of its config, the v1 credentials
    included; ``resend-rejected`` for a named destination refuses them in one line."""
    from gpufleet.agent import config

    from gpufleet.flags import InfluxFlags

    pw = tmp_path / "pw"
    pw.write_text("secret\n")
    cfg = config.apply_overrides(config.load(None), exporters=("influx",), influx=InfluxFlags(
        url="http://db:8086", db="fleet", user="agent7", password_file=str(pw)))
    ix = cfg["influx"]
    assert (ix["url"], ix["db"], ix["username"], ix["password_file"]) == (
        "http://db:8086", "fleet", "agent7", str(pw))
    assert config.influx_secret(ix, "influx") == "secret"
    conf = tmp_path / "agent.toml"
    conf.write_text('[agent]\nexporters = ["influx.b"]\n[influx.b]\nurl = "http://b:8086"\n')
    code = gpufleet_main(["agent", "resend-rejected", "--config", str(conf), "--destination", "influx.b",
                          "--influx-user", "x"])
    assert code == 2
