"""The analyzer on agent-shaped data and online (``python -m bench.run --only online``).

Agent-shaped: the fleet is simulated with the agent's cadences (every NVLink link every 30 s,
the slow tier every 60 s, 10 s polls) through the simulator's own telemetry knobs. Measured
side by side, in one run, against a real InfluxDB 1.6.7 (tests/servers.py):

- file path: ``gpufleet analyze --input`` (GPU-samples per second of its CPU time, peak RSS);
- pull path: ``gpufleet analyze --influx-url --start --end`` against InfluxDB answering raw
  ``SELECT * FROM <m> ... GROUP BY *`` for every measurement, for the same rows;
- ``--since 30d`` over that store (it holds a few hours), and ``--follow --since 30d``'s catch-up;
- ``--listen`` path: the fleet POSTed as the agent posts (gzip, 5000 lines), the listener's
  GPU-samples per second of its CPU time and its peak RSS; the same with one host in ten 30 min
  late;
- ``--listen`` peak RSS for larger fleets (the small one copied), all on time and with one rack
  an hour late;
- online latency: rows written live into InfluxDB, a DBE on a new GPU every few seconds, from
  the write of the row to the alert at a real Alertmanager, fed by a subscription (``--listen``)
  and by ``--follow`` (1 s polls).
"""

from __future__ import annotations

import gzip
import json
import math
import os
import re
import statistics
import struct
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import requests

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from bench import sim  # noqa: E402 - after the path line, for a run from anywhere

GPUFLEET = [sys.executable, "-m", "gpufleet"]


def _row(metric, value, unit, target="", note=""):
    return {
        "benchmark": "online",
        "metric": metric,
        "value": value,
        "unit": unit,
        "target": target,
        "note": note,
    }


def _agent_shaped(out: Path, nodes: int, duration: str, start: str | None = None) -> dict:
    base = (ROOT / "gpufleet" / "sim" / "scenarios" / "mixed.toml").read_text()
    fleet = f'\n[fleet]\nstart = "{start}"\n' if start else ""
    sc = out.parent / f"{out.name}.toml"
    sc.write_text(base + fleet + "\n[telemetry]\nnvlink_full_every = 3\nslow_every = 6\n")
    sim(out, sc, nodes, duration, 7)
    return json.loads((out / "manifest.json").read_text())


def _measured(cmd: list[str], env=None, timeout=600) -> tuple[float, float, float, str]:
    """Run a command: (wall s, CPU s, peak RSS MiB, stderr) of that process alone (wait4)."""
    t = time.perf_counter()
    p = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, cwd=ROOT, env=env)
    err = []
    th = threading.Thread(target=lambda: err.append(p.stderr.read()), daemon=True)
    th.start()
    _pid, status, ru = os.wait4(p.pid, 0)
    wall = time.perf_counter() - t
    p.returncode = os.waitstatus_to_exitcode(status)
    th.join(10)
    text = err[0].decode() if err else ""
    if p.returncode:
        raise RuntimeError(f"{' '.join(cmd[2:5])}: exit {p.returncode}: {text[-500:]}")
    return wall, ru.ru_utime + ru.ru_stime, ru.ru_maxrss / 1024, text


def _stats(err: str) -> dict:
    return json.loads(err.strip().splitlines()[-1])


def _cpu(pid: int) -> float:
    f = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(f[11]) + int(f[12])) / os.sysconf("SC_CLK_TCK")


