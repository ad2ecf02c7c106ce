"""The GPU half of the sidecar design, proven on one H200: LMCache's copy kernels, CUDA IPC into the real
`lmcache server` across processes, and what that path moves per second beside the host link's own limit.

Why: CI has no GPU, so nothing else in the repository runs LMCache's CUDA extension or its CUDA IPC path. This script
is what `scripts/gpu-proof.sh` runs after building LMCache from its sdist on the GPU host:

``plan``     the cases, their geometry and bytes (pure arithmetic; the shell script's ``--dry-run`` prints it on CPU);
``kernels``  ``lmcache.cuda_ops.multi_layer_block_kv_transfer`` on the GPU (device -> pinned host objects -> device)
             for both models' paged layouts, checked byte for byte against LMCache's own PyTorch implementation of
             the kernel and a plain gather, and timed;
``ipc``      per case: the real ``lmcache server`` in its own process; this process is the GPU engine stand-in. It
             registers CUDA KV tensors shaped like the model's cache groups (LMCache's own vLLM group conversion, its
             lmcache-driven transfer context: CUDA IPC handles), stores a request, looks it up, retrieves it into
             poisoned blocks, compares the bytes, and times store (GPU -> host L1) and retrieve (host L1 -> GPU);
             then a pinned ``cudaMemcpy`` (``Tensor.copy_``) of the same sizes in both directions, in the same run.
             ``--device cpu`` rehearses the identical flow on a CPU host (LMCache then moves the bytes through POSIX
             SHM), which is how this script was made to work before it met a GPU.

Shapes are per TP worker and follow the profile table (`glm53.profiles`): group kinds, tokens per block and layer
counts come from there; the widths below are this script's estimates of the physical pages (documented beside them).
Prints one JSON document (also written to ``--out``) and a short table last.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import sys
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

REPO_ROOT = Path(__file__).resolve().parents[1]
if str(REPO_ROOT / "src") not in sys.path:  # the GPU host runs this file with a bare python3, not the project's venv
    sys.path.insert(0, str(REPO_ROOT / "src"))

from glm53.errors import Glm53Error  # noqa: E402
from glm53.loopback import LOCALHOST, free_ports  # noqa: E402
from glm53.profiles import (  # noqa: E402
    DSA_MLA,
    KDA_STATE,
    KPOOL_TAIL_SCRATCH,
    SPARSE_MLA_INDEXER,
    ModelProfile,
    get_profile,
)
from glm53.sidecar import serving  # noqa: E402

PROG = "gpu-proof"
DTYPE_BYTES = {"bfloat16": 2, "uint8": 1}
# The DSA indexer row LMCache recognises: 128 fp8 values + one fp32 scale (lmcache 0.5.6
# lmcache/v1/gpu_connector/kv_format/detectors/vllm.py:44-47, `_is_blocked_indexer_plane`).
INDEXER_ROW_BYTES = 132
# MLA latent widths in bf16 elements. GLM-5.3 (DSA, DeepSeek-V3.2 family): kv_lora_rank 512 + 64 rope dims = 576.
# GLM-5.3-Flash's sparse-MLA layers are NoPE, so the latent is the 512 without rope dims. Estimates, not read from a
# checkpoint (none is reachable here); they set the bytes per token, which is what the speed numbers scale with.
DSA_LATENT_WIDTH = 576
NOPE_LATENT_WIDTH = 512
# The seed's compressed indexer: slots_per_block = 288 at N = 1152, one slot per four tokens.
FLASH_INDEXER_TOKENS_PER_SLOT = 4
# vLLM pads hybrid pages to one size per block: it raises the attention block to N "to ensure that attention page size
# is >= mamba page size" (vllm 0.33 platforms/interface.py), so a KDA state page is taken as one latent page of N rows.
KDA_STATE_WIDTH = NOPE_LATENT_WIDTH
# The per-request kpool-tail scratch ring: registered with the other tensors but never transferred (tokens_per_block 0).
SCRATCH_WIDTH = 64
MODEL_NAME_PREFIX = "glm53-gpu-proof"
INSTANCE_ID = 1000
RPC_TIMEOUT_SECONDS = 60.0
SERVER_START_SECONDS = 120.0
# A poison byte pattern the retrieve must overwrite; the sources are random, so an untouched block is caught.
POISON_BYTE = 0x5A
# How long a stored request may take to become visible to lookups before the round counts as a miss.
VISIBLE_WITHIN_SECONDS = 10.0


class ProofError(Exception):
    """A failed check or bad input; its message is the one line printed."""


# ---- geometry (pure) -------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Plane:
    """`count` registered tensors of shape (num_blocks, slots_per_block, width) and one dtype."""

    label: str
    count: int
    slots_per_block: int
    width: int
    dtype: str

    @property
    def bytes_per_block(self) -> int:
        return self.count * self.slots_per_block * self.width * DTYPE_BYTES[self.dtype]


@dataclass(frozen=True)
class Group:
    """One vLLM KV-cache group as the connector registers it: its spec kind, block size in tokens, and tensors."""

    kind: str
    spec: str  # "mamba" (KDA state, align mode), "mla" (attention), "scratch" (prefix_cacheable False)
    tokens_per_block: int
    planes: tuple[Plane, ...]

    @property
    def cacheable(self) -> bool:
        return self.spec != "scratch"

    @property
    def bytes_per_block(self) -> int:
        return sum(p.bytes_per_block for p in self.planes)


@dataclass(frozen=True)
class Case:
    """One server configuration and the KV geometry of one TP worker of a model."""

    name: str
    profile: str
    chunk_size: int
    separate_object_groups: bool
    groups: tuple[Group, ...]

    @property
    def bytes_per_token(self) -> float:
        return sum(g.bytes_per_block / g.tokens_per_block for g in self.groups if g.cacheable)

    @property
    def chunk_bytes(self) -> int:
        return round(self.bytes_per_token * self.chunk_size)

    @property
    def layers(self) -> int:
        return sum(p.count for g in self.groups for p in g.planes)


def split_evenly(total: int, parts: int) -> list[int]:
    """`total` layers over `parts` groups, the larger shares first (34 over 4: 9, 9, 8, 8)."""
    base, extra = divmod(total, parts)
    return [base + (1 if i < extra else 0) for i in range(parts)]


def profile_groups(profile: ModelProfile) -> tuple[Group, ...]:
    """The profile's cache groups with this script's physical page estimates (see the module constants)."""
    n = profile.unified_block_size(profile.tensor_parallel_size)
    sizes = profile.expected_groups(n)
    kda_total = sum(1 for g in profile.groups if g.kind == KDA_STATE)
    kda_layers = iter(split_evenly(profile.layer_mix.get("kda_linear_attention", 0), kda_total or 1))
    groups: list[Group] = []
    for group, tokens in zip(profile.groups, sizes, strict=True):
        if group.kind == KDA_STATE:
            plane = Plane("kda_state", next(kda_layers), tokens, KDA_STATE_WIDTH, "bfloat16")
            groups.append(Group(group.kind, "mamba", tokens, (plane,)))
        elif group.kind == SPARSE_MLA_INDEXER:
            layers = profile.layer_mix["nope_sparse_mla"]
            latent = Plane("nope_latent", layers, tokens, NOPE_LATENT_WIDTH, "bfloat16")
            slots = tokens // FLASH_INDEXER_TOKENS_PER_SLOT
            indexer = Plane("indexer", layers, slots, INDEXER_ROW_BYTES, "uint8")
            groups.append(Group(group.kind, "mla", tokens, (latent, indexer)))
        elif group.kind == KPOOL_TAIL_SCRATCH:
            block = n or 1
            groups.append(Group(group.kind, "scratch", block, (Plane("kpool_tail", 1, 1, SCRATCH_WIDTH, "bfloat16"),)))
        elif group.kind == DSA_MLA:
            layers = profile.layer_mix["dsa_mla"]
            latent = Plane("dsa_latent", layers, tokens, DSA_LATENT_WIDTH, "bfloat16")
            indexer = Plane("indexer", layers, tokens, INDEXER_ROW_BYTES, "uint8")
            groups.append(Group(group.kind, "mla", tokens, (latent, indexer)))
        else:
            raise ProofError(f"no physical page estimate for cache group kind {group.kind!r}; add one to {PROG}")
    return tuple(groups)


def make_case(profile_name: str, chunk_size: int) -> Case:
    """A case for one profile and server chunk size; the chunk must be a multiple of every cacheable block."""
    profile = get_profile(profile_name)
    groups = profile_groups(profile)
    misfit = [g.tokens_per_block for g in groups if g.cacheable and chunk_size % g.tokens_per_block]
    if misfit:
        raise ProofError(
            f"chunk size {chunk_size} is not a multiple of {profile.display_name}'s block size {misfit[0]}; "
            f"the released server refuses it (use {profile.recommended_chunk_size})"
        )
    return Case(
        name=f"{profile.name}@{chunk_size}",
        profile=profile.name,
        chunk_size=chunk_size,
        separate_object_groups=profile.separate_object_groups_required,
        groups=groups,
    )


def parse_case(text: str) -> Case:
    """`PROFILE@CHUNK`, e.g. `glm53-flash@1152`."""
    profile, sep, chunk = text.partition("@")
    if not sep or not chunk.isdigit() or int(chunk) <= 0:
        raise ProofError(f"expected a case like glm53@256 (PROFILE@CHUNK_SIZE) but got {text!r}")
    return make_case(profile, int(chunk))


# The GLM-5.3-Flash deployment's chunk (its N), GLM-5.3's recommended 256, and GLM-5.3 at 1152 to compare chunk sizes
# at one per-token size. GLM-5.3-Flash at 256 does not exist: its blocks are 1152 tokens.
DEFAULT_CASES = ("glm53-flash@1152", "glm53@256", "glm53@1152")


@dataclass(frozen=True)
class Settings:
    """What one run does; `chunks` whole chunks per request, `reps` timed requests after `warmup` untimed ones."""

    cases: tuple[Case, ...]
    chunks: int
    reps: int
    warmup: int
    l1_size_gb: float
    device: str

    @property
    def requests(self) -> int:
        return self.reps + self.warmup

    def l1_needed_gb(self, case: Case) -> float:
        """Every request stores new tokens, so L1 must hold all of them without evicting (plus a quarter spare)."""
        return case.chunk_bytes * self.chunks * self.requests * 1.25 / 2**30


def plan_lines(settings: Settings) -> list[str]:
    """The human-readable plan: one line per case with its geometry and byte counts."""
    lines = [
        f"{PROG}: device={settings.device} chunks/request={settings.chunks} requests={settings.requests} "
        f"(timed {settings.reps}) l1={settings.l1_size_gb:g} GB"
    ]
    for case in settings.cases:
        groups = ", ".join(
            f"{g.kind}[{g.tokens_per_block}]" + ("" if g.cacheable else " (skipped)") for g in case.groups
        )
        lines.append(
            f"  {case.name}: {case.layers} tensors in {len(case.groups)} groups ({groups}); "
            f"{case.bytes_per_token:,.0f} B/token, {case.chunk_bytes / 2**20:.1f} MiB/chunk, "
            f"{bytes_moved(case, settings.chunks, expected_windows(case)) / 2**20:.1f} MiB moved per request "
            f"of {settings.chunks} chunks"
        )
    return lines


def check_settings(settings: Settings) -> None:
    """Refuse settings that cannot work before anything starts."""
    if settings.chunks < 1 or settings.reps < 1 or settings.warmup < 0:
        raise ProofError("expected --chunks >= 1, --reps >= 1 and --warmup >= 0")
    for case in settings.cases:
        if settings.l1_needed_gb(case) > settings.l1_size_gb:
            raise ProofError(
                f"{case.name} stores {settings.l1_needed_gb(case):.1f} GB over the run but --l1-size-gb is "
                f"{settings.l1_size_gb:g}; raise it or lower --chunks/--reps"
            )


def gbps(nbytes: int, seconds: float) -> float:
    return nbytes / seconds / 1e9


def summarize(samples: Sequence[float]) -> dict[str, float]:
    """Median and spread of timings in seconds."""
    return {"median_s": statistics.median(samples), "min_s": min(samples), "max_s": max(samples)}


# ---- the engine stand-in (needs torch and lmcache) -----------------------------------------------------------


@dataclass
class Registered:
    """The stand-in's KV tensors, the vLLM-style config LMCache derives its groups from, and the transfer context."""

    kv_caches: dict[str, Any]
    planes: dict[str, tuple[int, Plane]]  # tensor name -> (group index, plane)
    group_infos: list[Any]
    context: Any
    num_blocks: int


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


