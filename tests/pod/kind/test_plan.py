"""The plan of a kind smoke test: the dry run, which prints the very plan a real run executes, asserted in detail for
each profile and engine and for --reuse/--keep; the options that reach it; the planned install command rendered by the
real chart; and the operations guide checked against the phases, the node image and the profiles.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from glm53.cli import main as cli_main
from glm53.pod.contract import ENGINE_CONTAINER, SIDECAR_CONTAINER
from glm53.pod.kind.plan import VLLM_PORT, Phase, SmokeOptions, WaitReady, helm_install_argv, service_name
from glm53.pod.kind.preflight import MIN_NODE_KUBERNETES, NODE_IMAGE, format_version, node_image_kubernetes
from glm53.pod.kind.verdicts import containers_of, is_serving_pod
from glm53.profiles import get_profile
from tests.support.kindkit import FLASH_HELM, IMAGE_SETS, KIND_DELETE, REPO, tool

GLM53_HELM = (
    f"helm install glm53 charts/glm53 --set mock.enabled=true --set validation.enabled=true --set profile=glm53 "
    f"{IMAGE_SETS}"
)
BUILD = (
    """ANSIBLE_CONFIG=ansible/ansible.cfg ansible-playbook ansible/build-images.yml -e '{"glm53_images": ["mock"]}'"""
)


# ---------------------------------------------------------------------------------------------------------- dry run


def dry_run(capsys: pytest.CaptureFixture[str], *args: str) -> list[str]:
    assert cli_main(["kind-smoke", "--dry-run", *args]) == 0
    return capsys.readouterr().out.splitlines()


def commands(lines: list[str]) -> list[str]:
    """The indented lines of the dry run: the commands and steps, without the phase headers."""
    return [line.strip() for line in lines if line.startswith("    ")]


def test_dry_run_flash_prints_every_step_in_order(capsys: pytest.CaptureFixture[str]) -> None:
    lines = dry_run(capsys)
    headers = [line for line in lines if line.startswith("[")]
    assert headers == [
        "[1] preflight (exit 10 on failure)",
        "[2] cluster (exit 11 on failure)",
        "[3] image (exit 11 on failure)",
        "[4] image (exit 11 on failure)",
        "[5] install (exit 12 on failure)",
        "[6] ready (exit 13 on failure)",
        "[7] ready (exit 13 on failure)",
        "[8] helm-test (exit 14 on failure)",
        "[9] validate (exit 14 on failure)",
    ]
    steps = commands(lines)
    assert steps[:6] == [
        "docker --version  # need docker >= 20.10.0",
        "kind version  # need kind >= 0.33.0",
        "kubectl version --client  # need kubectl >= 1.33.0",
        "ansible-playbook --version  # need ansible-playbook >= 2.19.0",
        "helm version --short  # need helm >= 3.10.0",
        "docker info --format '{{.ServerVersion}}'  # the daemon must be reachable",
    ]
    assert f"# node image {NODE_IMAGE} must be Kubernetes >= 1.29.0" in steps
    create = f"kind create cluster --name glm53-smoke --image {NODE_IMAGE} --wait 120s"
    expected_in_order = [
        "kind get clusters",
        f"{create}  # fails first if `kind get clusters` already lists 'glm53-smoke' (pass --reuse to keep it)",
        "kind export kubeconfig --name glm53-smoke",
        BUILD,
        "kind load docker-image glm53/mock:0.1.0 --name glm53-smoke",
        FLASH_HELM,
        "helm test glm53-flash --logs --timeout 10m --kube-context kind-glm53-smoke --namespace glm53-smoke",
        "kubectl --context kind-glm53-smoke --namespace glm53-smoke port-forward --address 127.0.0.1 "
        "service/glm53-flash 18000:8000 &",
        "glm53 validate --base-url http://127.0.0.1:18000 --profile glm53-flash",
        "# stop the port-forward",
        KIND_DELETE,
    ]
    positions = [steps.index(line) for line in expected_in_order]
    assert positions == sorted(positions)
    wait = next(line for line in steps if line.startswith("# watch pods"))
    assert "-l app.kubernetes.io/instance=glm53-flash,app.kubernetes.io/component=engine in glm53-smoke" in wait
    assert "milestones: scheduled, sidecar lmcache started, vllm running, startup probe passed, Ready" in wait
    geometry = next(line for line in steps if "parsed geometry" in line)
    assert "group_tokens_per_block=[1152, 1152, 1152, 1152, 1152, 0] at TP 4" in geometry
    assert "on failure: collect describe, events and the logs of every container into artifacts/kind-smoke/" in lines
    assert lines[-2:] == ["teardown (always, also after a failure):", f"    {KIND_DELETE}"]


def test_dry_run_glm53_installs_the_tp8_profile_under_its_own_release(capsys: pytest.CaptureFixture[str]) -> None:
    steps = commands(dry_run(capsys, "--profile", "glm53"))
    assert GLM53_HELM in steps
    assert FLASH_HELM not in steps
    assert "helm test glm53 --logs --timeout 10m --kube-context kind-glm53-smoke --namespace glm53-smoke" in steps
    assert "glm53 validate --base-url http://127.0.0.1:18000 --profile glm53" in steps
    assert any("service/glm53 18000:8000" in line for line in steps)
    assert any("(expected for glm53: group_tokens_per_block=[64] at TP 8)" in line for line in steps)
    assert steps[-1] == KIND_DELETE


def test_dry_run_real_engine_installs_the_tiny_profile_with_the_images_vllm(capsys: pytest.CaptureFixture[str]) -> None:
    steps = commands(dry_run(capsys, "--engine", "vllm"))
    (install,) = [step for step in steps if step.startswith("helm install ")]
    assert install.startswith("helm install glm53-tiny-dense charts/glm53 --set mock.enabled=true")
    assert "--set profile=tiny-dense --set mock.engine=vllm" in install
    assert "glm53 validate --base-url http://127.0.0.1:18000 --profile tiny-dense" in steps
    assert any("(expected for tiny-dense: group_tokens_per_block=[64] at TP 1)" in line for line in steps)


def test_dry_run_reuse_keeps_the_cluster_and_uninstalls_only_the_release(capsys: pytest.CaptureFixture[str]) -> None:
    lines = dry_run(capsys, "--reuse", "--name", "dev")
    steps = commands(lines)
    assert (
        f"kind create cluster --name dev --image {NODE_IMAGE} --wait 120s  "
        "# only if `kind get clusters` does not list 'dev' (--reuse keeps an existing one)"
    ) in steps
    assert "kind load docker-image glm53/mock:0.1.0 --name dev" in steps
    assert not any(line.startswith("kind delete") for line in steps)
    assert lines[-2:] == [
        "teardown (always, also after a failure):",
        "    helm uninstall glm53-flash --wait --kube-context kind-dev --namespace glm53-smoke  "
        "# only if the install step ran",
    ]


@pytest.mark.parametrize("extra", [[], ["--reuse"]])
def test_dry_run_keep_tears_nothing_down(capsys: pytest.CaptureFixture[str], extra: list[str]) -> None:
    lines = dry_run(capsys, "--keep", *extra)
    assert lines[-1] == "teardown: skipped (--keep)"
    assert not any("kind delete" in line or "helm uninstall" in line for line in lines)
    assert FLASH_HELM in commands(lines)


def test_dry_run_options_reach_the_commands(capsys: pytest.CaptureFixture[str]) -> None:
    steps = commands(
        dry_run(
            capsys,
            *("--namespace", "ns1", "--local-port", "19001", "--timeout", "90", "--artifacts", "/tmp/out"),
        )
    )
    assert any(line.startswith("helm install") and "--namespace ns1 --create-namespace" in line for line in steps)
    assert "helm test glm53-flash --logs --timeout 10m --kube-context kind-glm53-smoke --namespace ns1" in steps
    assert "glm53 validate --base-url http://127.0.0.1:19001 --profile glm53-flash" in steps
    assert any(line.startswith("# watch pods") and "timeout 90s" in line for line in steps)


def test_dry_run_needs_no_tool_at_all(tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "glm53", "kind-smoke", "--dry-run", "--profile", "glm53"],
        env={"PATH": str(tmp_path), "HOME": str(tmp_path)},
        cwd=tmp_path,
        capture_output=True,
        text=True,
    )
    assert done.returncode == 0, done.stderr
    assert GLM53_HELM in done.stdout


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--local-port", "0"], "--local-port must be a TCP port 1-65535, got 0; pick a free local port"),
        (
            ["--timeout", "-1"],
            "--timeout must be positive seconds, got -1; pass the seconds the pod may take to become Ready",
        ),
        (
            ["--timeout", "nan"],
            "--timeout must be positive seconds, got nan; pass the seconds the pod may take to become Ready",
        ),
    ],
)
def test_bad_options_are_one_line_usage_errors(
    capsys: pytest.CaptureFixture[str], args: list[str], message: str
) -> None:
    assert cli_main(["kind-smoke", "--dry-run", *args]) == 2
    assert capsys.readouterr().err == f"glm53 kind-smoke: error: {message}\n"


# ------------------------------------------------------------------------------------------ the plan meets the chart


@pytest.mark.parametrize(
    ("profile", "engine"), [("glm53-flash", "standin"), ("glm53", "standin"), ("tiny-dense", "vllm")]
)
def test_the_install_command_renders_the_pod_the_smoke_test_waits_for(profile: str, engine: str) -> None:
    # `helm template` with the very arguments of the planned `helm install` (minus the cluster-only flags), at the
    # pinned node image's Kubernetes version: the chart must accept them and render what the later steps rely on.
    helm = tool("helm", "20-helm.sh")
    options = SmokeOptions(profile=get_profile(profile), engine=engine)
    install = list(helm_install_argv(options))
    assert install[:2] == ["helm", "install"]
    cluster_only = {"--create-namespace", "--kube-context", options.context}
    args = [arg for arg in install[2:] if arg not in cluster_only]
    kube_version = format_version(node_image_kubernetes(options.node_image) or MIN_NODE_KUBERNETES)
    done = subprocess.run(
        [helm, "template", *args, "--kube-version", kube_version], cwd=REPO, capture_output=True, text=True
    )
    assert done.returncode == 0, done.stderr
    objects = [doc for doc in yaml.safe_load_all(done.stdout) if doc]
    by_kind: dict[str, list[dict[str, Any]]] = {}
    for obj in objects:
        by_kind.setdefault(obj["kind"], []).append(obj)
    assert "PersistentVolumeClaim" not in by_kind  # weights.source=none
    (service,) = by_kind["Service"]
    assert service["metadata"]["name"] == service_name(options)
    assert [p["port"] for p in service["spec"]["ports"]] == [VLLM_PORT]
    (deployment,) = by_kind["Deployment"]
    template = deployment["spec"]["template"]
    selector = dict(item.split("=") for item in WaitReady("c", "n", options.release, 1).selector.split(","))
    assert selector.items() <= template["metadata"]["labels"].items()
    serving_pod = {"spec": template["spec"]}
    assert is_serving_pod(serving_pod)
    makes_the_model = ["tiny-model"] if engine == "vllm" else []  # the real engine's init container
    expected_containers = [*makes_the_model, SIDECAR_CONTAINER, ENGINE_CONTAINER]
    assert [name for name, _ in containers_of(serving_pod)] == expected_containers
    (sidecar,) = [c for c in template["spec"]["initContainers"] if c.get("restartPolicy") == "Always"]
    assert sidecar["name"] == SIDECAR_CONTAINER
    for container in [*template["spec"]["initContainers"], *template["spec"]["containers"]]:
        assert (container["image"], container["imagePullPolicy"]) == (options.mock_image, "Never")
    (engine_container,) = [c for c in template["spec"]["containers"] if c["name"] == ENGINE_CONTAINER]
    served = " ".join(engine_container["args"] if engine == "vllm" else engine_container["command"])
    assert ("vllm.entrypoints.openai.api_server" in served) == (engine == "vllm"), served
    (test_pod,) = [pod for pod in by_kind["Pod"] if pod["metadata"]["annotations"]["helm.sh/hook"] == "test"]
    assert not is_serving_pod(test_pod)
    assert f"--profile {profile}" in " ".join(test_pod["spec"]["containers"][0]["args"])


# ------------------------------------------------------------------------------ the operations guide tells the truth

OPERATIONS = REPO / "docs" / "operations.md"


def table_row(text: str, first_cell: str) -> list[str]:
    """The cells of the Markdown table row whose first cell is `first_cell`."""
    (line,) = [line for line in text.splitlines() if line.startswith(f"| {first_cell} |")]
    return [cell.strip() for cell in line.strip("|").split("|")][1:]


def test_the_operations_guide_agrees_with_the_profiles() -> None:
    text = OPERATIONS.read_text()
    profiles = [get_profile("glm53-flash"), get_profile("glm53")]
    assert table_row(text, "GPUs per pod (TP)") == [str(p.tensor_parallel_size) for p in profiles]
    expected = [p.expected_groups(p.unified_block_size(p.tensor_parallel_size)) for p in profiles]
    assert table_row(text, "expected `group_tokens_per_block`") == [f"`{list(groups)}`" for groups in expected]
    chunks = table_row(text, "LMCache `--chunk-size` the chart passes")
    assert [cell.split()[0] for cell in chunks] == [str(p.recommended_chunk_size) for p in profiles]
    assert [p.model_id for p in profiles] == [cell.split("`")[1] for cell in table_row(text, "model")]


def test_the_operations_guide_documents_the_smoke_tests_exit_codes_and_node_image() -> None:
    text = OPERATIONS.read_text()
    assert NODE_IMAGE in text
    start = text.index("| exit | failed phase |")
    rows = text[start:].split("\n\n")[0].splitlines()[2:]
    documented = {int(row.split("|")[1]) for row in rows}
    assert documented == {0, 2} | {phase.exit_code for phase in Phase}
