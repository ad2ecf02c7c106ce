"""The container-level pod: the Docker runner of the one pod plan, the way a kubelet would run it.

The plan is the chart's own (`glm53.chart.render` of `charts/glm53` with `mock.enabled=true, validation.enabled=true`,
read by `glm53.podplan`, the same reader the loopback runner of `glm53 pod` uses): the `lmcache` native sidecar (the
real LMCache 0.5.6 server, `lmcache server`, from the image's `pod` extra) and the `vllm` container (the engine
stand-in, which talks to the server with LMCache's own client classes), each with its image, command, args, env, user,
read-only root, dropped capabilities, memory/CPU limits, volumes and exec probes, and the `helm test` pod's
`glm53 validate` command. This runner gives each container of the plan to Docker as it is: the sidecar owns the pod's
network namespace (loopback only, like a pod without a Service) and the engine joins it; the log volume is one Docker
volume shared by both, like the chart's emptyDir, and so is /dev/shm (one IPC namespace per pod, like the chart's
in-memory emptyDir there): LMCache moves CPU KV tensors between client and server through POSIX shared memory. The
kubelet's order is kept: the sidecar's startup probe passes before the engine starts, then the engine's startup probe
(`glm53 probe startup`) is executed inside the engine container until it reports Ready, then the readiness probe, then
validation runs in the same network namespace. The only rewrite is the Service URL of the test pod, which has no DNS
here: it becomes the engine's declared `http` port (the Service's target) on loopback. Last, the real server's own
`/metrics` (on its HTTP port) must show the hits it served. The pure reader's tests are in tests/test_podplan.py.
"""

from __future__ import annotations

import json
import re
import time
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from docker.models.containers import Container
from docker.types import Mount
from dockerkit import DockerEngine, MockImageBuild, built_image

import docker
from glm53 import chart
from glm53.faults.load import Outcome
from glm53.faults.table import FaultWindow, format_table, row
from glm53.lifecycle import RestartEvent
from glm53.loopback import service_url_on_loopback
from glm53.podplan import ContainerPlan, ExecProbe, PodPlan, deployment_pod, helm_test_pods
from glm53.profiles import PROFILES

# The first test here pays for the session's engine and mock image (fixtures, which pytest-timeout counts): many
# minutes while the other xdist worker keeps both cores busy.
pytestmark = pytest.mark.timeout(2400)
MOCK_VALUES = {"mock": {"enabled": True}, "validation": {"enabled": True}}
# The two model profiles: GLM-5.3-Flash (the chart's default, hybrid TP 4) and GLM-5.3 (TP 8).
PROFILE_VALUES: dict[str, dict[str, Any]] = {"glm53-flash": {}, "glm53": {"profile": "glm53"}}
# Upper bound on any one wait, whatever the rendered probe budget says (the mock loads in seconds, the budget of the
# real engine's startup probe is an hour).
WAIT_CAP_S = 120.0
VALIDATE_TIMEOUT_S = 300


# Read the real server's Prometheus text from inside the pod (the admin HTTP port listens on loopback only).
SCRAPE = "import urllib.request as r; print(r.urlopen('http://127.0.0.1:{port}/metrics', timeout=10).read().decode())"


def sample(text: str, name: str) -> float:
    """The sum of a metric's samples in Prometheus text (0 when absent)."""
    return sum(
        float(line.rsplit(" ", 1)[1]) for line in text.splitlines() if line.startswith((f"{name} ", f"{name}{{"))
    )


def with_option(argv: tuple[str, ...], option: str, value: str) -> list[str]:
    """`argv` with the value of `option` replaced; an error when the rendered command lacks the option."""
    if option not in argv:
        pytest.fail(f"expected {option} in the rendered command {list(argv)}")
    index = argv.index(option) + 1
    return [*argv[:index], value, *argv[index + 1 :]]


