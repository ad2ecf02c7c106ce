"""`glm53 mock vllm`: a CPU stand-in for `vllm serve` whose KV path is the real LMCache server, via its own connector.

Start-up follows vLLM 0.33 with `LMCacheMPConnector`, logging what the probe reads in vLLM's own format
(`glm53.mock.logs`): the start banner, for hybrid profiles `Setting attention block size to N tokens ...`, a simulated
weight load, then the connector: the server's chunk size (a silent server -> `ConnectionError: Cannot reach the
LMCache MP server ...`), `Resolved LMCache MP geometry: ...` through LMCache's logger once per TP worker and once for
the scheduler, the scheduler's chunk check (a misfit -> `ValueError: LMCache chunk size 256 must be a multiple of
group 0 tokens_per_block 1152`, lmcache_mp_connector.py:812-820), each worker's KV registration, then serving. Start-up
failures log `EngineCore failed to start.` with the traceback (vllm v1/engine/core.py:1584) and the API server's
`RuntimeError` (v1/engine/utils.py:1473-1476), and the stand-in exits 1 with one line. The HTTP port is bound first so
a taken port fails at once; until the engine is ready every route answers 503.
After Ready the stand-in is vLLM with LMCache's connector, whose adapters it drives (`glm53.mock.kv_client`): a lost
sidecar puts it in degraded mode, not down. It keeps serving and `/health` stays 200; lookups miss, stores are dropped,
and a request whose KV load failed ends as `kv_load_failure_policy` says (`glm53.mock.engine`): with `fail`, vLLM's
default, a 500 `Internal server error` (in a stream: a 200 whose one event is that error); with `recompute`, a
normal answer. A sidecar back after a failed ping is registered again; one back sooner rejects every store and load
until the engine restarts (LMCache #4642).
With `--enable-scale-out` it also answers vLLM's render routes (`glm53.mock.render`), which vllm-router tokenizes
through; without it they answer 403, as in `vllm serve`.
"""

from __future__ import annotations

import hashlib
import json
import os
import sys
import threading
import time
from dataclasses import dataclass, field, replace
from typing import Any
from urllib.parse import parse_qs, urlsplit

from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from glm53.chunks import required_alignment
from glm53.errors import EXIT_FAILURE, Glm53Error
from glm53.mock import logs, model, openai_api, render
from glm53.mock.connector import ConnectorConfig, KVEventsConfig
from glm53.mock.engine import Engine, EngineSettings, EventSink, LoadFailed, Outcome
from glm53.mock.local_cache import LocalPrefixCache
from glm53.mock.logs import VLLM_VERSION, VllmLogger
from glm53.mock.model import ComputeCost
from glm53.mock.runtime import (
    JsonHandler,
    MockHTTPServer,
    bind_http,
    compact_json,
    serve_in_background,
    stop_on_signals,
)
from glm53.mock.vllm_metrics import VllmMetrics
from glm53.profiles import ModelProfile

DEFAULT_LOCAL_CACHE_TOKENS = 262_144
DEV_MODE_ENV = "VLLM_SERVER_DEV_MODE"


@dataclass(frozen=True)
class VllmConfig:
    model: str
    profile: ModelProfile
    host: str
    port: int
    tensor_parallel_size: int
    enable_prefix_caching: bool | None
    enable_prompt_tokens_details: bool
    connector: ConnectorConfig
    served_model_name: str
    load_seconds: float
    fault: str | None
    seed: int
    max_model_len: int
    num_gpu_blocks_override: int | None
    cost: ComputeCost
    kv_events: KVEventsConfig | None = None  # from `--kv-events-config`; None: no events
    enable_scale_out: bool = False  # `--enable-scale-out`: serve the render endpoints (glm53.mock.render)
    non_default_args: dict[str, Any] = field(default_factory=dict)


def unified_block_size(profile: ModelProfile, tensor_parallel_size: int) -> int:
    """N for this TP size: the measured value, else the measured one scaled by TP (a made-up but stable stand-in).

    Real N can change with TP and must be re-read from vLLM's log; the stand-in only needs it deterministic.
    """
    measured = profile.unified_block_size(tensor_parallel_size)
    if measured is not None:
        return measured
    reference_tp, reference_n = next(iter(sorted(profile.unified_block_size_by_tp.items())))
    return reference_n * tensor_parallel_size // reference_tp


