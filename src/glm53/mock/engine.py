"""The engine stand-in's request path: vLLM's local prefix cache, then LMCache through its own adapters, then store.

The rules on vLLM's side of the connector are applied exactly as LMCache 0.5.6's `LMCacheMPConnector` does
(`lmcache/integration/vllm/lmcache_mp_connector.py`; vLLM 0.33 ships the same connector under
`vllm/distributed/kv_transfer/kv_connector/v1/lmcache_mp_connector.py`, which imports it):
- hybrid models (Mamba cache mode `align`) reserve the last prompt token: the lookup covers at most L-1 tokens,
  aligned down to whole chunks (connector:601, vllm_multi_process_adapter.py:891-894), so 8507 tokens at C = 1152
  can hit 8064;
- the tokens to load are LMCache's hit minus what vLLM's own cache already computed (connector:1330), and on a
  full-prompt hit one fewer, because vLLM must recompute the last token (connector:1341-1346): L = 256 at C = 256
  loads 255;
- the lookup's locks on what is not retrieved are freed (connector:1437-1464), and the retrieve starts at the chunk
  holding vLLM's own last computed token, writing none of what vLLM has (lmcache_mp_metadata.py:335-395).
Everything else (chunk hashing, which chunks exist, eviction, the `lmcache_mp_*` counters) is the real server's.
After prefill the prompt's whole chunks beyond what LMCache already held are stored.

A load that fails (the server was lost, or restarted without this engine's registration: `kv_client`) goes the way
of vLLM's scheduler under `kv_load_failure_policy`: `fail` ends the request with FinishReason.ERROR (`LoadFailed`,
which the API answers with HTTP 500); `recompute` computes it again, from scratch when the model has several KV groups
or the load started at token 0 (the connector then bypasses LMCache for it), else from the load's first token.
The `recovery-mismatch` fault drops the last-token reservation (seed 004): a hybrid prompt of exactly k*C tokens then
loads k*C-1 tokens, more than the strict-prefix bound (k-1)*C, and its first-token log-prob shifts, as a recurrent
state restored for the whole prompt while vLLM recomputes the last token would. The `corrupt-restore` fault restores
the wrong state: every request that loaded tokens from LMCache continues as if from another prefix (its first-token
log-prob shifts and its words change), while every hit counter stays right; validation must name the divergence.
"""

from __future__ import annotations

import logging
import threading
import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from glm53.mock import logs, model
from glm53.mock.connector import DEFAULT_LOAD_FAILURE_POLICY
from glm53.mock.kv_client import KVClient
from glm53.mock.local_cache import LocalPrefixCache, block_hashes
from glm53.mock.logs import VllmLogger
from glm53.mock.vllm_metrics import VllmMetrics

RECOVERY_MISMATCH = "recovery-mismatch"
# Restored state that is wrong while every counter is right (what LMCache 0.5.6's CPU path does to a hybrid's
# linear-attention state): a request that loaded anything from LMCache continues from another prefix's state.
CORRUPT_RESTORE = "corrupt-restore"
FAULTS = (RECOVERY_MISMATCH, CORRUPT_RESTORE)


def tokens_to_load(lmcache_hit: int, vllm_computed: int, prompt_tokens: int) -> int:
    """The external hit vLLM counts: LMCache's hit beyond vLLM's own, one fewer on a full-prompt hit.

    lmcache 0.5.6 lmcache_mp_connector.py:1330 (`need_to_load = max(0, ret - num_computed_tokens)`) and :1341-1346
    (`if ret == len(request.all_token_ids): need_to_load = max(0, need_to_load - 1)`).
    """
    load = max(0, lmcache_hit - vllm_computed)
    return max(0, load - 1) if lmcache_hit == prompt_tokens else load


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


class EventSink(Protocol):
    """Where the local prefix cache's changes go as vLLM KV events (glm53.mock.kv_events.KVEventPublisher)."""

    def publish(self, events: Sequence[Any]) -> None: ...

    def close(self) -> None: ...


@dataclass(frozen=True)
class EngineSettings:
    block_size: int
    groups: tuple[int, ...]  # group_tokens_per_block, for the KV events' group_idx
    chunk_size: int
    reserve_last_token: bool  # the hybrid profiles' Mamba `align` mode (connector:601)
    fault: str | None
    seed: int
    cost: model.ComputeCost
    noise_sd: float
    load_failure_policy: str = DEFAULT_LOAD_FAILURE_POLICY  # vLLM's kv_load_failure_policy: "fail" or "recompute"


