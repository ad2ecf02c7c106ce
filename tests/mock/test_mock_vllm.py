"""`glm53 mock vllm` against the REAL `lmcache server`: start-up lines, chunk misfit, hits counted by the server.

The expected numbers are the seeds' and the 0.5.6 connector's: GLM-5.3-Flash at C = 1152 serves 8064 of an 8507-token
prompt (strict prefix, L-1 looked up); GLM-5.3 at C = 256 serves 255 of 256 (full-prompt hit: one token fewer).
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path

import pytest

from glm53.mock import logs
from tests.support.mockproc import (
    DEADLINE,
    FLASH_MODEL,
    GLM53_MODEL,
    Process,
    Server,
    cached_after_priming,
    complete,
    connector_json,
    engine,
    free_port,
    glm53,
    http,
    lmcache_server,
    metric,
    reset,
    vllm_args,
)

pytestmark = pytest.mark.slow

FLASH_GROUPS = "[1152, 1152, 1152, 1152, 1152, 0]"
# vllm/logger.py:28-33: "(process pid=N) LEVEL MM-DD HH:MM:SS [file:line] message".
VLLM_LINE = re.compile(r"^\((\w+) pid=\d+\) (INFO|WARNING|ERROR) \d\d-\d\d \d\d:\d\d:\d\d \[([\w.]+):(\d+)\] (.*)$")
# lmcache/logging.py:8-14: colour, "[date] LMCache LEVEL:", reset, message, "(file:line:logger)" in italics.
LMCACHE_GEOMETRY = re.compile(
    r"^\x1b\[32;20m\[[\d :,-]+\] LMCache INFO:\x1b\[0m Resolved LMCache MP geometry: group_tokens_per_block=(.*), "
    r"scheduler_block_size=(\d+), cache_model_name=(\S+) \x1b\[3m\(lmcache_mp_connector\.py:667:"
    r"lmcache\.integration\.vllm\.lmcache_mp_connector\)\x1b\[0m$"
)


@pytest.fixture(scope="module")
def flash_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    with lmcache_server(tmp_path_factory.mktemp("flash"), "glm53-flash") as server:
        yield server


@pytest.fixture(scope="module")
def glm53_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    with lmcache_server(tmp_path_factory.mktemp("glm53"), "glm53") as server:
        yield server


def test_flash_starts_with_vllm_lines_and_tp_plus_one_geometry_lines(tmp_path: Path, flash_server: Server) -> None:
    extra = ("--enable-prompt-tokens-details",)
    with engine(tmp_path, FLASH_MODEL, "glm53-flash", 4, flash_server.port, *extra) as pair:
        lines = pair.process.lines()
    vllm = [m.groups() for m in map(VLLM_LINE.match, lines) if m]
    # vLLM's monochrome logo (startup.py:16-38), its prefix repeated on each of its lines.
    banner = (logs.LOGO % ("0.33.0", FLASH_MODEL)).split("\n")
    assert vllm[: len(banner)] == [("APIServer", "INFO", "startup.py", "38", line) for line in banner]
    assert (
        "APIServer",
        "INFO",
        "interface.py",
        "1108",
        "Setting attention block size to 1152 tokens to ensure that attention page size is >= mamba page size.",
    ) in vllm
    assert {name for name, *_ in vllm} >= {"APIServer", "EngineCore", "Worker_TP0", "Worker_TP3"}
    geometry = [m.groups() for m in map(LMCACHE_GEOMETRY.match, lines) if m]
    assert geometry == [(FLASH_GROUPS, "1152", FLASH_MODEL)] * 5  # 4 TP workers + the scheduler, untagged
    assert vllm[-1][4].startswith("Starting vLLM server on http://127.0.0.1:")


def test_flash_8507_tokens_hit_8064_counted_by_the_real_server(tmp_path: Path, flash_server: Server) -> None:
    extra = ("--enable-prompt-tokens-details",)
    before = metric(flash_server.metrics(), "lmcache_mp_lookup_hit_tokens_total")
    with engine(tmp_path, FLASH_MODEL, "glm53-flash", 4, flash_server.port, *extra) as pair:
        assert cached_after_priming(pair.base_url, 8507, "seed-000") == 8064
        assert cached_after_priming(pair.base_url, 2304, "exact-two-chunks") == 1152  # L-1 looked up
        _, vllm_metrics = http(f"{pair.base_url}/metrics")
    assert metric(vllm_metrics, "vllm:external_prefix_cache_hits_total") == 8064 + 1152
    assert metric(flash_server.metrics(), "lmcache_mp_lookup_hit_tokens_total") - before == 8064 + 1152


def test_recovery_mismatch_fault_breaks_the_strict_prefix_rule(tmp_path: Path, flash_server: Server) -> None:
    extra = ("--enable-prompt-tokens-details", "--fault", "recovery-mismatch")
    with engine(tmp_path, FLASH_MODEL, "glm53-flash", 4, flash_server.port, *extra) as pair:
        assert cached_after_priming(pair.base_url, 2304, "fault") == 2303  # bound: 1152
        assert cached_after_priming(pair.base_url, 8507, "fault-8507") == 8064  # off the boundary nothing changes


def test_glm53_full_prompt_hits_load_one_token_fewer(tmp_path: Path, glm53_server: Server) -> None:
    extra = ("--enable-prompt-tokens-details",)
    with engine(tmp_path, GLM53_MODEL, "glm53", 8, glm53_server.port, *extra) as pair:
        hits = [cached_after_priming(pair.base_url, n, f"b{n}") for n in (255, 256, 257, 512, 768, 8507)]
        reset(pair.base_url, external=True)  # the connector's reset_cache: CLEAR on the server, which empties L1 only
        prompt = list(range(10, 10 + 768))
        # The chart's default fs L2 tier still holds the prompt (storage_manager.py:1244-1255 clears L1 managers).
        assert complete(pair.base_url, prompt, "b768")["usage"]["prompt_tokens_details"]["cached_tokens"] == 767
    assert hits == [0, 255, 256, 511, 767, 8448]


def test_usage_details_only_with_the_flag_and_chat_and_streaming_work(tmp_path: Path, glm53_server: Server) -> None:
    with engine(tmp_path, GLM53_MODEL, "glm53", 8, glm53_server.port) as pair:
        reply = complete(pair.base_url, list(range(300)), "plain")
        assert reply["usage"]["prompt_tokens_details"] is None
        status, chat = http(
            f"{pair.base_url}/v1/chat/completions",
            {"messages": [{"role": "user", "content": "the total is 42. what is the total?"}], "max_tokens": 2},
        )
        assert status == 200 and chat["choices"][0]["message"]["content"].startswith(" 42")
        status, text = http(f"{pair.base_url}/v1/completions", {"prompt": "a b c", "max_tokens": 3, "stream": True})
        assert status == 200 and text.count("data: ") == 4 and text.endswith("data: [DONE]\n\n")
        status, error = http(f"{pair.base_url}/v1/completions", {"prompt": "a", "cache_salt": "a/b"})
        assert status == 400 and "cache_salt" in error["error"]["message"]


def test_a_chunk_size_that_does_not_fit_fails_like_0_5_6(tmp_path: Path, glm53_server: Server) -> None:
    """GLM-5.3-Flash against a server on the default 256: the scheduler-side connector refuses it."""
    process = Process(vllm_args(FLASH_MODEL, "glm53-flash", 4, free_port(), glm53_server.port), tmp_path / "v.log")
    try:
        assert process.wait_exit(DEADLINE * 2) == 1
    finally:
        process.stop()
    lines = process.lines()
    vllm = [m.groups() for m in map(VLLM_LINE.match, lines) if m]
    failed = ("EngineCore", "ERROR", "core.py", "1584")
    assert (*failed, "EngineCore failed to start.") in vllm
    # NewLineFormatter repeats the prefix on every traceback line, the exception's own line included.
    assert (*failed, "ValueError: LMCache chunk size 256 must be a multiple of group 0 tokens_per_block 1152") in vllm
    assert sum(bool(LMCACHE_GEOMETRY.match(line)) for line in lines) == 5
    assert lines[-1] == (
        "glm53 mock: error: EngineCore failed to start: ValueError: LMCache chunk size 256 must be a multiple of "
        "group 0 tokens_per_block 1152"
    )


def test_an_unreachable_server_is_one_line_within_the_connector_timeout(tmp_path: Path) -> None:
    config = connector_json(free_port(), **{"lmcache.mp.mq_timeout": 1.0})
    argv = glm53("mock", "vllm", GLM53_MODEL, "--profile", "glm53", "--tensor-parallel-size", "8")
    argv += ["--port", str(free_port()), "--kv-transfer-config", config, "--load-seconds", "0"]
    process = Process(argv, tmp_path / "v.log")
    try:
        assert process.wait_exit(DEADLINE) == 1
    finally:
        process.stop()
    assert process.lines()[-1].startswith(
        "glm53 mock: error: EngineCore failed to start: ConnectionError: Cannot reach the LMCache MP server at "
        "'tcp://127.0.0.1:"
    )


def test_reset_endpoint_is_absent_without_dev_mode(tmp_path: Path, glm53_server: Server) -> None:
    port = free_port()
    process = Process(vllm_args(GLM53_MODEL, "glm53", 8, port, glm53_server.port), tmp_path / "v.log")
    try:
        process.wait_for("Starting vLLM server on", DEADLINE * 2)
        assert http(f"http://127.0.0.1:{port}/reset_prefix_cache", {})[0] == 404
    finally:
        assert process.stop() == 0


def test_kv_events_go_out_in_vllms_wire_format(tmp_path: Path, glm53_server: Server) -> None:
    """`--kv-events-config`: a ZMQ SUB sees (topic, sequence, msgpack batch) with BlockStored for each new block."""
    zmq = pytest.importorskip("zmq")
    msgpack = pytest.importorskip("msgspec").msgpack
    port = free_port()
    config = f'{{"enable_kv_cache_events":true,"publisher":"zmq","endpoint":"tcp://*:{port}","topic":"kv"}}'
    context = zmq.Context()
    subscriber = context.socket(zmq.SUB)
    subscriber.setsockopt(zmq.LINGER, 0)
    subscriber.setsockopt(zmq.SUBSCRIBE, b"kv")
    try:
        with engine(tmp_path, GLM53_MODEL, "glm53", 8, glm53_server.port, "--kv-events-config", config) as pair:
            subscriber.connect(f"tcp://127.0.0.1:{port}")
            prompt = list(range(1000, 1130))  # two whole 64-token blocks
            frames: list[bytes] = []
            for attempt in range(40):  # PUB drops what it sends before the subscription arrives: retry
                complete(pair.base_url, prompt, f"events-{attempt}")
                if subscriber.poll(250):
                    frames = subscriber.recv_multipart()
                    break
            reset(pair.base_url)
            while subscriber.poll(2000):
                cleared = subscriber.recv_multipart()
                if b"AllBlocksCleared" in cleared[2]:
                    break
    finally:
        subscriber.close()
        context.term()
    topic, sequence, payload = frames
    assert topic == b"kv" and len(sequence) == 8
    ts, events, dp_rank = msgpack.decode(payload)  # EventBatch is array_like: [ts, events, data_parallel_rank]
    assert isinstance(ts, float) and dp_rank == 0
    assert [e["type"] for e in events] == ["BlockStored", "BlockStored"]
    first, second = events
    assert first["token_ids"] == prompt[:64] and second["token_ids"] == prompt[64:128]
    assert first["block_size"] == 64 and first["medium"] == "GPU" and first["group_idx"] == 0
    assert first["parent_block_hash"] is None and second["parent_block_hash"] == first["block_hashes"][0]
    assert isinstance(first["block_hashes"][0], int) and first["block_hashes"][0] < 2**64
    assert first["extra_keys"][0][0].startswith("events-") and second["extra_keys"] == [None]
    assert msgpack.decode(cleared[2])[1] == [{"type": "AllBlocksCleared"}]
