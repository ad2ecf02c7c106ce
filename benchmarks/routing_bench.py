"""Benchmark: how many prompt tokens a 3-replica fleet serves from cache under each vllm-router policy.

Why: with `router.enabled=true` the chart puts the vLLM project's router in front of N engine pods, each with its own
vLLM prefix cache and its own LMCache server. A request only reuses a prefix when it lands on the pod that saw it, so
the policy decides whether the caches pay off. The target: cache-aware routing serves at least 1.5x the hit tokens of
round-robin on a multi-tenant workload.

What is measured (CPU fleet on loopback: `glm53.fleet`, real vllm-router 0.1.17, every replica a `glm53 pod`):
1. the workload: --documents long shared documents (--doc-chunks LMCache chunks each), --questions questions each,
   interleaved in an order fixed by --seed; each request is document + question, 1 output token, streamed;
2. each replica's local prefix cache holds about --local-docs documents (the stand-in's --num-gpu-blocks-override)
   and its LMCache L1 about --l1-docs (sized from one document's footprint, measured on a throwaway replica), as a
   GPU's KV cache and a host's DRAM hold only part of a multi-tenant working set;
3. once per policy, in one run, over the same replicas: round_robin, cache_aware, and with --kv-aware kv_aware (the
   engines then publish vLLM KV events on wildcard ports; without the flag the run says why it is skipped). Before
   each policy every replica's caches are reset (local and LMCache, dev mode) and the requests carry a per-policy
   cache_salt, so each policy starts cold;
4. per policy: prompt tokens served from cache (usage.prompt_tokens_details.cached_tokens, i.e. local prefix cache plus
   LMCache; split by vLLM's prefix-cache counters of every replica), mean TTFT, requests per replica, and how close the
   hits get to the physical limit: every repeated document prefix served from cache;
5. a dead replica: one replica's engine is stopped, the workload runs again through the cache-aware router, and the
   run prints how many requests succeeded and which workers the router still lists healthy (its /health checks).
The last line is `hit tokens, cache-aware vs round-robin: R x`.

Run: ``.venv/bin/python benchmarks/routing_bench.py [--replicas 3] [--documents 6] [--questions 8] [--seed 13]``.
"""

from __future__ import annotations

import argparse
import dataclasses
import random
import statistics
import sys
import tempfile
import time
import urllib.request
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from glm53.errors import Glm53Error
from glm53.fleet import FleetSpec, RunningFleet, replica_url, running_replicas, running_router, scheduler_block_size
from glm53.loopback import RunningPod, quiet
from glm53.pod import PodAddresses
from glm53.profiles import PROFILES, get_profile
from glm53.validate.client import VllmClient
from glm53.validate.metrics import parse_exposition

BASELINE, CACHE_AWARE, KV_AWARE = "round_robin", "cache_aware", "kv_aware"
LOCAL_HITS, EXTERNAL_HITS = "vllm:prefix_cache_hits_total", "vllm:external_prefix_cache_hits_total"
L1_BYTES = "lmcache_mp_l1_memory_usage_bytes"


@dataclasses.dataclass(frozen=True)
class Request:
    document: int
    question: int
    prompt: str
    shared_tokens: int  # the document's tokens: the prefix a repeat of this document may reuse


def workload(documents: int, questions: int, doc_tokens: int, seed: int) -> list[Request]:
    """Documents of `doc_tokens` words (the mocks' tokenizer: one token per word), questions interleaved at random."""
    rng = random.Random(seed)
    texts = [" ".join(f"d{d}w{rng.randrange(10**6)}" for _ in range(doc_tokens)) for d in range(documents)]
    order = [(d, q) for d in range(documents) for q in range(questions)]
    rng.shuffle(order)
    return [
        Request(d, q, f"{texts[d]} question {q} about document {d} : what does it say ?", doc_tokens) for d, q in order
    ]


