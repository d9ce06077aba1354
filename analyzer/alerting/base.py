"""The sink interface, the alert a sink renders, and HTTP delivery shared by every sink.

A sink turns one :class:`Alert` (a group of incidents, firing or resolved) into one request
and says what happened with it: :class:`Outcome` ``sent``, ``retry`` (timeout, connection
error, 5xx, 429: try again later, honouring ``Retry-After``) or ``failed`` (any other 4xx:
give up and log the response). Sinks register by name in :data:`REGISTRY`.

A sink declares its facts on its class, and the ``[[sink]]`` table's validation, its secret
handling, the ``--sink TYPE=URL`` shortcut and the docs' key tables derive them
(:mod:`gpufleet.analyzer.alerting.config`, ``python -m gpufleet.regen``): ``options`` (its own keys,
:class:`gpufleet.options.Option`; a ``secret`` one comes only from ``KEY_file`` / ``KEY_env``, its
``env`` is the variable ``--sink`` reads it from), ``needs_url`` and ``default_url``, and
``delivery_defaults`` (where its retry and rate-limit defaults differ from :class:`Delivery`'s).
"""

from __future__ import annotations

import json
import logging
from dataclasses import asdict, dataclass, field
from typing import ClassVar
from urllib.parse import urlsplit

from gpufleet import net
from gpufleet.net import classify
from gpufleet.options import Option

log = logging.getLogger("gpufleet.alerting")

REGISTRY: dict[str, type[Sink]] = {}


def register(cls: type[Sink]) -> type[Sink]:
    REGISTRY[cls.type] = cls
    return cls


@dataclass
class Alert:
    """What one notification says: one incident group, firing or resolved.

    ``gpu``/``link`` are the opening incident's (stable labels); ``gpus``/``links`` list every
    member of the group. Times are seconds since the epoch. ``title`` (what is wrong, in plain
    words), ``impact``, ``action`` (what to do) and ``runbook_url`` come from the action catalogue
    (:mod:`gpufleet.analyzer.alerting.actions`) and lead every rendering; ``jobs`` are the job ids on the
    affected GPUs; ``summary`` is the title, ``description`` the detector's technical line.
    """

    key: str
    status: str  # "firing" | "resolved"
    kind: str
    severity: str
    start: float
    end: float | None = None
    host: str | None = None
    gpu: int | None = None
    link: int | None = None
    gpus: list[int] = field(default_factory=list)
    links: list[int] = field(default_factory=list)
    cluster: str | None = None
    rack: str | None = None
    summary: str = ""
    description: str = ""
    page_url: str | None = None
    incidents: list[str] = field(default_factory=list)
    evidence: dict = field(default_factory=dict)
    title: str = ""
    impact: str = ""
    action: str = ""
    runbook_url: str | None = None
    jobs: list[str] = field(default_factory=list)

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict) -> Alert:
        known = set(cls.__dataclass_fields__)
        return cls(**{k: v for k, v in d.items() if k in known})


@dataclass
class Outcome:
    status: str  # "sent" | "retry" | "failed"
    detail: str = ""
    retry_after: float | None = None
    code: int | None = None
    record: dict | None = None  # what an action sink did, kept in the notifier's state


def redact_url(url: str) -> str:
    """Scheme and host only: paths and queries of webhook URLs carry tokens."""
    return net.redact_url(url, keep_path=False)


@dataclass
class Delivery:
    """Retry, timeout and rate-limit settings of one sink (seconds; rate in notifications/minute)."""

    timeout: float = 5.0
    backoff: float = 1.0
    backoff_max: float = 60.0
    give_up_after: float = 86400.0
    rate_limit: float | None = 60.0
    burst: int = 10


# the keys every sink takes, beyond type and name (Delivery's fields, and the URL)
DELIVERY_OPTIONS = (
    Option("timeout", "duration", 5.0, "seconds per attempt", 0.0, lo_open=True),
    Option("backoff", "duration", 1.0, "first retry delay; doubles per attempt, jittered to 50-100 %"),
    Option("backoff_max", "duration", 60.0, "the retry delay's cap"),
    Option("give_up_after", "duration", 86400.0, "an undeliverable notification is dropped (logged) "
           "after this"),
    Option("rate_limit", "float", 60.0, "notifications per minute (token bucket); 0 = unlimited; excess "
           "waits, never dropped", 0.0, none_ok=True),
    Option("burst", "int", 10, "the token bucket's size", 0),
)
URL_OPTIONS = (
    Option("url", "str", "", "http:// or https:// with a host"),
    Option("url", "secret", help="the URL from a file or the environment, where it is itself the "
           "credential (a Slack webhook)"),
)


