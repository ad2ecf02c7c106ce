"""After Ready the stand-in is vLLM with LMCache's connector, whose adapters it drives: when the sidecar dies it keeps
serving in degraded mode, registers again with a server back after a failed ping, and misses a faster restart.

The engine's side of a failed KV load (vLLM's scheduler under `kv_load_failure_policy`) is checked with a scripted KV
path; the rest against the REAL `lmcache server` on loopback, killed and started again on its ports under running
stand-ins, with the connector's heartbeat interval set through `lmcache.mp.heartbeat_interval` as the chart sets it.
"""

from __future__ import annotations

import io
import logging
import os
import signal
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any, cast

import pytest

from glm53.errors import Glm53Error
from glm53.mock import logs, openai_api
from glm53.mock.connector import ConnectorConfig, parse_connector_config
from glm53.mock.engine import Engine, EngineSettings, LoadFailed, Prompt
from glm53.mock.kv_client import KVClient, KVLayout
from glm53.mock.local_cache import LocalPrefixCache
from glm53.mock.logs import VllmFormatter, VllmLogger
from glm53.mock.model import ComputeCost
from glm53.mock.vllm_metrics import VllmMetrics
from tests.support.mockproc import (
    GLM53_MODEL,
    cached_after_priming,
    complete,
    connector_json,
    engine,
    http,
    lmcache_server,
    poll,
    serving,
    with_load_failure_policy,
)

INTERNAL_ERROR = {
    "error": {"message": "Internal server error", "type": "InternalServerError", "param": None, "code": 500}
}
DEGRADED = "LMCache server is unhealthy — entering degraded mode"
RECOVERING = "LMCache server is healthy again, triggering recovery callback"
REREGISTERED = "Finished re-registering KV caches after server recovery"
RESUMED = "LMCache server is healthy again — resuming normal operation"
TP = 2  # two workers, each with its own adapter and heartbeat, and the scheduler's


# ---------------------------------------------------------------------------------------------------------------
# The flags, the answers and the scheduler's side, without a server.


def test_the_load_failure_policy_is_vllms_kv_transfer_config_key() -> None:
    """vllm/config/kv_transfer.py:88-91: `Literal["recompute", "fail"] = "fail"`, a top-level key."""
    base = '{"kv_connector":"LMCacheMPConnector"'
    assert parse_connector_config(base + "}").load_failure_policy == "fail"
    assert parse_connector_config(base + ',"kv_load_failure_policy":"recompute"}').load_failure_policy == "recompute"
    with pytest.raises(Glm53Error, match="kv_load_failure_policy must be 'recompute' or 'fail', got 'retry'"):
        parse_connector_config(base + ',"kv_load_failure_policy":"retry"}')


@pytest.mark.slow  # imports LMCache and torch: half a minute on a busy machine
def test_the_adapters_get_their_own_keys_as_given_and_cudas_transfer_mode() -> None:
    pytest.importorskip("lmcache")
    from glm53.mock.kv_client import adapter_extra_config

    extra = {"lmcache.mp.host": "tcp://h", "lmcache.mp.lazy_offload": True, "lmcache.mp.hash_algorithm": "sha256_cbor"}
    assert adapter_extra_config(ConnectorConfig("tcp://h:1", 7.0, 1.5, extra=extra)) == {
        "lmcache.mp.hash_algorithm": "sha256_cbor",
        "lmcache.mp.mp_transfer_mode": "lmcache_driven",
        "lmcache.mp.mq_timeout": 7.0,
        "lmcache.mp.heartbeat_interval": 1.5,
    }
    given = {"lmcache.mp.mp_transfer_mode": "engine_driven"}
    assert adapter_extra_config(ConnectorConfig("tcp://h:1", 7.0, 1.5, extra=given))["lmcache.mp.mp_transfer_mode"] == (
        "engine_driven"
    )


def test_a_failed_generation_is_vllms_500_and_in_a_stream_one_error_event() -> None:
    assert openai_api.generation_error().status == 500
    assert openai_api.generation_error().body() == INTERNAL_ERROR
    # completion/serving.py:552-553 writes json.dumps' spacing; chat pydantic's compact dump.
    assert openai_api.stream_error_event(chat=False) == (
        b'data: {"error": {"message": "Internal server error", "type": "InternalServerError", "param": null, '
        b'"code": 500}}\n\n'
    )
    assert openai_api.stream_error_event(chat=True) == (
        b'data: {"error":{"message":"Internal server error","type":"InternalServerError","param":null,"code":500}}\n\n'
    )


