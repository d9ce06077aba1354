"""XID and other driver events, from two independent paths, as ``gpu_event`` rows.

1. **NVML event set** (``source=nvml``), in its own thread: ``nvmlEventSetCreate``, then
   ``nvmlDeviceRegisterEvents`` per GPU for the supported subset of XID critical errors, single/
   double-bit ECC, DRAM retirement (event and failure), poison errors, GPU unavailable and
   recovery-action events, then ``nvmlEventSetWait`` with a short timeout in a loop. Events queue
   up until the next ``collect``.
2. **Kernel log** (``source=kmsg``): ``NVRM: Xid (PCI:0000:xx:00): N, ...`` lines read without
   blocking from ``/dev/kmsg`` (kernel timestamps kept), a file that is appended to (``tail -f``
   semantics, rotation and truncation followed), a FIFO, or the journal
   (``journalctl _TRANSPORT=kernel -f -o json``, kernel timestamps kept). This path needs no
   NVML at all, so XIDs are still caught when NVML is wedged. With a ``state_dir`` the journal
   cursor / ``/dev/kmsg`` sequence number is kept across restarts: XIDs logged while the agent
   was stopped are delivered at its next start, once.

An XID seen by both paths is one row (the kernel log's); see :class:`XidCollector`.

Each event becomes one row: tags gpu/uuid/model (mapped from the PCI bus id through the
backend's ``nvmlDeviceGetPciInfo``; left out when the address is not one of this node's GPUs),
type (``xid``, ``ecc_sbe``, ``ecc_dbe``, ...), source; fields code, pid, process, message,
pci_bus_id, and severity/action from ``gpufleet/xid_catalogue.toml`` (NVIDIA's Xid catalog).

Formats parsed (several driver generations; see tests/fixtures/kmsg/):
``NVRM: Xid (0000:01:00): 79, GPU has fallen off the bus.`` (old, no ``PCI:``),
``NVRM: Xid (PCI:0000:3b:00): 31, Ch 00000010, intr 10000000. MMU Fault: ...`` (R450-R470),
``NVRM: Xid (PCI:0000:3b:00): 31, pid=2403, name=python, Ch 00000008, ...`` (R515 and newer),
``pid='<unknown>', name=<unknown>``, ``pid='N/A'``, and dmesg/syslog/kmsg prefixes. A line cut
off before the comma that ends the code is dropped (``79`` truncated to ``7`` must not be read).
"""

from __future__ import annotations

import collections
import ctypes
import errno
import logging
import os
import queue
import re
import shutil
import stat
import subprocess
import threading
import time
from pathlib import Path

from gpufleet.agent.model import STATE_DIR, Node, Sample, register

from gpufleet import catalogue
from gpufleet.errors import ConfigError, GpufleetError
from gpufleet.net import backoff_delay
from gpufleet.options import Option

log = logging.getLogger(__name__)


# ------------------------------------------------------------------------------ kernel log
_XID = re.compile(
    r"NVRM: Xid \((?:PCI:)?(?P<pci>[0-9A-Fa-f]{4,8}:[0-9A-Fa-f]{2}:[0-9A-Fa-f]{2})(?:\.[0-7])?\):"
    r"\s*(?P<code>\d+),\s?(?P<rest>.*)$")
_PID = re.compile(r"(?:^|,\s*)pid=(?P<pid>'[^']*'|<[^>]*>|[^,\s]+)")
_NAME = re.compile(r"(?:^|,\s*)name=(?P<name>'[^']*'|<[^>]*>|[^,]*)")
_SYSLOG = re.compile(r"^[A-Z][a-z]{2}\s+\d+\s+\d\d:\d\d:\d\d\s+\S+\s+kernel:\s*")
_DMESG = re.compile(r"^\[\s*\d+\.\d+\]\s*")
_RECOVERY = re.compile(r"recovery action changed from .*? to 0x([0-9a-fA-F]+)\s*\(([^)]*)\)")


def split_kmsg_record(line: str) -> tuple[int | None, str]:
    """A ``/dev/kmsg`` record ``prio,seq,usec,flags[,...];text`` -> (usec since boot, text).

    Other lines (dmesg ``[ 12.3]``, syslog ``Mon DD hh:mm:ss host kernel:``, journal ``-o cat``)
    come back with None and the prefix removed.
    """
    head, sep, text = line.partition(";")
    if sep and head[:1].isdigit():
        parts = head.split(",")
        if len(parts) >= 4 and parts[2].isdigit():
            return int(parts[2]), text
    line = _SYSLOG.sub("", line, count=1)
    return None, _DMESG.sub("", line, count=1)


