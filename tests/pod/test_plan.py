"""The pure reader of the chart's rendered pod (`glm53.pod.plan`): what the runners are told to run.

The plans come from the chart itself, rendered in-process by `glm53.pod.chart.render` in mock mode (the pod every CPU
runner executes); synthetic PodSpecs cover what the chart never renders (run-to-completion init containers, env from
a Secret, a container that keeps its image's ENTRYPOINT).
"""

from __future__ import annotations

from typing import Any

import pytest

from glm53.errors import Glm53Error
from glm53.pod import chart
from glm53.pod.plan import ContainerPlan, PodPlan, deployment_pod, parse_quantity, pod_from_spec

MOCK_VALUES: dict[str, Any] = {"mock": {"enabled": True}, "weights": {"source": "none"}}
# The image's own PID 1, which the chart names because a pod's `command` replaces the image's ENTRYPOINT.
SUPERVISOR = ("/usr/bin/tini", "--", "glm53", "supervise")


@pytest.fixture(scope="module")
def mock_pod() -> PodPlan:
    return deployment_pod(chart.render(MOCK_VALUES))


def container(args: list[str], name: str = "c") -> ContainerPlan:
    """A one-container pod's container, as the reader makes it from a PodSpec with these `args`."""
    return pod_from_spec("p", {"containers": [{"name": name, "image": "x", "args": args}]}).container(name)


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


def test_mock_pod_reads_sidecar_first_with_the_security_context(mock_pod: PodPlan) -> None:
    sidecar, engine = mock_pod.containers[0], mock_pod.container("vllm")

    assert [c.name for c in mock_pod.containers][:2] == ["lmcache", "vllm"]
    assert sidecar.sidecar and not engine.sidecar
    assert sidecar.user == "10001:10001" and sidecar.read_only_root and sidecar.cap_drop == ("ALL",)
    for each in (sidecar, engine):
        assert each.overrides_entrypoint
        assert each.argv[: len(SUPERVISOR)] == SUPERVISOR, each.argv
    assert sidecar.served_argv[:2] == ("lmcache", "server")


def test_init_containers_keep_their_order_and_kind() -> None:
    """A plain init container runs to completion before the native sidecar after it, as the kubelet orders them."""
    spec = {
        "initContainers": [{"name": "fetch", "image": "x"}, {"name": "side", "image": "x", "restartPolicy": "Always"}],
        "containers": [{"name": "main", "image": "x"}],
    }
    plan = pod_from_spec("p", spec)
    assert [(c.name, c.init, c.sidecar) for c in plan.containers] == [
        ("fetch", True, False),
        ("side", False, True),
        ("main", False, False),
    ]


def test_env_from_a_secret_key_is_kept_as_a_reference_and_any_other_source_refused() -> None:
    secret = {"name": "TOKEN", "valueFrom": {"secretKeyRef": {"name": "s", "key": "k"}}}
    plain = {"name": "A", "value": "1"}
    pod = pod_from_spec("p", {"containers": [{"name": "c", "image": "x", "env": [plain, secret]}]})
    assert pod.container("c").env == (("A", "1"),) and pod.container("c").secret_env == (("TOKEN", "s", "k"),)

    field = {"name": "NODE", "valueFrom": {"fieldRef": {"fieldPath": "spec.nodeName"}}}
    with pytest.raises(Glm53Error) as error:
        pod_from_spec("p", {"containers": [{"name": "c", "image": "x", "env": [field]}]})
    assert error.value.message == (
        "expected literal env values or Secret keys in container 'c', found NODE from valueFrom; "
        "a pod plan holds `value` and `valueFrom.secretKeyRef` entries only"
    )


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


def test_a_missing_container_names_the_ones_the_pod_has(mock_pod: PodPlan) -> None:
    with pytest.raises(Glm53Error) as error:
        mock_pod.container("router")
    assert error.value.message == (
        "expected a container 'router' in pod 'glm53-flash', found only lmcache, vllm; check the chart values"
    )


def test_declared_ports_are_read_by_name(mock_pod: PodPlan) -> None:
    # The engine's `http` port is what the Service targets; the sidecar declares none (it is reached on loopback).
    assert mock_pod.container("vllm").port("http") == 8000
    with pytest.raises(Glm53Error) as error:
        mock_pod.container("vllm").port("metrics")
    assert error.value.message == "expected a port 'metrics' on container 'vllm', found http; check the chart"
    with pytest.raises(Glm53Error) as error:
        mock_pod.container("lmcache").port("http")
    assert error.value.message == "expected a port 'http' on container 'lmcache', found none; check the chart"