def _hwm(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def _metrics(url: str) -> dict:
    out = {}
    for line in requests.get(url + "/metrics", timeout=10).text.splitlines():
        k, _, v = line.rpartition(" ")
        out[k] = float(v)
    return out


def _file_path(lp: Path):
    from gpufleet.analyzer.pipeline import Analyzer
    from gpufleet.analyzer.sources import read_chunks

    an = Analyzer()
    for chunk in read_chunks(lp):
        an.feed_bytes(chunk)
    an.finish()
    return an


def _raw(url: str, measurements, s_ns: int, e_ns: int) -> int:
    n = 0
    for m in measurements:
        q = f'SELECT * FROM "{m}" WHERE time >= {s_ns} AND time < {e_ns} GROUP BY *'
        body = requests.get(
            url + "/query", params={"db": "fleet", "q": q, "epoch": "ns"}, timeout=600
        ).content
        n += sum(len(s.get("values", [])) for r in json.loads(body)["results"] for s in r.get("series", []))
    return n


def _pull(url: str, s_ns: int, e_ns: int, analyse: bool):
    from gpufleet.analyzer.pipeline import Analyzer
    from gpufleet.analyzer.sources import Influx, pull
    from gpufleet.analyzer.store import pull as pull_into

    influx = Influx(url, "fleet")
    an = Analyzer()
    if not analyse:
        return sum(
            sum(len(r) for r in rows.values())
            for _a, _b, rows in pull(influx, an.wanted(), s_ns, e_ns, an.parser.series, int(300e9))
        )
    pull_into(an, influx, s_ns, e_ns)
    an.finish()
    return an


def bench_paths(quick: bool, tmp: Path) -> list[dict]:
    from gpufleet.analyzer.pipeline import MEASUREMENTS

    from tests.servers import InfluxDB1

    nodes, dur = (4, "1h") if quick else (16, "2h")
    fl = tmp / "fleet"
    man = _agent_shaped(fl, nodes, dur)
    lp = fl / "telemetry.lp.gz"
    gpus = man["fleet"]["gpus"]
    lines = man["telemetry"]["lines"]
    shape = (
        f"{gpus} GPUs x {dur} agent-shaped ({lines.get('gpu', 0):,} gpu rows, "
        f"{lines.get('gpu_nvlink', 0):,} NVLink rows)"
    )
    rows = []

    wall, cpu, rss, err = _measured([*GPUFLEET, "analyze", "--input", str(lp), "--stats"])
    n = _stats(err)["gpu_samples"]
    # in-process, the analyzer's modules imported first (as a running analyzer has them: the
    # --listen figure below starts counting once its listener answers); best of three passes
    import gpufleet.analyzer.pipeline  # noqa: F401
    import gpufleet.analyzer.sources  # noqa: F401

    fw = fc = math.inf
    for _ in range(3):
        t, c = time.perf_counter(), time.process_time()
        an = _file_path(lp)
        fw, fc = min(fw, time.perf_counter() - t), min(fc, time.process_time() - c)
    rows.append(
        _row(
            "file path (read+parse+detect)",
            n / fc,
            "GPU-samples/s per core",
            ">= 100,000",
            f"{shape}; best of 3 in-process passes; {n / fw:,.0f}/s wall; `gpufleet analyze --input` as "
            f"a process: {wall:.1f} s wall, {cpu:.2f} s CPU with start-up ({n / cpu:,.0f}/s), "
            f"peak RSS {rss:.0f} MiB",
        )
    )
    with InfluxDB1(tmp / "influx") as db:
        db.create_db("fleet")
        subprocess.run(
            [*GPUFLEET, "replay", str(fl), "--influx-url", db.url, "--influx-db", "fleet", "--no-progress"],
            check=True,
            capture_output=True,
            cwd=ROOT,
        )
        first = db.query("SELECT first(up) FROM gpu", db="fleet")["results"][0]["series"][0]["values"][0][0]
        last = db.query("SELECT last(up) FROM gpu", db="fleet")["results"][0]["series"][0]["values"][0][0]
        s_ns, e_ns = int(first), int(last) + 10**9
        # InfluxDB's own rate (every measurement, raw, GROUP BY *, read to the last byte), the pull
        # path reading the same span (query + convert to rows) and analysing it; interleaved, best of 3
        raw, read, e2e = [], [], []
        for _ in range(3):
            t = time.perf_counter()
            raw_rows = _raw(db.url, MEASUREMENTS, s_ns, e_ns)
            raw.append(time.perf_counter() - t)
            t = time.perf_counter()
            got = _pull(db.url, s_ns, e_ns, analyse=False)
            read.append(time.perf_counter() - t)
            t = time.perf_counter()
            an = _pull(db.url, s_ns, e_ns, analyse=True)
            e2e.append(time.perf_counter() - t)
        raw_s, read_s, e2e_s = min(raw), min(read), min(e2e)
        rows.append(
            _row(
                "InfluxDB raw query, all measurements",
                raw_rows / raw_s,
                "rows/s",
                "",
                f"{raw_rows:,} rows in {raw_s:.2f} s: SELECT * FROM <m> ... GROUP BY *, each read whole",
            )
        )
        rows.append(
            _row(
                "pull path read (query+convert) vs InfluxDB raw",
                raw_s / read_s,
                "x",
                ">= 0.5",
                f"{read_s:.2f} s for the same span ({got:,} rows: only the fields a detector reads)",
            )
        )
        rows.append(
            _row(
                "pull path end to end (query+convert+detect) vs InfluxDB raw",
                raw_s / e2e_s,
                "x",
                ">= 0.5",
                f"{e2e_s:.2f} s; {an.gpu_samples / e2e_s:,.0f} GPU-samples/s; "
                f"next batch queried while this one is analysed",
            )
        )
        wall, cpu, rss, err = _measured(
            [*GPUFLEET, "analyze", "--influx-url", db.url, "--influx-db", "fleet", "--since", "30d",
             "--stats"]
        )
        rows.append(
            _row(
                "--since 30d over the store (holds " + dur + ")",
                wall,
                "s",
                "seconds",
                f"{_stats(err)['gpu_samples']:,} GPU-samples; wall time with interpreter start-up",
            )
        )
        # --follow from 30 days back: the catch-up line it prints
        p = subprocess.Popen(
            [
                *GPUFLEET,
                "analyze",
                "--follow",
                "--influx-url",
                db.url,
                "--influx-db",
                "fleet",
                "--since",
                "30d",
                "--poll",
                "10s",
                "--out",
                str(tmp / "follow.jsonl"),
            ],
            stderr=subprocess.PIPE,
            stdout=subprocess.DEVNULL,
            text=True,
            cwd=ROOT,
        )
        t = time.perf_counter()
        line = ""
        while time.perf_counter() - t < 300:
            line = p.stderr.readline()
            if "caught up" in line or not line:
                break
        caught = time.perf_counter() - t
        p.terminate()
        p.wait(30)
        m = re.search(r"in ([0-9.]+)s", line)
        rows.append(
            _row(
                "--follow --since 30d: catch-up to live",
                float(m.group(1)) if m else "failed",
                "s",
                "",
                f"{line.strip()[len('gpufleet analyze: ') :]}; {caught:.1f} s from start",
            )
        )
    return rows + bench_listen(quick, tmp)


def bench_listen(quick: bool, tmp: Path) -> list[dict]:
    """``--listen``: the fleet POSTed as the agent posts it, timestamps from now on (the analysis
    keeps pace with the data's own clock: windows are cut as the pushed data's time passes); then
    the same with one host in ten 30 min late."""
    nodes, dur = (4, "1h") if quick else (16, "2h")
    now = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(time.time() + 60))
    fl2 = tmp / "fleet-live"
    man2 = _agent_shaped(fl2, nodes, dur, start=now)
    lines = man2["telemetry"]["lines"]
    shape = (
        f"{man2['fleet']['gpus']} GPUs x {dur} agent-shaped ({lines.get('gpu', 0):,} gpu rows, "
        f"{lines.get('gpu_nvlink', 0):,} NVLink rows)"
    )
    rows = []
    body = gzip.decompress((fl2 / "telemetry.lp.gz").read_bytes()).splitlines(keepends=True)
    n_all = man2["telemetry"]["lines"].get("gpu", 0)
    n, cpu, took, refused, got, rss, nb = _listen_path(tmp, body, n_all, "listen")
    rows.append(
        _row(
            "--listen path (HTTP+gunzip+parse+detect)",
            n / cpu,
            "GPU-samples/s per core",
            ">= 100,000",
            f"{shape} POSTed in {nb} gzip bodies of 5000 lines; {n / took:,.0f}/s wall; "
            f"{refused} answered 429 (retried); windows {got.get('gpufleet_analyzer_windows_total', 0):.0f}; "
            f"peak RSS {rss:.0f} MiB",
        )
    )
    n1, cpu1, took1, _r1, got1, rss1, _nb1 = _listen_path(tmp, body, n_all, "listen-pinned", pin=True)
    rows.append(
        _row(
            "--listen path, the listener on one core and its client on another",
            n1 / cpu1,
            "GPU-samples/s per core",
            ">= 100,000",
            f"the same {nb} bodies; {n1 / took1:,.0f}/s wall; {n1 / cpu1 / (n / cpu):.2f}x the unpinned "
            f"rate of this run; windows {got1.get('gpufleet_analyzer_windows_total', 0):.0f}; peak RSS "
            f"{rss1:.0f} MiB",
        )
    )
    # the same fleet with one host in ten 30 min late (its rows land beside the others' rows of
    # 30 min later): analysed in its own time (event time per host), none dropped
    hosts = sorted({_host(x) for x in body if x.startswith(b"gpu,")})
    late = set(hosts[::10])
    keyed = [(_ts(x) + (1800 * 10**9 if _host(x) in late else 0), x) for x in body]
    body_late = [x for _k, x in sorted(keyed, key=lambda kv: kv[0])]
    n2, cpu2, took2, refused2, got2, rss2, nb2 = _listen_path(tmp, body_late, n_all, "listen-late")
    rows.append(
        _row(
            "--listen path, one host in ten 30 min late",
            n2 / cpu2,
            "GPU-samples/s per core",
            ">= 100,000",
            f"the same {nb2} bodies, {len(late)} of {len(hosts)} hosts' rows 30 min behind the rest; "
            f"{n2 / took2:,.0f}/s wall; {n2 / cpu2 / (n / cpu):.2f}x the on-time rate of this run; "
            f"rows analysed late {got2.get('gpufleet_analyzer_late_rows_analysed_total', 0):,.0f}, dropped "
            f"{got2.get('gpufleet_analyzer_gap_rows_dropped_total', 0):.0f}, late points "
            f"{got2.get('gpufleet_analyzer_late_points_total', 0):.0f}; {refused2} answered 429 (retried); "
            f"peak RSS {rss2:.0f} MiB",
        )
    )
    return rows