def engine_groups(profile: ModelProfile, tensor_parallel_size: int) -> tuple[int, ...]:
    n = unified_block_size(profile, tensor_parallel_size) if profile.follows_unified_block_size else None
    return profile.expected_groups(n)


def chunk_misfit(chunk_size: int, groups: tuple[int, ...]) -> str | None:
    """The scheduler-side connector's refusal (lmcache_mp_connector.py:812-820) for the first misfit group, or None."""
    for index, tokens in enumerate(groups):
        if tokens and chunk_size % tokens:
            return f"LMCache chunk size {chunk_size} must be a multiple of group {index} tokens_per_block {tokens}"
    return None


def engine_process_name() -> str:
    """vllm 0.33.0 v1/engine/utils.py:289: `EngineCore`, or `EngineCore_DP<n>` with data parallelism (none here)."""
    return "EngineCore"


def worker_process_name(rank: int, tensor_parallel_size: int) -> str:
    """vllm 0.33.0 v1/executor/multiproc_executor.py:1214-1229: `Worker`, plus `_TP<rank>` only when TP > 1."""
    return f"Worker_TP{rank}" if tensor_parallel_size > 1 else "Worker"


def system_fingerprint(config: VllmConfig) -> str:
    """vllm 0.33.0 entrypoints/serve/utils/fingerprint.py:48-82 (mode `full`): vllm-<version>[-tp<N>]-<hash8>, the hash
    being the first 8 hex digits of the engine config's hash; the stand-in hashes what it emulates."""
    parts = [f"vllm-{VLLM_VERSION}"]
    if config.tensor_parallel_size > 1:
        parts.append(f"tp{config.tensor_parallel_size}")
    emulated = f"{config.model}|{config.profile.name}|{config.tensor_parallel_size}|{config.max_model_len}"
    parts.append(hashlib.sha256(emulated.encode()).hexdigest()[:8])
    return "-".join(parts)


def model_max_len(config: VllmConfig) -> int:
    """The context length: `--max-model-len` when given, else the model's own, as vLLM derives it from the model's
    config (vllm 0.33.0 config/model.py, `max_position_embeddings`): for the tiny CPU models that is their 16384
    positions (glm53.tinymodels.MAX_POSITIONS), which the real engine serves."""
    if "max_model_len" in config.non_default_args or config.profile.tiny_model is None:
        return config.max_model_len
    from glm53.tinymodels import MAX_POSITIONS

    return MAX_POSITIONS


class _Pids:
    """Made-up pids for the simulated processes, distinct per process as in a real vLLM log."""

    api = os.getpid()
    engine = api + 1

    @staticmethod
    def worker(rank: int) -> int:
        return _Pids.api + 2 + rank


class StartupFailed(Glm53Error):
    """The engine did not start; the log already holds vLLM's lines, this is the one-line summary."""

    def __init__(self, reason: str) -> None:
        super().__init__(f"EngineCore failed to start: {reason}", EXIT_FAILURE)


