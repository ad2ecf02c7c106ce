"""The stage step's own Prometheus metrics: bytes staged, files, rate, and whether staging is done or failed.

A collector over the shared `StageState`, read fresh at every scrape, in its own registry (never the global one), served
by the stage container itself on `--metrics-host:--metrics-port` (127.0.0.1 by default: loopback only; the chart binds
the pod's address only with weights.staging.metrics.expose, and then a PodMonitor scrapes it: the pod is not Ready
while it stages, so a Service would not list it). The exporter is not involved: staging ends before the engine it
watches starts.
"""

from __future__ import annotations

from collections.abc import Iterable

from prometheus_client import CollectorRegistry, start_http_server
from prometheus_client.metrics_core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from glm53.staging.progress import PHASES
from glm53.staging.stager import StageState


class StageCollector(Collector):
    """The metric families of one stage step, from its state at scrape time."""

    def __init__(self, state: StageState) -> None:
        self.state = state

    def collect(self) -> Iterable[Metric]:
        progress = self.state.current()
        labels = ["repo", "revision"]
        values = [progress.repo_id, progress.revision]

        def gauge(name: str, documentation: str, value: float) -> GaugeMetricFamily:
            family = GaugeMetricFamily(name, documentation, labels=labels)
            family.add_metric(values, value)
            return family

        yield gauge(
            "glm53_stage_bytes",
            "Bytes of the repository on the weights volume now (staged or verified).",
            progress.bytes_done,
        )
        yield gauge(
            "glm53_stage_expected_bytes",
            "Bytes of the repository at the revision, as the hub lists it.",
            progress.bytes_total,
        )
        yield gauge("glm53_stage_files", "Files of the repository staged (or verified) so far.", progress.files_done)
        yield gauge("glm53_stage_expected_files", "Files of the repository at the revision.", progress.files_total)
        yield gauge(
            "glm53_stage_rate_bytes_per_second", "Download (or hashing) rate over the last 30 s.", progress.rate or 0.0
        )
        eta = progress.eta
        yield gauge(
            "glm53_stage_eta_seconds", "Seconds left at the current rate (-1: unknown).", -1.0 if eta is None else eta
        )
        yield gauge(
            "glm53_stage_done",
            "1 once the weights are staged and verified: the engine may start.",
            float(progress.phase == "done"),
        )
        yield gauge(
            "glm53_stage_failed",
            "1 while the last attempt failed (the stage step retries by itself).",
            float(progress.phase == "failed"),
        )
        phase = GaugeMetricFamily(
            "glm53_stage_phase", "1 for the phase the stage step is in.", labels=[*labels, "phase"]
        )
        for name in PHASES:
            phase.add_metric([*values, name], float(progress.phase == name))
        yield phase
        downloaded = CounterMetricFamily(
            "glm53_stage_downloaded_bytes",
            "Bytes fetched from the hub by this process (a resumed file counts only what was fetched).",
            labels=labels,
        )
        downloaded.add_metric(values, self.state.downloaded_bytes)
        yield downloaded
        attempts = CounterMetricFamily("glm53_stage_attempts", "Staging attempts by this process.", labels=labels)
        attempts.add_metric(values, self.state.attempts)
        yield attempts
        for name, seconds, what in (
            ("glm53_stage_download_seconds", self.state.last_download_s, "downloading"),
            ("glm53_stage_verify_seconds", self.state.last_verify_s, "verifying (hashing every byte read back)"),
        ):
            if seconds is not None:
                yield gauge(name, f"Seconds the last attempt spent {what}.", seconds)


def registry_for(state: StageState) -> CollectorRegistry:
    registry = CollectorRegistry(auto_describe=False)
    registry.register(StageCollector(state))
    return registry


def serve(state: StageState, host: str, port: int) -> None:
    """Serve /metrics in a background thread (prometheus_client's own server)."""
    start_http_server(port, addr=host, registry=registry_for(state))


def sample_names() -> set[str]:
    """Every sample name the stage step can serve (for checks of the dashboard's queries)."""
    state = StageState("org/model", "main")
    state.last_download_s = state.last_verify_s = 1.0
    return {sample.name for family in registry_for(state).collect() for sample in family.samples}
