"""The engine stand-in's KV path: LMCache's own connector adapters talking to the real `lmcache server`.

vLLM 0.33's `LMCacheMPConnector` hands over to LMCache's (lmcache/integration/vllm/lmcache_mp_connector.py), a
vLLM-facing shell around two classes of lmcache/integration/vllm/vllm_multi_process_adapter.py that need no vLLM:
`LMCacheMPSchedulerAdapter` (lookups, lock releases, sessions, CLEAR) and, per TP worker, `LMCacheMPWorkerAdapter`
(KV registration, stores, retrieves). The stand-in drives those same classes, built as the connector builds them
(connector:727-771), so the wire protocol and what happens after Ready are upstream's by construction (line numbers
below are the adapter module's):
- each adapter starts its `HeartbeatThread` lazily, the scheduler's at its first lookup (:827-843), a worker's at its
  first store or retrieve (:1682-1705), pinging every `lmcache.mp.heartbeat_interval` with that timeout; a failed
  ping clears the adapter's health event and logs `LMCache server is unhealthy — entering degraded mode` (:611-614)
  (measured: the next ping to a SIGKILLed server fails at once, one to a frozen server after its timeout);
- while unhealthy, lookups are misses (:884-885, :989-991), stores are dropped (:1819-1829), and a retrieve submitted
  or in flight is reported failed (:1894-1898, :2073-2108), which `retrieve` returns; a lookup the server never
  answers waits until then (the scheduler polls it, :997-1014);
- on the first good ping after a failed one a worker registers its KV caches again (recover callback: :593-610,
  :1716-1761) and logs `Finished re-registering KV caches after server recovery`; a server restarted before any ping
  failed is never told (it answers PING for any instance: lmcache v1/multiprocess/modules/management.py:105-120), and
  rejects the worker's stores and retrieves (`Rejecting STORE for unregistered GPU instance ID`,
  modules/lmcache_driven_transfer.py:616-628, :890-910; LMCache #4642).
Two waits are the stand-in's own: for the server's chunk size at start (`chunk_size`), so that a stop signal ends it
and the start-up failure stays one line; and for each store to finish before the engine's next step (vLLM's finish
asynchronously), so that a prompt sent again finds its chunks.

Each simulated worker registers one tiny CPU layer per cacheable group (4 bytes per token: the values never matter)
in `lmcache_driven` mode, CUDA's default (`auto` resolves to it on devices with that stack: lmcache
v1/platform/base/device_spec.py:156-175, devices/cuda/__init__.py:161-163), which moves CPU tensors through POSIX SHM
(transfer_context/worker_transfer.py:1019); `lmcache.mp.mp_transfer_mode` overrides it as in vLLM. torch and LMCache
are the `pod` extra: imported when a `KVClient` is created, never by the slim toolkit (probe, exporter, chart helpers).
"""

from __future__ import annotations

import functools
import math
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

from glm53.errors import EXIT_FAILURE, Glm53Error
from glm53.mock.connector import ConnectorConfig

# lmcache 0.5.6 v1/multiprocess/modules/lmcache_driven_transfer.py:685-695: chunks whose block ids are all vLLM's null
# block (id 0) are never stored, so a request's blocks start at 1, as vLLM's block pool hands them out.
FIRST_BLOCK_ID = 1
# lmcache 0.5.6 lmcache_driven_transfer.py:806-810: a store's objects become visible when `finish_write_by_owner`
# runs on the server's stream thread, shortly after the STORE reply. A lookup of the same salt right after a store
# waits this long, so the validation's prime-then-reload is deterministic (measured: 50 ms always suffices on CPU).
STORE_SETTLE_SECONDS = 0.1
# How often a pending lookup, store or retrieve is polled (vLLM's scheduler asks again at each step).
POLL_SECONDS = 0.002
# The start-up wait for the chunk size checks for a stop signal this often.
START_POLL_SECONDS = 0.2
# vllm 0.33.0 envs.py:253 (VLLM_WORKER_SHUTDOWN_TIMEOUT_SECONDS = 5) and v1/executor/multiproc_executor.py:559-608:
# at shutdown the workers get 5 s to exit by themselves (a worker's adapter unregisters, which waits up to
# mq_timeout for a lost server) before they are terminated.
WORKER_SHUTDOWN_SECONDS = 5.0
MP_PREFIX = "lmcache.mp."
# What the stand-in's workers use when `lmcache.mp.mp_transfer_mode` is not given: CUDA's default (module docstring).
DEFAULT_TRANSFER_MODE = "lmcache_driven"