class VllmServer:
    def __init__(self, config: VllmConfig) -> None:
        self.config = config
        self.ready = threading.Event()
        self.stop = threading.Event()
        self.engine: Engine | None = None
        self.metrics: VllmMetrics | None = None
        self.api_log = VllmLogger("APIServer", _Pids.api)
        self.engine_log = VllmLogger(engine_process_name(), _Pids.engine)
        self.fingerprint = system_fingerprint(config)

    def worker_log(self, rank: int) -> VllmLogger:
        return VllmLogger(worker_process_name(rank, self.config.tensor_parallel_size), _Pids.worker(rank))

    def _fail(self, error: Exception) -> StartupFailed:
        """Log the failure the way vLLM does (traceback through its formatter, then the API server's error); the
        summary is the error's first line (LMCache's connection errors go on with advice)."""
        try:
            raise error
        except Exception:
            self.engine_log.exception(logs.ENGINE_FAILED, "EngineCore failed to start.")
        sys.stdout.write(
            "RuntimeError: Engine core initialization failed. See root cause above. "
            "Failed core proc(s): {'EngineCore_DP0': 1}\n"
        )
        sys.stdout.flush()
        first_line = str(error).partition("\n")[0]
        return StartupFailed(f"{type(error).__name__}: {first_line}")

    def start_engine(self) -> bool:
        """Load, connect to LMCache and build the engine; False if a stop signal came first."""
        c, p = self.config, self.config.profile
        self.api_log.info(logs.BANNER, logs.banner_format(os.environ), VLLM_VERSION, c.model)
        self.api_log.info(logs.NON_DEFAULT_ARGS, "non-default args: %s", c.non_default_args)
        prefix_caching = c.enable_prefix_caching
        if prefix_caching is None:
            prefix_caching = not p.follows_unified_block_size  # vLLM leaves it off by default for hybrid models
        groups = engine_groups(p, c.tensor_parallel_size)
        block_size = required_alignment(groups)
        if p.follows_unified_block_size:
            self.api_log.info(
                logs.ATTENTION_BLOCK,
                "Setting attention block size to %d tokens to ensure that attention page size is >= mamba page size.",
                block_size,
            )
        self.engine_log.info(
            logs.ENGINE_INIT,
            "Initializing a V1 LLM engine (v%s) with config: %s",
            VLLM_VERSION,
            f"model='{c.model}', tensor_parallel_size={c.tensor_parallel_size}, "
            f"enable_prefix_caching={prefix_caching}, kv_transfer_config=LMCacheMPConnector",
        )
        if c.fault is not None:
            print(f"glm53 mock: fault injected: {c.fault}", flush=True)
        started = time.monotonic()
        if self.stop.wait(c.load_seconds):
            return False
        for rank in range(c.tensor_parallel_size):
            self.worker_log(rank).info(logs.LOAD_DONE, "Loading weights took %.2f seconds", time.monotonic() - started)
        self.engine = self._connect(groups, block_size, prefix_caching)
        return self.engine is not None

    def _connect(self, groups: tuple[int, ...], block_size: int, prefix_caching: bool) -> Engine | None:
        """The engine with its LMCache connection, or None if a stop signal came first."""
        try:
            from glm53.mock.kv_client import KVClient, KVLayout, Stopped  # torch + LMCache: pod extra
        except ImportError as error:
            raise Glm53Error(
                f"the engine stand-in talks to LMCache through LMCache's own connector, which is not installed "
                f"({error}); install the pod extra: pip install -e '.[pod]'",
                EXIT_FAILURE,
            ) from None
        c = self.config
        kv = KVClient(c.connector, self.stop)
        try:
            chunk_size = kv.chunk_size()
            if chunk_size is None:
                # vllm_multi_process_adapter.py:305-318 (_raise_server_unreachable), first line of its message.
                raise self._fail(
                    ConnectionError(
                        f"Cannot reach the LMCache MP server at '{c.connector.url}' within {c.connector.mq_timeout}s."
                    )
                )
            for _ in range(c.tensor_parallel_size + 1):  # each worker, then the scheduler (connector:668)
                logs.log_geometry(list(groups), block_size, c.model)
            misfit = chunk_misfit(chunk_size, groups)
            if misfit is not None:
                raise self._fail(ValueError(misfit))
            try:
                kv.connect(KVLayout(c.model, c.tensor_parallel_size, groups, block_size, c.max_model_len))
            except ConnectionError as error:  # the adapters' own: the server stopped answering (mq_timeout)
                raise self._fail(error) from None
        except Stopped:
            kv.close()
            return None
        except BaseException:
            kv.close()
            raise
        capacity = c.num_gpu_blocks_override or DEFAULT_LOCAL_CACHE_TOKENS // block_size
        local = LocalPrefixCache(capacity if prefix_caching else 0)
        self.metrics = VllmMetrics(c.served_model_name, lambda: len(local) / capacity)
        noise_sd = 0.0 if c.profile.bit_exact_outputs else model.NOISE_SD
        settings = EngineSettings(
            block_size,
            groups,
            chunk_size,
            c.profile.strict_prefix,
            c.fault,
            c.seed,
            c.cost,
            noise_sd,
            c.connector.load_failure_policy,
        )
        return Engine(settings, local, kv, self.metrics, self.engine_log, self._event_publisher())

    def _event_publisher(self) -> EventSink | None:
        """vLLM's ZMQ KV-event publisher when `--kv-events-config` enables it (vllm/distributed/kv_events.py)."""
        if self.config.kv_events is None:
            return None
        from glm53.mock import kv_events  # msgspec: the pod extra

        return kv_events.KVEventPublisher(self.config.kv_events)


