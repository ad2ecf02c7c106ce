"""The render endpoints vllm-router tokenizes through, against what vLLM 0.33's own classes answer.

`fixtures/render/render.json` was produced by vLLM 0.33's request, sampling-params and `GenerateRequest` classes
(`fixtures/render/generate.py`); only the request id is random, so it is checked by shape.
"""

from __future__ import annotations

import json
import re
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from glm53.mock import openai_api, render, vllm_server
from glm53.mock.connector import ConnectorConfig
from glm53.mock.model import ComputeCost, tokenize
from glm53.mock.runtime import bind_http, serve_in_background
from glm53.profiles import get_profile

FIXTURE = json.loads((Path(__file__).parent / "fixtures" / "render" / "render.json").read_text())
MODEL = "m"


def _without_id(rendered: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in rendered.items() if k != "request_id"}


@pytest.mark.parametrize("case", FIXTURE["cases"], ids=lambda c: f"{c['kind']}-{sorted(c['body'])}")
def test_render_answers_what_vllm_answers(case: dict[str, Any]) -> None:
    chat = case["kind"] == "chat"
    got = render.render(case["body"], chat, MODEL, FIXTURE["max_model_len"], None)
    expected = case["response"]
    if chat:
        assert _without_id(got) == _without_id(expected)
        assert re.fullmatch(r"chatcmpl-[0-9a-f]{16}", got["request_id"])
    else:
        assert [_without_id(g) for g in got] == [_without_id(e) for e in expected]
        assert re.fullmatch(r"cmpl-[0-9a-f]{16}", got[0]["request_id"])


def test_the_request_id_header_names_the_rendered_request() -> None:
    got = render.render({"prompt": "a b"}, False, MODEL, 64, "abc")
    assert got[0]["request_id"] == "cmpl-abc"
    assert got[0]["token_ids"] == tokenize("a b")


def test_max_tokens_is_capped_by_the_context_left() -> None:
    got = render.render({"messages": [{"role": "user", "content": "a b c"}]}, True, MODEL, 64, None)
    assert got["sampling_params"]["max_tokens"] == 61


@pytest.mark.parametrize(
    ("body", "status", "message"),
    [
        ({"model": "other", "prompt": "a"}, 404, "The model `other` does not exist. Valid aliases: m."),
        ({"prompt": 7}, 400, "prompt must be a string or a list of non-negative integer token ids"),
        ({"prompt": "   "}, 400, "the prompt is empty"),
        ([], 400, "the request body must be a JSON object"),
    ],
)
def test_bad_input_is_refused_like_generation(body: Any, status: int, message: str) -> None:
    with pytest.raises(openai_api.ApiError) as caught:
        render.render(body, False, MODEL, 64, None)
    assert (caught.value.status, caught.value.message) == (status, message)


def _config(enable_scale_out: bool) -> vllm_server.VllmConfig:
    return vllm_server.VllmConfig(
        model=MODEL,
        profile=get_profile("glm53"),
        host="127.0.0.1",
        port=0,
        tensor_parallel_size=8,
        enable_prefix_caching=True,
        enable_prompt_tokens_details=False,
        connector=ConnectorConfig("tcp://127.0.0.1:1", 1.0, 1.0),  # never dialled: render needs no engine
        served_model_name=MODEL,
        load_seconds=0.0,
        fault=None,
        seed=0,
        max_model_len=64,
        num_gpu_blocks_override=None,
        cost=ComputeCost(0.0, 0.0),
        enable_scale_out=enable_scale_out,
    )


@pytest.fixture
def serving() -> Iterator[Any]:
    """A started HTTP front of the stand-in (render needs no engine), for either setting of --enable-scale-out."""
    servers = []

    def start(enable_scale_out: bool) -> str:
        server = vllm_server.VllmServer(_config(enable_scale_out))
        server.ready.set()
        server.metrics = object()  # type: ignore[assignment]  # never read on POST
        http = bind_http("vLLM API server", "127.0.0.1", 0, vllm_server._handler(server), "--port")
        servers.append(http)
        serve_in_background(http)
        return f"http://127.0.0.1:{http.server_address[1]}"

    yield start
    for http in servers:
        http.shutdown()
        http.server_close()


def _post(url: str, body: object) -> tuple[int, Any]:
    request = urllib.request.Request(url, json.dumps(body).encode(), {"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as error:
        return error.code, json.loads(error.read())


def test_the_routes_answer_with_enable_scale_out(serving: Any) -> None:
    base = serving(True)
    status, body = _post(f"{base}/v1/completions/render", {"prompt": "a b c"})
    assert status == 200 and isinstance(body, list) and body[0]["token_ids"] == tokenize("a b c")
    status, body = _post(f"{base}/v1/chat/completions/render", {"messages": [{"role": "user", "content": "x y"}]})
    assert status == 200 and body["token_ids"] == tokenize("x y")
    status, body = _post(f"{base}/v1/completions/render", {"model": "nope", "prompt": "a"})
    assert status == 404 and body["error"]["type"] == "NotFoundError"


def test_the_routes_are_forbidden_without_it_as_in_vllm_serve(serving: Any) -> None:
    # vllm 0.33.0 entrypoints/scale_out/factories.py:100-127: the paths exist and answer 403 with this error.
    status, body = _post(f"{serving(False)}/v1/completions/render", {"prompt": "a"})
    assert status == 403
    assert body == {
        "error": {
            "message": "Scale-out endpoints are disabled. Restart vllm serve with --enable-scale-out to enable them.",
            "type": "PermissionDeniedError",
            "param": None,
            "code": 403,
        }
    }
