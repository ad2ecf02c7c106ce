"""Tiny stand-ins for vLLM's HTTP surface, for tests where the full CPU mock is not needed (error paths, parsing).

A `FakeServer` answers fixed responses per (method, path) on a free loopback port in a background thread.
"""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler

from glm53.mock.runtime import serving_on_loopback


@dataclass(frozen=True)
class Canned:
    status: int
    body: bytes
    content_type: str = "application/json"


Routes = Mapping[tuple[str, str], Canned]


@contextmanager
def fake_server(routes: Routes) -> Iterator[str]:
    """Serve `routes` (keyed by method and path without query) and yield the base URL."""

    class Handler(BaseHTTPRequestHandler):
        def _answer(self, method: str) -> None:
            length = int(self.headers.get("Content-Length") or 0)
            self.rfile.read(length)
            canned = routes.get((method, self.path.split("?")[0]), Canned(404, b'{"detail":"Not Found"}'))
            self.send_response(canned.status)
            self.send_header("Content-Type", canned.content_type)
            self.send_header("Content-Length", str(len(canned.body)))
            self.end_headers()
            self.wfile.write(canned.body)

        def do_GET(self) -> None:
            self._answer("GET")

        def do_POST(self) -> None:
            self._answer("POST")

        def log_message(self, format: str, *args: object) -> None:
            pass

    with serving_on_loopback(Handler) as url:
        yield url


MODELS = Canned(200, b'{"object":"list","data":[{"id":"zai-org/GLM-5.3-Flash","object":"model"}]}')
METRICS = Canned(
    200,
    b"# HELP vllm:external_prefix_cache_hits_total External prefix cache hits, in tokens.\n"
    b"# TYPE vllm:external_prefix_cache_hits_total counter\n"
    b'vllm:external_prefix_cache_hits_total{engine="0",model_name="m"} 0.0\n',
    "text/plain; version=0.0.4",
)
RESET_OK = Canned(200, b'{"success": true}')


def run_glm53(*args: str, timeout: float = 60.0) -> subprocess.CompletedProcess[str]:
    """`glm53 ARGS...` in a fresh interpreter, as a user runs it."""
    return subprocess.run(
        [sys.executable, "-m", "glm53", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        stdin=subprocess.DEVNULL,
    )


def error_line(result: subprocess.CompletedProcess[str]) -> str:
    """The one line a failing command printed on stderr (progress lines come before it)."""
    lines = result.stderr.strip().splitlines()
    assert lines, f"no stderr; stdout was {result.stdout!r}"
    assert "Traceback" not in result.stderr, result.stderr
    return lines[-1]