_HOST = re.compile(rb"[ ,]host=([^, ]+)")


def _host(line: bytes) -> bytes:
    m = _HOST.search(line)
    return m.group(1) if m else b""


def _ts(line: bytes) -> int:
    return int(line.rsplit(b" ", 1)[1])


def _timed(fleet: Path) -> list[tuple[int, bytes]]:
    """(timestamp ns, line) of each line of a simulated fleet's telemetry."""
    lines = gzip.decompress((fleet / "telemetry.lp.gz").read_bytes()).splitlines(keepends=True)
    return [(_ts(x), x) for x in lines if x.strip()]


def _listen_path(tmp: Path, body, n_all: int, name: str, pin: bool = False):
    """POST ``body`` (lines, or an iterable of gzip bodies) to a fresh ``--listen`` as the agent
    posts (gzip, 5000 lines) and wait until every GPU sample is analysed: (samples, CPU s, wall s,
    429s, /metrics, peak RSS MiB, bodies). ``pin``: the listener on one core and this process (the
    client) on another, where there are two: its CPU is then one core's, not shared with the
    client's on the same core or its sibling."""
    from tests.servers import answers_ping, free_port

    cores = sorted(os.sched_getaffinity(0))
    pin = pin and len(cores) >= 2

    if isinstance(body, list):
        batches = [gzip.compress(b"".join(body[i : i + 5000]), 1) for i in range(0, len(body), 5000)]
    else:
        batches = body
    posted = 0
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    p = subprocess.Popen(
        [
            *GPUFLEET,
            "analyze",
            "--listen",
            f"127.0.0.1:{port}",
            "--poll",
            "10s",
            "--grace",
            "60s",
            "--out",
            str(tmp / f"{name}.jsonl"),
        ],
        cwd=ROOT,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        preexec_fn=(lambda: os.sched_setaffinity(0, {cores[-1]})) if pin else None,
    )
    if pin:
        os.sched_setaffinity(0, {cores[0]})
    try:
        answers_ping(url)
        cpu0 = _cpu(p.pid)
        t = time.perf_counter()
        s = requests.Session()
        refused = 0
        for b in batches:
            posted += 1
            while True:
                r = s.post(
                    url + "/write",
                    params={"db": "fleet", "precision": "ns"},
                    data=b,
                    headers={"Content-Encoding": "gzip"},
                    timeout=60,
                )
                if r.status_code != 429:
                    break
                refused += 1
                time.sleep(0.05)
        while (
            time.perf_counter() - t < 600
            and _metrics(url).get("gpufleet_analyzer_gpu_samples_total", 0) < n_all
        ):
            time.sleep(0.1)
        took = time.perf_counter() - t
        cpu = _cpu(p.pid) - cpu0
        # the peak once what landed last is analysed too (a late host's last windows): the
        # counters unchanged across a poll
        keys = ("gpufleet_analyzer_windows_total", "gpufleet_analyzer_late_rows_analysed_total")
        seen = None
        for _ in range(8):
            got = _metrics(url)
            if seen == [got.get(k) for k in keys]:
                break
            seen = [got.get(k) for k in keys]
            time.sleep(11)
        rss = _hwm(p.pid)
    finally:
        p.terminate()
        p.wait(30)
        if pin:
            os.sched_setaffinity(0, cores)
    n = got.get("gpufleet_analyzer_gpu_samples_total", 0)
    return n, cpu, took, refused, got, rss, posted


