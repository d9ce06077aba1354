"""A local HTTP receiver for alerting tests: records every request, answers as told, can go down.

Not a mock of any service: the payload rules each test checks are written in the tests, from
the services' published documentation. Stopping it closes the port (connection refused), and
``start()`` listens on the same port again.
"""

from __future__ import annotations

import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from tests.servers import free_port


class Receiver:
    def __init__(self, respond=None, port: int | None = None):
        self.port = port or free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.requests: list[dict] = []
        self.respond = respond or (lambda req: (200, {}, b"ok"))
        self.cond = threading.Condition()
        self.server: ThreadingHTTPServer | None = None

    def start(self) -> Receiver:
        outer = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def do_POST(self):
                n = int(self.headers.get("Content-Length") or 0)
                body = self.rfile.read(n)
                try:
                    doc = json.loads(body)
                except ValueError:
                    doc = None
                req = {"t": time.monotonic(), "wall": time.time(), "path": self.path,
                       "headers": {k.lower(): v for k, v in self.headers.items()}, "body": body, "json": doc}
                status, headers, out = outer.respond(req)
                req["status"] = status
                with outer.cond:
                    outer.requests.append(req)
                    outer.cond.notify_all()
                try:
                    self.send_response(status)
                    for k, v in headers.items():
                        self.send_header(k, v)
                    self.send_header("Content-Length", str(len(out)))
                    self.end_headers()
                    self.wfile.write(out)
                except OSError:
                    pass  # the client gave up (timeout): fine

            def log_message(self, *args):
                pass

        ThreadingHTTPServer.allow_reuse_address = True
        self.server = ThreadingHTTPServer(("127.0.0.1", self.port), Handler)
        self.server.daemon_threads = True
        threading.Thread(target=self.server.serve_forever, kwargs={"poll_interval": 0.05},
                         daemon=True).start()
        return self

    def stop(self) -> None:
        if self.server is not None:
            self.server.shutdown()
            self.server.server_close()
            self.server = None

    def wait_for(self, n: int, timeout: float = 10.0, pred=None) -> list[dict]:
        """Wait until ``n`` requests (matching ``pred``) arrived; returns them."""
        deadline = time.monotonic() + timeout
        with self.cond:
            while True:
                got = [r for r in self.requests if pred is None or pred(r)]
                left = deadline - time.monotonic()
                if len(got) >= n or left <= 0:
                    return got
                self.cond.wait(left)

    def __enter__(self):
        return self.start()

    def __exit__(self, *exc):
        self.stop()


T0 = 1_795_000_000.0  # 2026-11-18T...Z: a fixed incident time


def incident(kind="thermal_throttle", host="node01", gpu=3, link=None, start=T0, end=None,
             severity="critical", id=None, **kw):
    from gpufleet.records import Record

    return Record(kind=kind, host=host, gpu=gpu, link=link, start=start, end=end, severity=severity,
                  id=id, cluster=kw.pop("cluster", "c1"), rack=kw.pop("rack", "r07"), **kw)


def fast(sink: dict, **kw) -> dict:
    """A sink table with test-sized delivery settings."""
    d = {"timeout": 1.0, "backoff": 0.05, "backoff_max": 0.2, "rate_limit": 0}
    d.update(sink)
    d.update(kw)
    return d
