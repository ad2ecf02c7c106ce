"""Hold an LMCache server's start until its shared L2 tier (a Redis-protocol server) answers, authenticated.

Why: LMCache 0.5.6's native Redis client opens one connection per worker thread, once, when the server starts
(csrc/storage_backends/connector_base.h:539-542 of the 0.5.6 sdist: `create_connection()` before the worker loop;
redis/connector.cpp:231-236 connects and authenticates there). If that fails (nothing listens yet, or Redis refuses
the password), the worker thread ends (connector_base.h:596-598, "[LMCache Connector Worker Error] connection failed")
and nothing serves its queue again: the server's L2 lookups never complete, and every request through the cache path
waits out the connector's `mq_timeout`. Measured here on the chart's CPU pod with Redis down at the sidecar's start:
the engine's warm-up request timed out and the pod never became Ready, although Redis was back 15 s later. A worker
whose connection breaks later is never reconnected either (the loop keeps its dead socket), but its requests fail
at once rather than hang: the pod serves on from L1 (tests/pod/test_l2_tier.py).

So the sidecar's supervisor (`glm53 supervise --wait-for-resp HOST:PORT`) sends the same AUTH (from the same
LMCACHE_RESP_USERNAME / LMCACHE_RESP_PASSWORD the server reads, resp_l2_adapter.py:151-154) and a PING first, and
starts the server only on PONG. A refused password ends supervision with one line: a wrong Secret does not fix
itself, and the kubelet's restart back-off and the pod's events say so. Meanwhile the sidecar's startup probe fails,
so the engine waits, as it would for a server that is still starting.
"""

from __future__ import annotations

import socket
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from glm53.errors import EXIT_FAILURE, Glm53Error

POLL_S = 1.0
# How often a wait that goes on says so again.
REPEAT_S = 10.0
CONNECT_TIMEOUT_S = 2.0


@dataclass(frozen=True)
class RespEndpoint:
    """Where the shared tier's Redis listens (lmcache.l2.resp.host and port)."""

    host: str
    port: int

    def __str__(self) -> str:
        return f"{self.host}:{self.port}"


def encode(*parts: str) -> bytes:
    """One command in RESP (the Redis serialization protocol): an array of bulk strings."""
    body = b"".join(b"$%d\r\n%s\r\n" % (len(p.encode()), p.encode()) for p in parts)
    return b"*%d\r\n" % len(parts) + body


Command = tuple[str, ...]


def handshake(env: Mapping[str, str]) -> list[Command]:
    """AUTH as LMCache's client sends it (with a user when one is set), then PING; PING alone without a password."""
    password = env.get("LMCACHE_RESP_PASSWORD", "")
    username = env.get("LMCACHE_RESP_USERNAME", "")
    auth: list[Command] = [("AUTH", *([username] if username else []), password)] if password else []
    return [*auth, ("PING",)]


def verdict(replies: bytes) -> str | None:
    """What the replies to `handshake` say: None once PING answered PONG; else Redis's error line (a refused
    password, or auth required but none given)."""
    lines = [line for line in replies.split(b"\r\n") if line]
    if lines and lines[-1] == b"+PONG":
        return None
    errors = [line.decode(errors="replace") for line in lines if line.startswith(b"-")]
    return errors[0][1:] if errors else f"unexpected reply {replies[:80]!r}"


def exchange(endpoint: RespEndpoint, commands: Sequence[Command], timeout_s: float = CONNECT_TIMEOUT_S) -> bytes:
    """`commands` on one connection, each answered by a one-line reply (status, error or integer), the replies
    together; fewer when the server closes the connection first."""
    with socket.create_connection((endpoint.host, endpoint.port), timeout=timeout_s) as sock:
        sock.sendall(b"".join(encode(*command) for command in commands))
        reply = b""
        while reply.count(b"\r\n") < len(commands):
            chunk = sock.recv(4096)
            if not chunk:
                break
            reply += chunk
        return reply


def wait_for_tier(endpoint: RespEndpoint, env: Mapping[str, str], say: Callable[[str], None]) -> None:
    """Return once `endpoint` answers PONG to the server's own credentials; say every REPEAT_S why it is waiting;
    a Glm53Error when Redis refuses them."""
    commands = handshake(env)
    said_at = -REPEAT_S
    while True:
        try:
            problem = verdict(exchange(endpoint, commands))
        except OSError as error:
            problem = f"unreachable: {error.strerror or error}"
        else:
            if problem is None:
                say(f"glm53 supervise: the L2 tier at {endpoint} answers; starting the server")
                return
            if "NOAUTH" in problem or "WRONGPASS" in problem or "invalid" in problem.lower():
                raise Glm53Error(
                    f"the L2 tier at {endpoint} refuses the server's credentials ({problem}); check the Secret in "
                    "lmcache.l2.resp.auth and the password (or ACL user) configured on Redis",
                    EXIT_FAILURE,
                )
        if time.monotonic() - said_at >= REPEAT_S:
            say(
                f"glm53 supervise: waiting for the L2 tier at {endpoint} ({problem}) before the server starts: "
                "LMCache 0.5.6's Redis client connects only once, at start"
            )
            said_at = time.monotonic()
        time.sleep(POLL_S)
