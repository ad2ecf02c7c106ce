"""LMCache 0.5.6's real server under the OpenTelemetry of the vLLM 0.34.0 joint set: the proof that lifting LMCache's
OpenTelemetry caps (docker/vllm-lmcache/joint_deps.py, generation 0.34.0's overrides) leaves its observability working.

As released, lmcache 0.5.6 caps opentelemetry-api<=1.40.0 and opentelemetry-exporter-prometheus<=0.61b0 while vLLM
0.34.0 needs SDK 1.45, so the 0.34 set overrides the caps. Here the venv's lmcache 0.5.6 runs with that set's
opentelemetry-* and prometheus-client first on PYTHONPATH (the overlay scripts/setup.d/27-otel-overlay.sh installs
from constraints-vllm0.34.0.txt's pins), as the chart's sidecar with its metrics on, driven by LMCache's own CPU bench
(a lookup that misses, a store, a lookup that hits). Both of LMCache's metric paths are exercised
(lmcache 0.5.6 lmcache/v1/mp_observability/otel_init.py:81-130): Prometheus pull, read on the server's `/metrics`, and,
with `--otlp-endpoint` and `--enable-tracing`, OTLP gRPC push of metrics and spans to a receiver on loopback. Which SDK
the server imported, it says itself: every page carries the SDK's `telemetry.sdk.version` resource attribute
(`target_info` on the Prometheus page, the resource of each OTLP export).
"""

from __future__ import annotations

import re
import threading
import time
from collections.abc import Iterator
from concurrent import futures
from contextlib import contextmanager
from dataclasses import dataclass, field
from importlib.metadata import Distribution
from pathlib import Path

import grpc
import pytest
from opentelemetry.proto.collector.metrics.v1 import metrics_service_pb2, metrics_service_pb2_grpc
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2, trace_service_pb2_grpc
from opentelemetry.proto.resource.v1.resource_pb2 import Resource
from prometheus_client.parser import text_string_to_metric_families

from glm53.exporter import names
from glm53.exporter.upstream import parse_exposition
from glm53.pod.loopback import LOCALHOST
from glm53.testing.chart_sidecar import StandaloneSidecar, chart_sidecar
from glm53.testing.sidecar import serving
from tests.support.dockerkit import REPO_ROOT, load_image_script
from tests.support.real_lmcache import (
    NO_BANNER,
    PROFILE,
    START_DEADLINE_SECONDS,
    http_get,
    send_one_request,
    settled_metrics,
)

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]

IMAGE_DIR = REPO_ROOT / "docker" / "vllm-lmcache"
OVERLAY = REPO_ROOT / ".venv" / "otel-vllm0.34.0"
# LMCache pushes metrics every 10 s (otel_init.py:92, a fixed export_interval_millis); spans leave in batches whose
# delay the SDK reads from OTEL_BSP_SCHEDULE_DELAY (LMCache passes none, otel_init.py:215).
PUSH_DEADLINE_SECONDS = 25.0
SPAN_DELAY = {"OTEL_BSP_SCHEDULE_DELAY": "200"}
SCOPE_LABELS = {"otel_scope_schema_url": "", "otel_scope_version": ""}


def overlay_pins() -> dict[str, str]:
    """The opentelemetry-* and prometheus-client pins of the 0.34 set, as the overlay must hold them."""
    module = load_image_script(IMAGE_DIR / "joint_deps.py")
    pinned = module.parse_constraints(module.GENERATIONS["0.34.0"].constraints.read_text(encoding="utf-8"))
    return {name: version for name, version in pinned.items() if re.match(r"opentelemetry-|prometheus-client$", name)}


def overlay_env(sidecar: StandaloneSidecar) -> dict[str, str]:
    """The sidecar's environment with the overlay first on PYTHONPATH; fails, naming the setup script, without it."""
    installed = {
        dist.metadata["Name"].lower().replace("_", "-"): dist.version
        for dist in Distribution.discover(path=[str(OVERLAY)])
    }
    assert installed == overlay_pins(), (
        f"{OVERLAY} is not the 0.34 set's pins: run bash scripts/setup.d/27-otel-overlay.sh"
    )
    return {**sidecar.env, **NO_BANNER, **SPAN_DELAY, "PYTHONPATH": str(OVERLAY)}


def sdk_version_on_page(page: str) -> str:
    """The SDK version the server's `target_info` family reports (its Resource's telemetry.sdk.version)."""
    (version,) = re.findall(r'^target_info\{.*telemetry_sdk_version="([^"]+)".*\} 1\.0$', page, flags=re.MULTILINE)
    return str(version)


def resource_attribute(resource: Resource, key: str) -> str:
    """One string attribute of an OTLP resource."""
    (value,) = [item.value.string_value for item in resource.attributes if item.key == key]
    return str(value)


@dataclass
class Received:
    """What the loopback OTLP receiver got: each sum metric's latest total (cumulative, LMCache's default), span
    scopes and the resources they came with."""

    sums: dict[str, float] = field(default_factory=dict)
    span_scopes: set[str] = field(default_factory=set)
    resources: list[Resource] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)


