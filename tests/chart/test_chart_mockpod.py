"""The CI scenarios' mock-mode pods, run on this machine by the loopback runner: the chart's exact commands and probes.

`glm53.pod.loopback` is the runner of the main job; here it runs the pods of `ci/mock-values.yaml` and
`ci/mock-glm53-values.yaml` as rendered (only their load time shortened), so a scenario whose pod cannot start or
whose probes cannot pass fails here, not first on kind. The sidecar gates the engine, the startup and readiness probes
are the rendered exec commands, and the engine's liveness probe (an httpGet) is its `/health`.
"""

from __future__ import annotations

import urllib.request
from pathlib import Path

import pytest

from glm53.pod.loopback import quiet, running_pod, wait_probe
from glm53.pod.main_job import PodAddresses
from glm53.pod.plan import deployment_pod
from tests.support.chartkit import render, scenario_values

DEADLINE_S = 60.0


@pytest.mark.slow
@pytest.mark.parametrize("name", ["mock", "mock-glm53"])
def test_rendered_mock_pod_starts_and_passes_its_probes(name: str, tmp_path: Path) -> None:
    values = scenario_values(name)
    plan = deployment_pod(render({**values, "mock": {**values.get("mock", {}), "loadSeconds": 1}}))
    with running_pod(plan, tmp_path, quiet) as pod:
        assert "lmcache" in pod.startup_seconds, "the native sidecar's startup probe gates the engine"
        engine = pod.plan.container("vllm")
        assert engine.startup_probe is not None and engine.readiness_probe is not None
        ready = wait_probe(pod, "vllm", engine.startup_probe, quiet, "startup probe")
        assert ready.startswith("ready:"), ready
        # The geometry lines precede the API server's start, so readiness may need a period or two, as on a kubelet.
        wait_probe(pod, "vllm", engine.readiness_probe, quiet, "readiness probe", within_s=DEADLINE_S)
        urls = PodAddresses.of(pod.plan)
        with urllib.request.urlopen(f"{urls.vllm}/health", timeout=5) as health:  # the liveness probe's httpGet
            assert health.status == 200
        pod.check_running()
