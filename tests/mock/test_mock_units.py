"""The mocks' pure parts: handshake of both LMCache generations, the L1 store's policies, keys, the model, the API."""

from __future__ import annotations

import statistics

import pytest

from glm53.errors import Glm53Error
from glm53.mock import model, openai_api, protocol
from glm53.mock.connector import parse_connector_config
from glm53.mock.engine import RECOVERY_MISMATCH, external_lookup_limit
from glm53.mock.handshake import handshake
from glm53.mock.store import ChunkStore, StoreResult
from glm53.mock.vllm_server import engine_groups, unified_block_size
from glm53.profiles import get_profile
from glm53.validate.prompts import document_qa_prompt

FLASH_GROUPS = [1152, 1152, 1152, 1152, 1152, 0]


def test_released_refuses_a_chunk_size_that_does_not_fit_with_the_0_5_6_text() -> None:
    result = handshake("released", 256, FLASH_GROUPS)
    assert not result.accepted
    assert result.error == "LMCache chunk size 256 must be a multiple of engine group 0 tokens_per_block 1152"


def test_released_keeps_a_fitting_chunk_size_and_ignores_scratch_groups() -> None:
    assert handshake("released", 1152, FLASH_GROUPS) == handshake("released", 1152, [1152])
    assert handshake("released", 1152, FLASH_GROUPS).chunk_size == 1152


def test_negotiating_rounds_the_minimum_up_to_the_alignment() -> None:
    assert handshake("negotiating", 256, FLASH_GROUPS).chunk_size == 1152
    assert handshake("negotiating", 256, [64]).chunk_size == 256  # unchanged: no Negotiated line
    assert handshake("negotiating", 1200, FLASH_GROUPS).chunk_size == 2304


def test_unified_block_size_is_measured_at_tp4_and_scaled_elsewhere() -> None:
    flash = get_profile("glm53-flash")
    assert unified_block_size(flash, 4) == 1152
    assert unified_block_size(flash, 8) == 2304
    assert engine_groups(flash, 4) == tuple(FLASH_GROUPS)
    assert engine_groups(get_profile("glm53"), 8) == (64,)


def test_lru_evicts_the_least_recently_used_chunk() -> None:
    store = ChunkStore(capacity_bytes=30, policy="LRU")
    assert store.put("", ["a", "b", "c"], 10).written == 3
    assert store.longest_prefix(["a"]) == 1  # a is now the most recently used
    result = store.put("", ["d"], 10)
    assert (result.written, result.evicted) == (1, 1)
    assert "b" not in store and "a" in store
    assert store.used_bytes == 30


def test_isolated_lru_only_evicts_the_writers_own_chunks() -> None:
    store = ChunkStore(capacity_bytes=20, policy="IsolatedLRU")
    store.put("tenant-a", ["a1"], 10)
    store.put("tenant-b", ["b1"], 10)
    assert store.put("tenant-c", ["c1"], 10).dropped == 1  # nothing of its own to evict
    assert store.put("tenant-a", ["a2"], 10).evicted == 1
    assert "b1" in store and "a2" in store and "a1" not in store


def test_noop_never_evicts_and_drops_what_does_not_fit() -> None:
    store = ChunkStore(capacity_bytes=10, policy="noop")
    assert store.put("", ["a", "b"], 10) == StoreResult(written=1, evicted=0, dropped=1)
    assert store.clear() == 1 and store.used_bytes == 0


def test_prefix_keys_name_whole_prefixes_and_depend_on_the_salt() -> None:
    tokens = list(range(10))
    keys = protocol.prefix_keys("", tokens, 4)
    assert len(keys) == 2
    assert protocol.prefix_keys("", [*tokens[:8], 99], 4) == keys
    assert protocol.prefix_keys("", tokens, 4, limit=7) == keys[:1]
    assert protocol.prefix_keys("salt", tokens, 4)[0] != keys[0]


def test_strict_prefix_lookup_reserves_the_last_token_unless_the_fault_is_injected() -> None:
    assert external_lookup_limit(8507, strict_prefix=True, fault=None) == 8506
    assert external_lookup_limit(2304, strict_prefix=True, fault=RECOVERY_MISMATCH) == 2304
    assert external_lookup_limit(5040, strict_prefix=False, fault=None) == 5040


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
        ({"prompt": "hi", "max_tokens": 0}, 400, "max_tokens must be an integer >= 1"),
        ({"prompt": "hi", "logprobs": 9}, 400, "logprobs must be an integer >= 0 and <= 5"),
        ({"prompt": "hi", "cache_salt": 1}, 400, "cache_salt must be a string"),
        ({"prompt": list(range(40))}, 400, "maximum context length is 50 tokens"),
    ],
)
def test_bad_requests_get_vllm_error_bodies(body: dict[str, object], status: int, message: str) -> None:
    with pytest.raises(openai_api.ApiError) as caught:
        openai_api.parse_request(body, chat=False, served_model="m", max_model_len=50)
    assert caught.value.status == status
    assert message in caught.value.body()["error"]["message"]


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
