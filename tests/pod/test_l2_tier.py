"""The L2 tier on the chart's CPU pod (`lmcache.l2`), with real storage behind the real `lmcache server`.

The default fs tier: `glm53 validate --reload-from l2` checks cold-versus-cached equivalence on KV that went through
the tier (LMCache's L1 emptied before each reload). The shared tier (`type=resp`) on a real Redis (Debian's
redis-server 7.0.15, loopback, a password): what one replica stored, another finds; two `cache_salt` tenants never hit
each other's entries; Redis killed under load fails no request and the pod serves on from L1; what a Redis that
comes back gets; and a Redis at its memory bound, evicting or refusing writes.

The pods are the chart's, rendered with the tier and its default auth (the password reaches the server as
LMCACHE_RESP_PASSWORD from the Secret), run on loopback with the engine stand-in: the tier is the server's business,
so the cheap engine is enough; the real engine's fault table covers the fs tier through a sidecar kill
(tests/pod/faults).
"""

from __future__ import annotations

import contextlib
import dataclasses
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from glm53.exporter.upstream import parse_exposition
from glm53.pod.contract import SIDECAR_CONTAINER
from glm53.pod.faults.load import Load, LoadShape, StoredDocument
from glm53.pod.faults.suite import load_on
from glm53.pod.loopback import RunningPod, container_env, relocate, relocation_for
from glm53.pod.main_job import PodAddresses, PodOptions, PodPlans, render_plans, started_pod
from glm53.profiles import get_profile
from glm53.testing.redis_server import RedisServer, redis_server
from glm53.validate.prompts import document_qa_prompt
from glm53.validate.runner import DEFAULT_RUNS

pytestmark = [pytest.mark.timeout(600)]

FLASH = get_profile("glm53-flash")
CHUNKS = 3
# How long the tier may take to hold a stored document's chunks (LMCache writes L2 after committing L1).
STORED_WITHIN_S = 20.0
REDIS_DOWN_AT_START_S = 10.0
# The Redis kill under load: seconds of load before it, of the outage, and after Redis is back.
BEFORE_KILL_S = 6.0
REDIS_DOWN_S = 10.0
AFTER_RESTART_S = 10.0
# The validation prompt's whole chunks at GLM-5.3-Flash's 1152 (the seed's 8507 tokens).
FLASH_PROMPT_CHUNKS = 8507 // 1152


def quiet(_: str) -> None:
    pass


def plans_for(redis: RedisServer) -> PodPlans:
    return render_plans(PodOptions(FLASH, validation=False, values=redis.pod_values(), secrets=redis.secrets()))


def load(pod: RunningPod, clients: int = 2) -> Load:
    chunk = int(pod.plan.container(SIDECAR_CONTAINER).option("--chunk-size"))
    return load_on(pod.plan, LoadShape(clients=clients, document_tokens=CHUNKS * chunk), FLASH.strict_prefix, 60.0)


@contextmanager
def pods(plans: PodPlans, workdir: Path, count: int) -> Iterator[list[RunningPod]]:
    with contextlib.ExitStack() as stack:
        yield [stack.enter_context(started_pod(plans, workdir / f"pod-{i}", quiet)) for i in range(count)]


def wait_for_keys(redis: RedisServer, at_least: int) -> int:
    deadline = time.monotonic() + STORED_WITHIN_S
    while (keys := redis.key_count()) < at_least and time.monotonic() < deadline:
        time.sleep(0.2)
    return keys


def test_a_replica_hits_what_another_stored_and_tenants_never_share(tmp_path: Path) -> None:
    with redis_server(tmp_path / "redis") as redis, pods(plans_for(redis), tmp_path, 2) as (first, second):
        on_first, on_second = load(first), load(second)
        prompt = document_qa_prompt(on_first.shape.document_tokens, seed=7).text
        document = StoredDocument(prompt, "tenant-a", 0.0)
        (cold,) = on_first.revisit([document])
        assert cold.result == "ok" and cold.hit_tokens == 0
        assert wait_for_keys(redis, CHUNKS) >= CHUNKS

        (shared,) = on_second.revisit([document])
        assert shared.result == "ok" and shared.hit_tokens == shared.expected_tokens > 0, shared
        (stranger,) = on_second.revisit([dataclasses.replace(document, salt="tenant-b")])
        assert stranger.result == "ok" and stranger.hit_tokens == 0, stranger


