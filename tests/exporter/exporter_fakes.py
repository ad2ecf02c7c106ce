"""Shared pieces of the exporter tests: the log fixtures, upstream metric pages, and a collector wired to them.

A helper module rather than a conftest.py: several test folders have a conftest, and both pytest and mypy would then
see modules with the same name.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler
from pathlib import Path
from typing import Any, ClassVar

from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.registry import CollectorRegistry

from glm53.exporter import names
from glm53.exporter.collector import Glm53Collector, Upstream
from glm53.exporter.facts import LogWatch
from glm53.exporter.upstream import Snapshot, UpstreamError, parse_exposition
from glm53.mock.runtime import serving_on_loopback
from glm53.profiles import get_profile

FIXTURES = Path(__file__).parent / "fixtures"
VLLM_URL = "http://vllm.test/metrics"
LMCACHE_URL = "http://lmcache.test/metrics"

# The seed's validation: an 8507-token prompt sent cold, the local prefix cache reset, then sent again; LMCache served
# 8064 tokens the second time (floor((8507-1)/1152)*1152). vLLM's counters after the two requests:
VLLM_PAGE = """\
# HELP vllm:prefix_cache_queries_total Prefix cache queries, in tokens
# TYPE vllm:prefix_cache_queries_total counter
vllm:prefix_cache_queries_total{engine="0",model_name="zai-org/GLM-5.3-Flash"} 17014.0
# HELP vllm:prefix_cache_hits_total Prefix cache hits, in tokens
# TYPE vllm:prefix_cache_hits_total counter
vllm:prefix_cache_hits_total{engine="0",model_name="zai-org/GLM-5.3-Flash"} 0.0
# HELP vllm:external_prefix_cache_queries_total External prefix cache queries, in tokens
# TYPE vllm:external_prefix_cache_queries_total counter
vllm:external_prefix_cache_queries_total{engine="0",model_name="zai-org/GLM-5.3-Flash"} 17014.0
# HELP vllm:external_prefix_cache_hits_total External prefix cache hits, in tokens
# TYPE vllm:external_prefix_cache_hits_total counter
vllm:external_prefix_cache_hits_total{engine="0",model_name="zai-org/GLM-5.3-Flash"} 8064.0
"""
# LMCache's side of the same two lookups: each requested its strict-prefix bound of 8064 tokens, the second hit it all.
LMCACHE_PAGE = """\
# HELP lmcache_mp_lookup_requested_tokens_total Chunk-aligned tokens submitted for lookup
# TYPE lmcache_mp_lookup_requested_tokens_total counter
lmcache_mp_lookup_requested_tokens_total{model_name="zai-org/GLM-5.3-Flash",cache_salt=""} 16128.0
# HELP lmcache_mp_lookup_hit_tokens_total Tokens of the contiguous prefix hit
# TYPE lmcache_mp_lookup_hit_tokens_total counter
lmcache_mp_lookup_hit_tokens_total{model_name="zai-org/GLM-5.3-Flash",cache_salt=""} 8064.0
# HELP lmcache_mp_l1_memory_usage_bytes Bytes currently held in L1 cache
# TYPE lmcache_mp_l1_memory_usage_bytes gauge
lmcache_mp_l1_memory_usage_bytes 6.291456e+06
# HELP process_start_time_seconds Start time of the process since unix epoch in seconds.
# TYPE process_start_time_seconds gauge
process_start_time_seconds 1.7963e+09
"""


class FakeUpstreams:
    """A scraper over canned pages: each URL answers its page, or raises the UpstreamError set for it."""

    def __init__(self, pages: Mapping[str, str | UpstreamError]) -> None:
        self.pages = dict(pages)
        self.calls = 0

    def __call__(self, url: str) -> Snapshot:
        self.calls += 1
        page = self.pages[url]
        if isinstance(page, UpstreamError):
            raise page
        return parse_exposition(page)


def copy_logs(directory: Path) -> tuple[Path, Path]:
    """Writable copies of the GLM-5.3-Flash TP 4 vLLM log and the negotiating LMCache server's log."""
    vllm, lmcache = directory / "vllm.log", directory / "lmcache.log"
    shutil.copy(FIXTURES / "vllm-flash-tp4.log", vllm)
    shutil.copy(FIXTURES / "lmcache-negotiating.log", lmcache)
    return vllm, lmcache


