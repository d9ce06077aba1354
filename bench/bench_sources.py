"""More sources: IPMI tools against a real ipmi_sim BMC, XID parsing/tailing, the canary, job lookup.

IPMI: wall time of one full sensor poll with FreeIPMI (the collector), ipmitool and pyghmi (when
installed), and what a bad BMC costs the poll loop (wrong password, BMC down, during backoff).
"""

from __future__ import annotations

import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))


def _timeit(fn, n: int) -> tuple[float, float]:
    ts = []
    for _ in range(n):
        t0 = time.perf_counter()
        fn()
        ts.append(time.perf_counter() - t0)
    ts.sort()
    return statistics.median(ts), ts[min(len(ts) - 1, int(len(ts) * 0.95))]


def _row(metric, value, unit, target="", note=""):
    return {"benchmark": "sources", "metric": metric, "value": value, "unit": unit, "target": target,
            "note": note}


def bench_ipmi(quick: bool) -> list[dict]:
    if not (shutil.which("ipmi_sim") and shutil.which("ipmi-sensors")):
        return [_row("ipmi", "skipped", "", note="ipmi_sim or freeipmi not installed")]
    from gpufleet.agent.collectors.ipmi import IpmiCollector, IpmiError

    from tests.ipmisim import IpmiSim

    n = 5 if quick else 30
    rows = []
    with tempfile.TemporaryDirectory() as tmp, IpmiSim(Path(tmp) / "bmc") as sim:
        time.sleep(0.5)
        col = IpmiCollector(**sim.lan_args(), workarounds="opensesspriv", sel_every=10**9, dcmi=False)
        col.collect(time.time_ns())  # SDR cache filled
        med, p95 = _timeit(lambda: col.collect(time.time_ns()), n)
        rows.append(_row("ipmi poll, freeipmi ipmi-sensors (6 sensors, LAN, cached SDR)", med * 1e3, "ms",
                         "< 1000", f"p95 {p95 * 1e3:.1f} ms"))
        lan = ["-I", "lanplus", "-C", "3", "-H", sim.host, "-p", str(sim.port), "-U", sim.user, "-E"]
        env = {**os.environ, "IPMI_PASSWORD": sim.password}
        if shutil.which("ipmitool"):
            for what in (["sdr", "list"], ["sensor"]):
                med, p95 = _timeit(lambda w=what: subprocess.run(["ipmitool", *lan, *w], env=env,
                                                                 capture_output=True, check=True), n)
                rows.append(_row(f"ipmi poll, ipmitool {' '.join(what)}", med * 1e3, "ms", "",
                                 f"p95 {p95 * 1e3:.1f} ms; text table, no event bitmask"))
        try:
            from pyghmi.ipmi import command as ghmi

            c = ghmi.Command(bmc=sim.host, userid=sim.user, password=sim.password, port=sim.port)
            med, p95 = _timeit(lambda: list(c.get_sensor_data()), n)
            rows.append(_row("ipmi poll, pyghmi get_sensor_data (in-process)", med * 1e3, "ms", "",
                             f"p95 {p95 * 1e3:.1f} ms; LAN only, no in-band"))
        except ImportError:
            rows.append(_row("ipmi poll, pyghmi", "skipped", "", note="pyghmi not installed"))
        except Exception as exc:  # noqa: BLE001 - a library failing against the BMC is a result
            rows.append(_row("ipmi poll, pyghmi", "failed", "", note=str(exc)[:80]))
        bad = IpmiCollector(**{**sim.lan_args(), "password": "wrong"}, workarounds="opensesspriv")

        def fail():
            bad._next_try = 0.0
            try:
                bad.collect(0)
            except IpmiError:
                pass
        med, _ = _timeit(fail, n)
        rows.append(_row("ipmi wrong password: time to fail", med * 1e3, "ms", "< deadline"))
        t0 = time.perf_counter()
        try:
            bad.collect(0)
        except IpmiError:
            pass
        rows.append(_row("ipmi during backoff: time to fail", (time.perf_counter() - t0) * 1e3, "ms", "< 1"))
        bad.close()
        down = IpmiCollector(**sim.lan_args(), workarounds="opensesspriv", deadline=2.0)
        sim.stop(kill=True)
        t0 = time.perf_counter()
        try:
            down.collect(0)
        except IpmiError:
            pass
        rows.append(_row("ipmi BMC down: time to fail (deadline 2 s)", (time.perf_counter() - t0), "s",
                         "<= 2"))
        down.close()
        col.close()
    return rows


