"""A chunk object damaged on disk in the chart's default L2 tier (LMCache's `fs` adapter): served, rejected or missed.

Finding (lmcache 0.5.6, line numbers of lmcache/v1/distributed/l2_adapters/fs_l2_adapter.py unless named): the fs
adapter writes a chunk's raw bytes with no header and no checksum (:5-7, :247-249, store :617-647), and a load
checks one thing, that it could read as many bytes as the destination buffer holds (:697-776; O_DIRECT :712-733 via
:536-567; read-ahead :739-753). So:
- a file of the right size with flipped bytes is a hit: the success bit is set (:763) and the flipped bytes are in
  the buffer, which the prefetch controller then makes readable in L1 like any loaded chunk
  (storage_controllers/prefetch_controller.py:1435-1438): wrong KV is served silently;
- a file one byte short is a miss: no error, the bit stays clear (:754-761) and the caller deletes the staging buffer
  (prefetch_controller.py:1439-1440), but the file stays, lookup still reports it (lookup is an existence test,
  :680-693), so every later lookup that reaches L2 finds it and every load of it misses;
- a longer file is a hit on its first bytes (the read stops when the buffer is full, :76-80, :91-95; the file's
  size is never compared);
- storing the key again never repairs a damaged file: a store skips a key whose file exists (:614-616).
All three read paths behave alike. The `serde` option (an `"serde"` key in the `--l2-adapter` JSON,
l2_adapters/config.py:186-230, :507; wrapped by storage_manager.py:1473-1481) with the `aesgcm` serde authenticates
each object: a flipped or truncated file fails its tag and becomes a miss (serde/aesgcm.py:106-133,
serde_wrapper.py:562-592). It binds no associated data (aesgcm.py:130-132) and so not the object's key: another chunk's
file of the same cache salt, put in this one's place, still loads, as that other chunk's KV. fp8 verifies nothing
(serde/fp8.py:74-86).

Each test drives the released adapter in this process, built from the JSON the chart renders
(charts/glm53/templates/engine/_lmcache.tpl, `glm53.lmcacheL2Adapter`) by the server's own parser, with L1 buffers
from LMCache's own `L1Manager`. One object is 4 KiB, a multiple of the filesystem block, so that `use_odirect` really
reads with O_DIRECT (:549-557). Under a second of CPU once torch and LMCache are imported.
"""

from __future__ import annotations

import argparse
import json
import os
import select
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, TypeVar

import pytest
import torch
from lmcache.v1.distributed.api import MemoryLayoutDesc, ObjectKey
from lmcache.v1.distributed.config import L1ManagerConfig, L1MemoryManagerConfig
from lmcache.v1.distributed.error import L1Error
from lmcache.v1.distributed.l1_manager import L1Manager
from lmcache.v1.distributed.l2_adapters import create_l2_adapter
from lmcache.v1.distributed.l2_adapters.config import parse_args_to_l2_adapters_config

# Imported by name, which registers the `fs` type: the registry would otherwise import the adapter modules in name order
# until one registers it (l2_adapters/config.py:77-93, factory.py:101-135), Google's Bigtable client among them (3 s).
from lmcache.v1.distributed.l2_adapters.fs_l2_adapter import FSL2Adapter
from lmcache.v1.distributed.l2_adapters.serde_wrapper import SerdeL2AdapterWrapper
from lmcache.v1.distributed.serde import create_serde_processor, make_temp_key
from lmcache.v1.platform import consume_fd

T = TypeVar("T")

MODEL = "zai-org/GLM-5.3"
SALT = "tenant-a"
# One chunk object: 2 x 16 x 64 bf16 = 4096 bytes, a whole filesystem block (fs_l2_adapter.py:549, :624).
LAYOUT = MemoryLayoutDesc(shapes=[torch.Size([2, 16, 64])], dtypes=[torch.bfloat16])
OBJECT_BYTES = 4096
# The buffers of one test: stored objects, load destinations and the aesgcm wrapper's temps (serde_wrapper.py:598-644).
L1_BYTES = 1 << 20
L1_TAG = "damage-test"
# An adapter answers within milliseconds here; past this a test fails instead of hanging.
TIMEOUT_SECONDS = 10.0
# The three ways FSL2Adapter reads a file (fs_l2_adapter.py:712-753): its JSON options beside the chart's.
READ_PATHS: dict[str, dict[str, Any]] = {
    "buffered": {},
    "read-ahead": {"read_ahead_size": 1024},
    "o-direct": {"use_odirect": True},
}