def register(torch: Any, req_client: Any, case: Case, settings: Settings, device: Any) -> Registered:
    """Allocate the worker's KV tensors, derive LMCache's groups the way the vLLM connector does, register them."""
    from lmcache.integration.vllm.kv_cache_groups import create_engine_group_infos_from_vllm
    from lmcache.utils import EngineType
    from lmcache.v1.multiprocess.transfer_context import create_transfer_context

    # The null block, source blocks for one request, as many destination blocks (retrieve lands somewhere else).
    num_blocks = 1 + 2 * settings.chunks * (
        case.chunk_size // min(g.tokens_per_block for g in case.groups if g.cacheable)
    )
    kv_caches: dict[str, Any] = {}
    planes: dict[str, tuple[int, Plane]] = {}
    names_by_group: list[list[str]] = []
    for gi, group in enumerate(case.groups):
        names = []
        blocks = num_blocks if group.cacheable else 1
        for plane in group.planes:
            for layer in range(plane.count):
                name = f"model.layers.g{gi}.{plane.label}.{layer}"
                dtype = getattr(torch, plane.dtype)
                tensor = torch.empty((blocks, plane.slots_per_block, plane.width), dtype=dtype, device=device)
                random_fill(torch, tensor)
                kv_caches[name] = tensor
                planes[name] = (gi, plane)
                names.append(name)
        names_by_group.append(names)
    layout_hints = {"kv_layout": "NHD"}
    infos = create_engine_group_infos_from_vllm(vllm_style_config(case, names_by_group), kv_caches, layout_hints)
    context = create_transfer_context(kv_caches, mode="lmcache_driven", instance_id=INSTANCE_ID, req_client=req_client)
    blocks_in_chunk = case.chunk_size // min(g.tokens_per_block for g in case.groups if g.cacheable)
    context.register(
        kv_caches,
        f"{MODEL_NAME_PREFIX}-{case.profile}",
        1,
        blocks_in_chunk,
        RPC_TIMEOUT_SECONDS,
        layout_hints=layout_hints,
        engine_group_infos=infos,
        engine_type=EngineType.VLLM,
    )
    return Registered(kv_caches, planes, list(infos), context, num_blocks)


