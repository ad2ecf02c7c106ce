"""`glm53 validate --lmcache-metrics`: reading LMCache's committed chunks per cache salt, per server.

The pages are made by the released server's own metric path: LMCache 0.5.6's L1 subscriber counting an
L1_WRITE_FINISHED event into an OpenTelemetry meter read by the Prometheus reader the server uses (lmcache
v1/mp_observability/otel_init.py:111-113), so the family name and labels are the server's, not typed here. The
pod exporter's several-server shape comes from its own pass-through.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Iterator
from pathlib import Path
from types import SimpleNamespace

import pytest
from lmcache.v1.mp_observability.event import Event, EventType
from lmcache.v1.mp_observability.subscribers.metrics import l1
from opentelemetry.exporter.prometheus import PrometheusMetricReader
from opentelemetry.sdk.metrics import MeterProvider
from prometheus_client import REGISTRY, CollectorRegistry, generate_latest
from prometheus_client.metrics_core import Metric
from prometheus_client.registry import Collector

from glm53.errors import Glm53Error
from glm53.exporter.collector import passthrough_families
from glm53.exporter.upstream import parse_exposition
from glm53.validate.commits import CommitWatch, committed_per_server

SALT = "glm53-validate-0123456789ab-equivalence-reloaded"
REAL_PAGE = Path(__file__).parents[1] / "exporter" / "fixtures" / "lmcache-metrics.prom"


@pytest.fixture
def server_meter(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """LMCache's meters read by the server's Prometheus reader, which registers in prometheus_client's global registry
    as in the server; unregistered afterwards."""
    reader = PrometheusMetricReader()
    provider = MeterProvider(metric_readers=[reader])
    monkeypatch.setattr(l1.metrics, "get_meter", provider.get_meter)
    try:
        yield
    finally:
        provider.shutdown()  # the reader's shutdown unregisters it


def commit(salts: dict[str, int]) -> str:
    """Publish one L1 write per salt through LMCache's subscriber and return the page its Prometheus reader serves."""
    subscriber = l1.L1MetricsSubscriber()
    for salt, chunks in salts.items():
        keys = [SimpleNamespace(cache_salt=salt) for _ in range(chunks)]
        subscriber._on_write_finished(Event(EventType.L1_WRITE_FINISHED, metadata={"keys": keys, "l1_tag": "_default"}))
    return generate_latest(REGISTRY).decode()


class PassThrough(Collector):
    """The exporter's pass-through families as a registry collector (the exporter's own server registers its
    collector the same way)."""

    def __init__(self, families: list[Metric]) -> None:
        self.families = families

    def collect(self) -> Iterable[Metric]:
        return self.families


def test_the_servers_page_counts_the_chunks_committed_under_each_salt(server_meter: None) -> None:
    page = commit({SALT: 33, "another-salt": 7})
    assert "lmcache_mp_l1_write_chunks_total{" in page
    assert committed_per_server(page, SALT) == [33.0]
    assert committed_per_server(page, "never-primed") == [0.0]


def test_a_page_with_no_commit_yet_reads_zero() -> None:
    assert committed_per_server(REAL_PAGE.read_text(), SALT) == [0.0]


def test_the_exporters_page_of_several_servers_gives_one_figure_per_server(server_meter: None) -> None:
    """Each server must commit: the smallest figure is the one waited on."""
    committed = parse_exposition(commit({SALT: 33}))
    quiet = parse_exposition(REAL_PAGE.read_text())
    registry = CollectorRegistry()
    registry.register(PassThrough(passthrough_families([committed, quiet])))
    assert committed_per_server(generate_latest(registry).decode(), SALT) == [33.0, 0.0]


def test_a_watch_needs_an_http_url_and_a_readable_page() -> None:
    with pytest.raises(Glm53Error, match="--lmcache-metrics must start with http"):
        CommitWatch("localhost:9400/metrics", 256, 5.0)
    with pytest.raises(Glm53Error, match=re.escape("cannot read LMCache's metrics at http://127.0.0.1:9/metrics")):
        CommitWatch("http://127.0.0.1:9/metrics", 256, 5.0).committed(SALT)
