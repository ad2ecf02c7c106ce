"""`glm53 mock vllm`: a CPU stand-in for `vllm serve` with the LMCache MP connector.

Start-up follows the real order, logging the lines the probe reads: a simulated model load, for hybrid profiles
`Setting attention block size to N tokens ...`, the connector's registration with the LMCache server (refusal ->
`ValueError: LMCache chunk size ...` then `EngineCore failed to start.`; silence -> `Cannot reach the LMCache MP
server ...`; both exit 1), then `Resolved LMCache MP geometry: ...` once per TP rank, then serving. The HTTP port is
bound first so a taken port fails at once; until the engine is ready every route answers 503.
"""

from __future__ import annotations

import json
import os
import threading
import time
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import parse_qs, urlsplit

from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from glm53.chunks import required_alignment
from glm53.errors import EXIT_FAILURE, Glm53Error
from glm53.mock import model, openai_api
from glm53.mock.connector import ConnectorConfig
from glm53.mock.engine import Engine, EngineSettings, Outcome
from glm53.mock.lmcache_client import LMCacheClient, LMCacheRefused, LMCacheUnavailable
from glm53.mock.loglines import VllmLogger
from glm53.mock.model import ComputeCost
from glm53.mock.runtime import JsonHandler, MockHTTPServer, bind_http, serve_in_background, stop_on_signals
from glm53.mock.store import ChunkStore
from glm53.mock.vllm_metrics import VllmMetrics
from glm53.profiles import ModelProfile

VLLM_VERSION = "0.33.0"
DEFAULT_LOCAL_CACHE_TOKENS = 262_144
# While serving, a silent LMCache server costs at most this long per request before it is skipped.
SERVING_TIMEOUT = 5.0
LOAD_SHARDS = 4
DEV_MODE_ENV = "VLLM_SERVER_DEV_MODE"


@dataclass(frozen=True)
class VllmConfig:
    model: str
    profile: ModelProfile
    host: str
    port: int
    tensor_parallel_size: int
    enable_prefix_caching: bool | None
    connector: ConnectorConfig
    served_model_name: str
    load_seconds: float
    fault: str | None
    seed: int
    max_model_len: int
    num_gpu_blocks_override: int | None
    cost: ComputeCost
    non_default_args: dict[str, Any] = field(default_factory=dict)


def unified_block_size(profile: ModelProfile, tensor_parallel_size: int) -> int:
    """N for this TP size: the measured value, else the measured one scaled by TP (a made-up but stable stand-in).

    Real N can change with TP and must be re-read from vLLM's log; the mock only needs it deterministic.
    """
    measured = profile.unified_block_size(tensor_parallel_size)
    if measured is not None:
        return measured
    reference_tp, reference_n = next(iter(sorted(profile.unified_block_size_by_tp.items())))
    return reference_n * tensor_parallel_size // reference_tp


def engine_groups(profile: ModelProfile, tensor_parallel_size: int) -> tuple[int, ...]:
    n = unified_block_size(profile, tensor_parallel_size) if profile.follows_unified_block_size else None
    return profile.expected_groups(n)


class _Pids:
    """Made-up pids for the simulated processes, distinct per process as in a real vLLM log."""

    api = os.getpid()
    engine = api + 1

    @staticmethod
    def worker(rank: int) -> int:
        return _Pids.api + 2 + rank


