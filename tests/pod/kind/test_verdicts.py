"""Judging what the cluster reports: readiness milestones, stuck and restarted containers, the geometry the logs show,
and the failure report, fed with pods, events and logs as the Kubernetes API returns them.
"""

from __future__ import annotations

from pathlib import PurePath
from typing import Any

from glm53.pod.kind import verdicts
from glm53.probe.logparse import parse_lines
from glm53.profiles import get_profile
from tests.support.kindkit import RUNNING, FakeReader, example_log, pod


def test_readiness_prints_each_milestone_once_with_its_duration() -> None:
    tracker = verdicts.ReadinessTracker(start=100.0)
    snapshots = [
        (101.5, pod(conditions={"PodScheduled": "True"})),
        (104.0, pod(conditions={"PodScheduled": "True"}, sidecar={"started": True, **RUNNING})),
        (104.5, pod(conditions={"PodScheduled": "True"}, sidecar={"started": True, **RUNNING})),
        (105.0, pod(conditions={"PodScheduled": "True"}, sidecar={"started": True}, engine=RUNNING)),
        (
            112.0,
            pod(
                conditions={"PodScheduled": "True", "Ready": "True"},
                sidecar={"started": True},
                engine={"started": True, **RUNNING},
                phase="Running",
            ),
        ),
    ]
    lines = []
    for now, snapshot in snapshots:
        assert not tracker.ready()
        lines += tracker.observe(snapshot, now)
    assert tracker.ready()
    assert lines == [
        "glm53-flash-7d9f-abcde: scheduled (+1.5s, 1.5s total)",
        "glm53-flash-7d9f-abcde: sidecar lmcache started (+2.5s, 4.0s total)",
        "glm53-flash-7d9f-abcde: vllm running (+1.0s, 5.0s total)",
        "glm53-flash-7d9f-abcde: startup probe passed (+7.0s, 12.0s total)",
        "glm53-flash-7d9f-abcde: Ready (+0.0s, 12.0s total)",
    ]


def test_stuck_and_restarted_containers_fail_at_once() -> None:
    pulling = pod(sidecar={"state": {"waiting": {"reason": "ErrImageNeverPull", "message": "image not present"}}})
    assert verdicts.pod_failure(pulling) == (
        "container lmcache of pod glm53-flash-7d9f-abcde is stuck in ErrImageNeverPull: image not present"
    )
    restarted = pod(engine={"restartCount": 1, "lastState": {"terminated": {"exitCode": 137, "reason": "Error"}}})
    assert verdicts.pod_failure(restarted) == (
        "container vllm of pod glm53-flash-7d9f-abcde restarted 1 time(s) (last exit code 137, reason Error); "
        "a failed startup probe restarts the engine"
    )
    assert verdicts.pod_failure(pod(engine={"state": {"waiting": {"reason": "ContainerCreating"}}})) is None


def test_pending_summary_names_what_is_missing_and_why() -> None:
    unschedulable = pod()
    unschedulable["status"]["conditions"] = [
        {"type": "PodScheduled", "status": "False", "reason": "Unschedulable", "message": "0/1 nodes are available"}
    ]
    assert verdicts.pending_summary(unschedulable) == (
        "pod glm53-flash-7d9f-abcde reached [nothing], not [scheduled, sidecar lmcache started, vllm running, "
        "startup probe passed, Ready] (Unschedulable: 0/1 nodes are available)"
    )


def test_only_the_pod_with_the_engine_is_the_serving_pod() -> None:
    test_pod = {"spec": {"containers": [{"name": "validate"}]}}
    assert verdicts.is_serving_pod(pod())
    assert not verdicts.is_serving_pod(test_pod)


def test_geometry_is_shown_once_per_fact_and_compared_with_the_profile() -> None:
    flash, healthy = get_profile("glm53-flash"), list(parse_lines(example_log("healthy")))
    geometry = "geometry: group_tokens_per_block=[1152, 1152, 1152, 1152, 1152, 0], scheduler_block_size=1152"
    assert verdicts.geometry_lines(healthy, flash) == [
        "unified block size N = 1152 tokens",
        f"{geometry} (as expected)",
    ]
    assert verdicts.geometry_lines(healthy, get_profile("glm53")) == [
        "unified block size N = 1152 tokens",
        f"{geometry} (expected [64])",
    ]
    assert verdicts.geometry_lines(parse_lines(example_log("wrong-chunk")), flash)[2:] == [
        "problem: vLLM's engine died (EngineCore failed to start)",
        "problem: the connector refused chunk size 256 (must be a multiple of 1152)",
        "problem: vLLM's engine died (Engine core initialization failed)",
    ]
    assert "problem: vLLM cannot reach the LMCache server at tcp://localhost:5555" in verdicts.geometry_lines(
        parse_lines(example_log("sidecar-unreachable")), flash
    )
    assert verdicts.geometry_lines([], flash) == ["geometry: no geometry line in the engine's log yet"]


