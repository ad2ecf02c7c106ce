"""`glm53 mock vllm` with `glm53 mock lmcache` as real processes: start-up lines, handshake failures, cache hits."""

from __future__ import annotations

import json
import socket
import statistics
import urllib.request
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest
from mockproc import (
    FLASH_MODEL,
    GLM53_MODEL,
    MockProcess,
    Pair,
    PairFactory,
    connector_json,
    free_port,
    http,
    metric,
    running,
    start_lmcache,
    vllm_args,
)

from glm53.logparse import (
    AttentionBlockSize,
    ChunkSizeRejected,
    EngineDied,
    NegotiatedChunk,
    ResolvedGeometry,
    ServerUnreachable,
)


@pytest.fixture
def pair(tmp_path: Path) -> Iterator[PairFactory]:
    """Start a mock LMCache + mock vLLM pair on free loopback ports; both are stopped afterwards."""
    started: list[MockProcess] = []

    def start(
        model: str,
        profile: str,
        tp: int,
        lmcache_flags: Sequence[str],
        vllm_flags: Sequence[str] = (),
        env: dict[str, str] | None = None,
    ) -> Pair:
        lmcache, port, _, prometheus_port = start_lmcache(tmp_path, *lmcache_flags)
        started.append(lmcache)
        api_port = free_port()
        vllm = MockProcess(vllm_args(model, profile, tp, api_port, port, *vllm_flags), tmp_path / "vllm.log", env)
        started.append(vllm)
        vllm.wait_for("Application startup complete.")
        return Pair(lmcache, vllm, f"http://127.0.0.1:{api_port}", f"http://127.0.0.1:{prometheus_port}/metrics")

    yield start
    for process in reversed(started):
        process.stop()


DEV_MODE = {"VLLM_SERVER_DEV_MODE": "1"}
L1 = ("--l1-size-gb", "1", "--eviction-policy", "LRU")
FLASH_GROUPS = (1152, 1152, 1152, 1152, 1152, 0)


def _complete(base_url: str, prompt: list[int], salt: str = "", **extra: object) -> dict[str, Any]:
    body = {"prompt": prompt, "max_tokens": 4, "temperature": 0, "logprobs": 1, "cache_salt": salt, **extra}
    status, reply = http(f"{base_url}/v1/completions", body)
    assert status == 200, reply
    assert isinstance(reply, dict)
    return reply


def _cached(reply: dict[str, Any]) -> int:
    return int(reply["usage"]["prompt_tokens_details"]["cached_tokens"])


def _first_logprob(reply: dict[str, Any]) -> float:
    return float(reply["choices"][0]["logprobs"]["token_logprobs"][0])


def _reset(base_url: str, external: bool = False) -> None:
    query = "?reset_external=true" if external else ""
    assert http(f"{base_url}/reset_prefix_cache{query}", {}) == (200, {"success": True})


@pytest.mark.parametrize(
    ("model", "profile", "tp", "generation", "chunk_flags", "negotiated"),
    [
        (FLASH_MODEL, "glm53-flash", 4, "released", ["--chunk-size", "1152"], None),
        (FLASH_MODEL, "glm53-flash", 4, "negotiating", [], (1152, 256, 1152)),
        (GLM53_MODEL, "glm53", 8, "released", ["--chunk-size", "256"], None),
        (GLM53_MODEL, "glm53", 8, "negotiating", ["--chunk-size", "256"], None),
    ],
)
def test_starts_and_logs_the_startup_records(
    pair: PairFactory,
    model: str,
    profile: str,
    tp: int,
    generation: str,
    chunk_flags: list[str],
    negotiated: tuple[int, int, int] | None,
) -> None:
    started = pair(model, profile, tp, [*L1, "--separate-object-groups", "--generation", generation, *chunk_flags])
    records = started.vllm.records()
    blocks = [r for r in records if isinstance(r, AttentionBlockSize)]
    geometry = [r for r in records if isinstance(r, ResolvedGeometry)]
    groups, scheduler_block = (FLASH_GROUPS, 1152) if profile == "glm53-flash" else ((64,), 64)
    assert [b.tokens for b in blocks] == ([1152] if profile == "glm53-flash" else [])
    assert [g.origin.rank for g in geometry] == list(range(tp))
    assert {(g.group_tokens_per_block, g.scheduler_block_size, g.cache_model_name) for g in geometry} == {
        (groups, scheduler_block, model)
    }
    assert not [r for r in records if isinstance(r, EngineDied | ChunkSizeRejected)]
    lmcache_records = [r for r in started.lmcache.records() if isinstance(r, NegotiatedChunk)]
    assert [(r.resolved, r.configured_min, r.alignment) for r in lmcache_records] == (
        [negotiated] if negotiated else []
    )
    assert http(f"{started.base_url}/health")[0] == 200
    status, models = http(f"{started.base_url}/v1/models")
    assert status == 200 and models["data"][0]["id"] == model