class ScriptedKV:
    """The KV path with a fixed LMCache hit whose every retrieve fails; it records what the engine asks of it."""

    def __init__(self, hit: int) -> None:
        self.hit = hit
        self.stores: list[tuple[int, int]] = []
        self.retrieves: list[tuple[tuple[int, int], int]] = []
        self.sessions_ended = 0

    def lookup(self, tokens: Sequence[int], salt: str, reserve_last_token: bool, request_id: str) -> int:
        return self.hit

    def release(self, tokens: Sequence[int], salt: str, end: int, request_id: str) -> None:
        pass

    def retrieve(self, tokens: Sequence[int], salt: str, span: tuple[int, int], skip: int, request_id: str) -> bool:
        self.retrieves.append((span, skip))
        return False

    def store(self, tokens: Sequence[int], salt: str, span: tuple[int, int], request_id: str) -> None:
        self.stores.append(span)

    def end_session(self, request_id: str) -> None:
        self.sessions_ended += 1


class Scheduled:
    """An engine (block 64, chunk 256) on a scripted KV path, with its vLLM and LMCache lines kept."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch, groups: tuple[int, ...], policy: str, hit: int) -> None:
        self.vllm_lines = io.StringIO()
        handler = logging.StreamHandler(self.vllm_lines)
        handler.setFormatter(VllmFormatter())
        monkeypatch.setattr(logs, "_HANDLER", handler)
        self.connector_lines: list[str] = []
        monkeypatch.setattr(
            logs, "log_connector", lambda _level, _site, message, *args: self.connector_lines.append(message % args)
        )
        self.kv = ScriptedKV(hit)
        self.metrics = VllmMetrics("m", lambda: 0.0)
        settings = EngineSettings(64, groups, 256, False, None, 0, ComputeCost(0.0, 0.0), 0.0, policy)
        self.engine = Engine(
            settings, LocalPrefixCache(1000), cast(KVClient, self.kv), self.metrics, VllmLogger("EngineCore", 1)
        )

    def counter(self, name: str, **labels: str) -> float:
        value = self.metrics.registry.get_sample_value(name, {"model_name": "m", "engine": "0", **labels})
        return float(value or 0.0)


PROMPT = Prompt(tuple(range(600)), "s", 2)


@pytest.mark.parametrize("groups", [(64,), (64, 64)])
def test_a_failed_load_under_fail_ends_the_request_with_an_error(
    monkeypatch: pytest.MonkeyPatch, groups: tuple[int, ...]
) -> None:
    """vLLM's default: the request finishes with FinishReason.ERROR after its admission was counted; with one KV
    group the scheduler says so (scheduler.py:3764-3770), with several it is silent (:3688-3701)."""
    scheduled = Scheduled(monkeypatch, groups, "fail", hit=512)
    with pytest.raises(LoadFailed):
        scheduled.engine.run(PROMPT)
    assert scheduled.kv.retrieves == [((0, 512), 0)] and scheduled.kv.stores == []
    assert scheduled.kv.sessions_ended == 1
    failing = [line for line in scheduled.vllm_lines.getvalue().splitlines() if "due to KV load failure" in line]
    if len(groups) == 1:
        (line,) = failing
        assert " ERROR " in line and "[scheduler.py:3764]" in line
        assert (
            "Failing 1 request(s) due to KV load failure (failure_policy=fail, 512 tokens affected). Request IDs: {'"
            in line
        )
    else:
        assert failing == []
    assert scheduled.counter("vllm:request_success_total", finished_reason="error") == 1
    assert scheduled.counter("vllm:request_success_total", finished_reason="length") == 0
    assert scheduled.counter("vllm:external_prefix_cache_queries_total") == 600
    assert scheduled.counter("vllm:external_prefix_cache_hits_total") == 512
    assert scheduled.counter("vllm:prompt_tokens_total") == 0


@pytest.mark.parametrize("groups", [(64,), (64, 64)])
def test_a_failed_load_from_token_0_under_recompute_is_admitted_again_and_bypasses_lmcache(
    monkeypatch: pytest.MonkeyPatch, groups: tuple[int, ...]
) -> None:
    """No computed token is left: vLLM admits the request again (counted again), the connector serves it nothing
    (lmcache_mp_connector.py:1275-1291) and it stores the prompt from token 0."""
    scheduled = Scheduled(monkeypatch, groups, "recompute", hit=512)
    outcome = scheduled.engine.run(PROMPT)
    assert outcome.cached_tokens == 0 and outcome.external_hit_tokens == 0
    assert scheduled.kv.stores == [(0, 512)]
    recovered = "Recovered from KV load failure: 1 request(s) rescheduled (512 tokens affected)."
    assert (recovered in scheduled.vllm_lines.getvalue()) is (len(groups) == 1)
    (bypass,) = scheduled.connector_lines
    assert bypass.startswith("Bypassing LMCache for request ") and bypass.endswith(
        " after a failed async KV load; the prompt will be recomputed locally."
    )
    assert scheduled.counter("vllm:external_prefix_cache_queries_total") == 1200
    assert scheduled.counter("vllm:external_prefix_cache_hits_total") == 512
    assert scheduled.counter("vllm:prompt_tokens_cached_total") == 0
    assert scheduled.counter("vllm:request_success_total", finished_reason="length") == 1


def test_a_failed_load_past_vllms_own_hit_under_recompute_computes_on_from_the_chunk_it_started(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """One KV group and 320 tokens in vLLM's own cache: the load starts at chunk 256 (skipping 64), fails, and vLLM
    computes on from 256, still counting the first admission's 512 cached tokens (its prefill stats)."""
    scheduled = Scheduled(monkeypatch, (64,), "recompute", hit=0)
    scheduled.engine.run(Prompt(PROMPT.tokens[:321], "s", 2))  # caches five blocks of vLLM's own: 320 tokens
    scheduled.kv.hit = 512
    outcome = scheduled.engine.run(PROMPT)
    assert scheduled.kv.retrieves == [((256, 512), 64)]
    assert (outcome.local_hit_tokens, outcome.external_hit_tokens) == (320, 192)
    assert "Recovered from KV load failure: 1 request(s) rescheduled (256 tokens affected)." in (
        scheduled.vllm_lines.getvalue()
    )
    assert scheduled.connector_lines == []
    assert scheduled.kv.stores == [(0, 256)]  # the first request's chunk; nothing past LMCache's 512


