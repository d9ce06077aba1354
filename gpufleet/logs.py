"""Log and console lines stay one line each, whatever the data in them says.

Host tags, sensor names, server answers and exception texts come from outside; printed raw, a
carriage return, an ANSI escape or a newline in one of them could forge a line (``evil\\x1b[2J\\r
RESOLVED all clear``) or hide one. :func:`escape` is the one function that makes such text safe
to print; the logging :class:`Formatter` (installed by :func:`setup`) and the console alert sink
use it, and so does any other line written to a terminal or a journal.
"""

from __future__ import annotations

import logging
import re
import sys

# C0 and C1 controls, DEL, the Unicode line and paragraph separators, and the bidirectional
# overrides and isolates (which reorder what a terminal shows)
_UNSAFE = re.compile("[\x00-\x1f\x7f-\x9f\u2028\u2029\u202a-\u202e\u2066-\u2069]")
_NAMED = {"\n": "\\n", "\r": "\\r", "\t": "\\t"}


def _one(m: re.Match) -> str:
    ch = m.group()
    if ch in _NAMED:
        return _NAMED[ch]
    code = ord(ch)
    return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}"


def escape(text: str) -> str:
    """``text`` with every control character written as an escape (``\\x1b``, ``\\r``, ``\\n``,
    ``\\u2028``): printable text is unchanged, and the result is one line."""
    text = str(text)
    return _UNSAFE.sub(_one, text) if _UNSAFE.search(text) else text


class Formatter(logging.Formatter):
    """A logging formatter whose line (message and arguments) is escaped; a traceback appended
    after it keeps its own lines."""

    def formatMessage(self, record: logging.LogRecord) -> str:  # noqa: N802 - the base class's name
        return escape(super().formatMessage(record))


class _Stderr(logging.StreamHandler):
    """Writes to whatever ``sys.stderr`` is at the time (a test's capture, a redirected stream)."""

    @property
    def stream(self):
        return sys.stderr

    @stream.setter
    def stream(self, _value) -> None:
        pass


_HANDLER: logging.Handler | None = None


def setup(fmt: str = "%(message)s", level: str | int | None = None, stream=None) -> logging.Handler:
    """Log to ``stream`` (standard error) through :class:`Formatter`: one handler on the root
    logger, replaced (not added to) when called again. ``level`` applies to the ``gpufleet``
    loggers; the root stays at WARNING for other libraries."""
    global _HANDLER
    root = logging.getLogger()
    if _HANDLER is not None:
        root.removeHandler(_HANDLER)
    _HANDLER = logging.StreamHandler(stream) if stream is not None else _Stderr()
    _HANDLER.setFormatter(Formatter(fmt))
    root.addHandler(_HANDLER)
    if level is not None:
        logging.getLogger("gpufleet").setLevel(level.upper() if isinstance(level, str) else level)
    return _HANDLER
