"""Scale-out storage: every engine replica gets a weights volume it can mount on its own node.

Each replica runs a whole tensor-parallel group (a GLM-5.3 replica fills an 8-GPU node), so the replicas land on
different nodes, and a ReadWriteOnce claim attaches to one node only. With weights.source=newPvc and replicaCount > 1
the chart runs the engine pods under a StatefulSet whose volumeClaimTemplate gives each replica its own claim
(charts/glm53/templates/engine/_storage.tpl); every other case stays a Deployment. The tests below list the pods a
workload creates and the claims each one mounts, named the way the StatefulSet controller names them
(`<template>-<statefulset>-<ordinal>`), and hold every claim two pods share to a many-node access mode.
"""

from __future__ import annotations

from typing import Any

import pytest
import yaml

from glm53.pod.plan import deployment_pod
from tests.support.chartkit import (
    CHART_DIR,
    NAMESPACE,
    RELEASE,
    Obj,
    container,
    engine,
    engine_workload,
    get,
    notes,
    objects,
    one,
    pod_spec,
    render,
    scenario_values,
    scenarios,
)

DEFAULTS = yaml.safe_load((CHART_DIR / "values.yaml").read_text())
MANY_NODES = {"ReadOnlyMany", "ReadWriteMany"}
HEADLESS = f"{RELEASE}-headless"


def pod_claims(objs: list[Obj]) -> dict[str, set[str]]:
    """Pod name -> the claims it mounts, for every pod the engine workload creates."""
    workload = engine_workload(objs)
    name, replicas = workload["metadata"]["name"], int(workload["spec"]["replicas"])
    volumes = get(workload, "spec.template.spec.volumes")
    shared = {v["persistentVolumeClaim"]["claimName"] for v in volumes if "persistentVolumeClaim" in v}
    templates = [t["metadata"]["name"] for t in workload["spec"].get("volumeClaimTemplates", [])]
    # A template's claim replaces the pod volume of its name; both at once would be a conflict.
    assert not set(templates) & {v["name"] for v in volumes}, templates
    return {f"{name}-{i}": shared | {f"{t}-{name}-{i}" for t in templates} for i in range(replicas)}


def claim_modes(objs: list[Obj], values: dict[str, Any]) -> dict[str, set[str]]:
    """Claim name -> access modes: rendered claims, per-replica claims, and the existing claim as declared."""
    modes = {o["metadata"]["name"]: set(o["spec"]["accessModes"]) for o in objects(objs, "PersistentVolumeClaim")}
    workload = engine_workload(objs)
    for template in workload["spec"].get("volumeClaimTemplates", []):
        for i in range(int(workload["spec"]["replicas"])):
            modes[f"{template['metadata']['name']}-{workload['metadata']['name']}-{i}"] = set(
                template["spec"]["accessModes"]
            )
    weights = {**DEFAULTS["weights"], **values.get("weights", {})}
    if weights["source"] == "existingPvc":
        modes[weights["existingClaim"]] = {weights["existingClaimAccessMode"]}
    return modes


# Every ci/ scenario, and the replica counts of each weights source that render.
RENDERS: dict[str, dict[str, Any]] = {f"ci/{name}": scenario_values(name) for name in scenarios()} | {
    "newPvc x3": {"replicaCount": 3},
    "newPvc x2 glm53": {"profile": "glm53", "replicaCount": 2},
    "newPvc x3 ReadWriteOncePod": {"replicaCount": 3, "weights": {"newPvc": {"accessModes": ["ReadWriteOncePod"]}}},
    "existing ReadWriteMany x3": {
        "replicaCount": 3,
        "weights": {"source": "existingPvc", "existingClaim": "w", "existingClaimAccessMode": "ReadWriteMany"},
    },
    "existing ReadWriteOnce x1": {"weights": {"source": "existingPvc", "existingClaim": "w"}},
    "hostPath x3": {"replicaCount": 3, "weights": {"source": "hostPath", "hostPath": "/mnt/nvme/models"}},
    "none x3": {"replicaCount": 3, "weights": {"source": "none"}},
    "mock x3": {"replicaCount": 3, "mock": {"enabled": True}},
}


