"""Benchmark: what LMCache's fs L2 tier costs the engine's hot path (lookup and retrieve), against no tier.

Why: the chart's default sidecar runs `lmcache server ... --l2-adapter '{"base_path":DIR,"type":"fs"}'`. On an H200
the tier made the server's lookup prefetch 0.8 -> 12.7 ms (p90 47 ms) and retrieves 3-13 % slower, also for prompts
L1 held in full. The code says why (lmcache 0.5.6):
- a lookup always goes through the prefetch controller's thread when any L2 adapter is attached: only `skip_l2` or no
  adapter serves it on the calling thread (lmcache/v1/distributed/storage_controllers/prefetch_controller.py:588-593),
  and the lookup handler never passes `skip_l2` (lmcache/v1/multiprocess/modules/lookup.py:302-305);
- that thread read-locks the L1 hits and then submits every key of the prompt to every L2 adapter, L1 hits included
  (prefetch_controller.py:1033-1052, "we submit the full keys to L2 adapters"), and the result is published only
  after every adapter answered (:899-915, :1149-1193);
- the fs adapter answers on its own asyncio loop, one `aiofiles.os.path.exists` per key, awaited one after another
  (lmcache/v1/distributed/l2_adapters/fs_l2_adapter.py:680-693), each a hop to the loop's default thread pool
  (aiofiles 25.1.0 aiofiles/base.py:7-15), on the same loop that runs the tier's writes (:600-676).
No server flag skips that L2 lookup for an L1 hit: `--l2-prefetch-policy` only plans which tier serves a chunk and
whether L2 loads stay in L1 (lmcache/v1/distributed/storage_controllers/prefetch_policy.py:194-327),
`--l2-prefetch-max-in-flight` only caps the requests in flight (prefetch_controller.py:1005-1018), and
`--l2-store-policy skip_l1` only deletes stored chunks from L1 (store_policy.py:152-178), sending more lookups to L2.

What is measured (the real server, CPU only, on loopback): the chart's sidecar command for GLM-5.3-Flash (C = 1152,
rendered by the chart, `glm53.pod`), per configuration of --configs:
  off          no `--l2-adapter` (lmcache.l2.type=off)
  fs           the chart's default: the fs tier in a fresh directory, `--l2-prefetch-policy retain` (chunks loaded from
               L2 stay in L1; lmcache.l2.prefetchPolicy)
  fs+default   the same with upstream's `--l2-prefetch-policy default` (L2 loads are temporary L1 objects)
  fs+inflight  fs plus `--l2-prefetch-max-in-flight 32` (default 8: more lookups than that wait their turn)
  fs_native    the same directory served by LMCache's C++ fs connector (`"type":"fs_native"`, same file names: one
               batched existence check on its worker threads, native_connector_l2_adapter.py:303-318)
driven by LMCache's own bench client (`lmcache bench server`'s ServerBenchClient, CPU mode, lmcache-driven transfers,
one MLA-style worker as GLM's). All configurations' servers run at once and every step below is taken on each of them
in turn, so that load from elsewhere on the machine drifts over all of them alike; after each STORE the run waits until
that server's tier wrote it (its own counter), so no configuration's disk writes overlap another's measurements. The
phases, over --prompts prompts of --chunks chunks each:
  store         a cold lookup (a miss) and a STORE of each prompt (the `store` rows: the round trip; the tier writes
                afterwards, asynchronously)
  L1 hit        --rounds rounds of LOOKUP + RETRIEVE of each prompt, all served by L1, the tier idle
  L1 burst      3 LOOKUPs of each prompt sent at once (18 at the defaults, as a scheduler step submits a batch of
                new requests), then polled round after round with QUERY_PREFETCH_STATUS as the scheduler polls once
                a step; a lookup's time runs from the burst's start
  L1 hit+write  per prompt: STORE a new prompt, then at once LOOKUP + RETRIEVE an L1-resident one, while the tier
                writes the new one (what a serving engine does: prefills store while other requests look up)
  restart, L2   every server restarted on its own directory (a sidecar restart; L1 empty): LOOKUP + RETRIEVE of each
                prompt, which the tier serves (for `off`: misses, no retrieve)
  again         the same prompts once more (default policy: from L2 again, its loads are temporary; retain: from L1)
A lookup's latency is LOOKUP's reply plus the prefetch: one QUERY_PREFETCH_STATUS right after the reply (what the
engine's scheduler sends, once per step: lmcache/integration/vllm/vllm_multi_process_adapter.py:958-1030, non-blocking
by default, :128) and, when that says "not yet", a WAIT_PREFETCH_STATUS until done (lookup.py:350-382), so the figure
is when the result existed, not a poll interval (the bench tool's own lookup sleeps 50 ms between polls:
lmcache/cli/commands/bench/server_bench/helpers.py:321-341). `1st poll` is the share of lookups done at the first
status query (burst: in the first polling round): in vLLM a lookup not done then costs its request at least one more
scheduler step. Retrieve and store are the client's round trips (ServerBenchClient.retrieve/store).
Printed: per configuration and phase, median and p90 (nearest rank) and the ratio of medians to `off`; the server's
own counters over the L1-hit phase (L2 prefetch lookups submitted, the chunks they checked, the keys L1 and L2
served). One run, no assertion. On two CPU cores the client, the servers and their threads share the cores, so absolute
figures are this machine's; the ratios, taken on the same workload step by step, are what carries over, roughly.

Run: ``.venv/bin/python benchmarks/l2_bench.py [--configs off,fs,fs+default,fs+inflight,fs_native] [--prompts 6]
[--chunks 32] [--rounds 2] [--workdir DIR]`` (about 3 minutes on 2 cores at the defaults).
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import math
import statistics
import sys
import tempfile
import time
import urllib.request
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

from lmcache.cli.commands.bench.server_bench import helpers as bench_helpers
from lmcache.cli.commands.bench.server_bench.client import RequestContext, ServerBenchClient
from lmcache.cli.commands.bench.server_bench.config import BenchConfig

from glm53.errors import Glm53Error
from glm53.pod.loopback import LOCALHOST
from glm53.testing.chart_sidecar import StandaloneSidecar, chart_sidecar
from glm53.testing.sidecar import serving
from glm53.validate.metrics import parse_exposition

PROFILE = "glm53-flash"
# The chunk size the chart renders for PROFILE (`--chunk-size`); checked against the rendered argv.
CHUNK_TOKENS = 1152
# The server runs with the chart's environment (its usage-report opt-outs included) and no banner in its log (lmcache
# 0.5.6 lmcache/banner.py:28,62).
NO_BANNER = {"LMCACHE_DISABLE_BANNER": "1"}
START_SECONDS = 120.0
DRAIN_SECONDS = 60.0
RPC_SECONDS = 10.0
# One MLA-style KV group (kv_size 1, as GLM's) of 64-token blocks; `layers` sets a chunk's bytes: 1152 tokens x 64
# elements x 2 bytes x layers (8 layers: 1.125 MiB a chunk).
BLOCK_TOKENS = 64
HEAD_SIZE = 64
CONFIGS = ("off", "fs", "fs+default", "fs+inflight", "fs_native")
# `--l2-prefetch-max-in-flight` for fs+inflight: above the burst's 18, so none of its lookups queues.
IN_FLIGHT = 32
PHASES = ("L1 hit", "L1 burst", "L1 hit+write", "restart, L2", "again")
# Lookups per prompt in the burst phase: 3 x 6 prompts = 18 at once, over the controller's default 8 in flight.
BURST_COPIES = 3


@dataclass
class Samples:
    """Latencies in ms of one operation in one phase, and how many lookups were done by their first status query."""

    ms: list[float] = field(default_factory=list)
    first_poll: list[bool] = field(default_factory=list)

    def median(self) -> float:
        return statistics.median(self.ms)

    def p90(self) -> float:
        ordered = sorted(self.ms)
        return ordered[max(1, math.ceil(0.9 * len(ordered))) - 1]


@dataclass
class ConfigResult:
    name: str
    store: Samples = field(default_factory=Samples)
    lookup: dict[str, Samples] = field(default_factory=dict)
    retrieve: dict[str, Samples] = field(default_factory=dict)
    hits: dict[str, tuple[int, int]] = field(default_factory=dict)  # phase -> (hit chunks, requested chunks)
    counters: dict[str, float] = field(default_factory=dict)  # the server's, over the L1-hit phase


def chart_server(workdir: Path, config: str) -> StandaloneSidecar:
    """The chart's `lmcache server` for PROFILE on fresh loopback ports, its L2 tier (if any) in workdir/lmcache-l2,
    with `config`'s change: the rendered `--l2-adapter` dropped with its prefetch policy (off), kept (fs), kept with
    upstream's default prefetch policy, or its type switched to fs_native (the rest of its JSON kept)."""
    sidecar = chart_sidecar(PROFILE, workdir)
    argv = list(sidecar.argv)
    if "--l2-adapter" not in argv:
        raise Glm53Error(
            f"the chart rendered no --l2-adapter for {PROFILE}; this benchmark compares its default fs tier"
        )
    chunk = argv[argv.index("--chunk-size") + 1]
    if chunk != str(CHUNK_TOKENS):
        raise Glm53Error(
            f"the chart renders --chunk-size {chunk} for {PROFILE}, this benchmark sizes its prompts for "
            f"{CHUNK_TOKENS}; update CHUNK_TOKENS"
        )
    at = argv.index("--l2-adapter")
    adapter = json.loads(argv[at + 1])
    if config == "off":
        # `--l2-adapter JSON --l2-prefetch-policy P`, as glm53.lmcacheServerArgs renders them.
        del argv[at : at + 4]
    elif config == "fs_native":
        argv[at + 1] = json.dumps({**adapter, "type": "fs_native"}, separators=(",", ":"))
    elif config == "fs+default":
        argv[argv.index("--l2-prefetch-policy") + 1] = "default"
    elif config == "fs+inflight":
        argv += ["--l2-prefetch-max-in-flight", str(IN_FLIGHT)]
    elif config != "fs":
        raise Glm53Error(f"unknown configuration {config!r}; expected one of {', '.join(CONFIGS)}")
    return dataclasses.replace(sidecar, argv=tuple(argv), env={**sidecar.env, **NO_BANNER})


