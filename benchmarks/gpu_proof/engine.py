"""The vLLM engine stand-in (needs torch and lmcache): each TP rank's role as LMCache's connector gives it, its KV
tensors registered with the server over CUDA IPC (POSIX SHM on CPU), and the store, lookup and retrieve of whole
requests with vLLM's block ids, compared byte for byte."""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from . import ProofError
from .geometry import (
    DTYPE_BYTES,
    NULL_BLOCK,
    Case,
    Plane,
    block_ids,
    engine_block_ids,
    num_blocks_for,
    restored_blocks,
)
from .stats import now_ns, request_seed

MODEL_NAME_PREFIX = "glm53-gpu-proof"
INSTANCE_ID = 1000
RPC_TIMEOUT_SECONDS = 60.0
# A poison byte pattern the retrieve must overwrite; the sources are random, so an untouched block is caught.
POISON_BYTE = 0x5A
# How long a stored request may take to become visible to lookups before the round counts as a miss.
VISIBLE_WITHIN_SECONDS = 10.0


@dataclass(frozen=True)
class Role:
    """What LMCache's connector makes of one TP rank (lmcache 0.5.6 lmcache/integration/vllm/
    vllm_multi_process_adapter.py:361-460, ParallelStrategy): the key's world size and worker id, how many ranks read
    one stored object, whether this rank stores at all, and which server it talks to."""

    rank: int
    instance_id: int
    server: int
    kv_world_size: int
    kv_worker_id: int
    num_kv_readers: int
    writer: bool
    replicated: bool  # every rank holds the same KV (a pure-MLA model): the source bytes are the same on every rank


SINGLE_ROLE = Role(0, INSTANCE_ID, 0, 1, 0, 1, True, False)


def tp_roles(case: Case, ranks: int, layout: str) -> list[Role]:
    """The connector's view of each of `ranks` TP ranks, through LMCache's own code: `mla_only` (lmcache 0.5.6
    lmcache/integration/vllm/utils.py:327-356: MLA and not hybrid) decides whether KV is replicated across ranks;
    `ParallelStrategy` gives the key geometry, readers and writers; a worker talks to `server_urls[rank //
    (world_size // n_servers)]` (lmcache/integration/vllm/lmcache_mp_connector.py:755-763)."""
    from types import SimpleNamespace

    from lmcache.integration.vllm.utils import mla_only
    from lmcache.integration.vllm.vllm_multi_process_adapter import ParallelStrategy

    # Both models' attention is MLA (GLM-5.3: DSA; Flash: sparse MLA); Flash's KDA layers make it hybrid.
    replicated = bool(mla_only(SimpleNamespace(use_mla=True, is_hybrid=case.hybrid)))
    servers = ranks if layout == "per-rank" else 1
    roles = []
    for rank in range(ranks):
        strategy = ParallelStrategy(
            mla_only=replicated,
            vllm_world_size=ranks,
            vllm_worker_id=rank,
            tp_size=ranks,
            pp_size=1,
            n_servers=servers,
        )
        roles.append(
            Role(
                rank=rank,
                instance_id=INSTANCE_ID + rank,
                server=rank // (ranks // servers),
                kv_world_size=int(strategy.kv_world_size),
                kv_worker_id=int(strategy.kv_worker_id),
                num_kv_readers=int(strategy.num_kv_readers),
                writer=bool(strategy.is_kv_writer),
                replicated=replicated,
            )
        )
    return roles


def vllm_style_config(case: Case, names_by_group: list[list[str]]) -> Any:
    """Duck-typed vLLM `KVCacheConfig`: LMCache reads group specs by class name only (lmcache 0.5.6
    lmcache/integration/vllm/kv_cache_groups.py:22-95), so these stand-ins feed its real conversion."""

    class AttentionSpec:
        def __init__(self, block_size: int) -> None:
            self.block_size = block_size

    class MLAAttentionSpec(AttentionSpec):
        pass

    class MambaSpec:
        # vLLM 0.33 selects the align mode when prefix caching is on (seed 000); kv_cache_groups.py:83-95 needs it.
        mamba_cache_mode = "align"

        def __init__(self, block_size: int) -> None:
            self.block_size = block_size

    class KpoolTailSpec:
        prefix_cacheable = False  # kv_cache_groups.py:35-53: scratch specs are excluded from every transfer

        def __init__(self, block_size: int) -> None:
            self.block_size = block_size

    @dataclass
    class KVCacheGroupSpec:
        layer_names: list[str]
        kv_cache_spec: Any

    @dataclass
    class KVCacheConfig:
        kv_cache_groups: list[KVCacheGroupSpec] = field(default_factory=list)

    spec_class: dict[str, Callable[[int], Any]] = {
        "mla": MLAAttentionSpec,
        "mamba": MambaSpec,
        "scratch": KpoolTailSpec,
    }
    return KVCacheConfig(
        [
            KVCacheGroupSpec(names, spec_class[g.spec](g.tokens_per_block))
            for g, names in zip(case.groups, names_by_group, strict=True)
        ]
    )


