"""The CPU fleet: N pods behind the real vllm-router on loopback (`glm53 fleet`, `glm53.pod.fleet`).

The router's command line is checked with vllm-router's own parser; the fleet itself runs for real: validated through
the router, a replica killed and taken out by the router's /health checks while requests keep succeeding, the router
killed and restarted under load losing only what it held, and no process left behind after a run or an interrupt (the
marker fixture of test_pod checks /proc).
"""

from __future__ import annotations

import dataclasses
import http.client
import json
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

import pytest
from vllm_router.launch_router import parse_router_args

from glm53.errors import Glm53Error
from glm53.pod.fleet import (
    FleetSpec,
    healthy_workers,
    kill_engine,
    replica_url,
    router_command,
    running_fleet,
    scheduler_block_size,
    validate_fleet,
)
from glm53.pod.loopback import RunningPod, relocate, relocation_for
from glm53.pod.main_job import render_plans
from glm53.profiles import get_profile
from glm53.validate.client import VllmClient
from glm53.validate.progress import SilentProgress
from tests.pod.test_main_job import assert_no_process_left, interrupted, marker  # noqa: F401  (marker is a fixture)

FLASH = get_profile("glm53-flash")


def _pods(spec: FleetSpec) -> list[RunningPod]:
    """The fleet's replicas as planned (nothing started): engine i on port 8000 + i, its KV events on 5557 + i."""
    plan = render_plans(spec.pod_options()).serving
    pods = []
    for i in range(spec.replicas):
        placed = relocation_for(plan, spec.workdir / str(i))
        relocation = dataclasses.replace(placed, ports={**placed.ports, 8000: 8000 + i, 5557: 5557 + i})
        pods.append(RunningPod(relocate(plan, relocation), relocation, spec.workdir / str(i)))
    return pods


def test_the_real_router_parser_accepts_the_fleet_command_line(tmp_path: Path) -> None:
    spec = FleetSpec(FLASH, 3, "cache_aware", tmp_path)
    command = router_command("vllm-router", "cache_aware", 30001, 30002, _pods(spec), spec)
    assert command[0] == "vllm-router"
    parsed = parse_router_args(command[1:])
    parsed._validate_router_args()
    assert parsed.worker_urls == ["http://127.0.0.1:8000", "http://127.0.0.1:8001", "http://127.0.0.1:8002"]
    assert (parsed.policy, parsed.host, parsed.port, parsed.prometheus_port) == (
        "cache_aware",
        "127.0.0.1",
        30001,
        30002,
    )
    # vllm_router/router_args.py:99: the worker health check is GET /health; out after 2 misses, 1 s apart.
    assert parsed.health_check_endpoint == "/health"
    assert (parsed.health_check_interval_secs, parsed.health_failure_threshold) == (1, 2)
    assert parsed.kv_event_source == []


def test_kv_aware_binds_each_worker_to_its_event_publisher(tmp_path: Path) -> None:
    spec = FleetSpec(FLASH, 2, "kv_aware", tmp_path, kv_events=True)
    pods = _pods(spec)
    parsed = parse_router_args(router_command("vllm-router", "kv_aware", 1, 2, pods, spec)[1:])
    assert parsed.kv_event_source == [
        "http://127.0.0.1:8000=tcp://127.0.0.1:5557",
        "http://127.0.0.1:8001=tcp://127.0.0.1:5558",
    ]
    assert (parsed.kv_event_block_size, parsed.kv_event_model) == (1152, "zai-org/GLM-5.3-Flash")
    config = json.loads(pods[0].plan.container("vllm").option("--kv-events-config"))
    # vllm/config/kv_events.py:14-47: the fields vLLM 0.33 reads.
    assert config == {
        "enable_kv_cache_events": True,
        "publisher": "zmq",
        "endpoint": "tcp://*:5557",  # vLLM binds only wildcard endpoints (kv_events.py:461-467)
        "topic": "",  # vllm-router 0.1.17 static sources subscribe to "" exactly (src/kv_index/subscriber.rs:179-186)
    }