LATE_RACK = b"r001"


def _replicated(base: list[tuple[int, bytes]], copies: int, late_s: float, landing: bool = False):
    """A large fleet from a small one, in gzip bodies of 5000 lines: ``copies`` copies of every
    host (``gpu0001`` -> ``gpu0001-c07``, its rack and GPU UUIDs renamed alike), in time order,
    except rack r001 of the first copy, whose rows land ``late_s`` after the others' rows of their
    time (those past the end land at the end, as a spool drains). ``landing``: (when the body's
    last row lands, ns; body) pairs."""
    tags = re.compile(rb"((?:host|rack)=[^, ]+|uuid=GPU-[0-9a-f-]+)")
    rack = re.compile(rb",rack=([^, ]+)")
    renamed: dict[bytes, list[bytes]] = {}  # series key -> its key in each copy
    late: dict[bytes, bool] = {}  # series key -> in the late rack
    entries = []  # (landing key, copies it stands for, series key, the rest of the line)
    everyone = range(copies)
    for t, line in base:
        i = line.find(b" ")  # the series key: up to the first unescaped space
        while i > 0 and line[i - 1] == 0x5C:
            i = line.find(b" ", i + 1)
        key, rest = line[:i], line[i:]
        if key not in renamed:
            renamed[key] = [tags.sub(lambda m, s=b"-c%02d" % c: m.group(0) + s, key) for c in everyone]
            m = rack.search(key)
            late[key] = m is not None and m.group(1) == LATE_RACK
        if late[key]:
            entries.append((t, range(1, copies), key, rest))
            entries.append((t + int(late_s * 1e9), range(1), key, rest))
        else:
            entries.append((t, everyone, key, rest))
    entries.sort(key=lambda e: e[0])
    out: list[bytes] = []
    for t, which, key, rest in entries:
        keys = renamed[key]
        out.extend(keys[c] + rest for c in which)
        if len(out) >= 5000:
            body = gzip.compress(b"".join(out[:5000]), 1)
            yield (t, body) if landing else body
            del out[:5000]
    while out:
        body = gzip.compress(b"".join(out[:5000]), 1)
        yield (entries[-1][0], body) if landing else body
        del out[:5000]


