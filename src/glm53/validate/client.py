"""HTTP to an OpenAI-compatible vLLM server with the standard library: completions, metrics, the cache-reset endpoint.

Validation runs inside the serving image and on laptops, so it avoids third-party HTTP clients. Every request has a
timeout, and every way a request can fail (refused, timed out, closed, HTTP error) becomes one `Glm53Error` sentence
naming the URL, so a dead server ends validation with exit 2 instead of a hang or a traceback.
"""

from __future__ import annotations

import http.client
import json
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from typing import Any

from glm53.errors import EXIT_USAGE, Glm53Error
from glm53.validate.metrics import Snapshot, parse_exposition

DEV_MODE_MESSAGE = "start vLLM with VLLM_SERVER_DEV_MODE=1 (validation only)"


@dataclass(frozen=True)
class Completion:
    """One completion as validation needs it: output, first-token log-prob, cache usage and client-side timings."""

    text: str
    first_logprob: float | None
    prompt_tokens: int | None
    cached_tokens: int | None
    ttft_seconds: float
    total_seconds: float
    # The generated tokens as the server names them (`logprobs.tokens`; empty when no log-probs were asked for).
    tokens: tuple[str, ...] = ()


# How long a refused prefix-cache reset is retried: LMCache's store of the last request holds its blocks meanwhile.
RESET_RETRY_SECONDS = 10.0


class VllmClient:
    """A vLLM server at `base_url` (e.g. http://127.0.0.1:8000), every request bounded by `timeout` seconds."""

    def __init__(self, base_url: str, timeout: float = 60.0) -> None:
        if not base_url.startswith(("http://", "https://")):
            raise Glm53Error(f"--base-url must start with http:// or https://, got {base_url!r}")
        self.base_url = base_url.rstrip("/")
        self.timeout = timeout

    def _open(self, method: str, path: str, body: Any = None) -> http.client.HTTPResponse:
        data = None if body is None else json.dumps(body).encode()
        request = urllib.request.Request(f"{self.base_url}{path}", data=data, method=method)
        if data is not None:
            request.add_header("Content-Type", "application/json")
        try:
            response: http.client.HTTPResponse = urllib.request.urlopen(request, timeout=self.timeout)
        except urllib.error.HTTPError as error:
            detail = " ".join(error.read(300).decode(errors="replace").split())
            error.close()
            raise HttpStatusError(method, f"{self.base_url}{path}", error.code, detail) from None
        except (urllib.error.URLError, OSError, http.client.HTTPException) as error:
            raise self._unreachable(method, path, error) from None
        return response

    def _unreachable(self, method: str, path: str, error: BaseException) -> Glm53Error:
        reason = error.reason if isinstance(error, urllib.error.URLError) else error
        if isinstance(reason, TimeoutError):
            what = f"no answer within {self.timeout:g}s"
        else:
            what = str(reason) or type(reason).__name__
        return Glm53Error(
            f"cannot reach vLLM at {self.base_url} ({method} {path}: {what}); check --base-url and that the server "
            "is up and healthy",
            EXIT_USAGE,
        )

    def _read(self, method: str, path: str, body: Any = None) -> bytes:
        try:
            with self._open(method, path, body) as response:
                return response.read()
        except (OSError, http.client.HTTPException) as error:
            raise self._unreachable(method, path, error) from None

    def get_json(self, path: str) -> Any:
        return _decode_json(self._read("GET", path), f"{self.base_url}{path}")

    def metrics(self) -> Snapshot:
        return parse_exposition(self._read("GET", "/metrics").decode(errors="replace"))

    @property
    def metrics_source(self) -> str:
        return f"{self.base_url}/metrics"

    def model_ids(self) -> list[str]:
        listing = self.get_json("/v1/models")
        try:
            return [str(entry["id"]) for entry in listing["data"]]
        except (KeyError, TypeError):
            raise Glm53Error(
                f"{self.base_url}/v1/models did not list models as OpenAI does ({{'data': [...]}})"
            ) from None

    def reset_prefix_cache(self, reset_external: bool = False) -> None:
        """Clear vLLM's local prefix cache (and LMCache's too when `reset_external`); exists only in dev mode.

        vLLM refuses while any block is in use (vllm 0.33.0 v1/core/block_pool.py:881-887), and a request that just
        finished still holds its blocks while LMCache stores them: the connector asks vLLM to free them only once
        the store is done (lmcache 0.5.6 integration/vllm/lmcache_mp_connector.py:1580 returns `_can_store`;
        vllm 0.33.0 v1/core/sched/scheduler.py:3058-3060). So a refusal is retried for RESET_RETRY_SECONDS; one that
        persists means other clients keep requests running.
        """
        path = f"/reset_prefix_cache?reset_external={str(reset_external).lower()}"
        deadline = time.monotonic() + RESET_RETRY_SECONDS
        pause = 0.02
        while True:
            try:
                answer = self._read("POST", path)
            except HttpStatusError as error:
                if error.status == 404:
                    raise Glm53Error(
                        f"POST {path} answered 404: vLLM's dev mode is off; {DEV_MODE_MESSAGE}", EXIT_USAGE
                    ) from None
                raise
            if not _refused(answer):
                return
            if time.monotonic() > deadline:
                # A stale cache would make every "reloaded" run a local hit.
                raise Glm53Error(
                    f"vLLM refused POST {path} (success: false) for {RESET_RETRY_SECONDS:g} s, so reuse could come "
                    "from its local cache; validate an idle server (no other clients)",
                    EXIT_USAGE,
                )
            time.sleep(pause)
            pause = min(2 * pause, 0.5)

    def complete(
        self,
        model: str,
        prompt: str | list[int],
        *,
        max_tokens: int,
        cache_salt: str,
        logprobs: int | None = None,
        stream: bool = False,
    ) -> Completion:
        """A temperature-0 completion; with `stream` the time to the first streamed token is measured too."""
        body: dict[str, Any] = {
            "model": model,
            "prompt": prompt,
            "max_tokens": max_tokens,
            "temperature": 0,
            "cache_salt": cache_salt,
        }
        if logprobs is not None:
            body["logprobs"] = logprobs
        if stream:
            body["stream"] = True
            body["stream_options"] = {"include_usage": True}
        start = time.perf_counter()
        try:
            with self._open("POST", "/v1/completions", body) as response:
                if "text/event-stream" in response.headers.get("Content-Type", ""):
                    return self._read_stream(response, start)
                payload = response.read()
        except (OSError, http.client.HTTPException) as error:
            raise self._unreachable("POST", "/v1/completions", error) from None
        elapsed = time.perf_counter() - start
        return _completion(_decode_json(payload, f"{self.base_url}/v1/completions"), [], elapsed, elapsed)

    def _read_stream(self, response: http.client.HTTPResponse, start: float) -> Completion:
        """Server-sent events: one JSON chunk per `data:` line until `data: [DONE]`; usage arrives in the last one."""
        chunks: list[Any] = []
        first: float | None = None
        for raw in response:
            line = raw.decode(errors="replace").strip()
            if not line.startswith("data:"):
                continue
            data = line.removeprefix("data:").strip()
            if data == "[DONE]":
                break
            chunk = _decode_json(data.encode(), f"{self.base_url}/v1/completions (stream)")
            if first is None and chunk.get("choices"):
                first = time.perf_counter()
            chunks.append(chunk)
        total = time.perf_counter() - start
        if not chunks:
            raise Glm53Error(f"{self.base_url}/v1/completions streamed no data; expected OpenAI server-sent events")
        return _completion(chunks[0], chunks[1:], (first or time.perf_counter()) - start, total)


