"""The KV geometry of one TP worker per case (pure): its cache groups and tensors as this proof estimates them from
the profile table (`glm53.profiles`), the cases the command line names, vLLM's block ids (align mode) and the bytes a
store and a retrieve move."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from glm53.profiles import (
    DSA_MLA,
    KDA_STATE,
    KPOOL_TAIL_SCRATCH,
    SPARSE_MLA_INDEXER,
    ModelProfile,
    get_profile,
)

from . import PROG, ProofError

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
# vLLM's null block: the block pool's first block (vllm 0.33 vllm/v1/core/block_pool.py:189-192), which LMCache's
# server also takes as "absent" by default (lmcache 0.5.6 lmcache/v1/multiprocess/config.py:146, null_block_id = 0).
NULL_BLOCK = 0
# How the stand-in hands block ids for KDA (Mamba-spec) groups:
#   align     what vLLM 0.33 hands with prefix caching on (the align Mamba mode): the null block for every block of the
#             request but the last, which holds the running state (vllm 0.33
#             vllm/v1/core/single_type_kv_cache_manager.py:1797-1860, MambaManager.allocate_new_blocks). LMCache skips
#             a chunk whose ids are all null (lmcache 0.5.6 lmcache/v1/multiprocess/modules/
#             lmcache_driven_transfer.py:85-127 `all_null_chunk_masks`, applied to the store at :684-696 and :756-758).
#   all-real  a real block for every chunk: what this benchmark did before issue 26. The store then copies one state
#             block per KDA layer and chunk, while a retrieve restores only the last (the one-block window,
#             :999-1012), so dividing the retrieve's bytes by the store's time understated the store.
BLOCK_LAYOUTS = ("align", "all-real")


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
    """One server configuration, the KV geometry of one TP worker of a model, and the chunk counts it runs."""

    name: str
    profile: str
    chunk_size: int
    separate_object_groups: bool
    groups: tuple[Group, ...]
    chunk_counts: tuple[int, ...] | None = None  # None: the run's --chunks

    @property
    def bytes_per_token(self) -> float:
        return sum(g.bytes_per_block / g.tokens_per_block for g in self.groups if g.cacheable)

    @property
    def chunk_bytes(self) -> int:
        return round(self.bytes_per_token * self.chunk_size)

    @property
    def layers(self) -> int:
        return sum(p.count for g in self.groups for p in g.planes)

    @property
    def hybrid(self) -> bool:
        """Mixes linear attention (KDA state, a Mamba spec) with attention: vLLM's `is_hybrid`."""
        return any(g.spec == "mamba" for g in self.groups)

    @property
    def blocks_in_chunk(self) -> int:
        return self.chunk_size // min(g.tokens_per_block for g in self.groups if g.cacheable)

    @property
    def label(self) -> str:
        """The case as the server logs and tables name it: `profile@chunk`."""
        return self.name.split(":")[0]


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


def make_case(profile_name: str, chunk_size: int, chunk_counts: tuple[int, ...] | None = None) -> Case:
    """A case for one profile and server chunk size; the chunk must be a multiple of every cacheable block."""
    profile = get_profile(profile_name)
    groups = profile_groups(profile)
    misfit = [g.tokens_per_block for g in groups if g.cacheable and chunk_size % g.tokens_per_block]
    if misfit:
        raise ProofError(
            f"chunk size {chunk_size} is not a multiple of {profile.display_name}'s block size {misfit[0]}; "
            f"the released server refuses it (use {profile.recommended_chunk_size})"
        )
    suffix = "" if chunk_counts is None else ":" + ",".join(str(c) for c in chunk_counts)
    return Case(
        name=f"{profile.name}@{chunk_size}{suffix}",
        profile=profile.name,
        chunk_size=chunk_size,
        separate_object_groups=profile.separate_object_groups_required,
        groups=groups,
        chunk_counts=chunk_counts,
    )


def parse_counts(text: str, what: str) -> tuple[int, ...]:
    """`1,4,8` -> (1, 4, 8); every entry a positive integer."""
    parts = [p.strip() for p in text.split(",")]
    if not parts or not all(p.isdigit() and int(p) > 0 for p in parts):
        raise ProofError(f"expected {what} as positive integers separated by commas (like 1,4,8) but got {text!r}")
    return tuple(int(p) for p in parts)


def parse_case(text: str) -> Case:
    """`PROFILE@CHUNK[:COUNTS]`, e.g. `glm53-flash@1152` or `glm53@1152:8` (only 8 chunks per request)."""
    spec, _, counts = text.partition(":")
    profile, sep, chunk = spec.partition("@")
    if not sep or not chunk.isdigit() or int(chunk) <= 0:
        raise ProofError(
            "expected a case like glm53@256 (PROFILE@CHUNK_SIZE, optionally :CHUNKS like glm53@1152:8) "
            f"but got {text!r}"
        )
    return make_case(profile, int(chunk), parse_counts(counts, "a case's chunk counts") if counts else None)


# ---- block ids and bytes (pure) ---------------------------------------------------------------------------------


def group_blocks(case: Case, group: Group, chunks: int) -> int:
    """The request's blocks in one vLLM group (0 for the scratch group, which takes part in no transfer)."""
    return chunks * case.chunk_size // group.tokens_per_block if group.cacheable else 0