def chunk_key(index: int) -> ObjectKey:
    return ObjectKey(
        chunk_hash=index.to_bytes(32, "big"), model_name=MODEL, kv_rank=0, object_group_id=0, cache_salt=SALT
    )


def chart_adapter_json(directory: Path, **options: Any) -> str:
    """The chart's fs tier JSON (`{"type": "fs", "base_path": ...}`) with `options` added."""
    return json.dumps({"type": "fs", "base_path": str(directory), **options})


def build_adapter(adapter_json: str, l1: L1Manager) -> Any:
    """The adapter `lmcache server --l2-adapter JSON` runs: the server's parsing of that option, the factory, and the
    serde wrapper when the JSON asks for one (storage_manager.py:1473-1481). The namespace is the one argparse makes
    (dest `l2_adapter`, l2_adapters/config.py:402, :430-436); the parser itself is not built, since its help text
    imports every adapter module (config.py:441, factory.py:138-162)."""
    (config,) = parse_args_to_l2_adapters_config(argparse.Namespace(l2_adapter=[adapter_json])).adapters
    adapter = create_l2_adapter(config, l1.get_l1_memory_desc())
    assert isinstance(adapter, FSL2Adapter), f"the JSON built a {type(adapter).__name__}, not the fs adapter"
    if config.serde_config is not None:
        adapter = SerdeL2AdapterWrapper(inner=adapter, serde=create_serde_processor(config.serde_config), l1_manager=l1)
    return adapter


def await_result(event_fd: int, result: Callable[[], T | None]) -> T:
    """`result()` once it is not None, woken by the adapter's event fd as LMCache's controllers are."""
    deadline = time.monotonic() + TIMEOUT_SECONDS
    while (value := result()) is None:
        remaining = deadline - time.monotonic()
        assert remaining > 0, f"the adapter gave no result within {TIMEOUT_SECONDS} s; expected one in milliseconds"
        select.select([event_fd], [], [], remaining)
        consume_fd(event_fd)
    return value


class Tier:
    """One L2 adapter over a directory, with L1 buffers to store from and load into."""

    def __init__(self, adapter: Any, directory: Path, l1: L1Manager) -> None:
        self.adapter, self.directory, self.l1 = adapter, directory, l1
        self._buffers = 0

    def buffer(self, content: bytes | None = None) -> Any:
        """A fresh L1 object of LAYOUT (staged under a key of its own, as the prefetch controller stages a load's
        destination), holding `content` or zeros."""
        self._buffers += 1
        key = make_temp_key(chunk_key(10_000 + self._buffers))
        error, obj = self.l1.reserve_write([key], [True], LAYOUT, tag=L1_TAG)[key]
        assert error == L1Error.SUCCESS, f"L1 refused a {OBJECT_BYTES}-byte buffer: {error}"
        data = obj.tensor.view(torch.uint8).view(-1)
        if content is None:
            data.zero_()
        else:
            data.copy_(torch.frombuffer(bytearray(content), dtype=torch.uint8))
        return obj

    def store(self, key: ObjectKey, content: bytes) -> Any:
        """Store `content` under `key`; the adapter's L2StoreResult."""
        task = self.adapter.submit_store_task([key], [self.buffer(content)])
        fd = self.adapter.get_store_event_fd()
        return await_result(fd, lambda: self.adapter.pop_completed_store_tasks().get(task))

    def lookup(self, key: ObjectKey) -> bool:
        task = self.adapter.submit_lookup_and_lock_task([key], {0: LAYOUT})
        fd = self.adapter.get_lookup_and_lock_event_fd()
        found = await_result(fd, lambda: self.adapter.query_lookup_and_lock_result(task)).test(0)
        self.adapter.submit_unlock([key])
        return bool(found)

    def load(self, key: ObjectKey) -> tuple[bool, bytes]:
        """Load `key` into a zeroed buffer: the success bit and the buffer's bytes afterwards."""
        destination = self.buffer()
        task = self.adapter.submit_load_task([key], [destination])
        bitmap = await_result(self.adapter.get_load_event_fd(), lambda: self.adapter.query_load_result(task))
        return bool(bitmap.test(0)), bytes(destination.byte_array)

    def file(self, key: ObjectKey) -> Path:
        """The one file the adapter wrote for `key` (fs_l2_adapter.py:99-121 names it; found, not re-derived)."""
        (path,) = (p for p in self.directory.iterdir() if p.name.endswith(f"{key.chunk_hash.hex()}@{SALT}.data"))
        return path


