"""`tp`: N TP-rank processes sharing one GPU against the pod's server (or one server per rank), each storing and
retrieving one request per round at once; aggregate GB/s beside N concurrent pinned copies, latencies, server CPU."""

from __future__ import annotations

import contextlib
import os
import statistics
import time
from collections.abc import Mapping, Sequence
from dataclasses import asdict
from pathlib import Path
from typing import Any

from . import ProofError
from .engine import INSTANCE_ID, RPC_TIMEOUT_SECONDS, Role, Worker, lookup_until_visible, tp_roles
from .geometry import Case, parse_case, request_bytes
from .plan import TpSettings
from .report import tp_table, write_report
from .server import read_phase_log, running_servers, server_cpu_seconds
from .stats import aggregate_gbps, gbps, join_phases, now_ns, percentile, request_tokens

WORKER_START_SECONDS = 300.0


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
    with running_servers(case, tp.device, l1, n_servers, out_dir, label, tp.server_args, tp.l2) as servers:
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
