"""Start the mock servers as real processes on loopback and watch their logs, with deadlines instead of sleeps."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from glm53.logparse import Record, parse_line

DEADLINE = 20.0
FLASH_MODEL = "zai-org/GLM-5.3-Flash"
GLM53_MODEL = "zai-org/GLM-5.3"


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class MockProcess:
    """One `glm53 ...` child with stdout+stderr captured to a file."""

    def __init__(self, args: Sequence[str], log: Path, env: dict[str, str] | None = None) -> None:
        self.log = log
        self._out = open(log, "wb")  # noqa: SIM115 - closed in stop()
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "glm53", *args],
            stdout=self._out,
            stderr=subprocess.STDOUT,
            env={**os.environ, **(env or {})},
        )

    def text(self) -> str:
        return self.log.read_text(errors="replace")

    def lines(self) -> list[str]:
        return self.text().splitlines()

    def records(self) -> list[Record]:
        return [r for r in map(parse_line, self.lines()) if r is not None]

    def wait_for(self, needle: str, deadline: float = DEADLINE) -> str:
        """The first log line containing `needle`; fails (with the log) if the process exits or time runs out."""
        end = time.monotonic() + deadline
        while time.monotonic() < end:
            for line in self.lines():
                if needle in line:
                    return line
            if self.proc.poll() is not None:
                break
            time.sleep(0.02)
        raise AssertionError(f"no line with {needle!r} (exit {self.proc.poll()}); log:\n{self.text()}")

    def wait_exit(self, deadline: float = DEADLINE) -> int:
        return self.proc.wait(timeout=deadline)

    def stop(self) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        try:
            return self.proc.wait(timeout=DEADLINE)
        finally:
            if self.proc.poll() is None:
                self.proc.kill()
                self.proc.wait()
            self._out.close()


@contextmanager
def running(args: Sequence[str], log: Path, env: dict[str, str] | None = None) -> Iterator[MockProcess]:
    process = MockProcess(args, log, env)
    try:
        yield process
    finally:
        process.stop()


def lmcache_args(port: int, http_port: int, prometheus_port: int, *extra: str) -> list[str]:
    return [
        "mock", "lmcache", "--port", str(port), "--http-port", str(http_port),
        "--prometheus-port", str(prometheus_port), *extra,
    ]  # fmt: skip


def connector_json(port: int, **extra: object) -> str:
    """The connector config the chart passes, with a short timeout so a dead LMCache costs seconds, not minutes."""
    config = {"lmcache.mp.host": "tcp://127.0.0.1", "lmcache.mp.port": port, "lmcache.mp.mq_timeout": 2.0, **extra}
    return json.dumps({"kv_connector": "LMCacheMPConnector", "kv_role": "kv_both", "kv_connector_extra_config": config})


def vllm_args(model: str, profile: str, tp: int, port: int, lmcache_port: int, *extra: str) -> list[str]:
    return [
        "mock", "vllm", model, "--profile", profile, "--tensor-parallel-size", str(tp), "--port", str(port),
        "--enable-prefix-caching", "--kv-transfer-config", connector_json(lmcache_port), "--load-seconds", "0.2",
        *extra,
    ]  # fmt: skip


def http(url: str, body: object | None = None, timeout: float = 10.0) -> tuple[int, Any]:
    """(status, parsed JSON or text) for a GET, or a POST when `body` is given; HTTP errors are returned, not raised."""
    data = None if body is None else json.dumps(body).encode()
    request = urllib.request.Request(url, data=data, headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            status, raw = response.status, response.read()
    except urllib.error.HTTPError as error:
        status, raw = error.code, error.read()
    try:
        return status, json.loads(raw) if raw else None
    except json.JSONDecodeError:
        return status, raw.decode()


def poll(check: Callable[[], bool], what: str, deadline: float = DEADLINE) -> None:
    end = time.monotonic() + deadline
    while time.monotonic() < end:
        if check():
            return
        time.sleep(0.02)
    raise AssertionError(f"timed out waiting for {what}")


def metric(text: str, name: str) -> float:
    """The sum of every sample of `name` in a Prometheus text exposition."""
    total, found = 0.0, False
    for line in text.splitlines():
        if line.startswith(name + "{") or line.startswith(name + " "):
            total += float(line.rsplit(" ", 1)[1])
            found = True
    assert found, f"metric {name} not exposed"
    return total


@dataclass
class Pair:
    """A ready mock LMCache + mock vLLM pair."""

    lmcache: MockProcess
    vllm: MockProcess
    base_url: str
    lmcache_metrics_url: str


def start_lmcache(tmp_path: Path, *extra: str, name: str = "lmcache") -> tuple[MockProcess, int, int, int]:
    """A mock LMCache server that has logged its listeners; (process, port, http port, prometheus port)."""
    port, http_port, prometheus_port = free_port(), free_port(), free_port()
    process = MockProcess(lmcache_args(port, http_port, prometheus_port, *extra), tmp_path / f"{name}.log")
    process.wait_for("LMCache MP server listening on")
    return process, port, http_port, prometheus_port


class PairFactory(Protocol):
    def __call__(
        self,
        model: str,
        profile: str,
        tp: int,
        lmcache_flags: Sequence[str],
        vllm_flags: Sequence[str] = (),
        env: dict[str, str] | None = None,
    ) -> Pair: ...
