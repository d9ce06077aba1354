"""XID and other driver events, from two independent paths, as ``gpu_event`` rows.

1. **NVML event set** (``source=nvml``): :class:`gpufleet.agent.nvml_events.NvmlEventThread`
   waits on it in its own thread (XID critical errors, ECC, DRAM retirement, poison errors, GPU
   unavailable, recovery actions); its events queue up until the next ``collect``.
2. **Kernel log** (``source=kmsg``): ``NVRM: Xid (PCI:0000:xx:00): N, ...`` lines from
   ``/dev/kmsg``, a file, a FIFO or the journal, followed by
   :class:`gpufleet.agent.kernel_log.LogSource` (rotation, kernel timestamps, the position kept
   across restarts in ``state_dir``). This path needs no NVML at all, so XIDs are still caught
   when NVML is wedged.

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
import logging
import os
import queue
import re
import time

from gpufleet.agent.kernel_log import open_kernel_log, split_kmsg_record
from gpufleet.agent.model import STATE_DIR, Node, Sample, register
from gpufleet.agent.nvml_events import NvmlEventThread

from gpufleet import catalogue
from gpufleet.errors import ConfigError, GpufleetError
from gpufleet.options import Option

log = logging.getLogger(__name__)


# ------------------------------------------------------------------------------ XID lines
_XID = re.compile(
    r"NVRM: Xid \((?:PCI:)?(?P<pci>[0-9A-Fa-f]{4,8}:[0-9A-Fa-f]{2}:[0-9A-Fa-f]{2})(?:\.[0-7])?\):"
    r"\s*(?P<code>\d+),\s?(?P<rest>.*)$")
_PID = re.compile(r"(?:^|,\s*)pid=(?P<pid>'[^']*'|<[^>]*>|[^,\s]+)")
_NAME = re.compile(r"(?:^|,\s*)name=(?P<name>'[^']*'|<[^>]*>|[^,]*)")
_RECOVERY = re.compile(r"recovery action changed from .*? to 0x([0-9a-fA-F]+)\s*\(([^)]*)\)")


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
