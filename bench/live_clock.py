"""The analyzer online at a live fleet's pace, on a clock of its own (``bench_online.bench_memory_live``
starts it): reads frames of (landing time ns, gzip body length, body) from stdin, moves its
clock to each body's landing time, cycles every 10 s poll of that clock as ``--listen`` does
(``Online.deliver``), then writes its peak RSS and counters as one JSON line. In a process of
its own, so that its peak RSS is the analyzer's, not the fleet generator's."""

from __future__ import annotations

import gzip
import json
import struct
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from gpufleet.analyzer.config import Config  # noqa: E402 - after the path line
from gpufleet.analyzer.online import Checkpoint, Online  # noqa: E402

POLL = 10.0
GRACE = 60.0
TAIL = 1200.0  # cycles after the last body: the late rack's last windows wait for its idle grace


def _status(field: str) -> float:
    """A /proc/self/status size in MiB."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1]) / 1024
    return float("nan")


def main() -> int:
    now = [0.0]
    online = None
    due = 0.0
    inp = sys.stdin.buffer
    cpu = time.process_time()
    while len(head := inp.read(16)) == 16:
        landing, size = struct.unpack("<qq", head)
        body = inp.read(size)
        t = landing / 1e9
        if online is None:
            now[0], due = t, t + POLL
            online = Online(
                Config(), None, None, None, None, Checkpoint(None), POLL, GRACE, clock=lambda: now[0]
            )
        while due <= t:  # the polls this body's landing passed
            now[0] = due
            online.deliver(int(due * 1e9))
            due += POLL
        now[0] = max(now[0], t)
        online.feed(online.an.parser.feed(gzip.decompress(body)))
    if online is None:
        print("live_clock: no body on stdin", file=sys.stderr)
        return 2
    for _ in range(int(TAIL / POLL)):
        now[0] = due
        online.deliver(int(due * 1e9))
        due += POLL
    an = online.an
    print(
        json.dumps(
            {
                "peak_rss_mib": _status("VmHWM"),
                "cpu_s": time.process_time() - cpu,
                "gpu_samples": an.gpu_samples,
                "late_rows": an.late_rows,
                "dropped": an.dropped_rows,
                "late_points": an.late_points,
                "windows": an.windows,
            }
        )
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
