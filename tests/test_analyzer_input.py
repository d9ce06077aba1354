"""The analyzer's file input: a store written by several agents (one segment file per host, several
per host) is read in time order across files, and finds what the single file finds."""

from __future__ import annotations

import gzip

import pytest
from gpufleet.analyzer.sources import merged_chunks, read_chunks

from gpufleet import records
from gpufleet.cli import main


def _host(line: bytes) -> bytes:
    i = line.find(b",host=")
    if i < 0:
        return b"none"
    j = i + 6
    k = j
    while k < len(line) and line[k] not in b", ":
        k += 1
    return line[j:k]


def _split_store(src, d, segment_s=2400):
    """The simulator's one file rewritten as an agents' store: per host, a new segment file every
    ``segment_s`` of data (names gpufleet-<host>-<time>.lp[.gz], every other one gzipped)."""
    d.mkdir()
    files: dict[tuple[bytes, int], list[bytes]] = {}
    with gzip.open(src, "rb") as f:
        for line in f:
            if not line.strip():
                continue
            t = int(line.rsplit(b" ", 1)[-1])
            files.setdefault((_host(line), t // int(segment_s * 1e9)), []).append(line)
    for n, ((host, seg), lines) in enumerate(sorted(files.items())):
        name = f"gpufleet-{host.decode()}-{seg:06d}.lp"
        if n % 2:
            with gzip.open(d / (name + ".gz"), "wb") as f:
                f.writelines(lines)
        else:
            (d / name).write_bytes(b"".join(lines))
    return len(files)


@pytest.mark.slow
def test_store_of_many_hosts_matches_the_single_file(tmp_path, capsys):
    sim = tmp_path / "sim"
    assert main(["sim", "--nodes", "4", "--duration", "2h", "--step", "10s", "--seed", "11",
                 "--scenario", "mixed", "--out", str(sim)]) == 0
    store = tmp_path / "store"
    assert _split_store(sim / "telemetry.lp.gz", store) >= 4 * 3  # several hosts, several segments each
    one, many = tmp_path / "one.jsonl", tmp_path / "many.jsonl"
    assert main(["analyze", "--input", str(sim / "telemetry.lp.gz"), "--out", str(one), "--stats"]) == 0
    assert main(["analyze", "--input", str(store), "--out", str(many), "--stats"]) == 0
    capsys.readouterr()
    want = sorted((i.kind, i.host, i.gpu, i.link, i.start) for i in records.read(one))
    got = sorted((i.kind, i.host, i.gpu, i.link, i.start) for i in records.read(many))
    assert want and got == want


def test_merge_is_in_time_order_across_files(tmp_path):
    d = tmp_path / "store"
    d.mkdir()
    # two hosts written side by side, 1 s apart, for 2 h; host b's file sorts first by name
    for host, off in (("b", 0), ("a", 5)):
        lines = [f"gpu,host={host},gpu=0 power_watts=1 {(t * 10 + off) * 10**9}\n" for t in range(720)]
        (d / f"gpufleet-{host}-0.lp").write_text("".join(lines[:400]))
        with gzip.open(d / f"gpufleet-{host}-1.lp.gz", "wt") as f:
            f.write("".join(lines[400:]))
    (d / "gpufleet-c-0.lp").write_text("gpu,host=c,gpu=0 power_watts=1 3600000000000")  # no final newline
    chunks = list(merged_chunks(sorted(d.iterdir()), chunk=4096, span_s=60))
    assert len(chunks) > 3
    data = b"".join(chunks)
    times = [int(ln.rsplit(b" ", 1)[-1]) for ln in data.splitlines()]
    assert len(times) == 2 * 720 + 1
    # never more than a piece (60 s) out of order: a host is never seen far behind another
    run_max = 0
    worst = 0
    for t in times:
        worst = max(worst, run_max - t)
        run_max = max(run_max, t)
    assert worst <= 60 * 10**9
    assert b"".join(read_chunks(d)) == data  # a directory of several files goes through the merge


def test_damaged_gzip_is_one_line_error(tmp_path, capsys):
    lines = b"".join(
        b"gpu,host=h,gpu=0 power_watts=%d.5,temperature_gpu_celsius=40i %d\n" % (i, (10**9) * (i + 1))
        for i in range(20000)
    )
    blob = gzip.compress(lines)
    truncated = tmp_path / "truncated.lp.gz"
    truncated.write_bytes(blob[: len(blob) // 2])
    corrupt = tmp_path / "corrupt.lp.gz"
    corrupt.write_bytes(blob[:40] + bytes(64) + blob[104:])
    for f in (truncated, corrupt):
        got = []
        try:
            for c in read_chunks(f):
                got.append(c)
        except Exception as exc:  # noqa: BLE001 - the type is the contract checked below
            assert type(exc).__name__ == "GpufleetError" and str(f) in str(exc)
        else:
            raise AssertionError(f"{f.name}: no error")
        if f is truncated:  # what was readable came out first, cut at a line end
            assert got and b"".join(got).endswith(b"\n") and lines.startswith(b"".join(got))
        capsys.readouterr()
        assert main(["analyze", "--input", str(f), "--out", str(tmp_path / "i.jsonl")]) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and "unreadable" in err[0], err


def test_chunks_of_gzip_members_and_plain_files(tmp_path):
    lines = b"".join(b"gpu,host=h%d,gpu=0 power_watts=%d.5 %d\n" % (i % 7, i, 10**9 * i)
                     for i in range(60000))
    # an agent's segment: many small gzip members (a flush each), zero padding between two of them
    # and after the last (as gzip reads them: skipped), and the same lines as a plain file
    members = [gzip.compress(lines[i : i + 3000]) for i in range(0, len(lines), 3000)]
    gz = tmp_path / "seg.lp.gz"
    gz.write_bytes(b"".join(members[:10]) + bytes(7) + b"".join(members[10:]) + bytes(512))
    plain = tmp_path / "seg.lp"
    plain.write_bytes(lines + b"gpu,host=h,gpu=0 power_watts=1 7")  # no final newline
    with gzip.open(gz, "rb") as f:
        assert f.read() == lines
    for f, want in ((gz, lines), (plain, lines + b"gpu,host=h,gpu=0 power_watts=1 7\n")):
        for chunk in (4096, 1 << 16, 1 << 20):
            chunks = list(read_chunks(f, chunk))
            assert b"".join(chunks) == want, (f.name, chunk)
            assert all(c.endswith(b"\n") for c in chunks)
            # blocks fill up across members (not one chunk per 3 kB member), cut at most a line short
            assert len(chunks) <= len(want) // (chunk - 100) + 2, (f.name, chunk)
            assert max(map(len, chunks)) <= chunk + 100, (f.name, chunk)