def test_redis_killed_under_load_fails_nothing_and_the_pod_serves_on(tmp_path: Path) -> None:
    """Redis SIGKILLed under load: no request fails or hangs, the sidecar does not restart, and L1 serves on. Redis
    back on the same port: LMCache 0.5.6's client does not reconnect (connector_base.h:539-542, glm53.l2gate), so
    nothing reaches the tier until the sidecar restarts (docs/runbook.md, Glm53LMCacheL2Failing)."""
    with redis_server(tmp_path / "redis") as redis, pods(plans_for(redis), tmp_path, 1) as (pod,):
        traffic = load(pod)
        traffic.start()
        time.sleep(BEFORE_KILL_S)
        killed = traffic.now()
        redis.kill()
        time.sleep(REDIS_DOWN_S)
        restarted = traffic.now()
        redis.start()
        time.sleep(AFTER_RESTART_S)
        outcomes = traffic.stop()
        sidecar_alive = pod.process(SIDECAR_CONTAINER).process.poll() is None
        keys_after = redis.key_count()

    during = [o for o in outcomes if killed <= o.started_s < restarted]
    assert during and all(o.result == "ok" for o in outcomes), [o for o in outcomes if o.result != "ok"]
    assert sidecar_alive
    # L1 serves on while the tier is gone: reloads of documents stored during the outage hit whole.
    reloads = [o for o in during if o.kind == "reload" and (o.stored_at_s or 0.0) > killed]
    assert reloads and all(o.hit_tokens == o.expected_tokens for o in reloads), reloads
    stored_after = [o for o in outcomes if o.kind == "store" and o.started_s > restarted]
    assert stored_after and keys_after == 0, (
        f"{keys_after} keys reached the restarted Redis: LMCache's client reconnects now; update docs/operations.md "
        "(The L2 tier) and the runbook's Glm53LMCacheL2Failing fix"
    )


def test_a_sidecar_started_while_redis_is_down_waits_for_it_then_serves_and_stores(tmp_path: Path) -> None:
    """LMCache 0.5.6's Redis client connects once, at the server's start (glm53.l2gate): started without its Redis,
    the server's lookups never complete and the pod never becomes Ready (measured before the chart's wait). With the
    supervisor's `--wait-for-resp`, the server starts once Redis is back, and the pod serves and stores."""
    with redis_server(tmp_path / "redis") as redis:
        redis.kill()
        back = threading.Timer(REDIS_DOWN_AT_START_S, redis.start)
        back.start()
        try:
            with pods(plans_for(redis), tmp_path, 1) as (pod,):
                traffic = load(pod)
                prompt = document_qa_prompt(traffic.shape.document_tokens, seed=11).text
                (stored,) = traffic.revisit([StoredDocument(prompt, "after-wait", 0.0)])
                keys = wait_for_keys(redis, CHUNKS)
        finally:
            back.join()
    log = (tmp_path / "pod-0" / "logs" / "lmcache.log").read_text(errors="replace")
    assert "waiting for the L2 tier" in log and "answers; starting the server" in log
    assert stored.result == "ok" and keys >= CHUNKS


def test_a_refused_password_ends_the_sidecar_with_one_line(tmp_path: Path) -> None:
    with redis_server(tmp_path / "redis") as redis:
        plans = render_plans(PodOptions(FLASH, validation=False, values=redis.pod_values()))  # a random password
        sidecar = relocate(plans.serving, relocation_for(plans.serving, tmp_path)).container(SIDECAR_CONTAINER)
        (tmp_path / "logs").mkdir()
        done = subprocess.run(sidecar.argv, env=container_env(sidecar), capture_output=True, text=True, timeout=60)
    assert done.returncode == 1
    assert (
        done.stderr.strip()
        .splitlines()[-1]
        .startswith(
            f"glm53 supervise: error: the L2 tier at 127.0.0.1:{redis.port} refuses the server's credentials (WRONGPASS"
        )
    ), done.stderr