def test_every_replica_serves_the_render_routes_the_router_tokenizes_through(tmp_path: Path) -> None:
    # vllm 0.33.0 entrypoints/scale_out/factories.py:94-129: /v1/completions/render answers 403 without this flag, and
    # vllm-router then routes cache_aware and kv_aware requests on load alone.
    assert "--enable-scale-out" in _pods(FleetSpec(FLASH, 1, "cache_aware", tmp_path))[0].plan.container("vllm").argv


def test_block_size_of_the_events_is_the_engines_scheduler_block() -> None:
    assert scheduler_block_size(FLASH) == 1152  # unified block N at TP 4
    assert scheduler_block_size(get_profile("glm53")) == 64


def test_healthy_workers_reads_the_routers_workers_listing() -> None:
    # The shape vllm-router 0.1.17 answers on GET /workers (measured against the binary; see the fleet test below).
    listing = {
        "workers": [
            {"url": "http://127.0.0.1:1", "is_healthy": True},
            {"url": "http://127.0.0.1:2", "is_healthy": False},
        ],
        "total": 2,
    }
    assert healthy_workers(json.dumps(listing)) == ["http://127.0.0.1:1"]


@pytest.mark.parametrize(
    ("replicas", "policy", "events", "message"),
    [
        (0, "cache_aware", False, "--replicas must be at least 1, got 0"),
        (2, "least_loaded", False, "the router policy must be one of cache_aware, round_robin"),
        (2, "kv_aware", False, "the kv_aware policy needs engines that publish KV events"),
    ],
)
def test_bad_fleet_settings_are_one_line(
    replicas: int, policy: str, events: bool, message: str, tmp_path: Path
) -> None:
    with pytest.raises(Glm53Error, match=message):
        FleetSpec(FLASH, replicas, policy, tmp_path, kv_events=events)


def test_cli_refuses_zero_replicas_in_one_line() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "glm53", "fleet", "--replicas", "0"], capture_output=True, text=True, timeout=30
    )
    assert done.returncode == 2
    assert "--replicas: expected a whole number of at least 1, got '0'" in done.stderr
    assert "Traceback" not in done.stderr


@pytest.mark.slow
def test_fleet_validates_through_the_router_and_survives_a_dead_replica(tmp_path: Path, marker: str) -> None:  # noqa: F811
    spec = FleetSpec(FLASH, 2, "cache_aware", tmp_path)
    lines: list[str] = []
    with running_fleet(spec, lines.append) as fleet:
        assert sorted(fleet.healthy()) == sorted(replica_url(p) for p in fleet.pods)
        report = validate_fleet(fleet, SilentProgress())
        assert report.passed, report
        assert report.equivalence is not None and report.boundary is not None and report.perf is None
        victim = fleet.pods[1]
        victim.process("vllm").stop(1.0)
        # The router's GET /health checks (every 1 s, out after 2 misses) take the dead replica out. A request routed
        # to it before that gets a 500 from the router, which it retries (vllm-router 0.1.17 src/core/retry.rs:9-19;
        # the fleet's backoffs outlast the health check); a stream broken after its 200 is not retried.
        deadline = time.monotonic() + 15
        while replica_url(victim) in fleet.healthy() and time.monotonic() < deadline:
            time.sleep(0.2)
        assert fleet.healthy() == [replica_url(fleet.pods[0])]
        client = VllmClient(fleet.url, 30.0)
        for i in range(20):
            done = client.complete(FLASH.model_id, f"question {i} about nothing", max_tokens=1, cache_salt=f"s{i}")
            assert done.prompt_tokens == 4
    assert any(line.startswith("fleet: vllm-router (cache_aware) at http://127.0.0.1:") for line in lines)
    assert_no_process_left(marker)


@pytest.mark.slow
@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM])
def test_interrupted_fleet_leaves_no_process(signum: int, tmp_path: Path, marker: str) -> None:  # noqa: F811
    command = [sys.executable, "-m", "glm53", "fleet", "--replicas", "2", "--workdir", str(tmp_path)]
    # Wait until the router runs over both replicas: 2 x (sidecar, engine, exporter, supervisors...) and the router.
    stderr = interrupted(command, "fleet: vllm-router (cache_aware) at ", signum, marker, 7)
    assert "glm53 fleet: interrupted" in stderr.splitlines()
    assert "Traceback" not in stderr


