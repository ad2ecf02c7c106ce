"""Start the real LMCache server and the engine stand-in as processes on loopback; deadlines instead of sleeps."""

from __future__ import annotations

import json
import os
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
from typing import Any

from glm53.testing.chart_sidecar import StandaloneSidecar, chart_sidecar
from glm53.testing.processes import kill_group, stop_group

DEADLINE = 30.0
SERVER_DEADLINE = 90.0  # the real server is ready in 3-7 s alone, much slower on a busy 2-core machine
FLASH_MODEL = "zai-org/GLM-5.3-Flash"
GLM53_MODEL = "zai-org/GLM-5.3"
DEV_MODE = {"VLLM_SERVER_DEV_MODE": "1"}


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class Process:
    """One child with stdout+stderr captured to a file, alone in its process group."""

    def __init__(self, argv: Sequence[str], log: Path, env: dict[str, str] | None = None) -> None:
        self.log = log
        self._out = open(log, "wb")  # noqa: SIM115 - closed in stop()
        self.proc = subprocess.Popen(
            list(argv),
            stdout=self._out,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            env={**os.environ, **(env or {})},
            start_new_session=True,
        )

    def text(self) -> str:
        return self.log.read_text(errors="replace")

    def lines(self) -> list[str]:
        return self.text().splitlines()

    def wait_for(self, needle: str, deadline: float = DEADLINE) -> str:
        """The first log line containing `needle`; fails (with the log) if the process exits or time runs out."""
        end = time.monotonic() + deadline
        while time.monotonic() < end:
            for line in self.lines():
                if needle in line:
                    return line
            if self.proc.poll() is not None:
                break
            time.sleep(0.05)
        raise AssertionError(f"no line with {needle!r} (exit {self.proc.poll()}); log:\n{self.text()[-4000:]}")

    def wait_count(self, needle: str, count: int, deadline: float = DEADLINE) -> None:
        """Until `count` log lines contain `needle`; fails (with the log) if the process exits or time runs out."""
        poll(lambda: sum(needle in line for line in self.lines()) >= count or self.proc.poll() is not None, needle)
        if sum(needle in line for line in self.lines()) < count:
            raise AssertionError(f"fewer than {count} lines with {needle!r}; log:\n{self.text()[-4000:]}")

    def wait_exit(self, deadline: float = DEADLINE) -> int:
        return self.proc.wait(timeout=deadline)

    def kill(self) -> None:
        """SIGKILL, as a crash ends a process; reaped at once."""
        kill_group(self.proc)
        self.proc.wait()

    def stop(self, grace: float = DEADLINE) -> int:
        try:
            return stop_group(self.proc, grace)
        finally:
            self._out.close()


def glm53(*args: str) -> list[str]:
    return [sys.executable, "-m", "glm53", *args]


@dataclass
class Server:
    """A running real `lmcache server`: its request port and its HTTP front."""

    process: Process
    sidecar: StandaloneSidecar

    @property
    def port(self) -> int:
        return self.sidecar.port

    @property
    def http_url(self) -> str:
        return self.sidecar.http_url

    def metrics(self) -> str:
        status, text = http(f"{self.http_url}/metrics")
        assert status == 200
        return str(text)


@contextmanager
def serving(sidecar: StandaloneSidecar, log: Path) -> Iterator[Server]:
    """`sidecar` running and healthy, logging to `log`; stopped on exit (unless it was stopped or killed before)."""
    server = Server(Process(sidecar.argv, log, sidecar.env), sidecar)
    try:
        poll(lambda: http(f"{server.http_url}/healthcheck")[0] == 200, "the LMCache /healthcheck", SERVER_DEADLINE)
        yield server
    finally:
        server.process.stop()


@contextmanager
def lmcache_server(tmp_path: Path, profile: str) -> Iterator[Server]:
    """The real server as `profile`'s pod runs it (the chart's sidecar, glm53.testing.chart_sidecar), healthy;
    stopped on exit. `serving(server.sidecar, ...)` starts it again on the same ports."""
    sidecar = chart_sidecar(profile, tmp_path)
    with serving(sidecar, tmp_path / f"lmcache-{sidecar.port}.log") as server:
        yield server