class TimedClient(ServerBenchClient):  # type: ignore[misc]  # lmcache ships no types
    """LMCache's bench client with a lookup timed to the prefetch's completion instead of a 50 ms poll."""

    def timed_lookup(self, request: RequestContext) -> tuple[int, float, bool]:
        """(hit chunks, ms, done at the first status query) of one LOOKUP of the whole prompt, built as
        ServerBenchClient.lookup builds it (lmcache/cli/commands/bench/server_bench/client.py:236-296)."""
        client = self._require_started()
        key = bench_helpers._make_key(
            request.token_ids, request.request_id, start=0, end=request.num_full_tokens, world_size=self._kv_world_size
        )
        start = time.perf_counter()
        if not bench_helpers._send_lookup(client, key, tp_size=len(self._workers)):
            raise Glm53Error(f"LOOKUP of {request.request_id} got no reply in {RPC_SECONDS:g} s; see the server's log")
        hit = bench_helpers._wait_for_result(client.query_prefetch_status(request.request_id))
        first = hit is not None
        if hit is None:
            hit = bench_helpers._wait_for_result(client.wait_prefetch_status(request.request_id, RPC_SECONDS))
        elapsed = (time.perf_counter() - start) * 1000
        if hit is None or hit is bench_helpers._TIMEOUT:
            raise Glm53Error(f"the prefetch of {request.request_id} did not finish in {RPC_SECONDS:g} s")
        return int(hit), elapsed, first

    def burst(self, requests: Sequence[RequestContext]) -> list[tuple[int, float, int]]:
        """LOOKUP every request at once (as one scheduler step submits a batch of new requests), then poll each
        outstanding one with QUERY_PREFETCH_STATUS round after round, as the scheduler polls once a step. Per request:
        (hit chunks, ms from the burst's start to the reply with its result, polling rounds it took). Their read locks
        are released after (FREE_LOOKUP_LOCKS, lookup.py:384-459) and the sessions ended."""
        client = self._require_started()
        keys = {
            r.request_id: bench_helpers._make_key(
                r.token_ids, r.request_id, start=0, end=r.num_full_tokens, world_size=self._kv_world_size
            )
            for r in requests
        }
        start = time.perf_counter()
        acks = [client.lookup(key, len(self._workers)) for key in keys.values()]
        for ack in acks:
            if bench_helpers._wait_for_result(ack) is bench_helpers._TIMEOUT:
                raise Glm53Error(f"a LOOKUP of the burst got no reply in {RPC_SECONDS:g} s; see the server's log")
        outstanding, done, rounds = list(keys), {}, 0
        while outstanding:
            rounds += 1
            if time.perf_counter() - start > RPC_SECONDS:
                raise Glm53Error(f"{len(outstanding)} prefetches of the burst did not finish in {RPC_SECONDS:g} s")
            for request_id in list(outstanding):
                hit = bench_helpers._wait_for_result(client.query_prefetch_status(request_id))
                if hit is not None and hit is not bench_helpers._TIMEOUT:
                    done[request_id] = (int(hit), (time.perf_counter() - start) * 1000, rounds)
                    outstanding.remove(request_id)
        for request_id, key in keys.items():
            bench_helpers._wait_for_result(client.free_lookup_locks(key, len(self._workers)))
            bench_helpers._wait_for_result(client.end_session(request_id))
        return [done[request_id] for request_id in keys]