class _Load:
    """Clients that keep sending short completions to the router until stopped, counting what became of each.

    A request whose connection is refused never reached a router (the port had no listener: the restart's gap, where a
    Service would have no ready endpoint), so the client tries it again; a request that was sent and then failed is
    lost. `in_flight` counts the requests whose connection a router holds and that are not yet answered. A connection
    counts from the moment it is established, under the lock the router's kill is made under: the kernel completes a
    loopback connect into the listener's accept queue, so a client that had connected but not yet counted itself when
    the router died was the router's too, and lost with it (a CI run lost 4 with 3 counted).
    """

    def __init__(self, port: int, clients: int) -> None:
        self.port = port
        self.lock = threading.Lock()
        self.stop = threading.Event()
        self.in_flight = self.answered = self.lost = self.refused = 0
        self.answered_after_restart = 0
        self.restarted = False
        self.threads = [threading.Thread(target=self._client, args=(i,), daemon=True) for i in range(clients)]

    def _client(self, index: int) -> None:
        body = json.dumps({"model": FLASH.model_id, "prompt": f"client {index} asks", "max_tokens": 1}).encode()
        while not self.stop.is_set():
            connection = http.client.HTTPConnection("127.0.0.1", self.port, timeout=30)
            with self.lock:
                try:
                    connection.connect()
                except ConnectionRefusedError:
                    self.refused += 1
                else:
                    self.in_flight += 1
            if connection.sock is None:
                time.sleep(0.05)
                continue
            try:
                connection.request("POST", "/v1/completions", body, {"Content-Type": "application/json"})
                response = connection.getresponse()
                response.read()
                ok = response.status == 200
            except (OSError, http.client.HTTPException):
                ok = False
            finally:
                connection.close()
            with self.lock:
                self.in_flight -= 1
                if ok:
                    self.answered += 1
                    self.answered_after_restart += self.restarted
                else:
                    self.lost += 1

    def wait_for(self, what: Callable[[], bool], deadline_s: float = 60.0) -> None:
        deadline = time.monotonic() + deadline_s
        while not what():
            assert time.monotonic() < deadline, "the load made no progress within a minute"
            time.sleep(0.05)


@pytest.mark.slow
def test_a_restarted_router_loses_only_the_requests_it_was_serving(tmp_path: Path, marker: str) -> None:  # noqa: F811
    spec = FleetSpec(FLASH, 2, "cache_aware", tmp_path)
    with running_fleet(spec, lambda line: None) as fleet:
        load = _Load(fleet.port, 4)
        for thread in load.threads:
            thread.start()
        try:
            load.wait_for(lambda: load.answered >= 10)
            with load.lock:  # nothing is sent or answered while the router dies: the count is exact
                serving = load.in_flight
                lost_before = load.lost
                fleet.restart_router()  # SIGKILL to the router's process group, then the same command again
                load.restarted = True
            load.wait_for(lambda: load.answered_after_restart >= 10)
        finally:
            load.stop.set()
            for thread in load.threads:
                thread.join(60)
        # Only what the killed router held (sent, not answered) may fail; nothing the new router accepted did.
        assert load.lost - lost_before <= serving, (load.lost, lost_before, serving)
        assert lost_before == 0
        # Readiness waits for a healthy engine: with every engine dead, the restarted router does not serve at all,
        # not even GET /readiness (the chart's readiness probe), because vllm-router 0.1.17 with static workers waits
        # for every worker's /health before it listens (src/routers/http/router.rs:971-1040, called from Router::new
        # at :364; it exits after --worker-startup-timeout-secs). Discovered workers (the chart) give 503 instead.
        for pod in fleet.pods:
            kill_engine(pod)
        fleet.restart_router()
        for _ in range(3):
            status, detail = fleet.readiness()
            assert status != 200, detail
            fleet.check_router()  # still waiting, not crashed
            time.sleep(0.5)
    assert_no_process_left(marker)
