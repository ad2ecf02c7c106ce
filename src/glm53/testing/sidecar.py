"""Run one `lmcache server` alone as a plain child, healthy before use: for tests and benchmarks, never for the pod.

The sidecar's flags are not defined here: the chart renders them (`charts/glm53/templates/engine/_lmcache.tpl`,
`glm53.lmcacheServerArgs`), and a test that needs the real server alone takes the rendered command line and
environment (`glm53.pod.plan`, moved onto free ports by `glm53.pod.loopback.relocate`). In the pod the server runs under
`glm53 supervise`; this module only starts a given argv, waits for its `/healthcheck` and stops it.
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path

from glm53.errors import Glm53Error
from glm53.pod.loopback import LOCALHOST


@contextmanager
def serving(
    argv: Sequence[str], env: Mapping[str, str], http_port: int, log: Path, start_timeout: float
) -> Iterator[subprocess.Popen[bytes]]:
    """Run `argv` with `env` added over this process's environment, wait until `/healthcheck` on `http_port`
    answers, and stop it (SIGTERM, then SIGKILL after 30 s) on leaving.

    A server that exits or stays silent fails in one line naming its log, rather than leaving a caller to time out.
    """
    health = f"http://{LOCALHOST}:{http_port}/healthcheck"
    with log.open("wb") as out:
        process = subprocess.Popen(list(argv), stdout=out, stderr=subprocess.STDOUT, env={**os.environ, **env})
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