def bench_memory(quick: bool, tmp: Path) -> list[dict]:
    """Peak RSS of ``--listen`` for a large fleet online with one rack an hour late: a 64-GPU
    agent-shaped fleet (90 min, stamped from a minute ahead of the wall clock, as the --listen
    rate above) copied to the sizes measured, POSTed as fast as the analyzer takes it."""
    fl = tmp / "fleet-mem"
    ahead = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(time.time() + 60))
    man = _agent_shaped(fl, 8, "90m", start=ahead)
    base = _timed(fl)
    n_base = man["telemetry"]["lines"].get("gpu", 0)
    rows = []
    for copies in (4,) if quick else (16, 32):
        gpus = 64 * copies
        for late in (0.0, 3600.0):
            name = f"mem-{gpus}-{int(late)}"
            n, cpu, took, refused, got, rss, nb = _listen_path(tmp, _replicated(base, copies, late),
                                                               n_base * copies, name)
            (tmp / f"{name}.jsonl").unlink(missing_ok=True)
            what = "one rack (32 GPUs) 1 h late" if late else "all on time"
            rows.append(
                _row(
                    f"--listen peak RSS, {gpus:,} GPUs, {what}",
                    rss,
                    "MiB",
                    "<= 2,048 at 10,000 GPUs",
                    f"{n:,.0f} GPU rows of 90 min (10 s polls, NVLink every 30 s) in {nb} gzip bodies; "
                    f"{n / cpu:,.0f} GPU-samples/s per core; rows analysed late "
                    f"{got.get('gpufleet_analyzer_late_rows_analysed_total', 0):,.0f}, dropped "
                    f"{got.get('gpufleet_analyzer_gap_rows_dropped_total', 0):.0f}, late points "
                    f"{got.get('gpufleet_analyzer_late_points_total', 0):.0f}; {refused} answered 429",
                )
            )
    return rows