@contextmanager
def connected(server: StandaloneSidecar, args: argparse.Namespace) -> Iterator[TimedClient]:
    config = BenchConfig(
        rpc_url=f"tcp://{LOCALHOST}:{server.port}",
        http_url=server.http_url,
        mode="cpu",
        transfer_mode="lmcache_driven",
        tp_size=1,
        use_mla=True,
        num_tokens=args.chunks * CHUNK_TOKENS,
        kvcache_shape_spec=kv_shape(args),
        num_blocks=blocks(args),
        block_size=BLOCK_TOKENS,
    )
    client = TimedClient(config, log=lambda _line: None)
    client.start()
    try:
        yield client
    finally:
        client.close()


def blocks(args: argparse.Namespace) -> int:
    # Room for one prompt plus a margin; the bench client places each prompt at its own block offset.
    return int(args.chunks) * CHUNK_TOKENS // BLOCK_TOKENS + 64


def kv_shape(args: argparse.Namespace) -> str:
    return f"(1,{blocks(args)},{BLOCK_TOKENS},1,{HEAD_SIZE}):float16:{args.layers}"


def metrics(server: StandaloneSidecar) -> dict[str, float]:
    """The server's /metrics once its event bus is drained (counters are fed from it asynchronously)."""
    deadline = time.monotonic() + 15
    while True:
        with urllib.request.urlopen(f"{server.http_url}/metrics", timeout=5) as response:
            snapshot = dict(parse_exposition(response.read().decode()))
        if snapshot.get("lmcache_mp_event_bus_queue_depth", 0.0) == 0.0 or time.monotonic() > deadline:
            return snapshot
        time.sleep(0.05)


