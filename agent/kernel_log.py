"""The kernel-log follower: kernel log records, read without blocking, from where the agent left off.

:class:`LogSource` reads ``/dev/kmsg`` (kernel timestamps kept), a file that is appended to
(``tail -f`` semantics, rotation and truncation followed), a FIFO, or the journal
(``journalctl _TRANSPORT=kernel -f -o json``, kernel timestamps kept). With a ``state_dir`` the
journal cursor / ``/dev/kmsg`` sequence number is kept across restarts (:class:`SavedPosition`),
so records logged while the agent was stopped are delivered at its next start, once.
:func:`open_kernel_log` falls back from an unreadable ``/dev/kmsg`` to the journal.

It parses no XIDs: the XID collector (:mod:`gpufleet.agent.collectors.xid`), its one reader,
picks the XID lines out of its records (and its warnings carry that collector's ``xid:`` prefix).
"""

from __future__ import annotations

import errno
import logging
import os
import re
import shutil
import stat
import subprocess
import time
from pathlib import Path

log = logging.getLogger(__name__)

_SYSLOG = re.compile(r"^[A-Z][a-z]{2}\s+\d+\s+\d\d:\d\d:\d\d\s+\S+\s+kernel:\s*")
_DMESG = re.compile(r"^\[\s*\d+\.\d+\]\s*")


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


BOOT_ID = "/proc/sys/kernel/random/boot_id"
JOURNAL_FIELDS = "MESSAGE,_SOURCE_MONOTONIC_TIMESTAMP"  # __CURSOR and the timestamps always come


def boot_id() -> str:
    """This boot's id (hex, no dashes); "" when it cannot be read."""
    try:
        return Path(BOOT_ID).read_text().strip().replace("-", "")
    except OSError:
        return ""


def machine_id() -> str:
    """This machine's id (``/etc/machine-id``); "" when it cannot be read."""
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


class SavedPosition:
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
        self._pos: SavedPosition | None = None
        self._boot = ""
        self._after_seq: int | None = None  # kmsg: records up to this one were handed on
        self._cursor: str | None = None  # journal: resume after this cursor
        self._started_cursor: str | None = None
        self._got_since_start = 0
        self._tail: list = []

    # -- position ---------------------------------------------------------------------------
    def _position(self, kind: str) -> SavedPosition | None:
        if self.state_dir is None:
            return None
        if self._pos is None:
            self._pos = SavedPosition(self.state_dir, kind, self.path)
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
            proc = subprocess.Popen(self._journal_cmd(), stdout=subprocess.PIPE,
                                    stderr=subprocess.DEVNULL, stdin=subprocess.DEVNULL)
            assert proc.stdout is not None  # stdout=PIPE
            self._proc = proc
            self._started_cursor, self._got_since_start = self._cursor, 0
            self._fd = proc.stdout.fileno()
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

    def _journal_exited(self, proc: subprocess.Popen) -> None:
        rc = proc.returncode
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
            self._journal_exited(self._proc)
        fd = self._fd
        assert fd is not None  # _open() set it or raised
        out: list[tuple[str, int | None, object]] = []
        got = 0
        boot_ns = None
        while got < limit:
            try:
                chunk = os.read(fd, 8192)
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
                t_ns = None
                if usec is not None:
                    if boot_ns is None:
                        boot_ns = time.time_ns() - time.clock_gettime_ns(time.CLOCK_MONOTONIC)
                    t_ns = boot_ns + usec * 1000
                out.append((line, t_ns, seq))
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
