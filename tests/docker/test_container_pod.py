"""The container-level pod: the chart's mock-mode pod run as containers of the mock image, the way a kubelet would.

Everything comes from `helm template` of `charts/glm53` with `mock.enabled=true, validation.enabled=true`: the
`lmcache` native sidecar (the real LMCache 0.5.6 server, `lmcache server`, from the image's `pod` extra) and the `vllm`
container (the engine stand-in, which talks to the server with LMCache's own client classes), each with its image,
command, args, env, user, read-only root, dropped capabilities, memory/CPU limits, volumes and exec probes, and the
`helm test` pod's `glm53 validate` command. The sidecar owns the pod's network namespace (loopback only, like a pod
without a Service) and the engine joins it; the log volume is one Docker volume shared by both, like the chart's
emptyDir, and so is /dev/shm (one IPC namespace per pod, like the chart's in-memory emptyDir there): LMCache moves CPU
KV tensors between client and server through POSIX shared memory. The kubelet's order is kept: the sidecar's startup
probe passes before the engine starts, then the engine's startup probe (`glm53 probe startup`) is executed
inside the engine container until it reports Ready, then the readiness probe, then validation runs in the same network
namespace. The only rewrite is the Service URL of the test pod, which has no DNS here: it becomes the pod-local
address on the same port. Last, the real server's own `/metrics` (on its HTTP port) must show the hits it served.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator, Mapping
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import helm_python
import pytest
import yaml
from docker.models.containers import Container
from docker.types import Mount
from dockerkit import REPO_ROOT, DockerEngine, MockImageBuild, built_image

import docker
from glm53.containerpod import (
    ExecProbe,
    PodContainer,
    RenderedPod,
    deployment_pod,
    helm_test_pods,
    parse_quantity,
    pod_from_spec,
)
from glm53.errors import Glm53Error

RELEASE = "glm53-flash"
NAMESPACE = "default"
MOCK_VALUES = {"mock": {"enabled": True}, "validation": {"enabled": True}}
# The two model profiles: GLM-5.3-Flash (the chart's default, hybrid TP 4) and GLM-5.3 (TP 8).
PROFILE_VALUES = {"glm53-flash": {}, "glm53": {"profile": "glm53"}}
# Upper bound on any one wait, whatever the rendered probe budget says (the mock loads in seconds, the budget of the
# real engine's startup probe is an hour).
WAIT_CAP_S = 120.0
VALIDATE_TIMEOUT_S = 300


# Read the real server's Prometheus text from inside the pod (the admin HTTP port listens on loopback only).
SCRAPE = "import urllib.request as r; print(r.urlopen('http://127.0.0.1:{port}/metrics', timeout=10).read().decode())"


def served_program(container: PodContainer) -> tuple[str, ...]:
    """The program `glm53 supervise` runs (the two words after its `--`, not tini's)."""
    argv = container.argv[container.argv.index("supervise") :] if "supervise" in container.argv else container.argv
    return argv[argv.index("--") + 1 : argv.index("--") + 3] if "--" in argv else ()


def sample(text: str, name: str) -> float:
    """The sum of a metric's samples in Prometheus text (0 when absent)."""
    return sum(
        float(line.rsplit(" ", 1)[1]) for line in text.splitlines() if line.startswith((f"{name} ", f"{name}{{"))
    )


def render_chart(values: Mapping[str, Any]) -> list[dict[str, Any]]:
    """The chart's rendered objects (helm-python-sdk, Helm's own template engine)."""
    with helm_python.Chart.load(REPO_ROOT / "charts" / "glm53") as chart:
        files: dict[str, str] = chart.render(values=dict(values), name=RELEASE, namespace=NAMESPACE)
    return [doc for path, text in files.items() if path.endswith(".yaml") for doc in yaml.safe_load_all(text) if doc]


def pod_local(url: str) -> str:
    """A Service URL as seen from inside the pod: same scheme, port and path, host 127.0.0.1."""
    parts = urlsplit(url)
    return urlunsplit(parts._replace(netloc=f"127.0.0.1:{parts.port}"))


def with_option(argv: tuple[str, ...], option: str, value: str) -> list[str]:
    """`argv` with the value of `option` replaced; an error when the rendered command lacks the option."""
    if option not in argv:
        pytest.fail(f"expected {option} in the rendered command {list(argv)}")
    index = argv.index(option) + 1
    return [*argv[:index], value, *argv[index + 1 :]]


class ContainerPod:
    """Rendered pods' containers on a Docker engine, all in the network namespace of the first container started.

    Volumes are per pod, like Kubernetes': Docker volumes named after the pod, except in-memory emptyDirs (tmpfs).
    """

    def __init__(self, client: docker.DockerClient) -> None:
        self.client = client
        self.prefix = f"glm53-pod-{uuid.uuid4().hex[:8]}"
        self.volume_names: set[str] = set()
        self.started: list[Container] = []
        # Per pod, the container whose IPC namespace (and so /dev/shm) the pod's later containers join.
        self.ipc_owner: dict[str, Container] = {}

    def _mounts(self, pod: RenderedPod, container: PodContainer) -> tuple[list[Mount], int | None]:
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

    def start(self, pod: RenderedPod, container: PodContainer, argv: list[str] | None = None) -> Container:
        """Start one container of `pod` in the shared network namespace (the first one started creates it)."""
        command = argv if argv is not None else list(container.argv)
        mounts, shm_size = self._mounts(pod, container)
        network_mode = f"container:{self.started[0].id}" if self.started else "none"
        owner = self.ipc_owner.get(pod.name)
        ipc_mode = f"container:{owner.id}" if owner is not None else "shareable"
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
            shm_size=shm_size if owner is None else None,
            network_mode=network_mode,
            ipc_mode=ipc_mode,
        )
        self.started.append(started)
        self.ipc_owner.setdefault(pod.name, started)
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
    return render_chart({**MOCK_VALUES, **PROFILE_VALUES[request.param]})


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
    assert served_program(sidecar) == ("lmcache", "server"), "the sidecar must run the real LMCache server"
    assert {("LMCACHE_TRACK_USAGE", "false"), ("DO_NOT_TRACK", "1")} <= set(sidecar.env)

    started = time.monotonic()
    lmcache = container_pod.start(pod, sidecar)
    container_pod.wait_probe(lmcache, "lmcache", sidecar.startup_probe)
    vllm = container_pod.start(pod, engine)
    ready = container_pod.wait_probe(vllm, "vllm", engine.startup_probe)
    container_pod.wait_probe(vllm, "vllm", engine.readiness_probe)
    print(f"\ncontainer pod: Ready in {time.monotonic() - started:.1f}s ({ready})")

    base_url = validate.argv[validate.argv.index("--base-url") + 1]
    validator = container_pod.start(test_pod, validate, with_option(validate.argv, "--base-url", pod_local(base_url)))
    outcome = validator.wait(timeout=VALIDATE_TIMEOUT_S)
    output = container_pod.logs(validator)
    print(f"container pod: validated in {time.monotonic() - started:.1f}s since the sidecar started")
    assert outcome["StatusCode"] == 0, f"glm53 validate exited {outcome['StatusCode']}:\n{output}"

    http_port = sidecar.argv[sidecar.argv.index("--http-port") + 1]
    exit_code, scraped = lmcache.exec_run(["python3", "-c", SCRAPE.format(port=http_port)])
    metrics = scraped.decode(errors="replace") if isinstance(scraped, bytes) else ""
    hits = sample(metrics, "lmcache_mp_lookup_hit_tokens_total")
    print(f"container pod: the real server counted {hits:.0f} hit tokens")
    assert exit_code == 0 and hits > 0, metrics[-2000:]