def test_released_lmcache_refuses_the_default_chunk_size_for_flash(tmp_path: Path) -> None:
    lmcache, port, _, _ = start_lmcache(tmp_path, *L1, "--separate-object-groups")
    try:
        process = MockProcess(vllm_args(FLASH_MODEL, "glm53-flash", 4, free_port(), port), tmp_path / "vllm.log")
        assert process.wait_exit() == 1
        process.stop()
    finally:
        lmcache.stop()
    records = process.records()
    rejected = [r for r in records if isinstance(r, ChunkSizeRejected)]
    assert [(r.chunk_size, r.required_multiple) for r in rejected] == [(256, 1152)]
    assert "ValueError: LMCache chunk size 256 must be a multiple of engine group 0 tokens_per_block 1152" in (
        process.text()
    )
    assert [r.reason for r in records if isinstance(r, EngineDied)][:1] == ["EngineCore failed to start"]
    assert not [r for r in records if isinstance(r, ResolvedGeometry)]


def test_unreachable_lmcache_is_reported_within_the_connector_timeout(tmp_path: Path) -> None:
    dead_port = free_port()
    args = vllm_args(FLASH_MODEL, "glm53-flash", 4, free_port(), dead_port)
    args[args.index("--kv-transfer-config") + 1] = connector_json(dead_port, **{"lmcache.mp.mq_timeout": 0.5})
    with running(args, tmp_path / "vllm.log") as process:
        assert process.wait_exit() == 1
        records = process.records()
    assert [r.url for r in records if isinstance(r, ServerUnreachable)] == [f"tcp://127.0.0.1:{dead_port}"]
    assert f"Cannot reach the LMCache MP server at 'tcp://127.0.0.1:{dead_port}' within 0.5s." in process.text()
    assert any(isinstance(r, EngineDied) for r in records)


def test_flash_cached_request_gets_the_strict_prefix_bound(pair: PairFactory) -> None:
    started = pair(
        FLASH_MODEL, "glm53-flash", 4, [*L1, "--chunk-size", "1152", "--separate-object-groups"], [], DEV_MODE
    )
    prompt = list(range(8507))
    assert _cached(_complete(started.base_url, prompt)) == 0
    _reset(started.base_url)
    reply = _complete(started.base_url, prompt)
    assert _cached(reply) == 8064  # seed 000: 8064 of 8507 served from LMCache
    _, text = http(f"{started.base_url}/metrics")
    assert metric(text, "vllm:external_prefix_cache_hits_total") == 8064
    assert metric(text, "vllm:external_prefix_cache_queries_total") == 2 * 8507
    assert metric(text, "vllm:prefix_cache_hits_total") == 0
    assert metric(text, "vllm:prompt_tokens_total") == 2 * 8507
    assert metric(text, "vllm:time_to_first_token_seconds_count") == 2
    assert metric(text, "vllm:e2e_request_latency_seconds_count") == 2
    _, lmcache_text = http(started.lmcache_metrics_url)
    assert metric(lmcache_text, "lmcache_mp_lookup_hit_tokens_total") == 8064
    # A second request without a reset is served by vLLM's own prefix cache, again up to L-1 in whole blocks.
    assert _cached(_complete(started.base_url, prompt)) == 8064
    _, text = http(f"{started.base_url}/metrics")
    assert metric(text, "vllm:prefix_cache_hits_total") == 8064
    # A different cache_salt never matches; reset_external also empties LMCache.
    assert _cached(_complete(started.base_url, prompt, salt="other")) == 0
    _reset(started.base_url, external=True)
    assert _cached(_complete(started.base_url, prompt)) == 0


