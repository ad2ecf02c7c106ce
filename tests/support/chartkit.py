"""Rendering the glm53 chart for the chart tests, with both real Helm engines, and reading the rendered objects.

The tests render with helm-python-sdk (Helm 4, in-process) for speed and cross-check with the Helm 3 CLI that
`scripts/setup.d/20-helm.sh` installs, because users install with either. Renders are cached per values document:
the same scenario is asserted on by many tests. External tools are looked up on PATH and in `.tools/bin`; a missing
one fails the test with a message naming its setup script (CI runs the setup scripts first).
"""

from __future__ import annotations

import functools
import json
import os
import shutil
import subprocess
import tempfile
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import helm_python
import yaml

from glm53.pod.contract import CHECKOUT_CHART, COMPONENT_LABEL, DEFAULT_RELEASE, ENGINE_COMPONENT

CHART_DIR = CHECKOUT_CHART
REPO_ROOT = CHART_DIR.parents[1]
CI_DIR = CHART_DIR / "ci"
RELEASE = DEFAULT_RELEASE
NAMESPACE = "llm"
# Helm 3's offline default Kubernetes version (1.25) is below the chart's kubeVersion; render for the oldest supported.
OLDEST_KUBE = "1.29.0"
NEWEST_KUBE = "1.37.0"
# Renders that need a newer Kubernetes than OLDEST_KUBE (so they are not ci/ scenarios, which every test renders at
# 1.29): name -> (values, the oldest version they render for).
NEWER_KUBE_RENDERS: dict[str, tuple[dict[str, Any], str]] = {"dra": ({"dra": {"enabled": True}}, "1.34.0")}
# Kinds from the Prometheus Operator CRDs; kubernetes-validate has schemas for built-in kinds only.
CRD_KINDS = frozenset({"ServiceMonitor", "PrometheusRule"})

Obj = dict[str, Any]

# The setup script that provides each external tool.
_SETUP = {"helm": "scripts/setup.d/20-helm.sh", "checkov": "scripts/setup.d/21-checkov.sh"}


class RenderError(Exception):
    """A render or lint that Helm refused; `message` is Helm's error text."""

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


def tool(name: str) -> str:
    """The path of an external tool, or an AssertionError naming the setup script that installs it."""
    found = shutil.which(name) or shutil.which(name, path=str(REPO_ROOT / ".tools" / "bin"))
    assert found, f"{name} not found on PATH or in .tools/bin; run `bash {_SETUP[name]}` first"
    return found


def scenarios() -> list[str]:
    """Names of the CI scenarios: `ci/<name>-values.yaml`."""
    return sorted(p.name.removesuffix("-values.yaml") for p in CI_DIR.glob("*-values.yaml"))


def scenario_values(name: str) -> Obj:
    loaded = yaml.safe_load((CI_DIR / f"{name}-values.yaml").read_text())
    return dict(loaded or {})


# The chart's appVersion: the serving image's default tag, and the tag the playbook builds.
APP_VERSION: str = yaml.safe_load((CHART_DIR / "Chart.yaml").read_text())["appVersion"]
# vllm.generation's opt-in release (the default is 0.33.0).
NEXT_VLLM = "0.34.0"


def at_vllm(values: Mapping[str, Any], generation: str) -> Obj:
    """`values` with vllm.generation set."""
    return {**values, "vllm": {**values.get("vllm", {}), "generation": generation}}


def vllm_next_scenarios() -> list[str]:
    """The CI scenarios that also render at vllm.generation=0.34.0: all but mock mode's (the CPU pod has no 0.34
    engine, so the chart refuses it)."""
    return [name for name in scenarios() if not (scenario_values(name).get("mock") or {}).get("enabled")]


def _key(values: Mapping[str, Any]) -> str:
    return json.dumps(values, sort_keys=True)


@functools.cache
def _sdk_render(values_json: str) -> dict[str, str]:
    with helm_python.Chart.load(CHART_DIR) as chart:
        try:
            rendered: dict[str, str] = chart.render(values=json.loads(values_json), name=RELEASE, namespace=NAMESPACE)
        except (helm_python.HelmValuesError, helm_python.HelmRenderError) as error:
            raise RenderError(str(error)) from None
    return rendered


def render_files(values: Mapping[str, Any]) -> dict[str, str]:
    """Template path -> rendered text, from helm-python-sdk (NOTES.txt included)."""
    return _sdk_render(_key(values))


def parse_manifests(text: str) -> list[Obj]:
    return [doc for doc in yaml.safe_load_all(text) if doc]


def render(values: Mapping[str, Any]) -> list[Obj]:
    """Every object the chart renders for these values (Helm 4 engine), NOTES excluded."""
    files = render_files(values)
    texts = [text for path, text in sorted(files.items()) if not path.endswith("NOTES.txt")]
    return [obj for text in texts for obj in parse_manifests(text)]


def notes(values: Mapping[str, Any]) -> str:
    return render_files(values)[f"{CHART_DIR.name}/templates/NOTES.txt"]


def _values_file(values: Mapping[str, Any], directory: str) -> str:
    path = os.path.join(directory, "values.json")
    Path(path).write_text(json.dumps(values))  # JSON is YAML
    return path


@functools.cache
def _cli_template(values_json: str, kube_version: str) -> str:
    with tempfile.TemporaryDirectory() as tmp:
        cmd = [tool("helm"), "template", RELEASE, str(CHART_DIR), "--namespace", NAMESPACE]
        cmd += ["--kube-version", kube_version, "-f", _values_file(json.loads(values_json), tmp)]
        done = subprocess.run(cmd, capture_output=True, text=True, check=False)
    if done.returncode:
        raise RenderError(done.stderr.strip())
    return done.stdout


