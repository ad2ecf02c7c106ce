"""The OpenAI-compatible request and response shapes of the mock vLLM server, as pure functions.

Requests are validated into an `ApiRequest` (a bad field is a 400 with vLLM's error body); responses are built from the
engine's `Outcome`. Prompts follow the stand-in's tokenizer rule: a string is one token per whitespace-separated word, a
list of integers is used as token ids as-is, and chat messages are joined by newlines. `usage` carries
`prompt_tokens_details.cached_tokens` (local plus external hits) only when the server runs with
`--enable-prompt-tokens-details`, as vLLM does. The context-length rules, error messages and completion shapes are
vLLM 0.33's (tests/mock/test_standin_conformance.py holds them to the real engine); where 0.32 differs, the code says
so.
"""

from __future__ import annotations

import json
import random
import time
from dataclasses import dataclass
from typing import Any

from glm53.mock import model
from glm53.mock.engine import Outcome, Prompt

DEFAULT_MAX_TOKENS = 16
MAX_TOP_LOGPROBS = 5
SALT_FORBIDDEN = frozenset("@/\\\x00")
SALT_MAX_LEN = 128


# vllm 0.33.0 renderers/hf.py:884-889: a tokenizer without a chat template refuses chat requests (a 400: the error is
# a VLLMClientError, exceptions.py:65); the tiny CPU models' tokenizers have none (glm53.tinymodels.train_tokenizer).
NO_CHAT_TEMPLATE = (
    "As of transformers v4.44, default chat template is no longer allowed, so you must provide a chat template if the "
    "tokenizer does not define one."
)


def random_uuid() -> str:
    """vllm 0.33.0 utils/__init__.py:11-12: 16 hex characters, the default request id."""
    return f"{random.getrandbits(64):016x}"


