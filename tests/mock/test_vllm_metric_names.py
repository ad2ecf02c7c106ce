"""The stand-in's `/metrics` serves only what vLLM 0.33 serves: every family it exposes is declared in vLLM's own
metrics logger, with the same type, so each sample name (a counter's `_total` and `_created` included) is a real one.

vLLM declares its families in `vllm/v1/metrics/loggers.py` as `self._counter_cls(name="vllm:...")`,
`self._gauge_cls(...)` and `self._histogram_cls(...)` (`_counter_cls = Counter` etc., loggers.py:474-476); the names are
read from the released wheel that `scripts/setup.d/24-upstream-wheels.sh` downloads, not typed here.
"""

from __future__ import annotations

import re
import zipfile
from pathlib import Path

import pytest
from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from glm53.mock.vllm_metrics import VllmMetrics

WHEELS = Path(__file__).resolve().parents[2] / ".tools" / "upstream"
DECLARATION = re.compile(r"self\._(counter|gauge|histogram)_cls\(\s*name=\"(vllm:[a-z0-9_:]+)\"")
# What prometheus_client exposes for a family of each type (the default registry keeps `_created` series on).
SUFFIXES = {"counter": ("_total", "_created"), "gauge": ("",), "histogram": ("_bucket", "_count", "_sum", "_created")}


def vllm_families(version: str = "0.33.0") -> dict[str, str]:
    """{family name: type} as vLLM `version`'s metrics logger declares them."""
    wheels = sorted(WHEELS.glob(f"vllm-{version}-*.whl"))
    if not wheels:
        pytest.fail(f"expected the vllm {version} wheel in {WHEELS}; run `bash scripts/setup.d/24-upstream-wheels.sh`")
    with zipfile.ZipFile(wheels[0]) as wheel:
        source = wheel.read("vllm/v1/metrics/loggers.py").decode()
    return {name: kind for kind, name in DECLARATION.findall(source)}


def stand_in_exposition() -> str:
    metrics = VllmMetrics("zai-org/GLM-5.3-Flash", cache_usage=lambda: 0.25)
    metrics.prefix_queries.inc(8507)
    metrics.ttft.observe(0.1)
    return generate_latest(metrics.registry).decode()


def test_every_family_the_stand_in_exposes_is_declared_by_vllm_with_the_same_type() -> None:
    real = vllm_families()
    assert {"vllm:prefix_cache_queries", "vllm:external_prefix_cache_hits"} <= set(real), "the pattern reads vLLM"
    for family in text_string_to_metric_families(stand_in_exposition()):
        # The text format carries a counter's or histogram's `_created` series as a gauge family of its own.
        base = family.name.removesuffix("_created")
        if base != family.name and real.get(base) in {"counter", "histogram"}:
            continue
        assert real.get(family.name) == family.type, f"{family.name} ({family.type}) is not a vLLM 0.33 {family.type}"


def test_every_sample_name_is_one_vllm_serves() -> None:
    served = {name + suffix for name, kind in vllm_families().items() for suffix in SUFFIXES[kind]}
    samples = {s.name for family in text_string_to_metric_families(stand_in_exposition()) for s in family.samples}
    assert "vllm:prefix_cache_queries_created" in samples  # one API server: the default registry's `_created`
    assert samples <= served, sorted(samples - served)


REPO = WHEELS.parents[1]
# Where the toolkit reads vLLM's series: the chart's rules and dashboards, the exporter, `glm53 validate`.
READERS = (REPO / "charts" / "glm53", REPO / "src" / "glm53" / "exporter", REPO / "src" / "glm53" / "validate")
SERIES = re.compile(r"vllm:[a-z0-9_:]+")


# The readers' source files (not `__pycache__`, whose byte code holds the same names with marshal's type bytes).
SOURCES = (".py", ".tpl", ".yaml", ".json", ".txt")


def series_the_toolkit_reads() -> set[str]:
    """Every `vllm:` sample name in the readers' source files."""
    files = [path for reader in READERS for path in reader.rglob("*") if path.suffix in SOURCES and path.is_file()]
    return {name for path in files for name in SERIES.findall(path.read_text(errors="replace"))}


@pytest.mark.parametrize("version", ["0.33.0", "0.34.0"])
def test_every_vllm_series_the_toolkit_reads_is_served_by_both_engine_generations(version: str) -> None:
    """vllm.generation=0.34.0 keeps the exporter's ratios, the alerts and the dashboards fed."""
    served = {name + suffix for name, kind in vllm_families(version).items() for suffix in SUFFIXES[kind]}
    read = series_the_toolkit_reads()
    assert {"vllm:prefix_cache_hits_total", "vllm:time_to_first_token_seconds_bucket"} <= read, "the pattern reads"
    assert read <= served, f"vLLM {version} serves none of {sorted(read - served)}"
