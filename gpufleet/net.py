"""HTTP helpers every sender shares: redaction for logs and the answer classification.

:func:`redact_url` is the one way a URL reaches a log line or a ``repr``: credentials
(``user:pass@``) and secret query values (``token``, ``password``, ``p``, ``u``, ``auth``...) are
masked; with ``keep_path=False`` (webhook URLs, whose path is the secret) the path and query
become ``/***``. :func:`classify` turns an HTTP status and its ``Retry-After`` header into
``ok`` / ``retry`` / ``refused``; :func:`retry_after_seconds` reads the header as delta-seconds
or as an HTTP date. :func:`backoff_delay` is the one retry schedule of every sender and follower
(the agent's InfluxDB sender, the alert sinks, the IPMI poller, the NVML event follower).
"""

from __future__ import annotations

import base64
import email.utils
import json
import random
import re
import time
from urllib.parse import quote, quote_plus, unquote, urlsplit, urlunsplit

INVALID = "<invalid URL>"
RETRY_AFTER_MAX = 3600.0
"""The longest ``Retry-After`` a sender honours (s): a server asking for more is waited on this long."""
_SECRET_QUERY = re.compile(r"(?i)((?:^|&)(?:token|password|p|u|auth)[^=&]*=)[^&]*")


def redact_url(url: str, keep_path: bool = True) -> str:
    """``http://user:secret@h:8086/write?db=x&p=pw`` -> ``http://***@h:8086/write?db=x&p=***``.

    ``keep_path=False``: ``https://hooks.example/services/T/B/x`` -> ``https://hooks.example/***``.
    A URL without a scheme and host (or one that does not parse) is ``<invalid URL>``.
    """
    try:
        p = urlsplit(url)
        p.port  # noqa: B018 - raises ValueError on a bad port
    except (ValueError, TypeError, AttributeError):
        return INVALID
    if not p.scheme or not p.hostname:
        return INVALID
    netloc = p.netloc
    if "@" in netloc:
        netloc = "***@" + netloc.rsplit("@", 1)[1]
    if not keep_path:
        rest = "/***" if (p.path not in ("", "/") or p.query) else ""
        return f"{p.scheme}://{netloc}{rest}"
    return urlunsplit((p.scheme, netloc, p.path, _SECRET_QUERY.sub(r"\1***", p.query), p.fragment))


def url_secrets(url: str) -> list[str]:
    """The credentials a URL carries: its password and the values of secret query parameters."""
    try:
        p = urlsplit(url)
        out = [p.password, unquote(p.password)] if p.password else []  # as written, and as sent
    except (ValueError, TypeError, AttributeError):
        return []
    for m in _SECRET_QUERY.finditer(p.query):
        value = p.query[m.end(1):m.end()]
        if value:
            out.append(value)
    return out


MIN_SECRET = 4  # shorter strings are not redacted (they would mask ordinary words)


def secret_forms(secret: str) -> set[str]:
    """Every spelling of ``secret`` an answer or an exception text may carry back: as it is,
    URL-encoded (``%XX`` and ``+``), JSON-escaped, and base64 (standard and URL-safe, also inside a
    longer encoded string such as ``Basic base64(user:secret)``: for each of the three byte
    alignments, the run of characters that the secret's bytes alone decide), those also URL-encoded.
    """
    if not secret or len(secret) < MIN_SECRET:
        return set()
    forms = {secret, quote(secret, safe=""), quote_plus(secret), json.dumps(secret)[1:-1],
             json.dumps(secret, ensure_ascii=False)[1:-1]}
    raw = secret.encode("utf-8")
    for enc in (base64.b64encode, base64.urlsafe_b64encode):
        for k in range(3):  # the secret starts k bytes into a 3-byte group
            e = enc(b"\0" * k + raw).decode("ascii")
            core = e[-(-8 * k // 6):8 * (k + len(raw)) // 6]  # characters made of the secret's bits only
            if len(core) >= MIN_SECRET:
                forms |= {core, quote(core, safe="")}
    return {f for f in forms if len(f) >= MIN_SECRET}


def redact(text: str, secrets) -> str:
    """``text`` with every form of every secret (:func:`secret_forms`) replaced by ``***``."""
    forms = set()
    for s in secrets:
        if s:
            forms |= secret_forms(s)
    for f in sorted(forms, key=len, reverse=True):
        text = text.replace(f, "***")
    return text


def retry_after_seconds(value: str | None, now: float | None = None) -> float | None:
    """Parse a ``Retry-After`` header: delta-seconds or an HTTP date; None when absent/garbage."""
    if not value:
        return None
    value = value.strip()
    try:
        return max(0.0, float(value))
    except ValueError:
        pass
    try:
        when = email.utils.parsedate_to_datetime(value).timestamp()
    except (TypeError, ValueError, IndexError, OverflowError):
        return None
    return max(0.0, when - (time.time() if now is None else now))


def classify(status: int | None, retry_after: str | None = None,
             now: float | None = None) -> tuple[str, float | None]:
    """``(disposition, retry_after seconds)`` of one HTTP answer.

    ``ok``: 2xx. ``retry``: no answer (``status`` None or 0), 429 or 5xx: the same request may
    succeed later (after ``Retry-After`` when given). ``refused``: any other status: this request
    will not succeed as it is (a sink gives up and logs it; the agent keeps the batch spooled
    until an operator fixes the cause, or sets a malformed one aside).
    """
    if status and 200 <= status < 300:
        return "ok", None
    ra = retry_after_seconds(retry_after, now)
    if not status or status == 429 or status >= 500:
        return "retry", ra
    return "refused", ra


def backoff_delay(attempt: int, base: float, cap: float, jitter: bool = True) -> float:
    """Seconds to wait after failed attempt number ``attempt`` (1, 2, ...): exponential backoff.

    ``base`` after the first failure, doubling per failure up to ``cap``. With ``jitter`` the
    delay is drawn uniformly from its upper half, ``[d/2, d]`` ("equal jitter"), so senders that
    failed together do not retry together and the delay never drops below half the schedule.
    """
    d = min(cap, base * 2.0 ** min(max(attempt, 1) - 1, 60))
    if jitter:
        d = d / 2 + random.uniform(0, d / 2)
    return d
