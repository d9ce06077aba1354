"""Secrets stay out of every log line and status in every encoding: a real HTTP server that
echoes the request (its Authorization header, its URL) back in an error answer gets nothing of
the secret logged, neither as it is, nor base64 (basic auth), nor URL-encoded."""

from __future__ import annotations

import base64
import json
import logging
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import quote, quote_plus

import pytest

from gpufleet.net import redact, secret_forms

SECRET = "pa55/w+rd=Zq9"  # base64-unfriendly characters on purpose


def leaks(text: str, secret: str = SECRET) -> list[str]:
    """The forms of ``secret`` found in ``text``: plain, URL-encoded, base64 of ``secret`` and of
    ``user:secret`` for user names of every length modulo 3."""
    found = []
    encoded = [secret, quote(secret, safe=""), quote_plus(secret), base64.b64encode(secret.encode()).decode()]
    for user in ("a", "ab", "abc", "alice"):
        encoded.append(base64.b64encode(f"{user}:{secret}".encode()).decode())
    for e in encoded:
        if e in text:
            found.append(e)
    return found


class Echo(BaseHTTPRequestHandler):
    """Answers 500 (or ``status``) with the request line and every header, as a broken proxy does."""

    status = 500

    def do_POST(self):  # noqa: N802 - the base class's name
        self.rfile.read(int(self.headers.get("Content-Length", "0") or 0))
        body = json.dumps({"authorization": self.headers.get("Authorization"),  # first: within any cut
                           "error": f"cannot handle {self.command} {self.path}",
                           "headers": dict(self.headers)}).encode()
        self.send_response(self.status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    do_GET = do_POST  # noqa: N815 - the base class's naming

    def log_message(self, *args):
        pass


@pytest.fixture
def echo():
    srv = ThreadingHTTPServer(("127.0.0.1", 0), Echo)
    t = threading.Thread(target=srv.serve_forever, daemon=True)
    t.start()
    yield f"127.0.0.1:{srv.server_address[1]}"
    srv.shutdown()
    srv.server_close()


def test_every_encoding_of_a_secret_is_redacted():
    text = " | ".join([SECRET, quote(SECRET, safe=""), quote_plus(SECRET), json.dumps(SECRET),
                       *(base64.b64encode(f"{u}:{SECRET}".encode()).decode() for u in ("a", "ab", "abc")),
                       base64.urlsafe_b64encode(SECRET.encode()).decode(),
                       quote(base64.b64encode(b"x:" + SECRET.encode()).decode(), safe="")])
    out = redact(text, [SECRET])
    assert not leaks(out) and "***" in out
    assert redact("plain words stay", [SECRET, "", None]) == "plain words stay"
    assert secret_forms("abc") == set()  # too short to redact without masking ordinary words


def test_the_agents_influx_sender_logs_no_echoed_credentials(tmp_path, echo, caplog):
    """v1 with basic auth and a v2 token against a server that echoes the Authorization header in
    its 500 (and a 400): the warning lines and the status line carry no form of the secret."""
    from gpufleet.agent.pipeline.influx import InfluxSender
    from gpufleet.agent.spool import Spool

    caplog.set_level(logging.DEBUG, logger="gpufleet")
    spool = Spool(tmp_path / "spool")
    spool.append(["m v=1i 1"])
    base = {"db": "x", "rp": "", "precision": "ns", "gzip": False, "timeout": 5.0, "batch_lines": 100,
            "backoff_min": 0.1, "backoff_max": 1.0, "org": "o", "bucket": "b"}
    for api, user in (("v1", "alice"), ("v1", "ab"), ("v2", "")):
        sender = InfluxSender(spool, {**base, "api": api, "username": user, "url": f"http://{echo}"}, SECRET)
        try:
            assert sender.step() != "sent"
        finally:
            sender.client.close()
        assert sender.last_error.startswith("HTTP 500") and "headers" in sender.last_error
        assert not leaks(sender.last_error), (api, sender.last_error)
    text = caplog.text
    assert "HTTP 500" in text and not leaks(text), text


def test_a_sink_logs_no_echoed_credentials(echo):
    """A webhook URL with credentials and a secret path, against an echoing server: the failed
    delivery's detail (what the notifier logs) holds none of them in any encoding."""
    from gpufleet.analyzer.alerting.webhook import WebhookSink

    from tests.alerting_receiver import incident

    url = f"http://alice:{quote(SECRET, safe='')}@{echo}/hooks/T0KEN-path-42"  # sent as basic auth
    sink = WebhookSink("w", url, secret="hmac-K3Y-value")
    try:
        from gpufleet.analyzer.alerting.base import Alert

        inc = incident(kind="sdc", id="c1", summary="x")
        alert = Alert(key="k", status="firing", kind=inc.kind, severity="critical", start=inc.start,
                      host=inc.host)
        out = sink.deliver(alert)
    finally:
        sink.close()
    assert out.status == "retry" and "HTTP 500" in out.detail and "headers" in out.detail
    assert not leaks(out.detail) and "T0KEN-path-42" not in out.detail, out.detail


def test_the_analyzers_influxdb_client_reports_no_echoed_credentials(echo):
    """The pull path's client (basic auth or a token) against a server that echoes the request in
    a 500: the error line the analyzer prints holds no form of the secret."""
    from gpufleet.analyzer.sources import Influx

    from gpufleet.errors import GpufleetError

    for kw in ({"username": "alice", "password": SECRET}, {"token": SECRET}):
        influx = Influx(f"http://{echo}", "fleet", **kw)
        for call, args in ((influx.check, ()), (influx.write, (["m v=1i 1"],))):
            with pytest.raises(GpufleetError) as err:
                call(*args)
            assert "HTTP 500" in str(err.value) and not leaks(str(err.value)), str(err.value)
