"""Line protocol -> columns, fast: a vectorised tokenizer over whole chunks of lines.

The analyzer reads millions of wide rows; a Python loop over every field of every line is
too slow. ``Parser.feed(chunk)`` finds every delimiter of a chunk with numpy, groups lines
by their field-key signature (one producer writes its fields in one order), converts all
numeric values of the chunk in one call and slices Python strings only for the series head
(measurement and tags, cached) and for string fields. Lines the fast path cannot prove
well-formed (escapes, odd quotes, stray delimiters) go through ``gpufleet.lineprotocol``;
what that rejects is skipped and counted, never raised.

Result: per measurement a :class:`Rows` block (series id, time in ns, float columns where
NaN means absent, string columns) plus the :class:`SeriesIndex` mapping ids to tags.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

import numpy as np

from gpufleet.lineprotocol import ParseError, parse_line

try:  # the C tokenizer (analyzer/_lpscan.c), built at install when a compiler is there
    from analyzer import _lpscan
except ImportError:  # pragma: no cover - exercised where no compiler was available
    _lpscan = None

_SP, _COMMA, _EQ, _NL, _QUOTE, _BSLASH, _HASH = 32, 44, 61, 10, 34, 92, 35
_T_STR, _T_BAD = 4, 5  # value types from the C tokenizer
_VW = 32  # widest numeric value token the fast path converts
_NUMCHARS = np.zeros(256, bool)
_NUMCHARS[[ord(c) for c in "0123456789.eE+-"]] = True
_NUMCHARS[0] = True
_CODES = bytes(
    1 if i in (_COMMA, _EQ, _SP, _NL) else 2 if i == _QUOTE else 3 if i == _BSLASH else 4 if i == 13 else 0
    for i in range(256)
)
_MULT = np.array([0x9E3779B97F4A7C15, 0xC2B2AE3D27D4EB4F, 0x165667B19E3779F9], dtype=np.uint64)


class SeriesIndex:
    """Series head (measurement + tags, as written) -> small int id, and id -> tags."""

    def __init__(self):
        self.ids: dict[tuple, int] = {}
        self.measurement: list[str] = []
        self.tags: list[dict[str, str]] = []

    def add(self, measurement: str, tags: dict[str, str]) -> int:
        key = (measurement, *sorted(tags.items()))  # not a joined string: "a\\,b=1" is no tag
        sid = self.ids.get(key)
        if sid is None:
            sid = len(self.tags)
            self.ids[key] = sid
            self.measurement.append(measurement)
            self.tags.append(tags)
        return sid

    def __len__(self):
        return len(self.tags)


@dataclass
class Rows:
    """Rows of one measurement. ``num[field]`` is float64 with NaN for absent values."""

    measurement: str
    sid: np.ndarray
    t: np.ndarray
    num: dict[str, np.ndarray] = field(default_factory=dict)
    text: dict[str, np.ndarray] = field(default_factory=dict)

    def __len__(self):
        return len(self.t)

    @staticmethod
    def concat(measurement: str, parts: list[Rows]) -> Rows:
        parts = [p for p in parts if len(p)]
        if not parts:
            return Rows(measurement, np.zeros(0, np.int64), np.zeros(0, np.int64))
        if len(parts) == 1:
            return parts[0]
        n = [len(p) for p in parts]
        out = Rows(measurement, np.concatenate([p.sid for p in parts]), np.concatenate([p.t for p in parts]))
        for name in dict.fromkeys(k for p in parts for k in p.num):
            out.num[name] = np.concatenate(
                [p.num.get(name, np.full(k, np.nan)) for p, k in zip(parts, n, strict=False)]
            )
        for name in dict.fromkeys(k for p in parts for k in p.text):
            out.text[name] = np.concatenate(
                [p.text.get(name, np.full(k, None, dtype=object)) for p, k in zip(parts, n, strict=False)]
            )
        return out

    def take(self, idx) -> Rows:
        return Rows(
            self.measurement,
            self.sid[idx],
            self.t[idx],
            {k: v[idx] for k, v in self.num.items()},
            {k: v[idx] for k, v in self.text.items()},
        )


@dataclass
class Stats:
    lines: int = 0
    points: int = 0
    bad_lines: int = 0
    no_timestamp: int = 0
    bad_values: int = 0

    def as_dict(self) -> dict:
        return dict(self.__dict__)


class Parser:
    """Stateful chunk parser: ``feed(bytes)`` -> {measurement: Rows}; series ids persist."""

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
        self._heads: dict[bytes, int] = {}  # head bytes -> sid, or -1 for a head to skip
        self._meas_ids: dict[str, int] = {}

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
            self._slow(data.split(b"\n"), pieces)
        return {m: Rows.concat(m, p) for m, p in pieces.items()}

    # ------------------------------------------------------------------ slow path
    def _slow(self, lines, pieces: dict[str, list[Rows]], count: bool = True) -> None:
        acc: dict[str, tuple[list, list, dict, dict]] = {}
        for raw in lines:
            if not raw or raw[:1] == b"#" or not raw.strip():
                continue
            self.stats.lines += count
            try:
                p = parse_line(raw.decode("utf-8", "replace"))
            except (ParseError, ValueError, IndexError):
                self.stats.bad_lines += 1
                continue
            if p.time == 0:
                self.stats.no_timestamp += 1
                continue
            if not -(2**63) <= p.time < 2**63:
                self.stats.bad_lines += 1
                continue
            if self.only is not None and p.measurement not in self.only:
                continue
            sid = self.series.add(p.measurement, p.tags)
            sids, ts, num, text = acc.setdefault(p.measurement, ([], [], {}, {}))
            i = len(ts)
            sids.append(sid)
            ts.append(p.time)
            for k, v in p.fields.items():
                if isinstance(v, str):
                    text.setdefault(k, {})[i] = v
                else:
                    try:
                        fv = float(v)
                    except (TypeError, ValueError):
                        self.stats.bad_values += 1
                        continue
                    num.setdefault(k, {})[i] = fv
            self.stats.points += 1
        for m, (sids, ts, num, text) in acc.items():
            n = len(ts)
            r = Rows(m, np.array(sids, np.int64), np.array(ts, np.int64))
            for k, d in num.items():
                col = np.full(n, np.nan)
                col[list(d)] = list(d.values())
                r.num[k] = col
            for k, d in text.items():
                col = np.full(n, None, dtype=object)
                for i, v in d.items():
                    col[i] = v
                r.text[k] = col
            pieces.setdefault(m, []).append(r)

    # ------------------------------------------------------------------ C tokenizer
    def _fast_c(self, data: bytes, pieces: dict[str, list[Rows]]) -> None:
        (real, head, group, f0, t, h0, hn, g_line, g_nf, fval, ftype, fk0, fkn, fv0, fvn, s0, s1) = (
            _lpscan.scan(data)
        )
        i64 = np.int64
        self.stats.lines += real
        s0, s1 = np.frombuffer(s0, i64), np.frombuffer(s1, i64)
        if len(s0):
            self._slow(_slices(data, s0, s1), pieces, count=False)
        head, group = np.frombuffer(head, i64), np.frombuffer(group, i64)
        if not len(head):
            return
        f0, t = np.frombuffer(f0, i64), np.frombuffer(t, i64)
        h0, hn = np.frombuffer(h0, i64).tolist(), np.frombuffer(hn, i64).tolist()
        sids = self._sids([data[a : a + k] for a, k in zip(h0, hn, strict=True)])
        self.stats.bad_lines += int(np.count_nonzero(sids == -2))
        sid = sids[head]
        fval, ftype = np.frombuffer(fval, np.float64), np.frombuffer(ftype, np.uint8)
        self.stats.bad_values += int(np.count_nonzero(ftype == _T_BAD))
        fk0, fkn = np.frombuffer(fk0, i64), np.frombuffer(fkn, i64)
        fv0, fvn = np.frombuffer(fv0, i64), np.frombuffer(fvn, i64)
        g_line, g_nf = np.frombuffer(g_line, i64).tolist(), np.frombuffer(g_nf, i64).tolist()
        order = np.argsort(group, kind="stable")
        bounds = np.concatenate([[0], np.cumsum(np.bincount(group, minlength=len(g_line)))]).tolist()
        for g, (line0, nf) in enumerate(zip(g_line, g_nf, strict=True)):
            rows = order[bounds[g] : bounds[g + 1]]
            rows = rows[sid[rows] >= 0]
            if not len(rows):
                continue
            k0 = int(f0[line0])
            keys = zip(fk0[k0 : k0 + nf].tolist(), fkn[k0 : k0 + nf].tolist(), strict=True)
            mname = self.series.measurement[int(sid[rows[0]])]
            r = Rows(mname, sid[rows], t[rows])
            first = f0[rows]
            for j, name in self._columns(mname, [_unkey(data[a : a + k]) for a, k in keys]):
                col = first + j
                typ = ftype[col]
                strs = typ == _T_STR
                if strs.any():
                    vals = zip(fv0[col].tolist(), fvn[col].tolist(), strs.tolist(), strict=True)
                    r.text[name] = np.array(
                        [_unquote(data[a : a + k]) if q else None for a, k, q in vals], dtype=object
                    )
                    if strs.all():
                        continue
                r.num[name] = fval[col]
            self.stats.points += len(rows)
            pieces.setdefault(mname, []).append(r)

    # ------------------------------------------------------------------ fast path
    def _fast(self, data: bytes, pieces: dict[str, list[Rows]]) -> None:
        data += b"\0" * _VW
        buf = np.frombuffer(data, np.uint8)
        code = np.frombuffer(data.translate(_CODES), np.uint8)
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
        real = (length > 0) & (first != _HASH)
        self.stats.lines += int(real.sum())

        def count(pos):
            return np.bincount(np.searchsorted(nl, pos), minlength=nlines)

        # a byte right after a backslash is escaped, never a delimiter (buf[-1] is a pad byte, not one)
        bsp = nz[k == 3]
        qi = np.flatnonzero(k == 2)  # quotes, as indices into nz
        qpos = nz[qi]
        unesc = buf[qpos - 1] != _BSLASH
        qi, qpos = qi[unesc], qpos[unesc]
        slow = real & (
            (count(bsp[buf[bsp - 1] == _BSLASH]) > 0) | (count(qpos) % 2 == 1) | (count(nz[k == 4]) > 0)
        )
        if slow.any():
            keepq = ~slow[np.searchsorted(nl, qpos)]
            qi, qpos = qi[keepq], qpos[keepq]
        fast = real & ~slow
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

        # per line: section 1 (fields) must alternate key= value, ; at most 3 sections
        in1 = (sec == 1) & tok_fast
        pos1 = np.cumsum(in1) - 1
        first1 = np.full(len(nl), -1, np.int64)
        idx1 = np.flatnonzero(in1)
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
            badl = np.zeros(len(nl), bool)
            badl[lid1[~okk]] = True
        else:
            lid1 = np.zeros(0, np.int64)
            badl = np.zeros(len(nl), bool)
        last_tok = np.empty(len(nl), np.int64)
        last_tok[:-1] = line_first_tok[1:] - 1
        last_tok[-1] = len(P) - 1
        nsec = sec[last_tok]
        n1 = np.bincount(lid1, minlength=len(nl)) if len(lid1) else np.zeros(len(nl), np.int64)
        badl |= (nsec < 1) | (nsec > 2) | (n1 < 2) | (n1 % 2 == 1)
        badl &= fast
        # section-0 tokens other than the measurement must alternate too; leave that to the head parse
        good = fast & ~badl
        if badl.any():
            self._slow(_slices(data, starts[badl], ends[badl]), pieces, count=False)
        if slow.any():
            self._slow(_slices(data, starts[slow], ends[slow]), pieces, count=False)
        gl = np.flatnonzero(good)
        if not len(gl):
            return

        # heads: bytes before the first space of each good line
        first_sp_tok = np.flatnonzero((c == _SP) & (sec == 0))  # token ending with the first space
        head_end = np.full(len(nl), -1, np.int64)
        head_end[lid[first_sp_tok]] = P[first_sp_tok]
        hs, he = starts[gl].tolist(), head_end[gl].tolist()
        sids = self._sids([data[a:b] for a, b in zip(hs, he, strict=True)])
        self.stats.bad_lines += int(np.count_nonzero(sids == -2))
        keep = sids >= 0
        gl, sids = gl[keep], sids[keep]
        if not len(gl):
            return

        # timestamps
        ts_tok = np.full(len(nl), -1, np.int64)
        t2 = np.flatnonzero((sec == 2) & (prevc == _SP))
        ts_tok[lid[t2]] = t2
        tt = ts_tok[gl]
        has_t = tt >= 0
        self.stats.no_timestamp += int((~has_t).sum())
        gl, sids, tt = gl[has_t], sids[has_t], tt[has_t]
        tvals, tok_ok = _to_numbers(buf, tstart[tt], tlen[tt], as_int=True)
        self.stats.bad_lines += int((~tok_ok).sum())
        gl, sids, tvals = gl[tok_ok], sids[tok_ok], tvals[tok_ok]
        if not len(gl):
            return

        # keys / values of section 1
        keys = idx1[c[idx1] == _EQ]
        vals = keys + 1
        klid = lid[keys]
        sel = np.zeros(len(nl), bool)
        sel[gl] = True
        m = sel[klid]
        keys, vals, klid = keys[m], vals[m], klid[m]
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
        vstart = tstart[vals]
        is_str = buf[vstart] == _QUOTE
        groups = []
        need = np.zeros(len(vals), bool)
        for g in range(len(ukeys)):
            rows = np.flatnonzero(ginv == g)
            line0 = gl[rows[0]]
            k = int(nk[rows[0]])
            names = self._names(data, tstart, tlen, keys, kfirst[line0], k)
            mname = self.series.measurement[int(sids[rows[0]])]
            cols = self._columns(mname, names)
            vidx = kfirst[gl[rows]][:, None] + np.array([j for j, _ in cols], np.int64)
            need[vidx.ravel()] = True
            groups.append((rows, vidx, [n for _, n in cols], mname))
        # convert only the values some detector reads
        vnum = np.full(len(vals), np.nan)
        sel = np.flatnonzero(need & ~is_str)
        conv, vok = _to_numbers(buf, vstart[sel], tlen[vals[sel]], as_int=False)
        vnum[sel] = conv
        self.stats.bad_values += int((~vok).sum())
        for rows, vidx, names, mname in groups:
            r = Rows(mname, sids[rows], tvals[rows])
            for j, name in enumerate(names):
                col = vidx[:, j]
                strs = is_str[col]
                if strs.any():
                    ss = vstart[col].tolist()
                    ll = tlen[vals[col]].tolist()
                    r.text[name] = np.array(
                        [
                            _unquote(data[a : a + n]) if q else None
                            for a, n, q in zip(ss, ll, strs.tolist(), strict=True)
                        ],
                        dtype=object,
                    )
                if not strs.all():  # a field may be a number in one line and a string in another
                    r.num[name] = vnum[col]
            self.stats.points += len(rows)
            pieces.setdefault(mname, []).append(r)

    def _sids(self, heads: list[bytes]) -> np.ndarray:
        """Series id per head (cached; a new head is parsed once)."""
        cache = self._heads
        return np.array([cache[h] if h in cache else self._head(h) for h in heads], np.int64)

    def _names(self, data, tstart, tlen, keys, k0, k):
        sig = tuple((int(tstart[keys[k0 + j]]), int(tlen[keys[k0 + j]])) for j in range(k))
        return [_unkey(data[a : a + n]) for a, n in sig]

    def _columns(self, measurement: str, names: list[str]) -> list[tuple[int, str]]:
        """(position, name) of the fields to keep; a key written twice in a line keeps its last
        value, as InfluxDB does."""
        wanted = self.fields.get(measurement) if self.fields is not None else None
        last = {n: j for j, n in enumerate(names)}
        return [(j, n) for n, j in last.items() if wanted is None or n in wanted]

    def _head(self, head: bytes) -> int:
        """Parse a new series head once; -1 if malformed or filtered out."""
        sid = -1
        text = head.decode("utf-8", "replace")
        try:
            if '"' in text or "\x00" in text or "\x01" in text or "\x02" in text or "\x03" in text:
                p = parse_line(text + " x=1 1")
                meas, tags = p.measurement, p.tags
            else:  # plain splits, escapes swapped for placeholders first ("NVIDIA\ H200")
                esc = "\\" in text
                if esc:
                    text = text.replace("\\\\", "\x00").replace("\\,", "\x01").replace("\\=", "\x02")
                    text = text.replace("\\ ", "\x03")
                meas, *pairs = text.split(",")
                tags = {}
                for pair in pairs:
                    k, eq, v = pair.partition("=")
                    if not eq or not k or "=" in v:
                        raise ParseError(f"bad tag {pair!r}")
                    tags[_unplace(k) if esc else k] = _unplace(v) if esc else v
                meas = _unplace(meas) if esc else meas
                if not meas:
                    raise ParseError("empty measurement")
            if self.only is None or meas in self.only:
                sid = self.series.add(meas, tags)
        except (ParseError, ValueError):
            sid = -2
        self._heads[head] = sid
        return sid


_UNESC = re.compile(rb'\\(["\\nr])')
_UNESC_TO = {b'"': b'"', b"\\": b"\\", b"n": b"\n", b"r": b"\r"}


_PLACE = str.maketrans({"\x00": "\\", "\x01": ",", "\x02": "=", "\x03": " "})


def _unplace(s: str) -> str:
    return s.translate(_PLACE)


def _unkey(raw: bytes) -> str:
    if b"\\" in raw:
        raw = re.sub(rb"\\([ ,=\\])", rb"\1", raw)
    return raw.decode("utf-8", "replace")


def _unquote(raw: bytes) -> str | None:
    if len(raw) < 2 or raw[0] != _QUOTE or raw[-1] != _QUOTE:
        return None
    body = raw[1:-1]
    if b"\\" in body:  # one pass: "\\\\r" is a backslash and an r, not a carriage return
        body = _UNESC.sub(lambda m: _UNESC_TO[m.group(1)], body)
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
    """64-bit fingerprint of a key token: its length, bytes 0-8 and bytes 8-16 (or the last 8).

    Injective over every field name in the catalogue (a test checks it); two unknown keys of one
    length sharing their first 16 bytes would collide, and unknown keys are never read.
    """
    if not len(start):
        return np.zeros(0, np.uint64)
    words = _words(buf)
    a = words[start] & _LOW[np.clip(n, 0, 8)]
    off = np.minimum(8, np.maximum(n - 8, 0))
    b = words[start + off] & _LOW[np.clip(n - off, 0, 8)]
    with np.errstate(over="ignore"):
        return (a * _MULT[0]) ^ (b * _MULT[1]) ^ (n.astype(np.uint64) << np.uint64(56))


def _to_numbers(buf, start, n, as_int: bool, skip=None):
    """Convert numeric tokens (optional i/u suffix) in bulk; returns (values, ok)."""
    k = len(start)
    dtype = np.int64 if as_int else np.float64
    vals = np.zeros(k, dtype)
    ok = np.zeros(k, bool)
    if not k:
        return vals, ok
    last = buf[np.maximum(start + n - 1, 0)]
    n = n - ((last == ord("i")) | (last == ord("u"))).astype(np.int64)
    cand = (n > 0) & (n <= _VW)
    if skip is not None:
        cand &= ~skip
    lo = 0
    for width in (8, 16, _VW):
        idx = np.flatnonzero(cand & (n > lo) & (n <= width))
        lo = width
        if not len(idx):
            continue
        g = _gather(buf, start[idx], n[idx], width)
        s = g.view(f"S{width}")[:, 0]
        try:
            vals[idx] = s.astype(dtype)
            ok[idx] = True
            continue
        except (ValueError, OverflowError):
            pass
        good = _NUMCHARS[g].all(axis=1)
        for i, x in zip(idx.tolist(), s.tolist(), strict=True):
            try:
                vals[i] = int(x) if as_int else float(x)
                ok[i] = True
            except (ValueError, OverflowError):
                pass
        del good
    if not as_int:
        vals[~ok] = np.nan
    return vals, ok