def engine_block_ids(case: Case, chunks: int, destination: bool, layout: str = "align") -> list[list[int]]:
    """Per vLLM group: the request's block ids (source: from block 1, destination: the next as many).

    Attention groups get a real block for every block. KDA (Mamba) groups get, in the align layout, the null block
    for every block but the last, as vLLM 0.33 hands them (see BLOCK_LAYOUTS); in the all-real layout a real block
    each. A block id's position is the same in both layouts, so a real id is `first + position` either way.
    """
    if layout not in BLOCK_LAYOUTS:
        raise ProofError(f"expected a block-id layout in {', '.join(BLOCK_LAYOUTS)} but got {layout!r}")
    ids = []
    for group in case.groups:
        count = group_blocks(case, group, chunks)
        first = 1 + (count if destination else 0)
        real = list(range(first, first + count))
        if group.spec == "mamba" and layout == "align":
            real = [NULL_BLOCK] * (count - 1) + real[-1:]
        ids.append(real)
    return ids


def block_ids(case: Case, chunks: int, destination: bool, layout: str, infos: Sequence[Any]) -> list[list[int]]:
    """One block-id list per LMCache KV group (per EngineGroupInfo, not per vLLM group: lmcache 0.5.6
    lmcache/v1/multiprocess/modules/lmcache_driven_transfer.py:586-588, as its `bench server` client does)."""
    per_engine_group = engine_block_ids(case, chunks, destination, layout)
    return [list(per_engine_group[info.engine_group_id]) for info in infos]


def window_blocks(case: Case, gi: int, windows: Mapping[int, int]) -> int | None:
    """Blocks of group `gi` an object holds per chunk when the group has a window (None: no window)."""
    group = case.groups[gi]
    window = windows.get(gi, -1)
    if window <= 0:
        return None
    return max(1, min(window, case.chunk_size) // group.tokens_per_block)


def restored_blocks(case: Case, chunks: int, windows: Mapping[int, int]) -> list[int]:
    """Per vLLM group: how many of the request's last blocks a retrieve restores.

    Attention groups move every block. Align-mode Mamba (KDA state) groups behave like a sliding window of one block
    (lmcache 0.5.6 lmcache/integration/vllm/kv_cache_groups.py:83-95): the server reads only the in-window suffix of
    chunks (lmcache/v1/multiprocess/modules/lmcache_driven_transfer.py:999-1012). `windows` maps a vLLM group index
    to its window in tokens (absent or <= 0: none).
    """
    counts = []
    for gi, group in enumerate(case.groups):
        blocks = group_blocks(case, group, chunks)
        window = windows.get(gi, -1)
        if window > 0:
            chunks_in_window = -(-window // case.chunk_size)
            blocks = min(blocks, chunks_in_window * case.chunk_size // group.tokens_per_block)
        counts.append(blocks)
    return counts


def stored_blocks(case: Case, chunks: int, windows: Mapping[int, int], layout: str) -> list[int]:
    """Per vLLM group: how many blocks a store copies out.

    The store reserves an object for every chunk whose block ids are not all null (lmcache 0.5.6
    lmcache/v1/multiprocess/modules/lmcache_driven_transfer.py:684-696, :756-758) and cuts a windowed group's chunk to
    its window (:698, lmcache/v1/multiprocess/object_group_transfer.py:160-199). With the align layout a KDA group has
    one such chunk (its last); with all-real ids every chunk.
    """
    counts = []
    for gi, group in enumerate(case.groups):
        blocks = group_blocks(case, group, chunks)
        per_chunk = window_blocks(case, gi, windows)
        if per_chunk is not None and blocks:
            real_chunks = 1 if (group.spec == "mamba" and layout == "align") else chunks
            blocks = min(blocks, real_chunks * per_chunk)
        counts.append(blocks)
    return counts


def expected_windows(case: Case) -> dict[int, int]:
    """The windows LMCache's group conversion gives (one block for KDA state), for planning without LMCache."""
    return {gi: g.tokens_per_block for gi, g in enumerate(case.groups) if g.spec == "mamba"}


def bytes_moved(case: Case, chunks: int, windows: Mapping[int, int]) -> int:
    """Bytes one retrieve restores."""
    counts = restored_blocks(case, chunks, windows)
    return sum(count * g.bytes_per_block for count, g in zip(counts, case.groups, strict=True) if g.cacheable)


def bytes_stored(case: Case, chunks: int, windows: Mapping[int, int], layout: str) -> int:
    """Bytes one store copies out."""
    counts = stored_blocks(case, chunks, windows, layout)
    return sum(count * g.bytes_per_block for count, g in zip(counts, case.groups, strict=True) if g.cacheable)


def request_bytes(case: Case, chunks: int, layout: str = "align") -> tuple[int, int]:
    """(stored, restored) bytes of one request of `chunks` chunks, from the planned windows."""
    windows = expected_windows(case)
    return bytes_stored(case, chunks, windows, layout), bytes_moved(case, chunks, windows)


def num_blocks_for(case: Case, max_chunks: int) -> int:
    """The null block, source blocks for the longest request, as many destination blocks."""
    return 1 + 2 * max_chunks * case.blocks_in_chunk


def gpu_bytes_for(case: Case, max_chunks: int) -> int:
    """Device memory one worker's KV tensors take (every cacheable tensor holds `num_blocks_for` blocks)."""
    return num_blocks_for(case, max_chunks) * sum(g.bytes_per_block for g in case.groups if g.cacheable)