T = TypeVar("T")


class Stopped(Glm53Error):
    """A stop signal arrived while waiting for the server."""

    def __init__(self) -> None:
        super().__init__("the engine is shutting down", EXIT_FAILURE)


@dataclass(frozen=True)
class KVLayout:
    """What the simulated workers register: the connector's group geometry and the engine's size limits."""

    model: str
    tensor_parallel_size: int
    group_tokens_per_block: tuple[int, ...]  # 0 = scratch group: never registered, stored or retrieved
    scheduler_block_size: int
    max_model_len: int

    @property
    def cacheable(self) -> tuple[int, ...]:
        """kv_cache_groups.py:291,347 (lmcache 0.5.6 integration/vllm): scratch groups' layers form no group."""
        return tuple(tokens for tokens in self.group_tokens_per_block if tokens > 0)

    @property
    def reports_failed_requests(self) -> bool:
        """Several KV groups: load failures are reported per request, else per block (connector:589-595)."""
        return len(self.group_tokens_per_block) > 1

    def num_blocks(self, tokens_per_block: int) -> int:
        return FIRST_BLOCK_ID + math.ceil(self.max_model_len / tokens_per_block)


def adapter_extra_config(connector: ConnectorConfig) -> dict[str, Any]:
    """The `lmcache.mp.*` keys the adapters resolve (`ExtraConfigDefault`, vllm_multi_process_adapter.py:100-151),
    as given, with the two numbers the stand-in checked and its default transfer mode; the connector's other keys
    (host and port, lazy offload, auto-start) stay out: the stand-in emulates none of what they change."""
    from lmcache.integration.vllm.vllm_multi_process_adapter import ExtraConfigDefault

    config = {
        MP_PREFIX + name: connector.extra[MP_PREFIX + name]
        for name in ExtraConfigDefault.__members__
        if MP_PREFIX + name in connector.extra
    }
    config.setdefault(MP_PREFIX + "mp_transfer_mode", DEFAULT_TRANSFER_MODE)
    config[MP_PREFIX + "mq_timeout"] = connector.mq_timeout
    config[MP_PREFIX + "heartbeat_interval"] = connector.heartbeat_interval
    return config


def _finished(worker: Any, request_id: str, storing: bool) -> bool | None:
    """True once the worker adapter reports the request's store (or retrieve) done, as vLLM polls it each step
    (`get_finished`, vllm_multi_process_adapter.py:2045-2180: a store counts once vLLM has finished the request)."""
    stores, retrieves = worker.get_finished({request_id} if storing else set())
    return True if request_id in ((stores if storing else retrieves) or ()) else None