class ApiError(Exception):
    """A request the server rejects; `status`, `message` and `param` become vLLM's error body
    (vllm 0.33.0 entrypoints/serve/engine/protocol.py:79-87, ErrorInfo)."""

    def __init__(self, status: int, message: str, kind: str = "BadRequestError", param: str | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.kind = kind
        self.param = param

    def body(self) -> dict[str, Any]:
        return {"error": {"message": self.message, "type": self.kind, "param": self.param, "code": self.status}}


def generation_error() -> ApiError:
    """What a client gets for a request the engine finished with FinishReason.ERROR (a failed KV load under
    kv_load_failure_policy=fail): vllm 0.33.0 entrypoints/generate/base/serving.py:200-207 raises
    `GenerationError("Internal server error")`, which serve/exception_handling/error_response.py:60-67 turns into a
    500 `InternalServerError` body (handlers/vllm_error.py:69-77 answers it, as JSON, when not streaming)."""
    return ApiError(500, "Internal server error", "InternalServerError")


def stream_error_event(chat: bool) -> bytes:
    """The event a stream gets instead of its tokens (after its 200 and before `data: [DONE]`): a completion's is
    `json.dumps` of the body (completion/serving.py:552-553, generate/base/serving.py:183-198), a chat's pydantic's
    compact dump (chat_completion/serving.py:947-950 and :496-497)."""
    body = generation_error().body()
    text = json.dumps(body, separators=(",", ":")) if chat else json.dumps(body)
    return b"data: " + text.encode() + b"\n\n"


def validation_error(message: str, parameter: str, value: object) -> ApiError:
    """vLLM's VLLMValidationError as a client sees it: the message ends with `(parameter=P, value=V)` and the body's
    `param` is P (vllm 0.33.0 exceptions.py:28-56)."""
    return ApiError(400, f"{message} (parameter={parameter}, value={value})", param=parameter)


@dataclass(frozen=True)
class ApiRequest:
    chat: bool
    model: str
    prompt: Prompt
    temperature: float
    top_logprobs: int | None  # None: no log-probs requested
    stream: bool
    include_usage: bool


def _int_field(body: dict[str, Any], name: str, default: int | None, low: int, high: int | None = None) -> int | None:
    value = body.get(name, default)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < low or (high is not None and value > high):
        limit = f" and <= {high}" if high is not None else ""
        raise ApiError(400, f"{name} must be an integer >= {low}{limit}, got {value!r}")
    return value


def _prompt_text(body: dict[str, Any], chat: bool) -> str | list[int]:
    """The prompt as text, or as the token ids a completions request may give instead."""
    if chat:
        messages = body.get("messages")
        if not isinstance(messages, list) or not messages:
            raise ApiError(400, "messages must be a non-empty list")
        contents = [m.get("content") if isinstance(m, dict) else None for m in messages]
        if not all(isinstance(c, str) for c in contents):
            raise ApiError(400, "every message needs string content (the mock is text-only)")
        return "\n".join(c for c in contents if isinstance(c, str))
    prompt = body.get("prompt")
    if isinstance(prompt, str):
        return prompt
    if isinstance(prompt, list) and all(isinstance(t, int) and not isinstance(t, bool) and t >= 0 for t in prompt):
        return prompt
    raise ApiError(400, "prompt must be a string or a list of non-negative integer token ids")


def parse_request(
    body: Any, chat: bool, served_model: str, max_model_len: int, chat_template: bool = True
) -> ApiRequest:
    """The request, or the ApiError vLLM answers; `chat_template` False: the model's tokenizer has none."""
    if not isinstance(body, dict):
        raise ApiError(400, "the request body must be a JSON object")
    name = body.get("model", served_model)
    if name != served_model:
        # vllm 0.33.0 entrypoints/serve/engine/serving.py:74-83 (_check_model)
        raise ApiError(
            404, f"The model `{name}` does not exist. Valid aliases: {served_model}.", "NotFoundError", param="model"
        )
    if chat and not chat_template:
        raise ApiError(400, NO_CHAT_TEMPLATE)
    text = _prompt_text(body, chat)
    tokens = tuple(model.tokenize(text)) if isinstance(text, str) else tuple(text)
    answer = model.extract_answer(text) if isinstance(text, str) else None
    if not tokens:
        raise ApiError(400, "the prompt is empty")
    max_tokens = _max_tokens(body, chat, len(tokens), isinstance(text, str), max_model_len)
    temperature = body.get("temperature", 1.0)
    if isinstance(temperature, bool) or not isinstance(temperature, int | float) or temperature < 0:
        raise ApiError(400, f"temperature must be a non-negative number, got {temperature!r}")
    salt = body.get("cache_salt", "")
    if not isinstance(salt, str):
        raise ApiError(400, "cache_salt must be a string")
    # lmcache 0.5.6 v1/multiprocess/custom_types.py:74-87: LMCache's keys refuse these salts; refuse them up front.
    if set(salt) & SALT_FORBIDDEN or len(salt) > SALT_MAX_LEN:
        raise ApiError(400, f"cache_salt must be at most {SALT_MAX_LEN} characters without '@', '/', '\\' or NUL")
    stream_options = body.get("stream_options") or {}
    return ApiRequest(
        chat=chat,
        model=served_model,
        prompt=Prompt(tokens, salt, max_tokens, answer),
        temperature=float(temperature),
        top_logprobs=_top_logprobs(body, chat),
        stream=bool(body.get("stream", False)),
        include_usage=isinstance(stream_options, dict) and bool(stream_options.get("include_usage")),
    )


def _max_tokens(body: dict[str, Any], chat: bool, prompt_tokens: int, text: bool, max_model_len: int) -> int:
    """The tokens to generate, or vLLM's 400, in vLLM's order (the same in 0.32 and 0.33):
    - asking for more than the context: renderers/params.py:271-284 (TokenizeParams.__post_init__);
    - a prompt longer than the context: renderers/params.py:531-552 (_token_len_check); a text prompt is tokenized with
      truncation to one token more (get_encode_kwargs, :367-375), so it reports "at least max_model_len + 1";
    - otherwise what was asked for, capped by the context left: serve/utils/api_utils.py:234-270 (get_max_tokens);
      a prompt filling the context leaves 0, which sampling_params.py:691-696 refuses."""
    name = "max_completion_tokens" if chat and body.get("max_completion_tokens") is not None else "max_tokens"
    asked = body.get(name)
    if asked is None:
        asked = DEFAULT_MAX_TOKENS  # completion/protocol.py:64 and :451-457: a null max_tokens is the default 16
    if isinstance(asked, bool) or not isinstance(asked, int):
        raise ApiError(400, f"{name} must be an integer, got {asked!r}")
    if asked > max_model_len:
        raise validation_error(
            f"{name}={asked} cannot be greater than max_model_len={max_model_len}. Please request fewer output tokens.",
            name,
            asked,
        )
    counted = min(prompt_tokens, max_model_len + 1) if text else prompt_tokens
    if counted > max_model_len:
        at_least = "at least " if counted == max_model_len + 1 else ""
        raise validation_error(
            f"This model's maximum context length is {max_model_len} tokens. However, your prompt contains "
            f"{at_least}{counted} input tokens, which exceeds this limit even without any output tokens. Please reduce "
            "the length of the input prompt.",
            "input_tokens",
            counted,
        )
    granted = min(asked, max_model_len - prompt_tokens)
    if granted < 1:
        raise validation_error(f"max_tokens must be at least 1, got {granted}.", "max_tokens", granted)
    return granted


def _top_logprobs(body: dict[str, Any], chat: bool) -> int | None:
    if not chat:
        return _int_field(body, "logprobs", None, 0, MAX_TOP_LOGPROBS)
    if not body.get("logprobs"):
        return None
    return _int_field(body, "top_logprobs", 0, 0, MAX_TOP_LOGPROBS)


def usage(outcome: Outcome, prompt_tokens_details: bool) -> dict[str, Any]:
    """vLLM's UsageInfo with every field, in its order (vllm 0.33.0 entrypoints/serve/engine/protocol.py:121-141, as in
    0.32); `prompt_tokens_details` only under `--enable-prompt-tokens-details` (completion/serving.py:668-676), else
    null."""
    completion = len(outcome.generation.words)
    details = None
    if prompt_tokens_details:
        details = {"cached_tokens": outcome.cached_tokens, "created_cache_tokens": None, "multimodal_tokens": None}
    return {
        "prompt_tokens": outcome.prompt_tokens,
        "total_tokens": outcome.prompt_tokens + completion,
        "completion_tokens": completion,
        "prompt_tokens_details": details,
        "completion_tokens_details": None,
    }


def without_nulls(value: Any) -> Any:
    """What pydantic's `model_dump_json(exclude_none=True)` leaves: no null field at any depth."""
    if isinstance(value, dict):
        return {k: without_nulls(v) for k, v in value.items() if v is not None}
    if isinstance(value, list):
        return [without_nulls(v) for v in value]
    return value


def _alternatives(generation: model.Generation, position: int, count: int) -> list[tuple[str, float]]:
    """The chosen token and the most likely others, `count` in all (at least the chosen one)."""
    chosen = (generation.words[position], generation.logprobs[position])
    others = list(generation.alternatives[position]) if position < len(generation.alternatives) else []
    return [chosen, *others][: max(count, 1)]


def _completion_logprobs(generation: model.Generation, top: int) -> dict[str, Any]:
    """vllm 0.33.0 completion/protocol.py:668-672 (CompletionLogProbs, fields in that order) and serving.py
    `_create_completion_logprobs`: each position lists the first `top + 1` of the sampled token and the top `top`
    (generate/base/serving.py:368-378); the stand-in's chosen token is the most likely, so that is max(top, 1)."""
    words = generation.words
    offsets, position = [], 0
    for word in words:
        offsets.append(position)
        position += len(word) + 1
    return {
        "text_offset": offsets,
        "token_logprobs": list(generation.logprobs),
        "tokens": [f" {w}" for w in words],
        "top_logprobs": [{f" {w}": lp for w, lp in _alternatives(generation, i, top)} for i in range(len(words))],
    }


def _chat_logprobs(generation: model.Generation, top: int) -> dict[str, Any]:
    def entry(word: str, logprob: float) -> dict[str, Any]:
        return {"token": f" {word}", "logprob": logprob, "bytes": list(f" {word}".encode())}

    return {
        "content": [
            {**entry(w, lp), "top_logprobs": [entry(a, alp) for a, alp in _alternatives(generation, i, top)][:top]}
            for i, (w, lp) in enumerate(zip(generation.words, generation.logprobs, strict=True))
        ]
    }


def text_of(generation: model.Generation) -> str:
    return "".join(f" {w}" for w in generation.words)


def _logprobs(request: ApiRequest, generation: model.Generation) -> dict[str, Any] | None:
    if request.top_logprobs is None:
        return None
    build = _chat_logprobs if request.chat else _completion_logprobs
    return build(generation, request.top_logprobs)


def response(
    request: ApiRequest, outcome: Outcome, prompt_tokens_details: bool, fingerprint: str | None = None
) -> dict[str, Any]:
    """The non-streaming response body; a completion's has every field of vllm 0.33.0's CompletionResponse and
    CompletionResponseChoice, in their order (completion/protocol.py:675-722)."""
    generation = outcome.generation
    logprobs = _logprobs(request, generation)
    if request.chat:
        choice: dict[str, Any] = {"index": 0, "logprobs": logprobs, "finish_reason": "length"}
        choice["message"] = {"role": "assistant", "content": text_of(generation)}
        return {**_envelope(request), "choices": [choice], "usage": usage(outcome, prompt_tokens_details)}
    choice = {
        "index": 0,
        "text": text_of(generation),
        "logprobs": logprobs,
        "finish_reason": "length",
        "stop_reason": None,
        "token_ids": None,
        "prompt_logprobs": None,
        "prompt_token_ids": None,
        "routed_experts": None,
        "weight_versions": None,  # new in 0.33 (protocol.py:701-702); 0.32's choice ends at routed_experts
    }
    return {
        **_envelope(request),
        "choices": [choice],
        "service_tier": None,
        "system_fingerprint": fingerprint,
        "usage": usage(outcome, prompt_tokens_details),
        "kv_transfer_params": None,
        "ec_transfer_params": None,
        "metrics": None,
    }


def _envelope(request: ApiRequest) -> dict[str, Any]:
    prefix, kind = ("chatcmpl", "chat.completion") if request.chat else ("cmpl", "text_completion")
    return {"id": f"{prefix}-{random_uuid()}", "object": kind, "created": int(time.time()), "model": request.model}


def stream_events(
    request: ApiRequest, outcome: Outcome, prompt_tokens_details: bool, fingerprint: str | None = None
) -> list[dict[str, Any]]:
    """The server-sent event payloads of a streaming response, one per generated token, then usage if asked for.

    A completion's follow vllm 0.33.0 completion/serving.py:438-547: each token chunk dumps the fields it set
    (`exclude_unset`): its choice's eight and `kv_transfer_params` (0.33 sets it on every chunk, 0.32 on none), and
    `system_fingerprint` on the last when no usage chunk follows; the usage chunk drops every null (`exclude_none`)."""
    envelope = _envelope(request)
    envelope["object"] = "chat.completion.chunk" if request.chat else "text_completion"
    events = []
    generation = outcome.generation
    for i, word in enumerate(generation.words):
        last = i == len(generation.words) - 1
        one = model.Generation((word,), (generation.logprobs[i],), generation.alternatives[i : i + 1])
        logprobs = _logprobs(request, one)
        if request.chat:
            choice: dict[str, Any] = {"index": 0, "finish_reason": "length" if last else None}
            choice["delta"] = {"content": f" {word}"} if i else {"role": "assistant", "content": f" {word}"}
            if logprobs is not None:
                choice["logprobs"] = logprobs
            events.append({**envelope, "choices": [choice]})
            continue
        choice = {
            "index": 0,
            "text": f" {word}",
            "logprobs": logprobs,
            "finish_reason": "length" if last else None,
            "stop_reason": None,
            "prompt_token_ids": None,
            "token_ids": None,
            "weight_versions": None,
        }
        chunk: dict[str, Any] = {**envelope, "choices": [choice]}
        if last and not request.include_usage and fingerprint is not None:
            chunk["system_fingerprint"] = fingerprint
        chunk["kv_transfer_params"] = None
        events.append(chunk)
    if request.include_usage:
        final = {**envelope, "choices": [], "usage": usage(outcome, prompt_tokens_details)}
        if not request.chat:
            final["system_fingerprint"] = fingerprint
        events.append(without_nulls(final))
    return events
