"""`glm53 mock lmcache` as a real process: flags like the real server, listeners on loopback, L1 budget, metrics."""

from __future__ import annotations

import socket
from pathlib import Path

import pytest
import zmq
from mockproc import MockProcess, free_port, http, lmcache_args, metric, running, start_lmcache

from glm53.logparse import NegotiatedChunk
from glm53.mock import protocol

REAL_METRICS = (
    "lmcache_mp_lookup_requested_tokens_total",
    "lmcache_mp_lookup_hit_tokens_total",
    "lmcache_mp_lookup_hit_l1_tokens_total",
    "lmcache_mp_l1_write_chunks_total",
    "lmcache_mp_l1_read_chunks_total",
    "lmcache_mp_l1_evicted_chunks_total",
    "lmcache_mp_l1_memory_usage_bytes",
    "lmcache_mp_l1_usage_ratio",
)


def _request(port: int, message: dict[str, object]) -> dict[str, object]:
    context = zmq.Context()
    sock = context.socket(zmq.REQ)
    sock.setsockopt(zmq.LINGER, 0)
    try:
        sock.connect(f"tcp://127.0.0.1:{port}")
        sock.send(protocol.encode(message))
        assert sock.poll(10_000), "the mock LMCache server did not answer"
        return protocol.decode(sock.recv())
    finally:
        sock.close()
        context.term()


def test_serves_healthcheck_and_metrics_never_run_script_and_stops_on_sigterm(tmp_path: Path) -> None:
    process, _, http_port, prometheus_port = start_lmcache(tmp_path, "--l1-size-gb", "1", "--eviction-policy", "LRU")
    assert http(f"http://127.0.0.1:{http_port}/healthcheck")[0] == 200
    assert http(f"http://127.0.0.1:{http_port}/run_script", {"script": "print(1)"})[0] == 404
    status, text = http(f"http://127.0.0.1:{prometheus_port}/metrics")
    assert status == 200
    for name in REAL_METRICS:
        metric(text, name)
    assert process.stop() == 0
    assert "LMCache MP server stopped" in process.text()


def test_l1_budget_evicts_least_recently_used_chunks(tmp_path: Path) -> None:
    # 0.0001 GiB = 107374 bytes: room for two 50000-byte chunks.
    process, port, _, prometheus_port = start_lmcache(
        tmp_path, "--l1-size-gb", "0.0001", "--eviction-policy", "LRU", "--chunk-size", "64"
    )
    try:
        assert _request(port, {"op": "register", "group_tokens_per_block": [64]})["chunk_size"] == 64
        stored = _request(port, {"op": "store", "salt": "", "keys": ["k1", "k2", "k3"], "chunk_bytes": 50_000})
        assert (stored["written"], stored["evicted"]) == (3, 1)
        assert _request(port, {"op": "lookup", "keys": ["k1", "k2"]})["hit_tokens"] == 0
        assert _request(port, {"op": "lookup", "keys": ["k2", "k3"]})["hit_tokens"] == 128
        _, text = http(f"http://127.0.0.1:{prometheus_port}/metrics")
        assert metric(text, "lmcache_mp_l1_evicted_chunks_total") == 1
        assert metric(text, "lmcache_mp_l1_write_chunks_total") == 3
        assert metric(text, "lmcache_mp_l1_memory_usage_bytes") == 100_000
        assert metric(text, "lmcache_mp_lookup_requested_tokens_total") == 256
        assert metric(text, "lmcache_mp_lookup_hit_tokens_total") == 128
        assert _request(port, {"op": "clear"})["removed"] == 2
        assert _request(port, {"op": "bogus"})["error"] == (
            "unknown op 'bogus'; expected one of: register, lookup, store, clear, ping"
        )
    finally:
        process.stop()


def test_negotiating_logs_the_negotiated_size_once(tmp_path: Path) -> None:
    process, port, _, _ = start_lmcache(
        tmp_path, "--l1-size-gb", "1", "--eviction-policy", "LRU", "--generation", "negotiating"
    )
    try:
        for rank in range(4):
            reply = _request(port, {"op": "register", "rank": rank, "group_tokens_per_block": [1152, 0]})
            assert reply["chunk_size"] == 1152
    finally:
        process.stop()
    negotiated = [r for r in process.records() if isinstance(r, NegotiatedChunk)]
    assert [(r.resolved, r.configured_min, r.alignment) for r in negotiated] == [(1152, 256, 1152)]


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--eviction-policy", "LRU"], "the following arguments are required: --l1-size-gb"),
        (["--l1-size-gb", "1"], "the following arguments are required: --eviction-policy"),
        (["--l1-size-gb", "1", "--eviction-policy", "FIFO"], "argument --eviction-policy: invalid choice: 'FIFO'"),
        (["--l1-size-gb", "1", "--eviction-policy", "LRU", "--enable-run-script"], "unrecognized arguments"),
    ],
)
def test_rejects_bad_flags_like_the_real_cli(tmp_path: Path, args: list[str], message: str) -> None:
    process = MockProcess(["mock", "lmcache", *args], tmp_path / "lmcache.log")
    assert process.wait_exit() == 2
    assert message in process.text()
    process.stop()


def test_enabling_run_script_is_refused(tmp_path: Path) -> None:
    args = ["mock", "lmcache", "--l1-size-gb", "1", "--eviction-policy", "LRU", "--run-script-api-enabled"]
    process = MockProcess(args, tmp_path / "l.log")
    assert process.wait_exit() == 2
    [line] = process.lines()
    assert line.startswith("glm53 mock: error: --run-script-api-enabled turns on /run_script")
    assert "pass --no-run-script-api-enabled" in line
    process.stop()


def test_zero_l1_size_is_a_one_line_error(tmp_path: Path) -> None:
    process = MockProcess(["mock", "lmcache", "--l1-size-gb", "0", "--eviction-policy", "LRU"], tmp_path / "l.log")
    assert process.wait_exit() == 2
    assert process.lines() == ["glm53 mock: error: --l1-size-gb must be positive, got 0.0"]
    process.stop()


@pytest.mark.parametrize("taken", ["--port", "--http-port", "--prometheus-port"])
def test_a_taken_port_is_a_one_line_error(tmp_path: Path, taken: str) -> None:
    with socket.socket() as blocker:
        blocker.bind(("127.0.0.1", 0))
        blocker.listen()
        ports = {"--port": free_port(), "--http-port": free_port(), "--prometheus-port": free_port()}
        ports[taken] = blocker.getsockname()[1]
        args = lmcache_args(ports["--port"], ports["--http-port"], ports["--prometheus-port"])
        with running([*args, "--l1-size-gb", "1", "--eviction-policy", "LRU"], tmp_path / "l.log") as process:
            assert process.wait_exit() == 1
            lines = process.lines()
    assert len(lines) == 1
    assert lines[0].startswith("glm53 mock: error: cannot bind the LMCache")
    assert f"127.0.0.1:{ports[taken]}" in lines[0] and f"choose another {taken}" in lines[0]