def bench_xid(quick: bool) -> list[dict]:
    from gpufleet.agent.collectors.xid import XidCollector, parse_xid_line

    fx = ROOT / "tests" / "fixtures" / "kmsg"
    lines = []
    for f in ("dmesg_old.txt", "journal_new.txt", "devkmsg.txt", "garbage.txt"):
        lines += (fx / f).read_bytes().decode("utf-8", "replace").splitlines()
    reps = 200 if quick else 2000
    t0 = time.perf_counter()
    for _ in range(reps):
        for x in lines:
            parse_xid_line(x)
    dt = time.perf_counter() - t0
    rows = [_row("xid line parse", reps * len(lines) / dt, "lines/s", "", "mixed formats and garbage")]
    with tempfile.TemporaryDirectory() as tmp:
        log = Path(tmp) / "kern.log"
        log.write_text("")
        col = XidCollector(kmsg=str(log), max_events=10**6)
        col.collect(0)
        noise = "Apr  3 01:05:00 n1 kernel: usb 2-3: USB disconnect, device number 4\n"
        xid = "Apr  3 01:05:00 n1 kernel: NVRM: Xid (PCI:0000:3b:00): 13, pid=1, name=x, Graphics Exception\n"
        n = 10_000 if quick else 100_000
        with log.open("a") as f:
            f.write((noise * 99 + xid) * (n // 100))
        t0 = time.perf_counter()
        got, polls = 0, 0
        while got < n // 100 and polls < 10_000:
            got += len(col.collect(time.time_ns()))  # at most 1 MiB of log per collect
            polls += 1
        dt = time.perf_counter() - t0
        rows.append(_row("xid tail: kernel log lines per second (1% XIDs)", n / dt, "lines/s", "",
                         f"{got} events in {polls} collects"))
        med, _ = _timeit(lambda: col.collect(time.time_ns()), 50)
        rows.append(_row("xid collect with nothing new", med * 1e6, "µs", "< 1000"))
        col.close()
    return rows


def bench_canary(quick: bool) -> list[dict]:
    from gpufleet.agent.collectors.canary import CanaryCollector

    rows = []
    for size in ((128, 256) if quick else (256, 512, 1024)):
        # each check is a child process (python -m gpufleet.agent.canary_worker): the whole round trip
        col = CanaryCollector(engine="numpy", size=size, interval=0, duty=1.0, memory_bytes=8 << 20,
                              wait=60, status_every=1e18)
        col.collect(0)
        got = []
        med, _ = _timeit(lambda c=col, g=got: g.extend(c.collect(0)), 3 if quick else 10)
        start = sorted(s.fields["startup_seconds"] for s in got if s.measurement == "gpu_canary")
        work = sorted(s.fields["duration_seconds"] for s in got if s.measurement == "gpu_canary")
        rows.append(_row(f"canary CPU numpy float32 n={size} + 8 MiB pattern, child process", med * 1e3, "ms",
                         "", f"check {work[len(work) // 2] * 1e3:.1f} ms + child start-up "
                         f"{start[len(start) // 2] * 1e3:.0f} ms (interpreter, numpy import)"))
        col.close()
    ref = ROOT.parent / "shared" / "reference" / "h200" / "canary.json"  # real H200, when present
    if ref.is_file():
        for k, v in json.loads(ref.read_text()).items():
            rows.append(_row(f"canary H200 {k} (recorded)", v["ms_per_check"], "ms", "",
                             f"bitwise mismatches {v['bitwise_mismatches']}"))
    return rows


def bench_jobs(quick: bool) -> list[dict]:
    from gpufleet.agent.jobs import resolve_job

    env = {**os.environ, "SLURM_JOB_ID": "4242"}
    cmd = [sys.executable, "-c", "import time; time.sleep(30)"]
    procs = [subprocess.Popen(cmd, env=env) for _ in range(8)]
    try:
        pids = [p.pid for p in procs]
        med, _ = _timeit(lambda: resolve_job(pids), 20 if quick else 200)
        return [_row("resolve_job, 8 processes (real /proc)", med * 1e6, "µs", "< 10000")]
    finally:
        for p in procs:
            p.kill()
            p.wait()


def run(quick: bool) -> list[dict]:
    return bench_ipmi(quick) + bench_xid(quick) + bench_canary(quick) + bench_jobs(quick)


if __name__ == "__main__":
    for r in run(quick="--quick" in sys.argv):
        print(r)
