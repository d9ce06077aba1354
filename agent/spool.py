"""A durable on-disk queue of line-protocol batches for remote exporters.

Layout of the spool directory::

    seg-0000000000000001.sp   segment files, appended in order, never rewritten
    ack                       "SEQ OFFSET": everything before this position was delivered
    rejected/                 batches the backend refused for good (4xx), with its answer

A segment is a run of records: ``b"GS"``, ``<u32 payload length>``, ``<u32 line count>``,
``<u32 crc32 of count+payload>``, then the payload (lines joined by ``\\n``, UTF-8). Each append is
one ``write`` and a flush (``fsync = true`` adds an fsync), so a killed agent loses nothing it
appended; a record torn by a crash or damaged on disk fails its length or checksum and is skipped
on restart (the scan resynchronises on the next valid record). A restarted agent always appends
to a fresh segment. Delivery is at least once: the ack moves after the backend accepted a batch,
and a re-sent batch carries its original timestamps, so InfluxDB stores it once.

Bounded: when the segments exceed ``max_bytes`` the oldest are deleted and their undelivered
points counted in ``dropped_points``.
"""

from __future__ import annotations

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


class Spool:
    """Append batches, read them oldest-first, acknowledge what was delivered.

    Thread-safe: the daemon appends, the sender thread reads and acknowledges.
    """

    def __init__(self, directory: str | Path, max_bytes: int = 512 * 2**20, segment_bytes: int = 4 * 2**20,
                 fsync: bool = False):
        self.dir = Path(directory)
        try:
            self.dir.mkdir(parents=True, exist_ok=True)
            (self.dir / "rejected").mkdir(exist_ok=True)
        except OSError as exc:
            raise ConfigError(f"spool directory {self.dir}: {exc.strerror or exc}") from None
        if not os.access(self.dir, os.W_OK):
            raise ConfigError(f"spool directory {self.dir}: not writable")
        self.max_bytes = max_bytes
        self.segment_bytes = segment_bytes
        self.fsync = fsync
        self.lock = threading.Lock()
        self.dropped_points = 0  # dropped because the spool was full
        self.skipped_bytes = 0  # torn or damaged records skipped at open
        self.rejected_points = 0
        self.segs: list[_Seg] = []
        self.read_seq, self.read_off = 0, 0
        self._open()

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
        next_seq = max([s.seq for s in self.segs] + [ack_seq]) + 1
        self._new_segment(next_seq)

    def _read_ack(self) -> tuple[int, int]:
        try:
            a, b = (self.dir / "ack").read_text().split()
            return int(a), int(b)
        except (OSError, ValueError):
            return 0, 0

    def _new_segment(self, seq: int) -> None:
        path = self.dir / _name(seq)
        self._fh = open(path, "ab")
        seg = _Seg(seq, path, 0, 0)
        self.segs.append(seg)
        if len(self.segs) == 1:
            self.read_seq, self.read_off = seq, 0

    # ---------------------------------------------------------------- writer side
    def append(self, lines: list[str]) -> None:
        if not lines:
            return
        rec = encode_record(lines)
        with self.lock:
            tail = self.segs[-1]
            if tail.size and tail.size + len(rec) > self.segment_bytes:
                self._fh.close()
                if self.fsync:
                    _fsync_path(tail.path)
                self._new_segment(tail.seq + 1)
                tail = self.segs[-1]
            self._fh.write(rec)
            self._fh.flush()
            if self.fsync:
                os.fsync(self._fh.fileno())
            tail.size += len(rec)
            tail.points += len(lines)
            self._enforce_bound()

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
                if i == len(self.segs) - 1:
                    self._fh.flush()
                with open(seg.path, "rb") as f:
                    f.seek(off)
                    data = f.read(max(0, seg.size - off))
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

    def reject(self, lines: list[str], position: tuple[int, int], reason: str) -> Path:
        """Move a batch the backend refused for good aside (with its answer) and acknowledge it."""
        stamp = time.strftime("%Y%m%dT%H%M%S", time.gmtime())
        path = self.dir / "rejected" / f"rejected-{stamp}-{position[0]}-{position[1]}.lp"
        path.write_text("\n".join(lines) + "\n", encoding="utf-8")
        path.with_suffix(".reason").write_text(reason + "\n", encoding="utf-8")
        self.rejected_points += len(lines)
        self.ack(position, len(lines))
        return path

    def _write_ack(self, seq: int, off: int) -> None:
        tmp = self.dir / "ack.tmp"
        tmp.write_text(f"{seq} {off}\n")
        os.replace(tmp, self.dir / "ack")

    def close(self) -> None:
        with self.lock:
            try:
                self._fh.close()
            except OSError:
                pass
            tail = self.segs[-1] if self.segs else None
            if tail is not None and tail.size == 0 and len(self.segs) >= 1:
                if not (tail.seq == self.read_seq and self.read_off):
                    tail.path.unlink(missing_ok=True)


def _fsync_path(path: Path) -> None:
    try:
        fd = os.open(path, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
    except OSError:
        pass