def test_glm53_stores_whole_chunks(pair: PairFactory) -> None:
    started = pair(GLM53_MODEL, "glm53", 8, [*L1, "--chunk-size", "256"], [], DEV_MODE)
    prompt = list(range(5040))
    _complete(started.base_url, prompt)
    _reset(started.base_url)
    assert _cached(_complete(started.base_url, prompt)) == 4864  # seed 001: 5040 tokens at C = 256


def _cold_then_cached(base_url: str, prompt: list[int], runs: int) -> tuple[list[float], set[int], list[float]]:
    """Seed 000's protocol in small: `runs` cold requests (unique salts), prime, then `runs` requests each after a
    local prefix-cache reset; returns the cold log-probs, the cached-token counts seen, and the cached log-probs."""
    cold = [_first_logprob(_complete(base_url, prompt, salt=f"cold-{i}")) for i in range(runs)]
    _complete(base_url, prompt)
    hits, cached = set(), []
    for _ in range(runs):
        _reset(base_url)
        reply = _complete(base_url, prompt)
        hits.add(_cached(reply))
        cached.append(_first_logprob(reply))
    return cold, hits, cached


def test_recovery_mismatch_fault_credits_the_full_prompt_and_shifts_the_logprob(pair: PairFactory) -> None:
    started = pair(
        FLASH_MODEL, "glm53-flash", 4, [*L1, "--chunk-size", "1152"], ["--fault", "recovery-mismatch"], DEV_MODE
    )
    cold, hits, cached = _cold_then_cached(started.base_url, list(range(2 * 1152)), runs=8)
    assert hits == {2 * 1152}  # the strict-prefix bound would be 1152
    assert statistics.mean(cached) < statistics.mean(cold) - 0.25


def test_without_the_fault_cold_and_cached_logprobs_share_a_distribution(pair: PairFactory) -> None:
    started = pair(FLASH_MODEL, "glm53-flash", 4, [*L1, "--chunk-size", "1152"], ["--seed", "3"], DEV_MODE)
    cold, hits, cached = _cold_then_cached(started.base_url, list(range(2 * 1152)), runs=16)
    assert hits == {1152}
    assert abs(statistics.mean(cached) - statistics.mean(cold)) < 0.06  # noise sd 0.05, 16 runs each


def test_reset_endpoint_is_absent_without_dev_mode(pair: PairFactory) -> None:
    started = pair(GLM53_MODEL, "glm53", 8, [*L1], [], {"VLLM_SERVER_DEV_MODE": "0"})
    assert http(f"{started.base_url}/reset_prefix_cache?reset_external=true", {})[0] == 404


def test_chat_and_streaming_completions(pair: PairFactory) -> None:
    started = pair(GLM53_MODEL, "glm53", 8, [*L1])
    body = {"messages": [{"role": "user", "content": "what is the total"}], "logprobs": True, "top_logprobs": 2}
    status, reply = http(f"{started.base_url}/v1/chat/completions", body)
    assert status == 200
    content = reply["choices"][0]["logprobs"]["content"]
    assert content[0]["top_logprobs"][0]["logprob"] == content[0]["logprob"]
    assert reply["usage"]["prompt_tokens"] == 4
    stream_body = {"prompt": "a b c", "max_tokens": 3, "stream": True, "stream_options": {"include_usage": True}}
    request = urllib.request.Request(
        f"{started.base_url}/v1/completions", json.dumps(stream_body).encode(), {"Content-Type": "application/json"}
    )
    with urllib.request.urlopen(request, timeout=10) as response:
        events = [line[6:] for line in response.read().decode().splitlines() if line.startswith("data: ")]
    assert events[-1] == "[DONE]"
    chunks = [json.loads(e) for e in events[:-1]]
    assert len([c for c in chunks if c["choices"]]) == 3
    assert chunks[-1]["usage"]["completion_tokens"] == 3