def wait_l2_holds(server: StandaloneSidecar, chunks: int) -> None:
    """Wait until the tier has completed writing at least `chunks` chunks (the server's own counter)."""
    deadline = time.monotonic() + DRAIN_SECONDS
    name = "lmcache_mp_l2_store_completed_objects_chunks_total"
    while (done := metrics(server).get(name, 0.0)) < chunks:
        if time.monotonic() > deadline:
            raise Glm53Error(f"L2 completed {done:.0f} of {chunks} chunk writes in {DRAIN_SECONDS:g} s; see its log")
        time.sleep(0.1)


def request(client: TimedClient, sequence: int, kind: str) -> RequestContext:
    made = client.create_request(
        sequence, request_id=f"l2bench-{sequence}-{kind}-{time.monotonic_ns()}", request_kind=kind
    )
    if made is None:
        raise Glm53Error(f"prompt {sequence} has no full chunk; raise --chunks")
    return made


def store(client: TimedClient, sequence: int, result: ConfigResult) -> int:
    """A cold request: the lookup (a miss, not recorded) and the STORE of the whole prompt; its chunks."""
    cold = request(client, sequence, "cold")
    client.timed_lookup(cold)
    stored = client.store(cold, start_token=0, token_count=cold.num_full_tokens)
    if stored is None or not stored.succeeded:
        raise Glm53Error(f"STORE of prompt {sequence} failed; see the server's log")
    result.store.ms.append(stored.latency_ms)
    client.end_session(cold)
    return int(cold.total_chunks)


