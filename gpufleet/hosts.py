"""A host is one plain node name: the one check every part of gpufleet uses.

The ``host`` tag is written by the node itself, so it is untrusted: a scheduler reads
``gpu[001-100]`` as a hundred nodes, ``n1,n2`` as two, ``ALL`` as every node, ``-n`` as an
option, and ``node1 State=RESUME`` as more words. A plain name is letters, digits, ``.``,
``_`` and ``-``, starts with a letter or digit, is at most :data:`MAX_LEN` characters, and is
not a scheduler keyword (``ALL`` in any case). Everything else is refused by the agent
(``--host``/``agent.host``), quarantined at the analyzer's ingest (:func:`display_name`) and
refused again by the action sink before it runs anything.
"""

from __future__ import annotations

import hashlib
import re

MAX_LEN = 253  # the longest DNS name
KEYWORDS = frozenset({"all"})  # scontrol NodeName=ALL (any case) is every node
_PLAIN = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*\Z")
UNSAFE_PREFIX = "unsafe:"  # ':' is no plain-name character: a display name can never pass check()


def problem(name) -> str | None:
    """Why ``name`` is not a plain node name (None: it is one)."""
    if not isinstance(name, str) or not name:
        return "empty"
    if len(name) > MAX_LEN:
        return f"longer than {MAX_LEN} characters"
    if name.startswith("-"):
        return "starts with '-' (reads as an option)"
    if not _PLAIN.match(name):
        bad = next((c for c in name if not (c.isascii() and (c.isalnum() or c in "._-"))), name[0])
        return f"contains {ascii(bad)} (only letters, digits, '.', '_' and '-'; first a letter or digit)"
    if name.lower() in KEYWORDS:
        return f"{name!r} is a scheduler keyword (every node)"
    return None


def is_plain(name) -> bool:
    return problem(name) is None


def display_name(raw: str) -> str:
    """The name an unsafe host's rows are analysed under: readable, bounded, unique per raw
    value, and never a plain name (it starts with ``unsafe:``)."""
    digest = hashlib.sha256(raw.encode("utf-8", "surrogatepass")).hexdigest()[:10]
    text = "".join(c if c.isascii() and (c.isalnum() or c in "._-") else "_" for c in raw[:32])
    return f"{UNSAFE_PREFIX}{text}~{digest}"


def safe(name: str) -> str:
    """``name`` if it is plain, else its display name."""
    return name if is_plain(name) else display_name(name)


def shown(text, limit: int = 80) -> str:
    """An untrusted value for a log line: escaped (no control characters, no newlines), bounded."""
    s = ascii(str(text))[1:-1] if not isinstance(text, str) or not text.isprintable() else text
    return s if len(s) <= limit else s[:limit] + f"...({len(str(text))} chars)"
