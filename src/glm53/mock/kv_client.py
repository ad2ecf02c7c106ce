"""The engine stand-in's KV path: LMCache's own client classes talking to the real `lmcache server`.

Like vLLM's `LMCacheMPConnector`, nothing here re-implements LMCache's wire protocol: the request client comes from
`RequestClientFactory` (lmcache/v1/multiprocess/transport/factory.py), each simulated TP worker registers its KV
tensors through `create_transfer_context(..., mode="lmcache_driven")` (CPU tensors travel through POSIX SHM,
lmcache/v1/multiprocess/transfer_context/worker_transfer.py:1019), and keys are LMCache's `IPCCacheServerKey`.
So chunk hashing, whole-chunk alignment, hits, eviction and the `lmcache_mp_*` metrics are the server's own.

The tensors are tiny (one layer per cacheable group, 4 bytes per token) so the pod fits in a few GiB; their values
never matter. torch and LMCache are the `pod` extra: they are imported when a `KVClient` is created, never by the slim
toolkit (probe, exporter, chart helpers).

Every RPC has a deadline. A server that does not answer raises `ServerLost`, which the stand-in reports in one line
and exits on, instead of hanging or silently serving misses.
"""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from glm53.errors import EXIT_FAILURE, Glm53Error

# lmcache 0.5.6 cli/commands/bench/server_bench/helpers.py:96: client instance ids kept clear of the legacy id 0.
INSTANCE_ID_BASE = 1000
# lmcache 0.5.6 v1/multiprocess/modules/lmcache_driven_transfer.py:685-695: chunks whose block ids are all vLLM's null
# block (id 0) are never stored, so a request's blocks start at 1, as vLLM's block pool hands them out.
FIRST_BLOCK_ID = 1
# lmcache 0.5.6 lmcache_driven_transfer.py:806-810: a store's objects become visible when `finish_write_by_owner`
# runs on the server's stream thread, shortly after the STORE reply. A lookup of the same salt right after a store
# waits this long, so the validation's prime-then-reload is deterministic (measured: 50 ms always suffices on CPU).
STORE_SETTLE_SECONDS = 0.1
POLL_SECONDS = 0.2


class Stopped(Glm53Error):
    """A stop signal arrived while waiting for the server."""

    def __init__(self) -> None:
        super().__init__("the engine is shutting down", EXIT_FAILURE)


class ServerLost(Glm53Error):
    """The LMCache server did not answer an RPC within its deadline."""

    def __init__(self, url: str, operation: str, timeout: float) -> None:
        super().__init__(
            f"the LMCache MP server at '{url}' did not answer {operation} within {timeout:g}s; it is down or was "
            "restarted: check the sidecar's log, then restart this engine",
            EXIT_FAILURE,
        )


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

    def num_blocks(self, tokens_per_block: int) -> int:
        return FIRST_BLOCK_ID + math.ceil(self.max_model_len / tokens_per_block)


