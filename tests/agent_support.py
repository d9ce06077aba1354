"""Helpers for the agent tests: run the real ``gpufleet agent run`` process, read what it wrote.

Also a site collector (``tests.agent_support:Broken``) that always fails, to show that one
failing collector never stops the others.
"""

from __future__ import annotations

import gzip
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

from gpufleet.lineprotocol import ParseError, Point, parse_line

ROOT = Path(__file__).resolve().parent.parent


class Broken:
    name = "broken"

    def collect(self, now_ns):
        raise RuntimeError("this source is broken")

    def close(self):
        pass


def agent_cmd(*args: str) -> list[str]:
    return [sys.executable, "-m", "gpufleet", "agent", "run", *args]


def start_agent(tmp: Path, *args: str, env: dict | None = None, log: str = "agent.log") -> subprocess.Popen:
    """Start ``gpufleet agent run ARGS`` in its own session, logging to ``tmp/log``. Its temporary
    folders go under ``tmp/agent-tmp``, so a test that SIGKILLs it leaves nothing elsewhere."""
    (tmp / "agent-tmp").mkdir(exist_ok=True)
    e = {**os.environ, "TMPDIR": str(tmp / "agent-tmp")}
    e.update(env or {})
    logf = open(tmp / log, "ab")
    return subprocess.Popen(agent_cmd(*args), stdout=logf, stderr=subprocess.STDOUT, cwd=ROOT, env=e,
                            start_new_session=True)


def stop_agent(proc: subprocess.Popen, timeout: float = 10.0) -> int:
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
    try:
        return proc.wait(timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(5)
        raise AssertionError("agent did not stop on SIGTERM") from None


def _split_head(line: str) -> tuple[str, str]:
    """Measurement+tags and the rest: quotes mean nothing before the first unescaped space."""
    i = 0
    while i < len(line):
        c = line[i]
        if c == "\\":
            i += 2
            continue
        if c == " ":
            return line[:i], line[i + 1:]
        i += 1
    raise ParseError("no fields")


def _unescape(s: str) -> str:
    out, i = [], 0
    while i < len(s):
        if s[i] == "\\" and i + 1 < len(s) and s[i + 1] in " ,=":
            out.append(s[i + 1])
            i += 2
            continue
        out.append(s[i])
        i += 1
    return "".join(out)


def _split_esc(s: str, sep: str) -> list[str]:
    parts, cur, i = [], [], 0
    while i < len(s):
        if s[i] == "\\" and i + 1 < len(s):
            cur.append(s[i:i + 2])
            i += 2
            continue
        if s[i] == sep:
            parts.append("".join(cur))
            cur = []
        else:
            cur.append(s[i])
        i += 1
    parts.append("".join(cur))
    return parts


def parse(line: str) -> Point:
    """One line of line protocol, with tag values that may hold quotes (InfluxDB's own rules)."""
    head, rest = _split_head(line)
    parts = _split_esc(head, ",")
    tags = {}
    for t in parts[1:]:
        k, v = _split_esc(t, "=")
        tags[_unescape(k)] = _unescape(v)
    p = parse_line("m " + rest)
    return Point(_unescape(parts[0]), tags, p.fields, p.time)


def read_lp_dir(directory: Path) -> list:
    """Every complete line-protocol point in a file exporter's directory (.lp and .lp.gz)."""
    points = []
    for p in sorted(Path(directory).iterdir()):
        if p.name.endswith(".lp.gz"):
            text = gzip.open(p, "rt", encoding="utf-8").read()
        elif p.name.endswith(".lp"):
            text = p.read_text(encoding="utf-8")
        else:
            continue
        lines = text.split("\n")
        for i, line in enumerate(lines):
            if not line:
                continue
            try:
                points.append(parse(line))
            except ParseError:
                if i < len(lines) - 1 and lines[-1] == "" and i != len(lines) - 2:
                    raise
    return points


def wait_for(pred, timeout: float, step: float = 0.1):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        got = pred()
        if got:
            return got
        time.sleep(step)
    return pred()


def influx_rows(server, db: str, measurement: str) -> dict:
    """``(time_ns, tags frozenset) -> {field: value}`` for every row of a measurement in InfluxDB 1.x."""
    res = server.query(f'SELECT * FROM "{measurement}" GROUP BY *', db=db, epoch="ns")
    out = {}
    for series in res["results"][0].get("series", []):
        tags = frozenset((k, v) for k, v in series.get("tags", {}).items() if v != "")
        cols = series["columns"]
        for row in series["values"]:
            d = {c: v for c, v in zip(cols, row, strict=True) if v is not None}
            t = d.pop("time")
            out[(t, tags)] = d
    return out


def compare(expected_points, server, db: str) -> int:
    """Every expected point is in InfluxDB with exactly its field values; returns how many."""
    by_meas: dict[str, dict] = {}
    n = 0
    for p in expected_points:
        rows = by_meas.get(p.measurement)
        if rows is None:
            rows = by_meas[p.measurement] = influx_rows(server, db, p.measurement)
        key = (p.time, frozenset(p.tags.items()))
        assert key in rows, f"missing in InfluxDB: {p}"
        got = rows[key]
        for f, v in p.fields.items():
            assert f in got, f"{p.measurement} {p.tags} @{p.time}: field {f} missing"
            g = got[f]
            if isinstance(v, float):  # InfluxDB's JSON writes 700.0 as 700
                ok = isinstance(g, (int, float)) and float(g) == v
            else:
                ok = g == v and type(g) is type(v)
            assert ok, f"{p.measurement}.{f} {p.tags}: wrote {v!r}, read {g!r}"
        n += 1
    return n


class NotifySocket:
    """A systemd notify socket (a unix datagram socket) the agent writes READY=1, WATCHDOG=1, ... to."""

    def __init__(self, tmp: Path):
        self.path = str(tmp / "notify.sock")
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self.sock.bind(self.path)
        self.sock.settimeout(0.2)
        self.msgs: list[str] = []

    def drain(self) -> list[str]:
        """Every datagram so far (read without waiting past the socket's short timeout)."""
        try:
            while True:
                self.msgs.append(self.sock.recv(4096).decode())
        except (TimeoutError, BlockingIOError):
            pass
        return self.msgs

    def close(self) -> None:
        self.sock.close()


def influx_agent_config(tmp_path: Path, url: str, extra_influx: str = "", extra_agent: str = "",
                        db: str = "fleet", backoff_max: str = "1s") -> str:
    """An agent on the sim backend at 1 s ticks writing to InfluxDB at ``url`` (and a file sink),
    spool and files under ``tmp_path``; returns the config's path."""
    cfg = tmp_path / "agent.toml"
    cfg.write_text(f"""
[agent]
backend = "sim"
interval = "1s"
exporters = ["influx", "file"]
host = "node-7"
flush_timeout = "5s"
{extra_agent}

[influx]
url = "{url}"
db = "{db}"
timeout = "2s"
backoff_min = "0.2s"
backoff_max = "{backoff_max}"
{extra_influx}

[file]
dir = "{tmp_path / 'lp'}"

[spool]
dir = "{tmp_path / 'spool'}"
""")
    return str(cfg)