class MetricsReceiver(metrics_service_pb2_grpc.MetricsServiceServicer):
    def __init__(self, received: Received) -> None:
        self.received = received

    def Export(
        self, request: metrics_service_pb2.ExportMetricsServiceRequest, context: grpc.ServicerContext
    ) -> metrics_service_pb2.ExportMetricsServiceResponse:
        with self.received.lock:
            for resource_metrics in request.resource_metrics:
                self.received.resources.append(resource_metrics.resource)
                for scope in resource_metrics.scope_metrics:
                    self.received.sums.update(
                        (metric.name, sum(point.as_int or point.as_double for point in metric.sum.data_points))
                        for metric in scope.metrics
                        if metric.HasField("sum")
                    )
        return metrics_service_pb2.ExportMetricsServiceResponse()


class TraceReceiver(trace_service_pb2_grpc.TraceServiceServicer):
    def __init__(self, received: Received) -> None:
        self.received = received

    def Export(
        self, request: trace_service_pb2.ExportTraceServiceRequest, context: grpc.ServicerContext
    ) -> trace_service_pb2.ExportTraceServiceResponse:
        with self.received.lock:
            for resource_spans in request.resource_spans:
                self.received.resources.append(resource_spans.resource)
                self.received.span_scopes.update(
                    scope.scope.name for scope in resource_spans.scope_spans if scope.spans
                )
        return trace_service_pb2.ExportTraceServiceResponse()


@contextmanager
def otlp_receiver() -> Iterator[tuple[str, Received]]:
    """An OTLP gRPC metrics + traces receiver on a free loopback port: its endpoint URL and what it receives."""
    received = Received()
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
    metrics_service_pb2_grpc.add_MetricsServiceServicer_to_server(  # type: ignore[no-untyped-call]
        MetricsReceiver(received), server
    )
    trace_service_pb2_grpc.add_TraceServiceServicer_to_server(  # type: ignore[no-untyped-call]
        TraceReceiver(received), server
    )
    port = server.add_insecure_port(f"{LOCALHOST}:0")
    server.start()
    try:
        yield f"http://{LOCALHOST}:{port}", received
    finally:
        server.stop(grace=None)


@contextmanager
def overlaid_lmcache(workdir: Path, *extra: str) -> Iterator[StandaloneSidecar]:
    """The chart's `lmcache server` (GLM-5.3-Flash's pod) with `extra` flags, under the overlay, on loopback."""
    sidecar = chart_sidecar(PROFILE, workdir)
    log = workdir / "lmcache-server.log"
    with serving([*sidecar.argv, *extra], overlay_env(sidecar), sidecar.http_port, log, START_DEADLINE_SECONDS):
        yield sidecar


def samples(page: str, name: str) -> dict[frozenset[tuple[str, str]], float]:
    """The values of sample family ``name`` on a Prometheus page, by label set."""
    return {
        frozenset(sample.labels.items()): sample.value
        for family in text_string_to_metric_families(page)
        for sample in family.samples
        if sample.name == name
    }


def test_prometheus_pull_serves_the_traffic_under_sdk_1_45(tmp_path: Path) -> None:
    sdk = overlay_pins()["opentelemetry-sdk"]
    with overlaid_lmcache(tmp_path) as server:
        send_one_request(server)
        page = settled_metrics(server)

    assert sdk.startswith("1.45.") and sdk_version_on_page(page) == sdk
    # The seed's traffic: 2 x 8064 tokens looked up (a miss, then a hit), 8064 hit, one store. Exporter-prometheus
    # 0.66b adds the instrumentation scope to every series (otel_scope_name, _version, _schema_url; 0.61b0 did not).
    lookup = {"cache_salt": "", "model_name": "test-model", **SCOPE_LABELS, "otel_scope_name": "lmcache.lookup"}
    assert samples(page, "lmcache_mp_lookup_requested_tokens_total") == {frozenset(lookup.items()): 2 * 8064}
    assert samples(page, "lmcache_mp_lookup_hit_tokens_total") == {frozenset(lookup.items()): 8064}
    assert sum(samples(page, "lmcache_mp_num_finished_stores_total").values()) == 1
    # The glm53 exporter sums LMCache's series over their label sets (upstream.Snapshot.total), so the new scope labels
    # leave what it reads unchanged.
    assert parse_exposition(page).total(names.LMCACHE_LOOKUP_HIT) == 8064


def test_otlp_push_delivers_metrics_and_spans_under_sdk_1_45(tmp_path: Path) -> None:
    sdk = overlay_pins()["opentelemetry-sdk"]
    with (
        otlp_receiver() as (endpoint, received),
        overlaid_lmcache(tmp_path, "--otlp-endpoint", endpoint, "--enable-tracing") as server,
    ):
        send_one_request(server)
        # With an OTLP endpoint the OTel metrics leave by push only: the HTTP front's page has none of them.
        assert "lmcache_mp_lookup_requested_tokens" not in http_get(f"{server.http_url}/metrics")
        deadline = time.monotonic() + PUSH_DEADLINE_SECONDS
        while time.monotonic() < deadline:
            with received.lock:
                if received.sums.get("lmcache_mp.lookup_hit") and received.span_scopes:
                    break
            time.sleep(0.5)

    with received.lock:
        # The same traffic as on the Prometheus page, pushed: 2 x 8064 tokens looked up, 8064 hit.
        assert received.sums.get("lmcache_mp.lookup_requested") == 2 * 8064, received.sums
        assert received.sums.get("lmcache_mp.lookup_hit") == 8064, received.sums
        assert "lmcache_mp.server" in received.span_scopes, sorted(received.span_scopes)
        assert {resource_attribute(resource, "telemetry.sdk.version") for resource in received.resources} == {sdk}