def engine_block_ids(case: Case, settings: Settings, destination: bool) -> list[list[int]]:
    """Per vLLM group: the request's blocks (source: from block 1, destination: the next as many).

    Block 0 is vLLM's null block: LMCache never commits a chunk whose blocks are all null (align-mode Mamba chunks
    without state; lmcache 0.5.6 lmcache/v1/multiprocess/modules/lmcache_driven_transfer.py:685-696).
    """
    ids = []
    for group in case.groups:
        count = settings.chunks * case.chunk_size // group.tokens_per_block if group.cacheable else 0
        first = 1 + (count if destination else 0)
        ids.append(list(range(first, first + count)))
    return ids


def block_ids(case: Case, settings: Settings, destination: bool, infos: Sequence[Any]) -> list[list[int]]:
    """One block-id list per LMCache KV group (per EngineGroupInfo, not per vLLM group: lmcache 0.5.6
    lmcache/v1/multiprocess/modules/lmcache_driven_transfer.py:586-588, as its `bench server` client does)."""
    per_engine_group = engine_block_ids(case, settings, destination)
    return [list(per_engine_group[info.engine_group_id]) for info in infos]


def restored_blocks(case: Case, chunks: int, windows: Mapping[int, int]) -> list[int]:
    """Per vLLM group: how many of the request's last blocks a store copies out and a retrieve restores.

    Attention groups move every block. Align-mode Mamba (KDA state) groups behave like a sliding window of one block
    (lmcache 0.5.6 lmcache/integration/vllm/kv_cache_groups.py:83-95): the server stores and reads only the in-window
    suffix of chunks (lmcache/v1/multiprocess/modules/lmcache_driven_transfer.py:660-664 and 999-1012). `windows`
    maps a vLLM group index to its window in tokens (absent or <= 0: none).
    """
    counts = []
    for gi, group in enumerate(case.groups):
        blocks = chunks * case.chunk_size // group.tokens_per_block if group.cacheable else 0
        window = windows.get(gi, -1)
        if window > 0:
            chunks_in_window = -(-window // case.chunk_size)
            blocks = min(blocks, chunks_in_window * case.chunk_size // group.tokens_per_block)
        counts.append(blocks)
    return counts


def expected_windows(case: Case) -> dict[int, int]:
    """The windows LMCache's group conversion gives (one block for KDA state), for planning without LMCache."""
    return {gi: g.tokens_per_block for gi, g in enumerate(case.groups) if g.spec == "mamba"}


def bytes_moved(case: Case, chunks: int, windows: Mapping[int, int]) -> int:
    """Bytes one request moves each way."""
    counts = restored_blocks(case, chunks, windows)
    return sum(count * g.bytes_per_block for count, g in zip(counts, case.groups, strict=True) if g.cacheable)


def compare_blocks(torch: Any, reg: Registered, case: Case, settings: Settings) -> dict[str, Any]:
    """Per group: the restored blocks must equal their sources, the others must still hold the poison."""
    src_ids = engine_block_ids(case, settings, destination=False)
    dst_ids = engine_block_ids(case, settings, destination=True)
    restored = restored_blocks(
        case, settings.chunks, {i.engine_group_id: int(i.sw_size_tokens) for i in reg.group_infos}
    )
    per_group: dict[int, dict[str, int]] = {}
    for name, (gi, plane) in reg.planes.items():
        group = case.groups[gi]
        if not group.cacheable:
            continue
        tensor = reg.kv_caches[name].view(torch.uint8)
        equal = (tensor[src_ids[gi]] == tensor[dst_ids[gi]]).flatten(1).all(dim=1).tolist()
        untouched = (tensor[dst_ids[gi]] == POISON_BYTE).flatten(1).all(dim=1).tolist()
        first_restored = len(src_ids[gi]) - restored[gi]
        stats = per_group.setdefault(gi, {"blocks": 0, "restored_expected": 0, "equal": 0, "untouched": 0, "ok": 0})
        stats["blocks"] += len(equal)
        stats["restored_expected"] += restored[gi]
        stats["equal"] += sum(equal)
        stats["untouched"] += sum(untouched)
        stats["ok"] += sum(
            (eq if i >= first_restored else un) for i, (eq, un) in enumerate(zip(equal, untouched, strict=True))
        )
        stats.setdefault("bytes_restored", 0)
        stats["bytes_restored"] += restored[gi] * plane.slots_per_block * plane.width * DTYPE_BYTES[plane.dtype]
    return {f"{gi}:{case.groups[gi].kind}": stats for gi, stats in sorted(per_group.items())}


def poison_destination(torch: Any, reg: Registered, case: Case, settings: Settings) -> None:
    dst_ids = engine_block_ids(case, settings, destination=True)
    for name, (gi, _plane) in reg.planes.items():
        if case.groups[gi].cacheable:
            reg.kv_caches[name].view(torch.uint8)[dst_ids[gi]] = POISON_BYTE


def refill_source(torch: Any, reg: Registered, case: Case, settings: Settings) -> None:
    """Fresh random source blocks for every request, so a retrieve can only match what this request stored."""
    src_ids = engine_block_ids(case, settings, destination=False)
    for name, (gi, _plane) in reg.planes.items():
        if case.groups[gi].cacheable:
            view = reg.kv_caches[name].view(torch.uint8)
            view[src_ids[gi]] = torch.randint(0, 256, view[src_ids[gi]].shape, dtype=torch.uint8, device=view.device)


def wait(future: Any, event: Any) -> Any:
    """The reply of a transfer future, keeping the producer event alive until the server is done with it."""
    owner = getattr(future, "raw_future_", future)
    if event is not None and hasattr(owner, "retain_reference"):
        owner.retain_reference(event)
    return future.result(timeout=RPC_TIMEOUT_SECONDS)


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


def sync(torch: Any, device: Any) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def timed_transfer(torch: Any, device: Any, reg: Registered, submit: Callable[[Any], Any]) -> tuple[Any, float]:
    """One store or retrieve, submitted with a fresh producer event: its reply and its seconds, submit to done."""
    event = reg.context.create_recorded_event()
    started = time.perf_counter()
    reply = wait(submit(event), event)
    sync(torch, device)  # result() already waited for the server's completion event; this only drains our stream
    return reply, time.perf_counter() - started


def one_request(
    torch: Any, req_client: Any, reg: Registered, case: Case, settings: Settings, seq: int
) -> dict[str, Any]:
    """Store a fresh request, look it up, retrieve it into poisoned blocks; times and the byte comparison."""
    from lmcache.v1.multiprocess.custom_types import IPCCacheServerKey

    device = next(iter(reg.kv_caches.values())).device
    tokens = settings.chunks * case.chunk_size
    generator = torch.Generator().manual_seed(1_000_003 * (seq + 1) + case.chunk_size)
    token_ids = tuple(int(t) for t in torch.randint(0, 150_000, (tokens,), generator=generator))
    model = f"{MODEL_NAME_PREFIX}-{case.profile}"

    def key(request_id: str, worker_id: int | None) -> Any:
        return IPCCacheServerKey(
            model_name=model,
            world_size=1,
            worker_id=worker_id,
            token_ids=token_ids,
            start=0,
            end=tokens,
            request_id=request_id,
            # One reader: the lookup takes one read lock per chunk that the retrieve releases (lmcache 0.5.6
            # lmcache/v1/multiprocess/modules/lookup.py:204 refuses 0, the field's default).
            num_kv_readers=1,
        )

    blocks_in_chunk = case.chunk_size // min(g.tokens_per_block for g in case.groups if g.cacheable)
    refill_source(torch, reg, case, settings)
    poison_destination(torch, reg, case, settings)
    sync(torch, device)

    store_id, retrieve_id = f"store-{case.name}-{seq}", f"retrieve-{case.name}-{seq}"
    stored, store_s = timed_transfer(
        torch,
        device,
        reg,
        lambda event: reg.context.submit_store(
            store_id,
            key(store_id, 0),
            reg.kv_caches,
            block_ids(case, settings, False, reg.group_infos),
            event,
            blocks_in_chunk,
        ),
    )
    req_client.end_session(store_id).result(timeout=RPC_TIMEOUT_SECONDS)

    # The reply comes when the copy is done; the server commits the objects to L1 from a stream callback just after
    # (lmcache 0.5.6 lmcache/v1/multiprocess/modules/lmcache_driven_transfer.py:806-812), so an immediate lookup can
    # miss. A real engine looks up a later request; here the lookup is repeated until the whole request is visible.
    visible_after = time.perf_counter()
    attempt = 0
    while True:
        lookup_id = f"{retrieve_id}-lookup{attempt}"
        hit_chunks = lookup_chunks(req_client, key(lookup_id, None))
        if hit_chunks == settings.chunks or time.perf_counter() - visible_after > VISIBLE_WITHIN_SECONDS:
            break
        req_client.end_session(lookup_id).result(timeout=RPC_TIMEOUT_SECONDS)
        attempt += 1
        time.sleep(0.005)
    visible_s = time.perf_counter() - visible_after
    retrieve_id = lookup_id  # the retrieve releases the read locks this lookup took, in its session

    retrieved, retrieve_s = timed_transfer(
        torch,
        device,
        reg,
        lambda event: reg.context.submit_retrieve(
            retrieve_id,
            key(retrieve_id, 0),
            reg.kv_caches,
            block_ids(case, settings, True, reg.group_infos),
            event,
            blocks_in_chunk,
            skip_first_n_tokens=0,
        ),
    )
    req_client.end_session(retrieve_id).result(timeout=RPC_TIMEOUT_SECONDS)
    return {
        "store_reply": repr(stored)[:200],
        "retrieve_reply": repr(retrieved)[:200],
        "hit_chunks": hit_chunks,
        "store_s": store_s,
        "retrieve_s": retrieve_s,
        "visible_after_s": visible_s,
        "lookup_attempts": attempt + 1,
        "groups": compare_blocks(torch, reg, case, settings),
    }


# lmcache 0.5.6 lmcache/usage_telemetry/identity.py:38-40: either switch stops the start-up usage report (the chart's
# sidecar sets both); lmcache/banner.py:28,62: no banner in the server's log.
SERVER_ENV = {"LMCACHE_TRACK_USAGE": "false", "DO_NOT_TRACK": "1", "LMCACHE_DISABLE_BANNER": "1"}


def server_argv(
    program: Sequence[str], case: Case, *, port: int, http_port: int, l1_size_gb: float, shm_name: str | None
) -> list[str]:
    """`program` and the sidecar's flags as the chart renders them for an install of this case (`profile`,
    `lmcache.chunkSize`, `lmcache.separateObjectGroups`; charts/glm53/templates/_helpers.tpl, glm53.lmcacheServerArgs).

    The GPU host runs this file without helm-python-sdk, so the flags are spelled here; tests/test_gpu_proof_dryrun.py
    proves they equal the chart's, ports and L1 size aside. `--shm-name` is the CPU rehearsal's own: it puts L1 in a
    POSIX SHM segment (lmcache 0.5.6 lmcache/v1/multiprocess/server.py:442-461), which the chart never asks for.
    """
    argv = [*program, "--host", LOCALHOST, "--port", str(port), "--chunk-size", str(case.chunk_size)]
    if case.separate_object_groups:
        argv.append("--separate-object-groups")
    argv += ["--l1-size-gb", f"{l1_size_gb:g}", "--eviction-policy", "LRU"]
    argv += ["--http-host", LOCALHOST, "--http-port", str(http_port), "--no-run-script-api-enabled"]
    return argv if shm_name is None else [*argv, "--shm-name", shm_name]


@contextlib.contextmanager
def running_server(case: Case, settings: Settings, log: Path) -> Iterator[int]:
    """The real `lmcache server` with the sidecar's flags (`server_argv`), a process of its own; yields its port."""
    port, http_port = free_ports(2)
    lmcache = Path(sys.executable).with_name("lmcache")
    program = (str(lmcache), "server") if lmcache.exists() else (sys.executable, "-m", "lmcache.cli.main", "server")
    shm_name = f"glm53-gpu-proof-{os.getpid()}-{port}" if settings.device == "cpu" else None
    argv = server_argv(program, case, port=port, http_port=http_port, l1_size_gb=settings.l1_size_gb, shm_name=shm_name)
    with serving(argv, SERVER_ENV, http_port, log, SERVER_START_SECONDS):
        yield port


def run_case(torch: Any, case: Case, settings: Settings, out_dir: Path) -> dict[str, Any]:
    """One server, one registered worker, `requests` store/lookup/retrieve rounds; correctness and GB/s."""
    import zmq
    from lmcache.v1.multiprocess.transport.factory import RequestClientFactory

    device = torch.device("cuda", 0) if settings.device == "cuda" else torch.device("cpu")
    log = out_dir / f"lmcache-server-{case.name.replace('@', '-')}.log"
    result: dict[str, Any] = {"case": case.name, "bytes_per_token": case.bytes_per_token, "server_log": log.name}
    with running_server(case, settings, log) as port:
        zmq_context = zmq.Context()
        req_client = RequestClientFactory.create(f"tcp://{LOCALHOST}:{port}", context=zmq_context)
        try:
            chunk = int(req_client.get_chunk_size().result(timeout=RPC_TIMEOUT_SECONDS))
            if chunk != case.chunk_size:
                raise ProofError(f"server answers chunk size {chunk}, expected {case.chunk_size}")
            reg = register(torch, req_client, case, settings, device)
            result["group_infos"] = [repr(info) for info in reg.group_infos]
            rounds = [one_request(torch, req_client, reg, case, settings, seq) for seq in range(settings.requests)]
            with contextlib.suppress(Exception):
                future = reg.context.unregister()
                if future is not None:
                    future.result(timeout=RPC_TIMEOUT_SECONDS)
            reg.context.close()
        finally:
            req_client.close()
            zmq_context.term()
    timed = rounds[settings.warmup :]
    # Bytes a request moves each way: the blocks a retrieve restores (whole request for attention, the last block
    # for KDA state); the store cuts the same blocks (lmcache_driven_transfer.py:660-664).
    moved = sum(g["bytes_restored"] for g in timed[0]["groups"].values())
    result.update(
        {
            "rounds": rounds,
            "bytes_per_request_expected": case.chunk_bytes * settings.chunks,
            "bytes_per_request_moved": moved,
            "all_hit": all(r["hit_chunks"] == settings.chunks for r in rounds),
            "all_equal": all(g["ok"] == g["blocks"] for r in rounds for g in r["groups"].values()),
            "store": summarize([r["store_s"] for r in timed]),
            "retrieve": summarize([r["retrieve_s"] for r in timed]),
        }
    )
    result["store_gbps"] = gbps(moved, result["store"]["median_s"])
    result["retrieve_gbps"] = gbps(moved, result["retrieve"]["median_s"])
    return result


def pinned_memcpy(torch: Any, nbytes: int, reps: int) -> dict[str, float]:
    """Pinned host <-> device `cudaMemcpyAsync` (Tensor.copy_, non_blocking) of `nbytes`, timed with CUDA events."""
    device = torch.device("cuda", 0)
    host = torch.empty(nbytes, dtype=torch.uint8, pin_memory=True)
    host.random_(0, 256)
    gpu = torch.empty(nbytes, dtype=torch.uint8, device=device)
    timings: dict[str, list[float]] = {"d2h": [], "h2d": []}
    for _ in range(reps + 2):  # two warm-ups
        for direction in ("h2d", "d2h"):
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            if direction == "h2d":
                gpu.copy_(host, non_blocking=True)
            else:
                host.copy_(gpu, non_blocking=True)
            end.record()
            end.synchronize()
            timings[direction].append(start.elapsed_time(end) / 1e3)
    if not torch.equal(host[:4096], gpu[:4096].cpu()):
        raise ProofError("pinned memcpy round trip changed the bytes")
    return {
        "bytes": nbytes,
        "d2h_gbps": gbps(nbytes, statistics.median(timings["d2h"][2:])),
        "h2d_gbps": gbps(nbytes, statistics.median(timings["h2d"][2:])),
    }


def run_ipc(settings: Settings, out_dir: Path) -> dict[str, Any]:
    import torch

    if settings.device == "cuda" and not torch.cuda.is_available():
        raise ProofError("expected a CUDA GPU for --device cuda but torch sees none; use --device cpu to rehearse")
    report: dict[str, Any] = {"settings": {**asdict(settings), "cases": [c.name for c in settings.cases]}, "cases": []}
    for case in settings.cases:
        try:
            report["cases"].append(run_case(torch, case, settings, out_dir))
        except Exception as exc:  # one broken case must not hide the others' results
            report["cases"].append({"case": case.name, "error": f"{type(exc).__name__}: {exc}"})
    if settings.device == "cuda":
        sizes = sorted({2**30, *(bytes_moved(c, settings.chunks, expected_windows(c)) for c in settings.cases)})
        report["pinned_memcpy"] = [pinned_memcpy(torch, n, settings.reps) for n in sizes]
    return report


def ipc_table(report: dict[str, Any]) -> list[str]:
    """The short table printed last: per case GB/s and the ratio to a pinned memcpy of the same size."""
    copies = {c["bytes"]: c for c in report.get("pinned_memcpy", [])}
    lines = ["case                 B/token  MiB/req  hit  bytes-ok  store GB/s (of D2H)  retrieve GB/s (of H2D)"]
    for case in report["cases"]:
        if "error" in case:
            lines.append(f"{case['case']:<20} ERROR {case['error'][:150]}")
            continue
        copy = copies.get(case["bytes_per_request_moved"])
        store_ratio = f"{case['store_gbps'] / copy['d2h_gbps']:.0%}" if copy else "-"
        retrieve_ratio = f"{case['retrieve_gbps'] / copy['h2d_gbps']:.0%}" if copy else "-"
        lines.append(
            f"{case['case']:<20} {case['bytes_per_token']:>7,.0f}  {case['bytes_per_request_moved'] / 2**20:>7.1f}"
            f"  {'yes' if case['all_hit'] else 'NO':<3}  {'yes' if case['all_equal'] else 'NO':<8}"
            f"  {case['store_gbps']:>10.2f} ({store_ratio:>4})  {case['retrieve_gbps']:>13.2f} ({retrieve_ratio:>4})"
        )
    for copy in report.get("pinned_memcpy", []):
        lines.append(
            f"pinned cudaMemcpy {copy['bytes'] / 2**20:>8.1f} MiB: D2H {copy['d2h_gbps']:.2f} GB/s, "
            f"H2D {copy['h2d_gbps']:.2f} GB/s"
        )
    return lines


# ---- kernels: lmcache.cuda_ops against a PyTorch gather ------------------------------------------------------


@dataclass(frozen=True)
class KernelShape:
    """One MLA-style paged layout (NL x (NB, BS, HS)) and the LMCache object size the kernel packs blocks into.

    One kernel call takes 1 to 4 objects (the 0.5.6 kernel refuses more: "Expected 1-4 LMCache objects").
    """

    name: str
    layers: int
    block_size: int
    width: int
    tokens_per_object: int
    objects: int


KERNEL_SHAPES = (
    # GLM-5.3 per worker: 78 DSA latent layers of 64-token blocks, 256-token objects (its recommended chunk).
    KernelShape("glm53-latent@256", 78, 64, DSA_LATENT_WIDTH, 256, 4),
    # GLM-5.3-Flash per worker: the sparse-MLA group's 11 NoPE latent layers, one 1152-token block per object.
    KernelShape("glm53-flash-latent@1152", 11, 1152, NOPE_LATENT_WIDTH, 1152, 4),
)


def median_seconds(torch: Any, fn: Callable[[], None], reps: int) -> float:
    """Median wall time of `fn` with the device drained before and after (one untimed warm-up first)."""
    samples = []
    for _ in range(reps + 1):
        torch.cuda.synchronize()
        started = time.perf_counter()
        fn()
        torch.cuda.synchronize()
        samples.append(time.perf_counter() - started)
    return statistics.median(samples[1:])


def locate_rows(torch: Any, obj: Any, source: list[Any], src_ids: list[int], shape: KernelShape) -> list[str]:
    """Where the first rows of an object came from (layer, request block, slot): shows the kernel's object layout."""
    stacked = torch.stack(source).view(torch.uint8)  # (layers, blocks, slots, width bytes)
    rows = obj.reshape(-1, shape.width).view(torch.uint8)
    found = []
    for r in (0, 1, shape.block_size, shape.tokens_per_object, shape.tokens_per_object + 1):
        if r >= rows.shape[0]:
            continue
        hits = (stacked == rows[r]).all(dim=-1).nonzero().tolist()
        where = [f"L{h[0]}/b{src_ids.index(h[1]) if h[1] in src_ids else 'x' + str(h[1])}/s{h[2]}" for h in hits[:2]]
        found.append(f"row {r}: {', '.join(where) or 'nowhere'}")
    return found


def kernel_case(torch: Any, shape: KernelShape, reps: int) -> dict[str, Any]:
    """D2H into pinned objects and compare with PyTorch references; H2D into other blocks and compare; time both."""
    import lmcache.cuda_ops as cuda_ops
    import lmcache.lmcache_native as native

    device = torch.device("cuda", 0)
    blocks_per_object = shape.tokens_per_object // shape.block_size
    total = blocks_per_object * shape.objects
    nb = 2 * total + 3
    generator = torch.Generator().manual_seed(shape.layers * 7919 + shape.width)
    order = torch.randperm(nb, generator=generator).tolist()
    src_ids, dst_ids = order[:total], order[total : 2 * total]
    source = [
        torch.empty((nb, shape.block_size, shape.width), dtype=torch.bfloat16, device=device)
        for _ in range(shape.layers)
    ]
    for tensor in source:
        random_fill(torch, tensor)
    target = [torch.empty_like(t) for t in source]
    for tensor in target:
        tensor.view(torch.uint8).fill_(POISON_BYTE)
    objects = [
        torch.empty((1, shape.layers, shape.tokens_per_object, shape.width), dtype=torch.bfloat16, pin_memory=True)
        for _ in range(shape.objects)
    ]
    desc = native.PageBufferShapeDesc()
    desc.kv_size, desc.nl, desc.nb, desc.bs, desc.nh, desc.hs = (1, shape.layers, nb, shape.block_size, 1, shape.width)
    desc.element_size = 2
    object_ptrs = [o.data_ptr() for o in objects]

    def transfer(tensors: list[Any], ids: list[int], direction: Any) -> None:
        # Called as LMCache's own kernel test calls it (lmcache 0.5.6 tests/v1/test_mp_mem_kernels.py:252-293).
        cuda_ops.multi_layer_block_kv_transfer(
            torch.tensor([t.data_ptr() for t in tensors], dtype=torch.int64, device=device),
            object_ptrs,
            torch.tensor(ids, dtype=torch.int64, device=device),
            device,
            direction,
            desc,
            shape.tokens_per_object,
            native.EngineKVFormat.NL_X_NB_BS_HS,
            0,
        )

    d2h_s = median_seconds(torch, lambda: transfer(source, src_ids, native.TransferDirection.D2H), reps)
    # Reference 1: LMCache's own PyTorch implementation of the same kernel (the fallback its other platforms run,
    # lmcache 0.5.6 lmcache/v1/platform/torch_ops/mp_mem_kernels.py:300), on CPU copies of the same inputs.
    from lmcache.v1.platform.torch_ops import mp_mem_kernels as torch_fallback

    cpu_source = [t.cpu() for t in source]
    fallback_objects = [torch.zeros(o.shape, dtype=o.dtype) for o in objects]
    torch_fallback.multi_layer_block_kv_transfer(
        cpu_source,
        fallback_objects,
        src_ids,
        torch.device("cpu"),
        native.TransferDirection.D2H,
        desc,
        shape.tokens_per_object,
        native.EngineKVFormat.NL_X_NB_BS_HS,
        0,
    )
    # Bytes, not values: random bytes include NaN patterns, which never compare equal as bf16.
    d2h_equal_fallback = all(
        torch.equal(a.view(torch.uint8), b.view(torch.uint8)) for a, b in zip(objects, fallback_objects, strict=True)
    )
    # Reference 2: a plain gather: object o, layer l holds layer l's blocks src_ids[o*k:(o+1)*k] in block order.
    src_index = torch.tensor(src_ids)
    d2h_equal = all(
        torch.equal(
            objects[o][0, layer].view(torch.uint8),
            cpu_source[layer]
            .index_select(0, src_index[o * blocks_per_object : (o + 1) * blocks_per_object])
            .reshape(shape.tokens_per_object, shape.width)
            .view(torch.uint8),
        )
        for o in range(shape.objects)
        for layer in range(shape.layers)
    )
    layout = [] if d2h_equal else locate_rows(torch, objects[0], cpu_source, src_ids, shape)
    h2d_s = median_seconds(torch, lambda: transfer(target, dst_ids, native.TransferDirection.H2D), reps)
    dst_index = torch.tensor(dst_ids, device=device)
    h2d_equal = all(
        torch.equal(
            target[layer].index_select(0, dst_index).view(torch.uint8),
            source[layer].index_select(0, src_index.to(device)).view(torch.uint8),
        )
        for layer in range(shape.layers)
    )
    nbytes = shape.layers * total * shape.block_size * shape.width * 2
    return {
        "shape": shape.name,
        "bytes": nbytes,
        "d2h_equal": d2h_equal,
        "d2h_equal_torch_fallback": d2h_equal_fallback,
        "h2d_equal": h2d_equal,
        "object_rows_from": layout,
        "d2h_gbps": gbps(nbytes, d2h_s),
        "h2d_gbps": gbps(nbytes, h2d_s),
    }


def run_kernels(reps: int) -> dict[str, Any]:
    import torch

    if not torch.cuda.is_available():
        raise ProofError("expected a CUDA GPU for the kernels but torch sees none")
    return {"kernels": [kernel_case(torch, shape, reps) for shape in KERNEL_SHAPES]}


# ---- command line -----------------------------------------------------------------------------------------------


def parse_args(argv: Sequence[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog=PROG, description=(__doc__ or "").splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    for name in ("plan", "ipc"):
        p = sub.add_parser(name)
        p.add_argument("--case", action="append", dest="cases", metavar="PROFILE@CHUNK", help="repeatable")
        p.add_argument("--chunks", type=int, default=8, help="whole chunks per request (default 8)")
        p.add_argument("--reps", type=int, default=5, help="timed requests per case (default 5)")
        p.add_argument("--warmup", type=int, default=1, help="untimed requests first (default 1)")
        p.add_argument("--l1-size-gb", type=float, default=8.0, help="the server's L1 (default 8)")
        p.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
        p.add_argument("--out", type=Path, help="directory for the JSON report and the server logs")
    k = sub.add_parser("kernels")
    k.add_argument("--reps", type=int, default=10)
    k.add_argument("--out", type=Path)
    return parser.parse_args(list(argv))


def settings_from(args: argparse.Namespace) -> Settings:
    settings = Settings(
        cases=tuple(parse_case(c) for c in (args.cases or DEFAULT_CASES)),
        chunks=args.chunks,
        reps=args.reps,
        warmup=args.warmup,
        l1_size_gb=args.l1_size_gb,
        device=args.device,
    )
    check_settings(settings)
    return settings


def emit(report: dict[str, Any], out: Path | None, name: str, table: list[str]) -> None:
    text = json.dumps(report, indent=2, sort_keys=True, default=str)
    if out is not None:
        out.mkdir(parents=True, exist_ok=True)
        (out / name).write_text(text + "\n", encoding="utf-8")
    print(text)
    print("\n".join(table))


def main(argv: Sequence[str]) -> int:
    args = parse_args(argv)
    try:
        if args.command == "plan":
            print("\n".join(plan_lines(settings_from(args))))
            return 0
        if args.command == "kernels":
            report = run_kernels(args.reps)
            table = [
                f"kernel {r['shape']}: D2H {r['d2h_gbps']:.1f} GB/s equal={r['d2h_equal']} "
                f"(torch fallback: {r['d2h_equal_torch_fallback']}), "
                f"H2D {r['h2d_gbps']:.1f} GB/s equal={r['h2d_equal']}"
                for r in report["kernels"]
            ]
            emit(report, args.out, "kernels.json", table)
            ok = all(r["d2h_equal"] and r["d2h_equal_torch_fallback"] and r["h2d_equal"] for r in report["kernels"])
            return 0 if ok else 1
        settings = settings_from(args)
        out = args.out or Path.cwd()
        out.mkdir(parents=True, exist_ok=True)
        report = run_ipc(settings, out)
        emit(report, out, "ipc.json", ipc_table(report))
        ok = all("error" not in c and c["all_hit"] and c["all_equal"] for c in report["cases"])
        return 0 if ok else 1
    except (ProofError, Glm53Error) as exc:  # Glm53Error: the sidecar server failed to start
        print(f"{PROG}: error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
