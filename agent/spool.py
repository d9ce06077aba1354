"""A durable on-disk queue of line-protocol batches for remote exporters.

Layout of the spool directory::

    seg-0000000000000001.sp   segment files, appended in order, never rewritten
    ack                       "SEQ OFFSET": everything before this position was delivered
    lock                      held (``flock``) by the one agent that owns the spool
    rejected/                 batches the backend refused as malformed (HTTP 400), with its answer

A segment is a run of records: ``b"GS"``, ``<u32 payload length>``, ``<u32 line count>``,
``<u32 crc32 of count+payload>``, then the payload (lines joined by ``\\n``, UTF-8). Each append is
one ``write`` and a flush (``fsync = true`` adds an fsync), so a killed agent loses nothing it
appended; a record torn by a crash or damaged on disk fails its length or checksum and is skipped
on restart (the scan resynchronises on the next valid record). A restarted agent always appends
to a fresh segment. Delivery is at least once: the ack moves after the backend accepted a batch,
and a re-sent batch carries its original timestamps, so InfluxDB stores it once.

Bounded: when the segments exceed ``max_bytes`` the oldest are deleted and their undelivered
points counted in ``dropped_points``; ``rejected/`` keeps at most ``rejected_max_files`` batches
and ``rejected_max_bytes``, the oldest deleted first (their points counted in
``rejected_pruned_points``).

One owner: the spool takes an exclusive ``flock`` on ``lock``; a second agent on the same
directory gets a :class:`ConfigError` (exit 2). A directory deleted while the agent runs is
recreated at the next append or at shutdown (:meth:`Spool.check`); the undelivered records of
the segment being written are read back through its open descriptor and kept, those of older
deleted segments are counted as dropped. A batch that cannot be written (disk full, no
permission) is counted in ``dropped_points`` and the reason kept in ``error`` until an append
succeeds again: never claimed as kept. A disk full at start is the same degraded state (one
line; the first segment is opened by the first append that can), never a crash.
"""

from __future__ import annotations

import errno
import fcntl
import logging
import os
import struct
import threading
import time
import zlib
from dataclasses import dataclass
from pathlib import Path

from gpufleet.errors import ConfigError

log = logging.getLogger("gpufleet.agent.spool")

MAGIC = b"GS"
HEADER = struct.Struct("<2sIII")
MAX_RECORD = 64 * 2**20


@dataclass
class _Seg:
    seq: int
    path: Path
    size: int
    points: int  # points in the records not yet delivered


def _name(seq: int) -> str:
    return f"seg-{seq:016d}.sp"


def encode_record(lines: list[str]) -> bytes:
    payload = "\n".join(lines).encode("utf-8")
    n = len(lines)
    crc = zlib.crc32(struct.pack("<I", n) + payload)
    return HEADER.pack(MAGIC, len(payload), n, crc) + payload


def scan(data: bytes, start: int = 0):
    """Yield ``(offset, end, lines_count, payload)`` for every valid record from ``start``.

    A damaged or torn record is skipped: the scan looks for the next offset holding a valid
    record. Yields ``(offset, end, -1, None)`` once for each skipped stretch.
    """
    pos, n = start, len(data)
    while pos < n:
        rec = _record_at(data, pos)
        if rec is not None:
            end, count, payload = rec
            yield pos, end, count, payload
            pos = end
            continue
        nxt = pos + 1
        while True:
            nxt = data.find(MAGIC, nxt)
            if nxt < 0 or _record_at(data, nxt) is not None:
                break
            nxt += 1
        bad_end = n if nxt < 0 else nxt
        yield pos, bad_end, -1, None
        pos = bad_end


def _record_at(data: bytes, pos: int):
    if pos + HEADER.size > len(data):
        return None
    magic, length, count, crc = HEADER.unpack_from(data, pos)
    if magic != MAGIC or length > MAX_RECORD:
        return None
    end = pos + HEADER.size + length
    if end > len(data):
        return None
    payload = data[pos + HEADER.size:end]
    if zlib.crc32(struct.pack("<I", count) + payload) != crc:
        return None
    return end, count, payload


_LOCKS: dict[str, list] = {}  # realpath -> [fd, users]: one flock per directory per process
_LOCKS_GUARD = threading.Lock()


