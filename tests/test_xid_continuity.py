"""XID continuity across agent restarts, against the real ``journalctl``.

The journal here is real: journal files written by ``systemd-journal-remote`` (from journald's
export format, the same files journald writes) and read by the system's ``journalctl`` through
``xid.kmsg = "journal:DIR"`` (``journalctl -D DIR``): the cursor, ``--after-cursor``, ``-f`` and
the JSON output are journalctl's own. The kernel entries carry the machine's current boot id, as
journald gives them. Without ``systemd-journal-remote`` (Debian: ``systemd-journal-remote``;
``GPUFLEET_JOURNAL_REMOTE`` may name the binary) these tests are skipped.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import time
import uuid
from pathlib import Path

import pynvml
import pytest
from gpufleet.agent import kernel_log
from gpufleet.agent.backends.recorded import RecordedBackend
from gpufleet.agent.collectors import xid as xidmod
from gpufleet.agent.collectors.xid import XidCollector

from tests.test_xid import H200, EventBackend, append


def _journal_remote() -> str | None:
    cands = [os.environ.get("GPUFLEET_JOURNAL_REMOTE", ""), shutil.which("systemd-journal-remote") or "",
             "/lib/systemd/systemd-journal-remote", "/usr/lib/systemd/systemd-journal-remote"]
    return next((c for c in cands if c and os.access(c, os.X_OK)), None)


REMOTE = _journal_remote()
needs_journal = pytest.mark.skipif(REMOTE is None or shutil.which("journalctl") is None,
                                   reason="needs journalctl and systemd-journal-remote")
BOOT = kernel_log.boot_id()


class Journal:
    """A journal directory that kernel entries are appended to, as journald would."""

    def __init__(self, path: Path):
        self.dir = path
        self.dir.mkdir()
        self.file = self.dir / "system.journal"
        self.t0 = int(time.time() * 1e6) - 60_000_000
        self.n = 0

    def kernel(self, message: str, boot: str = BOOT, src_mono_us: int | None = None) -> int:
        """Append one kernel entry; returns the kernel's time (ns) the agent must report."""
        self.n += 1
        mono = 5_000_000_000 + self.n * 1000  # journald's monotonic clock at receive time (µs)
        src = src_mono_us if src_mono_us is not None else mono - 1234  # the kernel's own stamp
        rt = self.t0 + self.n * 1000
        rec = (f"__REALTIME_TIMESTAMP={rt}\n__MONOTONIC_TIMESTAMP={mono}\n_BOOT_ID={boot}\n"
               f"_TRANSPORT=kernel\nSYSLOG_IDENTIFIER=kernel\nPRIORITY=4\n"
               f"_SOURCE_MONOTONIC_TIMESTAMP={src}\nMESSAGE={message}\n\n")
        subprocess.run([REMOTE, "-o", str(self.file), "-"], input=rec.encode(), check=True,
                       capture_output=True, timeout=30)
        return (rt - mono + src) * 1000


def collect_until(col, want: int, timeout: float = 10.0, settle: float = 0.8) -> list:
    """Rows until ``want`` arrived, then a little longer (so duplicates would show)."""
    rows: list = []
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        rows += col.collect(time.time_ns())
        if len(rows) >= want:
            break
        time.sleep(0.05)
    end = time.monotonic() + settle
    while time.monotonic() < end:
        rows += col.collect(time.time_ns())
        time.sleep(0.05)
    return rows


def xid(tag: str, code: int = 79) -> str:
    return f"NVRM: Xid (PCI:0000:00:06): {code}, pid=4242, name=train.py, GPU has fallen off the bus. {tag}"


@needs_journal
@pytest.mark.slow
def test_xids_logged_while_stopped_are_delivered_once_after_start(tmp_path):
    j = Journal(tmp_path / "journal")
    state = tmp_path / "state"
    tag = uuid.uuid4().hex[:8]

    def start():
        return XidCollector(backend=RecordedBackend(H200), nvml_events=False, kmsg=f"journal:{j.dir}",
                            state_dir=str(state))

    j.kernel("usb 1-1: new high-speed USB device")  # not an XID: read past, never a row
    t_a = j.kernel(xid(f"A-{tag}"))
    col = start()  # first start, no saved position: this boot from its start
    try:
        rows = collect_until(col, 1)
    finally:
        col.close()
    assert [r.fields["message"].split()[-1] for r in rows] == [f"A-{tag}"]
    a = rows[0]
    assert a.time_ns == t_a  # the kernel's own time, not the time it was read
    assert a.tags == {"type": "xid", "source": "kmsg", "gpu": "0",
                      "uuid": "GPU-5e1f0a2c-7d31-4b58-9c2e-0000000a0200", "model": "NVIDIA H200"}
    assert a.fields["pid"] == 4242 and a.fields["process"] == "train.py" and a.fields["code"] == 79
    saved = json.loads(kernel_log.SavedPosition(state, "journal", f"journal:{j.dir}").file.read_text())
    assert saved["cursor"].startswith("s=")

    # the agent is stopped (an upgrade, a restart after the GPU failed): the kernel goes on logging,
    # including an entry of the boot before a reboot
    t_b = j.kernel(xid(f"B-{tag}", 48))
    t_c = j.kernel(xid(f"C-{tag}", 13), boot=uuid.uuid4().hex, src_mono_us=777_000)
    col = start()
    try:
        rows = collect_until(col, 2)
    finally:
        col.close()
    assert [(r.fields["message"].split()[-1], r.fields["code"], r.time_ns) for r in rows] == [
        (f"B-{tag}", 48, t_b), (f"C-{tag}", 13, t_c)]

    col = start()  # a third start with nothing new: nothing again
    try:
        assert collect_until(col, 1, timeout=1.5) == []
        t_d = j.kernel(xid(f"D-{tag}", 31))  # while running: followed (journalctl -f)
        rows = collect_until(col, 1)
        assert [(r.fields["code"], r.time_ns) for r in rows] == [(31, t_d)]
    finally:
        col.close()