@contextmanager
def wired(
    paths: list[Path],
    pages: Mapping[str, str | UpstreamError] | None = None,
    profile: str = "glm53-flash",
    tp: int = 4,
    chunk: int = 1152,
) -> Iterator[tuple[CollectorRegistry, FakeUpstreams]]:
    """A registry holding a collector over `paths` and canned upstream pages (the seed's numbers by default)."""
    fake = FakeUpstreams(pages if pages is not None else {VLLM_URL: VLLM_PAGE, LMCACHE_URL: LMCACHE_PAGE})
    upstreams = [Upstream(names.VLLM, VLLM_URL), Upstream(names.LMCACHE, LMCACHE_URL)]
    collector = Glm53Collector(LogWatch(paths, get_profile(profile), tp, chunk), upstreams, fake)
    registry = CollectorRegistry()
    registry.register(collector)
    try:
        yield registry, fake
    finally:
        collector.close()


class _PageHandler(BaseHTTPRequestHandler):
    pages: ClassVar[dict[str, tuple[int, bytes]]] = {}

    def do_GET(self) -> None:
        status, body = self.pages.get(self.path, (404, b"not found"))
        self.send_response(status)
        self.send_header("Content-Type", "text/plain; version=0.0.4")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: object) -> None:
        """Quiet: the tests read status codes, not access logs."""


@contextmanager
def http_pages(pages: Mapping[str, tuple[int, str]]) -> Iterator[str]:
    """A loopback HTTP server on a free port answering GET path -> (status, body); yields its base URL."""
    handler = type("Pages", (_PageHandler,), {"pages": {p: (s, b.encode()) for p, (s, b) in pages.items()}})
    with serving_on_loopback(handler) as url:
        yield url


@contextmanager
def silent_listener() -> Iterator[str]:
    """A loopback port that accepts connections (kernel backlog) but never answers: a hung upstream."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen(8)
        yield f"http://127.0.0.1:{sock.getsockname()[1]}"


def free_port() -> int:
    """A port nothing listens on right now (bound, then released)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


DEADLINE_SECONDS = 30.0


@dataclass
class Child:
    """A `python -m glm53 ...` child process with stdout+stderr going to `log`."""

    proc: subprocess.Popen[bytes]
    log: Path

    def wait_for(self, needle: str, deadline: float = DEADLINE_SECONDS) -> str:
        """The first line of the child's output containing `needle`; fails with the output if it exits or times out."""
        end = time.monotonic() + deadline
        while time.monotonic() < end:
            for line in self.log.read_text(errors="replace").splitlines():
                if needle in line:
                    return line
            if self.proc.poll() is not None:
                break
            time.sleep(0.02)
        output = self.log.read_text(errors="replace")
        raise AssertionError(f"no {needle!r} from {self.proc.args!r} (exit {self.proc.poll()}):\n{output}")


@contextmanager
def glm53_child(args: list[str], log: Path, env: Mapping[str, str] | None = None) -> Iterator[Child]:
    """Run `glm53 ARGS` for the block; SIGTERM on exit (SIGKILL if it does not stop within the deadline)."""
    with log.open("wb") as out:
        command = [sys.executable, "-m", "glm53", *args]
        proc = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT, env={**os.environ, **(env or {})})
        try:
            yield Child(proc, log)
        finally:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout=DEADLINE_SECONDS)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


def http_json(url: str, body: object | None = None) -> Any:
    """GET (or POST `body` as JSON) and parse the JSON answer."""
    data = None if body is None else json.dumps(body).encode()
    request = urllib.request.Request(url, data=data, headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=DEADLINE_SECONDS) as response:
        return json.loads(response.read() or b"null")


def scrape_samples(url: str) -> dict[tuple[str, frozenset[tuple[str, str]]], float]:
    """One HTTP scrape of a /metrics page: {(sample name, labels): value}."""
    with urllib.request.urlopen(url, timeout=DEADLINE_SECONDS) as response:
        text = response.read().decode()
    return {
        (s.name, frozenset(s.labels.items())): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }
