"""`glm53 mock lmcache`: a CPU stand-in for `lmcache server` in multiprocess mode.

It answers the connector on a ZMQ REP socket (see glm53.mock.protocol), keeps chunk-aligned prefixes in an L1 budget
(glm53.mock.store), behaves like the released 0.5.6 or the negotiating generation at registration
(glm53.mock.handshake), serves `GET /healthcheck` on its HTTP frontend and Prometheus metrics on loopback
(glm53.mock.lmcache_metrics). Like the real one it has no `/run_script` endpoint enabled: the admin API has no
authentication, so the mock never offers code execution at all.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from typing import Any

import zmq
from prometheus_client import start_http_server

from glm53.errors import Glm53Error
from glm53.mock import protocol
from glm53.mock.handshake import handshake
from glm53.mock.lmcache_metrics import LMCacheMetrics
from glm53.mock.loglines import lmcache_log
from glm53.mock.runtime import JsonHandler, bind_error, bind_http, serve_in_background, stop_on_signals
from glm53.mock.store import ChunkStore

GIB = 1024**3
POLL_MS = 100


@dataclass(frozen=True)
class LMCacheConfig:
    host: str
    port: int
    chunk_size: int
    separate_object_groups: bool
    l1_size_gb: float
    eviction_policy: str
    http_host: str
    http_port: int
    prometheus_port: int
    generation: str


class LMCacheServer:
    """The request handling, independent of sockets: one message in, one reply out."""

    def __init__(self, config: LMCacheConfig) -> None:
        self.config = config
        self.chunk_size = config.chunk_size
        self.store = ChunkStore(int(config.l1_size_gb * GIB), config.eviction_policy)
        self.metrics = LMCacheMetrics(self.store)
        self._lock = threading.Lock()

    def handle(self, message: dict[str, Any]) -> dict[str, Any]:
        op = message.get("op")
        try:
            with self._lock:
                if op == "register":
                    return self._register(message)
                if op == "lookup":
                    return self._lookup(_strings(message, "keys"))
                if op == "store":
                    return self._store(str(message.get("salt", "")), _strings(message, "keys"), message)
                if op == "clear":
                    removed = self.store.clear()
                    lmcache_log("INFO", f"Cleared {removed} chunks from L1")
                    return protocol.reply_ok(removed=removed)
                if op == "ping":
                    return protocol.reply_ok()
        except Glm53Error as error:
            return protocol.reply_error(error.message)
        return protocol.reply_error(f"unknown op {op!r}; expected one of: {', '.join(protocol.OPS)}")

    def _register(self, message: dict[str, Any]) -> dict[str, Any]:
        groups = message.get("group_tokens_per_block")
        if not isinstance(groups, list) or not all(isinstance(g, int) for g in groups):
            raise Glm53Error("register needs group_tokens_per_block as a list of integers")
        result = handshake(self.config.generation, self.config.chunk_size, groups)
        if not result.accepted:
            lmcache_log("ERROR", f"Rejected engine registration: {result.error}")
            return protocol.reply_error(result.error or "")
        if result.chunk_size != self.chunk_size:
            lmcache_log(
                "INFO",
                f"Negotiated LMCache MP chunk size to {result.chunk_size} "
                f"(configured_min={self.config.chunk_size}, required_alignment={result.alignment})",
            )
            self.chunk_size = result.chunk_size
        hybrid = sum(1 for g in groups if g > 0) > 1
        if hybrid and not self.config.separate_object_groups and message.get("rank", 0) == 0:
            lmcache_log(
                "WARNING",
                f"Engine registered {len(groups)} KV cache groups but --separate-object-groups is off; "
                "hybrid models need it so each group gets its own cache objects",
            )
        lmcache_log(
            "INFO",
            f"Registered engine {message.get('model')} rank {message.get('rank')}: "
            f"group_tokens_per_block={groups}, chunk_size={self.chunk_size}",
        )
        return protocol.reply_ok(chunk_size=self.chunk_size)

    def _lookup(self, keys: list[str]) -> dict[str, Any]:
        hit_chunks = self.store.longest_prefix(keys)
        hit_tokens = hit_chunks * self.chunk_size
        self.metrics.record_lookup(len(keys) * self.chunk_size, hit_tokens, hit_chunks)
        return protocol.reply_ok(hit_chunks=hit_chunks, hit_tokens=hit_tokens)

    def _store(self, salt: str, keys: list[str], message: dict[str, Any]) -> dict[str, Any]:
        chunk_bytes = message.get("chunk_bytes")
        if not isinstance(chunk_bytes, int) or chunk_bytes <= 0:
            raise Glm53Error("store needs chunk_bytes as a positive integer")
        result = self.store.put(salt, keys, chunk_bytes)
        self.metrics.record_store(result.written, result.evicted)
        return protocol.reply_ok(written=result.written, evicted=result.evicted, dropped=result.dropped)


def _strings(message: dict[str, Any], field: str) -> list[str]:
    value = message.get(field)
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise Glm53Error(f"{message.get('op')} needs {field} as a list of strings")
    return value


class _HealthHandler(JsonHandler):
    def do_GET(self) -> None:
        if self.path.split("?")[0] == "/healthcheck":
            self.send_json(200, {"status": "healthy"})
        else:
            self.send_json(404, {"detail": "Not Found"})

    def do_POST(self) -> None:
        self.send_json(404, {"detail": "Not Found"})


def _bind_zmq(context: zmq.Context[zmq.Socket[bytes]], host: str, port: int) -> zmq.Socket[bytes]:
    socket = context.socket(zmq.REP)
    socket.setsockopt(zmq.LINGER, 0)
    try:
        socket.bind(f"tcp://{host}:{port}")
    except zmq.ZMQError as error:
        socket.close()
        raise bind_error("LMCache request endpoint", host, port, str(error), "--port") from None
    return socket


def serve(config: LMCacheConfig) -> int:
    """Bind every listener (failing fast on a taken port), log start-up, answer requests until SIGTERM/SIGINT."""
    if config.l1_size_gb <= 0:
        raise Glm53Error(f"--l1-size-gb must be positive, got {config.l1_size_gb}")
    if config.chunk_size <= 0:
        raise Glm53Error(f"--chunk-size must be a positive integer, got {config.chunk_size}")
    stop = stop_on_signals()
    server = LMCacheServer(config)
    context: zmq.Context[zmq.Socket[bytes]] = zmq.Context()
    socket = _bind_zmq(context, config.host, config.port)
    try:
        http = bind_http("LMCache HTTP frontend", config.http_host, config.http_port, _HealthHandler, "--http-port")
        try:
            metrics_server, _ = start_http_server(config.prometheus_port, "127.0.0.1", server.metrics.registry)
        except OSError as error:
            http.server_close()
            raise bind_error(
                "LMCache Prometheus endpoint",
                "127.0.0.1",
                config.prometheus_port,
                error.strerror or "",
                "--prometheus-port",
            ) from None
        serve_in_background(http)
        _log_startup(config)
        try:
            _answer_until(stop, socket, server)
        finally:
            http.shutdown()
            http.server_close()
            metrics_server.shutdown()
            metrics_server.server_close()
    finally:
        socket.close()
        context.term()
    lmcache_log("INFO", "LMCache MP server stopped")
    return 0


def _log_startup(config: LMCacheConfig) -> None:
    lmcache_log(
        "INFO",
        f"Starting LMCache MP server ({config.generation} generation): chunk_size={config.chunk_size}, "
        f"separate_object_groups={config.separate_object_groups}, l1_size_gb={config.l1_size_gb}, "
        f"eviction_policy={config.eviction_policy}",
    )
    lmcache_log("INFO", f"LMCache MP server listening on tcp://{config.host}:{config.port}")
    lmcache_log("INFO", f"HTTP frontend listening on http://{config.http_host}:{config.http_port}")
    lmcache_log("INFO", f"Prometheus metrics on http://127.0.0.1:{config.prometheus_port}/metrics")


def _answer_until(stop: threading.Event, socket: zmq.Socket[bytes], server: LMCacheServer) -> None:
    poller = zmq.Poller()
    poller.register(socket, zmq.POLLIN)
    while not stop.is_set():
        if not dict(poller.poll(POLL_MS)):
            continue
        data = socket.recv()
        try:
            reply = server.handle(protocol.decode(data))
        except Glm53Error as error:
            reply = protocol.reply_error(error.message)
        socket.send(protocol.encode(reply))
