"""vLLM 0.33's KV-cache events, published by the engine stand-in in vLLM's exact wire format (`--kv-events-config`).

A router that routes by KV events (vllm-router's `kv_aware`) indexes what each engine's prefix cache holds from these
messages, so the stand-in publishes what its local prefix cache does, the way vLLM's block pool reports it:
`BlockStored` for each newly cached block of each cache group, `BlockRemoved` for each evicted one,
`AllBlocksCleared` on a prefix-cache reset (vllm/v1/core/block_pool.py:583-601, 659-663, 908).

Wire format (vllm 0.33.0 vllm/distributed/kv_events.py): msgspec structs - the batch `array_like`, the events
tagged by class name, both `omit_defaults` (:31-149); block hashes as 64-bit ints by default
(VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES=1, vllm/envs.py:2024-2026, v1/core/kv_cache_utils.py:82-85); each batch a ZMQ
multipart `(topic, 8-byte big-endian sequence number, msgpack payload)` on a PUB socket (:505-511) that binds
wildcard and ipc/inproc endpoints and connects to any other (:440-458). The config's fields and defaults are
vllm/config/kv_events.py:14-47. vLLM is not installed next to the toolkit, so the structs are declared here with the
same names, fields, order and options.
msgspec comes with LMCache (the `pod` extra), like everything the stand-in imports when it connects.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from itertools import count
from typing import Any

import msgspec
import zmq

from glm53.errors import Glm53Error
from glm53.mock.connector import KVEventsConfig

MEDIUM_GPU = "GPU"  # vllm/distributed/kv_events.py:51


class EventBatch(msgspec.Struct, array_like=True, omit_defaults=True, gc=False):
    ts: float
    events: list[Any]
    data_parallel_rank: int | None = None


class KVCacheEvent(msgspec.Struct, omit_defaults=True, gc=False, tag=True):
    """Base class of the events; the tag is the class name, as in vLLM."""


class BlockStored(KVCacheEvent):
    block_hashes: list[bytes | int]
    parent_block_hash: bytes | int | None
    token_ids: list[int]
    block_size: int
    lora_id: int | None
    medium: str | None
    lora_name: str | None
    extra_keys: list[tuple[Any, ...] | None] | None = None
    group_idx: int | None = None
    kv_cache_spec_kind: str | None = None
    kv_cache_spec_sliding_window: int | None = None
    locality: str | None = None
    ownership: str | None = None
    session_id: str | None = None
    lookahead_token_ids: list[list[int]] | None = None


class BlockRemoved(KVCacheEvent):
    block_hashes: list[bytes | int]
    medium: str | None
    group_idx: int | None = None
    locality: str | None = None
    ownership: str | None = None


class AllBlocksCleared(KVCacheEvent):
    pass


class KVEventBatch(EventBatch):
    events: list[BlockStored | BlockRemoved | AllBlocksCleared]


def external_hash(block_hash: str) -> int:
    """vLLM's int form of a block hash: the digest's big-endian value, low 64 bits (kv_cache_utils.py:82-85)."""
    return int.from_bytes(bytes.fromhex(block_hash), "big") & ((1 << 64) - 1)


class KVEventPublisher:
    """One PUB socket; each batch goes out with the next sequence number, as vLLM's publisher thread sends it."""

    def __init__(self, config: KVEventsConfig) -> None:
        self._context = zmq.Context()
        self._socket = self._context.socket(zmq.PUB)
        self._socket.set_hwm(config.hwm)
        self._socket.setsockopt(zmq.LINGER, 0)
        endpoint = config.endpoint
        try:
            if "*" in endpoint or "::" in endpoint or endpoint.startswith(("ipc://", "inproc://")):
                self._socket.bind(endpoint)
            else:
                self._socket.connect(endpoint)
        except zmq.ZMQError as error:
            self.close()
            raise Glm53Error(
                f"cannot open the KV-event endpoint {endpoint} ({error}); choose another endpoint"
            ) from None
        self._topic = config.topic.encode()
        self._sequence = count()
        self._encoder = msgspec.msgpack.Encoder()

    def publish(self, events: Sequence[BlockStored | BlockRemoved | AllBlocksCleared]) -> None:
        if not events:
            return
        batch = KVEventBatch(ts=time.time(), events=list(events), data_parallel_rank=0)
        payload = self._encoder.encode(batch)
        self._socket.send_multipart((self._topic, next(self._sequence).to_bytes(8, "big"), payload))

    def close(self) -> None:
        self._socket.close()
        self._context.term()


def stored_events(
    salt: str, tokens: Sequence[int], hashes: Sequence[str], new: Sequence[int], block_size: int, groups: Sequence[int]
) -> list[BlockStored | BlockRemoved | AllBlocksCleared]:
    """BlockStored for the prompt's newly cached blocks `new`, per block and cacheable group (block_pool.py:583-601)."""
    events: list[BlockStored | BlockRemoved | AllBlocksCleared] = []
    for group, tokens_per_block in enumerate(groups):
        if tokens_per_block <= 0:
            continue
        for index in new:
            events.append(
                BlockStored(
                    block_hashes=[external_hash(hashes[index])],
                    parent_block_hash=external_hash(hashes[index - 1]) if index else None,
                    token_ids=list(tokens[index * block_size : (index + 1) * block_size]),
                    block_size=block_size,
                    lora_id=None,
                    medium=MEDIUM_GPU,
                    lora_name=None,
                    # the salt keys the first block only (kv_cache_utils.py:659-661), untagged per block (:696-704)
                    extra_keys=[(salt,)] if salt and index == 0 else [None],
                    group_idx=group,
                )
            )
    return events


def removed_events(hashes: Sequence[str], groups: Sequence[int]) -> list[BlockStored | BlockRemoved | AllBlocksCleared]:
    """BlockRemoved for evicted blocks, per cacheable group (block_pool.py:659-663)."""
    return [
        BlockRemoved(block_hashes=[external_hash(h)], medium=MEDIUM_GPU, group_idx=group)
        for group, tokens_per_block in enumerate(groups)
        if tokens_per_block > 0
        for h in hashes
    ]
