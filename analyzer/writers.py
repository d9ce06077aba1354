"""``--listen-writers FILE``: each writer's token, bound to the hosts it may write.

One shared ``--listen`` token lets any node write rows under any other node's name. With a
writers file each node (or relay) gets a token of its own, and a body carrying a row whose
``host`` tag its token may not write is refused whole (403, counted as ``forbidden``). The
file (mode 0600, owned by the analyzer's user: it holds secrets) has one writer per line::

    # token                          hosts or patterns it may write
    9f1c...e2  node01
    77ab...0c  node02 node02-bmc
    c3d4...9a  rack07-*              # a relay for one rack
    e5f6...b1  *                     # the InfluxDB subscription: every host

A pattern is a shell-style glob (``*``, ``?``, ``[0-9]``) over the host tag as written. A
token here is accepted wherever ``--listen`` takes one (``Authorization: Token``/``Bearer``,
basic auth's password, ``p=``); ``--listen-token-file``'s token, when also given, stays
unbound. Tokens are never printed: errors name the file and the line number.
"""

from __future__ import annotations

import fnmatch
import hashlib
import re

from gpufleet import hosts
from gpufleet.errors import ConfigError

_GLOB = re.compile(r"[A-Za-z0-9._*?\[\]!-]+\Z")


def _digest(token: str) -> bytes:
    return hashlib.sha256(token.encode("utf-8", "surrogatepass")).digest()


class Writer:
    """One token's binding: the hosts (plain names) and patterns it may write."""

    def __init__(self, line: int, patterns: list[str]):
        self.line = line
        self.names = {p for p in patterns if hosts.is_plain(p)}
        self.globs = [p for p in patterns if p not in self.names]
        self.any = "*" in self.globs
        self._seen: dict[str, bool] = {}

    def may(self, host: str | None) -> bool:
        if host is None:
            return self.any
        ok = self._seen.get(host)
        if ok is None:
            ok = self.any or host in self.names or (
                hosts.is_plain(host) and any(fnmatch.fnmatchcase(host, g) for g in self.globs))
            if len(self._seen) < 100_000:
                self._seen[host] = ok
        return ok

    def foreign(self, rows: dict, series) -> list[str]:
        """Host tags (as written) of ``rows`` this writer may not write; [] when all are its own."""
        if self.any:
            return []
        import numpy as np

        bad = []
        for r in rows.values():
            for sid in np.unique(r.sid).tolist():
                host = series.written(sid).get("host")
                if not self.may(host):
                    bad.append("(no host tag)" if host is None else host)
        return sorted(set(bad))


class Writers:
    def __init__(self, by_digest: dict[bytes, Writer]):
        self.by_digest = by_digest

    def __len__(self):
        return len(self.by_digest)

    @classmethod
    def load(cls, path: str) -> Writers:
        label = f"--listen-writers {path}"
        try:
            with open(path, encoding="utf-8") as f:
                text = f.read()
        except (OSError, UnicodeDecodeError) as exc:
            raise ConfigError(f"{label}: {getattr(exc, 'strerror', None) or exc}") from None
        out: dict[bytes, Writer] = {}
        for n, raw in enumerate(text.splitlines(), 1):
            words = raw.split("#", 1)[0].split()
            if not words:
                continue
            token, patterns = words[0], words[1:]
            if len(token) < 16:
                raise ConfigError(f"{label}: line {n}: the token is shorter than 16 characters")
            if not patterns:
                raise ConfigError(f"{label}: line {n}: no host or pattern after the token")
            for p in patterns:
                if not hosts.is_plain(p) and not _GLOB.match(p):
                    raise ConfigError(f"{label}: line {n}: '{hosts.shown(p)}' is neither a plain host name "
                                      f"nor a pattern of letters, digits, '.', '_', '-', '*', '?', [...]")
            d = _digest(token)
            if d in out:
                raise ConfigError(f"{label}: line {n}: the same token as line {out[d].line}")
            out[d] = Writer(n, patterns)
        if not out:
            raise ConfigError(f"{label}: no writer in the file")
        return cls(out)

    def find(self, given: list[str]) -> Writer | None:
        """The writer whose token is among ``given`` (credentials a request carries)."""
        for g in given:
            w = self.by_digest.get(_digest(g))
            if w is not None:
                return w
        return None