def test_hybrid_profile_without_prefix_caching_fails_like_vllm(tmp_path: Path) -> None:
    lmcache, port, _, _ = start_lmcache(tmp_path, *L1)
    try:
        args = vllm_args(FLASH_MODEL, "glm53-flash", 4, free_port(), port, "--no-enable-prefix-caching")
        with running(args, tmp_path / "vllm.log") as process:
            assert process.wait_exit() == 1
    finally:
        lmcache.stop()
    assert "ValueError: GLM-5.3-Flash is a hybrid (Mamba / linear-attention) model" in process.text()
    assert "pass --enable-prefix-caching" in process.text()


def test_a_taken_api_port_fails_at_once_with_one_line(tmp_path: Path) -> None:
    with socket.socket() as blocker:
        blocker.bind(("127.0.0.1", 0))
        blocker.listen()
        port = blocker.getsockname()[1]
        with running(vllm_args(GLM53_MODEL, "glm53", 8, port, free_port()), tmp_path / "vllm.log") as process:
            assert process.wait_exit() == 1
    assert process.lines() == [
        f"glm53 mock: error: cannot bind the vLLM API server to 127.0.0.1:{port}: Address already in use; "
        "stop the process using it or choose another --port"
    ]


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (["--gpu-memory-utilizaton", "0.9"], "unrecognized arguments: --gpu-memory-utilizaton"),
        (["--fault", "bogus"], "argument --fault: invalid choice: 'bogus'"),
        (["--limit-mm-per-prompt", "image=0"], "argument --limit-mm-per-prompt: invalid JSON"),
    ],
)
def test_rejects_bad_flags(tmp_path: Path, extra: list[str], message: str) -> None:
    with running(vllm_args(GLM53_MODEL, "glm53", 8, free_port(), free_port(), *extra), tmp_path / "v.log") as process:
        assert process.wait_exit() == 2
    assert message in process.text()


def test_a_wrong_connector_is_a_one_line_error(tmp_path: Path) -> None:
    args = vllm_args(GLM53_MODEL, "glm53", 8, free_port(), free_port())
    args[args.index("--kv-transfer-config") + 1] = '{"kv_connector":"NixlConnector"}'
    with running(args, tmp_path / "vllm.log") as process:
        assert process.wait_exit() == 2
    assert process.lines() == [
        "glm53 mock: error: --kv-transfer-config kv_connector must be 'LMCacheMPConnector' (the mock emulates only "
        "LMCache's MP connector), got 'NixlConnector'"
    ]


def test_lmcache_dying_mid_run_turns_hits_into_misses_without_hanging(pair: PairFactory) -> None:
    started = pair(GLM53_MODEL, "glm53", 8, [*L1], [], DEV_MODE)
    prompt = list(range(600))
    _complete(started.base_url, prompt)
    assert started.lmcache.stop() == 0
    _reset(started.base_url)
    assert _cached(_complete(started.base_url, prompt)) == 0
    started.vllm.wait_for("did not answer lookup within")
    assert http(f"{started.base_url}/health")[0] == 200


@pytest.mark.parametrize("phase", ["loading", "waiting for LMCache"])
def test_sigterm_during_startup_exits_cleanly(tmp_path: Path, phase: str) -> None:
    dead_port = free_port()
    args = vllm_args(GLM53_MODEL, "glm53", 8, free_port(), dead_port)
    args[args.index("--kv-transfer-config") + 1] = connector_json(dead_port, **{"lmcache.mp.mq_timeout": 300})
    if phase == "loading":
        args += ["--load-seconds", "300"]
    with running(args, tmp_path / "vllm.log") as process:
        process.wait_for("non-default args" if phase == "loading" else "Loading weights took")
        assert process.stop() == 0
    assert not [r for r in process.records() if isinstance(r, ServerUnreachable | EngineDied)]
