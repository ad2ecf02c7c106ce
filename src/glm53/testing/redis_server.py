"""A real Redis server on loopback for the shared L2 tier's tests and the routing benchmark (Debian's redis-server
7.0.15, installed by scripts/setup.d/34-redis.sh onto the repository's .tools/bin), with a password as the chart's
default `lmcache.l2.resp.auth` wants, nothing persisted, and the eviction docs/operations.md recommends for a shared
tier (`maxmemory` with `allkeys-lru`)."""

from __future__ import annotations

import contextlib
import os
import secrets
import shutil
import signal
import socket
import subprocess
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from glm53.errors import Glm53Error
from glm53.l2gate import Command, RespEndpoint, encode, exchange, verdict
from glm53.pod.loopback import free_ports

# The repository's tool folder, searched after PATH (this file is src/glm53/testing/redis_server.py).
TOOLS_BIN = Path(__file__).resolve().parents[3] / ".tools" / "bin"
SECRET = "glm53-l2-redis"
PASSWORD_KEY = "password"
START_DEADLINE_S = 20.0
# The bound and eviction policy docs/operations.md recommends for a shared tier, unless a test asks for others.
MAXMEMORY = "512mb"
POLICY = "allkeys-lru"


@dataclass
class RedisServer:
    """One redis-server process: where it listens and the password it wants."""

    port: int
    password: str
    workdir: Path
    program: str
    # Its memory bound and what it does there.
    maxmemory: str = MAXMEMORY
    policy: str = POLICY
    process: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        """Start it (again, after `kill`) on the same port, and wait until it answers."""
        log = (self.workdir / "redis.log").open("ab")
        command = [
            self.program,
            *("--bind", "127.0.0.1", "--port", str(self.port), "--requirepass", self.password),
            *("--save", "", "--appendonly", "no", "--dir", str(self.workdir)),
            *("--maxmemory", self.maxmemory, "--maxmemory-policy", self.policy),
        ]
        self.process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        deadline = time.monotonic() + START_DEADLINE_S
        while not self.answers():
            if self.process.poll() is not None or time.monotonic() > deadline:
                raise Glm53Error(f"redis-server did not start on port {self.port}; see {self.workdir}/redis.log")
            time.sleep(0.1)

    def kill(self) -> None:
        """SIGKILL it, as a node losing the Redis pod would."""
        if self.process is not None and self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait()

    def answers(self) -> bool:
        """Whether it answers an authenticated PING, as the sidecar's supervisor asks (glm53.l2gate)."""
        try:
            return verdict(self._commands(("AUTH", self.password), ("PING",))) is None
        except OSError:
            return False

    def flush(self) -> None:
        """Empty it (FLUSHALL), so that a run starts from a cold tier."""
        reply = self._commands(("AUTH", self.password), ("FLUSHALL",))
        if not reply.endswith(b"+OK\r\n+OK\r\n"):
            raise Glm53Error(f"redis-server on port {self.port} refused FLUSHALL: {reply[:80]!r}")

    def key_count(self) -> int:
        """How many keys it holds (DBSIZE)."""
        return int(self._commands(("AUTH", self.password), ("DBSIZE",)).split(b"\r\n")[1].lstrip(b":"))

    def info(self, section: str) -> dict[str, str]:
        """INFO `section`'s fields (`used_memory`, `evicted_keys`, ...): a bulk reply, which the supervisor's one-line
        exchange does not read, so it is read here up to its announced length."""
        with socket.create_connection(("127.0.0.1", self.port), timeout=5) as sock:
            sock.sendall(encode("AUTH", self.password) + encode("INFO", section))
            data = b""
            while True:
                received = sock.recv(65536)
                if not received:
                    raise Glm53Error(f"redis-server on port {self.port} closed the connection during INFO {section}")
                data += received
                _, _, bulk = data.partition(b"\r\n")  # after AUTH's +OK
                header, found, body = bulk.partition(b"\r\n")
                if found and not header.startswith(b"$"):
                    raise Glm53Error(f"redis-server on port {self.port} refused INFO {section}: {bulk[:80]!r}")
                if found and len(body) >= int(header[1:]):
                    text = body[: int(header[1:])].decode()
                    return dict(line.split(":", 1) for line in text.splitlines() if ":" in line)

    def _commands(self, *commands: Command) -> bytes:
        """`commands` on one connection, their one-line replies together."""
        return exchange(RespEndpoint("127.0.0.1", self.port), commands, timeout_s=5)

    def pod_values(self) -> dict[str, Any]:
        """The chart values of a pod whose L2 tier is this server, with auth on from the Secret `SECRET`."""
        resp = {"host": "127.0.0.1", "port": self.port, "auth": {"secretName": SECRET}}
        return {"lmcache": {"l2": {"type": "resp", "resp": resp}}}

    def secrets(self) -> Mapping[tuple[str, str], str]:
        """The Secret the operator created for the pods, as the loopback runner takes it."""
        return {(SECRET, PASSWORD_KEY): self.password}


@contextlib.contextmanager
def redis_server(workdir: Path, maxmemory: str = MAXMEMORY, policy: str = POLICY) -> Iterator[RedisServer]:
    """A fresh Redis on a free loopback port with a random password, bounded at `maxmemory` with `policy`; killed on
    leaving."""
    program = shutil.which("redis-server") or shutil.which("redis-server", path=str(TOOLS_BIN))
    if program is None:
        raise Glm53Error("redis-server not found on PATH or in .tools/bin; run `bash scripts/setup.d/34-redis.sh`")
    workdir.mkdir(parents=True, exist_ok=True)
    server = RedisServer(free_ports(1)[0], secrets.token_hex(16), workdir, program, maxmemory, policy)
    server.start()
    try:
        yield server
    finally:
        server.kill()