class LoadFailed(Exception):
    """vLLM finished the request with FinishReason.ERROR: its KV load from LMCache failed under
    `kv_load_failure_policy=fail` (vllm 0.33.0 v1/core/sched/scheduler.py:2557-2575)."""


@dataclass(frozen=True)
class Admission:
    """What the KV path leaves to prefill."""

    restored_hit: int  # LMCache's hit, when its KV reached the request (0 after a failed load)
    computed: int  # tokens prefill skips: vLLM's own hit plus what was loaded
    external: int  # vLLM's count of the connector's tokens (usage and counters)
    loaded: int  # tokens actually restored from LMCache
    stored: int  # the connector's `num_stored_tokens`: the store starts there (connector:1327)


class Engine:
    """One engine step at a time (a lock), so counters, caches and LMCache sessions stay consistent."""

    def __init__(
        self,
        settings: EngineSettings,
        local: LocalPrefixCache,
        kv: KVClient,
        metrics: VllmMetrics,
        log: VllmLogger,
        events: EventSink | None = None,
    ) -> None:
        self.settings = settings
        self.local = local
        self.kv = kv
        self.metrics = metrics
        self.requests = 0
        self._lock = threading.Lock()
        self._log = log
        self._events = events

    def run(self, prompt: Prompt, on_token: Callable[[Outcome, int], None] | None = None) -> Outcome:
        """Prefill under the engine lock, then decode token by token, calling `on_token` for each.

        Raises LoadFailed when vLLM would finish the request with an error.
        """
        start = time.monotonic()
        with self.metrics.running.track_inprogress():
            try:
                outcome = self._prefill_and_decode(prompt, start, on_token)
            except LoadFailed:
                # vllm 0.33.0 v1/engine/output_processor.py:869-885: a finished request counts by its reason.
                self.metrics.request_error.inc()
                self.metrics.e2e.observe(time.monotonic() - start)
                raise
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
            hashes = block_hashes(prompt.cache_salt, prompt.tokens, s.block_size)
            # vLLM's own cache never serves the last prompt token, so it matches at most L-1 tokens' blocks.
            local_hit = self.local.longest_prefix(hashes[: (length - 1) // s.block_size]) * s.block_size
            request_id = uuid.uuid4().hex  # one LMCache session per request: lookup, load, store
            admission = self._admit(prompt, local_hit, request_id)
            self.requests += 1
            time.sleep(s.cost.prefill(max(1, length - admission.computed)) + s.cost.decode(1))
            ttft = time.monotonic() - start
            self._store(prompt, admission.stored, request_id)
            self.kv.end_session(request_id)
            restored = admission.restored_hit >= length
            shift = model.RECOVERY_MISMATCH_SHIFT if s.fault == RECOVERY_MISMATCH and restored else 0.0
            state = prompt.tokens
            if s.fault == CORRUPT_RESTORE and admission.loaded > 0:
                shift, state = model.CORRUPT_RESTORE_SHIFT, (*prompt.tokens, model.WRONG_STATE_TOKEN)
            generation = model.generate(
                state, prompt.max_tokens, s.seed, self.requests, shift, s.noise_sd, prompt.answer
            )
            self._cache_locally(prompt, hashes)
            self._record_prefill(length, local_hit + admission.external, ttft)
        outcome = Outcome(generation, length, local_hit, admission.external, ttft)
        for index in range(len(generation.words)):
            if index:
                time.sleep(s.cost.decode(1))
            if on_token is not None:
                on_token(outcome, index)
        return outcome

    def _admit(self, prompt: Prompt, local_hit: int, request_id: str) -> Admission:
        """Look up, then retrieve what vLLM does not have already, freeing the locks of what it will not load."""
        s, tokens, salt = self.settings, prompt.tokens, prompt.cache_salt
        reserve = s.reserve_last_token and s.fault != RECOVERY_MISMATCH
        hit = self.kv.lookup(tokens, salt, reserve, request_id)
        load = tokens_to_load(hit, local_hit, len(tokens))
        self._record_admission(len(tokens), local_hit, load)
        if load == 0:
            self.kv.release(tokens, salt, hit, request_id)
            return Admission(hit, local_hit, 0, 0, hit)
        self.kv.release(tokens, salt, local_hit, request_id)  # whole chunks below vLLM's own hit
        begin = local_hit // s.chunk_size * s.chunk_size
        if self.kv.retrieve(tokens, salt, (begin, hit), local_hit - begin, request_id):
            return Admission(hit, local_hit + load, load, load, hit)
        return self._load_failed(prompt, local_hit, begin, load, hit, request_id)

    def _load_failed(
        self, prompt: Prompt, local_hit: int, begin: int, load: int, hit: int, request_id: str
    ) -> Admission:
        """vLLM 0.33's scheduler on a failed asynchronous load (v1/core/sched/scheduler.py).

        One KV group: the worker reports the failed blocks (`_handle_invalid_blocks`, :3703-3785); the request's
        computed tokens end at the first of them, `begin` (:3584-3686), and the policy's line is logged. Several: it
        reports the request, which then counts no computed token (`_handle_failed_recving`, :3688-3701), silently.
        `fail` finishes the request with an error. Under `recompute` a request left with no computed token (several
        groups, or `begin` 0) is admitted again (:3467-3497), counted again, and the connector serves it nothing
        (connector:1275-1291), so its store starts at token 0; one left with `begin` computes on from there and
        keeps its first admission's counts (prefill stats are set at admission, :1252-1258).
        """
        s = self.settings
        several_groups = len(s.groups) > 1
        affected = local_hit + load - begin
        fail = s.load_failure_policy == "fail"
        if not several_groups and fail:
            self._log.error(
                logs.LOAD_FAILED,
                "Failing %d request(s) due to KV load failure (failure_policy=fail, %d tokens affected). "
                "Request IDs: %s",
                1,
                affected,
                {request_id},
            )
        elif not several_groups:
            self._log.warning(
                logs.LOAD_RECOVERED,
                "Recovered from KV load failure: %d request(s) rescheduled (%d tokens affected).",
                1,
                affected,
            )
        if fail:
            self.kv.end_session(request_id)  # the finished request's session (connector:1579)
            raise LoadFailed(request_id)
        if several_groups or begin == 0:
            logs.log_connector(
                logging.WARNING,
                logs.BYPASS,
                "Bypassing LMCache for request %s after a failed async KV load; the prompt will be recomputed locally.",
                request_id,
            )
            self._record_admission(len(prompt.tokens), local_hit, 0)
            return Admission(0, local_hit, 0, 0, 0)
        return Admission(0, begin, load, 0, hit)

    def _store(self, prompt: Prompt, stored: int, request_id: str) -> None:
        """Store the prompt's whole chunks from where the connector's stored count stands (connector:1327)."""
        end = len(prompt.tokens) // self.settings.chunk_size * self.settings.chunk_size
        if end > stored:
            self.kv.store(prompt.tokens, prompt.cache_salt, (stored, end), request_id)

    def _cache_locally(self, prompt: Prompt, hashes: list[str]) -> None:
        new, evicted = self.local.put(hashes)
        if self._events is not None:
            from glm53.mock import kv_events  # msgspec: the pod extra

            s = self.settings
            stored = kv_events.stored_events(prompt.cache_salt, prompt.tokens, hashes, new, s.block_size, s.groups)
            self._events.publish([*kv_events.removed_events(evicted, s.groups), *stored])

    def _record_admission(self, length: int, local: int, external: int) -> None:
        """The prefix-cache counters vLLM's scheduler records when it admits a request (scheduler.py:1488-1512)."""
        m = self.metrics
        m.prefix_queries.inc(length)
        m.prefix_hits.inc(local)
        # vllm 0.33.0 v1/core/sched/scheduler.py:1211-1214 (0.32: :1039-1042): the connector is asked about the tokens
        # beyond vLLM's own hit, `request.num_tokens - num_new_local_computed_tokens`.
        m.external_queries.inc(length - local)
        m.external_hits.inc(external)

    def _record_prefill(self, length: int, cached: int, ttft: float) -> None:
        m = self.metrics
        m.prompt_tokens_cached.inc(cached)
        m.prompt_tokens.inc(length)
        m.ttft.observe(ttft)

    def reset_local(self) -> None:
        with self._lock:
            self.local.clear()
            if self._events is not None:
                from glm53.mock import kv_events

                self._events.publish([kv_events.AllBlocksCleared()])

    def reset_external(self) -> bool:
        """The connector's reset_cache: CLEAR on the server; False when it did not answer within mq_timeout."""
        with self._lock:
            return self.kv.clear()

    def close(self) -> None:
        with self._lock:
            self.kv.close()
            if self._events is not None:
                self._events.close()
