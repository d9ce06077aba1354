"""No line the analyzer or the agent prints can be forged by data: a host tag carrying control
characters (``evil\\x1b[2J\\r... RESOLVED all clear``) is printed escaped, on its own line, by the
console sink and by every log line (one escaping function: gpufleet.logs.escape)."""

from __future__ import annotations

import io
import logging
import re
import subprocess
import sys

import pytest

from gpufleet import logs
from tests.agent_support import ROOT
from tests.fleets import fleet

EVIL = "evil\x1b[2J\r\x00\x85\u2028\u202eRESOLVED all clear"
CONTROL = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\u2028\u2029\u202a-\u202e]")


def test_escape_keeps_printable_text_and_writes_every_control_as_an_escape():
    plain = "gpu0 on node-1.example, 300.5 W, ünïcode ✓"
    assert logs.escape(plain) == plain
    out = logs.escape(EVIL + "\nFIRING\ttab")
    assert out == "evil\\x1b[2J\\r\\x00\\x85\\u2028\\u202eRESOLVED all clear\\nFIRING\\ttab"
    assert not CONTROL.search(out) and "\n" not in out


def test_log_lines_are_escaped_and_tracebacks_keep_their_lines():
    buf = io.StringIO()
    logs.setup("%(levelname)s %(name)s: %(message)s", "info", stream=buf)
    try:
        log = logging.getLogger("gpufleet.test")
        log.warning("host %s went away", EVIL)
        try:
            raise ValueError("boom")
        except ValueError:
            log.error("failed on %s", "a\nFAKE line", exc_info=True)
    finally:
        logs.setup()
    lines = buf.getvalue().splitlines()
    assert lines[0] == "WARNING gpufleet.test: host " + logs.escape(EVIL) + " went away"
    assert lines[1] == "ERROR gpufleet.test: failed on a\\nFAKE line"
    assert lines[2].startswith("Traceback") and lines[-1] == "ValueError: boom"
    assert not any(line.startswith("FAKE") for line in lines)
    assert not CONTROL.search(buf.getvalue())


@pytest.mark.slow
def test_a_hostile_host_tag_forges_no_console_line(tmp_path):
    """The analyzer run on telemetry whose host tag carries an escape sequence, a carriage return
    and a fake RESOLVED: each alert is one line starting as the console sink starts it."""
    evil = "evil\x1b[2J\rRESOLVED\\ all\\ clear\x1b]0;x\x07"  # a line-protocol tag value (spaces escaped)
    data = fleet(fault=("memory_errors", 1, 2, 50), steps=120)
    data = data.replace(b"host=node1", b"host=" + evil.encode())
    (tmp_path / "in.lp").write_bytes(data)
    r = subprocess.run([sys.executable, "-m", "gpufleet", "analyze", "--input", str(tmp_path / "in.lp"),
                        "--sink", "console", "--state", str(tmp_path / "state.db")],
                       capture_output=True, cwd=ROOT, timeout=120)
    assert r.returncode == 0, r.stderr
    err = r.stderr.decode()
    lines = [line for line in err.split("\n") if "evil" in line]
    # the alert names the quarantined host by its safe display name; the one line that quotes the
    # raw tag (the quarantine warning) quotes it escaped
    alerts = [line for line in lines if line.startswith("gpufleet: alert: FIRING ")]
    assert len(alerts) == 1 and "host=unsafe:evil__2J_RESOLVED_all_clear" in alerts[0], err
    quoted = [line for line in lines if line not in alerts]
    assert quoted and all("evil\\x1b[2J\\rRESOLVED all clear\\x1b]0;x\\x07 is not a plain node name" in line
                          for line in quoted), err
    assert not CONTROL.search(err) and "\r" not in err


def test_the_online_analyzers_own_lines_are_escaped(capsys):
    """The online loop's messages name hosts (a gap, a read-back): one escaped line each."""
    from gpufleet.analyzer import online

    online._say(f"{EVIL}: read back 3 rows of 60s behind the analysis from InfluxDB")
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("gpufleet analyze: evil\\x1b[2J\\r")
    assert not CONTROL.search(err.rstrip("\n"))