def _unquote(v: str | None) -> str | None:
    if v is None:
        return None
    v = v.strip().strip("'\"")
    return None if v in ("", "N/A", "<unknown>", "unknown") or v.startswith("<") else v


def parse_xid_line(line: str) -> dict | None:
    """One kernel log line -> {pci, code, pid?, process?, message, usec?} or None if not an XID."""
    usec, text = split_kmsg_record(line.rstrip("\r\n"))
    m = _XID.search(text)
    if not m:
        return None
    rest = m.group("rest").strip()
    out: dict = {"pci": normalise_pci(m.group("pci")), "code": int(m.group("code"))}
    if usec is not None:
        out["usec"] = usec
    pm = _PID.search(rest)
    if pm:
        pid = _unquote(pm.group("pid"))
        if pid is not None and pid.isdigit():
            out["pid"] = int(pid)
        rest = (rest[:pm.start()] + rest[pm.end():]).lstrip(", ")
    nm = _NAME.search(rest)
    if nm:
        name = _unquote(nm.group("name"))
        if name:
            out["process"] = name
        rest = (rest[:nm.start()] + rest[nm.end():]).lstrip(", ")
    out["message"] = rest.strip()[:1000]
    return out


def normalise_pci(bus_id: str | bytes) -> str:
    """Any PCI address spelling -> ``dddd:bb:dd`` lower case (domain 4 digits, no function).

    ``00000000:3B:00.0`` (NVML), ``0000:3b:00`` (XID), ``3b:00.0`` all give ``0000:3b:00``.
    """
    if isinstance(bus_id, bytes):
        bus_id = bus_id.decode("ascii", "replace")
    s = bus_id.strip().lower().split(".")[0]
    parts = s.split(":")
    if len(parts) == 2:
        parts = ["0", *parts]
    dom, bus, dev = parts[-3:]
    return f"{int(dom, 16) & 0xFFFF:04x}:{int(bus, 16):02x}:{int(dev, 16):02x}"


# ------------------------------------------------------------------------------- log sources
BOOT_ID = "/proc/sys/kernel/random/boot_id"
JOURNAL_FIELDS = "MESSAGE,_SOURCE_MONOTONIC_TIMESTAMP"  # __CURSOR and the timestamps always come


def boot_id() -> str:
    try:
        return Path(BOOT_ID).read_text().strip().replace("-", "")
    except OSError:
        return ""


def machine_id() -> str:
    try:
        return Path("/etc/machine-id").read_text().strip()
    except OSError:
        return ""


def kmsg_seq(line: str) -> int | None:
    """The sequence number of a ``/dev/kmsg`` record ``prio,seq,usec,flags;text``."""
    head, sep, _ = line.partition(";")
    parts = head.split(",", 2)
    if sep and len(parts) >= 2 and parts[0].isdigit() and parts[1].isdigit():
        return int(parts[1])
    return None


def journal_entry(line: bytes | str) -> tuple[str, int | None, str | None] | None:
    """One ``journalctl -o json`` line -> (MESSAGE, the kernel's time in ns, ``__CURSOR``).

    The kernel's time is its own stamp (``_SOURCE_MONOTONIC_TIMESTAMP``, µs since that entry's
    boot) placed on the wall clock through the entry's own realtime/monotonic pair, which holds
    for entries of an earlier boot too; without it, journald's receive time.
    """
    import json

    try:
        e = json.loads(line)
    except ValueError:
        return None
    if not isinstance(e, dict):
        return None
    msg = e.get("MESSAGE")
    if isinstance(msg, list):  # journald's JSON for binary data (bytes) or a repeated field
        msg = bytes(msg).decode("utf-8", "replace") if all(isinstance(b, int) for b in msg) \
            else str(msg[0]) if msg else ""
    if not isinstance(msg, str):
        return None

    def num(key):
        v = e.get(key)
        return int(v) if isinstance(v, str) and v.isdigit() else None

    rt, mono = num("__REALTIME_TIMESTAMP"), num("__MONOTONIC_TIMESTAMP")
    src = num("_SOURCE_MONOTONIC_TIMESTAMP")
    t_us = rt - mono + src if None not in (rt, mono, src) else rt
    cursor = e.get("__CURSOR")
    return msg, (t_us * 1000 if t_us is not None else None), cursor if isinstance(cursor, str) else None


