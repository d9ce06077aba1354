"""The packaged config does what the README says once given a URL, and says what it does.

``[influx] url`` switches the influx exporter on; ``gpufleet agent check`` (the unit's
ExecStartPre, the package's postinst) prints one line per exporter and collector and refuses a
config that names a destination it would not send to; the agent logs the same collector lines
at start, and a collector whose hardware is absent (no /dev/ipmi0) is not started."""

from __future__ import annotations

import logging
import os
import re
import tomllib

import pytest
from gpufleet.agent import config

from gpufleet.cli import main
from tests.conftest import FIXTURES, ROOT

PACKAGED = ROOT / "packaging" / "config" / "agent.toml"
RECORDING = FIXTURES / "recordings" / "h200" / "nvml_dump.json"


def packaged(tmp_path, edits: dict | None = None) -> str:
    """The packaged agent.toml with the README's edits (``edits``: (section, key) -> TOML value
    text, replacing that key's line) and its state paths moved into ``tmp_path``."""
    text = PACKAGED.read_text().replace("/var/lib/gpufleet-agent", str(tmp_path / "state"))
    for (section, key), value in (edits or {}).items():
        start = text.index(f"\n[{section}]\n")
        m = re.compile(rf"^{key} = .*$", re.M).search(text, start)
        text = text[:m.start()] + f"{key} = {value}" + text[m.end():]
    p = tmp_path / "agent.toml"
    p.write_text(text)
    return str(p)


def check(capsys, *args):
    rc = main(["agent", "check", *args])
    out, err = capsys.readouterr()
    return rc, out, err


def test_the_packaged_config_exports_to_influx_once_given_a_url(tmp_path, capsys):
    path = packaged(tmp_path, {("influx", "url"): '"http://influx.example:8086"'})
    cfg = config.load(path)
    assert tomllib.loads(open(path).read())["agent"]["exporters"] == []
    assert config.exporters(cfg) == ["influx"]
    assert [d.name for d in config.influx_destinations(cfg)] == ["influx"]
    rc, out, err = check(capsys, "--config", path)
    assert rc == 0, err
    lines = out.splitlines()
    assert lines[0] == f"config {path}: valid"
    (exp,) = [ln for ln in lines if ln.startswith("exporter ")]
    assert exp.startswith("exporter influx: http://influx.example:8086 v1 gpufleet, spool ")
    assert exp.endswith("(switched on by [influx] url)")
    # without a url: the local files, and the line says why
    rc, out, _ = check(capsys, "--config", packaged(tmp_path))
    assert rc == 0 and "exporter file: " in out and "([influx] url is not set)" in out


def test_each_collector_says_on_off_or_unavailable(tmp_path, capsys):
    if any(os.path.exists(d) for d in ("/dev/ipmi0", "/dev/ipmi/0", "/dev/ipmidev/0")):
        pytest.skip("this machine has a local BMC")
    path = packaged(tmp_path, {("agent", "backend"): f'"recorded:{RECORDING}"'})
    rc, out, err = check(capsys, "--config", path)
    assert rc == 0, err
    col = {ln.split(":")[0].split()[1]: ln.split(": ", 1)[1] for ln in out.splitlines()
           if ln.startswith("collector ")}
    assert list(col) == ["gpu", "host", "canary", "ipmi", "xid"]  # as the packaged config lists them
    assert col["gpu"].startswith("on (1 GPU(s) through NVML")
    assert col["host"].startswith("on (")
    assert col["xid"].startswith("on (XID lines from the kernel log /dev/kmsg")
    assert col["ipmi"].startswith("unavailable (no /dev/ipmi0")
    assert col["canary"].startswith("on (results of job-boundary checks (Slurm Epilog/Prolog hooks) from ")
    assert "no CUDA engine (torch or cupy)" in col["canary"] and "canary.python" in col["canary"]
    # no NVML here: the gpu line says why; the canary does no checks of its own
    rc, out, _ = check(capsys, "--config", packaged(tmp_path))
    import pynvml

    try:
        pynvml.nvmlInit()
        pynvml.nvmlShutdown()
        return  # a real driver: the lines above are the node's
    except pynvml.NVMLError:
        pass
    assert "collector gpu: unavailable (NVML: " in out
    assert "no checks of its own (no NVML GPU here)" in out
    # a collector left out of the list is off
    cfg_path = tmp_path / "few.toml"
    cfg_path.write_text('[agent]\ncollectors = ["host"]\n')
    rc, out, _ = check(capsys, "--config", str(cfg_path))
    assert rc == 0 and "collector canary: off (not in agent.collectors)" in out


@pytest.mark.parametrize("text, words", [
    ('[influx.analyzer]\nurl = "http://a:8186"\n', '[influx.analyzer] names a url but agent.exporters'),
    # the trap of the old packaged config: a url, and an exporter list that leaves influx out
    ('[agent]\nexporters = ["file"]\n[influx]\nurl = "http://h:1"\n', '[influx] names a url but'),
    ('[influx]\nurl = "http://h:1"\npassword_file = "/nonexistent/pw"\n',
     "influx.password_file: cannot read"),
    ('[agent]\nexporters = ["kafka"]\n', "agent.exporters"),
])
def test_check_refuses_with_one_line(tmp_path, capsys, text, words):
    p = tmp_path / "agent.toml"
    p.write_text(text)
    rc, out, err = check(capsys, "--config", str(p))
    assert rc == 2 and out == ""
    assert err.startswith("gpufleet: error:") and words in err and err.count("\n") == 1


def test_the_agent_logs_the_lines_and_starts_only_what_the_node_has(tmp_path, caplog):
    if any(os.path.exists(d) for d in ("/dev/ipmi0", "/dev/ipmi/0", "/dev/ipmidev/0")):
        pytest.skip("this machine has a local BMC")
    from gpufleet.agent.daemon import Agent

    kmsg = tmp_path / "kmsg.log"
    kmsg.write_text("")
    cfg = config.load(packaged(tmp_path, {("agent", "backend"): f'"recorded:{RECORDING}"',
                                          ("xid", "kmsg"): f'"{kmsg}"'}))
    with caplog.at_level(logging.INFO, logger="gpufleet"):
        a = Agent(cfg)
    try:
        assert sorted(c.name for c in a.collectors) == ["canary", "gpu", "host", "xid"]
        lines = [r.getMessage() for r in caplog.records if r.getMessage().startswith("collector ")]
        assert [ln.split(":")[0] for ln in lines] == [f"collector {n}" for n in
                                                      ("gpu", "host", "canary", "ipmi", "xid")]
        assert any(ln.startswith("collector ipmi: unavailable (no /dev/ipmi0") for ln in lines)
        assert a.tick()
    finally:
        a.close()