def lock_dir(directory: str | Path) -> str:
    """Take the spool directory's exclusive lock (kept until :func:`unlock_dir`); returns its key.

    The lock is per process and counted: the daemon takes it before the slow start-up (so a
    second agent on the same directory is refused at once) and each :class:`Spool` takes it again.
    """
    d = Path(directory)
    try:
        d.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise ConfigError(f"spool directory {d}: {exc.strerror or exc}") from None
    key = os.path.realpath(d)
    with _LOCKS_GUARD:
        held = _LOCKS.get(key)
        if held is not None and _lock_file_is(held[0], d / "lock"):
            held[1] += 1
            return key
        try:
            fd = os.open(d / "lock", os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
        except OSError as exc:
            raise ConfigError(f"spool directory {d}: {exc.strerror or exc}") from None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as exc:
            owner = ""
            try:
                owner = os.pread(fd, 32, 0).decode("ascii", "replace").strip()
            except OSError:
                pass
            os.close(fd)
            if exc.errno in (errno.EAGAIN, errno.EACCES, errno.EWOULDBLOCK):
                raise ConfigError(f"spool directory {d} is in use by another agent"
                                  f"{f' (pid {owner})' if owner.isdigit() else ''}; "
                                  "give each agent its own spool.dir") from None
            raise ConfigError(f"spool directory {d}: cannot lock: {exc.strerror or exc}") from None
        try:  # the owner's pid, for the message a second agent gets; a full disk keeps it empty
            os.ftruncate(fd, 0)
            os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        except OSError as exc:
            log.debug("spool lock %s: pid not written: %s", d / "lock", exc.strerror)
        if held is not None:  # the old lock file was deleted with its directory: this one replaces it
            os.close(held[0])
            held[0] = fd
            held[1] += 1
        else:
            _LOCKS[key] = [fd, 1]
        return key


def unlock_dir(key: str) -> None:
    with _LOCKS_GUARD:
        held = _LOCKS.get(key)
        if held is None:
            return
        held[1] -= 1
        if held[1] <= 0:
            del _LOCKS[key]
            os.close(held[0])  # closing the descriptor releases the flock


def _lock_file_is(fd: int, path: Path) -> bool:
    try:
        a, b = os.fstat(fd), os.stat(path)
    except OSError:
        return False
    return (a.st_dev, a.st_ino) == (b.st_dev, b.st_ino)


class Spool:
    """Append batches, read them oldest-first, acknowledge what was delivered.

    Thread-safe: the daemon appends, the sender thread reads and acknowledges.
    """

    def __init__(self, directory: str | Path, max_bytes: int = 512 * 2**20, segment_bytes: int = 4 * 2**20,
                 fsync: bool = False, rejected_max_files: int = 1000, rejected_max_bytes: int = 64 * 2**20):
        self.dir = Path(directory)
        try:
            self.dir.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise ConfigError(f"spool directory {self.dir}: {exc.strerror or exc}") from None
        try:
            (self.dir / "rejected").mkdir(exist_ok=True)
        except OSError:
            pass  # a full disk: made when a batch is first set aside
        if not os.access(self.dir, os.W_OK):
            raise ConfigError(f"spool directory {self.dir}: not writable")
        self._lock_key = lock_dir(self.dir)
        self.max_bytes = max_bytes
        self.segment_bytes = segment_bytes
        self.fsync = fsync
        self.rejected_max_files = rejected_max_files
        self.rejected_max_bytes = rejected_max_bytes
        self.lock = threading.Lock()
        self.dropped_points = 0  # spool full, directory deleted, or a batch that could not be written
        self.skipped_bytes = 0  # torn or damaged records skipped at open
        self.rejected_points = 0
        self.rejected_pruned_points = 0  # set-aside points deleted by the rejected/ bound
        self.write_failures = 0  # appends that could not be written (their points are in dropped_points)
        self.error = ""  # why the last append failed; "" once one succeeds
        self.segs: list[_Seg] = []
        self.read_seq, self.read_off = 0, 0
        self._fh = None
        self._closed = False
        try:
            self._open()
        except BaseException:
            unlock_dir(self._lock_key)
            raise

    # ---------------------------------------------------------------- open / scan
    def _open(self) -> None:
        ack_seq, ack_off = self._read_ack()
        seqs = sorted(int(p.name[4:20]) for p in self.dir.glob("seg-*.sp") if p.name[4:20].isdigit())
        for seq in seqs:
            path = self.dir / _name(seq)
            if seq < ack_seq:
                path.unlink(missing_ok=True)
                continue
            data = path.read_bytes()
            start = ack_off if seq == ack_seq else 0
            points = 0
            for off, end, count, _ in scan(data, start):
                if count < 0:
                    self.skipped_bytes += end - off
                    log.warning("spool %s: skipped %d damaged bytes at offset %d", path.name, end - off, off)
                else:
                    points += count
            self.segs.append(_Seg(seq, path, len(data), points))
        if self.segs:
            self.read_seq = self.segs[0].seq
            self.read_off = ack_off if self.segs[0].seq == ack_seq else 0
        self._ack_seq = ack_seq
        try:
            self._new_segment(max([s.seq for s in self.segs] + [ack_seq]) + 1)
        except OSError as exc:  # a full disk at start: degraded, never a crash (see append)
            self.error = exc.strerror or str(exc)
            log.error("spool %s: cannot write (%s): the agent starts degraded; points are counted as "
                      "dropped until it can write again", self.dir, self.error)

    def _read_ack(self) -> tuple[int, int]:
        try:
            a, b = (self.dir / "ack").read_text().split()
            return int(a), int(b)
        except (OSError, ValueError):
            return 0, 0

    def _new_segment(self, seq: int) -> None:
        path = self.dir / _name(seq)
        fh = open(path, "a+b")  # readable too: a tail deleted under us can still be read back
        self._fh = fh
        seg = _Seg(seq, path, 0, 0)
        self.segs.append(seg)
        if len(self.segs) == 1:
            self.read_seq, self.read_off = seq, 0

    # ---------------------------------------------------------------- writer side
    def append(self, lines: list[str]) -> bool:
        """Write one batch; False when it could not be spooled (its points counted as dropped)."""
        if not lines:
            return True
        rec = encode_record(lines)
        with self.lock:
            try:
                self._check_alive()
                tail = self.segs[-1]
                if tail.size and tail.size + len(rec) > self.segment_bytes:
                    self._fh.close()
                    if self.fsync:
                        _fsync_path(tail.path)
                    self._new_segment(tail.seq + 1)
                    tail = self.segs[-1]
                start = self._fh.tell()
                try:
                    self._fh.write(rec)
                    self._fh.flush()
                    if self.fsync:
                        os.fsync(self._fh.fileno())
                except OSError:
                    self._truncate_to(start)
                    raise
            except (OSError, ConfigError) as exc:
                self.dropped_points += len(lines)
                self.write_failures += 1
                why = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
                if why != self.error:
                    log.error("spool %s: cannot write (%s): %d points dropped; the agent is degraded",
                              self.dir, why, len(lines))
                self.error = why
                return False
            if self.error:
                log.warning("spool %s: writing again", self.dir)
                self.error = ""
            tail.size += len(rec)
            tail.points += len(lines)
            self._enforce_bound()
            return True

    def _truncate_to(self, size: int) -> None:
        """Cut a partly written record (disk full) so the segment stays a run of whole records."""
        try:
            self._fh.close()
        except OSError:
            pass
        tail = self.segs[-1]
        try:
            os.truncate(tail.path, size)
        except OSError:
            pass
        self._fh = open(tail.path, "a+b")

    def _check_alive(self) -> None:
        """Open the tail segment if the start could not (a full disk); recreate the spool
        directory, lock and tail segment if they were deleted under us. The undelivered records
        of a deleted tail are read back through its open descriptor and kept in the new tail;
        only those of older deleted segments are lost, and counted as dropped."""
        if self._fh is None:
            if not self.dir.is_dir():  # deleted while no segment was open (a full disk at start)
                self.dir.mkdir(parents=True, exist_ok=True)
                lock_dir(self.dir)
                unlock_dir(self._lock_key)
            self._new_segment(max([s.seq for s in self.segs] + [self.read_seq, self._ack_seq]) + 1)
            return
        try:
            gone = os.fstat(self._fh.fileno()).st_nlink == 0
        except (OSError, ValueError):
            gone = True
        if not gone:
            return
        tail = self.segs[-1]
        kept, kept_points = self._read_tail(tail)
        lost = 0
        for seg in self.segs:
            if not seg.path.exists():
                lost += seg.points
                seg.points = 0
        lost = max(0, lost - kept_points)
        self.dropped_points += lost
        try:
            self._fh.close()
        except OSError:
            pass
        self._fh = None
        self.dir.mkdir(parents=True, exist_ok=True)
        if lost:
            log.error("spool %s was deleted while the agent ran: recreated; %d undelivered points were lost "
                      "with it (counted as dropped), %d kept", self.dir, lost, kept_points)
        else:
            log.warning("spool %s was deleted while the agent ran: recreated, its %d undelivered points "
                        "kept (read back from the open segment)", self.dir, kept_points)
        (self.dir / "rejected").mkdir(exist_ok=True)
        lock_dir(self.dir)  # re-take the lock on a fresh lock file (the old one went with the directory)
        unlock_dir(self._lock_key)  # ... keeping one count for this spool
        next_seq = max([s.seq for s in self.segs] + [self.read_seq]) + 1
        self.segs = [s for s in self.segs if s.path.exists()]
        self._new_segment(next_seq)  # the only segment when all were deleted: reading starts there
        if self.segs[0].seq != self.read_seq:
            self.read_seq, self.read_off = self.segs[0].seq, 0
        self._write_ack(self.read_seq, self.read_off)
        if kept:
            self._fh.write(kept)
            self._fh.flush()
            self.segs[-1].size += len(kept)
            self.segs[-1].points += kept_points

    def _read_tail(self, tail: _Seg) -> tuple[bytes, int]:
        """The undelivered whole records of the open tail segment, read through its descriptor
        (the file may be deleted): ``(bytes, points)``."""
        start = self.read_off if tail.seq == self.read_seq else 0
        try:
            self._fh.flush()
            data = os.pread(self._fh.fileno(), max(0, tail.size - start), start)
        except (OSError, ValueError):
            return b"", 0
        out, points = [], 0
        for off, end, count, _ in scan(data):
            if count >= 0:
                out.append(data[off:end])
                points += count
        return b"".join(out), points

    def check(self) -> None:
        """Recreate a deleted spool now (keeping what its open tail holds), as the next append
        would: before a flush at shutdown, so what is left is counted from the disk truthfully."""
        with self.lock:
            if self._closed:
                return
            try:
                self._check_alive()
            except (OSError, ConfigError) as exc:
                why = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
                if why != self.error:
                    log.error("spool %s: cannot write (%s)", self.dir, why)
                self.error = why

    def _enforce_bound(self) -> None:
        while len(self.segs) > 1 and self.bytes > self.max_bytes:
            seg = self.segs.pop(0)
            self.dropped_points += seg.points
            log.warning("spool over %d bytes: dropped segment %s (%d points)", self.max_bytes,
                        seg.path.name, seg.points)
            seg.path.unlink(missing_ok=True)
            self.read_seq, self.read_off = self.segs[0].seq, 0
            self._write_ack(self.read_seq, 0)

    # ---------------------------------------------------------------- reader side
    @property
    def bytes(self) -> int:
        total = sum(s.size for s in self.segs)
        return total - (self.read_off if self.segs and self.segs[0].seq == self.read_seq else 0)

    @property
    def points(self) -> int:
        return sum(s.points for s in self.segs)

    def read_batch(self, max_lines: int = 5000, max_bytes: int = 8 * 2**20):
        """The oldest undelivered records, up to ``max_lines``: ``(lines, position)`` or None.

        Pass ``position`` to :meth:`ack` once the backend accepted the lines.
        """
        with self.lock:
            lines: list[str] = []
            size = 0
            seq, off = self.read_seq, self.read_off
            for i, seg in enumerate(self.segs):
                if seg.seq < seq:
                    continue
                if seg.seq > seq:
                    seq, off = seg.seq, 0
                if i == len(self.segs) - 1 and self._fh is not None:
                    try:
                        self._fh.flush()
                    except (OSError, ValueError):
                        pass
                try:
                    with open(seg.path, "rb") as f:
                        f.seek(off)
                        data = f.read(max(0, seg.size - off))
                except OSError:
                    data = b""  # deleted under us: the next append recreates the spool and counts it
                for roff, end, count, payload in scan(data):
                    if count < 0:
                        off += end - roff
                        continue
                    if lines and (len(lines) + count > max_lines or size + len(payload) > max_bytes):
                        return lines, (seq, off)
                    lines.extend(payload.decode("utf-8").split("\n") if count else [])
                    size += len(payload)
                    off += end - roff
                if i == len(self.segs) - 1:
                    break
                if lines and len(lines) >= max_lines:
                    break
                # segment exhausted: continue with the next one
            if not lines:
                return None
            return lines, (seq, off)

    def ack(self, position: tuple[int, int], points: int) -> None:
        """Everything before ``position`` was delivered (``points`` of them since the last ack)."""
        seq, off = position
        with self.lock:
            if not self.segs or seq < self.segs[0].seq:
                return  # its segment was dropped meanwhile (spool full)
            while len(self.segs) > 1 and self.segs[0].seq < seq:
                seg = self.segs.pop(0)
                points -= seg.points
                seg.path.unlink(missing_ok=True)
            if self.segs and self.segs[0].seq == seq:
                self.segs[0].points = max(0, self.segs[0].points - max(points, 0))
            self.read_seq, self.read_off = seq, off
            self._write_ack(seq, off)

    def reject(self, lines: list[str], position: tuple[int, int], reason: str,
               batch_points: int | None = None) -> Path:
        """Move lines the backend refused as malformed aside (with its answer) and acknowledge the
        batch they came from (``batch_points`` lines, default: just these)."""
        stamp = time.strftime("%Y%m%dT%H%M%S", time.gmtime())
        rdir = self.dir / "rejected"
        rdir.mkdir(parents=True, exist_ok=True)
        path = rdir / f"rejected-{stamp}-{position[0]:016d}-{position[1]:012d}.lp"
        path.write_text("\n".join(lines) + "\n", encoding="utf-8")
        path.with_suffix(".reason").write_text(reason + "\n", encoding="utf-8")
        self.rejected_points += len(lines)
        self.ack(position, len(lines) if batch_points is None else batch_points)
        self.prune_rejected()
        return path

    def prune_rejected(self) -> int:
        """Keep ``rejected/`` within its bounds: delete the oldest batches; returns the points deleted."""
        rdir = self.dir / "rejected"
        try:
            files = sorted(rdir.glob("rejected-*.lp"))
            sizes = [f.stat().st_size for f in files]
        except OSError:
            return 0
        total, n, pruned = sum(sizes), len(files), 0
        for f, size in zip(files, sizes, strict=True):
            if n <= self.rejected_max_files and total <= self.rejected_max_bytes:
                break
            try:
                with open(f, "rb") as fh:
                    points = sum(1 for line in fh if line.strip())
                f.unlink()
            except OSError:
                continue
            f.with_suffix(".reason").unlink(missing_ok=True)
            n -= 1
            total -= size
            pruned += points
        if pruned:
            self.rejected_pruned_points += pruned
            log.warning("spool %s: rejected/ over its bound (%d batches, %d bytes): deleted the oldest, "
                        "%d points lost", self.dir, self.rejected_max_files, self.rejected_max_bytes, pruned)
        return pruned

    def _write_ack(self, seq: int, off: int) -> None:
        tmp = self.dir / "ack.tmp"
        try:
            tmp.write_text(f"{seq} {off}\n")
            os.replace(tmp, self.dir / "ack")
        except OSError as exc:  # the directory was deleted or is unusable: the next append
            log.debug("spool ack not written: %s", exc)  # recreates it and writes the ack

    def points_on_disk(self) -> int:
        """Undelivered points counted from the files (after the ack), not from the counters."""
        return count_points(self.dir)

    def close(self) -> None:
        self.check()  # deleted just before the end: recreated, its open tail kept, losses counted
        with self.lock:
            if self._closed:
                return
            self._closed = True
            try:
                if self._fh is not None:
                    self._fh.close()
            except OSError:
                pass
            tail = self.segs[-1] if self.segs else None
            if tail is not None and tail.size == 0 and len(self.segs) >= 1:
                if not (tail.seq == self.read_seq and self.read_off):
                    tail.path.unlink(missing_ok=True)
            unlock_dir(self._lock_key)


def count_points(directory: str | Path) -> int:
    """The points a spool directory holds after its ack, read from the disk (0 when it is gone)."""
    d = Path(directory)
    try:
        a, b = (d / "ack").read_text().split()
        ack_seq, ack_off = int(a), int(b)
    except (OSError, ValueError):
        ack_seq, ack_off = 0, 0
    total = 0
    for p in sorted(d.glob("seg-*.sp")):
        if not p.name[4:20].isdigit() or int(p.name[4:20]) < ack_seq:
            continue
        try:
            data = p.read_bytes()
        except OSError:
            continue
        start = ack_off if int(p.name[4:20]) == ack_seq else 0
        total += sum(count for _, _, count, _ in scan(data, start) if count > 0)
    return total


def _fsync_path(path: Path) -> None:
    try:
        fd = os.open(path, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
    except OSError:
        pass
