"""The mock engine's request path: local prefix cache first, LMCache for the rest, simulated compute, then store.

This is where the seeds' numbers come from. vLLM's local cache serves whole scheduler blocks and never the last prompt
token. The connector then asks LMCache for the longest stored chunk-aligned prefix; for strict-prefix (hybrid)
profiles it looks up at most L-1 tokens, so the external hit is floor((L-1)/C)*C minus what the local cache already
gave (8507 tokens at C = 1152: 8064); single-group profiles look up all L tokens (5040 at C = 256: 4864). After the
request the prompt's whole chunks are stored in LMCache under its cache_salt. The `recovery-mismatch` fault looks up
the full prompt on a strict-prefix profile (seed 004): a prompt of exactly k*C tokens then reports k*C external hits
and its first-token log-prob shifts, as a state restored for L tokens while L-1 were credited would.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from glm53.mock import model, protocol
from glm53.mock.lmcache_client import LMCacheClient, LMCacheRefused, LMCacheUnavailable
from glm53.mock.loglines import VllmLogger
from glm53.mock.store import ChunkStore
from glm53.mock.vllm_metrics import VllmMetrics

RECOVERY_MISMATCH = "recovery-mismatch"
FAULTS = (RECOVERY_MISMATCH,)


@dataclass(frozen=True)
class Prompt:
    tokens: tuple[int, ...]
    cache_salt: str
    max_tokens: int
    answer: str | None = None


@dataclass(frozen=True)
class Outcome:
    generation: model.Generation
    prompt_tokens: int
    local_hit_tokens: int
    external_hit_tokens: int
    ttft_seconds: float

    @property
    def cached_tokens(self) -> int:
        return self.local_hit_tokens + self.external_hit_tokens


@dataclass(frozen=True)
class EngineSettings:
    block_size: int
    chunk_size: int
    strict_prefix: bool
    fault: str | None
    seed: int
    cost: model.ComputeCost
    bytes_per_token: int
    noise_sd: float


def external_lookup_limit(prompt_tokens: int, strict_prefix: bool, fault: str | None) -> int:
    """How many leading prompt tokens the connector may look up in LMCache (L-1 under the strict-prefix rule)."""
    return prompt_tokens - 1 if strict_prefix and fault != RECOVERY_MISMATCH else prompt_tokens


class Engine:
    """Serialises requests (one engine step at a time) so the request counter, caches and metrics stay consistent."""

    def __init__(
        self, settings: EngineSettings, local: ChunkStore, client: LMCacheClient, metrics: VllmMetrics
    ) -> None:
        self.settings = settings
        self.local = local
        self.client = client
        self.metrics = metrics
        self.requests = 0
        self._lock = threading.Lock()
        self._log = VllmLogger("EngineCore_DP0")

    def run(self, prompt: Prompt, on_token: Callable[[Outcome, int], None] | None = None) -> Outcome:
        """Prefill under the engine lock (one at a time), then decode token by token, calling `on_token` for each."""
        start = time.monotonic()
        with self.metrics.running.track_inprogress():
            outcome = self._prefill_and_decode(prompt, start, on_token)
        self.metrics.generation_tokens.inc(len(outcome.generation.words))
        self.metrics.request_success.inc()
        self.metrics.e2e.observe(time.monotonic() - start)
        return outcome

    def _prefill_and_decode(
        self, prompt: Prompt, start: float, on_token: Callable[[Outcome, int], None] | None
    ) -> Outcome:
        s = self.settings
        with self._lock:
            length = len(prompt.tokens)
            local_keys = protocol.prefix_keys(prompt.cache_salt, prompt.tokens, s.block_size, limit=length - 1)
            local_hit = self.local.longest_prefix(local_keys) * s.block_size
            limit = external_lookup_limit(length, s.strict_prefix, s.fault)
            external_hit = max(0, self._lookup(prompt, limit) - local_hit)
            full_hit = local_hit + external_hit >= length
            shift = model.RECOVERY_MISMATCH_SHIFT if s.fault == RECOVERY_MISMATCH and full_hit else 0.0
            self.requests += 1
            time.sleep(s.cost.prefill(max(1, length - local_hit - external_hit)) + s.cost.decode(1))
            ttft = time.monotonic() - start
            generation = model.generate(
                prompt.tokens, prompt.max_tokens, s.seed, self.requests, shift, s.noise_sd, prompt.answer
            )
            self.local.put("", protocol.prefix_keys(prompt.cache_salt, prompt.tokens, s.block_size), 1)
            self._store(prompt)
            self._record_prefill(length, local_hit, external_hit, ttft)
        outcome = Outcome(generation, length, local_hit, external_hit, ttft)
        for index in range(len(generation.words)):
            if index:
                time.sleep(s.cost.decode(1))
            if on_token is not None:
                on_token(outcome, index)
        return outcome

    def _lookup(self, prompt: Prompt, limit: int) -> int:
        if not self.client.healthy:
            return 0
        keys = protocol.prefix_keys(prompt.cache_salt, prompt.tokens, self.settings.chunk_size, limit=limit)
        reply = self._call({"op": "lookup", "keys": keys})
        return int(reply.get("hit_tokens", 0)) if reply else 0

    def _store(self, prompt: Prompt) -> None:
        if not self.client.healthy:
            return
        chunk = self.settings.chunk_size
        keys = protocol.prefix_keys(prompt.cache_salt, prompt.tokens, chunk)
        if keys:
            message = {"op": "store", "salt": prompt.cache_salt, "keys": keys}
            self._call({**message, "chunk_bytes": chunk * self.settings.bytes_per_token})

    def _call(self, message: dict[str, Any]) -> dict[str, Any] | None:
        try:
            return self.client.request(message)
        except LMCacheUnavailable:
            self._log.warning(
                "lmcache_mp_connector.py:812",
                f"LMCache MP server at '{self.client.url}' did not answer {message['op']} within "
                f"{self.client.timeout}s; treating it as a miss until it answers again.",
            )
        except LMCacheRefused as error:
            self._log.warning("lmcache_mp_connector.py:820", f"LMCache MP server refused {message['op']}: {error}")
        return None

    def _record_prefill(self, length: int, local: int, external: int, ttft: float) -> None:
        m = self.metrics
        m.prefix_queries.inc(length)
        m.prefix_hits.inc(local)
        m.external_queries.inc(length)
        m.external_hits.inc(external)
        m.prompt_tokens_cached.inc(local + external)
        m.prompt_tokens.inc(length)
        m.ttft.observe(ttft)

    def reset_local(self) -> None:
        with self._lock:
            self.local.clear()

    def reset_external(self) -> bool:
        with self._lock:
            return self._call({"op": "clear"}) is not None
