"""The mock connector's side of the LMCache protocol: one REQ socket, a timeout on every request, health tracking.

A REQ socket that missed its reply is stuck, so after a timeout it is closed and a fresh one dialled. Like the real
adapter, an unreachable server during serving does not fail requests: the connector is marked unhealthy, lookups
count as misses, and it tries again after `retry_seconds` (the real adapter's heartbeat interval).
"""

from __future__ import annotations

import threading
import time
from typing import Any

import zmq

from glm53.mock import protocol

POLL_MS = 50


class LMCacheUnavailable(Exception):
    """No reply within the timeout."""


class LMCacheRefused(Exception):
    """The server answered with an error; the message is its text."""


class LMCacheClient:
    def __init__(self, url: str, timeout: float, retry_seconds: float) -> None:
        self.url = url
        self.timeout = timeout
        self.retry_seconds = retry_seconds
        self._context: zmq.Context[zmq.Socket[bytes]] = zmq.Context()
        self._socket = self._dial()
        self._lock = threading.Lock()
        self._unhealthy_since: float | None = None

    def _dial(self) -> zmq.Socket[bytes]:
        socket = self._context.socket(zmq.REQ)
        socket.setsockopt(zmq.LINGER, 0)
        socket.connect(self.url)
        return socket

    def request(
        self, message: dict[str, Any], timeout: float | None = None, stop: threading.Event | None = None
    ) -> dict[str, Any]:
        """The server's reply to `message`; raises LMCacheUnavailable on timeout (or once `stop` is set while
        waiting), LMCacheRefused on an error reply."""
        deadline = time.monotonic() + (self.timeout if timeout is None else timeout)
        with self._lock:
            self._socket.send(protocol.encode(message))
            while not self._socket.poll(POLL_MS, zmq.POLLIN):
                if time.monotonic() < deadline and not (stop is not None and stop.is_set()):
                    continue
                self._socket.close()
                self._socket = self._dial()
                self._unhealthy_since = time.monotonic()
                raise LMCacheUnavailable(self.url)
            reply = protocol.decode(self._socket.recv())
            self._unhealthy_since = None
        if not reply.get("ok"):
            raise LMCacheRefused(str(reply.get("error")))
        return reply

    @property
    def healthy(self) -> bool:
        """False for `retry_seconds` after a timeout, so a dead server costs one timeout, not one per request."""
        since = self._unhealthy_since
        return since is None or time.monotonic() - since >= self.retry_seconds

    def close(self) -> None:
        self._socket.close()
        self._context.term()