class KVClient:
    """The scheduler's adapter and one worker adapter per TP rank, for one engine step at a time (the engine's lock)."""

    def __init__(self, connector: ConnectorConfig, stop: threading.Event) -> None:
        import zmq
        from lmcache.v1.multiprocess.transport.factory import RequestClientFactory

        self.connector = connector
        self.stop = stop
        self._zmq = zmq.Context()
        self._zmq.setsockopt(zmq.LINGER, 0)
        self._probe: Any = RequestClientFactory.create(connector.url, context=self._zmq)
        self._scheduler: Any = None
        self._workers: list[Any] = []
        self._layout: KVLayout | None = None
        self._stored_at: dict[str, float] = {}

    def chunk_size(self) -> int | None:
        """The server's chunk size (GET_CHUNK_SIZE, which each adapter asks again), or None when the server did not
        answer within mq_timeout; polled in slices so a stop signal (Stopped) is never stuck behind the deadline."""
        future = self._probe.get_chunk_size()
        deadline = time.monotonic() + self.connector.mq_timeout
        while True:
            try:
                return int(future.result(timeout=min(START_POLL_SECONDS, max(0.0, deadline - time.monotonic()))))
            except TimeoutError:
                if time.monotonic() >= deadline:
                    return None
                if self.stop.is_set():
                    raise Stopped() from None

    def connect(self, layout: KVLayout) -> None:
        """Build the adapters as the connector does (connector:727-771), each worker registering its KV caches.

        Raises the adapters' own errors: ConnectionError when the server does not answer within mq_timeout
        (vllm_multi_process_adapter.py:305-332, :1636-1680).
        """
        import torch
        from lmcache.integration.vllm.vllm_multi_process_adapter import (
            LMCacheMPSchedulerAdapter,
            LMCacheMPWorkerAdapter,
            ParallelStrategy,
        )
        from lmcache.v1.multiprocess.group_view import EngineGroupInfo

        self._layout = layout
        tp = layout.tensor_parallel_size
        extra = adapter_extra_config(self.connector)
        urls = self.connector.urls
        if tp % len(urls):
            # lmcache_mp_connector.py:675-678 asserts this before any adapter exists.
            raise Glm53Error(
                f"world_size ({tp}) must be divisible by n_servers ({len(urls)}): lmcache.mp.server_urls names "
                f"{len(urls)} servers for TP {tp}; give one server per rank or per equal block of ranks",
                EXIT_FAILURE,
            )

        def strategy(rank: int) -> Any:
            # The stand-in's keys are per TP rank (num_kv_readers 1), as for a model that is not MLA-only.
            return ParallelStrategy(
                mla_only=False, vllm_world_size=tp, vllm_worker_id=rank, tp_size=tp, pp_size=1, n_servers=len(urls)
            )

        infos = [
            EngineGroupInfo(engine_group_id=index, layer_indices=(index,), tokens_per_block=tokens)
            for index, tokens in enumerate(layout.cacheable)
        ]
        block_size = layout.scheduler_block_size
        for rank in range(tp):
            # lmcache_mp_connector.py:759-762: a worker talks only to the server of its block of ranks.
            url = urls[rank // (tp // len(urls))]
            worker = LMCacheMPWorkerAdapter(
                url, self._zmq, layout.model, block_size, strategy(rank), extra_config=extra
            )
            self._workers.append(worker)
            # (K/V, blocks, tokens per block, heads, head size): the vLLM NHD layout of one layer, one fp16 per slot.
            kv = {
                f"layer.{index}": torch.zeros((2, layout.num_blocks(tokens), tokens, 1, 1), dtype=torch.float16)
                for index, tokens in enumerate(layout.cacheable)
            }
            worker.register_kv_caches(kv, infos, layout_hints={"kv_layout": "NHD"})
        # The scheduler looks up on every server and takes the minimum (vllm_multi_process_adapter.py:1054-1068).
        self._scheduler = LMCacheMPSchedulerAdapter(
            list(urls), self._zmq, layout.model, block_size, strategy(0), extra_config=extra
        )
        # The probe goes only now that every adapter has its socket. Each LMCache client binds a monitor endpoint named
        # after its socket's descriptor (lmcache 0.5.6 zmq_impl/mq.py:312; pyzmq 27.3.0 sugar/socket.py:1146,
        # `inproc://monitor.s-{FD}`), and closing a client (mq.py:505-509) leaves that endpoint to libzmq's reaper
        # thread. Closed first, the probe handed its descriptor to the first worker's socket while its endpoint was
        # still bound, and on a loaded machine that worker died of `ZMQError: Address already in use`.
        self._probe.close()
        self._probe = None

    def _poll(self, answer: Callable[[], T | None]) -> T:
        """`answer()` once it is not None; upstream sets no deadline here (a lost server makes the adapter unhealthy,
        which answers), so only a stop signal ends the wait early."""
        while True:
            result = answer()
            if result is not None:
                return result
            if self.stop.is_set():
                raise Stopped()
            time.sleep(POLL_SECONDS)

    def lookup(self, tokens: Sequence[int], salt: str, reserve_last_token: bool, request_id: str) -> int:
        """Tokens LMCache holds for the prompt, in whole chunks (LOOKUP, then the prefetch status).

        The adapter aligns the range down to whole chunks, one token short with `reserve_last_token`
        (vllm_multi_process_adapter.py:891-894); the scheduler then drops the lookup's state (connector:1433).
        """
        settle = self._stored_at.pop(salt, 0.0) + STORE_SETTLE_SECONDS - time.monotonic()
        if settle > 0:
            time.sleep(settle)
        scheduler = self._scheduler
        scheduler.maybe_submit_lookup_request(
            request_id, list(tokens), cache_salt=salt, reserve_last_token=reserve_last_token
        )
        hit = self._poll(lambda: scheduler.check_lookup_result(request_id))
        scheduler.cleanup_lookup_result(request_id)
        return int(hit)

    def release(self, tokens: Sequence[int], salt: str, end: int, request_id: str) -> None:
        """Free the read locks of the looked-up chunks in [0, end) that nothing will retrieve (FREE_LOOKUP_LOCKS)."""
        if end > 0:
            self._scheduler.free_lookup_locks(list(tokens), 0, end, request_id, cache_salt=salt)

    def _op(self, tokens: Sequence[int], span: tuple[int, int], skip: int = 0) -> Any:
        """The request's blocks for tokens [start, end), per cacheable group (its blocks are 1, 2, ...)."""
        from lmcache.integration.vllm.vllm_multi_process_adapter import LoadStoreOp

        assert self._layout is not None
        start, end = span
        blocks = [list(range(FIRST_BLOCK_ID + start // t, FIRST_BLOCK_ID + end // t)) for t in self._layout.cacheable]
        return LoadStoreOp(token_ids=list(tokens), block_ids=blocks, start=start, end=end, skip_first_n_tokens=skip)

    def retrieve(self, tokens: Sequence[int], salt: str, span: tuple[int, int], skip: int, request_id: str) -> bool:
        """Every worker loads its share of tokens [start, end) (RETRIEVE), writing none of the first `skip`; False
        when any worker's load failed, as the connector reports it to vLLM (connector:1073-1132)."""
        assert self._layout is not None
        op = self._op(tokens, span, skip)
        for worker in self._workers:
            worker.submit_retrieve_request(request_id, op, worker.create_recorded_event(), cache_salt=salt)
        failed = False
        for worker in self._workers:
            self._poll(functools.partial(_finished, worker, request_id, storing=False))
            if self._layout.reports_failed_requests:
                failed |= request_id in worker.get_failed_request_ids()
            else:
                failed |= bool(worker.get_block_ids_with_load_errors())
        return not failed

    def store(self, tokens: Sequence[int], salt: str, span: tuple[int, int], request_id: str) -> None:
        """Every worker stores its share of tokens [start, end), whole chunks (STORE); waits until each is done."""
        op = self._op(tokens, span)
        for worker in self._workers:
            worker.submit_store_request(request_id, op, worker.create_recorded_event(), cache_salt=salt)
        for worker in self._workers:
            self._poll(functools.partial(_finished, worker, request_id, storing=True))
        self._stored_at[salt] = time.monotonic()

    def end_session(self, request_id: str) -> None:
        """END_SESSION, as the connector's request_finished sends it (connector:1579)."""
        self._scheduler.end_session(request_id)

    def clear(self) -> bool:
        """CLEAR without force, as the connector's reset_cache sends it (vllm_multi_process_adapter.py:1093-1129)."""
        return bool(self._scheduler.reset_cache())

    def close(self) -> None:
        """Shut the adapters down as vLLM's do at exit, the workers (each unregisters) within vLLM's grace."""
        shutdowns = [threading.Thread(target=worker.shutdown, daemon=True) for worker in self._workers]
        for thread in shutdowns:
            thread.start()
        deadline = time.monotonic() + WORKER_SHUTDOWN_SECONDS
        for thread in shutdowns:
            thread.join(max(0.0, deadline - time.monotonic()))
        self._workers.clear()
        if self._scheduler is not None:
            self._scheduler.shutdown()
        if self._probe is not None:
            self._probe.close()
        if not any(thread.is_alive() for thread in shutdowns):
            self._zmq.term()  # a worker still unregistering holds its socket: the process exits without the term