@pytest.fixture
def l1() -> Iterator[L1Manager]:
    """LMCache's L1 manager, small and without a shared-memory segment; closed (every buffer freed) afterwards."""
    manager = L1Manager(L1ManagerConfig(memory_config=L1MemoryManagerConfig(L1_BYTES, use_lazy=False, shm_name="")))
    yield manager
    manager.close()


@contextmanager
def open_tier(adapter_json: str, directory: Path, l1: L1Manager) -> Iterator[Tier]:
    """The adapter the JSON describes over `directory`, closed on exit."""
    adapter = build_adapter(adapter_json, l1)
    try:
        yield Tier(adapter, directory, l1)
    finally:
        adapter.close()


@pytest.fixture(params=list(READ_PATHS))
def fs_tier(request: pytest.FixtureRequest, tmp_path: Path, l1: L1Manager) -> Iterator[Tier]:
    """The chart's fs tier in `tmp_path/l2`, read the way the parameter names."""
    directory = tmp_path / "l2"
    options = READ_PATHS[request.param]
    if options.get("use_odirect"):
        skip_unless_odirect(tmp_path)
    with open_tier(chart_adapter_json(directory, **options), directory, l1) as tier:
        yield tier


def skip_unless_odirect(directory: Path) -> None:
    """Skip when this filesystem cannot show the O_DIRECT read: it refuses O_DIRECT, or its block does not divide an
    object (the adapter then reads through the page cache, fs_l2_adapter.py:549-556)."""
    block = os.statvfs(directory).f_bsize
    if OBJECT_BYTES % block:
        pytest.skip(
            f"{directory} has {block}-byte blocks; a {OBJECT_BYTES}-byte object would not be read with O_DIRECT"
        )
    probe = directory / "odirect-probe"
    try:
        os.close(os.open(probe, os.O_CREAT | os.O_RDONLY | os.O_DIRECT, 0o600))
    except OSError as error:
        pytest.skip(f"{directory} refuses O_DIRECT ({error.strerror}); the O_DIRECT read path cannot run here")
    finally:
        probe.unlink(missing_ok=True)


def chunk_bytes(seed: int) -> bytes:
    """A chunk's KV: random bf16 values, as bytes."""
    generator = torch.Generator().manual_seed(seed)
    return bytes(torch.randn(LAYOUT.shapes[0], generator=generator).to(torch.bfloat16).view(torch.uint8).flatten())


def flipped(data: bytes, offset: int) -> bytes:
    damaged = bytearray(data)
    damaged[offset] ^= 0xFF
    return bytes(damaged)


# -- the chart's tier: `{"type": "fs", "base_path": ...}` --------------------------------------------------------------


def test_an_intact_chunk_loads_as_stored(fs_tier: Tier) -> None:
    key, stored = chunk_key(1), chunk_bytes(1)
    assert fs_tier.store(key, stored).is_successful()
    assert fs_tier.file(key).stat().st_size == OBJECT_BYTES  # raw bytes, no header (fs_l2_adapter.py:5-7)
    assert fs_tier.load(key) == (True, stored)