# ---------------------------------------------------------------------------------------------------------------
# Against the real server.


def heartbeat_every(seconds: float, port: int) -> str:
    return connector_json(port, **{"lmcache.mp.heartbeat_interval": seconds})


@pytest.mark.slow
def test_a_lost_sidecar_is_degraded_mode_and_one_back_after_a_failed_ping_is_registered_again(tmp_path: Path) -> None:
    heartbeat = 1.0
    details = "--enable-prompt-tokens-details"
    with lmcache_server(tmp_path, "glm53") as server:
        connector = heartbeat_every(heartbeat, server.port)
        with engine(tmp_path, GLM53_MODEL, "glm53", TP, server.port, details, connector=connector) as pair:
            assert cached_after_priming(pair.base_url, 600, "before") == 512  # starts all three heartbeats
            server.process.kill()
            killed = time.monotonic()
            pair.process.wait_count(DEGRADED, TP + 1)  # the scheduler's adapter and each worker's, once
            assert http(f"{pair.base_url}/health")[0] == 200
            assert cached_after_priming(pair.base_url, 600, "before") == 0  # misses; its store was dropped
            assert http(f"{pair.base_url}/health")[0] == 200
            with serving(server.sidecar, tmp_path / "lmcache-restarted.log") as restarted:
                assert time.monotonic() - killed > 2 * heartbeat  # back later than a ping period and its timeout
                pair.process.wait_count(REREGISTERED, TP)
                pair.process.wait_count(RESUMED, TP + 1)
                assert cached_after_priming(pair.base_url, 600, "after") == 512
                assert "Rejecting" not in restarted.process.text()
                log = pair.process.text()  # before the server stops again
    assert log.count(RECOVERING) == TP + 1 and log.count(DEGRADED) == TP + 1
    assert log.index(DEGRADED) < log.index(RECOVERING) < log.index(REREGISTERED)


