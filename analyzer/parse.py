"""Line protocol -> columns, fast: a vectorised tokenizer over whole chunks of lines.

The analyzer reads millions of wide rows; a Python loop over every field of every line is
too slow. ``Parser.feed(chunk)`` finds every delimiter of a chunk with numpy, groups lines
by their field-key signature (one producer writes its fields in one order), converts all
numeric values of the chunk in one call and slices Python strings only for the series head
(measurement and tags, cached) and for string fields. Both engines accept and read exactly what
InfluxDB 1.x does (tests/test_lineprotocol_influx.py checks it against a real influxd): lines
outside the plain form the fast paths handle (escapes in field keys or values, leading or
repeated whitespace, odd numbers, duplicate keys, no timestamp...) go through the reference
parser ``gpufleet.lineprotocol`` (InfluxDB's own rules); what that rejects is skipped and
counted, never raised. The C engine (analyzer/_lpscan.c, a ``Scanner`` per parser) keeps the
series heads and field-key groups it has met from chunk to chunk: Python parses a head, and plans
a group's columns, once.

Result: per measurement a :class:`Rows` block (series id, time in ns, numeric columns where
NaN means absent, string columns, the type of every value) plus the :class:`SeriesIndex`
mapping ids to tags.
"""

from __future__ import annotations

import hashlib
import logging
import re
import sys
from dataclasses import dataclass, field
from itertools import chain

import numpy as np

from gpufleet import hosts
from gpufleet.lineprotocol import ParseError, parse_head, parse_line, skip_line

try:  # the C tokenizer (analyzer/_lpscan.c), built at install when a compiler is there
    from gpufleet.analyzer import _lpscan
except ImportError:  # pragma: no cover - exercised where no compiler was available
    _lpscan = None

_log = logging.getLogger("gpufleet.analyzer")
_SP, _TAB, _COMMA, _EQ, _NL, _QUOTE, _BSLASH, _HASH = 32, 9, 44, 61, 10, 34, 92, 35
# the type of a value (Rows.kind; the C tokenizer's codes too); 0: absent
FLOAT, INT, BOOL, STR = 1, 2, 3, 4
_EXACT = 2**53  # integers beyond this are kept in Rows.ints (a float64 is not exact there)
_VW = 32  # widest numeric value token the fast path converts
_CODES = bytes(  # 4: a carriage return or a NUL, which the reference parser handles
    1
    if i in (_COMMA, _EQ, _SP, _NL)
    else 2
    if i == _QUOTE
    else 3
    if i == _BSLASH
    else 4
    if i in (0, 13)
    else 0
    for i in range(256)
)
_MULT = np.array([0x9E3779B97F4A7C15, 0xC2B2AE3D27D4EB4F, 0x165667B19E3779F9], dtype=np.uint64)


class SeriesIndex:
    """Series head (measurement + tags, as written) -> small int id, and id -> tags.

    A ``host`` tag that is not a plain node name (:mod:`gpufleet.hosts`) is quarantined here,
    where every ingest path (files, ``--follow``, ``--listen``) meets: the series' tags carry
    its display name (``unsafe:...``), which no action sink accepts, and ``unsafe_hosts``
    maps each such display name to the raw value (counted, logged once each)."""

    def __init__(self):
        self.ids: dict[tuple, int] = {}
        self.measurement: list[str] = []
        self.tags: list[dict[str, str]] = []
        self.unsafe_hosts: dict[str, str] = {}
        self.unsafe_series = 0
        self._raw_host: dict[int, str] = {}  # sid -> the host tag as written, where quarantined
        self._plain: dict[str, bool] = {}  # host tag -> a plain node name (judged once per host)

    def add(self, measurement: str, tags: dict[str, str]) -> int:
        # not a joined string: "a\\,b=1" is no tag; the pairs flat (measurement, k1, v1, k2, ...)
        key = (measurement, *chain.from_iterable(sorted(tags.items())))
        sid = self.ids.get(key)
        if sid is None:
            # a fleet's series share most of their tag values (a GPU's host, rack, model and UUID
            # in each of its links' series): one string each, not one per series
            intern = sys.intern
            tags = {intern(k): intern(v) for k, v in tags.items()}
            key = tuple(map(intern, key))
            sid = len(self.tags)
            self.ids[key] = sid
            self.measurement.append(measurement)
            host = tags.get("host")
            plain = self._plain.get(host) if host is not None else True
            if plain is None:
                plain = self._plain[host] = hosts.is_plain(host)
            if not plain:
                tags = {**tags, "host": self._quarantine(host)}
                self._raw_host[sid] = host
            self.tags.append(tags)
        return sid

    def written(self, sid: int) -> dict[str, str]:
        """The series' tags as written (its host tag too, where quarantined)."""
        raw = self._raw_host.get(sid)
        return self.tags[sid] if raw is None else {**self.tags[sid], "host": raw}

    def _quarantine(self, raw: str) -> str:
        shown = hosts.display_name(raw)
        self.unsafe_series += 1
        if shown not in self.unsafe_hosts:
            if len(self.unsafe_hosts) < 10000:  # a writer inventing names costs bounded memory
                self.unsafe_hosts[shown] = raw[:300]
            if len(self.unsafe_hosts) <= 20:
                _log.warning("host tag %s is not a plain node name (%s): analysed as %s, never acted on",
                             hosts.shown(raw), hosts.problem(raw), shown)
        return shown

    def __len__(self):
        return len(self.tags)