class KVClient:
    """One request client for the scheduler's lookups, and one registered transfer context per TP worker."""

    def __init__(self, url: str, timeout: float, stop: threading.Event) -> None:
        import zmq
        from lmcache.v1.multiprocess.transport.factory import RequestClientFactory

        self.url = url
        self.timeout = timeout
        self.stop = stop
        self._zmq = zmq.Context()
        self._zmq.setsockopt(zmq.LINGER, 0)
        self._client: Any = RequestClientFactory.create(url, context=self._zmq)
        self._workers: list[tuple[Any, dict[str, Any]]] = []
        self._layout: KVLayout | None = None
        self._chunk_size = 0
        self._stored_at: dict[str, float] = {}
        self.lost = False

    def _result(self, future: Any, operation: str, timeout: float | None = None) -> Any:
        """The reply, waiting in short slices so a stop signal is never stuck behind a long deadline."""
        wait = self.timeout if timeout is None else timeout
        deadline = time.monotonic() + wait
        while True:
            try:
                return future.result(timeout=min(POLL_SECONDS, max(0.0, deadline - time.monotonic())))
            except TimeoutError:
                if time.monotonic() >= deadline:
                    self.lost = True
                    raise ServerLost(self.url, operation, wait) from None
                if self.stop.is_set():
                    raise Stopped() from None

    def chunk_size(self, timeout: float) -> int:
        """The server's chunk size (vllm_multi_process_adapter.py:261-278, GET_CHUNK_SIZE); waits up to `timeout`."""
        self._chunk_size = int(self._result(self._client.get_chunk_size(), "GET_CHUNK_SIZE", timeout))
        return self._chunk_size

    def register(self, layout: KVLayout) -> None:
        """Each TP worker registers one small CPU layer per cacheable group (REGISTER_KV_CACHE, lmcache_driven)."""
        import torch
        from lmcache.utils import EngineType
        from lmcache.v1.multiprocess.group_view import EngineGroupInfo
        from lmcache.v1.multiprocess.transfer_context import create_transfer_context

        self._layout = layout
        blocks_in_chunk = self._chunk_size // layout.scheduler_block_size
        infos = [
            EngineGroupInfo(engine_group_id=index, layer_indices=(index,), tokens_per_block=tokens)
            for index, tokens in enumerate(layout.cacheable)
        ]
        for rank in range(layout.tensor_parallel_size):
            # (K/V, blocks, tokens per block, heads, head size): the vLLM NHD layout of one layer, one fp16 per slot.
            kv = {
                f"layer.{index}": torch.zeros((2, layout.num_blocks(tokens), tokens, 1, 1), dtype=torch.float16)
                for index, tokens in enumerate(layout.cacheable)
            }
            context = create_transfer_context(
                kv, mode="lmcache_driven", instance_id=INSTANCE_ID_BASE + rank, req_client=self._client
            )
            self._workers.append((context, kv))
            try:
                context.register(
                    kv,
                    layout.model,
                    layout.tensor_parallel_size,
                    blocks_in_chunk,
                    self.timeout,
                    layout_hints={"kv_layout": "NHD"},
                    engine_group_infos=infos,
                    engine_type=EngineType.VLLM,
                )
            except TimeoutError:
                self.lost = True
                raise ServerLost(self.url, f"REGISTER_KV_CACHE (TP rank {rank})", self.timeout) from None

    def _key(self, tokens: Sequence[int], salt: str, span: tuple[int, int], request_id: str, worker: int | None) -> Any:
        from lmcache.v1.multiprocess.custom_types import IPCCacheServerKey

        assert self._layout is not None
        # vllm_multi_process_adapter.py:1272-1283; num_kv_readers is 1 for non-MLA layouts (adapter:419-429).
        return IPCCacheServerKey(
            model_name=self._layout.model,
            world_size=self._layout.tensor_parallel_size,
            worker_id=worker,
            token_ids=tuple(tokens),
            start=span[0],
            end=span[1],
            request_id=request_id,
            cache_salt=salt,
            num_kv_readers=1,
        )

    def lookup(self, tokens: Sequence[int], salt: str, lookup_tokens: int, request_id: str) -> int:
        """Tokens LMCache holds for the prompt's first `lookup_tokens`, in whole chunks (LOOKUP + prefetch status).

        The range is aligned down to whole chunks first, as vllm_multi_process_adapter.py:891-894 does.
        """
        end = lookup_tokens // self._chunk_size * self._chunk_size
        if end == 0:
            return 0
        settle = self._stored_at.pop(salt, 0.0) + STORE_SETTLE_SECONDS - time.monotonic()
        if settle > 0:
            time.sleep(settle)
        assert self._layout is not None
        key = self._key(tokens, salt, (0, end), request_id, None)
        self._result(self._client.lookup(key, self._layout.tensor_parallel_size), "LOOKUP")
        chunks = self._result(self._client.wait_prefetch_status(request_id, self.timeout), "QUERY_PREFETCH_STATUS")
        return int(chunks or 0) * self._chunk_size

    def _block_ids(self, start: int, end: int) -> list[list[int]]:
        """Per group, the engine blocks holding tokens [start, end) of the request (its blocks are 1, 2, ...)."""
        assert self._layout is not None
        return [list(range(FIRST_BLOCK_ID + start // t, FIRST_BLOCK_ID + end // t)) for t in self._layout.cacheable]

    def retrieve(self, tokens: Sequence[int], salt: str, end: int, skip: int, request_id: str) -> None:
        """Every worker loads its share of the first `end` tokens (RETRIEVE), each releasing its lookup lock."""
        assert self._layout is not None
        blocks_in_chunk = self._chunk_size // self._layout.scheduler_block_size
        for rank, (context, kv) in enumerate(self._workers):
            key = self._key(tokens, salt, (0, end), request_id, rank)
            future = context.submit_retrieve(
                request_id, key, kv, self._block_ids(0, end), context.create_recorded_event(), blocks_in_chunk, skip
            )
            self._result(future, f"RETRIEVE (TP rank {rank})")

    def release(self, tokens: Sequence[int], salt: str, end: int, request_id: str) -> None:
        """Free the read locks of a lookup nothing will retrieve (FREE_LOOKUP_LOCKS)."""
        assert self._layout is not None
        key = self._key(tokens, salt, (0, end), request_id, None)
        self._result(self._client.free_lookup_locks(key, self._layout.tensor_parallel_size), "FREE_LOOKUP_LOCKS")

    def store(self, tokens: Sequence[int], salt: str, span: tuple[int, int], request_id: str) -> None:
        """Every worker stores its share of the prompt's tokens [start, end), whole chunks (STORE)."""
        assert self._layout is not None
        blocks_in_chunk = self._chunk_size // self._layout.scheduler_block_size
        for rank, (context, kv) in enumerate(self._workers):
            key = self._key(tokens, salt, span, request_id, rank)
            future = context.submit_store(
                request_id, key, kv, self._block_ids(*span), context.create_recorded_event(), blocks_in_chunk
            )
            self._result(future, f"STORE (TP rank {rank})")
        self._stored_at[salt] = time.monotonic()

    def end_session(self, request_id: str) -> None:
        self._result(self._client.end_session(request_id), "END_SESSION")

    def clear(self) -> None:
        """CLEAR without force, as the connector's reset_cache sends it (vllm_multi_process_adapter.py:1093-1118)."""
        self._result(self._client.clear(force=False), "CLEAR")

    def close(self) -> None:
        """Unregister (skipped once the server is lost: nobody would answer) and release SHM segments and sockets."""
        for context, _ in self._workers:
            if not self.lost:
                future = context.unregister()
                if future is not None:
                    try:
                        future.result(timeout=min(self.timeout, 5.0))
                    except TimeoutError:
                        self.lost = True
            context.close()
        self._workers.clear()
        self._client.close()
        self._zmq.term()