# Pure parts of glm53.containerpod (no engine needed).


def test_quantities_read_like_kubernetes() -> None:
    assert parse_quantity("500m") == 0.5
    assert parse_quantity("256Mi") == 256 * 2**20
    assert parse_quantity("1G") == 1e9
    assert parse_quantity(2) == 2.0


def test_bad_quantity_is_one_sentence() -> None:
    with pytest.raises(Glm53Error) as error:
        parse_quantity("lots")
    assert (
        error.value.message
        == "expected a Kubernetes quantity such as 500m or 256Mi, found 'lots'; fix the chart values"
    )


def test_mock_pod_reads_sidecar_first_with_the_security_context() -> None:
    pod = deployment_pod(render_chart(MOCK_VALUES))
    sidecar = pod.containers[0]

    assert [c.name for c in pod.containers][:2] == ["lmcache", "vllm"]
    assert sidecar.sidecar and not pod.container("vllm").sidecar
    assert sidecar.user == "10001:10001" and sidecar.read_only_root and sidecar.cap_drop == ("ALL",)
    for container in (sidecar, pod.container("vllm")):
        # The chart names the image's own PID 1 (tini -- glm53 supervise), since a pod's command replaces ENTRYPOINT.
        assert container.overrides_entrypoint
        expected = ("/usr/bin/tini", "--", "glm53", "supervise")
        assert container.argv[: len(expected)] == expected, container.argv
    assert served_program(sidecar) == ("lmcache", "server")
    assert {v.name for v in pod.volumes if v.in_memory} == {"shm"}


def test_run_to_completion_init_container_is_refused() -> None:
    spec = {"initContainers": [{"name": "fetch", "image": "x"}], "containers": []}
    with pytest.raises(Glm53Error) as error:
        pod_from_spec("p", spec)
    assert error.value.message == (
        "expected only native sidecars among the init containers of 'p', found run-to-completion fetch; "
        "the container pod does not run those"
    )


def test_env_from_a_secret_is_refused() -> None:
    spec = {"containers": [{"name": "c", "image": "x", "env": [{"name": "TOKEN", "valueFrom": {}}]}]}
    with pytest.raises(Glm53Error) as error:
        pod_from_spec("p", spec)
    assert error.value.message == (
        "expected literal env values in container 'c', found TOKEN from valueFrom; "
        "the container pod supports `value` entries only"
    )


def test_service_url_becomes_pod_local() -> None:
    assert pod_local("http://glm53-flash:8000") == "http://127.0.0.1:8000"
    assert pod_local("http://svc.ns.svc:9400/metrics") == "http://127.0.0.1:9400/metrics"


def test_a_container_without_command_keeps_the_image_entrypoint() -> None:
    spec = {
        "containers": [
            {"name": "a", "image": "x", "args": ["--log", "l", "--", "id"]},
            {"name": "b", "image": "x", "command": ["glm53", "supervise"], "args": ["--", "id"]},
        ]
    }
    pod = pod_from_spec("p", spec)

    assert not pod.container("a").overrides_entrypoint and pod.container("a").argv == ("--log", "l", "--", "id")
    assert pod.container("b").overrides_entrypoint and pod.container("b").argv == ("glm53", "supervise", "--", "id")