def test_a_chunk_with_flipped_bytes_is_served_as_a_hit(fs_tier: Tier) -> None:
    """The finding: same size, one byte flipped (the high byte of a bf16 value): the load succeeds and the buffer
    holds the damaged bytes (no checksum, fs_l2_adapter.py:754-763); storing the key again leaves the file as it is
    (fs_l2_adapter.py:614-616)."""
    key, stored = chunk_key(2), chunk_bytes(2)
    assert fs_tier.store(key, stored).is_successful()
    damaged = flipped(stored, OBJECT_BYTES // 2 + 1)  # little-endian: the odd byte holds the sign and exponent
    fs_tier.file(key).write_bytes(damaged)

    loaded, data = fs_tier.load(key)
    assert loaded, "a same-size damaged file was reported as a miss; LMCache now checks what it loads"
    assert data == damaged != stored

    again = fs_tier.store(key, stored)
    assert again.is_successful() and again.bytes_transferred() == 0
    assert fs_tier.file(key).read_bytes() == damaged


def test_a_truncated_chunk_is_a_miss_that_lookup_still_finds(fs_tier: Tier) -> None:
    """One byte short: the load reports a miss, with no error (fs_l2_adapter.py:754-761); the file stays, and lookup
    (an existence test, fs_l2_adapter.py:680-693) keeps reporting the chunk."""
    key, stored = chunk_key(3), chunk_bytes(3)
    assert fs_tier.store(key, stored).is_successful()
    fs_tier.file(key).write_bytes(stored[:-1])

    assert not fs_tier.load(key)[0]
    assert fs_tier.lookup(key)
    assert fs_tier.file(key).stat().st_size == OBJECT_BYTES - 1


def test_a_longer_file_is_served_by_its_first_bytes(fs_tier: Tier) -> None:
    """Twice the object's size, other content: a hit on the first OBJECT_BYTES bytes; the rest is never read and the
    file's size never compared (fs_l2_adapter.py:76-80, :91-95)."""
    key = chunk_key(4)
    assert fs_tier.store(key, chunk_bytes(4)).is_successful()
    longer = chunk_bytes(40) + chunk_bytes(41)
    fs_tier.file(key).write_bytes(longer)

    assert fs_tier.load(key) == (True, longer[:OBJECT_BYTES])


# -- the same tier with LMCache's `aesgcm` serde: `"serde": {"type": "aesgcm", "master_key_path": ...}` ----------------


def test_the_aesgcm_serde_rejects_damage_but_not_another_chunks_file(tmp_path: Path, l1: L1Manager) -> None:
    """AES-GCM's tag turns a flipped or truncated file into a miss (serde/aesgcm.py:127-132, serde_wrapper.py:584-589);
    a file of another chunk of the same salt, put in this one's place, loads as a hit with that chunk's KV, since the
    object's key is not authenticated (aesgcm.py:130-132 passes no associated data)."""
    master_key = tmp_path / "master.key"
    master_key.write_bytes(os.urandom(32))
    directory = tmp_path / "l2"
    serde = {"type": "aesgcm", "master_key_path": str(master_key)}
    with open_tier(chart_adapter_json(directory, serde=serde), directory, l1) as tier:
        key, other = chunk_key(5), chunk_key(6)
        stored, other_stored = chunk_bytes(5), chunk_bytes(6)
        assert tier.store(key, stored).is_successful()
        assert tier.store(other, other_stored).is_successful()
        frame = tier.file(key).read_bytes()
        assert len(frame) == OBJECT_BYTES + 1 + 12 + 16  # version, IV, ciphertext, tag (aesgcm.py:31-36)
        assert tier.load(key) == (True, stored)

        tier.file(key).write_bytes(flipped(frame, len(frame) // 2))
        assert not tier.load(key)[0]

        tier.file(key).write_bytes(frame[:-1])
        assert not tier.load(key)[0]

        tier.file(key).write_bytes(tier.file(other).read_bytes())
        assert tier.load(key) == (True, other_stored)