def bench_memory_live(quick: bool, tmp: Path) -> list[dict]:
    """Peak RSS of the analyzer online at a live fleet's pace: the ``bench_memory`` fleet (stamped
    from three hours ago) copied to 1,024 and 2,048 GPUs (10,048 with ``GPUFLEET_BENCH_10K`` set:
    about 12 min of CPU), rack r001 of the first copy an hour late, fed to ``bench.live_clock``
    body by body at each body's landing time on its own clock: 10 s polls, windows a poll long,
    60 s of grace, as ``--listen`` runs on a live fleet (``bench_memory`` posts as fast as the
    listener takes it: batch-size windows and a full queue)."""
    fl = tmp / "fleet-live"
    start = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(time.time() - 3 * 3600))
    _agent_shaped(fl, 8, "90m", start=start)
    base = _timed(fl)
    sizes = (4,) if quick else (16, 32, 157) if os.environ.get("GPUFLEET_BENCH_10K") else (16, 32)
    rows = []
    for copies in sizes:
        p = subprocess.Popen([sys.executable, "-m", "bench.live_clock"], cwd=ROOT, stdin=subprocess.PIPE,
                             stdout=subprocess.PIPE)
        assert p.stdin is not None and p.stdout is not None
        for landing, body in _replicated(base, copies, 3600.0, landing=True):
            p.stdin.write(struct.pack("<qq", landing, len(body)) + body)
        p.stdin.close()
        got = json.loads(p.stdout.read())
        p.wait()
        rows.append(
            _row(
                f"online peak RSS at a live pace, {64 * copies:,} GPUs, one rack (32 GPUs) 1 h late",
                got["peak_rss_mib"],
                "MiB",
                "<= 2,048 at 10,000 GPUs",
                f"{got['gpu_samples']:,} GPU rows of 90 min (10 s polls, NVLink every 30 s); rows analysed "
                f"late {got['late_rows']:,}, dropped {got['dropped']}, late points {got['late_points']}; "
                f"{got['windows']:,} windows, {got['cpu_s']:.0f} s CPU",
            )
        )
    return rows


class _Writer(threading.Thread):
    """A small live fleet: one gpu row per GPU every 1.37 s into InfluxDB, a DBE on the next host
    every ``every`` seconds; records when each DBE row's write returned."""

    def __init__(self, db, gpus: int, every: float, faults: int):
        super().__init__(daemon=True)
        self.db, self.gpus, self.every, self.faults = db, gpus, every, faults
        self.landed: dict[str, float] = {}
        self.stop = threading.Event()
        self.t_start = time.time()

    def run(self):
        t_start = self.t_start = time.time()
        dbe = [0] * self.gpus
        k = 0
        while not self.stop.is_set():
            t = time.time()
            due = min(int((t - t_start) / self.every), self.faults)
            fresh = []
            for j in range(1, due + 1):  # one GPU per host: the notifier groups a host's incidents
                g = 4 * j + 1
                if not dbe[g]:
                    dbe[g] = 1
                    fresh.append(g)
            lines = []
            for g in range(self.gpus):
                host = f"node{g // 4:02d}"
                lines.append(
                    f"gpu,host={host},gpu={g % 4} power_watts=650,utilization_gpu_ratio=0.97,"
                    f"ecc_corrected_volatile_total=0i,ecc_uncorrected_volatile_total={dbe[g]}i,up=1i,"
                    f"health_code=0i {int(t * 1e9)}"
                )
            self.db.write("fleet", "\n".join(lines))
            now = time.time()
            for g in fresh:
                self.landed[f"node{g // 4:02d}/{g % 4}"] = now
            k += 1
            # writes about a second apart at a wandering phase: a fault's row lands anywhere in
            # the analyzer's window, so the latencies spread over what a window and grace allow
            time.sleep(max(0.0, t_start + 1.37 * k - time.time()))


def _backlog(db, tmp: Path, nodes: int) -> tuple[threading.Thread, dict]:
    """A thread that writes ``nodes`` agent-shaped nodes' last 30 minutes into ``db`` at once, in
    5,000-line bodies (spools draining after a network cut), when started; its ``done`` holds
    the lines and when the last write returned."""
    out = tmp / f"backlog-{nodes}"
    start = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(time.time() - 32 * 60))
    _agent_shaped(out, nodes, "30m", start)
    lines = gzip.decompress((out / "telemetry.lp.gz").read_bytes()).splitlines()
    done: dict = {}

    def drain():
        for i in range(0, len(lines), 5000):
            db.write("fleet", b"\n".join(lines[i:i + 5000]).decode())
        done.update(lines=len(lines), at=time.time())

    return threading.Thread(target=drain, daemon=True), done


