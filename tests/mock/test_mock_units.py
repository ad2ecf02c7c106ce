"""The engine stand-in's pure parts: the connector's vLLM-side rules, the log format, caches, the model, the API; and
how tests run one server alone (`glm53.testing.sidecar.serving`)."""

from __future__ import annotations

import logging
import signal
import statistics
import sys
from pathlib import Path

import pytest

from glm53.errors import Glm53Error
from glm53.mock import model, openai_api
from glm53.mock.connector import KVEventsConfig, parse_connector_config, parse_kv_events_config
from glm53.mock.engine import Outcome, tokens_to_load
from glm53.mock.local_cache import LocalPrefixCache, block_hashes
from glm53.mock.logs import VllmFormatter
from glm53.mock.runtime import stop_on_signals
from glm53.mock.vllm_server import chunk_misfit, engine_groups, unified_block_size
from glm53.pod.loopback import free_ports
from glm53.profiles import get_profile
from glm53.testing.sidecar import serving
from glm53.validate.prompts import document_qa_prompt

FLASH_GROUPS = (1152, 1152, 1152, 1152, 1152, 0)


@pytest.mark.parametrize(
    ("prompt", "lmcache_hit", "loaded"),
    [
        (8507, 8064, 8064),  # seed 000: GLM-5.3-Flash, strict prefix (the adapter looks up L-1, whole chunks)
        (2304, 1152, 1152),  # L = 2C: L-1 looked up, one chunk
        (256, 256, 255),  # GLM-5.3 full-prompt hit: one token fewer (connector:1341-1346)
        (512, 512, 511),
        (768, 768, 767),
        (8507, 8448, 8448),
        (5040, 4864, 4864),
    ],
)
def test_the_connectors_vllm_side_rules_give_the_seeds_numbers(prompt: int, lmcache_hit: int, loaded: int) -> None:
    assert tokens_to_load(lmcache_hit, 0, prompt) == loaded


def test_tokens_to_load_subtracts_what_vllm_computed_itself() -> None:
    assert tokens_to_load(2304, 1152, 3000) == 1152
    assert tokens_to_load(2304, 2304, 2304) == 0  # nothing left to load; never negative
    assert tokens_to_load(0, 0, 100) == 0


def test_chunk_misfit_names_the_first_group_like_the_0_5_6_connector() -> None:
    message = "LMCache chunk size 256 must be a multiple of group 0 tokens_per_block 1152"
    assert chunk_misfit(256, FLASH_GROUPS) == message
    assert chunk_misfit(1152, FLASH_GROUPS) is None  # the scratch group (0) never constrains
    assert chunk_misfit(256, (64,)) is None


def test_unified_block_size_is_measured_at_tp4_and_scaled_elsewhere() -> None:
    flash = get_profile("glm53-flash")
    assert unified_block_size(flash, 4) == 1152
    assert engine_groups(flash, 4) == FLASH_GROUPS
    assert engine_groups(get_profile("glm53"), 8) == (64,)


def test_vllm_formatter_repeats_the_prefix_on_every_line() -> None:
    record = logging.LogRecord("vllm", logging.ERROR, "core.py", 1584, "first\nsecond", None, None)
    record.created = 0.0
    record.process = 7
    record.vllm_process_name = "EngineCore_DP0"
    lines = VllmFormatter().format(record).split("\r\n")
    assert [line.split("] ", 1)[1] for line in lines] == ["first", "second"]
    assert {line.split(" ", 3)[:2] == ["(EngineCore_DP0", "pid=7)"] for line in lines} == {True}
    assert all(" ERROR " in line and "[core.py:1584]" in line for line in lines)


def test_local_cache_keys_whole_prefixes_per_salt_and_evicts_a_requests_tail_first() -> None:
    tokens = list(range(10))
    assert len(block_hashes("a", tokens, 4)) == 2
    assert block_hashes("a", tokens, 4) != block_hashes("b", tokens, 4)
    assert block_hashes("a", tokens, 4, limit=7) == block_hashes("a", tokens, 4)[:1]
    cache = LocalPrefixCache(capacity=2)
    cache.put(["x", "y"])
    assert cache.longest_prefix(["x", "y", "z"]) == 2
    # vLLM frees a request's blocks in reverse, so its tail y goes before its prefix x (this test used to expect x to
    # go first, the head-first order vLLM does not have; tests/mock/test_local_cache.py pins vLLM's order).
    cache.put(["z"])
    assert cache.longest_prefix(["x"]) == 1 and cache.longest_prefix(["y"]) == 0 and cache.longest_prefix(["z"]) == 1