# What FastAPI reads as true in a `bool` query parameter (pydantic's bool parsing), e.g. `?reset_external=1`.
QUERY_TRUE = frozenset({"1", "on", "t", "true", "y", "yes"})
# The routes the stand-in serves and their methods; another method on one of these paths is a 405, as in FastAPI.
ROUTES: dict[str, frozenset[str]] = {
    "/health": frozenset({"GET"}),
    "/v1/models": frozenset({"GET"}),
    "/reset_prefix_cache": frozenset({"POST"}),  # only in dev mode (entrypoints/serve/dev/cache/api_router.py:20)
    "/v1/completions": frozenset({"POST"}),
    "/v1/chat/completions": frozenset({"POST"}),
    "/v1/completions/render": frozenset({"POST"}),
    "/v1/chat/completions/render": frozenset({"POST"}),
}


def model_card(config: VllmConfig) -> dict[str, Any]:
    """`GET /v1/models`'s entry: vllm 0.33.0 entrypoints/serve/engine/protocol.py:88-113 (ModelCard, ModelPermission,
    every field dumped); `root` is the served model as given (the model id, or the directory the real engine gets)."""
    created = int(time.time())
    permission = {
        "id": f"modelperm-{openai_api.random_uuid()}",
        "object": "model_permission",
        "created": created,
        "allow_create_engine": False,
        "allow_sampling": True,
        "allow_logprobs": True,
        "allow_search_indices": False,
        "allow_view": True,
        "allow_fine_tuning": False,
        "organization": "*",
        "group": None,
        "is_blocking": False,
    }
    return {
        "id": config.served_model_name,
        "object": "model",
        "created": created,
        "owned_by": "vllm",
        "root": config.model,
        "parent": None,
        "max_model_len": config.max_model_len,
        "permission": [permission],
    }


