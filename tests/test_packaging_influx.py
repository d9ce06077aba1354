"""The README's "Install on a node", done by the letter, delivers rows into a real InfluxDB.

packaging/build-deb.sh builds the .deb; dpkg installs it on this machine (as the other package
test does); the only edit is the README's: `[influx] url` and the credentials (`username`,
`password_file`) in /etc/gpufleet/agent.toml. Then, as the unit does: `gpufleet agent check`
(ExecStartPre) and `gpufleet agent run` as the service user `gpufleet` (no systemd here), with the state
directories systemd would create. Rows must arrive in InfluxDB 1.6.7 with authentication on.
"""

from __future__ import annotations

import fcntl
import os
import re
import shutil
import signal
import subprocess
import time
from pathlib import Path

import pytest

from tests.servers import InfluxDB1, skip_unless
from tests.test_packaging import BINARY, _dpkg, _installed, built_deb

CONF = Path("/etc/gpufleet/agent.toml")
PASSWORD = Path("/etc/gpufleet/influx-password")
STATE = Path("/var/lib/gpufleet-agent")


def readme_edit(text: str, url: str, user: str, password_file: str) -> str:
    """The README's edit of the packaged agent.toml: [influx] url and credentials, nothing else."""
    start = text.index("\n[influx]\n")
    end = text.index("\n[", start + 1)
    section = text[start:end]
    for key, value in (("url", url), ("username", user), ("password_file", password_file)):
        section, n = re.subn(rf"^{key} = \"\"", f'{key} = "{value}"', section, count=1, flags=re.M)
        assert n == 1, f"[influx] {key} is not in the packaged config"
    return text[:start] + section + text[end:]


# as the unit runs it: User=gpufleet, Group=gpufleet (exec'd directly, so signals reach the agent)
SERVICE_USER = {"user": "gpufleet", "group": "gpufleet", "extra_groups": []}


@pytest.mark.slow
@pytest.mark.skipif(os.geteuid() != 0, reason="installs a .deb: needs root (CI runs as root)")
@pytest.mark.skipif(shutil.which("dpkg-deb") is None, reason="not a Debian system")
@skip_unless("influxd")
def test_readme_install_then_url_and_credentials_deliver_rows_to_influxdb(tmp_path, tmp_path_factory):
    with open("/tmp/gpufleet-deb-test.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if _installed("gpufleet"):
            pytest.skip("a gpufleet package is already installed here; not touching it")
        deb, _ = built_deb(tmp_path_factory)  # the one test_packaging.py installs too
        agent = None
        try:
            inst = _dpkg("-i", str(deb))
            assert inst.returncode == 0, inst.stdout + inst.stderr
            # postinst ran `gpufleet agent check`: the packaged config without a url writes files
            assert "exporter file: /var/lib/gpufleet-agent/telemetry ([influx] url is not set)" in inst.stdout

            with InfluxDB1(tmp_path / "influx", auth=("fleetwriter", "pw-1ex")) as influx:
                influx.create_db("gpufleet")
                PASSWORD.write_text("pw-1ex\n")
                shutil.chown(PASSWORD, "root", "gpufleet")
                PASSWORD.chmod(0o640)
                CONF.write_text(readme_edit(CONF.read_text(), influx.url, "fleetwriter", str(PASSWORD)))

                env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTHON", "VIRTUAL_ENV"))}
                for d in (STATE, STATE / "spool", STATE / "canary-drop"):  # the unit's StateDirectory=
                    d.mkdir(mode=0o750, exist_ok=True)
                    shutil.chown(d, "gpufleet", "gpufleet")
                # ExecStartPre
                check = subprocess.run([BINARY, "agent", "check", "--config", str(CONF)], capture_output=True,
                                       text=True, env=env, timeout=120, cwd="/", **SERVICE_USER)
                assert check.returncode == 0, check.stdout + check.stderr
                assert f"exporter influx: {influx.url} v1 gpufleet, spool /var/lib/gpufleet-agent/spool " \
                       "(switched on by [influx] url)" in check.stdout
                assert "exporter file" not in check.stdout
                assert "pw-1ex" not in check.stdout + check.stderr
                # ExecStart
                log = open(tmp_path / "agent.log", "wb")
                agent = subprocess.Popen([BINARY, "agent", "run", "--config", str(CONF)], stdout=log,
                                         stderr=subprocess.STDOUT, env=env, cwd="/", start_new_session=True,
                                         **SERVICE_USER)
                deadline = time.monotonic() + 90
                got: set[str] = set()
                while time.monotonic() < deadline and not {"host", "gpufleet_collector"} <= got:
                    assert agent.poll() is None, (tmp_path / "agent.log").read_text()[-3000:]
                    res = influx.query("SHOW MEASUREMENTS", db="gpufleet")["results"][0]
                    got = {v[0] for s in res.get("series", []) for v in s["values"]}
                    time.sleep(0.5)
                log_tail = (tmp_path / "agent.log").read_text()[-3000:]
                assert {"host", "gpufleet_collector"} <= got, (got, log_tail)
                res = influx.query('SELECT * FROM "host" LIMIT 1', db="gpufleet")["results"][0]["series"][0]
                assert "host" in res["columns"]
                os.killpg(agent.pid, signal.SIGTERM)
                assert agent.wait(30) == 0
                agent = None
                text = (tmp_path / "agent.log").read_text()
                assert "exporters influx" in text and "pw-1ex" not in text
                assert "collector ipmi: " in text and "collector canary: on (" in text
        finally:
            if agent is not None:
                os.killpg(agent.pid, signal.SIGKILL)
                agent.wait(10)
            PASSWORD.unlink(missing_ok=True)
            purge = _dpkg("--purge", "gpufleet")
        assert purge.returncode == 0, purge.stdout + purge.stderr
        assert not _installed("gpufleet") and not STATE.exists() and not Path("/opt/gpufleet").exists()