@dataclass
class Rows:
    """Rows of one measurement. ``num[field]`` is float64 with NaN for absent values (integers
    and booleans too: 1.0/0.0), ``text[field]`` the strings (None elsewhere), ``kind[field]`` the
    type of each row's value (0 absent, FLOAT, INT, BOOL, STR), and ``ints[field]`` the exact
    int64 values of a field holding an integer beyond +-2**53 (elsewhere ``num`` is exact)."""

    measurement: str
    sid: np.ndarray
    t: np.ndarray
    num: dict[str, np.ndarray] = field(default_factory=dict)
    text: dict[str, np.ndarray] = field(default_factory=dict)
    kind: dict[str, np.ndarray] = field(default_factory=dict)
    ints: dict[str, np.ndarray] = field(default_factory=dict)

    def __len__(self):
        return len(self.t)

    @staticmethod
    def concat(measurement: str, parts: list[Rows]) -> Rows:
        parts = [p for p in parts if len(p)]
        if not parts:
            return Rows(measurement, np.zeros(0, np.int64), np.zeros(0, np.int64))
        if len(parts) == 1:
            return parts[0]
        out = Rows(measurement, np.concatenate([p.sid for p in parts]), np.concatenate([p.t for p in parts]))
        for attr, fill in (("num", np.nan), ("text", None), ("kind", 0)):
            cols = [getattr(p, attr) for p in parts]
            for name in dict.fromkeys(k for c in cols for k in c):
                dtype = next(c[name] for c in cols if name in c).dtype
                parts_of = zip(cols, parts, strict=True)
                getattr(out, attr)[name] = np.concatenate(
                    [c[name] if name in c else np.full(len(r), fill, dtype) for c, r in parts_of]
                )
        for name in dict.fromkeys(k for p in parts for k in p.ints):
            out.ints[name] = np.concatenate([p.exact_ints(name) for p in parts])
        return out

    def exact_ints(self, name: str) -> np.ndarray:
        """The exact int64 of field ``name`` where it is an integer (0 elsewhere)."""
        if name in self.ints:
            return self.ints[name]
        out = np.zeros(len(self), np.int64)
        if name in self.kind and name in self.num:
            at = self.kind[name] == INT
            out[at] = self.num[name][at]  # within +-2**53 here: the float64 is exact
        return out

    def take(self, idx) -> Rows:
        return Rows(
            self.measurement,
            self.sid[idx],
            self.t[idx],
            {k: v[idx] for k, v in self.num.items()},
            {k: v[idx] for k, v in self.text.items()},
            {k: v[idx] for k, v in self.kind.items()},
            {k: v[idx] for k, v in self.ints.items()},
        )


@dataclass
class Stats:
    lines: int = 0
    points: int = 0
    bad_lines: int = 0
    no_timestamp: int = 0

    def as_dict(self) -> dict:
        return dict(self.__dict__)


