"""Run the rendered mock-mode pod on this machine: the chart's exact commands and probes, not a re-typed copy.

The sidecar, the engine and the exporter are started from the rendered container specs in the kubelet's order (the
engine only after the sidecar's startup probe passed), then the rendered startup, readiness and liveness probe commands
are executed as the kubelet would. Only what a pod gives for free is rewritten: the pod-local ports become free loopback
ports (tests never use fixed ports), 0.0.0.0 becomes 127.0.0.1, and the log volume becomes a temporary directory.
"""

from __future__ import annotations

import os
import re
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import pytest
from chartkit import Obj, container, get, render, scenario_values

PORTS = ("5555", "8080", "8000", "9400")
DEADLINE_S = 60.0


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


class Pod:
    """The rendered pod's processes, with the pod-local wiring rewritten for this machine."""

    def __init__(self, objs: list[Obj], log_dir: Path) -> None:
        self.objs = objs
        self.ports = {p: str(free_port()) for p in PORTS}
        self.log_dir = log_dir
        self.env = dict(os.environ, PATH=f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}")
        self.procs: list[subprocess.Popen[bytes]] = []

    def rewrite(self, args: Sequence[str]) -> list[str]:
        pattern = re.compile(r"\b(" + "|".join(PORTS) + r")\b")
        out = []
        for arg in args:
            arg = arg.replace("/var/log/glm53", str(self.log_dir)).replace("0.0.0.0", "127.0.0.1")
            out.append(pattern.sub(lambda m: self.ports[m.group(1)], arg))
        return out

    def start(self, name: str) -> None:
        c = container(self.objs, name)
        env = dict(self.env, **{e["name"]: e["value"] for e in c.get("env", []) if "value" in e})
        # tini is the container's PID 1 (it reaps, forwards signals); on this host the supervisor runs directly.
        command = c["command"][c["command"].index("--") + 1 :] if c["command"][0].endswith("/tini") else c["command"]
        cmd = self.rewrite([*command, *c["args"]])
        self.procs.append(subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT))

    def run_probe(self, name: str, probe: str) -> subprocess.CompletedProcess[str]:
        command = self.rewrite(get(container(self.objs, name), f"{probe}.exec.command"))
        return subprocess.run(command, env=self.env, capture_output=True, text=True, timeout=30, check=False)

    def wait_probe(self, name: str, probe: str) -> subprocess.CompletedProcess[str]:
        """Run a probe like the kubelet until it passes or the deadline is spent; the last run's result."""
        deadline = time.monotonic() + DEADLINE_S
        while True:
            done = self.run_probe(name, probe)
            if done.returncode == 0 or time.monotonic() > deadline:
                return done
            assert all(p.poll() is None for p in self.procs), f"a container exited while probing {name}: {done}"
            time.sleep(0.2)

    def stop(self) -> None:
        for proc in reversed(self.procs):  # engine first, sidecar last, like the kubelet
            proc.terminate()
            try:
                proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


@pytest.fixture
def run_pod(tmp_path: Path) -> Iterator[Any]:
    pods: list[Pod] = []

    def start(values: Mapping[str, Any]) -> Pod:
        pod = Pod(render({**values, "mock": {**values.get("mock", {}), "loadSeconds": 1}}), tmp_path)
        pods.append(pod)
        return pod

    yield start
    for pod in pods:
        pod.stop()


@pytest.mark.slow
@pytest.mark.parametrize("name", ["mock", "mock-glm53"])
def test_rendered_mock_pod_starts_and_passes_its_probes(name: str, run_pod: Any) -> None:
    pod: Pod = run_pod(scenario_values(name))
    pod.start("lmcache")
    sidecar = pod.wait_probe("lmcache", "startupProbe")
    assert sidecar.returncode == 0, sidecar.stderr
    pod.start("vllm")  # only now: the native sidecar's startup probe gates the engine
    startup = pod.wait_probe("vllm", "startupProbe")
    assert startup.returncode == 0, startup.stdout + startup.stderr
    assert startup.stdout.startswith("ready:"), startup.stdout
    # The geometry lines precede the API server's start, so readiness may need a period or two, as on a kubelet.
    readiness = pod.wait_probe("vllm", "readinessProbe")
    assert readiness.returncode == 0, readiness.stderr
    assert pod.run_probe("lmcache", "livenessProbe").returncode == 0
    base = f"http://127.0.0.1:{pod.ports['8000']}"
    with urllib.request.urlopen(f"{base}/health", timeout=5) as health:  # the liveness probe's httpGet
        assert health.status == 200
    if any(c["name"] == "exporter" for c in get(pod.objs, "[kind=Deployment].spec.template.spec.containers")):
        pod.start("exporter")
        deadline = time.monotonic() + DEADLINE_S
        while True:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{pod.ports['9400']}/metrics", timeout=5) as metrics:
                    assert b"glm53_" in metrics.read()
                    break
            except OSError:
                assert time.monotonic() < deadline, "the exporter never served /metrics"
                time.sleep(0.2)