def warm(client: TimedClient, sequence: int, phase: str, result: ConfigResult) -> None:
    """LOOKUP then, for what it found, RETRIEVE; recorded under `phase`."""
    hot = request(client, sequence, "warm")
    hit, ms, first = client.timed_lookup(hot)
    lookup = result.lookup.setdefault(phase, Samples())
    lookup.ms.append(ms)
    lookup.first_poll.append(first)
    found, asked = result.hits.get(phase, (0, 0))
    result.hits[phase] = (found + hit, asked + hot.total_chunks)
    if hit:
        got = client.retrieve(hot, start_token=0, token_count=hit * hot.chunk_size)
        if got is None or not got.succeeded:
            raise Glm53Error(f"RETRIEVE of prompt {sequence} ({phase}) failed; see the server's log")
        result.retrieve.setdefault(phase, Samples()).ms.append(got.latency_ms)
    client.end_session(hot)


def burst(client: TimedClient, prompts: Sequence[int], result: ConfigResult) -> None:
    """BURST_COPIES lookups of each L1-resident prompt at once: more than the prefetch controller's default 8 in
    flight (`--l2-prefetch-max-in-flight`, prefetch_controller.py:1005-1018 queues the rest)."""
    requests = [request(client, sequence, f"burst{copy}") for copy in range(BURST_COPIES) for sequence in prompts]
    lookup = result.lookup.setdefault("L1 burst", Samples())
    found, asked = result.hits.get("L1 burst", (0, 0))
    for made, (hit, ms, rounds) in zip(requests, client.burst(requests), strict=True):
        lookup.ms.append(ms)
        lookup.first_poll.append(rounds == 1)
        found, asked = found + hit, asked + made.total_chunks
    result.hits["L1 burst"] = (found, asked)


COUNTERS = (
    "lmcache_mp_l2_prefetch_lookup_requests_total",
    "lmcache_mp_l2_prefetch_lookup_objects_chunks_total",
    "lmcache_mp_lookup_hit_l1_keys_total",
    "lmcache_mp_lookup_hit_l2_keys_total",
)


@dataclass
class Subject:
    """One configuration's live server and client, its results, and the chunks its tier must hold by now."""

    result: ConfigResult
    server: StandaloneSidecar
    client: TimedClient
    stored_chunks: int = 0

    def store(self, sequence: int) -> None:
        """A cold STORE of prompt `sequence`; the tier's write of it follows asynchronously."""
        self.stored_chunks += store(self.client, sequence, self.result)

    def drain(self) -> None:
        """Wait until the tier wrote everything stored, so that no configuration's writes run while the next one is
        measured."""
        if self.result.name != "off":
            wait_l2_holds(self.server, self.stored_chunks)