class Parser:
    """Stateful chunk parser: ``feed(bytes)`` -> {measurement: Rows}; series ids persist."""

    # the C scanner keeps every field-key sequence it meets; past this many it starts afresh (a
    # producer writing ever new field names costs re-parsed heads, never unbounded memory)
    max_groups = 65536

    def __init__(
        self,
        measurements: set[str] | None = None,
        fields: dict[str, set[str] | None] | None = None,
        engine: str = "auto",
    ):
        """``measurements``: keep only these; ``fields``: per measurement, the fields to keep
        (None: all). ``engine``: "c" (the compiled tokenizer), "numpy", or "auto" (C when built)."""
        if engine not in ("auto", "c", "numpy"):
            raise ValueError(f"unknown parser engine {engine!r}")
        if engine == "c" and _lpscan is None:
            raise RuntimeError("the C line-protocol tokenizer is not built (pip install needs a C compiler)")
        self.engine = "c" if engine == "c" or (engine == "auto" and _lpscan is not None) else "numpy"
        self.fields = fields
        self.series = SeriesIndex()
        self.stats = Stats()
        self.only = measurements
        self._heads: dict[bytes, int] = {}  # head bytes -> sid, or -1 for a head to skip (numpy engine)
        self._meas_ids: dict[str, int] = {}
        self._reset_c()

    # ------------------------------------------------------------------ public
    def feed(self, data: bytes) -> dict[str, Rows]:
        if not data:
            return {}
        if data[-1:] != b"\n":
            data += b"\n"
        pieces: dict[str, list[Rows]] = {}
        try:
            (self._fast_c if self.engine == "c" else self._fast)(data, pieces)
        except MemoryError:
            raise
        except Exception:  # noqa: BLE001 - never lose a chunk to a fast-path corner case
            pieces = {}
            self._reset_c()  # the scanner may know heads and groups the glue has not taken
            self._slow(data.split(b"\n"), pieces)
        return {m: Rows.concat(m, p) for m, p in pieces.items()}

    # ------------------------------------------------------------------ slow path
    def _slow(self, lines, pieces: dict[str, list[Rows]], count: bool = True) -> None:
        acc: dict[str, tuple[list, list, dict]] = {}
        for raw in lines:
            if skip_line(raw):
                continue
            self.stats.lines += count
            try:
                p = parse_line(raw)
            except ParseError:
                self.stats.bad_lines += 1
                continue
            if p.time is None:
                self.stats.no_timestamp += 1
                continue
            if self.only is not None and p.measurement not in self.only:
                continue
            sid = self.series.add(p.measurement, p.tags)
            sids, ts, vals = acc.setdefault(p.measurement, ([], [], {}))
            i = len(ts)
            sids.append(sid)
            ts.append(p.time)
            for k, v in p.fields.items():
                vals.setdefault(k, {})[i] = v
            self.stats.points += 1
        for m, (sids, ts, vals) in acc.items():
            n = len(ts)
            r = Rows(m, np.array(sids, np.int64), np.array(ts, np.int64))
            for k, d in vals.items():
                kind = np.zeros(n, np.uint8)
                num = np.full(n, np.nan)
                text = None
                for i, v in d.items():
                    if isinstance(v, str):
                        if text is None:
                            text = np.full(n, None, dtype=object)
                        text[i] = v
                        kind[i] = STR
                        continue
                    kind[i] = BOOL if isinstance(v, bool) else INT if isinstance(v, int) else FLOAT
                    num[i] = v
                    if kind[i] == INT and not -_EXACT <= v <= _EXACT:
                        r.ints[k] = None  # filled below: every integer of the field, exactly
                if k in r.ints:
                    r.ints[k] = exact = np.zeros(n, np.int64)
                    for i, v in d.items():
                        if kind[i] == INT:
                            exact[i] = v
                r.kind[k] = kind
                if text is not None:
                    r.text[k] = text
                if (kind != STR).any():
                    r.num[k] = num
            pieces.setdefault(m, []).append(r)

    # ------------------------------------------------------------------ C tokenizer
    def _reset_c(self) -> None:
        """A fresh C scanner: its head and group ids restart (series ids do not: they are the
        SeriesIndex's)."""
        self._scanner = _lpscan.Scanner() if _lpscan is not None else None
        self._hsid = np.zeros(1024, np.int64)  # C head id -> series id (-1 skipped, -2 refused)
        self._hlen = np.zeros(1024, np.int64)  # C head id -> its length in bytes
        self._nheads = self._hmax = 0
        self._gkeys: list[list[bytes]] = []  # C group id -> its field keys
        self._plans: list[tuple | None] = []  # C group id -> its columns (once a row of it is kept)

    def _fast_c(self, data: bytes, pieces: dict[str, list[Rows]]) -> None:
        if len(self._plans) > self.max_groups:
            self._reset_c()
        (
            real,
            new_heads,
            new_groups,
            g_id,
            g_bound,
            head,
            f0,
            t,
            l0,
            l1,
            fval,
            ftype,
            b_idx,
            b_val,
            q_idx,
            q_v0,
            q_vn,
            s0,
            s1,
            picked,
        ) = self._scanner.scan(data)
        i64 = np.int64
        self.stats.lines += real
        if new_heads:
            self._add_heads(new_heads)
        if new_groups:
            self._gkeys += new_groups
            self._plans += [None] * len(new_groups)
        s0, s1 = np.frombuffer(s0, i64), np.frombuffer(s1, i64)
        if len(s0):
            self._slow(_slices(data, s0, s1), pieces, count=False)
        head = np.frombuffer(head, i64)
        if not len(head):
            return
        sid = self._hsid[head]
        self.stats.bad_lines += int(np.count_nonzero(sid == -2))
        f0, t = np.frombuffer(f0, i64), np.frombuffer(t, i64)
        fval, ftype = np.frombuffer(fval, np.float64), np.frombuffer(ftype, np.uint8)
        q_idx, q_v0, q_vn = np.frombuffer(q_idx, i64), np.frombuffer(q_v0, i64), np.frombuffer(q_vn, i64)
        b_idx, b_val = np.frombuffer(b_idx, i64), np.frombuffer(b_val, i64)
        bounds = np.frombuffer(g_bound, i64).tolist()
        seen: dict[bytes, str] = {}  # string values read in this chunk (a job id repeats)
        for g, gid in enumerate(np.frombuffer(g_id, i64).tolist()):
            a, b = bounds[g], bounds[g + 1]
            rows = slice(a, b)
            if (sid[rows] < 0).any():
                rows = np.flatnonzero(sid[rows] >= 0) + a
                if not len(rows):
                    continue
            plan = self._plans[gid] or self._plan(gid, int(sid[rows][0]))
            mname, names, maxkey, pos, cols = plan
            if names is not None and self._hmax + 4 + maxkey > 65535:  # the series key's limit
                hl = self._hlen[head[rows]].max()
                names = names if hl + 4 + maxkey <= 65535 else None
            if names is None:  # InfluxDB's corner cases (a key twice, "time", not UTF-8): line by line
                ls, le = np.frombuffer(l0, i64), np.frombuffer(l1, i64)
                self._slow(_slices(data, ls[rows], le[rows]), pieces, count=False)
                continue
            r = Rows(mname, sid[rows], t[rows])
            first = f0[rows]
            if picked[g] is not None:  # the scanner gathered the planned columns: (column, row)
                vals = np.frombuffer(picked[g][0], np.float64).reshape(len(pos), b - a)
                kinds = np.frombuffer(picked[g][1], np.uint8).reshape(len(pos), b - a)
                if not isinstance(rows, slice):
                    vals, kinds = vals[:, rows - a], kinds[:, rows - a]
            else:
                vidx = first + pos[:, None]  # (column, row) -> field
                kinds, vals = ftype[vidx], fval[vidx]
            strs = (kinds == STR) if len(q_idx) else None
            has_str = strs.any(axis=1).tolist() if strs is not None else [False] * len(cols)
            for j, name in enumerate(cols):
                typ = kinds[j]
                r.kind[name] = typ
                if has_str[j]:
                    at = np.flatnonzero(strs[j])
                    span = np.searchsorted(q_idx, first[at] + pos[j])
                    text = np.full(len(typ), None, dtype=object)
                    spans = zip(q_v0[span].tolist(), q_vn[span].tolist(), strict=True)
                    raw = [data[x : x + k] for x, k in spans]
                    got = [seen[v] if v in seen else seen.setdefault(v, _unquote(v)) for v in raw]
                    text[at] = np.array(got, dtype=object)
                    r.text[name] = text
                    if len(at) == len(typ):
                        continue
                r.num[name] = vals[j]
                if len(b_idx):
                    col = first + pos[j]
                    big = np.isin(col, b_idx)
                    if big.any():
                        iv = np.zeros(len(typ), i64)
                        small = (typ == INT) & ~big
                        iv[small] = vals[j][small]
                        iv[big] = b_val[np.searchsorted(b_idx, col[big])]
                        r.ints[name] = iv
            self.stats.points += len(r)
            pieces.setdefault(mname, []).append(r)

    def _add_heads(self, heads: list[bytes]) -> None:
        """Series ids of the heads the C scanner met for the first time (their ids follow on)."""
        n, k = self._nheads, len(heads)
        if n + k > len(self._hsid):
            grow = np.zeros(max(len(self._hsid), k), np.int64)
            self._hsid, self._hlen = np.concatenate([self._hsid, grow]), np.concatenate([self._hlen, grow])
        self._hsid[n : n + k] = [self._head_sid(h) for h in heads]
        self._hlen[n : n + k] = lens = [len(h) for h in heads]
        self._nheads += k
        self._hmax = max(self._hmax, *lens)

    def _plan(self, gid: int, sid: int) -> tuple:
        """A group's columns: (measurement, field names or None for the reference parser, longest
        key, positions of the fields to keep, their names)."""
        keys = self._gkeys[gid]
        mname = self.series.measurement[sid]
        names = _plain_names(keys, 0)
        cols = self._columns(mname, names) if names is not None else []
        pos = np.array([j for j, _ in cols], np.int64)
        plan = (mname, names, max(map(len, keys)), pos, [n for _, n in cols])
        self._plans[gid] = plan
        if names is not None:  # later scans gather these columns themselves
            self._scanner.columns(gid, pos.tobytes())
        return plan

    # ------------------------------------------------------------------ fast path
    def _fast(self, data: bytes, pieces: dict[str, list[Rows]]) -> None:
        code = np.frombuffer(data.translate(_CODES) + b"\0" * _VW, np.uint8)
        data += b"\0" * _VW
        buf = np.frombuffer(data, np.uint8)
        nz = np.flatnonzero(code.view(bool))  # every special byte, sparse from here on
        k = code[nz]
        nl = nz[buf[nz] == _NL]
        nlines = len(nl)
        starts = np.empty(nlines, np.int64)
        starts[0] = 0
        starts[1:] = nl[:-1] + 1
        ends = nl
        length = ends - starts
        first = buf[starts]
        lead = (length > 0) & ((first == _SP) | (first == _TAB) | (first == 0))  # blanks: skipped first
        real = (length > 0) & (first != _HASH) & ~lead
        self.stats.lines += int(real.sum())

        def count(pos):
            return np.bincount(np.searchsorted(nl, pos), minlength=nlines)

        def line_of(pos):
            return np.searchsorted(nl, pos)

        # the head ends at the first space whose previous byte is not a backslash; escapes and
        # quotes there are the head parser's (once per series); after it, a backslash or a quote
        # that is not a string's own takes the reference parser
        sp = nz[(k == 1) & (buf[nz] == _SP)]
        sp = sp[buf[sp - 1] != _BSLASH]
        j = np.searchsorted(sp, starts)
        head_end = np.where(j < len(sp), sp[np.minimum(j, len(sp) - 1)], ends) if len(sp) else ends
        head_end = np.minimum(head_end, ends)
        bsp = nz[k == 3]
        qi = np.flatnonzero(k == 2)  # quotes, as indices into nz
        qpos = nz[qi]
        bl, ql = line_of(bsp), line_of(qpos)
        slow = real & (
            (count(nz[k == 4]) > 0)  # a carriage return or a NUL
            | (count(qpos) % 2 == 1)
            | (np.bincount(bl[bsp > head_end[bl]], minlength=nlines) > 0)
            | (np.bincount(ql[qpos < head_end[ql]], minlength=nlines) > 0)
            | (head_end >= ends - 1)
        )
        fast = real & ~slow
        keepq = fast[ql]  # only the quotes of lines read here (a comment may hold one)
        qi, qpos = qi[keepq], qpos[keepq]
        di = np.flatnonzero(k == 1)
        D = nz[di]
        drop = (buf[D - 1] == _BSLASH) & (buf[D] != _NL)
        if len(qi):  # inside quotes: an odd number of quotes before it
            qm = np.zeros(len(nz), np.int32)
            qm[qi] = 1
            drop |= (np.cumsum(qm, dtype=np.int32)[di] & 1).astype(bool)
        P = D[~drop]
        c = buf[P]
        tstart = np.empty(len(P), np.int64)
        tstart[0] = 0
        tstart[1:] = P[:-1] + 1
        prevc = np.empty(len(P), np.uint8)
        prevc[0] = _NL
        prevc[1:] = c[:-1]
        newline_tok = prevc == _NL
        lid = np.cumsum(newline_tok) - 1  # line index of each token
        spaces = np.cumsum(prevc == _SP)
        line_first_tok = np.flatnonzero(newline_tok)
        sec = spaces - spaces[line_first_tok][lid]
        tok_fast = fast[lid]
        tlen = P - tstart

        # per line: section 1 (fields) must alternate key= value, ; exactly 3 sections
        in1 = (sec == 1) & tok_fast
        pos1 = np.cumsum(in1) - 1
        first1 = np.full(len(nl), -1, np.int64)
        idx1 = np.flatnonzero(in1)
        badl = np.zeros(len(nl), bool)
        # position of each section-1 token within its line
        if len(idx1):
            lid1 = lid[idx1]
            newl = np.ones(len(idx1), bool)
            newl[1:] = lid1[1:] != lid1[:-1]
            first1[lid1[newl]] = pos1[idx1[newl]]
            p_in = pos1[idx1] - first1[lid1]
            is_key = c[idx1] == _EQ
            okk = (p_in % 2 == 0) == is_key
            okk &= tlen[idx1] > 0
            badl[lid1[~okk]] = True
        else:
            lid1 = np.zeros(0, np.int64)
        last_tok = np.empty(len(nl), np.int64)
        last_tok[:-1] = line_first_tok[1:] - 1
        last_tok[-1] = len(P) - 1
        nsec = sec[last_tok]
        n1 = np.bincount(lid1, minlength=len(nl)) if len(lid1) else np.zeros(len(nl), np.int64)
        badl |= (nsec != 2) | (n1 < 2) | (n1 % 2 == 1)  # no timestamp: the reference parser counts it

        # keys and values of section 1, checked against InfluxDB's grammar; the timestamp too
        keys = idx1[c[idx1] == _EQ]
        vals = keys + 1
        vstart, vlen = tstart[vals], tlen[vals]
        kb = buf[tstart[keys]]
        badl[lid[keys[(kb == _TAB) | (kb == 0)]]] = True  # InfluxDB skips blanks before a key
        is_str = buf[vstart] == _QUOTE
        vkind = np.full(len(vals), STR, np.uint8)
        vnum = np.full(len(vals), np.nan)
        ivals = np.zeros(len(vals), np.int64)
        ns = np.flatnonzero(~is_str)
        vkind[ns], vnum[ns], ivals[ns] = _values(buf, vstart[ns], vlen[ns])
        strs_ok = (vlen >= 2) & (buf[vstart + vlen - 1] == _QUOTE)
        badl[lid[vals[(vkind == 0) | (is_str & ~strs_ok)]]] = True
        nstr = np.bincount(lid[vals[is_str]], minlength=nlines)
        badl |= count(qpos) != 2 * nstr  # a quote inside a string or a key
        ts_tok = np.full(len(nl), -1, np.int64)
        t2 = np.flatnonzero((sec == 2) & (prevc == _SP))
        ts_tok[lid[t2]] = t2
        badl[lid[t2[c[t2] != _NL]]] = True  # the timestamp ends the line
        tvals = np.zeros(len(nl), np.int64)
        has_t = np.flatnonzero(fast & ~badl & (ts_tok >= 0))
        tv, tok_ok = _timestamps(buf, tstart[ts_tok[has_t]], tlen[ts_tok[has_t]])
        tvals[has_t] = tv
        badl[has_t[~tok_ok]] = True
        badl &= fast
        good = fast & ~badl
        if badl.any():
            self._slow(_slices(data, starts[badl], ends[badl]), pieces, count=False)
        if slow.any():
            self._slow(_slices(data, starts[slow], ends[slow]), pieces, count=False)
        if lead.any():
            self._slow(_slices(data, starts[lead], ends[lead]), pieces)
        gl = np.flatnonzero(good)
        if not len(gl):
            return

        # heads: bytes before the first unescaped space of each good line
        hs, he = starts[gl].tolist(), head_end[gl].tolist()
        sids = self._sids([data[a:b] for a, b in zip(hs, he, strict=True)])
        self.stats.bad_lines += int(np.count_nonzero(sids == -2))
        keep = sids >= 0
        gl, sids = gl[keep], sids[keep]
        if not len(gl):
            return
        tvals = tvals[gl]

        klid = lid[keys]
        sel = np.zeros(len(nl), bool)
        sel[gl] = True
        m = sel[klid]
        keys, vals, klid = keys[m], vals[m], klid[m]
        vstart, vlen, is_str, vkind, vnum, ivals = vstart[m], vlen[m], is_str[m], vkind[m], vnum[m], ivals[m]
        fp = _fingerprint(buf, tstart[keys], tlen[keys])
        nk = np.bincount(klid, minlength=len(nl))[gl]
        kfirst = np.zeros(len(nl) + 1, np.int64)
        np.cumsum(np.bincount(klid, minlength=len(nl)), out=kfirst[1:])
        # per-line signature: position-weighted sum of key fingerprints
        posw = (np.arange(len(keys)) - kfirst[klid]).astype(np.uint64) * _MULT[0] + np.uint64(1)
        with np.errstate(over="ignore"):
            h = fp * posw
            sig = np.add.reduceat(h, kfirst[gl]) if len(h) else np.zeros(len(gl), np.uint64)
        mids = self._meas_ids
        smeas = self.series.measurement
        mid = np.array([mids.setdefault(smeas[s], len(mids)) for s in sids.tolist()], np.uint64)
        with np.errstate(over="ignore"):
            gkey = sig ^ (mid * np.uint64(0xD6E8FEB86659FD93)) ^ (nk.astype(np.uint64) << np.uint64(48))
        ukeys, ginv = np.unique(gkey, return_inverse=True)
        groups = []
        for g in range(len(ukeys)):
            rows = np.flatnonzero(ginv == g)
            line0 = gl[rows[0]]
            nkeys = int(nk[rows[0]])
            k0 = int(kfirst[line0])
            raw = [
                data[a : a + n]
                for a, n in zip(
                    tstart[keys[k0 : k0 + nkeys]].tolist(), tlen[keys[k0 : k0 + nkeys]].tolist(), strict=True
                )
            ]
            names = _plain_names(raw, int((head_end[gl[rows]] - starts[gl[rows]]).max()))
            if names is None:  # InfluxDB's corner cases (a key twice, "time", not UTF-8): line by line
                self._slow(_slices(data, starts[gl[rows]], ends[gl[rows]]), pieces, count=False)
                continue
            mname = self.series.measurement[int(sids[rows[0]])]
            cols = self._columns(mname, names)
            vidx = kfirst[gl[rows]][:, None] + np.array([j for j, _ in cols], np.int64)
            groups.append((rows, vidx, [n for _, n in cols], mname))
        for rows, vidx, names, mname in groups:
            r = Rows(mname, sids[rows], tvals[rows])
            for j, name in enumerate(names):
                col = vidx[:, j]
                typ = vkind[col]
                r.kind[name] = typ
                strs = typ == STR
                if strs.any():
                    ss = vstart[col].tolist()
                    ll = vlen[col].tolist()
                    r.text[name] = np.array(
                        [
                            _unquote(data[a : a + n]) if q else None
                            for a, n, q in zip(ss, ll, strs.tolist(), strict=True)
                        ],
                        dtype=object,
                    )
                if not strs.all():  # a field may be a number in one line and a string in another
                    r.num[name] = vnum[col]
                    iv = ivals[col]
                    if ((iv > _EXACT) | (iv < -_EXACT)).any():
                        r.ints[name] = iv
            self.stats.points += len(rows)
            pieces.setdefault(mname, []).append(r)

    def _sids(self, heads: list[bytes]) -> np.ndarray:
        """Series id per head (cached; a new head is parsed once)."""
        cache = self._heads
        return np.array([cache[h] if h in cache else self._head(h) for h in heads], np.int64)

    def _columns(self, measurement: str, names: list[str]) -> list[tuple[int, str]]:
        """(position, name) of the fields to keep (a field named "time" never: InfluxDB drops it)."""
        wanted = self.fields.get(measurement) if self.fields is not None else None
        return [(j, n) for j, n in enumerate(names) if n != "time" and (wanted is None or n in wanted)]

    def _head(self, head: bytes) -> int:
        """A new series head's id, parsed once and cached."""
        sid = self._heads[head] = self._head_sid(head)
        return sid

    def _head_sid(self, head: bytes) -> int:
        """Parse a series head: its series id, -1 if filtered out, -2 if InfluxDB rejects it."""
        try:
            meas, tags = parse_head(head)
        except ParseError:
            return -2
        if self.only is not None and meas not in self.only:
            return -1
        return self.series.add(meas, tags)