def test_validation_reloads_from_the_fs_tier_and_finds_them_equivalent(tmp_path: Path) -> None:
    plans = render_plans(PodOptions(FLASH, validation=True))
    with pods(plans, tmp_path, 1) as (pod,):
        lmcache = PodAddresses.of(pod.plan).lmcache
        command = [sys.executable, "-m", "glm53", "validate", "--base-url", PodAddresses.of(pod.plan).vllm]
        command += ["--checks", "equivalence", "--runs", str(DEFAULT_RUNS), "--reload-from", "l2"]
        command += ["--lmcache-metrics", f"{lmcache}/metrics"]
        done = subprocess.run(command, capture_output=True, text=True, timeout=300, check=False)
        loaded = parse_exposition(urllib.request.urlopen(f"{lmcache}/metrics", timeout=5).read().decode())
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    # Every reload came from the tier: the server loaded the prompt's chunks back from L2 once per reload.
    chunks = FLASH_PROMPT_CHUNKS
    assert (loaded.total("lmcache_mp_l2_prefetch_load_completed_chunks_total") or 0) >= DEFAULT_RUNS * chunks


# A Redis bounded far below what the load stores, and how long the load goes on once it is full.
FULL_REDIS = "4mb"
FILL_WITHIN_S = 90.0
PAST_FULL_S = 10.0


@pytest.mark.parametrize("policy", ["allkeys-lru", "noeviction"])
def test_at_its_memory_bound_redis_evicts_or_refuses_and_no_request_fails(tmp_path: Path, policy: str) -> None:
    """What the chart's docs recommend, `allkeys-lru`: at `maxmemory` Redis evicts the least recently used chunks and
    every store succeeds. Redis's default, `noeviction`: every write past the bound is refused (OOM), which the server
    logs as failed store tasks (the exporter's glm53_lmcache_l2_store_failures_total, the L2 alert's store branch).
    Either way no request fails or hangs: the engine serves on from L1."""
    redis_bounded = redis_server(tmp_path / "redis", maxmemory=FULL_REDIS, policy=policy)
    with redis_bounded as redis, pods(plans_for(redis), tmp_path, 1) as (pod,):
        traffic = load(pod)
        traffic.start()
        deadline = time.monotonic() + FILL_WITHIN_S
        while time.monotonic() < deadline and not full(redis.info("stats")):
            time.sleep(0.5)
        filled = full(redis.info("stats"))
        time.sleep(PAST_FULL_S)
        outcomes = traffic.stop()
        memory, stats, keys = redis.info("memory"), redis.info("stats"), redis.key_count()
    failed_stores = (tmp_path / "pod-0" / "logs" / "lmcache.log").read_text(errors="replace").count("failed for keys")
    figures = (
        f"{policy}: {len(outcomes)} requests, {keys} keys held, used_memory {memory['used_memory']} of "
        f"{memory['maxmemory']}, evicted_keys {stats['evicted_keys']}, error replies {stats['total_error_replies']}, "
        f"failed store tasks {failed_stores}"
    )
    print(figures)
    assert filled, figures
    assert outcomes and all(o.result == "ok" for o in outcomes), figures
    if policy == "allkeys-lru":
        assert int(stats["evicted_keys"]) > 0 and failed_stores == 0, figures
    else:
        assert int(stats["evicted_keys"]) == 0 and failed_stores > 0, figures


def full(stats: dict[str, str]) -> bool:
    """Whether Redis reached its bound: it evicted a key or refused a write (an error reply; AUTH never fails here)."""
    return int(stats["evicted_keys"]) > 0 or int(stats["total_error_replies"]) > 0