@needs_journal
def test_a_crash_before_handing_on_rereads_never_skips(tmp_path):
    """The position kept is that of rows already handed on: a collect whose rows were lost
    (the process died before the next collect) is read again after the restart."""
    j = Journal(tmp_path / "journal")
    state = tmp_path / "state"
    j.kernel(xid("first"))
    col = XidCollector(nvml_events=False, kmsg=f"journal:{j.dir}", state_dir=str(state))
    try:
        assert len(collect_until(col, 1)) == 1
        col.collect(time.time_ns())  # the next collect: "first" was handed on, its cursor is kept
        j.kernel(xid("second"))
        assert [r.fields["message"].split()[-1] for r in collect_until(col, 1, settle=0)] == ["second"]
    finally:  # killed here: no close, no further collect, "second" was never handed on
        col.source._proc.kill()
        col.source._proc.wait()
    col = XidCollector(nvml_events=False, kmsg=f"journal:{j.dir}", state_dir=str(state))
    try:
        assert [r.fields["message"].split()[-1] for r in collect_until(col, 1)] == ["second"]
    finally:
        col.close()


@needs_journal
def test_a_bad_saved_cursor_falls_back_to_this_boot(tmp_path, caplog):
    j = Journal(tmp_path / "journal")
    state = tmp_path / "state"
    state.mkdir()
    j.kernel(xid("only"))
    saved = kernel_log.SavedPosition(state, "journal", f"journal:{j.dir}").file
    saved.write_text(json.dumps({"cursor": "bad"}))
    col = XidCollector(nvml_events=False, kmsg=f"journal:{j.dir}", state_dir=str(state))
    try:
        rows = collect_until(col, 1)
    finally:
        col.close()
    assert [r.fields["message"].split()[-1] for r in rows] == ["only"]
    assert "refused the saved cursor" in caplog.text


def test_journal_json_entries():
    line = json.dumps({"__CURSOR": "s=1;i=2", "__REALTIME_TIMESTAMP": "1700000000500000",
                       "__MONOTONIC_TIMESTAMP": "9000000", "_SOURCE_MONOTONIC_TIMESTAMP": "8999000",
                       "MESSAGE": [78, 86, 82, 77, 58]})  # binary MESSAGE: a byte array
    assert kernel_log.journal_entry(line) == ("NVRM:", (1700000000500000 - 1000) * 1000, "s=1;i=2")
    no_src = json.dumps({"__CURSOR": "c", "__REALTIME_TIMESTAMP": "5", "MESSAGE": "x"})
    assert kernel_log.journal_entry(no_src) == ("x", 5000, "c")
    assert kernel_log.journal_entry(b"{not json") is None


def _kmsg_writable():
    if os.environ.get("GPUFLEET_TEST_WRITE_KMSG") != "1":
        return False
    try:
        with open("/dev/kmsg", "w"), open("/dev/kmsg", "rb"):
            return True
    except OSError:
        return False


@pytest.mark.skipif(not _kmsg_writable(), reason="opt in with GPUFLEET_TEST_WRITE_KMSG=1")
def test_dev_kmsg_resumes_after_its_last_sequence_number(tmp_path):
    state = tmp_path / "state"
    tag = uuid.uuid4().hex[:10]

    def write(label, code):
        with open("/dev/kmsg", "w") as k:
            k.write(f"<4>NVRM: Xid (PCI:0000:00:06): {code}, gpufleet-test {tag}-{label}\n")

    def mine(rows):
        return [r.fields["message"].split("-")[-1] for r in rows if tag in r.fields.get("message", "")]

    write("before", 13)  # in the ring buffer before the first start: this boot, read
    col = XidCollector(kmsg="/dev/kmsg", state_dir=str(state))
    try:
        assert mine(collect_until(col, 1, timeout=3, settle=0.2)) == ["before"]
    finally:
        col.close()
    saved = json.loads((state / "kmsg.json").read_text())
    assert saved["boot_id"] == BOOT and saved["seq"] > 0
    write("stopped", 43)  # while the agent is stopped
    col = XidCollector(kmsg="/dev/kmsg", state_dir=str(state))
    try:
        rows = collect_until(col, 1, timeout=3, settle=0.2)
        assert mine(rows) == ["stopped"]
        assert abs(rows[-1].time_ns - time.time_ns()) < 5e9  # the kernel's time on the wall clock
    finally:
        col.close()
    col = XidCollector(kmsg="/dev/kmsg", state_dir=str(state))
    try:
        assert mine(collect_until(col, 1, timeout=1, settle=0.2)) == []
    finally:
        col.close()


