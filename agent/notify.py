"""systemd's notify protocol, spoken directly: one datagram per message to ``$NOTIFY_SOCKET``.

``READY=1`` after the first successful poll, ``WATCHDOG=1`` after every completed tick (a hung
loop stops the pings and systemd restarts the unit), ``STATUS=`` a one-line summary,
``STOPPING=1`` on the way out. Without ``$NOTIFY_SOCKET`` every call is a no-op.
"""

from __future__ import annotations

import logging
import os
import socket
import time

log = logging.getLogger("gpufleet.agent.notify")


class Notifier:
    def __init__(self, address: str | None = None):
        addr = address if address is not None else os.environ.get("NOTIFY_SOCKET", "")
        self.address = None
        self.sock = None
        if addr:
            if addr.startswith("@"):
                addr = "\0" + addr[1:]  # abstract namespace
            self.address = addr
            # never blocking: a manager that stops reading costs dropped notifications (logged at
            # debug), never a poll loop stuck in sendto
            kind = socket.SOCK_DGRAM | socket.SOCK_CLOEXEC | socket.SOCK_NONBLOCK
            self.sock = socket.socket(socket.AF_UNIX, kind)
        usec = os.environ.get("WATCHDOG_USEC", "")
        pid = os.environ.get("WATCHDOG_PID", "")
        self.watchdog_s = int(usec) / 1e6 if usec.isdigit() and (not pid or pid == str(os.getpid())) else None

    @property
    def enabled(self) -> bool:
        return self.sock is not None

    def send(self, *msgs: str) -> bool:
        if self.sock is None:
            return False
        data = "\n".join(m.replace("\n", " ") for m in msgs).encode("utf-8", "replace")
        try:
            self.sock.sendto(data, self.address)
            return True
        except OSError as exc:
            log.debug("sd_notify failed: %s", exc)
            return False

    def ready(self, status: str = "") -> bool:
        return self.send("READY=1", *([f"STATUS={status}"] if status else []))

    def watchdog(self) -> bool:
        return self.send("WATCHDOG=1")

    def status(self, text: str) -> bool:
        return self.send(f"STATUS={text}")

    def reloading(self) -> bool:
        """``RELOADING=1`` with ``MONOTONIC_USEC`` (CLOCK_MONOTONIC, µs): systemd matches the
        reload to the request by it; a ``READY=1`` must follow when the reload is done."""
        usec = time.clock_gettime_ns(time.CLOCK_MONOTONIC) // 1000
        return self.send("RELOADING=1", f"MONOTONIC_USEC={usec}")

    def stopping(self, status: str = "") -> bool:
        return self.send("STOPPING=1", *([f"STATUS={status}"] if status else []))

    def close(self) -> None:
        if self.sock is not None:
            self.sock.close()
            self.sock = None
