"""The spool's failure paths: a spool deleted under a running agent keeps what its open segment
holds and counts the rest as lost, also when SIGTERM follows at once (the exit line tells the
truth); an agent starting on a full disk runs degraded with one line, never a traceback, and
writes again once there is room (a real tmpfs, mounted in a user namespace)."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
import time

import pytest
from gpufleet.agent.spool import Spool, count_points

from tests.agent_support import ROOT, start_agent, stop_agent
from tests.servers import free_port


def test_a_deleted_spool_keeps_its_open_segment_and_counts_the_rest(tmp_path, caplog):
    sp = Spool(tmp_path / "sp", segment_bytes=200)
    for i in range(6):  # six ticks of 3 points, over several segments
        sp.append([f"m,t={i} v={j}i {i}" for j in range(3)])
    lines, pos = sp.read_batch(3)
    sp.ack(pos, 3)  # the first tick was delivered
    tail_points = sp.segs[-1].points
    older = sp.points - tail_points
    assert older > 0 and tail_points > 0
    shutil.rmtree(tmp_path / "sp")
    sp.check()
    assert count_points(tmp_path / "sp") == tail_points == sp.points
    assert sp.dropped_points == older
    assert f"{older} undelivered points were lost" in caplog.text and f"{tail_points} kept" in caplog.text
    got, _ = sp.read_batch()
    assert len(got) == tail_points and got[-1] == "m,t=5 v=2i 5"  # the newest, in order
    sp.append(["m,t=6 v=0i 6"])
    sp.close()
    sp = Spool(tmp_path / "sp")
    assert sp.points == tail_points + 1
    sp.close()


@pytest.mark.slow
def test_an_agent_whose_spool_is_deleted_just_before_sigterm_keeps_its_ticks(tmp_path):
    """InfluxDB down, the spool holds every tick; the directory is deleted and SIGTERM follows at
    once: the points are written back (the segment was still open), and the exit line's count is
    what the disk holds."""
    spool = tmp_path / "spool"
    proc = start_agent(tmp_path, "--backend", "sim", "--interval", "1", "--exporter", "influx",
                       "--influx-url", f"http://127.0.0.1:{free_port()}", "--spool-dir", str(spool))
    try:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and count_points(spool) < 5 * 12:  # five ticks spooled
            time.sleep(0.2)
        held = count_points(spool)
        assert held >= 60
        shutil.rmtree(spool)
        assert stop_agent(proc) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
    log = (tmp_path / "agent.log").read_text()
    m = re.search(r"influx: (\d+) points stay in the spool", log)
    assert m, log
    assert int(m.group(1)) == count_points(spool) >= held
    assert "the spool is empty" not in log and "Traceback" not in log


def _userns_tmpfs() -> bool:
    if not shutil.which("unshare"):
        return False
    r = subprocess.run(["unshare", "-Urm", "--propagation", "private", "sh", "-c",
                        "mount -t tmpfs -o size=64k tmpfs /mnt 2>/dev/null || "
                        "mount -t tmpfs -o size=64k tmpfs /tmp"], capture_output=True, timeout=20)
    return r.returncode == 0


FULL = """
set -e
mount -t tmpfs -o size=64k tmpfs "$1"
dd if=/dev/zero of="$1/filler" bs=4k 2>/dev/null || true
shift
"$@" >"$DIR.log" 2>&1 &
pid=$!
waitfor() {  # up to 60 s for the agent's log to say it (a loaded machine starts it slowly)
    i=0; while [ $i -lt 600 ] && ! grep -q "$1" "$DIR.log"; do sleep 0.1; i=$((i + 1)); done
}
waitfor "No space left on device"
rm -f "$DIR/filler"
waitfor "healthy again"
sleep 1
kill -TERM $pid
wait $pid && echo "exit 0" || echo "exit $?"
cat "$DIR.log"
"""


@pytest.mark.skipif(not _userns_tmpfs(), reason="needs unshare -Urm and a tmpfs mount (user namespaces)")
@pytest.mark.slow
def test_an_agent_starting_on_a_full_disk_runs_degraded_then_writes_again(tmp_path):
    mnt = tmp_path / "disk"
    mnt.mkdir()
    script = tmp_path / "full.sh"
    script.write_text(FULL)
    cmd = [sys.executable, "-m", "gpufleet", "agent", "run", "--backend", "sim", "--interval", "1",
           "--exporter", "influx", "--influx-url", f"http://127.0.0.1:{free_port()}",
           "--spool-dir", str(mnt / "spool")]
    r = subprocess.run(["unshare", "-Urm", "--propagation", "private", "env", f"DIR={mnt}", "sh", str(script),
                        str(mnt), *cmd], capture_output=True, text=True, cwd=ROOT, timeout=180)
    out = r.stdout + r.stderr
    assert "exit 0" in out and "Traceback" not in out and "OSError" not in out, out
    full = [line for line in out.splitlines() if "No space left on device" in line]
    assert len(full) == 1 and "degraded" in full[0], out
    assert "writing again" in out and "healthy again" in out
    m = re.search(r"influx: (\d+) points stay in the spool .*; (\d+) points were dropped", out)
    assert m and int(m.group(1)) > 0 and int(m.group(2)) > 0, out
