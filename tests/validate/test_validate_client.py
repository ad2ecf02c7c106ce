"""How `glm53 validate` talks to a server and fails: one line and exit 2 for unreachable, dev mode off, no counter."""

from __future__ import annotations

import json
import socket

import pytest

import glm53.validate.client as client_module
from glm53.errors import Glm53Error
from glm53.validate.client import VllmClient
from tests.support.validate_fakes import METRICS, MODELS, RESET_OK, Canned, error_line, fake_server, run_glm53


def closed_port() -> int:
    """A loopback port nothing listens on (bound and released, so the kernel refuses connections to it)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def test_unreachable_server_is_one_line_and_exit_2() -> None:
    port = closed_port()
    result = run_glm53("validate", "--base-url", f"http://127.0.0.1:{port}", "--profile", "glm53-flash")
    assert result.returncode == 2
    assert error_line(result).startswith(
        f"glm53 validate: error: cannot reach vLLM at http://127.0.0.1:{port} (GET /v1/models: "
    )
    assert error_line(result).endswith("check --base-url and that the server is up and healthy")


def test_dev_mode_off_is_one_line_and_exit_2() -> None:
    """vLLM without VLLM_SERVER_DEV_MODE=1 has no /reset_prefix_cache: it answers 404."""
    with fake_server({("GET", "/v1/models"): MODELS, ("GET", "/metrics"): METRICS}) as url:
        result = run_glm53("validate", "--base-url", url, "--profile", "glm53-flash")
    assert result.returncode == 2
    assert error_line(result) == (
        "glm53 validate: error: POST /reset_prefix_cache?reset_external=false answered 404: vLLM's dev mode is off; "
        "start vLLM with VLLM_SERVER_DEV_MODE=1 (validation only)"
    )


def test_missing_external_counter_says_what_to_enable() -> None:
    no_connector = Canned(200, b"# TYPE vllm:prefix_cache_hits_total counter\nvllm:prefix_cache_hits_total 0\n")
    routes = {
        ("GET", "/v1/models"): MODELS,
        ("GET", "/metrics"): no_connector,
        ("POST", "/reset_prefix_cache"): RESET_OK,
    }
    with fake_server(routes) as url:
        result = run_glm53("validate", "--base-url", url, "--profile", "glm53-flash")
    assert result.returncode == 2
    assert error_line(result) == (
        f"glm53 validate: error: {url}/metrics exposes no vllm:external_prefix_cache_hits_total counter; start vLLM "
        'with the LMCache connector (--kv-transfer-config \'{"kv_connector":"LMCacheMPConnector",'
        '"kv_role":"kv_both"}\') and without --disable-log-stats'
    )


def test_unknown_model_is_refused() -> None:
    routes = {("GET", "/v1/models"): MODELS, ("GET", "/metrics"): METRICS, ("POST", "/reset_prefix_cache"): RESET_OK}
    with fake_server(routes) as url:
        result = run_glm53("validate", "--base-url", url, "--model", "other")
    assert result.returncode == 2
    assert error_line(result) == (
        "glm53 validate: error: vLLM serves ['zai-org/GLM-5.3-Flash'], not 'other'; pass one of those with --model"
    )


def test_http_error_is_one_line() -> None:
    broken = Canned(500, b'{"error": "engine dead"}')
    with fake_server({("GET", "/v1/models"): broken}) as url, pytest.raises(Glm53Error) as caught:
        VllmClient(url).model_ids()
    assert caught.value.message == f'vLLM answered HTTP 500 to GET {url}/v1/models: {{"error": "engine dead"}}'
    assert caught.value.exit_code == 2


def test_completion_parses_logprobs_and_cached_tokens() -> None:
    body = {
        "choices": [
            {
                "text": " 7311",
                "logprobs": {"tokens": [" 7311"], "token_logprobs": [-0.95], "top_logprobs": [{" 7311": -0.93}]},
            }
        ],
        "usage": {"prompt_tokens": 8507, "prompt_tokens_details": {"cached_tokens": 8064}},
    }
    with fake_server({("POST", "/v1/completions"): Canned(200, json.dumps(body).encode())}) as url:
        completion = VllmClient(url).complete("m", "prompt", max_tokens=1, cache_salt="s", logprobs=5)
    assert (completion.text, completion.first_logprob) == (" 7311", -0.93)
    assert (completion.prompt_tokens, completion.cached_tokens) == (8507, 8064)
    assert completion.ttft_seconds == completion.total_seconds


def test_streamed_completion_measures_first_token_and_reads_usage() -> None:
    events = [
        {"choices": [{"text": " the"}]},
        {"choices": [{"text": " answer"}]},
        {"choices": [], "usage": {"prompt_tokens": 2304, "prompt_tokens_details": {"cached_tokens": 1152}}},
    ]
    stream = "".join(f"data: {json.dumps(e)}\n\n" for e in events) + "data: [DONE]\n\n"
    canned = Canned(200, stream.encode(), "text/event-stream")
    with fake_server({("POST", "/v1/completions"): canned}) as url:
        completion = VllmClient(url).complete("m", [1, 2, 3], max_tokens=2, cache_salt="s", stream=True)
    assert completion.text == " the answer"
    assert (completion.prompt_tokens, completion.cached_tokens) == (2304, 1152)
    assert 0 < completion.ttft_seconds <= completion.total_seconds


def test_timeout_is_one_line() -> None:
    with socket.socket() as silent:  # accepts connections (backlog) but never answers
        silent.bind(("127.0.0.1", 0))
        silent.listen()
        url = f"http://127.0.0.1:{silent.getsockname()[1]}"
        with pytest.raises(Glm53Error) as caught:
            VllmClient(url, timeout=0.2).model_ids()
    assert caught.value.message == (
        f"cannot reach vLLM at {url} (GET /v1/models: no answer within 0.2s); check --base-url and that the server "
        "is up and healthy"
    )


def test_base_url_without_scheme_is_refused() -> None:
    with pytest.raises(Glm53Error, match=r"--base-url must start with http:// or https://, got '127\.0\.0\.1:8000'"):
        VllmClient("127.0.0.1:8000")


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--runs", "7"], "--runs must be at least 8 per condition (the seed protocol runs 16 + 16; fewer leave"),
        (["--alpha", "1.5"], "--alpha must lie strictly between 0 and 1, got 1.5"),
        (["--chunk-size", "0"], "--chunk-size must be a positive number of tokens, got 0"),
        (
            ["--checks", "equivalence,speed"],
            "--checks takes a comma-separated subset of equivalence,boundary,perf,continuations,mixed",
        ),
        (["--timeout", "0"], "--timeout must be a positive, finite number of seconds, got 0.0"),
        (["--timeout", "nan"], "--timeout must be a positive, finite number of seconds, got nan"),
        (["--timeout", "inf"], "--timeout must be a positive, finite number of seconds, got inf"),
        (["--alpha", "nan"], "--alpha must lie strictly between 0 and 1, got nan"),
        (["--pairs", "2"], "--pairs must be at least 3 (one per template), got 2"),
        (["--continuation-tokens", "0"], "--continuation-tokens must be a positive number, got 0"),
    ],
)
def test_bad_options_are_one_line(args: list[str], message: str) -> None:
    result = run_glm53("validate", "--base-url", "http://127.0.0.1:9", *args)
    assert result.returncode == 2
    assert error_line(result).startswith(f"glm53 validate: error: {message}")


def test_refused_reset_is_retried_then_one_line(monkeypatch: pytest.MonkeyPatch) -> None:
    """vLLM answers {"success": false} while blocks are in use (LMCache's store of the last request holds them for a
    moment, so a refusal is retried); one that persists means "reloaded" runs could hit its local cache."""
    monkeypatch.setattr(client_module, "RESET_RETRY_SECONDS", 0.3)
    refused = Canned(200, b'{"success": false}')
    with fake_server({("POST", "/reset_prefix_cache"): refused}) as url, pytest.raises(Glm53Error) as caught:
        VllmClient(url).reset_prefix_cache()
    assert caught.value.message == (
        "vLLM refused POST /reset_prefix_cache?reset_external=false (success: false) for 0.3 s, so reuse could come "
        "from its local cache; validate an idle server (no other clients)"
    )


def test_a_reset_refused_while_a_store_finishes_succeeds_on_retry(monkeypatch: pytest.MonkeyPatch) -> None:
    answers = iter([b'{"success": false}', b'{"success": false}', b'{"success": true}'])
    calls: list[str] = []

    def read(self: VllmClient, method: str, path: str, body: object = None) -> bytes:
        calls.append(path)
        return next(answers)

    monkeypatch.setattr(VllmClient, "_read", read)
    VllmClient("http://127.0.0.1:9").reset_prefix_cache()
    assert len(calls) == 3


@pytest.mark.parametrize("body", [b'{"success": true}', b""])
def test_accepted_reset(body: bytes) -> None:
    with fake_server({("POST", "/reset_prefix_cache"): Canned(200, body)}) as url:
        VllmClient(url).reset_prefix_cache()
