"""Process plumbing both mock servers share: binding listeners with one-line errors, and a clean SIGTERM/SIGINT stop.

Kubernetes stops a container with SIGTERM and the main job with SIGINT; both must end the mock with status 0 after
closing its sockets, never with a traceback. A taken port is a person's mistake (another server, a stale process),
so it becomes a one-line `Glm53Error` naming the address and the flag to change.
"""

from __future__ import annotations

import contextlib
import json
import signal
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from types import FrameType

from glm53.errors import EXIT_FAILURE, Glm53Error


def bind_error(what: str, host: str, port: int, reason: str, flag: str) -> Glm53Error:
    return Glm53Error(
        f"cannot bind the {what} to {host}:{port}: {reason}; stop the process using it or choose another {flag}",
        EXIT_FAILURE,
    )


class MockHTTPServer(ThreadingHTTPServer):
    """A threading HTTP server whose request threads never block exit.

    SO_REUSEADDR lets a restarted server rebind a port whose old connections linger in TIME_WAIT; on Linux it still
    refuses a port another socket is listening on, so a taken port fails as it should. SO_REUSEPORT stays off.
    """

    daemon_threads = True
    allow_reuse_address = True
    allow_reuse_port = False


def bind_http(what: str, host: str, port: int, handler: type[BaseHTTPRequestHandler], flag: str) -> MockHTTPServer:
    try:
        return MockHTTPServer((host, port), handler)
    except OSError as error:
        raise bind_error(what, host, port, error.strerror or str(error), flag) from None


def serve_in_background(server: MockHTTPServer) -> threading.Thread:
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.1}, daemon=True)
    thread.start()
    return thread


@contextlib.contextmanager
def serving_on_loopback(handler: type[BaseHTTPRequestHandler]) -> Iterator[str]:
    """Serve `handler` on a free 127.0.0.1 port in a background thread; yield the base URL, then shut down.

    The tests' and benchmarks' stand-in upstreams (canned metrics pages, broken servers) all start this way.
    """
    server = MockHTTPServer(("127.0.0.1", 0), handler)
    thread = serve_in_background(server)
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()
        thread.join()


def stop_on_signals() -> threading.Event:
    """An event set by the first SIGTERM or SIGINT; the servers poll it instead of dying mid-write.

    A pod's stop often delivers SIGTERM twice: to the whole process group, and again forwarded by `glm53 supervise`.
    Python runs a handler between bytecodes of the main thread, so the second can interrupt the first inside
    `Event.set()`, which holds the event's non-reentrant lock: setting it again there deadlocks, and the kubelet (or
    the loopback runner) then SIGKILLs the process after its grace period, leaving its SHM segments behind. Only the
    first signal sets the event; a non-blocking acquire is safe inside a handler.
    """
    stop = threading.Event()
    first = threading.Lock()

    def handler(_signum: int, _frame: FrameType | None) -> None:
        if first.acquire(blocking=False):
            stop.set()

    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, handler)
    return stop


def compact_json(payload: object) -> bytes:
    """JSON as vLLM's server writes it: starlette's JSONResponse (`separators=(",", ":")`, `ensure_ascii=False`) and
    pydantic's `model_dump_json` alike leave no spaces (starlette 1.10.0 responses.py:199-206, JSONResponse.render)."""
    return json.dumps(payload, ensure_ascii=False, allow_nan=False, separators=(",", ":")).encode()


class JsonHandler(BaseHTTPRequestHandler):
    """Request handler base: JSON in and out, HTTP/1.1 keep-alive, and no access log on stderr."""

    protocol_version = "HTTP/1.1"

    def log_message(self, format: str, *args: object) -> None:
        """Request lines would drown the start-up lines the probe reads."""

    def send_body(self, status: int, body: bytes, content_type: str) -> None:
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def send_json(self, status: int, payload: object) -> None:
        self.send_body(status, compact_json(payload), "application/json")

    def read_body(self) -> bytes:
        length = int(self.headers.get("Content-Length") or 0)
        return self.rfile.read(length) if length > 0 else b""