@pytest.mark.parametrize("name", sorted(RENDERS))
def test_no_two_pods_share_a_single_node_claim(name: str) -> None:
    values = RENDERS[name]
    objs = render(values)
    claims = pod_claims(objs)
    modes = claim_modes(objs, values)
    users: dict[str, list[str]] = {}
    for pod, mounted in claims.items():
        for claim in mounted:
            users.setdefault(claim, []).append(pod)
    for claim, pods in users.items():
        assert claim in modes, f"{claim} is mounted but neither rendered nor declared"
        if len(pods) > 1:
            assert modes[claim] <= MANY_NODES, f"{claim} ({sorted(modes[claim])}) is shared by {pods}"


def test_the_readme_scale_out_gives_each_replica_its_own_claim() -> None:
    """`helm install glm53 charts/glm53 --set profile=glm53 --set replicaCount=3 --set router.enabled=true`."""
    objs = render(scenario_values("scaleout"))
    sts = engine_workload(objs)
    assert (sts["kind"], sts["metadata"]["name"], sts["spec"]["replicas"]) == ("StatefulSet", RELEASE, 3)
    assert objects(objs, "PersistentVolumeClaim") == []  # no shared claim: the template makes one per replica
    [template] = sts["spec"]["volumeClaimTemplates"]
    assert template["metadata"]["name"] == "weights"
    assert template["spec"] == {"accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": "1Ti"}}}
    assert pod_claims(objs) == {f"{RELEASE}-{i}": {f"weights-{RELEASE}-{i}"} for i in range(3)}
    # The pod mounts the template's claim as its `weights` volume; its own volumes no longer carry one.
    assert "weights" not in {v["name"] for v in pod_spec(objs)["volumes"]}
    assert get(container(objs, "vllm"), "volumeMounts[name=weights].mountPath") == "/models"
    assert get(container(objs, "vllm"), "resources.limits.nvidia\\.com/gpu") == 8  # a whole node per replica


def test_the_statefulset_starts_replicas_together_and_never_surges() -> None:
    sts = engine_workload(render(scenario_values("scaleout")))
    spec = sts["spec"]
    assert spec["podManagementPolicy"] == "Parallel"
    # StatefulSet RollingUpdate: delete a pod, then create its replacement, one at a time (no surge pod asking for a
    # second TP-sized GPU set). Both values of updateStrategy.type render as this.
    assert spec["updateStrategy"] == {"type": "RollingUpdate"}
    rolling = engine_workload(render({**scenario_values("scaleout"), "updateStrategy": {"type": "RollingUpdate"}}))
    assert rolling["spec"]["updateStrategy"] == {"type": "RollingUpdate"}
    # The claims survive uninstall and scale-down like the single claim's helm.sh/resource-policy: keep.
    assert spec["persistentVolumeClaimRetentionPolicy"] == {"whenDeleted": "Retain", "whenScaled": "Retain"}


def test_the_claim_template_never_changes_with_the_chart_version_or_common_labels() -> None:
    """The API server refuses any change to volumeClaimTemplates, so a chart upgrade must render the same template."""
    plain = engine_workload(render({"replicaCount": 3}))
    labelled = engine_workload(render({"replicaCount": 3, "commonLabels": {"team": "inference"}}))
    assert plain["spec"]["volumeClaimTemplates"] == labelled["spec"]["volumeClaimTemplates"]
    labels = plain["spec"]["volumeClaimTemplates"][0]["metadata"]["labels"]
    assert labels == {
        "app.kubernetes.io/name": "glm53",
        "app.kubernetes.io/instance": RELEASE,
        "app.kubernetes.io/component": "weights",
        "app.kubernetes.io/part-of": "glm53",
    }