def connector_json(port: int, **extra: object) -> str:
    """The connector config the chart passes, with a short timeout so a dead LMCache costs seconds, not minutes."""
    config = {"lmcache.mp.host": "tcp://127.0.0.1", "lmcache.mp.port": port, "lmcache.mp.mq_timeout": 20.0, **extra}
    return json.dumps({"kv_connector": "LMCacheMPConnector", "kv_role": "kv_both", "kv_connector_extra_config": config})


def with_load_failure_policy(connector: str, policy: str) -> str:
    """`connector` with vLLM's `kv_load_failure_policy` set, as the chart renders it."""
    return json.dumps({**json.loads(connector), "kv_load_failure_policy": policy})


def vllm_args(
    model: str, profile: str, tp: int, port: int, lmcache_port: int, *extra: str, connector: str | None = None
) -> list[str]:
    """`connector`: the --kv-transfer-config JSON (default: `connector_json(lmcache_port)`)."""
    return glm53(
        "mock", "vllm", model, "--profile", profile, "--tensor-parallel-size", str(tp), "--port", str(port),
        "--enable-prefix-caching", "--kv-transfer-config", connector or connector_json(lmcache_port),
        "--load-seconds", "0.2", *extra,
    )  # fmt: skip


def http(url: str, body: object | None = None, timeout: float = 30.0) -> tuple[int, Any]:
    """(status, parsed JSON or text) for a GET, or a POST when `body` is given; HTTP errors are returned, not raised."""
    data = None if body is None else json.dumps(body).encode()
    request = urllib.request.Request(url, data=data, headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            status, raw = response.status, response.read()
    except urllib.error.HTTPError as error:
        status, raw = error.code, error.read()
    except OSError:
        return 0, None
    try:
        return status, json.loads(raw) if raw else None
    except json.JSONDecodeError:
        return status, raw.decode()


def poll(check: Callable[[], bool], what: str, deadline: float = DEADLINE) -> None:
    end = time.monotonic() + deadline
    while time.monotonic() < end:
        if check():
            return
        time.sleep(0.05)
    raise AssertionError(f"timed out waiting for {what}")


def metric(text: str, name: str) -> float:
    """The sum of every sample of `name` in a Prometheus text exposition (0 when none is exposed yet)."""
    total = 0.0
    for line in text.splitlines():
        if line.startswith(name + "{") or line.startswith(name + " "):
            total += float(line.rsplit(" ", 1)[1])
    return total


def complete(base_url: str, prompt: list[int], salt: str, **extra: object) -> dict[str, Any]:
    body = {"prompt": prompt, "max_tokens": 2, "temperature": 0, "logprobs": 1, "cache_salt": salt, **extra}
    status, reply = http(f"{base_url}/v1/completions", body)
    assert status == 200, reply
    assert isinstance(reply, dict)
    return reply


def reset(base_url: str, external: bool = False) -> None:
    assert http(f"{base_url}/reset_prefix_cache?reset_external={str(external).lower()}", {}) == (
        200,
        {"success": True},
    )


def cached_after_priming(base_url: str, length: int, salt: str) -> int:
    """Prime LMCache with a `length`-token prompt, drop vLLM's own cache, send it again: the cached tokens."""
    prompt = list(range(10, 10 + length))
    complete(base_url, prompt, salt)
    reset(base_url)
    return int(complete(base_url, prompt, salt)["usage"]["prompt_tokens_details"]["cached_tokens"])


@dataclass
class Engine:
    """A ready engine stand-in and its base URL."""

    process: Process
    base_url: str


@contextmanager
def engine(
    tmp_path: Path,
    model: str,
    profile: str,
    tp: int,
    server_port: int,
    *extra: str,
    name: str = "vllm",
    connector: str | None = None,
) -> Iterator[Engine]:
    port = free_port()
    argv = vllm_args(model, profile, tp, port, server_port, *extra, connector=connector)
    process = Process(argv, tmp_path / f"{name}.log", DEV_MODE)
    try:
        process.wait_for("Starting vLLM server on", DEADLINE * 2)
        yield Engine(process, f"http://127.0.0.1:{port}")
    finally:
        process.stop()