class VllmServer:
    def __init__(self, config: VllmConfig) -> None:
        self.config = config
        self.ready = threading.Event()
        self.engine: Engine | None = None
        self.metrics: VllmMetrics | None = None
        self.api_log = VllmLogger("APIServer", _Pids.api)
        self.engine_log = VllmLogger("EngineCore_DP0", _Pids.engine)

    def worker_log(self, rank: int) -> VllmLogger:
        return VllmLogger(f"Worker_TP{rank}", _Pids.worker(rank))

    def start_engine(self, stop: threading.Event) -> int | None:
        """Load, hand-shake with LMCache and build the engine; an exit status if start-up failed or was stopped."""
        c, p = self.config, self.config.profile
        self.api_log.info("api_server.py:1870", f"vLLM API server version {VLLM_VERSION}")
        self.api_log.info("utils.py:328", f"non-default args: {c.non_default_args}")
        self.api_log.info("model.py:562", f"Resolved architecture: {p.architecture}")
        prefix_caching = c.enable_prefix_caching
        if prefix_caching is None:
            prefix_caching = not p.follows_unified_block_size  # vLLM leaves it off by default for hybrid models
        if p.follows_unified_block_size and not prefix_caching:
            self.api_log.error(
                "lmcache_mp_connector.py:402",
                f"ValueError: {p.display_name} is a hybrid (Mamba / linear-attention) model and LMCacheMPConnector "
                "needs per-block state snapshots: pass --enable-prefix-caching.",
            )
            return EXIT_FAILURE
        groups = engine_groups(p, c.tensor_parallel_size)
        block_size = required_alignment(groups)
        if p.follows_unified_block_size:
            self.api_log.info(
                "config.py:228",
                f"Setting attention block size to {block_size} tokens to ensure that attention page size is >= "
                "mamba page size.",
            )
        self.engine_log.info(
            "core.py:93",
            f"Initializing a V1 LLM engine (v{VLLM_VERSION}) with config: model='{c.model}', "
            f"tensor_parallel_size={c.tensor_parallel_size}, enable_prefix_caching={prefix_caching}, "
            f"kv_transfer_config=LMCacheMPConnector",
        )
        if c.fault is not None:
            self.engine_log.warning("core.py:101", f"Mock fault injected: {c.fault}")
        if not self._load(stop):
            return 0
        client = LMCacheClient(
            c.connector.url, min(c.connector.mq_timeout, SERVING_TIMEOUT), c.connector.heartbeat_interval
        )
        chunk_size = self._register(client, groups, stop)
        if chunk_size is None:
            client.close()
            return 0 if stop.is_set() else EXIT_FAILURE
        for rank in range(c.tensor_parallel_size):
            self.worker_log(rank).info(
                "lmcache_mp_connector.py:668",
                f"Resolved LMCache MP geometry: group_tokens_per_block={list(groups)}, "
                f"scheduler_block_size={block_size}, cache_model_name={c.model}",
            )
        capacity = c.num_gpu_blocks_override or DEFAULT_LOCAL_CACHE_TOKENS // block_size
        local = ChunkStore(capacity if prefix_caching else 0, "LRU")
        self.metrics = VllmMetrics(c.served_model_name, lambda: local.used_bytes / capacity)
        noise_sd = 0.0 if p.bit_exact_outputs else model.NOISE_SD
        settings = EngineSettings(
            block_size, chunk_size, p.strict_prefix, c.fault, c.seed, c.cost, model.BYTES_PER_TOKEN[p.name], noise_sd
        )
        self.engine = Engine(settings, local, client, self.metrics)
        self.engine_log.info("kv_cache_utils.py:1087", f"GPU KV cache size: {capacity * block_size:,} tokens")
        return None

    def _load(self, stop: threading.Event) -> bool:
        """The simulated weight load; False if a stop signal arrived meanwhile."""
        started = time.monotonic()
        log = self.worker_log(0)
        for shard in range(1, LOAD_SHARDS + 1):
            if stop.wait(self.config.load_seconds / LOAD_SHARDS):
                return False
            log.info(
                "default_loader.py:291",
                f"Loading safetensors checkpoint shards: {100 * shard // LOAD_SHARDS}% Completed | "
                f"{shard}/{LOAD_SHARDS}",
            )
        elapsed = time.monotonic() - started
        for rank in range(self.config.tensor_parallel_size):
            self.worker_log(rank).info("default_loader.py:322", f"Loading weights took {elapsed:.2f} seconds")
        return True

    def _register(self, client: LMCacheClient, groups: tuple[int, ...], stop: threading.Event) -> int | None:
        """Each TP rank registers its KV caches; the server's chunk size, or None if stopped or start-up failed."""
        c = self.config
        chunk_size = None
        for rank in range(c.tensor_parallel_size):
            message = {"op": "register", "model": c.model, "rank": rank, "world_size": c.tensor_parallel_size}
            try:
                reply = client.request(
                    {**message, "group_tokens_per_block": list(groups)}, c.connector.mq_timeout, stop
                )
            except LMCacheUnavailable:
                if stop.is_set():
                    return None
                self.worker_log(rank).error(
                    "vllm_multi_process_adapter.py:316",
                    f"ConnectionError: Cannot reach the LMCache MP server at '{client.url}' within "
                    f"{c.connector.mq_timeout}s.",
                )
                self._engine_failed()
                return None
            except LMCacheRefused as error:
                self.worker_log(rank).error("vllm_multi_process_adapter.py:781", f"ValueError: {error}")
                self._engine_failed()
                return None
            chunk_size = int(reply["chunk_size"])
        return chunk_size

    def _engine_failed(self) -> None:
        self.engine_log.error("core.py:708", "EngineCore failed to start.")
        self.api_log.error(
            "api_server.py:1511", "RuntimeError: Engine core initialization failed. See root cause above."
        )