def first_life(subjects: Sequence[Subject], args: argparse.Namespace) -> None:
    """store, L1 hit, L1 burst and L1 hit+write, every step taken on each configuration in turn."""
    prompts = range(args.prompts)
    for sequence in prompts:
        for subject in subjects:
            subject.store(sequence)
            subject.drain()
    before = [metrics(subject.server) for subject in subjects]
    for _ in range(args.rounds):
        for sequence in prompts:
            for subject in subjects:
                warm(subject.client, sequence, "L1 hit", subject.result)
    for subject, earlier in zip(subjects, before, strict=True):
        after = metrics(subject.server)
        subject.result.counters = {key: after.get(key, 0.0) - earlier.get(key, 0.0) for key in COUNTERS}
    for subject in subjects:
        burst(subject.client, prompts, subject.result)
    for new, sequence in zip(range(1000, 1000 + args.prompts), prompts, strict=True):
        for subject in subjects:
            subject.store(new)
            warm(subject.client, sequence, "L1 hit+write", subject.result)  # while the tier writes `new`
            subject.drain()


def second_life(subjects: Sequence[Subject], args: argparse.Namespace) -> None:
    """restart, L2 and again, after every server restarted on its own directory."""
    for phase in ("restart, L2", "again"):
        for sequence in range(args.prompts):
            for subject in subjects:
                warm(subject.client, sequence, phase, subject.result)


def run(configs: Sequence[str], args: argparse.Namespace, root: Path) -> list[ConfigResult]:
    """Every configuration's server at once (so that the machine's load drifts over all of them alike), twice: a
    first life, then a restart on the same directories and a second life."""
    results = [ConfigResult(name) for name in configs]
    for name in configs:
        (root / name.replace("+", "-")).mkdir(parents=True)
    for life, steps in ((1, first_life), (2, second_life)):
        started = time.monotonic()
        with contextlib.ExitStack() as stack:
            subjects = []
            for result in results:
                workdir = root / result.name.replace("+", "-")
                server = chart_server(workdir, result.name)  # fresh ports; the same L2 directory
                log = workdir / f"server-{life}.log"
                stack.enter_context(serving(server.argv, server.env, server.http_port, log, START_SECONDS))
                subjects.append(Subject(result, server, stack.enter_context(connected(server, args))))
            ready = time.monotonic()
            steps(subjects, args)
        print(f"life {life}: servers up in {ready - started:.0f} s, workload {time.monotonic() - ready:.0f} s")
    return results


def ratio(value: float, base: tuple[float, str] | None) -> str:
    return "-" if base is None else f"{value / base[0]:.2f}x{base[1]}"


def baseline(off: ConfigResult | None, phase: str, hits: tuple[int, int], kind: str) -> tuple[float, str] | None:
    """`off`'s median for the same phase when it hit as much; else (after a restart `off` has nothing) its L1-hit
    median, marked `*`: what serving the prompt from the tier costs against an L1 hit without one."""
    if off is None:
        return None
    samples = getattr(off, kind)
    if off.hits.get(phase) == hits and phase in samples:
        return samples[phase].median(), ""
    return (samples["L1 hit"].median(), "*") if "L1 hit" in samples else None