def random_fill(torch: Any, tensor: Any) -> None:
    """Random bytes of any dtype (never zeros: they hide unwritten outputs)."""
    tensor.view(torch.uint8).random_(0, 256)


def sync(torch: Any, device: Any) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def wait(future: Any, event: Any) -> Any:
    """The reply of a transfer future, keeping the producer event alive until the server is done with it."""
    owner = getattr(future, "raw_future_", future)
    if event is not None and hasattr(owner, "retain_reference"):
        owner.retain_reference(event)
    return future.result(timeout=RPC_TIMEOUT_SECONDS)


def ipc_key(case: Case, role: Role, token_ids: tuple[int, ...], request_id: str, worker_id: int | None) -> Any:
    """The key the connector sends: the rank's kv world size and worker id (None for the scheduler's lookup)."""
    from lmcache.v1.multiprocess.custom_types import IPCCacheServerKey

    return IPCCacheServerKey(
        model_name=f"{MODEL_NAME_PREFIX}-{case.profile}",
        world_size=role.kv_world_size,
        worker_id=worker_id,
        token_ids=token_ids,
        start=0,
        end=len(token_ids),
        request_id=request_id,
        # The lookup takes one read lock per chunk and reader that the readers' retrieves release (lmcache 0.5.6
        # lmcache/v1/multiprocess/modules/lookup.py:204 refuses 0, the field's default).
        num_kv_readers=role.num_kv_readers,
    )


def lookup_chunks(req_client: Any, key: Any) -> int:
    """LOOKUP, then poll the prefetch status until the server answers with the hit count in chunks."""
    req_client.lookup(key, 1).result(timeout=RPC_TIMEOUT_SECONDS)
    deadline = time.monotonic() + RPC_TIMEOUT_SECONDS
    while time.monotonic() < deadline:
        hit = req_client.query_prefetch_status(key.request_id).result(timeout=RPC_TIMEOUT_SECONDS)
        if hit is not None:
            return int(hit)
        time.sleep(0.01)
    raise ProofError(f"lookup of {key.request_id} did not finish within {RPC_TIMEOUT_SECONDS:g}s")


def lookup_until_visible(
    req_client: Any, case: Case, role: Role, token_ids: tuple[int, ...], chunks: int, base_id: str
) -> tuple[int, float, str, int]:
    """Look the request up until all its chunks are visible: (hit chunks, seconds, the lookup's id, attempts).

    The store's reply comes when the copy is done; the server commits the objects to L1 from a stream callback just
    after (lmcache 0.5.6 lmcache/v1/multiprocess/modules/lmcache_driven_transfer.py:806-812), so an immediate lookup
    can miss. A real engine looks up a later request; here the lookup is repeated until the whole request is visible.
    The returned lookup's session holds the read locks the retrieves release; the caller ends it.
    """
    started = time.perf_counter()
    attempt = 0
    while True:
        lookup_id = f"{base_id}-lookup{attempt}"
        hit = lookup_chunks(req_client, ipc_key(case, role, token_ids, lookup_id, None))
        if hit == chunks or time.perf_counter() - started > VISIBLE_WITHIN_SECONDS:
            return hit, time.perf_counter() - started, lookup_id, attempt + 1
        req_client.end_session(lookup_id).result(timeout=RPC_TIMEOUT_SECONDS)
        attempt += 1
        time.sleep(0.005)


