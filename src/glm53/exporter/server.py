"""Serve an exporter registry over HTTP (`/metrics`) until asked to stop.

prometheus_client's threaded WSGI server does the HTTP; this module only owns its lifetime: bind (port 0 picks a free
port, which the tests use), report the bound address, shut down cleanly on SIGTERM/SIGINT so a Kubernetes pod stops
within its grace period and a test leaves no thread behind.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from wsgiref.simple_server import WSGIServer

from prometheus_client import start_http_server
from prometheus_client.registry import CollectorRegistry

from glm53.errors import EXIT_FAILURE, Glm53Error


@dataclass
class MetricsServer:
    """A running `/metrics` endpoint; `close()` stops it and waits for its thread."""

    httpd: WSGIServer
    thread: threading.Thread

    @property
    def port(self) -> int:
        return int(self.httpd.server_address[1])

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()
        self.thread.join()


def serve(registry: CollectorRegistry, host: str, port: int) -> MetricsServer:
    """Start serving `registry` on host:port in a background thread."""
    try:
        httpd, thread = start_http_server(port, addr=host, registry=registry)
    except OSError as error:
        raise Glm53Error(
            f"could not listen on {host}:{port} ({error.strerror or error}); pick a free port with --port",
            EXIT_FAILURE,
        ) from None
    return MetricsServer(httpd, thread)
