"""vLLM 0.33's render endpoints, as pure functions: a request in, the `GenerateRequest` JSON vLLM would answer out.

`POST /v1/completions/render` answers a list with one `GenerateRequest` per prompt and `POST
/v1/chat/completions/render` answers one (vllm 0.33.0 entrypoints/scale_out/render/api_router.py:30-91). vllm-router
0.1.17 tokenizes through them for `cache_aware` and `kv_aware`; without them it routes on load alone. `vllm serve`
mounts them only with `--enable-scale-out` and otherwise answers 403 on the same paths
(entrypoints/scale_out/factories.py:94-129; mounted from entrypoints/launchers/api_server/routers.py:68-71 for
"generate" models), so the stand-in does too. Token ids come from the stand-in's tokenizer; `sampling_params` carries
the fields the stand-in honours, with the values vLLM's `to_sampling_params` gives them (generated fixture:
tests/mock/fixtures/render/).
"""

from __future__ import annotations

from typing import Any

from glm53.mock import openai_api

SCALE_OUT_DISABLED = openai_api.ApiError(
    403,
    "Scale-out endpoints are disabled. Restart vllm serve with --enable-scale-out to enable them.",
    "PermissionDeniedError",
)
# vllm 0.33.0 entrypoints/openai/completion/protocol.py: CompletionRequest.max_tokens defaults to 16; chat has none.
COMPLETION_DEFAULT_MAX_TOKENS = 16
# vllm 0.33.0 sampling_params.py:32 and :615-619: below this temperature sampling is greedy and top_p/min_p reset.
SAMPLING_EPS = 1e-5
# vllm 0.33.0 v1 RequestOutputKind: DELTA when streaming, FINAL_ONLY otherwise (completion/protocol.py:423-425).
OUTPUT_KIND_DELTA = 1
OUTPUT_KIND_FINAL_ONLY = 2


random_uuid = openai_api.random_uuid


def sampling_params(request: openai_api.ApiRequest, max_tokens: int) -> dict[str, Any]:
    """The `sampling_params` object of a rendered request, as vLLM dumps it (omitted defaults left out)."""
    params: dict[str, Any] = {
        "presence_penalty": 0.0,
        "frequency_penalty": 0.0,
        "repetition_penalty": 1.0,
        "temperature": request.temperature,
    }
    if request.temperature >= SAMPLING_EPS:
        params |= {"top_p": 1.0, "min_p": 0.0}
    params |= {"stop": [], "stop_token_ids": []}
    if max_tokens != COMPLETION_DEFAULT_MAX_TOKENS:
        params["max_tokens"] = max_tokens
    if request.top_logprobs is not None:
        params["logprobs"] = request.top_logprobs
    params |= {
        "output_kind": OUTPUT_KIND_DELTA if request.stream else OUTPUT_KIND_FINAL_ONLY,
        "skip_clone": True,
        "bad_words": [],
        "skip_reading_prefix_cache": False,
    }
    return params


def _max_tokens(body: dict[str, Any], chat: bool, prompt_tokens: int, max_model_len: int) -> int:
    """vllm 0.33.0 serve/utils/api_utils.py:234-270 (get_max_tokens): what was asked for, capped by the context left.

    Chat prefers `max_completion_tokens` and asks for no default (render/serving.py:168-177)."""
    wanted = body.get("max_completion_tokens") if chat else None
    if wanted is None:
        wanted = body.get("max_tokens", None if chat else COMPLETION_DEFAULT_MAX_TOKENS)
    left = max_model_len - prompt_tokens
    return left if wanted is None else min(wanted, left)


def render(
    body: Any, chat: bool, served_model: str, max_model_len: int, request_id: str | None, chat_template: bool = True
) -> Any:
    """The body of a 200 answer; bad input raises `openai_api.ApiError` with the same status as generation would.

    `request_id` is the `X-Request-Id` header, used as vLLM does (serve/engine/serving.py:133-142)."""
    request = openai_api.parse_request(body, chat, served_model, max_model_len, chat_template)
    assert isinstance(body, dict)  # parse_request refuses anything else
    tokens = list(request.prompt.tokens)
    stream_options = body.get("stream_options") if request.stream else None
    rendered: dict[str, Any] = {
        "request_id": f"{'chatcmpl' if chat else 'cmpl'}-{request_id or body.get('request_id') or random_uuid()}",
        "token_ids": tokens,
        "token_offsets": None,
        "features": None,
        "content_parts": None,
        "sampling_params": sampling_params(request, _max_tokens(body, chat, len(tokens), max_model_len)),
        "model": body.get("model"),
        "reasoning_ended": None,
        "reasoning_parser_kwargs": None,
        "return_token_ids": body.get("return_token_ids"),
        "output_mode": "tokens",
        "parse_context": _parse_context(body) if chat else None,
        "stream": request.stream,
        "stream_options": _stream_options(stream_options),
        "cache_salt": request.prompt.cache_salt or None,
        "priority": 0,
        "kv_transfer_params": None,
        "ec_transfer_params": None,
    }
    return rendered if chat else [rendered]


def _stream_options(options: Any) -> dict[str, Any] | None:
    """vLLM's StreamOptions with its defaults filled in (vllm 0.33.0 entrypoints/generate/base/protocol.py:293-295)."""
    if not isinstance(options, dict):
        return None
    return {
        "include_usage": options.get("include_usage", False),
        "continuous_usage_stats": options.get("continuous_usage_stats", False),
    }


def _parse_context(body: dict[str, Any]) -> dict[str, Any]:
    """render/serving.py:228-242 for a request without tools, on a model without chat-template kwargs."""
    return {
        "tools": None,
        "tool_choice": "none",
        "parallel_tool_calls": True,
        "include_reasoning": body.get("include_reasoning", True),
        "chat_template_kwargs": {},
        "history_tool_call_cnt": 0,
    }