def table(results: Sequence[ConfigResult]) -> list[str]:
    off = next((r for r in results if r.name == "off"), None)
    head = (
        f"{'config':<11} {'phase':<13} {'hit':>9}  {'lookup p50':>10} {'p90':>7} {'1st poll':>8} {'vs off':>8}"
        f"  {'retrieve p50':>12} {'p90':>7} {'vs off':>8}"
    )
    lines = ["latencies in ms; `1st poll`: lookups whose prefetch was done at the first status query", head]
    lines.append("-" * len(head))
    for r in results:
        for phase in PHASES:
            lookup = r.lookup.get(phase)
            if lookup is None:
                continue
            hits = r.hits[phase]
            polled = 100 * sum(lookup.first_poll) / len(lookup.first_poll)
            line = (
                f"{r.name:<11} {phase:<13} {hits[0]:>4}/{hits[1]:<4}  {lookup.median():>10.2f} {lookup.p90():>7.2f}"
                f" {polled:>7.0f}% {ratio(lookup.median(), baseline(off, phase, hits, 'lookup')):>8}"
            )
            retrieve = r.retrieve.get(phase)
            if retrieve is not None:
                base = baseline(off, phase, hits, "retrieve")
                line += f"  {retrieve.median():>12.2f} {retrieve.p90():>7.2f} {ratio(retrieve.median(), base):>8}"
            else:
                line += "  (lookups only)" if hits[0] else "  (a miss: nothing to retrieve)"
            lines.append(line)
    lines.append("* against off's L1-hit row: off has nothing to serve after a restart")
    lines.append("")
    lines.append(f"{'config':<11} {'store p50':>10} {'p90':>7} {'vs off':>8}   server counters over the L1-hit phase")
    for r in results:
        base_store = (off.store.median(), "") if off else None
        c = r.counters
        lines.append(
            f"{r.name:<11} {r.store.median():>10.2f} {r.store.p90():>7.2f} {ratio(r.store.median(), base_store):>8}"
            f"   L2 prefetch lookups {c.get('lmcache_mp_l2_prefetch_lookup_requests_total', 0):.0f}"
            f" ({c.get('lmcache_mp_l2_prefetch_lookup_objects_chunks_total', 0):.0f} chunks checked),"
            f" hit keys L1 {c.get('lmcache_mp_lookup_hit_l1_keys_total', 0):.0f}"
            f" / L2 {c.get('lmcache_mp_lookup_hit_l2_keys_total', 0):.0f}"
        )
    return lines


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--configs", default=",".join(CONFIGS), help=f"comma-separated, of {', '.join(CONFIGS)}")
    parser.add_argument("--prompts", type=int, default=6, help="prompts per phase (default 6)")
    parser.add_argument(
        "--chunks", type=int, default=32, help=f"LMCache chunks ({CHUNK_TOKENS} tokens) per prompt (default 32)"
    )
    parser.add_argument("--layers", type=int, default=8, help="KV layers: a chunk is 144 KiB per layer (default 8)")
    parser.add_argument("--rounds", type=int, default=2, help="rounds of the L1-hit phase (default 2)")
    parser.add_argument("--workdir", type=Path, help="keep the servers' logs here (one new folder per configuration)")
    args = parser.parse_args()
    configs = [c.strip() for c in args.configs.split(",") if c.strip()]
    unknown = sorted(set(configs) - set(CONFIGS))
    if unknown:
        parser.error(f"unknown configurations {', '.join(unknown)}; expected some of {', '.join(CONFIGS)}")

    chunk_mib = CHUNK_TOKENS * HEAD_SIZE * 2 * args.layers / 2**20
    print(
        f"{PROFILE} sidecar as the chart renders it, C = {CHUNK_TOKENS}; {args.prompts} prompts x {args.chunks} "
        f"chunks of {chunk_mib:.3f} MiB ({args.prompts * args.chunks * chunk_mib:.0f} MiB a phase); "
        f"L1-hit phase x{args.rounds}"
    )
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="glm53-l2-bench-") as temp:
        results = run(configs, args, Path(temp) if args.workdir is None else args.workdir)
    print(f"all configurations in {time.monotonic() - started:.0f} s")
    print()
    for line in table(results):
        print(line)
    return 0


if __name__ == "__main__":
    sys.exit(main())
