"""The disk spool: order, acknowledgement, torn and damaged records, the bound."""

from __future__ import annotations

from gpufleet.agent.spool import Spool


def test_append_read_ack_reopen(tmp_path):
    sp = Spool(tmp_path, segment_bytes=4096)
    for i in range(50):
        sp.append([f"m v={i}i {i}" + " " * 60, f"m v={i}i {i + 1000}"])
    assert sp.points == 100 and len(sp.segs) > 1
    lines, pos = sp.read_batch(30)
    assert lines[0].rstrip() == "m v=0i 0" and len(lines) == 30
    sp.ack(pos, len(lines))
    sp.close()
    sp = Spool(tmp_path, segment_bytes=4096)
    assert sp.points == 70
    lines, _ = sp.read_batch(5000)
    assert lines[0].rstrip() == "m v=15i 15" and len(lines) == 70


def test_torn_and_damaged_records_are_skipped(tmp_path):
    sp = Spool(tmp_path)
    for i in range(3):
        sp.append([f"m v={i}i {i}"])
    seg = sp.segs[-1].path
    sp.close()
    data = bytearray(seg.read_bytes())
    data[20] ^= 0xFF  # damage the first record's payload
    seg.write_bytes(bytes(data) + b"GS\x10\x00")  # and a torn header at the end
    sp = Spool(tmp_path)
    assert sp.skipped_bytes > 0
    lines, _ = sp.read_batch()
    assert lines == ["m v=1i 1", "m v=2i 2"]


def test_bound_drops_oldest_and_counts(tmp_path):
    sp = Spool(tmp_path, max_bytes=65536, segment_bytes=8192)
    for i in range(2000):
        sp.append([f"m,i={i} v=1i {i}"] * 4)
    assert sp.bytes <= 65536 + 8192
    assert sp.dropped_points > 0
    lines, _ = sp.read_batch(4)
    first = int(lines[0].split(" ")[-1])
    assert first > 0 and sp.points + sp.dropped_points == 8000
