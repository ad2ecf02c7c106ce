"""`kernels`: `lmcache.cuda_ops.multi_layer_block_kv_transfer` on the GPU for both models' paged layouts, checked
byte for byte against LMCache's own PyTorch implementation of the kernel and a plain gather, and timed."""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from . import ProofError
from .engine import POISON_BYTE, random_fill
from .geometry import DSA_LATENT_WIDTH, NOPE_LATENT_WIDTH
from .stats import gbps


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