def test_serving_yields_a_healthy_server_and_stops_it(tmp_path: Path) -> None:
    """`serving` (how tests and benchmarks run the chart's sidecar alone) waits for /healthcheck, then stops the child;
    a static file server stands in for `lmcache server` here."""
    (tmp_path / "healthcheck").write_text("ok")
    (port,) = free_ports(1)
    argv = [sys.executable, "-m", "http.server", str(port), "--bind", "127.0.0.1", "--directory", str(tmp_path)]
    with serving(argv, {}, port, tmp_path / "server.log", 30.0) as process:
        assert process.poll() is None
    assert process.returncode is not None


def test_serving_names_a_server_that_exits_in_one_line(tmp_path: Path) -> None:
    """The child gets `env` over this process's environment; its exit fails at once, with its last log lines."""
    argv = [sys.executable, "-c", "import os, sys; print(os.environ['REFUSAL'], os.environ['PATH'] != ''); sys.exit(2)"]
    env = {"REFUSAL": "lmcache server: error: unrecognized arguments: --nope"}
    with pytest.raises(Glm53Error) as caught, serving(argv, env, free_ports(1)[0], tmp_path / "server.log", 30.0):
        pass
    assert caught.value.message == (
        "lmcache server exited with 2: lmcache server: error: unrecognized arguments: --nope True"
    )


def test_usage_reports_cached_tokens_only_with_prompt_tokens_details() -> None:
    generation = model.generate([1, 2], 1, 0, 0)
    outcome = Outcome(generation, 300, 64, 192, 0.01)
    details = {"cached_tokens": 256, "created_cache_tokens": None, "multimodal_tokens": None}
    assert openai_api.usage(outcome, True)["prompt_tokens_details"] == details
    assert openai_api.usage(outcome, False)["prompt_tokens_details"] is None


def test_first_token_logprobs_are_noisy_around_the_seed_value_and_reproducible() -> None:
    tokens = list(range(100))
    values = [model.generate(tokens, 2, seed=7, counter=i).logprobs[0] for i in range(200)]
    assert values == [model.generate(tokens, 2, seed=7, counter=i).logprobs[0] for i in range(200)]
    assert -0.97 < statistics.mean(values) < -0.89
    assert 0.03 < statistics.stdev(values) < 0.07
    shifted = model.generate(tokens, 2, seed=7, counter=0, shift=model.RECOVERY_MISMATCH_SHIFT).logprobs[0]
    assert shifted == pytest.approx(values[0] - 0.4)


def test_generated_text_is_deterministic_per_prompt() -> None:
    assert model.generate([1, 2, 3], 5, 0, 1).words == model.generate([1, 2, 3], 5, 9, 2).words
    assert model.tokenize("one  two\nthree") == model.tokenize("one two three")
    assert len(model.tokenize("one two three")) == 3


def test_connector_config_reads_the_lmcache_extra_keys() -> None:
    config = parse_connector_config(
        '{"kv_connector":"LMCacheMPConnector","kv_connector_extra_config":'
        '{"lmcache.mp.host":"tcp://127.0.0.1","lmcache.mp.port":6000,"lmcache.mp.mq_timeout":2}}'
    )
    assert (config.url, config.mq_timeout, config.heartbeat_interval) == ("tcp://127.0.0.1:6000", 2.0, 10.0)
    assert parse_connector_config('{"kv_connector":"LMCacheMPConnector"}').url == "tcp://localhost:5555"


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("{", "--kv-transfer-config is not valid JSON"),
        ('{"kv_connector":"NixlConnector"}', "kv_connector must be 'LMCacheMPConnector'"),
        ('{"kv_connector":"LMCacheMPConnector","kv_connector_extra_config":{"lmcache.mp.port":-1}}', "positive"),
    ],
)
def test_connector_config_errors_are_one_line(text: str, message: str) -> None:
    with pytest.raises(Glm53Error, match=message):
        parse_connector_config(text)