class _Position:
    """Where a kernel-log source got to, kept in ``state_dir`` across restarts.

    One small JSON file per source (``journal.json``, ``kmsg.json``, ``journal-<hash>.json`` for
    another directory), replaced atomically. It is written for the records whose rows the agent
    has handed on (the next collect, or close), so a crash in between re-reads a few records
    (same rows, same kernel timestamps: the store keeps one) and never skips one.
    """

    def __init__(self, state_dir: str | os.PathLike, kind: str, path: str):
        import hashlib

        default = {"journal": "journal", "kmsg": "/dev/kmsg"}.get(kind)
        name = kind if path == default else f"{kind}-{hashlib.sha1(path.encode()).hexdigest()[:10]}"
        self.file = Path(state_dir) / f"{name}.json"
        self.saved: dict | None = None

    def load(self) -> dict | None:
        import json

        try:
            doc = json.loads(self.file.read_text())
        except FileNotFoundError:
            return None
        except (OSError, ValueError) as exc:
            log.warning("xid: %s unreadable (%s); the kernel log is read from this boot's start",
                        self.file, getattr(exc, "strerror", None) or exc)
            return None
        self.saved = doc if isinstance(doc, dict) else None
        return self.saved

    def save(self, doc: dict) -> None:
        import json

        if doc == self.saved:
            return
        tmp = self.file.with_name(f".{self.file.name}.{os.getpid()}.tmp")
        try:
            tmp.write_text(json.dumps(doc))
            os.replace(tmp, self.file)
            self.saved = doc
        except OSError as exc:
            log.warning("xid: cannot save the kernel-log position to %s: %s", self.file, exc.strerror or exc)