def _handler(server: VllmServer) -> type[JsonHandler]:
    dev_mode = os.environ.get(DEV_MODE_ENV) == "1"
    config = server.config

    class Handler(JsonHandler):
        def _route(self) -> tuple[str, dict[str, list[str]]]:
            parts = urlsplit(self.path)
            return parts.path, parse_qs(parts.query)

        def _not_ready(self) -> bool:
            if server.ready.is_set():
                return False
            self.send_json(503, {"error": {"message": "the engine is still starting", "code": 503}})
            return True

        def do_GET(self) -> None:
            path, _ = self._route()
            if self._not_ready():
                return
            assert server.metrics is not None
            if path == "/health":
                self.send_body(200, b"", "application/json")
            elif path == "/v1/models":
                card = {
                    "id": config.served_model_name,
                    "object": "model",
                    "created": int(time.time()),
                    "owned_by": "vllm",
                    "root": config.model,
                    "max_model_len": config.max_model_len,
                }
                self.send_json(200, {"object": "list", "data": [card]})
            elif path == "/metrics":
                self.send_body(200, generate_latest(server.metrics.registry), CONTENT_TYPE_LATEST)
            else:
                self.send_json(404, {"detail": "Not Found"})

        def do_POST(self) -> None:
            path, query = self._route()
            body = self.read_body()
            if path == "/reset_prefix_cache" and dev_mode:
                if not self._not_ready():
                    self._reset(query)
            elif path in ("/v1/completions", "/v1/chat/completions"):
                if not self._not_ready():
                    self._complete(body, chat=path.endswith("chat/completions"))
            else:
                self.send_json(404, {"detail": "Not Found"})

        def _reset(self, query: dict[str, list[str]]) -> None:
            assert server.engine is not None
            server.engine.reset_local()
            external = query.get("reset_external", ["false"])[0].lower() == "true"
            server.api_log.info("api_server.py:1102", f"Resetting prefix cache (reset_external={external})")
            success = server.engine.reset_external() if external else True
            self.send_json(200, {"success": success})

        def _complete(self, body: bytes, chat: bool) -> None:
            assert server.engine is not None
            try:
                request = openai_api.parse_request(_json(body), chat, config.served_model_name, config.max_model_len)
            except openai_api.ApiError as error:
                self.send_json(error.status, error.body())
                return
            if not request.stream:
                self.send_json(200, openai_api.response(request, server.engine.run(request.prompt)))
                return
            self._stream(request)

        def _stream(self, request: openai_api.ApiRequest) -> None:
            assert server.engine is not None
            self.close_connection = True
            self.send_response(200)
            self.send_header("Content-Type", "text/event-stream")
            self.send_header("Connection", "close")
            self.end_headers()
            events: list[dict[str, Any]] = []

            def on_token(outcome: Outcome, index: int) -> None:
                if not events:
                    events.extend(openai_api.stream_events(request, outcome))
                self._event(events[index])

            outcome = server.engine.run(request.prompt, on_token)
            for event in events[len(outcome.generation.words) :]:
                self._event(event)
            self.wfile.write(b"data: [DONE]\n\n")

        def _event(self, payload: dict[str, Any]) -> None:
            self.wfile.write(b"data: " + json.dumps(payload).encode() + b"\n\n")
            self.wfile.flush()

    return Handler


def _json(body: bytes) -> Any:
    try:
        return json.loads(body or b"null")
    except (UnicodeDecodeError, json.JSONDecodeError):
        raise openai_api.ApiError(400, "the request body is not valid JSON") from None


def serve(config: VllmConfig) -> int:
    if config.load_seconds < 0:
        raise Glm53Error(f"--load-seconds must be >= 0, got {config.load_seconds}")
    stop = stop_on_signals()
    server = VllmServer(config)
    http: MockHTTPServer = bind_http("vLLM API server", config.host, config.port, _handler(server), "--port")
    serve_in_background(http)
    try:
        status = server.start_engine(stop)
        if status is not None:
            return status
        server.ready.set()
        server.api_log.info("api_server.py:1912", f"Starting vLLM API server 0 on http://{config.host}:{config.port}")
        server.api_log.info("launcher.py:44", "Application startup complete.")
        stop.wait()
        server.api_log.info("launcher.py:80", "Shutting down FastAPI HTTP server.")
        return 0
    finally:
        http.shutdown()
        http.server_close()
        if server.engine is not None:
            server.engine.client.close()