@pytest.mark.parametrize(
    ("body", "status", "message"),
    [
        ({"prompt": 5}, 400, "prompt must be a string or a list of non-negative integer token ids"),
        ({"prompt": "hi", "model": "other"}, 404, "The model `other` does not exist."),
        ({"prompt": "hi", "max_tokens": 0}, 400, "max_tokens must be at least 1, got 0."),
        ({"prompt": "hi", "max_tokens": 51}, 400, "max_tokens=51 cannot be greater than max_model_len=50."),
        ({"prompt": "hi", "logprobs": 9}, 400, "logprobs must be an integer >= 0 and <= 5"),
        ({"prompt": "hi", "cache_salt": 1}, 400, "cache_salt must be a string"),
        ({"prompt": "hi", "cache_salt": "a@b"}, 400, "cache_salt must be at most 128 characters without '@'"),
        ({"prompt": "hi", "cache_salt": "x" * 129}, 400, "cache_salt must be at most 128 characters"),
        ({"prompt": list(range(60))}, 400, "maximum context length is 50 tokens. However, your prompt contains 60"),
        ({"prompt": "a " * 60}, 400, "However, your prompt contains at least 51 input tokens"),
        ({"prompt": list(range(50))}, 400, "max_tokens must be at least 1, got 0."),
    ],
)
def test_bad_requests_get_vllm_error_bodies(body: dict[str, object], status: int, message: str) -> None:
    with pytest.raises(openai_api.ApiError) as caught:
        openai_api.parse_request(body, chat=False, served_model="m", max_model_len=50)
    assert caught.value.status == status
    assert message in caught.value.body()["error"]["message"]


def test_max_tokens_are_capped_by_what_the_context_has_left() -> None:
    """vLLM's get_max_tokens: 40 prompt tokens in a context of 50 leave 10 of the default 16."""
    request = openai_api.parse_request({"prompt": list(range(40))}, chat=False, served_model="m", max_model_len=50)
    assert request.prompt.max_tokens == 10


def test_chat_messages_are_joined_into_one_prompt() -> None:
    request = openai_api.parse_request(
        {"messages": [{"role": "system", "content": "a b"}, {"role": "user", "content": "c"}], "logprobs": True},
        chat=True,
        served_model="m",
        max_model_len=100,
    )
    assert request.prompt.tokens == tuple(model.tokenize("a b c"))
    assert request.top_logprobs == 0


def test_answers_the_planted_document_question() -> None:
    prompt = document_qa_prompt()
    assert model.extract_answer(prompt.text) == prompt.answer
    generation = model.generate(model.tokenize(prompt.text), 4, 0, 0, answer=model.extract_answer(prompt.text))
    assert generation.words[0] == prompt.answer and len(generation.words) == 4


def test_no_answer_without_a_question_or_a_stated_value() -> None:
    assert model.extract_answer("the code is 12. nothing asked here") is None
    assert model.extract_answer("what is the code? nobody said") is None


def test_bit_exact_profiles_get_no_noise() -> None:
    tokens = [5, 6, 7]
    values = {model.generate(tokens, 1, seed=3, counter=i, noise_sd=0.0).logprobs[0] for i in range(50)}
    assert len(values) == 1


def test_kv_events_config_follows_vllms_defaults() -> None:
    """vllm/config/kv_events.py:14-47: publisher defaults to zmq when enabled, endpoint tcp://*:5557, topic ""."""
    assert parse_kv_events_config('{"enable_kv_cache_events":true}') == KVEventsConfig("tcp://*:5557", "", 100_000)
    assert parse_kv_events_config('{"enable_kv_cache_events":false,"publisher":"zmq"}') is None
    assert parse_kv_events_config('{"enable_kv_cache_events":true,"publisher":"null"}') is None
    with pytest.raises(Glm53Error, match="publisher must be 'zmq' or 'null', got 'kafka'"):
        parse_kv_events_config('{"enable_kv_cache_events":true,"publisher":"kafka"}')


def test_a_second_stop_signal_inside_the_first_does_not_set_the_event_again() -> None:
    """SIGTERM to the process group and SIGTERM forwarded by `glm53 supervise` arrive together; a handler run inside the
    first one's `Event.set()` must not set it again (that re-enters the event's lock and hangs until SIGKILL)."""
    previous = {sig: signal.getsignal(sig) for sig in (signal.SIGTERM, signal.SIGINT)}
    try:
        stop = stop_on_signals()
        handler = signal.getsignal(signal.SIGTERM)
        assert callable(handler)
        setting = stop.set
        sets = []

        def set_interrupted_by_the_second_signal() -> None:
            sets.append("set")
            if len(sets) == 1:
                handler(signal.SIGTERM, None)
            setting()

        stop.set = set_interrupted_by_the_second_signal  # type: ignore[method-assign]
        handler(signal.SIGTERM, None)
        assert stop.is_set() and sets == ["set"]
    finally:
        for sig, old in previous.items():
            signal.signal(sig, old)
