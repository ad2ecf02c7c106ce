"""The measuring arithmetic (pure): GB/s, percentiles, aggregate rates, one request's phases split at the server's
timestamps, and the clock and token ids every process agrees on."""

from __future__ import annotations

import math
import random
import statistics
import time
import zlib
from collections.abc import Mapping, Sequence
from typing import Any

from . import ProofError


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