class HttpStatusError(Glm53Error):
    """The server answered, but with an HTTP error status."""

    def __init__(self, method: str, url: str, status: int, detail: str) -> None:
        super().__init__(f"vLLM answered HTTP {status} to {method} {url}: {detail or '(empty body)'}", EXIT_USAGE)
        self.status = status


def _refused(answer: bytes) -> bool:
    """True when a reset answer says `{"success": false}` (older servers answer 200 with no body: accepted)."""
    try:
        decoded = json.loads(answer)
    except ValueError:
        return False
    return isinstance(decoded, dict) and decoded.get("success") is False


def _decode_json(payload: bytes, url: str) -> Any:
    try:
        return json.loads(payload)
    except ValueError:
        raise Glm53Error(f"{url} did not answer JSON; check that --base-url points at vLLM's OpenAI server") from None


def _completion(first: Any, rest: list[Any], ttft: float, total: float) -> Completion:
    """Join a completion response (or its streamed chunks) into one `Completion`."""
    try:
        choices = [c for chunk in (first, *rest) for c in chunk.get("choices") or []]
        text = "".join(str(choice.get("text") or "") for choice in choices)
        usage = next((chunk["usage"] for chunk in reversed((first, *rest)) if chunk.get("usage")), None) or {}
        details = usage.get("prompt_tokens_details") or {}
        logprobs = next((c["logprobs"] for c in choices if c.get("logprobs")), None)
        tokens = tuple(str(t) for c in choices for t in (c.get("logprobs") or {}).get("tokens") or [])
    except (AttributeError, KeyError, TypeError):
        raise Glm53Error("the completion response is not OpenAI-shaped (expected choices[].text and usage)") from None
    return Completion(
        text=text,
        first_logprob=_first_logprob(logprobs),
        prompt_tokens=usage.get("prompt_tokens"),
        cached_tokens=details.get("cached_tokens"),
        ttft_seconds=ttft,
        total_seconds=total,
        tokens=tokens,
    )


def _first_logprob(logprobs: Any) -> float | None:
    """The log-prob of the most likely first token: the best of `top_logprobs[0]`, else `token_logprobs[0]`."""
    if not isinstance(logprobs, dict):
        return None
    top = logprobs.get("top_logprobs") or []
    if top and isinstance(top[0], dict) and top[0]:
        return float(max(top[0].values()))
    chosen = logprobs.get("token_logprobs") or []
    return float(chosen[0]) if chosen and chosen[0] is not None else None
