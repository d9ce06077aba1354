"""XID and other driver events, from two independent paths, as ``gpu_event`` rows.

1. **NVML event set** (``source=nvml``), in its own thread: ``nvmlEventSetCreate``, then
   ``nvmlDeviceRegisterEvents`` per GPU for the supported subset of XID critical errors, single/
   double-bit ECC, DRAM retirement (event and failure), poison errors, GPU unavailable and
   recovery-action events, then ``nvmlEventSetWait`` with a short timeout in a loop. Events queue
   up until the next ``collect``.
2. **Kernel log** (``source=kmsg``): ``NVRM: Xid (PCI:0000:xx:00): N, ...`` lines read without
   blocking from ``/dev/kmsg`` (kernel timestamps kept), a file that is appended to (``tail -f``
   semantics, rotation and truncation followed), a FIFO, or ``journalctl -k -f -o cat``. This
   path needs no NVML at all, so XIDs are still caught when NVML is wedged.

Each event becomes one row: tags gpu/uuid/model (mapped from the PCI bus id through the
backend's ``nvmlDeviceGetPciInfo``; left out when the address is not one of this node's GPUs),
type (``xid``, ``ecc_sbe``, ``ecc_dbe``, ...), source; fields code, pid, process, message,
pci_bus_id, and severity/action from ``agent/xid_catalogue.toml`` (NVIDIA's Xid catalog).

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
import tomllib
from functools import cache
from pathlib import Path

from agent.model import Sample, register
from gpufleet.errors import ConfigError, GpufleetError

CATALOGUE = Path(__file__).resolve().parent.parent / "xid_catalogue.toml"
log = logging.getLogger(__name__)


@cache
def xid_catalogue() -> dict[int, dict]:
    """code -> {name, mnemonic, severity, action, investigate?, secondary?, description?}."""
    with CATALOGUE.open("rb") as f:
        doc = tomllib.load(f)
    return {int(k): v for k, v in doc.get("xid", {}).items()}


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
class LogSource:
    """Non-blocking reader of kernel log lines from a path or ``journal``.

    ``/dev/kmsg`` (or any character device): records, starting at the end unless ``replay``.
    A regular file: appended lines, from its end unless ``replay``; a rotated (new inode) or
    truncated file is reopened from its start. A FIFO: whatever writers send.
    ``journal``: ``journalctl -k -f -o cat -n 0`` as a child process, restarted if it dies.
    """

    def __init__(self, path: str, replay: bool = False):
        self.path = path
        self.replay = replay
        self._fd: int | None = None
        self._ino: tuple | None = None
        self._buf = b""
        self._proc: subprocess.Popen | None = None
        self.kind = "journal" if path == "journal" else None
        self.dropped = 0  # kmsg records lost to ring-buffer overrun

    def _open(self) -> None:
        if self.kind == "journal":
            self._proc = subprocess.Popen(["journalctl", "-k", "-f", "-o", "cat", "-n", "0"],
                                          stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                                          stdin=subprocess.DEVNULL)
            self._fd = self._proc.stdout.fileno()
            os.set_blocking(self._fd, False)
            return
        st = os.stat(self.path)
        fd = os.open(self.path, os.O_RDONLY | os.O_NONBLOCK)
        if stat.S_ISCHR(st.st_mode):
            self.kind = "kmsg"
            if not self.replay:
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
            self.read_available()  # finish the old file first
            os.close(self._fd)
            self._fd = None
            self._buf = b""
            self._open_from_start()

    def _open_from_start(self) -> None:
        st = os.stat(self.path)
        self._fd = os.open(self.path, os.O_RDONLY | os.O_NONBLOCK)
        self._ino = (st.st_dev, st.st_ino)

    def read_available(self, limit: int = 1 << 20) -> list[str]:
        """Every complete line available now (never blocks)."""
        if self._fd is None:
            self._open()
        if self.kind == "journal" and self._proc is not None and self._proc.poll() is not None:
            self.close()
            self._open()
        lines: list[str] = []
        got = 0
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
                lines.append(chunk.decode("utf-8", "replace").split("\n", 1)[0])
                continue
            self._buf += chunk
            *complete, self._buf = self._buf.split(b"\n")
            lines.extend(c.decode("utf-8", "replace") for c in complete)
            if len(self._buf) > 65536:  # a runaway line: keep its start, drop the rest
                lines.append(self._buf[:4096].decode("utf-8", "replace"))
                self._buf = b""
        return lines

    def poll(self) -> list[str]:
        self._reopen_if_rotated()
        return self.read_available()

    def close(self) -> None:
        if self._proc is not None:
            self._proc.kill()
            self._proc.wait()
            self._proc = None
        elif self._fd is not None:
            os.close(self._fd)
        self._fd = None


def open_kernel_log(path: str, replay: bool = False) -> LogSource | None:
    """The kernel-log source for ``path``, tail started now.

    ``/dev/kmsg`` (or any path) that cannot be opened for want of permission (EPERM/EACCES: no
    ``CAP_SYSLOG`` with ``kernel.dmesg_restrict = 1``, or a sandboxing systemd unit) falls back to
    the journal (``journalctl -k -f``) with a one-line warning, and to None (no kernel-log path; the
    NVML events go on) when ``journalctl`` is not there either. Any other error is left to the
    first ``collect``, where it fails the collector with one line.
    """
    src = LogSource(path, replay=replay)
    try:
        src.read_available(limit=0)
        return src
    except PermissionError as exc:
        src.close()
        why = exc.strerror or "permission denied"
    except OSError:
        return src
    if path != "journal" and shutil.which("journalctl"):
        j = LogSource("journal")
        try:
            j.read_available(limit=0)
            log.warning("xid: cannot read %s (%s); reading the kernel log from the journal "
                        "(journalctl -k -f)", path, why)
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
                if self.stop_event.wait(min(30.0, 0.5 * 2 ** min(errors, 6))):
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
@register("xid")
class XidCollector:
    """XID/ECC events from NVML's event set and the kernel log (either may be turned off).

    Options: ``backend`` (the NVML backend object; None: kernel log only), ``nvml_events``
    (default True), ``kmsg`` (``/dev/kmsg`` default, a file or FIFO path, ``journal``, or "" for
    none), ``replay`` (read the log from its start: False), ``max_events`` per collect (1000;
    the rest wait for the next one), ``wait_ms`` (NVML wait slice, 500).
    """

    def __init__(self, backend=None, nvml_events: bool = True, kmsg: str = "/dev/kmsg",
                 replay: bool = False, max_events: int = 1000, wait_ms: int = 500,
                 config: dict | None = None):
        from agent.collectors.ipmi import section_options

        o = section_options(config, "xid", XidCollector.__init__, locals())
        if o:
            return self.__init__(**o)
        if not kmsg and not (nvml_events and backend is not None):
            raise ConfigError("xid: needs kmsg (a path or 'journal') or nvml_events with a backend")
        if kmsg and kmsg != "journal" and not os.path.exists(kmsg):
            raise ConfigError(f"xid.kmsg: {kmsg} does not exist")
        self.backend = backend
        self.max_events = int(max_events)
        self.source = open_kernel_log(kmsg, replay) if kmsg else None
        self._queue: queue.Queue = queue.Queue()
        self._pending: collections.deque = collections.deque()
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
            info = xid_catalogue().get(int(code))
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
        out: list[Sample] = []
        while True:
            try:
                t, idx, etype, data = self._queue.get_nowait()
            except queue.Empty:
                break
            ident = self._by_index.get(idx) if idx is not None else None
            code = data if etype == "xid" else (data or None)
            out.append(self._row(t, ident, etype, "nvml", code,
                                 message=None if etype == "xid" else f"NVML event {etype}"))
        if self.source is not None:
            try:
                self._pending.extend(self.source.poll())
            except OSError as exc:  # e.g. /dev/kmsg without CAP_SYSLOG, journalctl missing
                if not out and not self._pending:
                    raise GpufleetError(f"xid: cannot read {self.source.path}: "
                                        f"{exc.strerror or exc}") from None
            boot_ns = None
            while self._pending and len(out) < self.max_events:
                line = self._pending.popleft()
                if "Xid" not in line:
                    continue
                ev = parse_xid_line(line)
                if ev is None:
                    if "NVRM: Xid" in line:
                        self.malformed += 1
                    continue
                t = now_ns
                if "usec" in ev:
                    if boot_ns is None:
                        boot_ns = time.time_ns() - time.clock_gettime_ns(time.CLOCK_MONOTONIC)
                    t = boot_ns + ev["usec"] * 1000
                out.append(self._row(t, self._gpus.get(ev["pci"]), "xid", "kmsg", ev["code"], ev["pci"],
                                     ev.get("pid"), ev.get("process"), ev.get("message")))
        return out

    @property
    def nvml_status(self) -> str:
        return self.thread.status if self.thread else "off"

    def close(self) -> None:
        if self.thread is not None:
            self.thread.stop_event.set()
            self.thread.join(timeout=2)
        if self.source is not None:
            self.source.close()
