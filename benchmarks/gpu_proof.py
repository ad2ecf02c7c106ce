"""The GPU half of the sidecar design, proven on one H200: LMCache's copy kernels, CUDA IPC into the real
`lmcache server` across processes, and what that path moves per second, measured as vLLM uses it, beside the host
link's own limit.

Why: CI has no GPU, so nothing else in the repository runs LMCache's CUDA extension or its CUDA IPC path. This script
is what `scripts/gpu-proof.sh` runs after building LMCache from its sdist on the GPU host:

``plan``     the cases, their geometry and bytes (pure arithmetic; the shell script's ``--dry-run`` prints it on CPU);
``kernels``  ``lmcache.cuda_ops.multi_layer_block_kv_transfer`` on the GPU (device -> pinned host objects -> device)
             for both models' paged layouts, checked byte for byte against LMCache's own PyTorch implementation of
             the kernel and a plain gather, and timed;
``ipc``      per case: the real ``lmcache server`` in its own process, started through ``lmcache-server`` below so
             that it logs when each store and retrieve reaches its handler, starts and ends its copy; this process
             is the GPU engine stand-in. It registers CUDA KV tensors shaped like the model's cache groups (LMCache's
             own vLLM group conversion, its lmcache-driven transfer context: CUDA IPC handles), and per request
             stores it with vLLM 0.33's align-mode block ids, looks it up until the whole request is visible,
             retrieves it into poisoned blocks and compares the bytes; for 1, 4, 8, 16 and 64 chunks per request.
             Per request it prints the client/transport time, the server's time before the copy, the copy and the
             time until a lookup sees the stored chunks, and the bytes the server really moved each way; then a
             pinned ``cudaMemcpy`` (``Tensor.copy_``) of the same sizes in both directions, in the same run;
``tp``       N worker processes (the TP ranks of one pod, here sharing one GPU: "single-GPU"), each registering its
             own KV tensors with the pod's server (or, ``--layouts per-rank``, with its own server, the connector's
             ``lmcache.mp.server_urls`` layout), storing and retrieving one request concurrently, with the roles
             LMCache's connector gives each rank; aggregate GB/s beside N concurrent pinned copies measured the same
             way, the server's CPU use, and p50/p99 latencies;
``lmcache-server``  ``lmcache server`` with the phase probes installed (used by ``ipc`` and ``tp``).
             ``--device cpu`` rehearses ``ipc`` and ``tp`` on a CPU host (LMCache then moves the bytes through POSIX
             SHM), which is how this script was made to work before it met a GPU.

Shapes are per TP worker and follow the profile table (`glm53.profiles`): group kinds, tokens per block and layer
counts come from there; the widths below are this script's estimates of the physical pages (documented beside them).
Prints one JSON document (also written to ``--out``) and short tables last.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import contextlib
import functools
import importlib
import json
import math
import os
import random
import statistics
import sys
import threading
import time
import zlib
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import asdict, dataclass, field, replace
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
SERVER_START_SECONDS = 180.0
WORKER_START_SECONDS = 300.0
# A poison byte pattern the retrieve must overwrite; the sources are random, so an untouched block is caught.
POISON_BYTE = 0x5A
# How long a stored request may take to become visible to lookups before the round counts as a miss.
VISIBLE_WITHIN_SECONDS = 10.0
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
# vLLM's `--max-model-len`-sized requests are far longer; 64 chunks of 1152 tokens is 73,728 tokens.
DEFAULT_CHUNKS = (1, 4, 8, 16, 64)
# LMCache pins an L1 of up to 20 GB at start and grows it lazily beyond (lmcache 0.5.6
# lmcache/v1/distributed/config.py:293-297, init_size_in_bytes; --l1-use-lazy defaults to on, :805-821): the proof
# keeps every server's L1 within it, so that no timed store pays for pinning new host memory.
LMCACHE_L1_INIT_GB = 20.0
# The environment variable that tells `lmcache-server` where to write its phase records.
PHASE_LOG_ENV = "GLM53_GPU_PROOF_PHASE_LOG"
SERVER_LAYOUTS = ("one", "per-rank")


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


# The GLM-5.3-Flash deployment's chunk (its N) and GLM-5.3's recommended 256 over the whole chunks-per-request curve;
# GLM-5.3 at 1152 at 8 chunks to compare chunk sizes at one per-token size (its 64-chunk request would be 7.4 GB).
# GLM-5.3-Flash at 256 does not exist: its blocks are 1152 tokens.
DEFAULT_CASES = ("glm53-flash@1152", "glm53@256", "glm53@1152:8")
# The TP runs: both models at their deployment chunk.
DEFAULT_TP_CASES = ("glm53-flash@1152", "glm53@256")


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


# ---- settings and the plan (pure) -------------------------------------------------------------------------------


@dataclass(frozen=True)
class Settings:
    """What one `ipc` run does: per case and chunk count, `reps` timed requests after `warmup` untimed ones; at
    `all_real_at` chunks (0: never) also the pre-issue-26 all-real block ids, for cases with KDA groups."""

    cases: tuple[Case, ...]
    chunks: tuple[int, ...]
    reps: int
    warmup: int
    l1_size_gb: float | None  # None: sized per case (`l1_for`)
    device: str
    all_real_at: int = 8
    server_args: tuple[str, ...] = ()  # flags beyond the chart's sidecar flags, for experiments (--server-arg)

    @property
    def requests(self) -> int:
        return self.reps + self.warmup

    def points(self, case: Case) -> list[tuple[int, str]]:
        """(chunks, block layout) in the order they run."""
        points = [(c, "align") for c in (case.chunk_counts or self.chunks)]
        if self.all_real_at and case.hybrid:
            points.append((self.all_real_at, "all-real"))
        return points

    def max_chunks(self, case: Case) -> int:
        return max(c for c, _ in self.points(case))

    def l1_needed_gb(self, case: Case) -> float:
        """Every request stores new tokens, so L1 must hold all of them without evicting (plus a quarter spare)."""
        stored = sum(request_bytes(case, c, layout)[0] for c, layout in self.points(case))
        return stored * self.requests * 1.25 / 2**30

    def l1_for(self, case: Case) -> float:
        return self.l1_size_gb if self.l1_size_gb is not None else float(math.ceil(self.l1_needed_gb(case) + 0.5))


@dataclass(frozen=True)
class TpSettings:
    """What one `tp` run does: per case, rank count and server layout, one request of `chunks` chunks per round."""

    cases: tuple[Case, ...]
    ranks: tuple[int, ...]
    layouts: tuple[str, ...]
    chunks: int
    reps: int
    warmup: int
    device: str
    server_args: tuple[str, ...] = ()  # flags beyond the chart's sidecar flags, for experiments (--server-arg)

    @property
    def requests(self) -> int:
        return self.reps + self.warmup

    @staticmethod
    def writers(case: Case, ranks: int, layout: str) -> int:
        """Ranks that store: all of them, except for a pure-MLA model (KV replicated across TP ranks), where it is the
        first rank of each server (lmcache 0.5.6 lmcache/integration/vllm/vllm_multi_process_adapter.py:446-459;
        `mla_only`, lmcache/integration/vllm/utils.py:348-356: MLA and not hybrid; both models' attention is MLA).
        `run_tp_case` checks this against LMCache's own `ParallelStrategy` before it runs."""
        servers = ranks if layout == "per-rank" else 1
        return ranks if case.hybrid else servers

    def l1_per_server_gb(self, case: Case, ranks: int, layout: str) -> float:
        """What one server must hold without evicting: its writers' stores over all rounds, plus a quarter."""
        servers = ranks if layout == "per-rank" else 1
        stored = request_bytes(case, self.chunks)[0] * self.writers(case, ranks, layout) * self.requests
        return float(math.ceil(stored * 1.25 / servers / 2**30 + 0.5))


def plan_lines(settings: Settings, tp: TpSettings | None = None) -> list[str]:
    """The human-readable plan: one line per case with its geometry and byte counts, then the TP runs."""
    lines = [
        f"{PROG}: device={settings.device} requests={settings.requests} (timed {settings.reps}) per chunk count; "
        f"block ids as vLLM 0.33's align mode"
        + (f" (and all-real at {settings.all_real_at} chunks for KDA models)" if settings.all_real_at else "")
    ]
    for case in settings.cases:
        groups = ", ".join(
            f"{g.kind}[{g.tokens_per_block}]" + ("" if g.cacheable else " (skipped)") for g in case.groups
        )
        per_point = ", ".join(
            f"{c}{'' if layout == 'align' else ' all-real'}: "
            + "/".join(f"{b / 2**20:.1f}" for b in request_bytes(case, c, layout))
            for c, layout in settings.points(case)
        )
        lines.append(
            f"  {case.name}: {case.layers} tensors in {len(case.groups)} groups ({groups}); "
            f"{case.bytes_per_token:,.0f} B/token, {case.chunk_bytes / 2**20:.1f} MiB/chunk; "
            f"MiB stored/restored per request by chunks: {per_point}; "
            f"GPU {gpu_bytes_for(case, settings.max_chunks(case)) / 2**30:.1f} GiB, L1 {settings.l1_for(case):g} GB"
        )
    if settings.server_args:
        lines.append(f"  ipc server flags beyond the chart's: {' '.join(settings.server_args)}")
    return lines if tp is None else lines + tp_plan_lines(tp)


def tp_plan_lines(tp: TpSettings) -> list[str]:
    lines = [f"  tp server flags beyond the chart's: {' '.join(tp.server_args)}"] if tp.server_args else []
    for case in tp.cases:
        for ranks in tp.ranks:
            for layout in tp.layouts:
                stored, restored = request_bytes(case, tp.chunks)
                servers = ranks if layout == "per-rank" else 1
                lines.append(
                    f"  tp {case.label} x{ranks} single-GPU, {servers} server{'s' if servers > 1 else ''} "
                    f"({layout}): {tp.chunks} chunks, {stored / 2**20:.1f}/{restored / 2**20:.1f} MiB stored/restored "
                    f"per writing/reading rank, {tp.writers(case, ranks, layout)} writing, "
                    f"{tp.requests} rounds (timed {tp.reps}), "
                    f"L1 {tp.l1_per_server_gb(case, ranks, layout):g} GB per server"
                )
    return lines


def check_settings(settings: Settings) -> None:
    """Refuse settings that cannot work before anything starts."""
    if not settings.chunks or min(settings.chunks) < 1 or settings.reps < 1 or settings.warmup < 0:
        raise ProofError("expected --chunks >= 1, --reps >= 1 and --warmup >= 0")
    if settings.all_real_at < 0:
        raise ProofError(f"expected --all-real-at >= 0 (0: off) but got {settings.all_real_at}")
    for case in settings.cases:
        needed = settings.l1_needed_gb(case)
        if settings.l1_size_gb is not None and needed > settings.l1_size_gb:
            raise ProofError(
                f"{case.name} stores {needed:.1f} GB over the run but --l1-size-gb is "
                f"{settings.l1_size_gb:g}; raise it or lower --chunks/--reps"
            )
        if settings.l1_for(case) > LMCACHE_L1_INIT_GB:
            raise ProofError(
                f"{case.name} needs an L1 of {settings.l1_for(case):g} GB, more than the {LMCACHE_L1_INIT_GB:g} GB a "
                f"server pins at start (it grows lazily beyond, inside timed stores); lower --chunks/--reps or give "
                f"the case fewer chunks (like {case.label}:8)"
            )


def check_tp_settings(tp: TpSettings) -> None:
    if not tp.ranks or min(tp.ranks) < 1 or tp.chunks < 1 or tp.reps < 1 or tp.warmup < 0:
        raise ProofError("expected --ranks >= 1, --tp-chunks >= 1, --tp-reps >= 1 and --warmup >= 0")
    for layout in tp.layouts:
        if layout not in SERVER_LAYOUTS:
            raise ProofError(f"expected --layouts from {', '.join(SERVER_LAYOUTS)} but got {layout!r}")
    for case in tp.cases:
        for ranks in tp.ranks:
            for layout in tp.layouts:
                per_server = tp.l1_per_server_gb(case, ranks, layout)
                if per_server > LMCACHE_L1_INIT_GB:
                    raise ProofError(
                        f"tp {case.label} x{ranks} ({layout}) needs an L1 of {per_server:g} GB per server, more than "
                        f"the {LMCACHE_L1_INIT_GB:g} GB a server pins at start; lower --tp-chunks or --tp-reps"
                    )


# ---- statistics (pure) ------------------------------------------------------------------------------------------


def gbps(nbytes: int, seconds: float) -> float:
    return nbytes / seconds / 1e9


def summarize(samples: Sequence[float]) -> dict[str, float]:
    """Median and spread of timings in seconds."""
    return {"median_s": statistics.median(samples), "min_s": min(samples), "max_s": max(samples)}


def percentile(samples: Sequence[float], q: float) -> float:
    """The nearest-rank percentile: the smallest sample with at least `q` % of the samples at or below it."""
    ordered = sorted(samples)
    if not ordered:
        raise ProofError("no samples to take a percentile of")
    rank = max(1, math.ceil(q / 100 * len(ordered)))
    return ordered[rank - 1]


def aggregate_gbps(spans: Sequence[tuple[int, int, int]]) -> float:
    """Bytes of concurrent operations over the wall time from the first start to the last end: (start_ns, end_ns,
    bytes) per operation, all on one monotonic clock."""
    if not spans:
        return 0.0
    wall = max(end for _, end, _ in spans) - min(start for start, _, _ in spans)
    return sum(nbytes for _, _, nbytes in spans) / (wall / 1e9) / 1e9


def join_phases(submit_ns: int, reply_ns: int, server: Mapping[str, Any] | None) -> dict[str, Any]:
    """One store or retrieve, split at the server's own timestamps (all on CLOCK_MONOTONIC, one clock for every
    process of the host):

    transport_in   client submit -> the server's handler starts (client work, ZMQ, the server's queue)
    pre_copy       handler start -> its first copy call (token-id hashing, L1 reservation or lookup, block-id staging)
    copy           the first copy's start -> the last copy's end, on the server's GPU stream (wall time on CPU)
    post_copy      the last copy call's return -> handler end (CPU work after the copies are queued)
    reply          the later of handler end and copy end -> the client holds the reply (completion event, ZMQ)
    client_transport  transport_in + reply: the part outside the server's handler and its copy
    """
    total = (reply_ns - submit_ns) / 1e9
    if server is None:
        return {"total_s": total}
    enter, leave = server["enter_ns"], server["exit_ns"]
    first, last = server.get("first_transfer_ns"), server.get("last_transfer_ns")
    copy_done = max(leave, server.get("copy_done_ns", leave))
    phases: dict[str, Any] = {
        "total_s": total,
        "transport_in_s": (enter - submit_ns) / 1e9,
        "pre_copy_s": None if first is None else (first - enter) / 1e9,
        "copy_s": server.get("copy_s"),
        "post_copy_s": None if last is None else (leave - last) / 1e9,
        "handler_s": (leave - enter) / 1e9,
        "reply_s": (reply_ns - copy_done) / 1e9,
        "server_bytes": server.get("bytes", 0),
        "copy_calls": server.get("transfers", 0),
        "transfer_cpu_s": server.get("transfer_cpu_ns", 0) / 1e9,
    }
    phases["client_transport_s"] = phases["transport_in_s"] + phases["reply_s"]
    return phases


def median_of(rows: Sequence[Mapping[str, Any]], key: str) -> float | None:
    values = [r[key] for r in rows if r.get(key) is not None]
    return statistics.median(values) if values else None


def now_ns() -> int:
    return time.clock_gettime_ns(time.CLOCK_MONOTONIC)


def request_seed(text: str) -> int:
    return zlib.crc32(text.encode())


def request_tokens(request: str, tokens: int) -> tuple[int, ...]:
    """Fresh token ids for one request, the same in every process that names it (the scheduler and each rank)."""
    rng = random.Random(request_seed(request))
    return tuple(rng.randrange(150_000) for _ in range(tokens))


# ---- the server, with phase probes ---------------------------------------------------------------------------------

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


def install_phase_probes(log_path: Path) -> None:
    """Wrap the released server's store/retrieve handlers and its per-object-group copy so that every request leaves
    one JSON line in `log_path`: when the handler started and ended, when its first copy was queued and its last
    returned, the copy's span on the server's GPU stream (CUDA events), and the bytes of the memory objects it copied.

    Where: the store handler calls `store_with_chunk_mask` (lmcache 0.5.6 lmcache/v1/multiprocess/modules/
    lmcache_driven_transfer.py:561-572); `retrieve` is the handler itself (:852-863; wrapped with functools.wraps, so
    the `request_handler` options and signature it is registered by stay: lmcache/v1/multiprocess/
    request_handler.py:60-64, 104-130); both copy through the module's `transfer_kv_per_object_group` (:780-791,
    :1053-1062), on the cache context's stream. Handlers for different workers run on different threads
    (lmcache/v1/multiprocess/affinity_pool.py:1-10), so the open record is thread-local. Cost per request: two CUDA
    event records per copy call and one queue put; the events are resolved on a thread of their own.
    """
    import queue

    from lmcache.v1.multiprocess.modules import lmcache_driven_transfer as ldt

    torch: Any = importlib.import_module("torch")

    current = threading.local()
    finished: queue.Queue[dict[str, Any]] = queue.Queue()
    use_cuda = torch.cuda.is_available()
    module_class = ldt.LMCacheDrivenTransferModule

    def probe_handler(op: str, method: Callable[..., Any]) -> Callable[..., Any]:
        @functools.wraps(method)
        def handler(self: Any, key: Any, instance_id: int, *args: Any, **kwargs: Any) -> Any:
            record: dict[str, Any] = {
                "op": op,
                "request_id": key.request_id,
                "instance_id": instance_id,
                "worker_id": key.worker_id,
                "enter_ns": now_ns(),
                "transfers": 0,
                "bytes": 0,
                "transfer_cpu_ns": 0,
            }
            current.record = record
            try:
                return method(self, key, instance_id, *args, **kwargs)
            finally:
                record["exit_ns"] = now_ns()
                current.record = None
                finished.put(record)

        return handler

    original_transfer = ldt.transfer_kv_per_object_group

    def transfer(cache_context: Any, block_ids_gpu: Any, memory_objs: Any, *args: Any, **kwargs: Any) -> Any:
        record = getattr(current, "record", None)
        if record is None:
            return original_transfer(cache_context, block_ids_gpu, memory_objs, *args, **kwargs)
        started = now_ns()
        record.setdefault("first_transfer_ns", started)
        if use_cuda and "start_event" not in record:
            record["start_event"] = torch.cuda.Event(enable_timing=True)
            record["start_event"].record(cache_context.stream)
        try:
            return original_transfer(cache_context, block_ids_gpu, memory_objs, *args, **kwargs)
        finally:
            if use_cuda:
                record["end_event"] = torch.cuda.Event(enable_timing=True)
                record["end_event"].record(cache_context.stream)
            record["last_transfer_ns"] = now_ns()
            record["transfer_cpu_ns"] += record["last_transfer_ns"] - started
            record["transfers"] += 1
            record["bytes"] += sum(int(m.get_size()) for m in memory_objs if m is not None)

    def resolve() -> None:
        with log_path.open("a", encoding="utf-8") as out:
            while True:
                record = finished.get()
                start, end = record.pop("start_event", None), record.pop("end_event", None)
                if end is not None and start is not None:
                    end.synchronize()
                    record["copy_done_ns"] = now_ns()
                    record["copy_s"] = start.elapsed_time(end) / 1e3
                elif "first_transfer_ns" in record:  # CPU: the copies ran inside the calls
                    record["copy_done_ns"] = record["last_transfer_ns"]
                    record["copy_s"] = (record["last_transfer_ns"] - record["first_transfer_ns"]) / 1e9
                out.write(json.dumps(record) + "\n")
                out.flush()

    threading.Thread(target=resolve, name="gpu-proof-phases", daemon=True).start()
    module_class.store_with_chunk_mask = probe_handler("store", module_class.store_with_chunk_mask)
    module_class.retrieve = probe_handler("retrieve", module_class.retrieve)
    ldt.transfer_kv_per_object_group = transfer


def lmcache_server_main(argv: Sequence[str]) -> int:
    """`lmcache <argv>` (the released CLI, lmcache/cli/main.py) with the phase probes, when PHASE_LOG_ENV is set."""
    log = os.environ.get(PHASE_LOG_ENV)
    if log:
        install_phase_probes(Path(log))
    from lmcache.cli.main import main as lmcache_main

    lmcache_main(list(argv))
    return 0


@dataclass(frozen=True)
class ServerHandle:
    """One started server: where to reach it, its process id and its logs."""

    port: int
    http_port: int
    pid: int
    log: Path
    phase_log: Path

    @property
    def url(self) -> str:
        return f"tcp://{LOCALHOST}:{self.port}"


@contextlib.contextmanager
def running_servers(
    case: Case,
    device: str,
    l1_size_gb: float,
    count: int,
    out_dir: Path,
    label: str,
    extra_args: Sequence[str] = (),
) -> Iterator[list[ServerHandle]]:
    """`count` real servers with the sidecar's flags (`server_argv`, then `extra_args`), started in parallel, each a
    process of its own running `lmcache-server` (the released server with phase probes); yields their handles and
    stops them all."""
    ports = free_ports(2 * count)
    logs = [out_dir / (f"{label}.log" if count == 1 else f"{label}-s{i}.log") for i in range(count)]
    program = (sys.executable, str(Path(__file__).resolve()), "lmcache-server", "server")
    managers = []
    for i, log in enumerate(logs):
        phase_log = log.with_suffix(".phases.jsonl")
        phase_log.unlink(missing_ok=True)
        shm_name = f"glm53-gpu-proof-{os.getpid()}-{ports[2 * i]}" if device == "cpu" else None
        argv = server_argv(
            program, case, port=ports[2 * i], http_port=ports[2 * i + 1], l1_size_gb=l1_size_gb, shm_name=shm_name
        )
        argv += list(extra_args)
        env = {**SERVER_ENV, PHASE_LOG_ENV: str(phase_log)}
        managers.append(serving(argv, env, ports[2 * i + 1], log, SERVER_START_SECONDS))
    with contextlib.ExitStack() as stack:
        handles: list[ServerHandle] = []
        errors: list[BaseException] = []
        with concurrent.futures.ThreadPoolExecutor(max_workers=count) as pool:
            started = [pool.submit(manager.__enter__) for manager in managers]
            for i, (manager, future) in enumerate(zip(managers, started, strict=True)):
                try:
                    process = future.result()
                except BaseException as exc:  # stop the others, then report the first failure
                    errors.append(exc)
                    continue
                stack.push(manager)
                handles.append(
                    ServerHandle(
                        ports[2 * i], ports[2 * i + 1], process.pid, logs[i], logs[i].with_suffix(".phases.jsonl")
                    )
                )
        if errors:
            raise errors[0]
        yield handles


def server_cpu_seconds(pids: Sequence[int]) -> float:
    """User + system CPU seconds of the server processes (all their threads) and their children so far."""
    psutil: Any = importlib.import_module("psutil")  # untyped; on the GPU host's image and in LMCache's requirements

    total = 0.0
    for pid in pids:
        process = psutil.Process(pid)
        for proc in [process, *process.children(recursive=True)]:
            with contextlib.suppress(psutil.Error):
                times = proc.cpu_times()
                total += times.user + times.system
    return total


def read_phase_log(path: Path, wanted: set[tuple[str, str, int]]) -> dict[tuple[str, str, int], dict[str, Any]]:
    """The server's phase records by (op, request id, instance id), waiting briefly for those not yet resolved."""
    deadline = time.monotonic() + 15.0
    records: dict[tuple[str, str, int], dict[str, Any]] = {}
    while True:
        records.clear()
        if path.exists():
            for line in path.read_text(encoding="utf-8").splitlines():
                with contextlib.suppress(json.JSONDecodeError):
                    record = json.loads(line)
                    records[(record["op"], record["request_id"], int(record["instance_id"]))] = record
        if wanted <= records.keys() or time.monotonic() > deadline:
            return records
        time.sleep(0.2)


# ---- the engine stand-in (needs torch and lmcache) -----------------------------------------------------------


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


# ---- ipc: one worker, the chunks-per-request curve --------------------------------------------------------------


def sweep_request(worker: Worker, case: Case, chunks: int, layout: str, seq: int) -> dict[str, Any]:
    """Store a fresh request, look it up until visible, retrieve it into poisoned blocks; times and the comparison."""
    request = f"{case.label}-{layout}-{chunks}-{seq}"
    tokens = request_tokens(request, chunks * case.chunk_size)
    worker.fill(request, chunks, layout)
    store_id = f"store-{request}"
    stored = worker.store(store_id, tokens, chunks, layout)
    worker.client.end_session(store_id).result(timeout=RPC_TIMEOUT_SECONDS)
    hit, visible_s, lookup_id, attempts = lookup_until_visible(
        worker.client, case, worker.role, tokens, chunks, f"retrieve-{request}"
    )
    retrieved = worker.retrieve(lookup_id, tokens, chunks, layout)  # releases the read locks of this lookup's session
    worker.client.end_session(lookup_id).result(timeout=RPC_TIMEOUT_SECONDS)
    return {
        "chunks": chunks,
        "layout": layout,
        "seq": seq,
        "store_id": store_id,
        "lookup_id": lookup_id,
        "hit_chunks": hit,
        "visible_after_s": visible_s,
        "lookup_attempts": attempts,
        "store": stored,
        "retrieve": retrieved,
    }


def summarize_point(case: Case, chunks: int, layout: str, rounds: list[dict[str, Any]], warmup: int) -> dict[str, Any]:
    """One (case, chunks, layout) point: medians of the timed requests' phases, bytes, GB/s, correctness."""
    timed = rounds[warmup:]
    stored_planned, restored_planned = request_bytes(case, chunks, layout)
    point: dict[str, Any] = {
        "chunks": chunks,
        "layout": layout,
        "bytes_stored_planned": stored_planned,
        "bytes_restored_planned": restored_planned,
        "all_hit": all(r["hit_chunks"] == chunks for r in rounds),
        "all_equal": all(r["retrieve"]["all_equal"] for r in rounds),
        "null_block_untouched": all(r["retrieve"]["null_block_untouched"] for r in rounds),
        "visible_after_s": statistics.median(r["visible_after_s"] for r in timed),
    }
    matches = []
    for op, planned in (("store", stored_planned), ("retrieve", restored_planned)):
        phases = [r[op]["phases"] for r in timed]
        point[op] = {k: median_of(phases, k) for k in phases[0] if k != "server_bytes"}
        # The bytes the server really copied (the memory objects it handed to its copies), per request.
        server_bytes = sorted({int(p.get("server_bytes", -1)) for p in phases})
        point[op]["server_bytes"] = server_bytes
        matches.append(server_bytes == [planned])
        point[op]["gbps"] = gbps(server_bytes[0], point[op]["total_s"]) if len(server_bytes) == 1 else None
    point["bytes_match_plan"] = all(matches)
    return point


def run_case(torch: Any, case: Case, settings: Settings, out_dir: Path) -> dict[str, Any]:
    """One server, one registered worker, every (chunks, layout) point of the case; correctness, phases and GB/s."""
    device = torch.device("cuda", 0) if settings.device == "cuda" else torch.device("cpu")
    label = f"lmcache-server-{case.label.replace('@', '-')}"
    result: dict[str, Any] = {"case": case.label, "bytes_per_token": case.bytes_per_token, "server_log": f"{label}.log"}
    rounds: dict[tuple[int, str], list[dict[str, Any]]] = {}
    l1 = settings.l1_for(case)
    with running_servers(case, settings.device, l1, 1, out_dir, label, settings.server_args) as servers:
        worker = Worker(torch, case, SINGLE_ROLE, settings.max_chunks(case), device, servers[0].url)
        try:
            result["group_infos"] = [repr(info) for info in worker.group_infos]
            result["windows"] = worker.windows
            for chunks, layout in settings.points(case):
                rounds[(chunks, layout)] = [
                    sweep_request(worker, case, chunks, layout, seq) for seq in range(settings.requests)
                ]
        finally:
            worker.close()
        phase_log = servers[0].phase_log
    wanted = {
        (op, r[f"{op}_id" if op == "store" else "lookup_id"], INSTANCE_ID)
        for rs in rounds.values()
        for r in rs
        for op in ("store", "retrieve")
    }
    records = read_phase_log(phase_log, wanted)
    for rs in rounds.values():
        for r in rs:
            for op, rid in (("store", r["store_id"]), ("retrieve", r["lookup_id"])):
                r[op]["phases"] = join_phases(
                    r[op]["submit_ns"], r[op]["reply_ns"], records.get((op, rid, INSTANCE_ID))
                )
    result["points"] = [summarize_point(case, c, layout, rs, settings.warmup) for (c, layout), rs in rounds.items()]
    result["rounds"] = [r for rs in rounds.values() for r in rs]
    return result


def pinned_memcpy(torch: Any, sizes: Sequence[int], reps: int) -> list[dict[str, float]]:
    """Pinned host <-> device `cudaMemcpyAsync` (Tensor.copy_, non_blocking) of each size, timed with CUDA events
    (slices of one buffer of the largest size)."""
    device = torch.device("cuda", 0)
    largest = max(sizes)
    host = torch.empty(largest, dtype=torch.uint8, pin_memory=True)
    host.random_(0, 256)
    gpu = torch.empty(largest, dtype=torch.uint8, device=device)
    results = []
    for nbytes in sizes:
        timings: dict[str, list[float]] = {"d2h": [], "h2d": []}
        for _ in range(reps + 2):  # two warm-ups
            for direction in ("h2d", "d2h"):
                start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                start.record()
                if direction == "h2d":
                    gpu[:nbytes].copy_(host[:nbytes], non_blocking=True)
                else:
                    host[:nbytes].copy_(gpu[:nbytes], non_blocking=True)
                end.record()
                end.synchronize()
                timings[direction].append(start.elapsed_time(end) / 1e3)
        if not torch.equal(host[:4096], gpu[:4096].cpu()):
            raise ProofError("pinned memcpy round trip changed the bytes")
        results.append(
            {
                "bytes": nbytes,
                "d2h_gbps": gbps(nbytes, statistics.median(timings["d2h"][2:])),
                "h2d_gbps": gbps(nbytes, statistics.median(timings["h2d"][2:])),
            }
        )
    return results


def run_ipc(settings: Settings, out_dir: Path) -> dict[str, Any]:
    import torch

    if settings.device == "cuda" and not torch.cuda.is_available():
        raise ProofError("expected a CUDA GPU for --device cuda but torch sees none; use --device cpu to rehearse")
    report: dict[str, Any] = {"settings": {**asdict(settings), "cases": [c.name for c in settings.cases]}, "cases": []}
    for case in settings.cases:
        try:
            report["cases"].append(run_case(torch, case, settings, out_dir))
        except Exception as exc:  # one broken case must not hide the others' results
            report["cases"].append({"case": case.label, "error": f"{type(exc).__name__}: {exc}"})
        write_report(report, out_dir, "ipc.json", ipc_table(report))  # what is done survives a cut-off run
    if settings.device == "cuda":
        sizes = sorted(
            {
                b
                for case in settings.cases
                for c, layout in settings.points(case)
                for b in request_bytes(case, c, layout)
            }
        )
        report["pinned_memcpy"] = pinned_memcpy(torch, sizes, settings.reps)
    return report


def ms(value: float | None) -> str:
    return "-" if value is None else f"{value * 1e3:.2f}"


def ratio(value: float | None, limit: float | None) -> str:
    return "-" if value is None or not limit else f"{value / limit:.0%}"


def ipc_table(report: dict[str, Any]) -> list[str]:
    """The short tables printed last: per case and chunk count GB/s each way (ratio to a pinned memcpy of the same
    size), then each way's phases (medians, ms)."""
    copies = {c["bytes"]: c for c in report.get("pinned_memcpy", [])}
    lines = [
        "case              chunks ids       MiB st/rt     hit bytes-ok null-ok  store GB/s (of D2H)  "
        "retrieve GB/s (of H2D)  visible ms"
    ]
    phase_lines = [
        "phases, ms (median)     ids       op        total  transport  pre-copy    copy  post-copy   reply  "
        "in+reply  GB/s"
    ]
    for case in report["cases"]:
        if "error" in case:
            lines.append(f"{case['case']:<17} ERROR {case['error'][:150]}")
            continue
        for point in case["points"]:
            st, rt = point["store"], point["retrieve"]
            d2h = copies.get(point["bytes_stored_planned"], {}).get("d2h_gbps")
            h2d = copies.get(point["bytes_restored_planned"], {}).get("h2d_gbps")
            moved = f"{point['bytes_stored_planned'] / 2**20:.1f}/{point['bytes_restored_planned'] / 2**20:.1f}"
            ok = point["all_equal"] and point["bytes_match_plan"]
            lines.append(
                f"{case['case']:<17} {point['chunks']:>6} {point['layout']:<8} {moved:>13}  "
                f"{'yes' if point['all_hit'] else 'NO':<3} {'yes' if ok else 'NO':<8} "
                f"{'yes' if point['null_block_untouched'] else 'NO':<7}  "
                f"{st['gbps'] or 0:>10.2f} ({ratio(st['gbps'], d2h):>4})  "
                f"{rt['gbps'] or 0:>13.2f} ({ratio(rt['gbps'], h2d):>4})  {ms(point['visible_after_s']):>10}"
            )
            for op, row in (("store", st), ("retrieve", rt)):
                phase_lines.append(
                    f"{case['case'] + ' x' + str(point['chunks']):<23} {point['layout']:<8}  {op:<8} "
                    f"{ms(row['total_s']):>7} {ms(row.get('transport_in_s')):>10} {ms(row.get('pre_copy_s')):>9} "
                    f"{ms(row.get('copy_s')):>7} {ms(row.get('post_copy_s')):>10} {ms(row.get('reply_s')):>7} "
                    f"{ms(row.get('client_transport_s')):>9} {row['gbps'] or 0:>5.1f}"
                )
    for copy in report.get("pinned_memcpy", []):
        lines.append(
            f"pinned cudaMemcpy {copy['bytes'] / 2**20:>8.1f} MiB: D2H {copy['d2h_gbps']:.2f} GB/s, "
            f"H2D {copy['h2d_gbps']:.2f} GB/s"
        )
    return lines + phase_lines


# ---- tp: N ranks on one GPU ---------------------------------------------------------------------------------------


def tp_worker_main(spec: dict[str, Any], commands: Any, results: Any, barrier: Any) -> None:
    """One TP rank in its own process: register, then run the coordinator's commands, each released together with
    the other ranks by `barrier`. Every message back is (kind, rank, payload)."""
    rank = int(spec["role"]["rank"])
    try:
        import torch

        case = parse_case(spec["case"])
        role = Role(**spec["role"])
        device = torch.device("cuda", 0) if spec["device"] == "cuda" else torch.device("cpu")
        worker = Worker(torch, case, role, spec["chunks"], device, spec["url"])
        nbytes = max(request_bytes(case, spec["chunks"]))
        host = gpu = None
        if device.type == "cuda":
            host = torch.empty(nbytes, dtype=torch.uint8, pin_memory=True)
            host.random_(0, 256)
            gpu = torch.empty(nbytes, dtype=torch.uint8, device=device)
        results.put(("ready", rank, {"pid": os.getpid(), "windows": worker.windows}))
        while True:
            command = commands.get()
            kind = command[0]
            if kind == "stop":
                break
            out: dict[str, Any]
            if kind == "store":
                _, request, chunks = command
                worker.fill(request, chunks, "align")
                tokens = request_tokens(request, chunks * case.chunk_size)
                barrier.wait(timeout=RPC_TIMEOUT_SECONDS)
                out = worker.store(f"store-{request}", tokens, chunks, "align") if role.writer else {"skipped": True}
            elif kind == "retrieve":
                _, request, chunks, lookup_ids = command
                tokens = request_tokens(request, chunks * case.chunk_size)
                barrier.wait(timeout=RPC_TIMEOUT_SECONDS)
                out = worker.retrieve(lookup_ids[role.server], tokens, chunks, "align")
            elif kind in ("d2h", "h2d") and host is not None and gpu is not None:
                barrier.wait(timeout=RPC_TIMEOUT_SECONDS)
                started = now_ns()
                if kind == "d2h":
                    host.copy_(gpu, non_blocking=True)
                else:
                    gpu.copy_(host, non_blocking=True)
                torch.cuda.synchronize(device)
                out = {"submit_ns": started, "reply_ns": now_ns(), "bytes": nbytes}
            else:
                raise ProofError(f"unknown command {kind!r}")
            results.put(("done", rank, out))
        worker.close()
    except BaseException as exc:
        results.put(("error", rank, f"{type(exc).__name__}: {exc}"))
        with contextlib.suppress(Exception):
            barrier.abort()


def gather(results: Any, procs: Sequence[Any], count: int, timeout: float) -> dict[int, dict[str, Any]]:
    """`count` replies from the ranks, by rank; a rank's error or death fails the run in one line."""
    import queue

    replies: dict[int, dict[str, Any]] = {}
    deadline = time.monotonic() + timeout
    while len(replies) < count:
        try:
            kind, rank, payload = results.get(timeout=1.0)
        except queue.Empty:
            dead = [i for i, p in enumerate(procs) if not p.is_alive()]
            if dead or time.monotonic() > deadline:
                raise ProofError(
                    f"ranks {dead} exited without a reply" if dead else f"no reply from the ranks within {timeout:g}s"
                ) from None
            continue
        if kind == "error":
            raise ProofError(f"rank {rank}: {payload}")
        replies[rank] = payload
    return replies


def run_tp_case(case: Case, ranks: int, layout: str, tp: TpSettings, out_dir: Path) -> dict[str, Any]:
    """`ranks` worker processes on one GPU with the pod's server (or one per rank): `requests` rounds of one store per
    writing rank, the scheduler's lookup on every server, one retrieve per rank; then N concurrent pinned copies."""
    import multiprocessing

    roles = tp_roles(case, ranks, layout)
    n_servers = max(r.server for r in roles) + 1
    if sum(r.writer for r in roles) != tp.writers(case, ranks, layout):
        raise ProofError(
            f"LMCache makes {sum(r.writer for r in roles)} of {ranks} ranks writers but the plan sized L1 for "
            f"{tp.writers(case, ranks, layout)}; update TpSettings.writers"
        )
    label = f"tp-{case.label.replace('@', '-')}-x{ranks}-{layout}"
    result: dict[str, Any] = {
        "case": case.label,
        "ranks": ranks,
        "layout": layout,
        "servers": n_servers,
        "single_gpu": tp.device == "cuda",
        "roles": [asdict(r) for r in roles],
        "chunks": tp.chunks,
    }
    ctx = multiprocessing.get_context("spawn")
    barrier = ctx.Barrier(ranks + 1)
    results = ctx.Queue()
    commands = [ctx.Queue() for _ in roles]
    started = time.monotonic()
    l1 = tp.l1_per_server_gb(case, ranks, layout)
    with running_servers(case, tp.device, l1, n_servers, out_dir, label, tp.server_args) as servers:
        result["server_start_s"] = time.monotonic() - started
        procs = [
            ctx.Process(
                target=tp_worker_main,
                args=(
                    {
                        "case": case.name,
                        "role": asdict(r),
                        "device": tp.device,
                        "chunks": tp.chunks,
                        "url": servers[r.server].url,
                    },
                    commands[r.rank],
                    results,
                    barrier,
                ),
                daemon=True,
            )
            for r in roles
        ]
        for p in procs:
            p.start()
        import zmq
        from lmcache.v1.multiprocess.transport.factory import RequestClientFactory

        zmq_context = zmq.Context()
        clients = [RequestClientFactory.create(s.url, context=zmq_context) for s in servers]
        # The scheduler's view of each server: the first rank that talks to it (all of a server's ranks agree).
        server_roles = [next(r for r in roles if r.server == s) for s in range(n_servers)]
        try:
            ready = gather(results, procs, ranks, WORKER_START_SECONDS)
            result["workers_ready_s"] = time.monotonic() - started
            result["windows"] = ready[0]["windows"]

            def phase(command: tuple[Any, ...]) -> dict[int, dict[str, Any]]:
                for q in commands:
                    q.put(command)
                barrier.wait(timeout=RPC_TIMEOUT_SECONDS * 2)
                return gather(results, procs, ranks, RPC_TIMEOUT_SECONDS * 2)

            rounds: list[dict[str, Any]] = []
            cpu_start = wall_start = 0.0
            for seq in range(tp.requests):
                if seq == tp.warmup:
                    cpu_start, wall_start = server_cpu_seconds([s.pid for s in servers]), time.monotonic()
                request = f"tp-{case.label}-x{ranks}-{layout}-{seq}"
                tokens = request_tokens(request, tp.chunks * case.chunk_size)
                stores = phase(("store", request, tp.chunks))
                for client in clients:
                    client.end_session(f"store-{request}").result(timeout=RPC_TIMEOUT_SECONDS)
                lookups = [
                    lookup_until_visible(clients[s], case, server_roles[s], tokens, tp.chunks, f"retrieve-{request}")
                    for s in range(n_servers)
                ]
                retrieves = phase(("retrieve", request, tp.chunks, [lk[2] for lk in lookups]))
                for client, lk in zip(clients, lookups, strict=True):
                    client.end_session(lk[2]).result(timeout=RPC_TIMEOUT_SECONDS)
                rounds.append(
                    {
                        "seq": seq,
                        "request": request,
                        "hit_chunks": [lk[0] for lk in lookups],
                        "visible_after_s": max(lk[1] for lk in lookups),
                        "lookup_ids": [lk[2] for lk in lookups],
                        "stores": stores,
                        "retrieves": retrieves,
                    }
                )
            wall = time.monotonic() - wall_start
            cpu = server_cpu_seconds([s.pid for s in servers]) - cpu_start
            copies: list[dict[str, Any]] = []
            if tp.device == "cuda":
                for _ in range(tp.reps):
                    copies.append({"d2h": phase(("d2h",)), "h2d": phase(("h2d",))})
            for q in commands:
                q.put(("stop",))
            for p in procs:
                p.join(timeout=60)
        finally:
            for p in procs:
                if p.is_alive():
                    p.terminate()
            for client in clients:
                client.close()
            zmq_context.term()
        phase_logs = [s.phase_log for s in servers]
    records: dict[tuple[str, str, int], dict[str, Any]] = {}
    wanted: list[set[tuple[str, str, int]]] = [set() for _ in phase_logs]  # per server: its ranks' operations
    for r in rounds:
        for rank, out in r["stores"].items():
            if not out.get("skipped"):
                wanted[roles[rank].server].add(("store", f"store-{r['request']}", INSTANCE_ID + rank))
        for rank in r["retrieves"]:
            server = roles[rank].server
            wanted[server].add(("retrieve", r["lookup_ids"][server], INSTANCE_ID + rank))
    for path, server_wanted in zip(phase_logs, wanted, strict=True):
        records.update(read_phase_log(path, server_wanted))
    result.update(summarize_tp(case, roles, rounds, records, copies, tp, cpu, wall))
    result["rounds"] = rounds
    return result


def summarize_tp(
    case: Case,
    roles: Sequence[Role],
    rounds: Sequence[dict[str, Any]],
    records: Mapping[tuple[str, str, int], Mapping[str, Any]],
    copies: Sequence[Mapping[str, Mapping[int, Mapping[str, Any]]]],
    tp: TpSettings,
    cpu_s: float,
    wall_s: float,
) -> dict[str, Any]:
    """Aggregate GB/s per round (median over timed rounds), latency percentiles over every rank's operations, the
    servers' CPU use, the server-side phases, correctness."""
    stored, restored = request_bytes(case, tp.chunks)
    timed = rounds[tp.warmup :]
    summary: dict[str, Any] = {
        "writers": sum(r.writer for r in roles),
        "bytes_stored_per_writer": stored,
        "bytes_restored_per_rank": restored,
        "all_hit": all(h == tp.chunks for r in rounds for h in r["hit_chunks"]),
        "all_equal": all(out["all_equal"] for r in rounds for out in r["retrieves"].values()),
        "null_block_untouched": all(out["null_block_untouched"] for r in rounds for out in r["retrieves"].values()),
        "server_cpu_cores": cpu_s / wall_s if wall_s > 0 else None,
        "server_cpu_s_per_round": cpu_s / len(timed) if timed else None,
        "visible_after_s": statistics.median(r["visible_after_s"] for r in timed),
    }
    for op, planned in (("store", stored), ("retrieve", restored)):
        per_round, latencies, per_rank_gbps, pre_copy, copy = [], [], [], [], []
        server_bytes: set[int] = set()
        for r in timed:
            outs = {rank: out for rank, out in r[f"{op}s"].items() if not out.get("skipped")}
            per_round.append(aggregate_gbps([(o["submit_ns"], o["reply_ns"], planned) for o in outs.values()]))
            for rank, out in outs.items():
                seconds = (out["reply_ns"] - out["submit_ns"]) / 1e9
                latencies.append(seconds)
                per_rank_gbps.append(gbps(planned, seconds))
                rid = f"store-{r['request']}" if op == "store" else r["lookup_ids"][roles[rank].server]
                record = records.get((op, rid, INSTANCE_ID + rank))
                if record is not None:
                    phases = join_phases(out["submit_ns"], out["reply_ns"], record)
                    server_bytes.add(int(phases["server_bytes"]))
                    if phases["pre_copy_s"] is not None:
                        pre_copy.append(phases["pre_copy_s"])
                    if phases["copy_s"] is not None:
                        copy.append(phases["copy_s"])
        summary[op] = {
            "aggregate_gbps": statistics.median(per_round) if per_round else None,
            "per_rank_gbps_median": statistics.median(per_rank_gbps) if per_rank_gbps else None,
            "latency_p50_s": percentile(latencies, 50) if latencies else None,
            "latency_p99_s": percentile(latencies, 99) if latencies else None,
            "latency_max_s": max(latencies) if latencies else None,
            "samples": len(latencies),
            "server_pre_copy_p50_s": percentile(pre_copy, 50) if pre_copy else None,
            "server_pre_copy_p99_s": percentile(pre_copy, 99) if pre_copy else None,
            "server_copy_p50_s": percentile(copy, 50) if copy else None,
            "server_bytes": sorted(server_bytes),
            "bytes_match_plan": server_bytes == {planned},
        }
    for direction in ("d2h", "h2d"):
        per_round = [
            aggregate_gbps([(o["submit_ns"], o["reply_ns"], o["bytes"]) for o in c[direction].values()]) for c in copies
        ]
        summary[f"pinned_{direction}_aggregate_gbps"] = statistics.median(per_round) if per_round else None
    return summary


def run_tp(tp: TpSettings, out_dir: Path) -> dict[str, Any]:
    import torch

    if tp.device == "cuda" and not torch.cuda.is_available():
        raise ProofError("expected a CUDA GPU for --device cuda but torch sees none; use --device cpu to rehearse")
    report: dict[str, Any] = {
        "settings": {**asdict(tp), "cases": [c.name for c in tp.cases]},
        "device_name": torch.cuda.get_device_name(0) if tp.device == "cuda" else "cpu",
        "runs": [],
    }
    for case in tp.cases:
        for ranks in tp.ranks:
            for layout in tp.layouts:
                try:
                    report["runs"].append(run_tp_case(case, ranks, layout, tp, out_dir))
                except Exception as exc:  # one broken run must not hide the others' results
                    error = f"{type(exc).__name__}: {exc}"
                    report["runs"].append({"case": case.label, "ranks": ranks, "layout": layout, "error": error})
                write_report(report, out_dir, "tp.json", tp_table(report))  # what is done survives a cut-off run
    return report


def tp_table(report: dict[str, Any]) -> list[str]:
    """Per TP run: aggregate GB/s each way beside the N concurrent pinned copies, latencies, server CPU."""
    lines = [
        "tp (single-GPU)        N layout   srv wr  ok    store agg GB/s (of N D2H)  p50/p99 ms     "
        "retrieve agg GB/s (of N H2D)  p50/p99 ms     per-rank rt GB/s  srv cores  pre-copy p50/p99 ms st|rt"
    ]
    for run in report["runs"]:
        head = f"{run['case']:<21} {run['ranks']:>2} {run['layout']:<8}"
        if "error" in run:
            lines.append(f"{head} ERROR {run['error'][:150]}")
            continue
        st, rt = run["store"], run["retrieve"]
        d2h, h2d = run["pinned_d2h_aggregate_gbps"], run["pinned_h2d_aggregate_gbps"]
        ok = run["all_hit"] and run["all_equal"] and run["null_block_untouched"]
        ok = ok and st["bytes_match_plan"] and rt["bytes_match_plan"]
        lines.append(
            f"{head} {run['servers']:>3} {run['writers']:>2}  {'yes' if ok else 'NO':<4}"
            f"  {st['aggregate_gbps'] or 0:>10.2f} ({ratio(st['aggregate_gbps'], d2h):>4} of {d2h or 0:.1f})"
            f"  {ms(st['latency_p50_s'])}/{ms(st['latency_p99_s']):<7}"
            f"  {rt['aggregate_gbps'] or 0:>13.2f} ({ratio(rt['aggregate_gbps'], h2d):>4} of {h2d or 0:.1f})"
            f"  {ms(rt['latency_p50_s'])}/{ms(rt['latency_p99_s']):<7}"
            f"  {rt['per_rank_gbps_median'] or 0:>16.2f}  {run['server_cpu_cores'] or 0:>9.2f}"
            f"  {ms(st['server_pre_copy_p50_s'])}/{ms(st['server_pre_copy_p99_s'])}"
            f" | {ms(rt['server_pre_copy_p50_s'])}/{ms(rt['server_pre_copy_p99_s'])}"
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


def add_ipc_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("--case", action="append", dest="cases", metavar="PROFILE@CHUNK[:COUNTS]", help="repeatable")
    p.add_argument("--chunks", default=",".join(str(c) for c in DEFAULT_CHUNKS), help="chunks per request, a list")
    p.add_argument("--reps", type=int, default=5, help="timed requests per point (default 5)")
    p.add_argument("--l1-size-gb", type=float, help="each server's L1 (default: what the run stores, plus a quarter)")
    p.add_argument("--all-real-at", type=int, default=8, help="also the old all-real block ids at N chunks (0: off)")


def add_tp_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("--tp-case", action="append", dest="tp_cases", metavar="PROFILE@CHUNK", help="repeatable")
    p.add_argument("--ranks", default="4,8", help="TP sizes to run, a list (default 4,8)")
    p.add_argument("--layouts", default="one", help="server layouts: one (the pod's server), per-rank; a list")
    p.add_argument("--tp-chunks", type=int, default=8, help="chunks per request (default 8)")
    p.add_argument("--tp-reps", type=int, default=10, help="timed rounds (default 10)")


def parse_args(argv: Sequence[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog=PROG, description=(__doc__ or "").splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    for name in ("plan", "ipc", "tp"):
        p = sub.add_parser(name)
        if name in ("plan", "ipc"):
            add_ipc_options(p)
        if name in ("plan", "tp"):
            add_tp_options(p)
        p.add_argument("--warmup", type=int, default=1, help="untimed requests (rounds) first (default 1)")
        p.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
        p.add_argument("--out", type=Path, help="directory for the JSON report and the server logs")
        p.add_argument(
            "--server-arg",
            action="append",
            dest="server_args",
            metavar="FLAG",
            help="a server flag beyond the chart's, for experiments (repeatable; --server-arg=--max-gpu-workers=8)",
        )
    k = sub.add_parser("kernels")
    k.add_argument("--reps", type=int, default=10)
    k.add_argument("--out", type=Path)
    return parser.parse_args(list(argv))


def settings_from(args: argparse.Namespace) -> Settings:
    settings = Settings(
        cases=tuple(parse_case(c) for c in (args.cases or DEFAULT_CASES)),
        chunks=parse_counts(args.chunks, "--chunks"),
        reps=args.reps,
        warmup=args.warmup,
        l1_size_gb=args.l1_size_gb,
        device=args.device,
        all_real_at=args.all_real_at,
        server_args=tuple(args.server_args or ()),
    )
    check_settings(settings)
    return settings


def tp_settings_from(args: argparse.Namespace) -> TpSettings:
    tp = TpSettings(
        cases=tuple(replace(parse_case(c), chunk_counts=None) for c in (args.tp_cases or DEFAULT_TP_CASES)),
        ranks=parse_counts(args.ranks, "--ranks"),
        layouts=tuple(x.strip() for x in args.layouts.split(",")),
        chunks=args.tp_chunks,
        reps=args.tp_reps,
        warmup=args.warmup,
        device=args.device,
        server_args=tuple(args.server_args or ()),
    )
    check_tp_settings(tp)
    return tp


def write_report(report: dict[str, Any], out: Path, name: str, table: list[str]) -> str:
    """`name` (the JSON report) and the same name with .txt (the tables) in `out`; returns the JSON text."""
    text = json.dumps(report, indent=2, sort_keys=True, default=str)
    out.mkdir(parents=True, exist_ok=True)
    (out / name).write_text(text + "\n", encoding="utf-8")
    (out / name).with_suffix(".txt").write_text("\n".join(table) + "\n", encoding="utf-8")
    return text


def emit(report: dict[str, Any], out: Path | None, name: str, table: list[str]) -> None:
    text = (
        json.dumps(report, indent=2, sort_keys=True, default=str)
        if out is None
        else write_report(report, out, name, table)
    )
    print(text)
    print("\n".join(table))


def main(argv: Sequence[str]) -> int:
    if argv and argv[0] == "lmcache-server":  # the server's own process: its arguments are lmcache's
        return lmcache_server_main(argv[1:])
    args = parse_args(argv)
    try:
        if args.command == "plan":
            print("\n".join(plan_lines(settings_from(args), tp_settings_from(args))))
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
        out = args.out or Path.cwd()
        out.mkdir(parents=True, exist_ok=True)
        if args.command == "tp":
            tp_report = run_tp(tp_settings_from(args), out)
            emit(tp_report, out, "tp.json", tp_table(tp_report))
            good = [
                "error" not in r
                and r["all_hit"]
                and r["all_equal"]
                and r["null_block_untouched"]
                and r["store"]["bytes_match_plan"]
                and r["retrieve"]["bytes_match_plan"]
                for r in tp_report["runs"]
            ]
            return 0 if all(good) else 1
        settings = settings_from(args)
        report = run_ipc(settings, out)
        emit(report, out, "ipc.json", ipc_table(report))
        ok = all(
            "error" not in c
            and all(
                p["all_hit"] and p["all_equal"] and p["null_block_untouched"] and p["bytes_match_plan"]
                for p in c["points"]
            )
            for c in report["cases"]
        )
        return 0 if ok else 1
    except (ProofError, Glm53Error) as exc:  # Glm53Error: the sidecar server failed to start
        print(f"{PROG}: error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