class ContainerPod:
    """Rendered pods' containers on a Docker engine, each pod around a sandbox container (Kubernetes' pause container).

    The sandbox owns the pod's IPC namespace (so its /dev/shm), and the first pod's sandbox owns the one network
    namespace every pod here shares: a container that exits and is started again comes back into the same namespaces,
    which it would take along if it owned them. Containers restart as the kubelet restarts them: a native sidecar
    always, a main container per the pod's `restartPolicy`, through Docker's own restart policy (at once the first
    time, then Docker's back-off, 100 ms doubling, where the kubelet's is 10 s doubling to 300 s). Volumes are per pod,
    like Kubernetes': Docker volumes named after the pod, except in-memory emptyDirs (tmpfs).
    """

    def __init__(self, client: docker.DockerClient) -> None:
        self.client = client
        self.prefix = f"glm53-pod-{uuid.uuid4().hex[:8]}"
        self.volume_names: set[str] = set()
        self.started: list[Container] = []
        self.sandboxes: dict[str, Container] = {}

    def _mounts(self, pod: PodPlan, container: ContainerPlan) -> tuple[list[Mount], int | None]:
        volumes = {v.name: v for v in pod.volumes}
        mounts: list[Mount] = []
        shm_size: int | None = None
        for mount in container.mounts:
            volume = volumes[mount.volume]
            if volume.in_memory and mount.path == "/dev/shm":
                shm_size = volume.size_bytes  # Docker mounts its own /dev/shm; size it instead of shadowing it
            elif volume.in_memory:
                mounts.append(Mount(target=mount.path, source=None, type="tmpfs", tmpfs_size=volume.size_bytes))
            else:
                name = f"{self.prefix}-{pod.name}-{volume.name}"
                self.volume_names.add(name)
                mounts.append(Mount(target=mount.path, source=name, type="volume", read_only=mount.read_only))
        return mounts, shm_size

    @property
    def network_owner(self) -> Container | None:
        """The first pod's sandbox, which holds the network namespace every pod here shares; None before any pod."""
        return next(iter(self.sandboxes.values()), None)

    def sandbox(self, pod: PodPlan, shm_size: int | None = None) -> Container:
        """The sandbox of `pod`, started the first time it is asked for: the pod's first container's image doing
        nothing under tini, with no privileges, sizing /dev/shm from that container's in-memory /dev/shm volume."""
        if pod.name in self.sandboxes:
            return self.sandboxes[pod.name]
        like = pod.containers[0]
        first = self.network_owner
        sandbox: Container = self.client.containers.run(
            like.image,
            entrypoint=["/usr/bin/tini", "--", "sleep", "infinity"],
            name=f"{self.prefix}-{pod.name}-sandbox",
            detach=True,
            user=like.user or "",
            read_only=True,
            cap_drop=["ALL"],
            security_opt=["no-new-privileges"],
            shm_size=shm_size,
            network_mode="none" if first is None else f"container:{first.id}",
            ipc_mode="shareable",
        )
        self.started.append(sandbox)
        self.sandboxes[pod.name] = sandbox
        return sandbox

    def start(self, pod: PodPlan, container: ContainerPlan, argv: list[str] | None = None) -> Container:
        """Start one container of `pod` in its sandbox's namespaces, restarted when it exits as the kubelet would."""
        command = argv if argv is not None else list(container.argv)
        mounts, shm_size = self._mounts(pod, container)
        sandbox = self.sandbox(pod, shm_size)
        network_owner = self.network_owner
        assert network_owner is not None  # the sandbox just asked for is one
        restarts = container.sidecar or (pod.restart_policy == "Always" and not container.init)
        # Kubernetes semantics: `command` replaces the image's ENTRYPOINT, `args` alone follow it.
        entrypoint, arguments = (command[:1], command[1:]) if container.overrides_entrypoint else (None, command)
        started: Container = self.client.containers.run(
            container.image,
            entrypoint=entrypoint,
            command=arguments,
            name=f"{self.prefix}-{pod.name}-{container.name}",
            detach=True,
            environment=dict(container.env),
            user=container.user or "",
            read_only=container.read_only_root,
            cap_drop=list(container.cap_drop),
            security_opt=["no-new-privileges"] if container.no_new_privileges else [],
            mem_limit=container.memory_limit_bytes or 0,
            nano_cpus=container.nano_cpus or 0,
            mounts=mounts,
            network_mode=f"container:{network_owner.id}",
            ipc_mode=f"container:{sandbox.id}",
            restart_policy={"Name": "always"} if restarts else None,
        )
        self.started.append(started)
        return started

    def wait_probe(self, running: Container, name: str, probe: ExecProbe) -> str:
        """Execute an exec probe inside `running` like the kubelet, until it exits 0; its output."""
        deadline = time.monotonic() + min(probe.budget_s, WAIT_CAP_S)
        while True:
            exit_code, output = running.exec_run(list(probe.command), demux=False)
            text = output.decode(errors="replace").strip() if isinstance(output, bytes) else ""
            if exit_code == 0:
                return text
            running.reload()
            if running.status != "running":
                pytest.fail(f"container {name} exited while probing ({running.status}); logs:\n{self.logs(running)}")
            if time.monotonic() > deadline:
                pytest.fail(
                    f"probe of {name} still exits {exit_code} ({text}) after the deadline; logs:\n{self.logs(running)}"
                )
            time.sleep(min(probe.period_s, 0.5))

    @staticmethod
    def logs(container: Container) -> str:
        logs = container.logs(tail=40, stream=False)
        return logs.decode(errors="replace") if isinstance(logs, bytes) else ""

    def stop(self) -> None:
        """Stop the engine before the sidecar (the kubelet's order), then remove containers and volumes."""
        for container in reversed(self.started):
            container.stop(timeout=10)
            container.remove(force=True)
        for volume in self.client.volumes.list():
            if volume.name in self.volume_names:
                volume.remove(force=True)
        leftovers = [c.name for c in self.client.containers.list(all=True) if (c.name or "").startswith(self.prefix)]
        assert not leftovers, f"containers left behind: {leftovers}"