def render_cli(values: Mapping[str, Any], kube_version: str = OLDEST_KUBE) -> list[Obj]:
    """Every object `helm template` (Helm 3 CLI) renders, test hooks included."""
    return parse_manifests(_cli_template(_key(values), kube_version))


def refusals(values: Mapping[str, Any]) -> tuple[str, str]:
    """The messages Helm 4 (the SDK) and Helm 3 (the CLI) refuse `values` with; a test failure if either renders."""
    messages = []
    for engine in (render, render_cli):
        try:
            engine(values)
        except RenderError as error:
            messages.append(error.message)
        else:
            raise AssertionError(f"{engine.__name__} rendered {values} instead of refusing it")
    return messages[0], messages[1]


def assert_refused(values: Mapping[str, Any], message: str) -> None:
    """Helm 4 (the SDK) and Helm 3 (the CLI) both refuse `values`, each with `message` in what it says."""
    sdk, cli = refusals(values)
    assert message in sdk and message in cli, f"expected {message!r} in both refusals:\nHelm 4: {sdk}\nHelm 3: {cli}"


def lint_cli(values: Mapping[str, Any]) -> str:
    """`helm lint --strict`; returns its output, raises RenderError when it fails."""
    with tempfile.TemporaryDirectory() as tmp:
        cmd = [tool("helm"), "lint", "--strict", str(CHART_DIR), "--namespace", NAMESPACE]
        cmd += ["-f", _values_file(values, tmp)]
        done = subprocess.run(cmd, capture_output=True, text=True, check=False)
    if done.returncode:
        raise RenderError(done.stdout + done.stderr)
    return done.stdout


def lint_sdk(values: Mapping[str, Any]) -> dict[str, Any]:
    report: dict[str, Any] = helm_python.lint(
        CHART_DIR, dict(values), strict=True, namespace=NAMESPACE, kube_version=f"v{OLDEST_KUBE}"
    )
    return report


# --- reading rendered objects ----------------------------------------------------------------------------------------


def objects(objs: Sequence[Obj], kind: str) -> list[Obj]:
    return [o for o in objs if o.get("kind") == kind]


def one(objs: Sequence[Obj], kind: str) -> Obj:
    found = objects(objs, kind)
    assert len(found) == 1, f"expected one {kind}, found {len(found)}"
    return found[0]


def get(obj: Any, path: str) -> Any:
    """A JSON-path-style lookup: dotted keys, `[3]` indexes and `[name=vllm]` list selections.

    `get(deploy, "spec.template.spec.containers[name=vllm].resources.limits.nvidia\\.com/gpu")` (escape literal dots).
    """
    for part in _split(path):
        if part.startswith("["):
            inner = part[1:-1]
            if "=" in inner:
                key, want = inner.split("=", 1)
                matches = [item for item in obj if str(item.get(key)) == want]
                assert len(matches) == 1, f"{path}: {len(matches)} items with {key}={want}"
                obj = matches[0]
            else:
                obj = obj[int(inner)]
        else:
            assert isinstance(obj, dict) and part in obj, f"{path}: no key {part!r}"
            obj = obj[part]
    return obj


def _split(path: str) -> Iterator[str]:
    token = ""
    i = 0
    while i < len(path):
        c = path[i]
        if c == "\\" and i + 1 < len(path):
            token += path[i + 1]
            i += 2
            continue
        if c == ".":
            if token:
                yield token
            token = ""
        elif c == "[":
            if token:
                yield token
            end = path.index("]", i)
            yield path[i : end + 1]
            token = ""
            i = end
        else:
            token += c
        i += 1
    if token:
        yield token


def engine(objs: Sequence[Obj], kind: str) -> Obj:
    """The serving pods' object of a kind (other components, e.g. the router, have their own Deployment, Service...)."""
    found = [o for o in objects(objs, kind) if get(o, "metadata.labels").get(COMPONENT_LABEL) == ENGINE_COMPONENT]
    assert len(found) == 1, f"expected one engine {kind}, found {len(found)}"
    return found[0]


# The kinds that can run the engine pod: a Deployment, or a StatefulSet for weights.source=newPvc with replicaCount > 1
# (each replica its own weights claim; charts/glm53/templates/engine/_storage.tpl).
ENGINE_WORKLOAD_KINDS = ("Deployment", "StatefulSet")


def engine_workload(objs: Sequence[Obj]) -> Obj:
    """The one object that runs the engine pods, whichever of ENGINE_WORKLOAD_KINDS it is."""
    found = [o for kind in ENGINE_WORKLOAD_KINDS for o in objects(objs, kind)]
    found = [o for o in found if get(o, "metadata.labels").get(COMPONENT_LABEL) == ENGINE_COMPONENT]
    assert len(found) == 1, f"expected one engine workload, found {[o['kind'] for o in found]}"
    return found[0]


def pod_spec(objs: Sequence[Obj]) -> Obj:
    """The engine pod's spec."""
    spec: Obj = get(engine_workload(objs), "spec.template.spec")
    return spec


def container(objs: Sequence[Obj], name: str) -> Obj:
    spec = pod_spec(objs)
    every = [*spec.get("initContainers", []), *spec["containers"]]
    found: Obj = get(every, f"[name={name}]")
    return found


def flag_value(args: Sequence[str], flag: str) -> str:
    """The value following `flag` in an argument list (exactly one occurrence)."""
    assert list(args).count(flag) == 1, f"{flag} occurs {list(args).count(flag)} times in {args}"
    return args[list(args).index(flag) + 1]
