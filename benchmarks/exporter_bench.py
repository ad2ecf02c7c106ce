"""Benchmark: a scrape of `glm53 exporter` stays under 50 ms after the first, with a 1 GiB log and live upstreams.

Why: the exporter follows vLLM's log for the pod's whole life, and a debug-level log reaches gigabytes. If a scrape
re-read the log its cost would grow with the pod's age and eventually exceed Prometheus' scrape timeout. The
exporter's follower keeps its position in memory, so only the first scrape pays for the backlog.

What is measured (on this machine, printed with the numbers):
1. a vLLM log of --log-gib GiB (default 1): the healthy GLM-5.3-Flash TP 4 start of examples/logs/, then realistic
   periodic stats and access-log lines; that example's LMCache server log beside it;
2. two live upstreams on loopback: HTTP servers serving a vLLM-shaped page (the vLLM stand-in's registry with traffic
   recorded) and the page the released `lmcache server` produced (tests/exporter/fixtures/lmcache-metrics.prom), so
   the exporter parses pages of realistic size;
3. `glm53 exporter` started as its own process; the first scrape (which reads the whole backlog) timed by a client
   over HTTP, then --scrapes scrapes, each after appending about 100 new log lines; median, p95 and max of those, their
   ratio to the 50 ms target, and the exporter's own `glm53_scrape_duration_seconds`. The run also checks that the
   exporter read every log byte exactly once (`glm53_log_read_bytes_total` equals the file size) and saw both upstreams.

Run: ``.venv/bin/python benchmarks/exporter_bench.py [--log-gib 1] [--scrapes 50] [--workdir DIR]``.
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler
from pathlib import Path

from prometheus_client import Histogram, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from glm53.mock.runtime import serving_on_loopback
from glm53.mock.vllm_metrics import LABELS, VllmMetrics

TARGET_SECONDS = 0.050
MODEL = "zai-org/GLM-5.3-Flash"
REPO = Path(__file__).resolve().parents[1]
HEALTHY_START = REPO / "examples" / "logs" / "glm53-flash" / "healthy"
LMCACHE_PAGE = REPO / "tests" / "exporter" / "fixtures" / "lmcache-metrics.prom"
STATS = (
    "(APIServer pid=1) INFO 11-29 {stamp} [loggers.py:257] Engine 000: Avg prompt throughput: 8507.0 tokens/s, "
    "Avg generation throughput: 31.2 tokens/s, Running: 1 reqs, Waiting: 0 reqs, GPU KV cache usage: 3.2%, "
    "Prefix cache hit rate: 48.1%, External prefix cache hit rate: 47.4%\n"
)
ACCESS = '(APIServer pid=1) INFO:     127.0.0.1:{port} - "POST /v1/completions HTTP/1.1" 200 OK\n'


def traffic_lines(count: int, second: int) -> str:
    """`count` lines of serving traffic: one stats line per ten access-log lines."""
    stamp = f"07:{(second // 60) % 60:02d}:{second % 60:02d}"
    return "".join(STATS.format(stamp=stamp) if i % 10 == 0 else ACCESS.format(port=40000 + i) for i in range(count))


def write_log(path: Path, size: int) -> None:
    block = traffic_lines(40_000, 30).encode()
    with path.open("wb") as handle:
        handle.write((HEALTHY_START / "vllm.log").read_bytes())
        while handle.tell() + len(block) <= size:
            handle.write(block)


def vllm_page() -> bytes:
    """A vLLM 0.33-shaped page: the mock's families after traffic, plus more per-request histograms as vLLM has."""
    metrics = VllmMetrics(MODEL, lambda: 0.032)
    labels = {"model_name": MODEL, "engine": "0"}
    buckets = (1, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384, 32768, 65536, 131072)
    extra = [
        Histogram(name, name, LABELS, buckets=buckets, registry=metrics.registry).labels(**labels)
        for name in (
            "vllm:request_prompt_tokens",
            "vllm:request_generation_tokens",
            "vllm:request_params_max_tokens",
            "vllm:iteration_tokens_total",
        )
    ]
    extra += [
        Histogram(name, name, LABELS, registry=metrics.registry).labels(**labels)
        for name in (
            "vllm:inter_token_latency_seconds",
            "vllm:request_queue_time_seconds",
            "vllm:request_prefill_time_seconds",
            "vllm:request_decode_time_seconds",
            "vllm:request_inference_time_seconds",
        )
    ]
    for request in range(200):
        metrics.prefix_queries.inc(8507)
        metrics.external_queries.inc(8507)
        metrics.external_hits.inc(8064 if request % 2 else 0)
        metrics.ttft.observe(0.05 + request / 1000)
        metrics.e2e.observe(0.5 + request / 100)
        for histogram in extra:
            histogram.observe(request * 37 % 9000)
    return generate_latest(metrics.registry)


