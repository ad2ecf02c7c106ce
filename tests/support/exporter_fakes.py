"""Shared pieces of the exporter tests: the log fixtures, upstream metric pages, and a collector wired to them.

A helper module rather than a conftest.py: several test folders have a conftest, and both pytest and mypy would then
see modules with the same name.
"""

from __future__ import annotations

import json
import logging
import os
import re
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
from datetime import datetime
from http.server import BaseHTTPRequestHandler
from pathlib import Path
from typing import Any, ClassVar

from prometheus_client import Counter, generate_latest
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.registry import CollectorRegistry

from glm53.exporter import names
from glm53.exporter.collector import Glm53Collector, Upstream
from glm53.exporter.facts import LogWatch
from glm53.exporter.upstream import Snapshot, UpstreamError, parse_exposition
from glm53.mock.runtime import serving_on_loopback
from glm53.profiles import get_profile

FIXTURES = Path(__file__).resolve().parents[1] / "exporter" / "fixtures"
VLLM_URL = "http://vllm.test/metrics"
LMCACHE_URL = "http://lmcache.test/metrics"

MODEL = "zai-org/GLM-5.3-Flash"


def vllm_page(queries: float, hits: float, external_queries: float, external_hits: float) -> str:
    """vLLM 0.33's prefix-cache counters as its PrometheusStatLogger builds them: prometheus_client Counters named as in
    vllm/v1/metrics/loggers.py:661-706, labelled model_name and engine (loggers.py:499), so each also has `_created`."""
    registry = CollectorRegistry()
    for name, documentation, value in (
        ("vllm:prefix_cache_queries", "Prefix cache queries, in terms of number of queried tokens.", queries),
        ("vllm:prefix_cache_hits", "Prefix cache hits, in terms of number of cached tokens.", hits),
        ("vllm:external_prefix_cache_queries", "External prefix cache queries from KV connector.", external_queries),
        ("vllm:external_prefix_cache_hits", "External prefix cache hits from KV connector.", external_hits),
    ):
        Counter(name, documentation, ["model_name", "engine"], registry=registry).labels(MODEL, "0").inc(value)
    return generate_latest(registry).decode()


# The seed's validation: an 8507-token prompt sent cold, the local prefix cache reset, then sent again; LMCache served
# 8064 tokens the second time (floor((8507-1)/1152)*1152). vLLM's counters after the two requests:
VLLM_PAGE = vllm_page(17014, 0, 17014, 8064)
# LMCache's side, from the real server (see real_lmcache.py): two lookups of 8064 chunk-aligned tokens, one hit.
LMCACHE_PAGE = (FIXTURES / "lmcache-metrics.prom").read_text(encoding="utf-8")


def with_value(page: str, sample: str, value: float) -> str:
    """`page` with every sample line of `sample` (any labels) set to `value`: a later scrape of the same upstream."""
    return re.sub(rf"^({re.escape(sample)}(?:{{[^}}]*}})?) \S+$", rf"\g<1> {value!r}", page, flags=re.MULTILINE)


def geometry_lines(groups: list[int], scheduler_block_size: int, at: datetime, count: int) -> str:
    """`count` geometry lines exactly as LMCache's connector logs them (scheduler + each TP worker print one): the
    message of lmcache 0.5.6 lmcache/integration/vllm/lmcache_mp_connector.py:667-673, formatted by lmcache.logging's
    own CustomFormatter (colour codes, no vLLM process tag), stamped `at`."""
    from lmcache.logging import CustomFormatter  # imports lmcache (about 2 s): only the tests that write logs pay it

    record = logging.LogRecord(
        "lmcache.integration.vllm.lmcache_mp_connector",
        logging.INFO,
        "lmcache_mp_connector.py",
        667,
        "Resolved LMCache MP geometry: group_tokens_per_block=%s, scheduler_block_size=%d, cache_model_name=%s",
        (groups, scheduler_block_size, MODEL),
        None,
    )
    record.created, record.msecs = at.timestamp(), 0.0
    line: str = CustomFormatter().format(record)  # lmcache is untyped here (ignore_missing_imports)
    return (line + "\n") * count


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


# A healthy GLM-5.3-Flash TP 4 start (vLLM's log and the LMCache server's), shared with the probe's tests.
HEALTHY_FLASH_LOGS = Path(__file__).resolve().parents[2] / "examples" / "logs" / "glm53-flash" / "healthy"


def copy_logs(directory: Path) -> tuple[Path, Path]:
    """Writable copies of the healthy GLM-5.3-Flash TP 4 start: vLLM's log and the LMCache server's."""
    vllm, lmcache = directory / "vllm.log", directory / "lmcache.log"
    shutil.copy(HEALTHY_FLASH_LOGS / "vllm.log", vllm)
    shutil.copy(HEALTHY_FLASH_LOGS / "lmcache.log", lmcache)
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
    # One engine registered with the sidecar, as /status says of a healthy pod (the live test reads the real server's).
    collector = Glm53Collector(LogWatch(paths, get_profile(profile), tp, chunk), upstreams, fake, lambda: 1)
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