def bench_latency(quick: bool, tmp: Path, backlog_nodes: int = 0) -> list[dict]:
    """On-time pages' latency; with ``backlog_nodes``, while that many other nodes' 30-minute
    backlog lands in the store a few seconds into the run (late data must not delay them)."""
    from tests.alerting_receiver import Receiver
    from tests.servers import Alertmanager, InfluxDB1, free_port

    faults = 4 if quick else 10
    every = 3.0
    port = free_port()
    rows = []
    with (
        InfluxDB1(tmp / f"influx-live-{backlog_nodes}") as db,
        Receiver() as rx_l,
        Receiver() as rx_f,
        Alertmanager(tmp / "am-l", rx_l.url + "/h") as am_l,
        Alertmanager(tmp / "am-f", rx_f.url + "/h") as am_f,
    ):
        db.create_db("fleet")
        db.query(
            f'CREATE SUBSCRIPTION "an" ON "fleet"."autogen" DESTINATIONS ALL \'http://127.0.0.1:{port}\''
        )
        store = ["--influx-url", db.url, "--influx-db", "fleet", "--poll", "1s", "--grace", "1s"]
        modes = (
            (["--listen", f"127.0.0.1:{port}"], am_l, f"l{backlog_nodes}.db"),
            (["--follow", "--since", "1m"], am_f, f"f{backlog_nodes}.db"),
        )
        procs = [
            subprocess.Popen(
                [*GPUFLEET, "analyze", *mode, *store, "--sink", f"alertmanager={am.url}",
                 "--state", str(tmp / st)],
                cwd=ROOT,
                stdout=subprocess.DEVNULL,
                stderr=(tmp / f"{st}.log").open("w"),
            )
            for mode, am, st in modes
        ]
        late = _backlog(db, tmp, backlog_nodes) if backlog_nodes else None
        time.sleep(4)  # both interpreters up
        w = _Writer(db, 4 * (faults + 1), every, faults)
        w.start()
        if late is not None:
            time.sleep(every / 2)  # the first DBE is due at ``every``: the backlog lands before it
            late[0].start()
        time.sleep(every * (faults + 1) + 8)
        w.stop.set()
        for p in procs:
            p.terminate()
            p.wait(30)
        for name, rx in (("--listen (subscription)", rx_l), ("--follow", rx_f)):
            first: dict[str, float] = {}
            for req in rx.requests:
                for a in req["json"]["alerts"]:
                    key = f"{a['labels'].get('host')}/{a['labels'].get('gpu')}"
                    if a["status"] == "firing":
                        first.setdefault(key, req["wall"])
            lat = sorted(first[k] - w.landed[k] for k in w.landed if k in first)
            during = ""
            if late is not None:
                name += f" while {backlog_nodes} nodes' 30 min backlog lands"
                during = (f"; backlog {late[1].get('lines', 0):,} lines, in the store "
                          f"{late[1].get('at', math.nan) - w.t_start:.1f} s into the run")
            if not lat:
                rows.append(_row(f"online latency {name}", "failed", "s", "<= 2 polls", "no alert arrived"))
                continue
            p95 = lat[min(len(lat) - 1, int(round(0.95 * (len(lat) - 1))))]
            rows.append(
                _row(
                    f"online latency {name}: row written -> webhook",
                    statistics.median(lat),
                    "s (median)",
                    "<= 2 polls + Alertmanager's group_wait",
                    f"p95 {p95:.2f} s, max {lat[-1]:.2f} s, {len(lat)}/{len(w.landed)} DBEs paged; poll 1 s, "
                    f"grace 1 s, Alertmanager group_wait 1 s{during}",
                )
            )
    return rows


def run(quick: bool) -> list[dict]:
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        latency = bench_latency(quick, tmp) + bench_latency(quick, tmp, 4 if quick else 16)
        return bench_paths(quick, tmp) + latency + bench_memory(quick, tmp) + bench_memory_live(quick, tmp)


if __name__ == "__main__":  # pragma: no cover
    for row in run(quick="--quick" in sys.argv):
        print(row)
