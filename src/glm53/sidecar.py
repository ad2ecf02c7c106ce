"""The LMCache sidecar's command line: one builder that the CPU pod, the container pod and the chart helper all match.

The sidecar is the real `lmcache server` (LMCache 0.5.6, multiprocess mode) everywhere: on the GPU pod, in the CPU pod
of the main job and in the mock image. Its flags are the ones the chart renders
(`charts/glm53/templates/_helpers.tpl`, `glm53.lmcacheServerArgs`): both endpoints on loopback (the admin HTTP API has
no authentication), the chunk size passed explicitly (0.5.6 cannot negotiate it), `--separate-object-groups` for
hybrid models (0.5.6 defaults it off), and `/run_script` (remote code execution) switched off by name. `--shm-name`
puts the L1 pool in `/dev/shm` instead of the process heap, which is what keeps a CPU pod's RSS low. The server also
sends a usage report at start unless told not to, so the environment carries both of LMCache's opt-outs.
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from glm53.errors import Glm53Error

# lmcache 0.5.6 lmcache/usage_telemetry/identity.py:38-40: either switch disables the start-up usage report.
LMCACHE_TELEMETRY_ENV = {"LMCACHE_TRACK_USAGE": "false", "DO_NOT_TRACK": "1"}
LOOPBACK = "127.0.0.1"


@dataclass(frozen=True)
class SidecarCommand:
    """What to run and with which extra environment (added to the inherited one)."""

    argv: tuple[str, ...]
    env: dict[str, str]


def lmcache_server_command(
    program: tuple[str, ...],
    *,
    port: int,
    http_port: int,
    chunk_size: int | None,
    separate_object_groups: bool,
    l1_size_gb: float,
    eviction_policy: str = "LRU",
    shm_name: str | None = None,
) -> SidecarCommand:
    """`program` (e.g. `("lmcache", "server")`) followed by the chart's sidecar flags, and the telemetry opt-outs."""
    argv = [*program, "--host", LOOPBACK, "--port", str(port)]
    if chunk_size is not None:
        argv += ["--chunk-size", str(chunk_size)]
    if separate_object_groups:
        argv.append("--separate-object-groups")
    argv += ["--l1-size-gb", f"{l1_size_gb:g}", "--eviction-policy", eviction_policy]
    argv += ["--http-host", LOOPBACK, "--http-port", str(http_port), "--no-run-script-api-enabled"]
    if shm_name is not None:
        argv += ["--shm-name", shm_name]
    return SidecarCommand(tuple(argv), dict(LMCACHE_TELEMETRY_ENV))


@contextmanager
def serving(
    command: SidecarCommand, http_port: int, log: Path, start_timeout: float, extra_env: dict[str, str] | None = None
) -> Iterator[subprocess.Popen[bytes]]:
    """Run `command` as a plain child (for benchmarks and test fixtures; the pod runs it under `glm53 supervise`),
    wait until `/healthcheck` on `http_port` answers, and stop it (SIGTERM, then SIGKILL after 30 s) on leaving.

    A server that exits or stays silent fails in one line naming its log, rather than leaving a caller to time out.
    """
    health = f"http://{LOOPBACK}:{http_port}/healthcheck"
    env = {**os.environ, **command.env, **(extra_env or {})}
    with log.open("wb") as out:
        process = subprocess.Popen(command.argv, stdout=out, stderr=subprocess.STDOUT, env=env)
        try:
            _wait_healthy(health, process, log, start_timeout)
            yield process
        finally:
            process.send_signal(signal.SIGTERM)
            try:
                process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()


def _wait_healthy(url: str, process: subprocess.Popen[bytes], log: Path, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if process.poll() is not None:
            tail = log.read_text(errors="replace").splitlines()[-5:]
            raise Glm53Error(f"lmcache server exited with {process.returncode}: {' | '.join(tail)}")
        try:
            with urllib.request.urlopen(url, timeout=2.0):
                return
        except (OSError, urllib.error.URLError):
            time.sleep(0.2)
    raise Glm53Error(f"lmcache server did not answer {url} within {timeout:g} s; see {log}")