def test_option_reads_the_rendered_flags(mock_pod: PodPlan) -> None:
    sidecar = mock_pod.container("lmcache")
    assert (sidecar.option("--port"), sidecar.option("--http-port"), sidecar.option("--chunk-size")) == (
        "5555",
        "8080",
        "1152",
    )


def test_option_takes_the_last_occurrence_as_argparse_does() -> None:
    assert container(["--port", "1", "--l1-size-gb", "2", "--port", "3"]).option("--port") == "3"


@pytest.mark.parametrize("args", [["--host", "h"], ["--host", "h", "--port"]], ids=["absent", "without-value"])
def test_a_missing_option_names_the_flag_and_the_container(args: list[str]) -> None:
    with pytest.raises(Glm53Error) as error:
        container(args).option("--port")
    assert error.value.message == "expected --port in the rendered command of container 'c'; check the chart's helpers"


def test_served_argv_is_what_follows_the_supervisors_separator(mock_pod: PodPlan) -> None:
    sidecar = mock_pod.container("lmcache")
    served = sidecar.served_argv
    assert served[:2] == ("lmcache", "server")
    assert sidecar.argv[-len(served) :] == served
    options = ("--hold-after-restart", "25", "--l2-dir", "/var/cache/glm53/lmcache-l2", "--l2-max-bytes")
    assert sidecar.argv[: -len(served)] == (
        *SUPERVISOR,
        *("--log", "/var/log/glm53/lmcache.log", *options, str(int(200 * 0.85 * 2**30)), "--"),
    )
    assert mock_pod.container("vllm").served_argv[:3] == ("glm53", "mock", "vllm")


def test_served_argv_of_an_unsupervised_container_is_its_whole_argv() -> None:
    assert container(["glm53", "exporter", "--port", "9400"]).served_argv == ("glm53", "exporter", "--port", "9400")
    # A `--` that belongs to tini, not to a supervisor, does not make a served program.
    assert container(["tini", "--", "id"]).served_argv == ("tini", "--", "id")


def test_grace_period_is_the_rendered_termination_grace_period() -> None:
    rendered = deployment_pod(chart.render({**MOCK_VALUES, "terminationGracePeriodSeconds": 15}))
    assert rendered.grace_period_s == 15.0
    # Kubernetes' default when the PodSpec leaves it out.
    assert pod_from_spec("p", {"containers": []}).grace_period_s == 30.0


def test_volumes_say_which_are_empty_dirs_and_which_are_in_memory(mock_pod: PodPlan) -> None:
    volumes = {v.name: v for v in mock_pod.volumes}

    assert all(v.empty_dir for v in volumes.values()), volumes
    assert {name for name, v in volumes.items() if v.in_memory} == {"shm"}
    assert volumes["logs"].size_bytes == 2**30 and not volumes["logs"].in_memory
    claim = {"name": "w", "persistentVolumeClaim": {"claimName": "w"}}
    (weights,) = pod_from_spec("p", {"containers": [], "volumes": [claim]}).volumes
    assert (weights.empty_dir, weights.in_memory, weights.size_bytes) == (False, False, None)


# lmcache.serverLayout=perRank: one sidecar per TP rank (glm53-flash: 4), each started only after the one before.
PER_RANK_VALUES: dict[str, Any] = {**MOCK_VALUES, "lmcache": {"serverLayout": "perRank"}, "exporter": {"enabled": True}}


def test_a_per_rank_pod_has_its_sidecars_in_rank_order_before_the_engine() -> None:
    plan = deployment_pod(chart.render(PER_RANK_VALUES))
    servers = plan.lmcache_servers()
    assert [c.name for c in plan.containers][:5] == ["lmcache-0", "lmcache-1", "lmcache-2", "lmcache-3", "vllm"]
    assert [c.name for c in servers] == ["lmcache-0", "lmcache-1", "lmcache-2", "lmcache-3"]
    assert all(c.sidecar and c.startup_probe is not None and c.liveness_probe is not None for c in servers)
    assert [(c.option("--port"), c.option("--http-port")) for c in servers] == [
        (str(5560 + i), str(8090 + i)) for i in range(4)
    ]
    assert {c.option("--l1-size-gb") for c in servers} == {"0.25"}  # mock.l1SizeGb (1) split four ways


def test_the_pods_one_sidecar_is_its_only_lmcache_server(mock_pod: PodPlan) -> None:
    assert [c.name for c in mock_pod.lmcache_servers()] == ["lmcache"]


def test_a_pod_without_an_lmcache_server_names_its_containers() -> None:
    plan = pod_from_spec("p", {"containers": [{"name": "vllm", "image": "x"}]})
    with pytest.raises(Glm53Error) as error:
        plan.lmcache_servers()
    assert error.value.message == ("expected a container 'lmcache' in pod 'p', found only vllm; check the chart values")