class LogSource:
    """Non-blocking reader of kernel log records from a path or the journal.

    :meth:`poll` returns ``(text, time_ns or None, position or None)`` tuples.

    ``/dev/kmsg`` (or any character device): records; with a ``state_dir`` it resumes after the
    last sequence number handed on (same boot), or reads the ring buffer from its start (another
    boot, or no position yet); without one it starts at the end unless ``replay``.
    A regular file: appended lines, from its end unless ``replay``; a rotated (new inode) or
    truncated file is reopened from its start. A FIFO: whatever writers send.
    ``journal`` (``journal:DIR`` for the journal files in DIR, e.g. the host's /var/log/journal
    mounted into a container): ``journalctl _TRANSPORT=kernel -f -o json`` as a child process,
    restarted if it dies; with a ``state_dir`` it resumes after the saved ``__CURSOR`` (also
    across a reboot) or reads this boot from its start; without one it starts now unless ``replay``.
    """

    def __init__(self, path: str, replay: bool = False, state_dir: str | os.PathLike | None = None):
        self.path = path
        self.replay = replay
        self._fd: int | None = None
        self._ino: tuple | None = None
        self._buf = b""
        self._proc: subprocess.Popen | None = None
        self.kind = "journal" if path == "journal" or path.startswith("journal:") else None
        self.journal_dir = path.partition(":")[2] if self.kind == "journal" else ""
        self.dropped = 0  # kmsg records lost to ring-buffer overrun (or overwritten while stopped)
        self.state_dir = state_dir or None
        self._pos: _Position | None = None
        self._boot = ""
        self._after_seq: int | None = None  # kmsg: records up to this one were handed on
        self._cursor: str | None = None  # journal: resume after this cursor
        self._started_cursor: str | None = None
        self._got_since_start = 0
        self._tail: list = []

    # -- position ---------------------------------------------------------------------------
    def _position(self, kind: str) -> _Position | None:
        if self.state_dir is None:
            return None
        if self._pos is None:
            self._pos = _Position(self.state_dir, kind, self.path)
            doc = self._pos.load() or {}
            self._boot = boot_id()
            if kind == "journal" and isinstance(doc.get("cursor"), str):
                self._cursor = doc["cursor"]
            elif kind == "kmsg" and doc.get("boot_id") == self._boot and isinstance(doc.get("seq"), int):
                self._after_seq = doc["seq"]
        return self._pos

    def commit(self, position) -> None:
        """Keep ``position`` (a record's cursor or sequence number) as handed on."""
        if position is None or self._pos is None:
            return
        if self.kind == "journal":
            self._cursor = position
            self._pos.save({"cursor": position})
        elif self.kind == "kmsg":
            self._after_seq = position
            self._pos.save({"boot_id": self._boot, "seq": position})

    def _journal_cmd(self) -> list[str]:
        cmd = ["journalctl", "-q", "_TRANSPORT=kernel", "-f", "-o", "json",
               f"--output-fields={JOURNAL_FIELDS}"]
        if self.journal_dir:
            cmd += ["-D", self.journal_dir]
        pos = self._position("journal")
        if self._cursor:
            # -f alone follows this boot only: -m (--merge) lifts that, so the entries of the boot
            # before a reboot that came after the cursor are read too; on the local journal,
            # this machine's entries only (-m also opens journals received from other hosts)
            cmd += ["-m", "--after-cursor", self._cursor]
            mid = machine_id() if not self.journal_dir else ""
            if mid:
                cmd.append(f"_MACHINE_ID={mid}")
        elif pos is not None or self.replay:
            cmd += ["-b", "--no-tail"]  # nothing handed on yet: this boot from its start
        else:
            cmd += ["-n", "0"]
        return cmd

    def _open(self) -> None:
        if self.kind == "journal":
            self._proc = subprocess.Popen(self._journal_cmd(), stdout=subprocess.PIPE,
                                          stderr=subprocess.DEVNULL, stdin=subprocess.DEVNULL)
            self._started_cursor, self._got_since_start = self._cursor, 0
            self._fd = self._proc.stdout.fileno()
            os.set_blocking(self._fd, False)
            return
        st = os.stat(self.path)
        fd = os.open(self.path, os.O_RDONLY | os.O_NONBLOCK)
        if stat.S_ISCHR(st.st_mode):
            self.kind = "kmsg"
            pos = self._position("kmsg")
            if not self.replay and pos is None:
                os.lseek(fd, 0, os.SEEK_END)
        elif stat.S_ISFIFO(st.st_mode):
            self.kind = "fifo"
        else:
            self.kind = "file"
            if not self.replay and self._ino is None:
                os.lseek(fd, 0, os.SEEK_END)
        self._fd, self._ino = fd, (st.st_dev, st.st_ino)

    def _reopen_if_rotated(self) -> None:
        if self.kind != "file" or self._fd is None:
            return
        try:
            st = os.stat(self.path)
        except FileNotFoundError:
            return  # rotated away, the new one not there yet: keep reading the old one
        pos = os.lseek(self._fd, 0, os.SEEK_CUR)
        if (st.st_dev, st.st_ino) != self._ino or st.st_size < pos:
            self._tail = self.read_available()  # finish the old file first
            os.close(self._fd)
            self._fd = None
            self._buf = b""
            self._open_from_start()

    def _open_from_start(self) -> None:
        st = os.stat(self.path)
        self._fd = os.open(self.path, os.O_RDONLY | os.O_NONBLOCK)
        self._ino = (st.st_dev, st.st_ino)

    def _journal_exited(self) -> None:
        rc = self._proc.returncode
        if rc and self._started_cursor and not self._got_since_start:
            log.warning("xid: journalctl refused the saved cursor (exit %s); reading this boot's kernel "
                        "log from its start", rc)
            self._cursor = None
        self.close()
        self._open()

    def read_available(self, limit: int = 1 << 20) -> list[tuple[str, int | None, object]]:
        """Every complete record available now (never blocks)."""
        if self._fd is None:
            self._open()
        if self.kind == "journal" and self._proc is not None and self._proc.poll() is not None:
            self._journal_exited()
        out: list[tuple[str, int | None, object]] = []
        got = 0
        boot_ns = None
        while got < limit:
            try:
                chunk = os.read(self._fd, 8192)
            except BlockingIOError:
                break
            except OSError as exc:
                if exc.errno == errno.EPIPE and self.kind == "kmsg":  # overrun: records lost
                    self.dropped += 1
                    continue
                raise
            if not chunk:
                break
            got += len(chunk)
            if self.kind == "kmsg":  # one record per read
                line = chunk.decode("utf-8", "replace").split("\n", 1)[0]
                seq = kmsg_seq(line)
                if seq is not None and self._after_seq is not None:
                    if seq <= self._after_seq:
                        continue  # handed on before a restart
                    if seq > self._after_seq + 1:
                        self.dropped += seq - self._after_seq - 1
                        log.warning("xid: %d kernel log records were overwritten in the ring buffer "
                                    "before they could be read", seq - self._after_seq - 1)
                    self._after_seq = None  # resumed: from here on every record is new
                usec, _ = split_kmsg_record(line)
                if usec is not None and boot_ns is None:
                    boot_ns = time.time_ns() - time.clock_gettime_ns(time.CLOCK_MONOTONIC)
                out.append((line, boot_ns + usec * 1000 if usec is not None else None, seq))
                continue
            self._buf += chunk
            *complete, self._buf = self._buf.split(b"\n")
            if self.kind == "journal":
                for c in complete:
                    e = journal_entry(c)
                    if e is not None:
                        out.append(e)
                        self._got_since_start += 1
            else:
                out.extend((c.decode("utf-8", "replace"), None, None) for c in complete)
            if len(self._buf) > 65536 and self.kind != "journal":  # a runaway line: keep its start
                out.append((self._buf[:4096].decode("utf-8", "replace"), None, None))
                self._buf = b""
        return out

    def poll(self) -> list[tuple[str, int | None, object]]:
        self._tail = []
        self._reopen_if_rotated()
        return self._tail + self.read_available()

    def close(self) -> None:
        if self._proc is not None:
            self._proc.kill()
            self._proc.wait()
            self._proc = None
        elif self._fd is not None:
            os.close(self._fd)
        self._fd = None
        self._buf = b""