class Worker:
    """One vLLM worker (TP rank) as LMCache's connector drives it: its KV tensors, registered over CUDA IPC (POSIX SHM
    on CPU) with its server, and stores and retrieves of whole requests with vLLM's block ids."""

    def __init__(self, torch: Any, case: Case, role: Role, max_chunks: int, device: Any, url: str) -> None:
        import zmq
        from lmcache.integration.vllm.kv_cache_groups import create_engine_group_infos_from_vllm
        from lmcache.utils import EngineType
        from lmcache.v1.multiprocess.transfer_context import create_transfer_context
        from lmcache.v1.multiprocess.transport.factory import RequestClientFactory

        self.torch, self.case, self.role, self.device = torch, case, role, device
        self.zmq_context = zmq.Context()
        self.client = RequestClientFactory.create(url, context=self.zmq_context)
        chunk = int(self.client.get_chunk_size().result(timeout=RPC_TIMEOUT_SECONDS))
        if chunk != case.chunk_size:
            raise ProofError(f"server answers chunk size {chunk}, expected {case.chunk_size}")
        num_blocks = num_blocks_for(case, max_chunks)
        self.kv_caches: dict[str, Any] = {}
        self.planes: dict[str, tuple[int, Plane]] = {}  # tensor name -> (vLLM group index, plane)
        names_by_group: list[list[str]] = []
        for gi, group in enumerate(case.groups):
            names = []
            for plane in group.planes:
                for layer in range(plane.count):
                    name = f"model.layers.g{gi}.{plane.label}.{layer}"
                    shape = (num_blocks if group.cacheable else 1, plane.slots_per_block, plane.width)
                    tensor = torch.empty(shape, dtype=getattr(torch, plane.dtype), device=device)
                    random_fill(torch, tensor)
                    self.kv_caches[name] = tensor
                    self.planes[name] = (gi, plane)
                    names.append(name)
            names_by_group.append(names)
        # vLLM's null block: nothing may write it (LMCache skips all-null chunks); checked after every retrieve.
        # Compared as bytes: random bytes include NaN patterns, which never compare equal as bf16.
        self.null_snapshot = {
            name: self.kv_caches[name].view(torch.uint8)[NULL_BLOCK].clone()
            for name, (gi, _) in self.planes.items()
            if case.groups[gi].cacheable
        }
        layout_hints = {"kv_layout": "NHD"}
        infos = create_engine_group_infos_from_vllm(
            vllm_style_config(case, names_by_group), self.kv_caches, layout_hints
        )
        self.group_infos = list(infos)
        self.windows = {int(i.engine_group_id): int(i.sw_size_tokens) for i in self.group_infos}
        self.context = create_transfer_context(
            self.kv_caches, mode="lmcache_driven", instance_id=role.instance_id, req_client=self.client
        )
        self.context.register(
            self.kv_caches,
            f"{MODEL_NAME_PREFIX}-{case.profile}",
            role.kv_world_size,
            case.blocks_in_chunk,
            RPC_TIMEOUT_SECONDS,
            layout_hints=layout_hints,
            engine_group_infos=infos,
            engine_type=EngineType.VLLM,
        )

    # -- data

    def fill(self, request: str, chunks: int, layout: str) -> None:
        """Fresh random bytes in the request's source blocks (the same on every rank of a replicated model, so each
        rank's retrieve can be compared with its own source), poison in its destination blocks."""
        torch = self.torch
        shard = 0 if self.role.replicated else self.role.rank
        generator = torch.Generator(device=self.device).manual_seed(request_seed(f"{request}/{shard}"))
        src = engine_block_ids(self.case, chunks, False, layout)
        dst = engine_block_ids(self.case, chunks, True, layout)
        for name, (gi, _plane) in self.planes.items():
            if not self.case.groups[gi].cacheable:
                continue
            view = self.kv_caches[name].view(torch.uint8)
            real_src = [b for b in src[gi] if b != NULL_BLOCK]
            shape = (len(real_src), *view.shape[1:])
            view[real_src] = torch.randint(0, 256, shape, dtype=torch.uint8, device=self.device, generator=generator)
            view[[b for b in dst[gi] if b != NULL_BLOCK]] = POISON_BYTE
        sync(torch, self.device)

    def compare(self, chunks: int, layout: str) -> tuple[dict[str, dict[str, int]], bool]:
        """Per group: the restored blocks must equal their sources, the other destination blocks must still hold the
        poison; and the null block must be unchanged. Returns the per-group counts and the null-block verdict."""
        torch = self.torch
        src = engine_block_ids(self.case, chunks, False, layout)
        dst = engine_block_ids(self.case, chunks, True, layout)
        restored = restored_blocks(self.case, chunks, self.windows)
        per_group: dict[int, dict[str, int]] = {}
        for name, (gi, plane) in self.planes.items():
            if not self.case.groups[gi].cacheable:
                continue
            tensor = self.kv_caches[name].view(torch.uint8)
            positions = [i for i, b in enumerate(dst[gi]) if b != NULL_BLOCK]
            src_ids = [src[gi][i] for i in positions]
            dst_ids = [dst[gi][i] for i in positions]
            equal = (tensor[src_ids] == tensor[dst_ids]).flatten(1).all(dim=1).tolist()
            untouched = (tensor[dst_ids] == POISON_BYTE).flatten(1).all(dim=1).tolist()
            first_restored = len(dst[gi]) - restored[gi]
            stats = per_group.setdefault(
                gi, {"blocks": 0, "restored_expected": 0, "equal": 0, "untouched": 0, "ok": 0, "bytes_restored": 0}
            )
            stats["blocks"] += len(positions)
            stats["restored_expected"] += restored[gi]
            stats["equal"] += sum(equal)
            stats["untouched"] += sum(untouched)
            stats["ok"] += sum(
                (eq if pos >= first_restored else un) for pos, eq, un in zip(positions, equal, untouched, strict=True)
            )
            stats["bytes_restored"] += restored[gi] * plane.slots_per_block * plane.width * DTYPE_BYTES[plane.dtype]
        null_ok = all(
            torch.equal(self.kv_caches[name].view(torch.uint8)[NULL_BLOCK], snapshot)
            for name, snapshot in self.null_snapshot.items()
        )
        return {f"{gi}:{self.case.groups[gi].kind}": s for gi, s in sorted(per_group.items())}, null_ok

    # -- transfers

    def _timed(self, submit: Callable[[Any], Any]) -> tuple[Any, int, int]:
        """One store or retrieve, submitted with a fresh producer event: its reply, submit and reply times (ns)."""
        event = self.context.create_recorded_event()
        submitted = now_ns()
        reply = wait(submit(event), event)
        sync(self.torch, self.device)  # result() already waited for the server's completion event; this drains ours
        return reply, submitted, now_ns()

    def store(self, request_id: str, token_ids: tuple[int, ...], chunks: int, layout: str) -> dict[str, Any]:
        key = ipc_key(self.case, self.role, token_ids, request_id, self.role.kv_worker_id)
        ids = block_ids(self.case, chunks, False, layout, self.group_infos)
        reply, submitted, replied = self._timed(
            lambda event: self.context.submit_store(
                request_id, key, self.kv_caches, ids, event, self.case.blocks_in_chunk
            )
        )
        return {"reply": repr(reply)[:200], "submit_ns": submitted, "reply_ns": replied}

    def retrieve(self, request_id: str, token_ids: tuple[int, ...], chunks: int, layout: str) -> dict[str, Any]:
        key = ipc_key(self.case, self.role, token_ids, request_id, self.role.kv_worker_id)
        ids = block_ids(self.case, chunks, True, layout, self.group_infos)
        reply, submitted, replied = self._timed(
            lambda event: self.context.submit_retrieve(
                request_id, key, self.kv_caches, ids, event, self.case.blocks_in_chunk, skip_first_n_tokens=0
            )
        )
        groups, null_ok = self.compare(chunks, layout)
        return {
            "reply": repr(reply)[:200],
            "submit_ns": submitted,
            "reply_ns": replied,
            "groups": groups,
            "null_block_untouched": null_ok,
            "all_equal": all(g["ok"] == g["blocks"] for g in groups.values()),
        }

    def close(self) -> None:
        try:
            with contextlib.suppress(Exception):
                future = self.context.unregister()
                if future is not None:
                    future.result(timeout=RPC_TIMEOUT_SECONDS)
            self.context.close()
        finally:
            self.client.close()
            self.zmq_context.term()