def physical_limit(requests: Sequence[Request]) -> int:
    """Hit tokens if every repeated document prefix came from cache: all but each document's first request."""
    seen: set[int] = set()
    total = 0
    for request in requests:
        if request.document in seen:
            total += request.shared_tokens
        seen.add(request.document)
    return total


@dataclasses.dataclass(frozen=True)
class PolicyResult:
    policy: str
    hit_tokens: int
    local_hits: int
    external_hits: int
    mean_ttft_ms: float
    per_replica: tuple[int, ...]
    failed: int


def _counters(pods: Sequence[RunningPod]) -> list[tuple[float, float, float]]:
    """(local hits, external hits, prompt tokens) per replica; a dead replica reads as zeros."""
    rows = []
    for pod in pods:
        try:
            m = VllmClient(PodAddresses.of(pod.plan).vllm, 5.0).metrics()
            rows.append((m.get(LOCAL_HITS, 0.0), m.get(EXTERNAL_HITS, 0.0), m.get("vllm:prompt_tokens_total", 0.0)))
        except Glm53Error:
            rows.append((0.0, 0.0, 0.0))
    return rows


def reset_caches(pods: Sequence[RunningPod]) -> None:
    for pod in pods:
        VllmClient(PodAddresses.of(pod.plan).vllm, 10.0).reset_prefix_cache(reset_external=True)


def drive(fleet: RunningFleet, requests: Sequence[Request], salt: str, model: str, clients: int) -> PolicyResult:
    """Send the requests in their order from `clients` concurrent clients (the router sees in-flight load)."""
    client = VllmClient(fleet.url, 60.0)
    before = _counters(fleet.pods)

    def one(request: Request) -> tuple[int, float] | None:
        try:
            done = client.complete(model, request.prompt, max_tokens=1, cache_salt=salt, stream=True)
        except Glm53Error:
            return None
        return done.cached_tokens or 0, done.ttft_seconds

    with ThreadPoolExecutor(clients) as pool:
        outcomes = list(pool.map(one, requests))
    after = _counters(fleet.pods)
    served = [o for o in outcomes if o is not None]
    local = sum(a[0] - b[0] for a, b in zip(after, before, strict=True))
    external = sum(a[1] - b[1] for a, b in zip(after, before, strict=True))
    prompts = tuple(round(a[2] - b[2]) for a, b in zip(after, before, strict=True))
    mean_ttft = 1000 * statistics.fmean(t for _, t in served) if served else float("nan")
    hits = sum(h for h, _ in served)
    return PolicyResult(
        fleet.policy, hits, round(local), round(external), mean_ttft, prompts, len(requests) - len(served)
    )


def l1_bytes_per_document(spec: FleetSpec, document: str, model: str) -> float:
    """What one document occupies in an LMCache server's L1, measured on a throwaway replica (real server, stand-in)."""
    with running_replicas(dataclasses.replace(spec, replicas=1, workdir=spec.workdir / "calibration"), quiet) as pods:
        VllmClient(PodAddresses.of(pods[0].plan).vllm, 60.0).complete(
            model, document, max_tokens=1, cache_salt="calibration"
        )
        with urllib.request.urlopen(f"{PodAddresses.of(pods[0].plan).lmcache}/metrics", timeout=10.0) as response:
            metrics = parse_exposition(response.read().decode())
    return float(metrics.get(L1_BYTES, 0.0))


