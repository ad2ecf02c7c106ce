"""The chart's template layout: one folder per component, and `_helpers.tpl` holds only what every component shares
(names, labels, the image, the pods' security contexts); a component's helpers sit beside the templates using them."""

from __future__ import annotations

import re
from typing import Any

from tests.support.chartkit import CHART_DIR, render_files

TEMPLATES = CHART_DIR / "templates"
_DEFINE = re.compile(r'\{\{-?\s*define\s+"([^"]+)"')


def _defines(text: str) -> list[str]:
    return _DEFINE.findall(text)


def test_one_folder_per_component_and_three_top_level_files() -> None:
    folders = sorted(p.name for p in TEMPLATES.iterdir() if p.is_dir())
    files = sorted(p.name for p in TEMPLATES.iterdir() if p.is_file())
    assert folders == ["engine", "monitoring", "router", "staging", "tests"]
    assert files == ["NOTES.txt", "_guards.tpl", "_helpers.tpl"]


def test_helpers_hold_only_names_labels_the_image_and_security_contexts() -> None:
    assert _defines((TEMPLATES / "_helpers.tpl").read_text()) == [
        "glm53.name",
        "glm53.fullname",
        "glm53.chart",
        "glm53.serviceAccountName",
        "glm53.selectorLabels",
        "glm53.labels",
        "glm53.image",
        "glm53.servingImageTag",
        "glm53.imagePullPolicy",
        "glm53.containerSecurityContext",
        "glm53.podSecurityContext",
    ]


def test_every_helper_is_defined_once() -> None:
    """Helm keeps the last of two defines of one name silently: a copy left behind by a move would shadow the other."""
    seen: dict[str, str] = {}
    for path in sorted(TEMPLATES.rglob("*")):
        if path.is_file():
            for name in _defines(path.read_text()):
                where = str(path.relative_to(TEMPLATES))
                assert name not in seen, f"{name} is defined in {seen[name]} and {where}"
                seen[name] = where
    assert all(name.startswith("glm53.") for name in seen), sorted(seen)


def _rendered_under(folder: str, values: dict[str, Any]) -> list[str]:
    prefix = f"{CHART_DIR.name}/templates/{folder}/"
    return sorted(path for path, text in render_files(values).items() if path.startswith(prefix) and text.strip())


def test_the_staging_folder_renders_only_with_the_stage_step() -> None:
    exposed: dict[str, Any] = {
        "weights": {"staging": {"metrics": {"expose": True}}},
        "monitoring": {"serviceMonitor": {"enabled": True}},
        "exporter": {"enabled": True},
        "networkPolicy": {"metricsNamespaces": ["monitoring"]},
    }
    assert _rendered_under("staging", exposed) == [
        "glm53/templates/staging/networkpolicy.yaml",
        "glm53/templates/staging/podmonitor.yaml",
    ]
    off = {**exposed, "weights": {"staging": {"enabled": False, "metrics": {"expose": True}}}}
    assert _rendered_under("staging", off) == []