@pytest.mark.slow
def test_a_sidecar_back_before_a_ping_failed_is_never_told_and_fails_every_load(tmp_path: Path) -> None:
    """The race (LMCache #4642): no ping fails while the server restarts, so neither engine registers again; the new
    server rejects their stores, and their loads of what another engine stored there fail: a 500 under vLLM's
    default `fail` (a stream: 200 and one error event), a recomputed answer under `recompute`."""
    heartbeat = 300.0  # more than a restart takes (20-40 s on two busy cores): no ping times out meanwhile
    details = "--enable-prompt-tokens-details"
    prompt = list(range(2000, 2600))
    with lmcache_server(tmp_path, "glm53") as server:
        connector = heartbeat_every(heartbeat, server.port)
        recompute = with_load_failure_policy(connector, "recompute")
        with (
            engine(tmp_path, GLM53_MODEL, "glm53", TP, server.port, details, name="fail", connector=connector) as fail,
            engine(tmp_path, GLM53_MODEL, "glm53", TP, server.port, details, name="re", connector=recompute) as redo,
        ):
            for pair in (fail, redo):
                assert cached_after_priming(pair.base_url, 600, "warm") == 512  # starts the heartbeats
            server.process.kill()
            with serving(server.sidecar, tmp_path / "lmcache-restarted.log") as restarted:
                assert cached_after_priming(fail.base_url, 600, "race") == 0
                restarted.process.wait_for("Rejecting STORE for unregistered GPU instance ID")
                fail.process.wait_for("Something went wrong when processing the store request for request_id=")
                # Another engine, registered with the new server, stores a prompt both look up; while it is
                # registered, the server answers lookups for its model and world size.
                with engine(tmp_path, GLM53_MODEL, "glm53", TP, server.port, name="fresh") as fresh:
                    complete(fresh.base_url, prompt, "shared")
                    body: dict[str, Any] = {"prompt": prompt, "max_tokens": 2, "cache_salt": "shared"}
                    assert http(f"{fail.base_url}/v1/completions", body) == (500, INTERNAL_ERROR)
                    restarted.process.wait_for("Rejecting RETRIEVE for unregistered GPU instance ID")
                    fail.process.wait_for(
                        "Failing 1 request(s) due to KV load failure (failure_policy=fail, 512 tokens affected)"
                    )
                    fail.process.wait_for("failed with an internal error during generation")
                    status, text = http(f"{fail.base_url}/v1/completions", {**body, "stream": True})
                    error_event = openai_api.stream_error_event(chat=False).decode()
                    assert (status, text) == (200, error_event + "data: [DONE]\n\n")
                    reply = complete(redo.base_url, prompt, "shared")
                    assert reply["usage"]["prompt_tokens_details"]["cached_tokens"] == 0  # recomputed from token 0
                    redo.process.wait_for(
                        "Recovered from KV load failure: 1 request(s) rescheduled (512 tokens affected)."
                    )
                    redo.process.wait_for("Bypassing LMCache for request")
                for pair in (fail, redo):
                    assert http(f"{pair.base_url}/health")[0] == 200
                    assert DEGRADED not in pair.process.text() and REREGISTERED not in pair.process.text()


@pytest.mark.slow
def test_a_retrieve_in_flight_when_the_server_freezes_fails_once_a_ping_has(tmp_path: Path) -> None:
    """The stand-in's KV path in this process: a frozen server never answers the RETRIEVE, which no deadline of the
    stand-in's ends; the heartbeat's failed ping does (vllm_multi_process_adapter.py:2073-2108), within two ping
    periods, and the server back registers the workers again."""
    heartbeat = 1.0
    segments = set(Path("/dev/shm").glob(f"lmcache_kv_{os.getpid()}_*"))
    with lmcache_server(tmp_path, "glm53") as server:
        kv = KVClient(parse_connector_config(heartbeat_every(heartbeat, server.port)), threading.Event())
        try:
            assert kv.chunk_size() == 256
            kv.connect(KVLayout(GLM53_MODEL, TP, (64,), 64, 1024))
            tokens = list(range(600))
            assert kv.lookup(tokens, "s", False, "first") == 0
            kv.store(tokens, "s", (0, 512), "first")
            kv.end_session("first")
            assert kv.lookup(tokens, "s", False, "second") == 512
            os.killpg(server.process.proc.pid, signal.SIGSTOP)
            frozen = time.monotonic()
            assert not kv.retrieve(tokens, "s", (0, 512), 0, "second")
            assert time.monotonic() - frozen < 2 * heartbeat + 10  # a ping period and its timeout; a busy machine
            os.killpg(server.process.proc.pid, signal.SIGCONT)
            kv.end_session("second")
            ids = iter(range(1000))

            def loads_again() -> bool:
                """Misses until the scheduler's next ping succeeds; a hit before the workers' has registered them
                again still fails to load (each adapter has its own heartbeat)."""
                request_id = f"again-{next(ids)}"
                loaded = kv.lookup(tokens, "s", False, request_id) == 512 and kv.retrieve(
                    tokens, "s", (0, 512), 0, request_id
                )
                kv.end_session(request_id)
                return loaded

            poll(loads_again, "a load after the thaw")
        finally:
            os.killpg(server.process.proc.pid, signal.SIGCONT)
            kv.close()
            for segment in set(Path("/dev/shm").glob(f"lmcache_kv_{os.getpid()}_*")) - segments:
                segment.unlink()  # LMCache leaves the workers' SHM segments behind (so does the real engine)