def _plain_names(keys: list[bytes], head_len: int) -> list[str] | None:
    """Field names of a group of lines, or None where InfluxDB has a rule for them: a key written
    twice, a field named "time" alone, a key that is not UTF-8, a series key too long."""
    try:
        names = [k.decode() for k in keys]
    except UnicodeDecodeError:
        return None
    if len(set(names)) != len(names) or names == ["time"] or head_len + 4 + max(map(len, keys)) > 65535:
        return None
    return names


_UNESC = re.compile(rb'\\([\\"])')


def _unquote(raw: bytes) -> str:
    """A string field value as InfluxDB reads it: the bytes between the quotes, ``\\\\`` and ``\\"``
    unescaped (``\\n`` stays a backslash and an n)."""
    body = raw[1:-1]
    if b"\\" in body:
        body = _UNESC.sub(rb"\1", body)
    return body.decode("utf-8", "replace")


def _slices(data: bytes, starts: np.ndarray, ends: np.ndarray) -> list[bytes]:
    return [data[a:b] for a, b in zip(starts.tolist(), ends.tolist(), strict=True)]


_LOW = np.array([(1 << (8 * k)) - 1 for k in range(8)] + [(1 << 64) - 1], dtype=np.uint64)


def _words(buf: np.ndarray) -> np.ndarray:
    """Every 8-byte little-endian word of ``buf``, one per byte offset (an overlapping view, no copy)."""
    return np.ndarray((len(buf) - 7,), dtype="<u8", buffer=buf, strides=(1,))