@contextmanager
def serving(page: bytes) -> Iterator[str]:
    """A loopback HTTP server answering every GET with `page`; yields its base URL."""

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            self.send_response(200)
            self.send_header("Content-Type", "text/plain; version=0.0.4")
            self.send_header("Content-Length", str(len(page)))
            self.end_headers()
            self.wfile.write(page)

        def log_message(self, format: str, *args: object) -> None:
            """Quiet."""

    with serving_on_loopback(Handler) as url:
        yield url


@contextmanager
def exporter(args: Sequence[str]) -> Iterator[str]:
    """`glm53 exporter ARGS --port 0` as a child process; yields its /metrics URL once it serves."""
    command = [sys.executable, "-m", "glm53", "exporter", *args, "--host", "127.0.0.1", "--port", "0"]
    proc = subprocess.Popen(command, stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        if "serving http://" not in line:
            raise SystemExit(f"exporter did not start: {line!r} (exit {proc.wait()})")
        yield line.split("serving ", 1)[1].strip()
    finally:
        proc.terminate()
        proc.wait(timeout=30)


def scrape(url: str) -> tuple[float, dict[tuple[str, tuple[tuple[str, str], ...]], float]]:
    started = time.perf_counter()
    with urllib.request.urlopen(url, timeout=600) as response:
        text = response.read().decode()
    elapsed = time.perf_counter() - started
    samples = {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }
    return elapsed, samples


def percentile(values: Sequence[float], share: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(share * (len(ordered) - 1)))]


def run(workdir: Path, log_bytes: int, scrapes: int) -> None:
    vllm_log, lmcache_log = workdir / "vllm.log", workdir / "lmcache.log"
    started = time.perf_counter()
    write_log(vllm_log, log_bytes)
    shutil.copy(HEALTHY_START / "lmcache.log", lmcache_log)
    print(f"log: {vllm_log.stat().st_size / 1024**3:.3f} GiB written in {time.perf_counter() - started:.1f} s")
    vllm_text, lmcache_text = vllm_page(), LMCACHE_PAGE.read_bytes()
    print(f"upstream pages: vLLM {len(vllm_text)} bytes, LMCache {len(lmcache_text)} bytes")
    with serving(vllm_text) as vllm_url, serving(lmcache_text) as lmcache_url:
        args = ["--log", str(vllm_log), "--log", str(lmcache_log), "--profile", "glm53-flash", "--chunk-size", "1152"]
        args += ["--vllm-url", vllm_url, "--lmcache-url", lmcache_url]
        with exporter(args) as url:
            first, samples = scrape(url)
            durations, internal = [], []
            for index in range(scrapes):
                with vllm_log.open("a") as handle:
                    handle.write(traffic_lines(100, index))
                elapsed, samples = scrape(url)
                durations.append(elapsed)
                internal.append(samples[("glm53_scrape_duration_seconds", ())])
    read = samples[("glm53_log_read_bytes_total", (("log", str(vllm_log)),))]
    assert read == vllm_log.stat().st_size, f"exporter read {read} bytes of a {vllm_log.stat().st_size}-byte log"
    assert samples[("glm53_upstream_up", (("target", "vllm"),))] == 1
    assert samples[("glm53_upstream_up", (("target", "lmcache"),))] == 1
    assert samples[("glm53_geometry_matches_profile", ())] == 1
    median, p95 = statistics.median(durations), percentile(durations, 0.95)
    print(f"first scrape (reads the whole log): {first:.2f} s")
    print(
        f"next {scrapes} scrapes (client over HTTP, ~100 new log lines each): median {median * 1000:.1f} ms, "
        f"p95 {p95 * 1000:.1f} ms, max {max(durations) * 1000:.1f} ms"
    )
    print(f"exporter's own glm53_scrape_duration_seconds: median {statistics.median(internal) * 1000:.1f} ms")
    verdict = "PASS" if p95 < TARGET_SECONDS else "FAIL"
    print(f"target {TARGET_SECONDS * 1000:.0f} ms: p95 / target = {p95 / TARGET_SECONDS:.2f} -> {verdict}", flush=True)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--log-gib", type=float, default=1.0, help="size of the vLLM log in GiB (default 1)")
    parser.add_argument("--scrapes", type=int, default=50, help="scrapes after the first (default 50)")
    parser.add_argument("--workdir", type=Path, help="where to write the logs (default: a temporary directory)")
    args = parser.parse_args(argv)
    workdir = args.workdir or Path(tempfile.mkdtemp(prefix="glm53-exporter-bench-"))
    workdir.mkdir(parents=True, exist_ok=True)
    try:
        run(workdir, int(args.log_gib * 1024**3), args.scrapes)
    finally:
        if args.workdir is None:
            shutil.rmtree(workdir)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