@pytest.fixture(params=sorted(PROFILE_VALUES))
def rendered(request: pytest.FixtureRequest) -> list[dict[str, Any]]:
    return chart.render({**MOCK_VALUES, **PROFILE_VALUES[request.param]})


@pytest.fixture
def container_pod(docker_engine: DockerEngine) -> Iterator[ContainerPod]:
    pods = ContainerPod(docker_engine.client)
    try:
        yield pods
    finally:
        pods.stop()


@pytest.mark.docker
def test_rendered_mock_pod_starts_probes_ready_and_validates(
    container_pod: ContainerPod, rendered: list[dict[str, Any]], mock_image_build: MockImageBuild
) -> None:
    pod = deployment_pod(rendered)
    sidecar, engine = pod.container("lmcache"), pod.container("vllm")
    (test_pod,) = helm_test_pods(rendered)
    validate = test_pod.container("validate")
    built_tags = set(built_image(mock_image_build, "mock")["tags"])
    assert {sidecar.image, engine.image, validate.image} <= built_tags, "the chart's mock image is not the one built"
    assert sidecar.sidecar and sidecar.startup_probe is not None
    assert engine.startup_probe is not None and engine.readiness_probe is not None
    assert sidecar.served_argv[:2] == ("lmcache", "server"), "the sidecar must run the real LMCache server"
    assert {("LMCACHE_TRACK_USAGE", "false"), ("DO_NOT_TRACK", "1")} <= set(sidecar.env)

    started = time.monotonic()
    lmcache = container_pod.start(pod, sidecar)
    container_pod.wait_probe(lmcache, "lmcache", sidecar.startup_probe)
    vllm = container_pod.start(pod, engine)
    ready = container_pod.wait_probe(vllm, "vllm", engine.startup_probe)
    container_pod.wait_probe(vllm, "vllm", engine.readiness_probe)
    print(f"\ncontainer pod: Ready in {time.monotonic() - started:.1f}s ({ready})")

    base_url = service_url_on_loopback(validate.option("--base-url"), engine.port("http"))
    validator = container_pod.start(test_pod, validate, with_option(validate.argv, "--base-url", base_url))
    outcome = validator.wait(timeout=VALIDATE_TIMEOUT_S)
    output = container_pod.logs(validator)
    print(f"container pod: validated in {time.monotonic() - started:.1f}s since the sidecar started")
    assert outcome["StatusCode"] == 0, f"glm53 validate exited {outcome['StatusCode']}:\n{output}"

    exit_code, scraped = lmcache.exec_run(["python3", "-c", SCRAPE.format(port=sidecar.option("--http-port"))])
    metrics = scraped.decode(errors="replace") if isinstance(scraped, bytes) else ""
    hits = sample(metrics, "lmcache_mp_lookup_hit_tokens_total")
    print(f"container pod: the real server counted {hits:.0f} hit tokens")
    assert exit_code == 0 and hits > 0, metrics[-2000:]


