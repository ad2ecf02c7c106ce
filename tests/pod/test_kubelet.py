"""The kubelet's after-Ready duties on the loopback runner (`glm53.pod.kubelet`): restarts with back-off, liveness.

Real processes on this machine: pods made of shell commands (`pod_from_spec`, the reader the chart's pods go through)
run by `glm53.pod.loopback.running_pod`, so what is checked is the runner a fault plays out on.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path
from typing import Any

import pytest

from glm53.pod.kubelet import BACKOFF_MAX_S, backoff_s, kubelet, restarts_on_exit
from glm53.pod.loopback import quiet, running_pod, wait_probe
from glm53.pod.plan import HttpGetProbe, pod_from_spec

pytestmark = pytest.mark.timeout(120)


def container(name: str, script: str, **extra: Any) -> dict[str, Any]:
    return {"name": name, "image": "x", "command": [sys.executable, "-c", script], **extra}


def exec_probe(script: str, period: int = 1, threshold: int = 2) -> dict[str, Any]:
    return {"exec": {"command": [sys.executable, "-c", script]}, "periodSeconds": period, "failureThreshold": threshold}


def wait_until(condition: Any, within_s: float) -> None:
    deadline = time.monotonic() + within_s
    while not condition():
        assert time.monotonic() < deadline, "condition not met in time"
        time.sleep(0.1)


def test_the_back_off_is_the_kubelets() -> None:
    assert [backoff_s(n) for n in range(8)] == [0, 10, 20, 40, 80, 160, 300, 300]
    assert BACKOFF_MAX_S == 300


def test_sidecars_always_restart_and_main_containers_per_the_pods_policy() -> None:
    spec = {
        "initContainers": [container("side", "pass", restartPolicy="Always")],
        "containers": [container("main", "pass")],
        "restartPolicy": "Never",
    }
    plan = pod_from_spec("p", spec)
    assert restarts_on_exit(plan.container("side"), plan.restart_policy)
    assert not restarts_on_exit(plan.container("main"), plan.restart_policy)
    assert restarts_on_exit(plan.container("main"), "Always")


def test_an_exited_sidecar_is_started_again_at_once_and_then_after_the_back_off(tmp_path: Path) -> None:
    starts = tmp_path / "starts"
    # Appends one line per start, lives a second, exits 3: a crash loop.
    script = f"import time; open({str(starts)!r}, 'a').write('x\\n'); time.sleep(1); raise SystemExit(3)"
    spec = {
        "initContainers": [container("side", script, restartPolicy="Always")],
        "containers": [container("main", "import time; time.sleep(60)")],
    }
    said: list[str] = []
    with running_pod(pod_from_spec("p", spec), tmp_path, quiet) as pod, kubelet(pod, said.append) as loop:
        wait_until(lambda: starts.exists() and len(starts.read_text().splitlines()) >= 2, 10)
        first = loop.restarts[0]
        assert first.container == "side" and "exited with status 3; back-off 0 s" in first.reason
        time.sleep(3)  # the second exit waits 10 s
        assert len(starts.read_text().splitlines()) == 2
        assert "back-off 10 s" in loop.restarts[1].reason
        assert pod.process("main").process.poll() is None  # the main container was never touched
    assert any("restarting side" in line for line in said)


def test_a_restart_keeps_the_instant_it_was_noticed_unrounded(tmp_path: Path) -> None:
    """A fault row counts the restarts at or after its injection; an exit noticed 40 ms after a fault injected at
    7.03 s rounded to tenths (7.0 s) fell before it, and a CI run's kill row said 'none' restarted."""
    spec = {
        "initContainers": [container("side", "raise SystemExit(1)", restartPolicy="Always")],
        "containers": [container("main", "import time; time.sleep(60)")],
    }
    with running_pod(pod_from_spec("p", spec), tmp_path, quiet) as pod, kubelet(pod, quiet, clock=lambda: 7.07) as loop:
        wait_until(lambda: bool(loop.restarts), 10)
    assert loop.restarts[0].at_s == 7.07


def test_a_held_restart_waits_as_long_as_asked(tmp_path: Path) -> None:
    spec = {
        "initContainers": [container("side", "import time; time.sleep(60)", restartPolicy="Always")],
        "containers": [container("main", "import time; time.sleep(60)")],
    }
    with running_pod(pod_from_spec("p", spec), tmp_path, quiet) as pod, kubelet(pod, quiet) as loop:
        first = pod.process("side")
        loop.hold_next_restart("side", 2.0)
        first.process.kill()
        started = time.monotonic()
        wait_until(lambda: pod.process("side") is not first, 10)
        assert time.monotonic() - started >= 2.0
        assert "back-off 2 s" in loop.restarts[0].reason


def test_a_failing_liveness_probe_kills_and_restarts_the_container(tmp_path: Path) -> None:
    flag = tmp_path / "sick"
    probe = exec_probe(f"import os, sys; sys.exit(1 if os.path.exists({str(flag)!r}) else 0)")
    spec = {
        "initContainers": [
            container("side", "import time; time.sleep(60)", restartPolicy="Always", livenessProbe=probe)
        ],
        "containers": [container("main", "import time; time.sleep(60)")],
    }
    said: list[str] = []
    with running_pod(pod_from_spec("p", spec), tmp_path, quiet) as pod, kubelet(pod, said.append) as loop:
        time.sleep(2.5)
        assert loop.restarts == []  # a passing liveness probe does nothing
        first = pod.process("side")
        flag.write_text("")
        wait_until(lambda: pod.process("side") is not first, 15)
        flag.unlink()
        assert first.process.returncode is not None
        assert any("liveness probe failed 2 times" in line for line in said)


def test_a_timed_out_startup_probe_spends_an_attempt_and_is_no_verdict(tmp_path: Path) -> None:
    """A CI run's startup probe took over its 10 s on a loaded machine and the runner took the timeout for the probe's
    final 'wrong' verdict; the kubelet counts it as one failed attempt (KEP-1972)."""
    attempts = tmp_path / "attempts"
    # The first attempt sleeps past the 1 s timeout; the second passes.
    script = (
        f"import time; from pathlib import Path; p = Path({str(attempts)!r}); n = len(p.read_text()) if p.exists() "
        "else 0; p.write_text('x' * (n + 1)); time.sleep(5 if n == 0 else 0); print('ready')"
    )
    probe = {**exec_probe(script, threshold=3), "timeoutSeconds": 1}
    spec = {"containers": [container("main", "import time; time.sleep(60)", startupProbe=probe)]}
    plan = pod_from_spec("p", spec)
    startup = plan.container("main").startup_probe
    assert startup is not None
    said: list[str] = []
    with running_pod(plan, tmp_path, quiet) as pod:
        line = wait_probe(pod, "main", startup, said.append, "startup probe", gives_up=lambda code: code != 3)
    assert line == "ready"
    assert said == ["pod: startup probe 1/3: probe timed out after 1 s"]


def test_an_http_liveness_probe_is_read_from_the_spec_with_its_named_port() -> None:
    spec = {
        "containers": [
            container(
                "main",
                "pass",
                ports=[{"name": "http", "containerPort": 8000}],
                livenessProbe={"httpGet": {"path": "/health", "port": "http"}, "periodSeconds": 15},
            )
        ]
    }
    probe = pod_from_spec("p", spec).container("main").liveness_probe
    assert probe == HttpGetProbe("/health", 8000, 15.0, 1.0, 3)