class Sink:
    """One alert destination. Subclasses set ``type`` and implement :meth:`render`.

    ``render(alert)`` is pure: it returns the JSON document to POST. ``deliver`` sends it and
    classifies the answer. ``repost_interval`` (seconds) asks the notifier to re-send active
    alerts on that period through :meth:`repost` (Alertmanager expires alerts it stops hearing
    about). ``acts``: it acts on the fleet (runs a command) instead of telling people: the pages
    the sinks raise themselves (a refused action) go to every sink but these, the others keep
    delivering while one still runs, and closing waits for its running command. ``url_is_address``:
    its URL's path and query name a place, not a credential (Alertmanager), so they may be logged;
    otherwise (a Slack or PagerDuty-style webhook) they are secrets, redacted wherever they appear.
    """

    type: ClassVar[str] = ""
    options: ClassVar[tuple[Option, ...]] = ()  # its own [[sink]] keys (beyond DELIVERY_OPTIONS, url)
    needs_url: ClassVar[bool] = True  # a [[sink]] table without url (nor default_url) is an error
    default_url: ClassVar[str] = ""
    delivery_defaults: ClassVar[dict[str, object]] = {}  # Delivery fields whose default differs
    acts: ClassVar[bool] = False
    url_is_address: ClassVar[bool] = False
    repost_interval: float | None = None

    @classmethod
    def table_options(cls) -> tuple[Option, ...]:
        """Every key of this type's ``[[sink]]`` table but ``type`` and ``name``, defaults filled in."""
        from dataclasses import replace

        own = {o.name for o in cls.options}
        delivery = tuple(replace(o, default=cls.delivery_defaults.get(o.name, o.default))
                         for o in DELIVERY_OPTIONS if o.name not in own)
        url = tuple(replace(o, default=cls.default_url) if o.kind == "str" else o for o in URL_OPTIONS)
        return (*url, *delivery, *cls.options)

    @classmethod
    def configure(cls, label: str, kwargs: dict) -> dict:
        """The constructor's keywords from the validated table's own options (``kwargs``): the place
        for what one key's type and range cannot say. ``label`` names the sink in errors."""
        return kwargs

    def __init__(self, name: str, url: str, delivery: Delivery | None = None, **options):
        self.name = name
        self.url = url
        self.delivery = delivery or Delivery()
        self.options = options
        self._session = None

    # -- to override -------------------------------------------------------------------
    def render(self, alert: Alert) -> dict | list:
        raise NotImplementedError

    def headers(self, body: bytes) -> dict[str, str]:
        return {}

    def target_url(self) -> str:
        return self.url

    def secrets(self) -> list[str]:
        """Strings that must never be logged (keys, tokens, secret URL paths)."""
        out: list[str] = []
        if self.url_is_address:
            return out
        parts = urlsplit(self.url)
        if parts.path not in ("", "/"):
            out.append(parts.path)
        if parts.query:
            out.append(parts.query)
        return out

    def repost(self, alerts: list[Alert]) -> Outcome:
        return Outcome("sent")

    def bind(self, notifier) -> None:
        """Called once by the notifier that owns this sink (the action sink reads its state)."""

    # -- shared ------------------------------------------------------------------------
    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.name} {redact_url(self.url)}>"

    def redact(self, text: str) -> str:
        """``text`` without the sink's secrets, nor its URL's credentials (whatever secrets() says),
        in any encoding (:func:`gpufleet.net.redact`: base64 in an echoed header, URL-encoded...)."""
        return net.redact(text, [*self.secrets(), *net.url_secrets(self.url or "")])

    def deliver(self, alert: Alert) -> Outcome:
        return self.post(self.render(alert))

    def post(self, doc) -> Outcome:
        import requests

        if self._session is None:
            self._session = requests.Session()
        body = json.dumps(doc, separators=(",", ":"), ensure_ascii=False).encode()
        headers = {"Content-Type": "application/json", "User-Agent": "gpufleet-alerting"}
        headers.update(self.headers(body))
        try:
            r = self._session.post(self.target_url(), data=body, headers=headers,
                                   timeout=self.delivery.timeout)
        except requests.Timeout:
            return Outcome("retry", f"timeout after {self.delivery.timeout:g} s")
        except requests.RequestException as exc:
            return Outcome("retry", self.redact(f"{type(exc).__name__}: {exc}"))
        text = self.redact(r.text[:4096])[:500]  # redacted whole, then cut
        disposition, ra = classify(r.status_code, r.headers.get("Retry-After"))
        if disposition == "ok":
            return Outcome("sent", code=r.status_code)
        if disposition == "retry":
            return Outcome("retry", f"HTTP {r.status_code}: {text}", ra, r.status_code)
        return Outcome("failed", f"HTTP {r.status_code}: {text}", code=r.status_code)

    def close(self) -> None:
        if self._session is not None:
            self._session.close()
            self._session = None