def open_kernel_log(path: str, replay: bool = False, state_dir: str | None = None) -> LogSource | None:
    """The kernel-log source for ``path``.

    ``/dev/kmsg`` (or any path) that cannot be opened for want of permission (EPERM/EACCES: no
    ``CAP_SYSLOG`` with ``kernel.dmesg_restrict = 1``, or a sandboxing systemd unit) falls back to
    the journal (``journalctl _TRANSPORT=kernel``) with a one-line warning, and to None (no
    kernel-log path; the NVML events go on) when ``journalctl`` is not there either. Any other
    error is left to the first ``collect``, where it fails the collector with one line.
    """
    src = LogSource(path, replay=replay, state_dir=state_dir)
    try:
        src.read_available(limit=0)
        return src
    except PermissionError as exc:
        src.close()
        why = exc.strerror or "permission denied"
    except OSError:
        return src
    if src.kind != "journal" and shutil.which("journalctl"):
        j = LogSource("journal", replay=replay, state_dir=state_dir)
        try:
            j.read_available(limit=0)
            log.warning("xid: cannot read %s (%s); reading the kernel log from the journal "
                        "(journalctl _TRANSPORT=kernel)", path, why)
            return j
        except OSError:
            j.close()
    log.warning("xid: cannot read %s (%s) and no journal; kernel-log XIDs are off, NVML events only",
                path, why)
    return None


# ------------------------------------------------------------------------------ NVML events
def _nvml_event_types() -> dict[int, str]:
    import pynvml

    names = {
        "nvmlEventTypeXidCriticalError": "xid",
        "nvmlEventTypeSingleBitEccError": "ecc_sbe",
        "nvmlEventTypeDoubleBitEccError": "ecc_dbe",
        "nvmlEventTypeSingleBitEccErrorStorm": "ecc_sbe_storm",
        "nvmlEventTypeDramRetirementEvent": "dram_retirement",
        "nvmlEventTypeDramRetirementFailure": "dram_retirement_failure",
        "nvmlEventTypeNonFatalPoisonError": "poison_nonfatal",
        "nvmlEventTypeFatalPoisonError": "poison_fatal",
        "nvmlEventTypeGpuUnavailableError": "gpu_unavailable",
        "nvmlEventTypeGpuRecoveryAction": "recovery_action",
    }
    return {getattr(pynvml, k): v for k, v in names.items() if hasattr(pynvml, k)}


def _handle_key(h):
    try:
        return ctypes.cast(h, ctypes.c_void_p).value
    except (TypeError, ctypes.ArgumentError):
        return h if getattr(type(h), "__hash__", None) else id(h)


