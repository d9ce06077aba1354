"""Real servers for tests, started on free loopback ports in a temp dir (see docs/testing.md).

InfluxDB 1.6.7, VictoriaMetrics and Prometheus Alertmanager from Debian's packages.
Each helper is a context manager yielding an object with ``url`` and ``stop()``/``start()``
so outage tests can take the server down and bring it back on the same port and data.
"""

from __future__ import annotations

import re
import shutil
import signal
import socket
import subprocess
import time
from pathlib import Path

import requests


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def answers_ping(url: str, timeout: float = 60.0) -> bool:
    """Wait until ``url``/ping answers 204 (an InfluxDB, a listening analyzer): whether it did."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            if requests.get(url + "/ping", timeout=1).status_code == 204:
                return True
        except requests.RequestException:
            pass
        time.sleep(0.1)
    return False


def have(binary: str) -> bool:
    return shutil.which(binary) is not None


class Server:
    """A server process we own: start, wait until ready, stop (TERM, then KILL)."""

    name = "server"

    def __init__(self, tmp: Path):
        self.tmp = Path(tmp)
        self.tmp.mkdir(parents=True, exist_ok=True)
        self.proc: subprocess.Popen | None = None
        self.log = self.tmp / f"{self.name}.log"

    def command(self) -> list[str]:
        raise NotImplementedError

    def ready(self) -> bool:
        raise NotImplementedError

    def start(self, timeout: float = 30.0) -> Server:
        logf = open(self.log, "ab")
        self.proc = subprocess.Popen(self.command(), stdout=logf, stderr=subprocess.STDOUT,
                                     stdin=subprocess.DEVNULL, start_new_session=True)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"{self.name} exited: {self.log.read_text()[-2000:]}")
            try:
                if self.ready():
                    return self
            except requests.RequestException:
                pass
            time.sleep(0.05)
        self.stop()
        raise RuntimeError(f"{self.name} not ready after {timeout}s: {self.log.read_text()[-2000:]}")

    def stop(self, kill: bool = False) -> None:
        if self.proc is None or self.proc.poll() is not None:
            return
        self.proc.send_signal(signal.SIGKILL if kill else signal.SIGTERM)
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(5)

    def __enter__(self):
        return self.start()

    def __exit__(self, *exc):
        self.stop()


class InfluxDB1(Server):
    """InfluxDB 1.6.7 (``influxd``): v1 /write and /query."""

    name = "influxd"

    def __init__(self, tmp: Path, auth: tuple[str, str] | None = None, max_body_size: int | None = None):
        super().__init__(tmp)
        self.auth = auth  # (admin user, password): auth-enabled, the admin created at start
        self.port = free_port()
        self.rpc_port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        conf = subprocess.run(["influxd", "config", "-config", "/dev/null"], capture_output=True,
                              text=True, check=True).stdout
        d = self.tmp
        conf = re.sub(r'^bind-address = .*$', f'bind-address = "127.0.0.1:{self.rpc_port}"', conf,
                      count=1, flags=re.M)
        conf = re.sub(r'(\[meta\][^\[]*?)dir = "[^"]*"', rf'\1dir = "{d}/meta"', conf, count=1)
        conf = re.sub(r'(\[data\][^\[]*?)dir = "[^"]*"', rf'\1dir = "{d}/data"', conf, count=1)
        conf = re.sub(r'wal-dir = "[^"]*"', f'wal-dir = "{d}/wal"', conf, count=1)
        conf = re.sub(r'(\[http\][^\[]*?)bind-address = "[^"]*"',
                      rf'\1bind-address = "127.0.0.1:{self.port}"', conf, count=1)
        conf = re.sub(r'(\[monitor\][^\[]*?)store-enabled = true', r'\1store-enabled = false', conf, count=1)
        conf = re.sub(r'(\[http\][^\[]*?)log-enabled = true', r'\1log-enabled = false', conf, count=1)
        if auth:
            conf = re.sub(r'(\[http\][^\[]*?)auth-enabled = false', r'\1auth-enabled = true', conf, count=1)
        if max_body_size is not None:
            conf = re.sub(r'(\[http\][^\[]*?)max-body-size = \d+', rf'\1max-body-size = {max_body_size}',
                          conf, count=1)
        (d / "influxdb.conf").write_text(conf)

    def command(self):
        return ["influxd", "run", "-config", str(self.tmp / "influxdb.conf")]

    def ready(self):
        if requests.get(self.url + "/ping", timeout=1).status_code != 204:
            return False
        if self.auth:  # the first admin may be created without credentials (idempotent on restart)
            user, pw = self.auth
            requests.post(self.url + "/query", params={"q": f"CREATE USER \"{user}\" WITH PASSWORD '{pw}' "
                                                          "WITH ALL PRIVILEGES"}, auth=self.auth, timeout=5)
        return True

    def query(self, q: str, db: str | None = None, epoch: str = "ns") -> dict:
        params = {"q": q, "epoch": epoch}
        if db:
            params["db"] = db
        r = requests.post(self.url + "/query", params=params, auth=self.auth, timeout=30)
        r.raise_for_status()
        return r.json()

    def create_db(self, db: str) -> None:
        self.query(f'CREATE DATABASE "{db}"')

    def write(self, db: str, lines: str | bytes, precision: str = "ns") -> None:
        r = requests.post(self.url + "/write", params={"db": db, "precision": precision}, auth=self.auth,
                          data=lines if isinstance(lines, bytes) else lines.encode(), timeout=30)
        if r.status_code != 204:
            raise RuntimeError(f"write failed {r.status_code}: {r.text}")


class VictoriaMetrics(Server):
    """VictoriaMetrics: a real server for the InfluxDB v2 write protocol."""

    name = "victoria-metrics"

    def __init__(self, tmp: Path, scrape: list[str] | None = None):
        super().__init__(tmp)
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.scrape = scrape  # HOST:PORT targets scraped every second (-promscrape.config)
        if scrape:
            targets = ", ".join(f'"{t}"' for t in scrape)
            (self.tmp / "scrape.yml").write_text(
                "scrape_configs:\n  - job_name: gpufleet\n    scrape_interval: 1s\n"
                f"    static_configs:\n      - targets: [{targets}]\n")

    def command(self):
        cmd = ["victoria-metrics", f"-storageDataPath={self.tmp}/vm",
               f"-httpListenAddr=127.0.0.1:{self.port}",
               "-retentionPeriod=100y", "-search.latencyOffset=0s"]
        if self.scrape:
            cmd += [f"-promscrape.config={self.tmp}/scrape.yml", "-promscrape.config.strictParse"]
        return cmd

    def query(self, promql: str) -> list[dict]:
        """An instant PromQL/MetricsQL query: the result vector (metric labels, value)."""
        r = requests.get(self.url + "/api/v1/query", params={"query": promql}, timeout=30)
        r.raise_for_status()
        return r.json()["data"]["result"]

    def ready(self):
        return requests.get(self.url + "/health", timeout=1).text.strip() == "OK"

    def export(self, match: str = '{__name__=~".+"}') -> list[dict]:
        """All stored samples matching ``match``: one dict per series (metric, values, timestamps)."""
        import json

        requests.get(self.url + "/internal/force_flush", timeout=10)
        r = requests.get(self.url + "/api/v1/export", params={"match[]": match}, timeout=30)
        r.raise_for_status()
        return [json.loads(line) for line in r.text.splitlines() if line.strip()]


class Alertmanager(Server):
    """Prometheus Alertmanager 0.25, routing everything to one webhook receiver."""

    name = "alertmanager"

    def __init__(self, tmp: Path, webhook_url: str, resolve_timeout: str = "5m"):
        super().__init__(tmp)
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        (self.tmp / "am.yml").write_text(
            f"global:\n  resolve_timeout: {resolve_timeout}\n"
            "route:\n  receiver: hook\n  group_by: ['...']\n  group_wait: 1s\n  group_interval: 1s\n"
            "  repeat_interval: 1h\n"
            f"receivers:\n  - name: hook\n    webhook_configs:\n      - url: {webhook_url}\n"
            "        send_resolved: true\n"
        )

    def command(self):
        binary = shutil.which("prometheus-alertmanager") or "alertmanager"
        return [binary, f"--config.file={self.tmp}/am.yml", f"--storage.path={self.tmp}/am",
                f"--web.listen-address=127.0.0.1:{self.port}", "--cluster.listen-address="]

    def ready(self):
        return requests.get(self.url + "/-/ready", timeout=1).status_code == 200


def skip_unless(binary: str):
    """The test needs ``binary`` (a real server or tool that ./run test installs): skipped where
    it is missing (but in CI, where it must be there), and slow: it starts a process, so the fast
    loop leaves it to CI (tests/conftest.py turns the ``needs`` mark into both)."""
    import pytest

    return pytest.mark.needs(binary)
