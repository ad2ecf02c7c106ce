"""The two fences the chart puts around LMCache's lazy heartbeats: the sidecar's hold on a restart, and the probe's
warm-up request. Real processes: `glm53 supervise` and `glm53 probe startup` as the kubelet runs them, the warm-up
answered by a completions endpoint on loopback that records what it was sent.
"""

from __future__ import annotations

import http.server
import json
import os
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from glm53.probe.warmup import WARM_UP_SALT

REPO = Path(__file__).resolve().parents[2]
HEALTHY = REPO / "examples" / "logs" / "glm53-flash" / "healthy"


def supervise(log: Path, hold: str, *command: str) -> subprocess.CompletedProcess[str]:
    argv = [sys.executable, "-m", "glm53", "supervise", "--log", str(log), "--hold-after-restart", hold, "--", *command]
    return subprocess.run(argv, capture_output=True, text=True, check=False, timeout=60)


def test_the_first_start_is_not_held_and_a_restart_in_the_same_pod_is(tmp_path: Path) -> None:
    log = tmp_path / "lmcache.log"
    started = time.monotonic()
    first = supervise(log, "2", sys.executable, "-c", "print('server up')")
    assert first.returncode == 0 and time.monotonic() - started < 2
    started = time.monotonic()
    second = supervise(log, "2", sys.executable, "-c", "print('server up')")
    assert second.returncode == 0 and time.monotonic() - started >= 2
    assert "start 2 of this container in this pod: holding 2 s" in second.stdout
    assert log.read_text().count("server up") == 2 and "holding 2 s" in log.read_text()
    assert (tmp_path / "lmcache.log.starts").read_text() == "2\n"


def test_a_zero_hold_never_waits(tmp_path: Path) -> None:
    log = tmp_path / "lmcache.log"
    for _ in range(2):
        result = supervise(log, "0", sys.executable, "-c", "pass")
        assert result.returncode == 0 and "holding" not in result.stdout


@pytest.mark.parametrize("value", ["-1", "nan", "soon"])
def test_a_bad_hold_is_one_line_and_exit_2(tmp_path: Path, value: str) -> None:
    result = supervise(tmp_path / "x.log", value, "true")
    assert result.returncode == 2 and len(result.stderr.strip().splitlines()) == 1


class Engine(http.server.ThreadingHTTPServer):
    """A completions endpoint that records each request body and answers with `status`."""

    def __init__(self, status: int) -> None:
        self.status = status
        self.bodies: list[dict[str, Any]] = []
        self.headers_seen: list[dict[str, str]] = []
        super().__init__(("127.0.0.1", 0), Handler)


class Handler(http.server.BaseHTTPRequestHandler):
    server: Engine

    def do_POST(self) -> None:
        length = int(self.headers["Content-Length"])
        self.server.bodies.append(json.loads(self.rfile.read(length)))
        self.server.headers_seen.append(dict(self.headers))
        answer = {"choices": [{"text": "x"}]} if self.server.status == 200 else {"error": "no"}
        payload = json.dumps(answer).encode()
        self.send_response(self.server.status)
        self.send_header("Content-Length", str(len(payload)))
        self.end_headers()
        self.wfile.write(payload)

    def log_message(self, *_args: Any) -> None:
        pass


@pytest.fixture
def engine(request: pytest.FixtureRequest) -> Iterator[Engine]:
    server = Engine(getattr(request, "param", 200))
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield server
    server.shutdown()
    server.server_close()


def probe(url: str, state: Path, *extra: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    logs = [f"--log={HEALTHY / name}" for name in ("vllm.log", "lmcache.log")]
    argv = [sys.executable, "-m", "glm53", "probe", "startup", "--profile", "glm53-flash", "--chunk-size", "1152"]
    argv += [*logs, "--state-dir", str(state), "--warm-up", url, *extra]
    return subprocess.run(argv, capture_output=True, text=True, check=False, timeout=60, env=env)


def test_ready_waits_for_the_warm_up_of_one_chunk_and_a_token(engine: Engine, tmp_path: Path) -> None:
    url = f"http://127.0.0.1:{engine.server_address[1]}"
    result = probe(url, tmp_path, "--served-model-name", "zai-org/GLM-5.3-Flash")
    assert result.returncode == 0, result.stdout
    assert result.stdout.startswith("ready: ") and result.stdout.rstrip().endswith("; warm-up request answered")
    (body,) = engine.bodies
    assert body["model"] == "zai-org/GLM-5.3-Flash" and body["cache_salt"] == WARM_UP_SALT
    assert len(body["prompt"]) == 1152 + 1 and body["max_tokens"] == 1


def test_the_warm_up_carries_the_engines_api_key(engine: Engine, tmp_path: Path) -> None:
    url = f"http://127.0.0.1:{engine.server_address[1]}"
    env = {**os.environ, "VLLM_API_KEY": "sekret"}
    assert probe(url, tmp_path, "--served-model-name", "m", env=env).returncode == 0
    assert {k.lower(): v for k, v in engine.headers_seen[0].items()}.get("authorization") == "Bearer sekret", (
        engine.headers_seen
    )


@pytest.mark.parametrize("engine", [500], indirect=True)
def test_an_unanswered_warm_up_is_not_yet(engine: Engine, tmp_path: Path) -> None:
    url = f"http://127.0.0.1:{engine.server_address[1]}"
    result = probe(url, tmp_path, "--served-model-name", "m")
    assert result.returncode == 3
    assert result.stdout.startswith("not yet: geometry right; waiting for the engine to answer the warm-up")
    assert "HTTP 500" in result.stdout


def test_an_unreachable_engine_is_not_yet(tmp_path: Path) -> None:
    result = probe("http://127.0.0.1:9", tmp_path, "--served-model-name", "m")
    assert result.returncode == 3 and "warm-up" in result.stdout


def test_a_warm_up_without_a_model_name_is_one_line_and_exit_2(tmp_path: Path) -> None:
    result = probe("http://127.0.0.1:9", tmp_path)
    assert result.returncode == 2 and "--served-model-name" in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1