@pytest.mark.slow
def test_an_xid_seen_by_nvml_and_the_kernel_log_is_one_row(tmp_path, monkeypatch):
    monkeypatch.setattr(xidmod, "NVML_HOLD_S", 0.3)
    log = tmp_path / "kern.log"
    log.write_text("")
    b = EventBackend()
    col = XidCollector(backend=b, kmsg=str(log), wait_ms=20)
    try:
        assert col.thread.ready.wait(5)
        # one XID 79: NVML reports it, the kernel logs it
        b.post(pynvml.nvmlEventTypeXidCriticalError, 79)
        append(log, xid("one") + "\n")
        rows = collect_until(col, 1, timeout=3, settle=0.6)
        assert [(r.tags["source"], r.fields["code"]) for r in rows] == [("kmsg", 79)]
        assert col.paired == 1
        # the kernel line first, the NVML event a collect later: still one
        append(log, xid("two", 48) + "\n")
        rows = col.collect(time.time_ns())
        b.post(pynvml.nvmlEventTypeXidCriticalError, 48)
        rows += collect_until(col, 99, timeout=0.6, settle=0)
        assert [(r.tags["source"], r.fields["code"]) for r in rows] == [("kmsg", 48)]
        # a storm of three XID 13 on both paths stays three rows
        for _ in range(3):
            b.post(pynvml.nvmlEventTypeXidCriticalError, 13)
        append(log, "".join(xid(f"s{i}", 13) + "\n" for i in range(3)))
        rows = collect_until(col, 99, timeout=0.8, settle=0)
        assert [(r.tags["source"], r.fields["code"]) for r in rows] == [("kmsg", 13)] * 3
        # an XID only NVML saw (the log line lost) goes out alone after the hold
        b.post(pynvml.nvmlEventTypeXidCriticalError, 94)
        rows = collect_until(col, 1, timeout=3, settle=0.5)
        assert [(r.tags["source"], r.tags["gpu"], r.fields["code"]) for r in rows] == [("nvml", "0", 94)]
    finally:
        col.close()


def test_without_a_kernel_log_nvml_xids_go_out_at_once():
    b = EventBackend()
    col = XidCollector(backend=b, kmsg="", wait_ms=20)
    try:
        assert col.thread.ready.wait(5)
        b.post(pynvml.nvmlEventTypeXidCriticalError, 79)
        deadline = time.monotonic() + 3
        rows = []
        while not rows and time.monotonic() < deadline:
            rows = col.collect(time.time_ns())
            time.sleep(0.01)
        assert [(r.tags["source"], r.fields["code"]) for r in rows] == [("nvml", 79)]
    finally:
        col.close()




@needs_journal
@pytest.mark.slow
def test_the_agent_delivers_xids_logged_while_it_was_stopped_once(tmp_path):
    """The real ``gpufleet agent run`` process, stopped and started again: the XID logged in
    between reaches its output once, at the kernel's time; the one before is not repeated."""
    from tests.agent_support import read_lp_dir, start_agent, stop_agent, wait_for

    j = Journal(tmp_path / "journal")
    cfg = tmp_path / "agent.toml"
    cfg.write_text(f'[agent]\nbackend = "sim"\ninterval = 1\nhost = "n1"\ncollectors = ["xid"]\n'
                   f'[xid]\nkmsg = "journal:{j.dir}"\nnvml_events = false\n'
                   f'state_dir = "{tmp_path / "state"}"\n'
                   f'[file]\ndir = "{tmp_path / "lp"}"\n')

    def xids():
        if not (tmp_path / "lp").is_dir():
            return []
        return [(p.fields["message"].split()[-1], p.time) for p in read_lp_dir(tmp_path / "lp")
                if p.measurement == "gpu_event"]

    t_a = j.kernel(xid("A"))
    proc = start_agent(tmp_path, "--config", str(cfg))
    try:
        assert wait_for(lambda: xids(), 20), (tmp_path / "agent.log").read_text()[-2000:]
        time.sleep(1.5)  # a tick or two more: nothing repeats
        assert stop_agent(proc) == 0
        t_b = j.kernel(xid("B", 48))  # while the agent is stopped
        proc = start_agent(tmp_path, "--config", str(cfg))
        assert wait_for(lambda: len(xids()) >= 2, 20), (tmp_path / "agent.log").read_text()[-2000:]
        time.sleep(1.5)
        assert stop_agent(proc) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
    assert sorted(xids()) == [("A", t_a), ("B", t_b)]