class NvmlEventThread(threading.Thread):
    """Waits on an NVML event set and queues (time_ns, gpu index, type, code) tuples."""

    def __init__(self, backend, handles: dict, out: queue.Queue, wait_ms: int = 500):
        super().__init__(name="gpufleet-nvml-events", daemon=True)
        self.backend, self.handles, self.out, self.wait_ms = backend, handles, out, wait_ms
        self.stop_event = threading.Event()
        self.status = "starting"
        self.registered: dict[int, int] = {}  # gpu index -> event mask registered
        self.ready = threading.Event()

    def run(self) -> None:
        import pynvml

        types = _nvml_event_types()
        wanted = 0
        for t in types:
            wanted |= t
        try:
            es = self.backend.nvmlEventSetCreate()
        except (pynvml.NVMLError, AttributeError, TypeError) as exc:
            self.status = f"unavailable: nvmlEventSetCreate: {exc}"
            self.ready.set()
            return
        keys = {}
        for idx, h in self.handles.items():
            try:
                supported = int(self.backend.nvmlDeviceGetSupportedEventTypes(h))
            except (pynvml.NVMLError, AttributeError, TypeError):
                supported = wanted
            mask = supported & wanted
            if not mask:
                continue
            try:
                self.backend.nvmlDeviceRegisterEvents(h, mask, es)
            except pynvml.NVMLError:
                # some bits refused: fall back to XID only
                try:
                    mask = mask & getattr(pynvml, "nvmlEventTypeXidCriticalError", 8)
                    self.backend.nvmlDeviceRegisterEvents(h, mask, es)
                except pynvml.NVMLError:
                    continue
            self.registered[idx] = mask
            keys[_handle_key(h)] = idx
        self.status = "registered" if self.registered else "unavailable: no GPU accepted event registration"
        self.ready.set()
        if not self.registered:
            self._free(es)
            return
        wait = getattr(self.backend, "nvmlEventSetWait_v2", None) or self.backend.nvmlEventSetWait
        errors = 0
        while not self.stop_event.is_set():
            try:
                data = wait(es, self.wait_ms)
            except pynvml.NVMLError_Timeout:
                errors = 0
                continue
            except pynvml.NVMLError as exc:
                errors += 1
                self.status = f"wait failed: {exc}"
                if self.stop_event.wait(backoff_delay(errors, 1.0, 30.0, jitter=False)):
                    break
                continue
            now = getattr(data, "timestamp_ns", None) or time.time_ns()  # a backend's own event time
            etype = int(data.eventType)
            idx = keys.get(_handle_key(data.device))
            if idx is None:
                try:
                    idx = int(self.backend.nvmlDeviceGetIndex(data.device))
                except Exception:  # noqa: BLE001 - an unknown handle still records the event
                    idx = None
            self.out.put((now, idx, types.get(etype, f"nvml_{etype}"), int(data.eventData)))
        self._free(es)

    def _free(self, es) -> None:
        try:
            self.backend.nvmlEventSetFree(es)
        except Exception:  # noqa: BLE001 - best effort at shutdown
            pass


# --------------------------------------------------------------------------------- collector
PAIR_WINDOW_NS = 5_000_000_000  # an NVML XID and a kernel-log XID this close (same GPU, code) are one
NVML_HOLD_S = 2.0  # an NVML XID waits this long for its kernel-log twin before it goes out alone


