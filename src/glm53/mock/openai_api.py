"""The OpenAI-compatible request and response shapes of the mock vLLM server, as pure functions.

Requests are validated into an `ApiRequest` (a bad field is a 400 with vLLM's error body); responses are built from the
engine's `Outcome`. Prompts follow the stand-in's tokenizer rule: a string is one token per whitespace-separated word, a
list of integers is used as token ids as-is, and chat messages are joined by newlines. `usage` carries
`prompt_tokens_details.cached_tokens` (local plus external hits) only when the server runs with
`--enable-prompt-tokens-details`, as vLLM does.
"""

from __future__ import annotations

import time
import uuid
from dataclasses import dataclass
from typing import Any

from glm53.mock import model
from glm53.mock.engine import Outcome, Prompt

DEFAULT_MAX_TOKENS = 16
MAX_TOP_LOGPROBS = 5
SALT_FORBIDDEN = frozenset("@/\\\x00")
SALT_MAX_LEN = 128


class ApiError(Exception):
    """A request the server rejects; `status` and `message` become vLLM's error body."""

    def __init__(self, status: int, message: str, kind: str = "BadRequestError") -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.kind = kind

    def body(self) -> dict[str, Any]:
        return {"error": {"message": self.message, "type": self.kind, "param": None, "code": self.status}}


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


def parse_request(body: Any, chat: bool, served_model: str, max_model_len: int) -> ApiRequest:
    if not isinstance(body, dict):
        raise ApiError(400, "the request body must be a JSON object")
    name = body.get("model", served_model)
    if name != served_model:
        raise ApiError(404, f"The model `{name}` does not exist.", "NotFoundError")
    text = _prompt_text(body, chat)
    tokens = tuple(model.tokenize(text)) if isinstance(text, str) else tuple(text)
    answer = model.extract_answer(text) if isinstance(text, str) else None
    if not tokens:
        raise ApiError(400, "the prompt is empty")
    max_tokens = (
        _int_field(
            body, "max_completion_tokens" if chat and "max_tokens" not in body else "max_tokens", DEFAULT_MAX_TOKENS, 1
        )
        or DEFAULT_MAX_TOKENS
    )
    if len(tokens) + max_tokens > max_model_len:
        raise ApiError(
            400,
            f"This model's maximum context length is {max_model_len} tokens. However, you requested "
            f"{len(tokens) + max_tokens} tokens ({len(tokens)} in the messages, {max_tokens} in the completion).",
        )
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


def _top_logprobs(body: dict[str, Any], chat: bool) -> int | None:
    if not chat:
        return _int_field(body, "logprobs", None, 0, MAX_TOP_LOGPROBS)
    if not body.get("logprobs"):
        return None
    return _int_field(body, "top_logprobs", 0, 0, MAX_TOP_LOGPROBS)


def usage(outcome: Outcome, prompt_tokens_details: bool) -> dict[str, Any]:
    """vLLM's UsageInfo; `prompt_tokens_details.cached_tokens` only under `--enable-prompt-tokens-details`
    (vllm 0.33.0 entrypoints/openai/completion/serving.py:508-511 and :668-676), else the field stays null."""
    completion = len(outcome.generation.words)
    details = {"cached_tokens": outcome.cached_tokens} if prompt_tokens_details else None
    return {
        "prompt_tokens": outcome.prompt_tokens,
        "completion_tokens": completion,
        "total_tokens": outcome.prompt_tokens + completion,
        "prompt_tokens_details": details,
    }


def _alternatives(generation: model.Generation, position: int, count: int) -> list[tuple[str, float]]:
    chosen = (generation.words[position], generation.logprobs[position])
    others = list(generation.first_alternatives) if position == 0 else []
    return [chosen, *others][: max(count, 1)]


def _completion_logprobs(generation: model.Generation, top: int) -> dict[str, Any]:
    words = generation.words
    offsets, position = [], 0
    for word in words:
        offsets.append(position)
        position += len(word) + 1
    return {
        "tokens": [f" {w}" for w in words],
        "token_logprobs": list(generation.logprobs),
        "top_logprobs": [
            {f" {w}": lp for w, lp in _alternatives(generation, i, top)} if top else None for i in range(len(words))
        ],
        "text_offset": offsets,
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


def response(request: ApiRequest, outcome: Outcome, prompt_tokens_details: bool) -> dict[str, Any]:
    """The non-streaming response body."""
    generation = outcome.generation
    logprobs = None
    if request.top_logprobs is not None:
        build = _chat_logprobs if request.chat else _completion_logprobs
        logprobs = build(generation, request.top_logprobs)
    choice: dict[str, Any] = {"index": 0, "logprobs": logprobs, "finish_reason": "length"}
    if request.chat:
        choice["message"] = {"role": "assistant", "content": text_of(generation)}
    else:
        choice["text"] = text_of(generation)
    return {**_envelope(request), "choices": [choice], "usage": usage(outcome, prompt_tokens_details)}


def _envelope(request: ApiRequest) -> dict[str, Any]:
    prefix, kind = ("chatcmpl", "chat.completion") if request.chat else ("cmpl", "text_completion")
    return {"id": f"{prefix}-{uuid.uuid4().hex}", "object": kind, "created": int(time.time()), "model": request.model}


def stream_events(request: ApiRequest, outcome: Outcome, prompt_tokens_details: bool) -> list[dict[str, Any]]:
    """The server-sent event payloads of a streaming response, one per generated token, then usage if asked for."""
    envelope = _envelope(request)
    envelope["object"] = "chat.completion.chunk" if request.chat else "text_completion"
    events = []
    generation = outcome.generation
    for i, word in enumerate(generation.words):
        last = i == len(generation.words) - 1
        choice: dict[str, Any] = {"index": 0, "finish_reason": "length" if last else None}
        if request.chat:
            choice["delta"] = {"content": f" {word}"} if i else {"role": "assistant", "content": f" {word}"}
        else:
            choice["text"] = f" {word}"
        if request.top_logprobs is not None:
            one = model.Generation((word,), (generation.logprobs[i],), generation.first_alternatives if i == 0 else ())
            build = _chat_logprobs if request.chat else _completion_logprobs
            choice["logprobs"] = build(one, request.top_logprobs)
        events.append({**envelope, "choices": [choice]})
    if request.include_usage:
        events.append({**envelope, "choices": [], "usage": usage(outcome, prompt_tokens_details)})
    return events
