"""The chart's LMCache sidecar, ready to run alone on loopback: what tests start when they need the real server.

The chart is the sidecar's one definition (`glm53.lmcacheServerArgs` in charts/glm53/templates/engine/_lmcache.tpl), so
a test takes the command line and environment of the rendered mock-mode pod (what `glm53 pod` runs for the profile)
instead of building its own; the loopback runner's one rewrite (`glm53.pod.loopback.relocate`) moves its ports to free
ones. The chart passes no `--shm-name`, so the server keeps its L1 pool in process memory (lmcache 0.5.6
lmcache/v1/multiprocess/config.py:476-484: default "", SHM off, a segment only engine-driven transfers use); the tests
move KV data in lmcache-driven mode.

Shared by tests (tests/mock, tests/exporter, `python -m tests.support.real_lmcache`, which captures a fixture) and
benchmarks/l2_bench.py. Its own module, not `glm53.testing.sidecar`'s: rendering imports the chart's toolchain, which
the GPU proof's bare host, a user of that module, does not have.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from pathlib import Path

from glm53.pod.contract import SIDECAR_CONTAINER
from glm53.pod.loopback import LOCALHOST, container_env, relocate, relocation_for
from glm53.pod.main_job import PodOptions, render_plans
from glm53.pod.plan import PodPlan
from glm53.profiles import get_profile


@dataclass(frozen=True)
class StandaloneSidecar:
    """The rendered `lmcache server` command, its full environment, and the loopback ports it will listen on."""

    argv: tuple[str, ...]
    env: dict[str, str]
    port: int
    http_port: int

    @property
    def http_url(self) -> str:
        """The server's HTTP front: /healthcheck and /metrics."""
        return f"http://{LOCALHOST}:{self.http_port}"


@functools.cache
def _serving_pod(profile: str) -> PodPlan:
    """The profile's mock-mode serving pod, rendered once per test session (a render takes about 0.3 s)."""
    return render_plans(PodOptions(get_profile(profile))).serving


def chart_sidecar(profile: str, workdir: Path) -> StandaloneSidecar:
    """The `lmcache server` of `profile`'s pod as the chart renders it, on free loopback ports (fresh on each call)."""
    pod = _serving_pod(profile)
    sidecar = relocate(pod, relocation_for(pod, workdir)).container(SIDECAR_CONTAINER)
    return StandaloneSidecar(
        argv=sidecar.served_argv,
        env=container_env(sidecar),
        port=int(sidecar.option("--port")),
        http_port=int(sidecar.option("--http-port")),
    )
