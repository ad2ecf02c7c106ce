"""`ipc`: one worker against one real server per case, every (chunks per request, block-id layout) point: phases,
bytes and GB/s of each store and retrieve, then pinned `cudaMemcpy` of the same sizes."""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from dataclasses import asdict
from pathlib import Path
from typing import Any

from . import ProofError
from .engine import INSTANCE_ID, RPC_TIMEOUT_SECONDS, SINGLE_ROLE, Worker, lookup_until_visible
from .geometry import Case, request_bytes
from .plan import Settings
from .report import ipc_table, write_report
from .server import read_phase_log, running_servers
from .stats import gbps, join_phases, median_of, request_tokens


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
    with running_servers(case, settings.device, l1, 1, out_dir, label, settings.server_args, settings.l2) as servers:
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