def _gather(buf: np.ndarray, start: np.ndarray, n: np.ndarray, width: int) -> np.ndarray:
    """(len(start), width) bytes from buf[start:start+n], zero beyond n (buf ends in >= width pad bytes).

    Read as 8-byte words through an overlapping view (one fancy index per word, not per byte)."""
    nw = width // 8
    words = _words(buf)
    start = np.minimum(start, len(words) - 1 - 8 * (nw - 1))
    if nw == 1:
        out = words[start] & _LOW[np.clip(n, 0, 8)]
        return out.view(np.uint8).reshape(len(start), 8)
    j = np.arange(nw, dtype=np.int64) * 8
    out = words[start[:, None] + j[None, :]]
    out &= _LOW[np.clip(n[:, None] - j[None, :], 0, 8)]
    return out.view(np.uint8).reshape(len(start), width)


def _fingerprint(buf: np.ndarray, start: np.ndarray, n: np.ndarray) -> np.ndarray:
    """64-bit hash of each key token's whole content (its length and every 8-byte word, mixed),
    so that lines are grouped by their exact keys (a test checks it is injective over the
    catalogue; two different keys collide with a chance of about 2**-64)."""
    if not len(start):
        return np.zeros(0, np.uint64)
    words = _words(buf)
    last = len(words) - 1
    h = n.astype(np.uint64) * _MULT[2] + np.uint64(1)
    with np.errstate(over="ignore"):
        h ^= words[start] & _LOW[np.clip(n, 0, 8)]
        h *= _MULT[0]
        for j in range(8, min(int(n.max()), 64), 8):  # the longer keys only, word by word
            sel = np.flatnonzero(n > j)
            w = words[np.minimum(start[sel] + j, last)] & _LOW[np.clip(n[sel] - j, 0, 8)]
            h[sel] = ((h[sel] ^ w) * _MULT[(j // 8) % 2]) ^ np.uint64(j)
        h ^= h >> np.uint64(29)
    for i in np.flatnonzero(n > 64).tolist():  # rare: the rest of a long key, in Python
        rest = bytes(buf[start[i] + 64 : start[i] + n[i]])
        h[i] ^= np.uint64(int.from_bytes(hashlib.blake2b(rest, digest_size=8).digest(), "little"))
    return h


_POS = np.arange(_VW)
_BOOLS = np.array(
    [int.from_bytes(w, "little") for w in b"t T true True TRUE f F false False FALSE".split()], np.uint64
)
_MAX_TS = np.bytes_(b"9223372036854775806")  # InfluxDB's range is +-(2**63 - 2)
_ORD = {c: ord(c) for c in "0123456789.-+eEi"}
_NOT_FLOAT = np.ones(256, bool)  # bytes a float token never holds (NUL: the padding)
_NOT_FLOAT[list(b"\x00" + b"0123456789.eE+-")] = False
_NOT_INT = np.ones(256, bool)
_NOT_INT[list(b"\x00" + b"0123456789-")] = False
_FLOAT_RE = re.compile(rb"-?(?:[0-9]+\.?[0-9]*|\.[0-9]+)(?:[eE][+-]?[0-9]+)?\Z")


def _values(buf: np.ndarray, start: np.ndarray, n: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(kind, float64 value, exact int64) of non-string value tokens in InfluxDB's grammar: floats
    -?(digits[.digits*]|.digits)([eE][+-]?digits)? and finite, integers -?digits + i within int64,
    the ten boolean spellings. Kind 0 for anything else and for tokens longer than _VW bytes: the
    reference parser decides those. numpy's conversion is Python's float()/int(), correctly
    rounded; a character check first keeps out what those take and InfluxDB does not (blanks,
    underscores, inf, nan, a leading +). Tokens hold no NUL (such lines take the slow path), so
    the zero padding of a gathered token passes the character check."""
    k = len(start)
    kind = np.zeros(k, np.uint8)
    fval = np.full(k, np.nan)
    ival = np.zeros(k, np.int64)
    lo = 0
    for w in (8, 16, _VW):
        idx = np.flatnonzero((n > lo) & (n <= w))
        lo = w
        if not len(idx):
            continue
        L = n[idx]
        g = _gather(buf, start[idx], L, w)
        last = g[np.arange(len(idx)), L - 1]
        plus = g[:, 0] == _ORD["+"]
        is_i = (last == _ORD["i"]) & (L >= 2) & ~plus
        cand = np.flatnonzero(is_i)
        if len(cand):
            body = g[cand]
            body[np.arange(len(cand)), L[cand] - 1] = 0
            good = ~_NOT_INT[body].any(1)
            cand = cand[good]
            iv, ok = _convert(body[good].view(f"S{w}")[:, 0], np.int64)
            sel = idx[cand[ok]]
            kind[sel] = INT
            ival[sel] = iv[ok]
            fval[sel] = iv[ok]
        num = ((last >= _ORD["0"]) & (last <= _ORD["9"])) | (last == _ORD["."])
        cand = np.flatnonzero(num & ~plus)
        if len(cand):
            gc = g[cand]
            good = ~_NOT_FLOAT[gc].any(1)
            cand = cand[good]
            fv, ok = _convert(gc[good].view(f"S{w}")[:, 0], np.float64)
            ok &= np.isfinite(fv)
            sel = idx[cand[ok]]
            kind[sel] = FLOAT
            fval[sel] = fv[ok]
        cand = np.flatnonzero(~is_i & ~num & (L <= 5))
        if len(cand):
            word = g[cand, :8].copy().view("<u8")[:, 0]
            sel = idx[cand[np.isin(word, _BOOLS)]]
            kind[sel] = BOOL
            fval[sel] = np.isin(buf[start[sel]], (ord("t"), ord("T")))
    return kind, fval, ival


def _convert(s: np.ndarray, dtype) -> tuple[np.ndarray, np.ndarray]:
    """Bytes tokens to numbers in one call; where one of them is not a number, one by one."""
    try:
        return s.astype(dtype), np.ones(len(s), bool)
    except (ValueError, OverflowError):
        pass
    out = np.zeros(len(s), dtype)
    ok = np.zeros(len(s), bool)
    for i, x in enumerate(s.tolist()):
        try:
            if dtype is np.int64:
                v = int(x)
                if not -(2**63) <= v < 2**63:
                    continue
            elif not _FLOAT_RE.match(x):
                continue
            else:
                v = float(x)
        except ValueError:
            continue
        out[i] = v
        ok[i] = True
    return out, ok


def _timestamps(buf: np.ndarray, start: np.ndarray, n: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """-?digits within InfluxDB's range; (values, ok). 19 digits and more take the reference parser."""
    ok = np.zeros(len(start), bool)
    vals = np.zeros(len(start), np.int64)
    idx = np.flatnonzero((n > 0) & (n <= 24))
    if not len(idx):
        return vals, ok
    g = _gather(buf, start[idx], n[idx], 24)
    L = n[idx]
    pos = _POS[None, :24]
    lead = (pos == 0) & (g[:, :1] == _ORD["-"])
    body = (pos < L[:, None]) & ~lead
    nd = body.sum(1)
    good = ~(body & ((g < _ORD["0"]) | (g > _ORD["9"]))).any(1) & (nd >= 1) & (nd <= 19)
    long = np.flatnonzero(good & (nd == 19))  # compare the digits with the bound, as text
    if len(long):
        neg = (g[long, 0] == _ORD["-"]).astype(np.int64)
        digits = _gather(buf, start[idx[long]] + neg, np.full(len(long), 19), 24).view("S24")[:, 0]
        good[long[digits > _MAX_TS]] = False
    sel = idx[good]
    vals[sel] = g[good].view("S24")[:, 0].astype(np.int64)
    ok[sel] = True
    return vals, ok