@register("xid")
class XidCollector:
    """XID/ECC events from NVML's event set and the kernel log (either may be turned off).

    Options: ``backend`` (the NVML backend object; None: kernel log only), ``nvml_events``
    (default True), ``kmsg`` (``/dev/kmsg`` default, a file or FIFO path, ``journal`` or
    ``journal:DIR``, or "" for none), ``replay`` (read the log from its start: False),
    ``state_dir`` (where the kernel-log position is kept across restarts; "" for none),
    ``max_events`` per collect (1000; the rest wait for the next one), ``wait_ms`` (NVML wait
    slice, 500).

    An XID seen by both paths is one row: the kernel log's (it has the process, the message and
    the kernel's time); NVML's own row is dropped when the kernel log shows the same GPU and code
    within ``PAIR_WINDOW_NS``, one for one (a storm of N XIDs stays N rows). An NVML XID whose
    twin has not appeared yet waits ``NVML_HOLD_S`` (to the next collect) before it goes out
    alone; without a kernel-log path it goes out at once.
    """

    needs_nvml = True
    measurements = ("gpu_event",)
    options = (  # the [xid] section
        Option("kmsg", "path", "/dev/kmsg", "the kernel log: /dev/kmsg, a file (kern.log) or FIFO, "
               "\"journal\", \"journal:DIR\", \"\" = none; /dev/kmsg refused (EPERM/EACCES) falls back to "
               "the journal, then to NVML events only"),
        Option("nvml_events", "bool", True, "the NVML event-set thread"),
        Option("replay", "bool", False, "read the log from its start instead of from now"),
        Option("max_events", "int", 1000, "per collect; the rest wait for the next one", 1, 1_000_000),
        Option("wait_ms", "int", 500, "NVML event wait slice, milliseconds", 10, 60_000),
        Option("state_dir", "path", f"{STATE_DIR}/xid", "keeps the kernel-log position (journal cursor, "
               "/dev/kmsg sequence number) so XIDs logged while the agent was stopped arrive at its next "
               "start; \"\" = none"),
    )

    @classmethod
    def describe(cls, table: dict, node: Node) -> tuple[str, str]:
        src = f"kernel log {table['kmsg']} (else the journal)" if table["kmsg"] else "no kernel log"
        ev = "NVML events" if table["nvml_events"] and node.gpus else (
            "no NVML events (no GPU)" if table["nvml_events"] else "NVML events off")
        return "on", f"XID lines from the {src}; {ev}"

    def __init__(self, backend=None, nvml_events: bool = True, kmsg: str = "/dev/kmsg",
                 replay: bool = False, max_events: int = 1000, wait_ms: int = 500,
                 state_dir: str = ""):
        if not kmsg and not (nvml_events and backend is not None):
            raise ConfigError("xid: needs kmsg (a path or 'journal') or nvml_events with a backend")
        if kmsg.startswith("journal:") and not os.path.isdir(kmsg[8:]):
            raise ConfigError(f"xid.kmsg: {kmsg[8:]} is not a directory")
        if kmsg and kmsg != "journal" and not kmsg.startswith("journal:") and not os.path.exists(kmsg):
            raise ConfigError(f"xid.kmsg: {kmsg} does not exist")
        if state_dir and kmsg:  # only the kernel log has a position to keep
            try:
                os.makedirs(state_dir, exist_ok=True)
            except OSError as exc:  # e.g. the packaged default outside the unit, unprivileged
                log.warning("xid.state_dir %s: %s; the kernel log is read from now at each start",
                            state_dir, exc.strerror or exc)
                state_dir = ""
        self.backend = backend
        self.max_events = int(max_events)
        self.source = open_kernel_log(kmsg, replay, state_dir or None) if kmsg else None
        self._queue: queue.Queue = queue.Queue()
        self._pending: collections.deque = collections.deque()
        self._handed: object = None  # position of the last record whose rows went out
        self._held: list = []  # NVML XIDs waiting for their kernel-log twin: (t, idx, code, since)
        self._recent: collections.deque = collections.deque()  # kernel-log XIDs: [t, idx, code, paired]
        self.paired = 0  # NVML XIDs folded into their kernel-log row
        self._gpus: dict[str, dict] = {}  # pci -> {gpu, uuid, model}
        self._by_index: dict[int, dict] = {}
        self._handles: dict[int, object] = {}
        self.malformed = 0
        if backend is not None:
            self._map_gpus()
        self.thread: NvmlEventThread | None = None
        if nvml_events and backend is not None and self._handles:
            self.thread = NvmlEventThread(backend, self._handles, self._queue, wait_ms=wait_ms)
            self.thread.start()
            self.thread.ready.wait(2.0)  # registered before the first poll: no event falls between
        self._kmsg = kmsg

    def _map_gpus(self) -> None:
        b = self.backend
        try:
            n = int(b.nvmlDeviceGetCount())
        except Exception:  # noqa: BLE001 - NVML down: the kernel log still works, unmapped
            return
        for i in range(n):
            try:
                h = b.nvmlDeviceGetHandleByIndex(i)
            except Exception:  # noqa: BLE001
                continue
            ident = {"gpu": str(i)}
            for key, fn in (("uuid", "nvmlDeviceGetUUID"), ("model", "nvmlDeviceGetName")):
                try:
                    v = getattr(b, fn)(h)
                    ident[key] = v.decode() if isinstance(v, bytes) else str(v)
                except Exception:  # noqa: BLE001 - absent, not fatal
                    pass
            try:
                pci = b.nvmlDeviceGetPciInfo(h)
                bus = getattr(pci, "busId", None) or getattr(pci, "busIdLegacy", None)
                if bus:
                    ident["pci"] = normalise_pci(bus)
                    self._gpus[ident["pci"]] = ident
            except Exception:  # noqa: BLE001
                pass
            self._by_index[i] = ident
            self._handles[i] = h

    def _row(self, t_ns: int, ident: dict | None, etype: str, source: str, code: int | None,
             pci: str | None = None, pid=None, process=None, message: str | None = None) -> Sample:
        tags = {"type": etype, "source": source}
        if ident:
            tags.update({k: ident[k] for k in ("gpu", "uuid", "model") if k in ident})
            pci = pci or ident.get("pci")
        fields: dict[str, object] = {}
        if code is not None:
            fields["code"] = int(code)
        if pid is not None:
            fields["pid"] = int(pid)
        if process:
            fields["process"] = process
        if message:
            fields["message"] = message
        if pci:
            fields["pci_bus_id"] = pci
        if etype == "xid" and code is not None:
            info = catalogue.xids().get(int(code))
            if info:
                sev, action = info["severity"], info["action"]
                if int(code) == 154 and message:
                    m = _RECOVERY.search(message)
                    if m:
                        action = m.group(2).strip() or action
                        sev = "info" if int(m.group(1), 16) == 0 else sev
                fields["severity"], fields["action"] = sev, action
        return Sample("gpu_event", tags, fields, t_ns)

    def collect(self, now_ns: int) -> list[Sample]:
        if self.source is None and (self.thread is None or not self.thread.registered):
            raise GpufleetError(f"xid: no event source (kernel log {self._kmsg or 'off'}: unavailable; "
                                f"NVML events: {self.nvml_status})")
        if self.source is not None:  # what the last collect returned has been handed on by now
            self.source.commit(self._handed)
        out: list[Sample] = []
        while True:
            try:
                t, idx, etype, data = self._queue.get_nowait()
            except queue.Empty:
                break
            if etype == "xid" and self.source is not None and idx is not None:
                self._held.append((t, idx, int(data), time.monotonic()))
                continue
            ident = self._by_index.get(idx) if idx is not None else None
            code = data if etype == "xid" else (data or None)
            out.append(self._row(t, ident, etype, "nvml", code,
                                 message=None if etype == "xid" else f"NVML event {etype}"))
        if self.source is not None:
            try:
                self._pending.extend(self.source.poll())
            except OSError as exc:  # e.g. /dev/kmsg without CAP_SYSLOG, journalctl missing
                if not out and not self._pending and not self._held:
                    raise GpufleetError(f"xid: cannot read {self.source.path}: "
                                        f"{exc.strerror or exc}") from None
            boot_ns = None
            while self._pending and len(out) < self.max_events:
                line, t, position = self._pending.popleft()
                if position is not None:
                    self._handed = position
                if "Xid" not in line:
                    continue
                ev = parse_xid_line(line)
                if ev is None:
                    if "NVRM: Xid" in line:
                        self.malformed += 1
                    continue
                if t is None:
                    t = now_ns
                    if "usec" in ev:
                        if boot_ns is None:
                            boot_ns = time.time_ns() - time.clock_gettime_ns(time.CLOCK_MONOTONIC)
                        t = boot_ns + ev["usec"] * 1000
                ident = self._gpus.get(ev["pci"])
                if ident is not None:
                    self._recent.append([t, int(ident["gpu"]), ev["code"], False])
                out.append(self._row(t, ident, "xid", "kmsg", ev["code"], ev["pci"],
                                     ev.get("pid"), ev.get("process"), ev.get("message")))
        out.extend(self._release_held())
        return out

    def _release_held(self) -> list[Sample]:
        """NVML XIDs: folded into a kernel-log twin, held a little longer, or sent alone."""
        out = []
        keep = []
        now = time.monotonic()
        for t, idx, code, since in self._held:
            twin = next((r for r in self._recent if not r[3] and r[1] == idx and r[2] == code
                         and abs(r[0] - t) <= PAIR_WINDOW_NS), None)
            if twin is not None:
                twin[3] = True
                self.paired += 1
            elif now - since < NVML_HOLD_S and self.source is not None:
                keep.append((t, idx, code, since))
            else:
                out.append(self._row(t, self._by_index.get(idx), "xid", "nvml", code))
        self._held = keep
        horizon = time.time_ns() - 2 * PAIR_WINDOW_NS - int(NVML_HOLD_S * 1e9)
        while self._recent and (self._recent[0][0] < horizon or len(self._recent) > 10_000):
            self._recent.popleft()
        return out

    @property
    def nvml_status(self) -> str:
        return self.thread.status if self.thread else "off"

    def close(self) -> None:
        if self.thread is not None:
            self.thread.stop_event.set()
            self.thread.join(timeout=2)
        if self.source is not None:
            self.source.commit(self._handed)  # the last collect's rows went out before close
            self.source.close()