# Run inside the pod's sandbox (the mock image holds the toolkit): the fault suite's own load (glm53.faults.load),
# which stores new documents and reloads older ones and reads what the server found for each reload from the server's
# /metrics; it says when to inject the fault, then, after `observe` seconds, prints every request's outcome as JSON.
LOAD_IN_POD = """
import dataclasses, json, sys, time
from glm53.faults.load import Load, LoadShape
engine, lmcache, model, chunk, strict, warm, observe = sys.argv[1:]
load = Load(engine, lmcache, model, LoadShape(document_tokens=2600), int(chunk), strict == "1", hang_s=60.0)
load.start()
time.sleep(float(warm))
print("inject", load.now(), flush=True)
time.sleep(float(observe))
print(json.dumps([dataclasses.asdict(o) for o in load.stop()]), flush=True)
"""
# SIGKILL to every process of the container but its init (the supervisor and the server, as the loopback fault suite
# kills the sidecar's process group): tini then exits and Docker's restart policy applies. `docker kill` would not do:
# it disables the container's restart policy until the container is next started (docker-kill(1)).
KILL_ALL_BUT_INIT = ["python3", "-c", "import os, signal; os.kill(-1, signal.SIGKILL)"]
# Seconds of load before the kill, and after it: the supervisor's hold (25 s with the chart's 10 s heartbeat), the
# server's start, the engine's failed ping and registration, and a document stored and reloaded after that.
WARM_S = 15
OBSERVE_S = 120


@pytest.mark.docker
def test_a_sidecar_killed_under_load_is_restarted_and_nothing_is_lost(
    container_pod: ContainerPod, mock_image_build: MockImageBuild
) -> None:
    """SIGKILL the sidecar's processes under load: Docker starts the container again at once (the kubelet's first
    restart), the chart's hold makes the engine's ping fail so it registers again (the fast-restart race), and
    the engine serves on meanwhile (`kv_load_failure_policy: recompute`): no request fails or hangs, and documents
    stored after the restart are found whole by the new server."""
    rendered = chart.render(MOCK_VALUES)
    pod = deployment_pod(rendered)
    sidecar, engine = pod.container("lmcache"), pod.container("vllm")
    assert sidecar.startup_probe is not None and engine.startup_probe is not None
    lmcache = container_pod.start(pod, sidecar)
    container_pod.wait_probe(lmcache, "lmcache", sidecar.startup_probe)
    vllm = container_pod.start(pod, engine)
    container_pod.wait_probe(vllm, "vllm", engine.startup_probe)

    profile = PROFILES[engine.option("--profile")]
    argv = [
        *("python3", "-c", LOAD_IN_POD),
        f"http://127.0.0.1:{engine.port('http')}",
        f"http://127.0.0.1:{sidecar.option('--http-port')}",
        helm_test_pods(rendered)[0].container("validate").option("--model"),
        sidecar.option("--chunk-size"),
        "1" if profile.strict_prefix else "0",
        str(WARM_S),
        str(OBSERVE_S),
    ]
    output = ""
    injected_s: float | None = None
    for chunk in container_pod.sandbox(pod).exec_run(argv, stream=True).output:
        output += chunk.decode(errors="replace") if isinstance(chunk, bytes) else ""
        if injected_s is None and (marker := re.search(r"^inject (\S+)$", output, re.MULTILINE)):
            injected_s = float(marker.group(1))
            lmcache.exec_run(KILL_ALL_BUT_INIT)
    assert injected_s is not None, output[-3000:]
    outcomes = [Outcome(**o) for o in json.loads(output.strip().splitlines()[-1])]

    lmcache.reload()
    restarts = int(lmcache.attrs["RestartCount"])
    kill = RestartEvent(injected_s, "lmcache", "killed (SIGKILL)")
    result = row(FaultWindow("kill (container)", injected_s, injected_s + OBSERVE_S, (kill,)), outcomes)
    print("\n" + "\n".join(format_table("container pod, the chart's settings:", [result])))
    logs = lmcache.logs().decode(errors="replace")
    assert restarts >= 1, f"Docker did not start the sidecar again; its logs:\n{logs[-3000:]}"
    assert "holding 25 s before the" in logs, logs[-3000:]  # the second start of the container held its server
    assert (result.failed, result.hung) == (0, 0), result
    assert result.hits_back_s is not None and result.hit_tokens == result.expected_tokens > 0, result