def report(result: PolicyResult, limit: int, doc_tokens: int, say: Callable[[str], None]) -> None:
    share = 100.0 * result.hit_tokens / limit if limit else 0.0
    say(
        f"{result.policy:>12}: hit tokens {result.hit_tokens} ({share:.1f}% of the limit {limit}; local prefix cache "
        f"{result.local_hits} + LMCache {result.external_hits}), mean TTFT {result.mean_ttft_ms:.1f} ms, "
        f"requests per replica {[round(t / doc_tokens) for t in result.per_replica]}, failed {result.failed}"
    )


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--replicas", type=int, default=3)
    parser.add_argument("--documents", type=int, default=6)
    parser.add_argument("--questions", type=int, default=8)
    parser.add_argument("--doc-chunks", type=int, default=3, help="document length in LMCache chunks")
    parser.add_argument("--local-docs", type=float, default=2.5, help="documents one replica's local cache holds")
    parser.add_argument("--l1-docs", type=float, default=2.5, help="documents one replica's LMCache L1 holds")
    parser.add_argument("--clients", type=int, default=4, help="concurrent clients")
    parser.add_argument("--seed", type=int, default=13)
    parser.add_argument(
        "--kv-aware",
        action="store_true",
        help="also run kv_aware: the engines publish KV events on tcp://*:PORT (vLLM binds only wildcard endpoints)",
    )
    parser.add_argument("--profile", default="glm53-flash", choices=list(PROFILES))
    parser.add_argument("--workdir", type=Path)
    args = parser.parse_args(argv)
    say = print
    profile = get_profile(args.profile)
    doc_tokens = args.doc_chunks * profile.recommended_chunk_size
    block = scheduler_block_size(profile)
    local_blocks = max(1, round(args.local_docs * (doc_tokens + 32) / block))
    requests = workload(args.documents, args.questions, doc_tokens, args.seed)
    limit = physical_limit(requests)
    kv_events = args.kv_aware
    policies = [BASELINE, CACHE_AWARE, *([KV_AWARE] if kv_events else [])]
    workdir = args.workdir or Path(tempfile.mkdtemp(prefix="glm53-routing-bench-"))
    spec = FleetSpec(profile, args.replicas, CACHE_AWARE, workdir, local_cache_blocks=local_blocks, kv_events=kv_events)
    per_document = l1_bytes_per_document(spec, requests[0].prompt, profile.model_id)
    l1_bytes = args.l1_docs * per_document
    spec = dataclasses.replace(spec, lmcache_l1_gb=l1_bytes / 2**30)
    say(
        f"workload: {args.documents} documents x {args.questions} questions = {len(requests)} requests, "
        f"{doc_tokens}-token documents, seed {args.seed}, {args.clients} concurrent clients; {args.replicas} replicas "
        f"of {profile.display_name}, local prefix cache {local_blocks} blocks of {block} tokens (~{args.local_docs:g} "
        f"documents) each, LMCache L1 {l1_bytes / 1e6:.2f} MB (~{args.l1_docs:g} documents of "
        f"{per_document / 1e3:.0f} kB, measured) each"
    )
    if not kv_events:
        say(f"{KV_AWARE}: skipped (pass --kv-aware: vLLM's KV-event publisher binds tcp://*:PORT, every interface)")
    results: dict[str, PolicyResult] = {}
    with running_replicas(spec, quiet) as pods:
        for policy in policies:
            reset_caches(pods)
            with running_router(spec, pods, policy, quiet) as fleet:
                results[policy] = drive(fleet, requests, f"bench-{policy}", profile.model_id, args.clients)
            report(results[policy], limit, doc_tokens, say)
        reset_caches(pods)
        victim = pods[-1]
        with running_router(spec, pods, CACHE_AWARE, quiet) as fleet:
            victim.process("vllm").stop(victim.plan.grace_period_s)
            killed = time.monotonic()
            dead = drive(fleet, requests, "bench-dead-replica", profile.model_id, args.clients)
            while replica_url(victim) in fleet.healthy() and time.monotonic() - killed < 30:
                time.sleep(0.1)
            out_after = time.monotonic() - killed
            healthy = fleet.healthy()
        say(
            f"dead replica ({replica_url(victim)} stopped): {len(requests) - dead.failed}/{len(requests)} requests "
            f"succeeded through {CACHE_AWARE}; the router lists {len(healthy)} of {len(pods)} workers healthy "
            f"{out_after:.1f} s after the kill"
        )
    ratio = results[CACHE_AWARE].hit_tokens / max(1, results[BASELINE].hit_tokens)
    say(f"hit tokens, cache-aware vs round-robin: {ratio:.2f} x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
