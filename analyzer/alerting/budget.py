"""The disruption budget of the action sink: how many distinct nodes may be acted on.

At most ``nodes`` distinct nodes, and at most ``percent`` % of any one cluster or rack (never
less than one node of it), within a sliding ``window`` of seconds. The ledger is a file of JSON
lines (one per node acted on, one per "budget exhausted" page) read and appended under an
exclusive ``fcntl.flock``: every analyzer process that names the same file (shards on one
machine, or on several machines with the file on shared storage that honours locks, e.g. NFSv4)
draws from one budget, and a restart (even a SIGKILL) forgets nothing. A line cut short by a
crash is skipped. Times are wall-clock seconds (shared storage has no common monotonic clock).

A cluster's or rack's size is what this analyzer knows of it (the hosts it has seen with that
tag); a shard sees only its share of a rack, so its percentage is stricter, never looser.
"""

from __future__ import annotations

import fcntl
import json
import os
import time
from dataclasses import dataclass
from pathlib import Path

from gpufleet.errors import ConfigError

PRUNE_LINES = 2000  # rewrite the ledger without expired lines once it holds this many


@dataclass
class Decision:
    ok: bool
    why: str = ""
    page: bool = False  # refused, and no "budget exhausted" page has gone out in this window
    used: int = 0  # distinct nodes acted on in the window (this one included when ok)


class Ledger:
    def __init__(self, path: str | Path, nodes: int = 2, percent: float = 5.0, window: float = 3600.0):
        self.path = Path(path)
        self.nodes = nodes
        self.percent = percent
        self.window = window
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            with self._locked():
                pass
        except OSError as exc:
            raise ConfigError(f"action sink: budget ledger {self.path}: {exc.strerror}") from None

    def _locked(self):
        return _Locked(self.path)

    @staticmethod
    def _read(f) -> list[dict]:
        f.seek(0)
        out = []
        for line in f.read().decode("utf-8", "replace").splitlines():
            try:
                e = json.loads(line)
            except ValueError:
                continue  # a line a crash cut short
            if isinstance(e, dict) and isinstance(e.get("t"), int | float):
                out.append(e)
        return out

    def entries(self, now: float | None = None) -> list[dict]:
        """The ledger's lines within the window that ends at ``now`` (default: now)."""
        now = time.time() if now is None else now
        with self._locked() as f:
            return [e for e in self._read(f) if e["t"] >= now - self.window]

    def acted_for(self, host: str, key: str, *, sink: str, now: float | None = None) -> dict | None:
        """This sink's "act" line for ``host`` and incident ``key`` within the window, if any: a
        process (this one before a restart, or a shard) got past the verification and started the
        command for this very incident."""
        for e in self.entries(now):
            if (e.get("type"), e.get("host"), e.get("key"), e.get("sink")) == ("act", host, key, sink):
                return e
        return None

    def claim(self, host: str, cluster: str | None, rack: str | None, sizes: dict, *, sink: str,
              key: str, record: bool = True, now: float | None = None) -> Decision:
        """May ``host`` be acted on now? When it may and ``record``, it is written down (one slot of
        the budget, kept for the window). ``sizes``: {"cluster": n, "rack": n} as known here."""
        now = time.time() if now is None else now
        with self._locked() as f:
            lines = self._read(f)
            live = [e for e in lines if e["t"] >= now - self.window]
            acted = {}
            for e in live:
                if e.get("type") == "act" and isinstance(e.get("host"), str):
                    acted.setdefault(e["host"], e)
            why = ""
            if host not in acted:
                if len(acted) >= self.nodes:
                    why = (f"disruption budget: {len(acted)} distinct nodes acted on in the last "
                           f"{self.window:g} s ({', '.join(sorted(acted)[:10])}); at most {self.nodes}")
                for scope, value in (("cluster", cluster), ("rack", rack)):
                    size = sizes.get(scope) or 0
                    if why or value is None or size <= 0:
                        continue
                    allowed = max(1, int(size * self.percent // 100))
                    mine = sorted(h for h, e in acted.items() if e.get(scope) == value)
                    if len(mine) >= allowed:
                        why = (f"disruption budget: {len(mine)} of the {size} nodes of {scope} {value} "
                               f"acted on in the last {self.window:g} s ({', '.join(mine[:10])}); at most "
                               f"{self.percent:g} % ({allowed})")
            if why:
                page = not any(e.get("type") == "exhausted" for e in live)
                if page and record:
                    self._append(f, {"type": "exhausted", "t": now, "sink": sink, "key": key,
                                     "host": host, "pid": os.getpid()})
                return Decision(False, why, page and record, len(acted))
            if record and host not in acted:
                self._append(f, {"type": "act", "t": now, "host": host, "cluster": cluster, "rack": rack,
                                 "sink": sink, "key": key, "pid": os.getpid()})
                if len(lines) >= PRUNE_LINES:
                    self._rewrite(f, [*live, {"type": "act", "t": now, "host": host, "cluster": cluster,
                                              "rack": rack, "sink": sink, "key": key}])
            return Decision(True, "", False, len(acted | {host: None}))

    @staticmethod
    def _append(f, entry: dict) -> None:
        end = f.seek(0, os.SEEK_END)
        torn = end > 0 and f.seek(end - 1) >= 0 and f.read(1) != b"\n"  # a crash cut the last line
        f.seek(0, os.SEEK_END)
        f.write(("\n" if torn else "").encode() + json.dumps(entry, separators=(",", ":")).encode() + b"\n")
        f.flush()
        os.fsync(f.fileno())

    @staticmethod
    def _rewrite(f, entries: list[dict]) -> None:
        f.seek(0)
        f.truncate()
        f.write("".join(json.dumps(e, separators=(",", ":")) + "\n" for e in entries).encode())
        f.flush()
        os.fsync(f.fileno())


class _Locked:
    """The ledger opened for reading and appending, under an exclusive flock while in use."""

    def __init__(self, path: Path):
        self.path = path

    def __enter__(self):
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o640)
        self.f = os.fdopen(fd, "r+b")
        fcntl.flock(self.f.fileno(), fcntl.LOCK_EX)
        return self.f

    def __exit__(self, *exc):
        try:
            fcntl.flock(self.f.fileno(), fcntl.LOCK_UN)
        finally:
            self.f.close()