# ------------------------------------------------------------------------------------------------------ artifacts


def event(time: str, reason: str, name: str, message: str, kind: str = "Warning") -> dict[str, Any]:
    return {
        "lastTimestamp": time,
        "type": kind,
        "reason": reason,
        "count": 3,
        "involvedObject": {"kind": "Pod", "name": name},
        "message": message,
    }


def test_artifacts_hold_describe_events_and_every_container_log() -> None:
    serving = pod(
        sidecar={"started": True, **RUNNING},
        engine={"restartCount": 2, "lastState": {"terminated": {"exitCode": 1, "reason": "Error"}}},
    )
    tester = {
        "metadata": {"name": "glm53-flash-validate", "namespace": "glm53-smoke"},
        "spec": {"containers": [{"name": "validate", "image": "glm53/mock:kind-smoke"}]},
        "status": {"phase": "Pending"},
    }
    events = [
        event("2026-11-29T07:00:30Z", "Unhealthy", serving["metadata"]["name"], "Startup probe failed: NOT-YET"),
        event(
            "2026-11-29T07:00:02Z", "Pulled", serving["metadata"]["name"], "Container image already present", "Normal"
        ),
        event("2026-11-29T07:00:40Z", "Scheduled", "glm53-flash-validate", "Successfully assigned", "Normal"),
    ]
    name = serving["metadata"]["name"]
    logs = {f"{name}/lmcache": "lmcache up\n", f"{name}/vllm": "engine log\n", f"{name}/vllm/previous": "died\n"}
    reader = FakeReader([serving, tester], events, logs)
    artifacts = {str(a.path): a.text for a in verdicts.collect_artifacts(reader, "glm53-smoke")}
    assert sorted(artifacts) == [
        "events.txt",
        f"{name}/describe.txt",
        f"{name}/lmcache.log",
        f"{name}/vllm.log",
        f"{name}/vllm.previous.log",
        "glm53-flash-validate/describe.txt",
        "glm53-flash-validate/validate.log",
    ]
    assert reader.asked == [f"{name}/lmcache", f"{name}/vllm", f"{name}/vllm/previous", "glm53-flash-validate/validate"]
    assert artifacts[f"{name}/vllm.previous.log"] == "died\n"
    assert artifacts["glm53-flash-validate/validate.log"] == (
        '(could not read the log of container validate: (400) Bad Request: container "validate" in pod '
        '"glm53-flash-validate" is waiting to start)\n'
    )
    assert artifacts["events.txt"].splitlines() == [
        f"2026-11-29T07:00:02Z  Normal  Pulled  Pod/{name}  x3  Container image already present",
        f"2026-11-29T07:00:30Z  Warning  Unhealthy  Pod/{name}  x3  Startup probe failed: NOT-YET",
        "2026-11-29T07:00:40Z  Normal  Scheduled  Pod/glm53-flash-validate  x3  Successfully assigned",
    ]
    describe = artifacts[f"{name}/describe.txt"]
    assert "Container lmcache (init/sidecar): image glm53/mock:kind-smoke" in describe
    assert "Container vllm (container): image glm53/mock:kind-smoke" in describe
    assert "  restarts: 2  last state: {'terminated': {'exitCode': 1, 'reason': 'Error'}}" in describe
    assert "  startupProbe: {'exec': {'command': ['glm53']}}" in describe
    assert describe.endswith(
        f"Events:\n2026-11-29T07:00:02Z  Normal  Pulled  Pod/{name}  x3  Container image already present\n"
        f"2026-11-29T07:00:30Z  Warning  Unhealthy  Pod/{name}  x3  Startup probe failed: NOT-YET\n"
    )


def test_artifacts_of_an_empty_namespace_still_say_so() -> None:
    artifacts = verdicts.collect_artifacts(FakeReader([], [], {}), "glm53-smoke")
    assert artifacts == [verdicts.Artifact(PurePath("events.txt"), "(no events)\n")]
