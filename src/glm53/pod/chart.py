"""Rendering the glm53 chart in-process: the edge where the pod's one definition enters the toolkit.

Why in-process: the CPU runners (`glm53 pod`, `glm53 fleet`) must run exactly what the chart renders, on a laptop
without a Helm CLI or a cluster. helm-python-sdk embeds Helm's own template engine (Helm 4) as a library, so the render
is the one `helm install` would make, values schema and `fail` guards included. A refusal becomes one line.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import yaml

from glm53.errors import EXIT_FAILURE, EXIT_USAGE, Glm53Error
from glm53.pod.contract import CHECKOUT_CHART, DEFAULT_RELEASE

NAMESPACE = "default"

RenderedObject = dict[str, Any]
# What Helm puts in front of a guard's `fail` message: "execution error at (glm53/templates/x.yaml:1:4): ".
_GUARD = re.compile(r"^execution error at \([^)]*\): ")


def merged(base: Mapping[str, Any], overlay: Mapping[str, Any]) -> dict[str, Any]:
    """`overlay` over `base`, maps merged key by key (how Helm layers values files)."""
    result = dict(base)
    for key, value in overlay.items():
        if isinstance(value, Mapping) and isinstance(result.get(key), Mapping):
            result[key] = merged(result[key], value)
        else:
            result[key] = value
    return result


def chart_dir(path: Path | None) -> Path:
    """The chart to render: `path`, else the checkout's; an error naming the fix when it is not a chart."""
    chart = path or CHECKOUT_CHART
    if not (chart / "Chart.yaml").is_file():
        raise Glm53Error(
            f"no Helm chart at {chart} (Chart.yaml missing); run from a checkout of glm53-serving or pass --chart",
            EXIT_USAGE,
        )
    return chart


def render(
    values: Mapping[str, Any], chart: Path | None = None, release: str = DEFAULT_RELEASE, namespace: str = NAMESPACE
) -> list[RenderedObject]:
    """The chart's rendered objects for `values`, as `helm template` would print them (NOTES.txt left out)."""
    try:
        import helm_python
    except ImportError:
        raise Glm53Error(
            "rendering the chart needs helm-python-sdk; install the toolkit's `chart` extra: pip install -e '.[chart]' "
            "(or run `bash scripts/bootstrap.sh dev`)",
            EXIT_FAILURE,
        ) from None
    # A JSON round trip: the engine takes plain JSON types (no tuples), as a values file would give it.
    plain = json.loads(json.dumps(values))
    path = chart_dir(chart)
    try:
        with helm_python.Chart.load(path) as loaded:
            files: dict[str, str] = loaded.render(values=plain, name=release, namespace=namespace)
    except helm_python.HelmError as error:
        refused = isinstance(error, helm_python.HelmValuesError)
        raise Glm53Error(explain(str(error), refused, path), EXIT_FAILURE) from None
    objects: list[RenderedObject] = []
    for name, text in sorted(files.items()):
        if name.endswith(".yaml"):
            try:
                objects += [doc for doc in yaml.safe_load_all(text) if doc]
            except yaml.YAMLError as error:
                raise Glm53Error(f"the chart rendered {name} as invalid YAML: {error}", EXIT_FAILURE) from None
    return objects


def explain(message: str, values_refused: bool, chart: Path) -> str:
    """Helm's error in one line. A guard's `fail` or a schema refusal says what to change; anything else is a bug."""
    text = " ".join(message.split())
    if values_refused or _GUARD.match(text):
        return f"the chart refused the values: {_GUARD.sub('', text)}"
    return f"cannot render the chart at {chart}: {text}"