def test_the_service_pdb_and_router_still_select_the_replicas() -> None:
    objs = render(scenario_values("scaleout"))
    sts = engine_workload(objs)
    selector = get(sts, "spec.selector.matchLabels")
    assert selector.items() <= get(sts, "spec.template.metadata.labels").items()
    assert get(one(objs, "PodDisruptionBudget"), "spec.selector.matchLabels") == selector
    assert get(engine(objs, "Service"), "spec.selector") == selector
    router = get(objects(objs, "Deployment")[0], "spec.template.spec.containers[name=router].args")
    assert sorted(router[router.index("--selector") + 1 :][:3]) == sorted(f"{k}={v}" for k, v in selector.items())
    # The governing headless Service: per-replica DNS names, same pods.
    headless = [s for s in objects(objs, "Service") if s["metadata"]["name"] == HEADLESS]
    assert len(headless) == 1 and sts["spec"]["serviceName"] == HEADLESS
    assert get(headless[0], "spec.clusterIP") == "None"
    assert get(headless[0], "spec.selector") == selector


def test_the_service_monitor_scrapes_each_replica_once() -> None:
    """The headless Service has its own component label: selected by the ServiceMonitor, it would double every pod."""
    objs = render({**scenario_values("scaleout"), "monitoring": {"serviceMonitor": {"enabled": True}}})
    wanted = get(one(objs, "ServiceMonitor"), "spec.selector.matchLabels")
    scraped = [
        s["metadata"]["name"] for s in objects(objs, "Service") if wanted.items() <= s["metadata"]["labels"].items()
    ]
    assert scraped == [RELEASE]


def test_one_replica_keeps_the_deployment_and_its_single_claim() -> None:
    objs = render({})
    deployment = engine_workload(objs)
    assert deployment["kind"] == "Deployment" and objects(objs, "StatefulSet") == []
    assert [o["metadata"]["name"] for o in objects(objs, "PersistentVolumeClaim")] == [f"{RELEASE}-weights"]
    assert HEADLESS not in {s["metadata"]["name"] for s in objects(objs, "Service")}
    assert get(deployment, "spec.strategy") == {"type": "Recreate"}


def test_a_rolling_deployment_deletes_before_it_creates() -> None:
    """updateStrategy.type=RollingUpdate on the Deployment: maxSurge 0, since a surge pod never schedules on full
    GPU nodes (Kubernetes' default 25 % rounds up to one surge pod)."""
    objs = render({**scenario_values("scaleout-shared"), "updateStrategy": {"type": "RollingUpdate"}})
    assert get(engine_workload(objs), "spec.strategy") == {
        "type": "RollingUpdate",
        "rollingUpdate": {"maxSurge": 0, "maxUnavailable": 1},
    }


def test_shared_pre_staged_weights_stay_a_deployment() -> None:
    objs = render(scenario_values("scaleout-shared"))
    deployment = engine_workload(objs)
    assert (deployment["kind"], deployment["spec"]["replicas"]) == ("Deployment", 3)
    assert get(pod_spec(objs), "volumes[name=weights].persistentVolumeClaim") == {
        "claimName": "glm53-weights",
        "readOnly": True,
    }
    assert get(container(objs, "vllm"), "env[name=HF_HUB_OFFLINE].value") == "1"


def test_mock_replicas_stay_one_deployment_the_cpu_runners_can_read() -> None:
    """The loopback runner reads the engine Deployment (glm53.pod.plan) and provides only emptyDirs."""
    objs = render({"mock": {"enabled": True}, "replicaCount": 3})  # weights.source stays newPvc
    assert objects(objs, "StatefulSet") == [] and objects(objs, "PersistentVolumeClaim") == []
    pod = deployment_pod(objs)
    assert pod.name == RELEASE
    assert get(pod_spec(objs), "volumes[name=weights].emptyDir") == {}


def test_notes_name_the_statefulset_and_its_claims() -> None:
    text = notes(scenario_values("scaleout"))
    assert f"kubectl -n {NAMESPACE} exec sts/{RELEASE} -c vllm --" in text
    assert f"weights-{RELEASE}-<ordinal> (1Ti each), and downloads its own copy on first start" in text
    assert f"get pvc -l app.kubernetes.io/instance={RELEASE},app.kubernetes.io/component=weights" in text
    single = notes({})
    assert f"exec deploy/{RELEASE} -c vllm" in single and "its own weights claim" not in single