def _handler(server: VllmServer) -> type[JsonHandler]:
    dev_mode = os.environ.get(DEV_MODE_ENV) == "1"
    config = server.config
    # The tiny CPU models' tokenizers have no chat template (glm53.tinymodels), so the real engine refuses chat there.
    chat_template = config.profile.tiny_model is None

    class Handler(JsonHandler):
        def _route(self) -> tuple[str, dict[str, list[str]]]:
            parts = urlsplit(self.path)
            return parts.path, parse_qs(parts.query)

        def _not_ready(self) -> bool:
            if server.ready.is_set():
                return False
            self.send_json(503, {"error": {"message": "the engine is not serving", "code": 503}})
            return True

        def _wrong_method(self, path: str, method: str) -> bool:
            """FastAPI's answer to a route's path with another method: 405 `{"detail":"Method Not Allowed"}` and an
            Allow header (starlette 1.10.0 routing.py:280-286 raises it, fastapi exception_handlers.py:11-17 body)."""
            allowed = ROUTES.get(path)
            if path == "/reset_prefix_cache" and not dev_mode:
                allowed = None
            if allowed is None or method in allowed:
                return False
            self.send_response(405)
            body = compact_json({"detail": "Method Not Allowed"})
            self.send_header("Allow", ", ".join(sorted(allowed)))
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)
            return True

        def do_GET(self) -> None:
            path, _ = self._route()
            if self._not_ready() or self._wrong_method(path, "GET"):
                return
            assert server.metrics is not None
            if path == "/health":
                # vllm 0.33.0 entrypoints/serve/instrumentator/health.py:22-31: a bare Response, no Content-Type.
                self.send_response(200)
                self.send_header("Content-Length", "0")
                self.end_headers()
            elif path == "/v1/models":
                self.send_json(200, {"object": "list", "data": [model_card(config)]})
            elif path == "/metrics":
                self.send_body(200, generate_latest(server.metrics.registry), CONTENT_TYPE_LATEST)
            else:
                self.send_json(404, {"detail": "Not Found"})

        def do_POST(self) -> None:
            path, query = self._route()
            body = self.read_body()
            if self._not_ready() or self._wrong_method(path, "POST"):
                return
            if path == "/reset_prefix_cache" and dev_mode:
                self._reset(query)
            elif path in ("/v1/completions", "/v1/chat/completions"):
                self._complete(body, chat=path.endswith("chat/completions"))
            elif path in ("/v1/completions/render", "/v1/chat/completions/render"):
                self._render(body, chat=path.startswith("/v1/chat/"))
            else:
                self.send_json(404, {"detail": "Not Found"})

        def _reset(self, query: dict[str, list[str]]) -> None:
            assert server.engine is not None
            server.api_log.info(logs.RESET, "Resetting prefix cache...")
            server.engine.reset_local()
            external = query.get("reset_external", ["false"])[0].lower() in QUERY_TRUE
            success = server.engine.reset_external() if external else True
            self.send_json(200, {"success": success})

        def _render(self, body: bytes, chat: bool) -> None:
            try:
                if not config.enable_scale_out:
                    raise render.SCALE_OUT_DISABLED
                rendered = render.render(
                    _json(body),
                    chat,
                    config.served_model_name,
                    config.max_model_len,
                    self.headers.get("X-Request-Id"),
                    chat_template,
                )
            except openai_api.ApiError as error:
                self.send_json(error.status, error.body())
                return
            self.send_json(200, rendered)

        def _complete(self, body: bytes, chat: bool) -> None:
            assert server.engine is not None
            try:
                request = openai_api.parse_request(
                    _json(body), chat, config.served_model_name, config.max_model_len, chat_template
                )
            except openai_api.ApiError as error:
                self.send_json(error.status, error.body())
                return
            try:
                if not request.stream:
                    try:
                        outcome = server.engine.run(request.prompt)
                    except LoadFailed:
                        self._generation_error(request)
                        self.send_json(500, openai_api.generation_error().body())
                        return
                    details = config.enable_prompt_tokens_details
                    self.send_json(200, openai_api.response(request, outcome, details, server.fingerprint))
                    return
                self._stream(request)
            except Glm53Error as error:
                self.send_json(500, openai_api.ApiError(500, error.message, "InternalServerError").body())

        def _generation_error(self, request: openai_api.ApiRequest) -> None:
            """The API server's line for a request the engine finished with an error (serving.py:203-206)."""
            kind = "chatcmpl" if request.chat else "cmpl"
            server.api_log.error(
                logs.GENERATION_ERROR,
                "Request %s failed with an internal error during generation",
                f"{kind}-{openai_api.random_uuid()}",
            )

        def _start_stream(self) -> None:
            self.close_connection = True
            self.send_response(200)
            self.send_header("Content-Type", "text/event-stream")
            self.send_header("Connection", "close")
            self.end_headers()

        def _stream(self, request: openai_api.ApiRequest) -> None:
            assert server.engine is not None
            events: list[dict[str, Any]] = []

            def on_token(outcome: Outcome, index: int) -> None:
                if not events:
                    self._start_stream()
                    details = config.enable_prompt_tokens_details
                    events.extend(openai_api.stream_events(request, outcome, details, server.fingerprint))
                self._event(events[index])

            try:
                outcome = server.engine.run(request.prompt, on_token)
            except LoadFailed:
                # The stream has answered 200 before the engine's first output (FastAPI's StreamingResponse).
                self._generation_error(request)
                self._start_stream()
                self.wfile.write(openai_api.stream_error_event(request.chat))
            else:
                for event in events[len(outcome.generation.words) :]:
                    self._event(event)
            self.wfile.write(b"data: [DONE]\n\n")

        def _event(self, payload: dict[str, Any]) -> None:
            self.wfile.write(b"data: " + compact_json(payload) + b"\n\n")
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
    config = replace(config, max_model_len=model_max_len(config))
    server = VllmServer(config)
    signalled = stop_on_signals()

    def relay() -> None:
        signalled.wait()
        server.stop.set()

    threading.Thread(target=relay, daemon=True).start()
    http: MockHTTPServer = bind_http("vLLM API server", config.host, config.port, _handler(server), "--port")
    serve_in_background(http)
    try:
        if not server.start_engine():
            return 0
        server.ready.set()
        server.api_log.info(logs.SERVER_STARTED, "Starting vLLM server on %s", f"http://{config.host}:{config.port}")
        server.stop.wait()
        return 0
    finally:
        http.shutdown()
        http.server_close()
        if server.engine is not None:
            server.engine.close()
