"""Resolve and check the serving image's joint dependency set: vLLM 0.33.0 and LMCache 0.5.6 in one environment.

Why: vLLM 0.33.0 alone resolves numpy 2.3.5, protobuf 7.x, prometheus-client 0.26, opentelemetry 1.45 and
setuptools 84, while LMCache 0.5.6 declares ``numpy<=2.2.6``, ``protobuf<7``, ``prometheus_client<=0.24.1``,
``opentelemetry-api<=1.40.0`` and ``setuptools<81`` (lmcache-0.5.6.dist-info/METADATA, its Requires-Dist lines).
Installed one after the other, the second install silently downgrades what the first installed. A joint set that
satisfies both exists (vLLM's own ranges are open enough), so the image takes it on purpose: ``constraints.txt`` pins
every distribution of the joint resolution, both ``pip install`` steps of the Dockerfile honour it (``-c``), and
``pip check`` runs after them. With every distribution pinned, the vLLM install already lands on the joint versions and
the LMCache install changes nothing it installed.

``--write`` resolves the set fresh from the package index with the image's Python (``pip install --dry-run --report``,
nothing is installed) and writes the file; ``--check`` resolves it again under the file and fails, in one line, when
the file is stale or the set does not satisfy a requirement of vLLM or LMCache. The requirement check reads the
``Requires-Dist`` metadata pip reports, evaluated with the markers of the interpreter that resolved (hence the image's
Python: pip's ``--python-version`` does not apply to markers, so ``six; python_version > "3.11"`` would be missed).

vLLM 0.34.0 (``--vllm 0.34.0``, an opt-in generation; 0.33.0 stays the default) and LMCache 0.5.6 as released cannot be
installed together: vLLM requires opentelemetry-api/sdk/exporter-otlp ``>=1.45.1`` where LMCache caps
``opentelemetry-api<=1.40.0`` and ``opentelemetry-exporter-prometheus<=0.61b0`` (only 0.66b pairs with SDK 1.45).
So that generation is resolved by uv with overrides (``uv pip compile --override``: an override replaces every
requirement on its distribution), each one listed below with its reason, and the requirement check then covers every
distribution of the set (what ``pip check`` would say, since the overrides bypass the resolver's own check): it passes
naming, one line each, exactly the documented exceptions, and fails on anything else unmet or on an exception that no
longer occurs. The requirement metadata still comes from the image's Python's pip (``--no-deps --report`` of the pins).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

PROG = "joint-deps"
# The image's Python (docker/vllm-lmcache/Dockerfile, ARG PYTHON_VERSION: Ubuntu 24.04's python3.12).
TARGET_PYTHON = "3.12"
# What uv resolves an override generation for: the image's Linux x86_64 (Ubuntu 24.04's glibc 2.39).
TARGET_PLATFORM = "x86_64-manylinux_2_39"
# An override with a marker no interpreter meets removes its distribution from uv's resolution.
NEVER = 'python_version < "0"'
CONSTRAINTS = Path(__file__).with_name("constraints.txt")
# The header's last line names the Python the set was resolved for; the Dockerfile's check-python.sh reads it and fails
# the build before anything is installed when PYTHON_VERSION names another (3.11 fails on networkx==3.7).
# constraints.txt is one of the serving image's hashed inputs (image_proof.INPUTS), so the header still names the test's
# old folder (tests/docker, now tests/images) until the image proof runs again: renaming it alone voids the record.
HEADER = """\
# The serving image's joint dependency set: vllm=={vllm} and lmcache=={lmcache} resolved together for CPython
# {python} on Linux x86_64, every distribution pinned. Both pip installs of the Dockerfile honour it (-c), so the
# LMCache install downgrades nothing vLLM installed; `pip check` runs after them. Generated, do not edit by hand:
#   .venv/bin/python docker/vllm-lmcache/joint_deps.py --python python{python} --write
# (and checked in CI by tests/docker/test_joint_deps.py with `--check`). The Dockerfile refuses any other Python
# (check-python.sh reads the next line).
# python-version: {python}
"""
# The header of a generation resolved with overrides: it names its exceptions, since `pip check` will.
OVERRIDDEN_HEADER = """\
# The joint dependency set of vllm=={vllm} and lmcache=={lmcache} for CPython {python} on Linux x86_64, every
# distribution pinned. As released the two cannot be installed together: uv resolved them with the overrides
# docker/vllm-lmcache/joint_deps.py lists with their reasons, so `pip check` on this set names these, and only these:
{exceptions}
# Generated, do not edit by hand:
#   .venv/bin/python docker/vllm-lmcache/joint_deps.py --vllm {vllm} --python python{python} --write
# (and checked by tests/images/test_joint_deps.py with `--check`). check-python.sh reads the next line.
# python-version: {python}
"""


class JointDepsError(Exception):
    """A problem with the joint set; its message is the one line printed."""


@dataclass(frozen=True)
class Override:
    """A uv override the set needs. It replaces every requirement on its distribution, so it states the whole answer,
    and the one requirement it exists to lift (``dependent`` requires ``lifted``) stays unmet in the set, on purpose."""

    requirement: str
    dependent: str
    lifted: str
    reason: str

    def problem_prefix(self) -> str:
        """How ``unmet_requirements`` begins the line for the lifted requirement."""
        return f"{self.dependent} requires {Requirement(self.lifted)} but "

    def exception(self) -> str:
        """The documented exception, one line."""
        return f"{self.dependent} requires {Requirement(self.lifted)}: overridden to {self.requirement} ({self.reason})"


@dataclass(frozen=True)
class Gap:
    """A distribution the set needs at an exact version the package index lacks: pinned alone, as its dependent pins
    it, and left out of the resolution, so its own requirements are not resolved here."""

    name: str
    version: str
    reason: str

    def exception(self) -> str:
        """The documented exception, one line."""
        return f"{self.name}=={self.version} pinned unresolved: {self.reason}"


@dataclass(frozen=True)
class Generation:
    """One engine generation's joint set: its two roots, its constraints file and what it knowingly departs from."""

    roots: Mapping[str, str]
    constraints: Path
    overrides: tuple[Override, ...] = ()
    gaps: tuple[Gap, ...] = ()

    def exceptions(self) -> list[str]:
        """Every documented exception, one line each."""
        return [item.exception() for item in self.overrides] + [gap.exception() for gap in self.gaps]


# LMCache 0.5.6's caps on OpenTelemetry come from LMCache PR #3000 ("[hotfix] fix prometheus version for UT failure",
# 2026-04-10), which pinned prometheus_client <= 0.24.1 against a breaking change in newer releases and capped
# opentelemetry-api and opentelemetry-exporter-prometheus at the releases of that day. What 0.5.6 uses of them
# (lmcache-0.5.6 wheel) is OpenTelemetry's stable 1.x API and SDK: opentelemetry.metrics (get_meter, Observation,
# create_observable_gauge, Histogram; lmcache/v1/mp_observability/otel_init.py:76-77,261-276, subscribers/metrics/*.py,
# e.g. cb_server.py:12-13), opentelemetry.trace (Status, StatusCode; subscribers/tracing/*.py, e.g. timeout.py:23-24),
# the SDK's MeterProvider, PeriodicExportingMetricReader, TracerProvider, BatchSpanProcessor and Resource.create
# (otel_init.py:41-45,77-93,209-216), the OTLP gRPC exporters with (endpoint, insecure=True) (otel_init.py:84-91,
# 206-213), PrometheusMetricReader() without arguments (otel_init.py:105-111; 0.66b2 still takes only optional ones)
# and the SDK's LoggingHandler, behind an ImportError guard (lmcache/logging.py:84-91; 1.45.2 still exports it). Of
# prometheus_client it uses REGISTRY, generate_latest, CONTENT_TYPE_LATEST, start_http_server and the text parser
# (lmcache/v1/internal_api_server/common/metrics_api.py:4, mp_coordinator/http_apis/metrics_api.py:6,
# otel_init.py:106-117, cli/commands/describe.py:17). So the OpenTelemetry caps can be lifted; prometheus_client's
# (the one PR #3000 was about) stays, since vLLM 0.34.0 accepts 0.24.1 (prometheus_client>=0.18.0).
# tests/images/test_otel_override_live.py runs 0.5.6's server under this set's OpenTelemetry to prove it.
GENERATIONS = {
    "0.33.0": Generation(roots={"vllm": "0.33.0", "lmcache": "0.5.6"}, constraints=CONSTRAINTS),
    "0.34.0": Generation(
        roots={"vllm": "0.34.0", "lmcache": "0.5.6"},
        constraints=CONSTRAINTS.with_name("constraints-vllm0.34.0.txt"),
        overrides=(
            # ==, not >=1.45.1: the override replaces opentelemetry-sdk's exact pin on the API too, so it restates it
            # (opentelemetry-sdk 1.45.2 requires opentelemetry-api==1.45.2; the check verifies that requirement).
            Override(
                requirement="opentelemetry-api==1.45.2",
                dependent="lmcache",
                lifted="opentelemetry-api<=1.40.0,>=1.20.0",
                reason="vllm 0.34.0 requires >=1.45.1; LMCache's cap is PR #3000's hotfix and 0.5.6 uses only the "
                "stable 1.x API",
            ),
            Override(
                requirement="opentelemetry-exporter-prometheus>=0.50b0",
                dependent="lmcache",
                lifted="opentelemetry-exporter-prometheus<=0.61b0,>=0.50b0",
                reason="0.61b0 requires opentelemetry-sdk~=1.40.0, SDK 1.45 pairs with 0.66b; LMCache calls only "
                "PrometheusMetricReader()",
            ),
        ),
        gaps=(
            Gap(
                name="flashinfer-python",
                version="0.7.3",
                reason="vllm 0.34.0 pins it and this index lacks it (0.7.2.post1, 0.7.4); its own requirements are "
                "resolved at build time on an index that has it",
            ),
        ),
    ),
}
DEFAULT_GENERATION = "0.33.0"


@dataclass(frozen=True)
class Resolution:
    """What pip's installation report says: version per distribution, each one's requirements, the marker env."""

    versions: dict[str, str]
    requires: dict[str, tuple[str, ...]]
    environment: dict[str, str]


def generation_named(name: str) -> Generation:
    """The generation of vLLM version ``name``; one line naming the known ones otherwise."""
    try:
        return GENERATIONS[name]
    except KeyError:
        raise JointDepsError(f"expected a known vLLM generation ({', '.join(GENERATIONS)}) but got {name!r}") from None


def read_report(report: Mapping[str, Any]) -> Resolution:
    """The resolution in a ``pip install --report`` document (format version 1)."""
    versions: dict[str, str] = {}
    requires: dict[str, tuple[str, ...]] = {}
    for item in report["install"]:
        metadata = item["metadata"]
        name = canonicalize_name(metadata["name"])
        versions[name] = str(metadata["version"])
        requires[name] = tuple(metadata.get("requires_dist", []))
    return Resolution(versions=versions, requires=requires, environment=dict(report["environment"]))


def unmet_requirements(resolution: Resolution, roots: Iterable[str]) -> list[str]:
    """Each requirement of ``roots`` (no extras, markers of the resolving interpreter) the set does not satisfy."""
    problems = []
    for root in roots:
        name = canonicalize_name(root)
        if name not in resolution.versions:
            problems.append(f"{root} is not in the set")
            continue
        for text in resolution.requires[name]:
            requirement = Requirement(text)
            if requirement.marker is not None and not requirement.marker.evaluate(
                {**resolution.environment, "extra": ""}
            ):
                continue
            found = resolution.versions.get(canonicalize_name(requirement.name))
            if found is None:
                problems.append(f"{root} requires {requirement} but the set has no {requirement.name}")
            elif not requirement.specifier.contains(found, prereleases=True):
                problems.append(f"{root} requires {requirement} but the set has {requirement.name} {found}")
    return problems


def problems_beyond_exceptions(resolution: Resolution, generation: Generation) -> list[str]:
    """What the set leaves unmet beyond the generation's documented exceptions, and each override whose lifted
    requirement is met after all (a stale exception). Without overrides only the roots' requirements are checked
    (pip's resolver met the rest); with them every distribution's, as ``pip check`` will."""
    if not generation.overrides:
        return unmet_requirements(resolution, generation.roots)
    problems = unmet_requirements(resolution, resolution.versions)
    for override in generation.overrides:
        waived = [problem for problem in problems if problem.startswith(override.problem_prefix())]
        if not waived:
            problems.append(f"the documented exception '{override.exception()}' no longer occurs; drop its override")
        problems = [problem for problem in problems if problem not in waived]
    return problems


def pins(resolution: Resolution, generation: Generation) -> dict[str, str]:
    """The constraints: every resolved distribution but the roots, by canonical name."""
    return {name: version for name, version in resolution.versions.items() if name not in generation.roots}


def render_constraints(pinned: Mapping[str, str], generation: Generation) -> str:
    """The constraints file: the header, then ``name==version`` sorted by name."""
    lines = [f"{name}=={version}" for name, version in sorted(pinned.items())]
    if generation.overrides or generation.gaps:
        exceptions = "\n".join(f"#   {line}" for line in generation.exceptions())
        header = OVERRIDDEN_HEADER.format(python=TARGET_PYTHON, exceptions=exceptions, **generation.roots)
    else:
        header = HEADER.format(python=TARGET_PYTHON, **generation.roots)
    return header + "\n".join(lines) + "\n"


def parse_constraints(text: str) -> dict[str, str]:
    """``name==version`` lines of a constraints file (comments and blank lines skipped)."""
    pinned: dict[str, str] = {}
    for number, raw in enumerate(text.splitlines(), start=1):
        line = raw.split("#", 1)[0].strip()
        if not line:
            continue
        name, sep, version = line.partition("==")
        if not sep or not name.strip() or not version.strip():
            raise JointDepsError(f"expected name==version on line {number} of the constraints file, found {raw!r}")
        pinned[canonicalize_name(name.strip())] = version.strip()
    return pinned


def drift(expected: Mapping[str, str], found: Mapping[str, str]) -> list[str]:
    """Differences between the pinned set and a resolved one, one phrase each, sorted by name."""
    problems = []
    for name in sorted(set(expected) | set(found)):
        want, got = expected.get(name), found.get(name)
        if want != got:
            problems.append(f"{name} pinned {want or 'nowhere'}, resolved {got or 'not at all'}")
    return problems


def run_tool(argv: Sequence[str], resolver: str, missing: str, stdin: str = "") -> str:
    """Run ``resolver``'s ``argv`` and return its stdout; one line (its ERROR lines, else its stderr) when it fails."""
    try:
        done = subprocess.run(list(argv), input=stdin, capture_output=True, text=True, check=False)
    except OSError as exc:
        raise JointDepsError(f"expected {missing} at {argv[0]!r} but could not run it: {exc}") from exc
    if done.returncode != 0:
        errors = [line for line in done.stderr.splitlines() if line.startswith("ERROR")] or [
            " ".join(done.stderr.split())
        ]
        raise JointDepsError(f"{resolver} could not resolve the joint set: {' '.join(errors)}")
    return done.stdout


def pip_report(python: str, requirements: Sequence[str]) -> Resolution:
    """Ask ``python``'s pip what installing ``requirements`` would install (``--dry-run --ignore-installed``: nothing
    is installed), with the metadata of each distribution and the interpreter's markers."""
    with tempfile.TemporaryDirectory(prefix="glm53-joint-deps-") as scratch:
        report_path = Path(scratch) / "report.json"
        argv = [python, "-m", "pip", "install", "--dry-run", "--ignore-installed", "--quiet", "--report"]
        run_tool([*argv, str(report_path), *requirements], "pip", f"a Python {TARGET_PYTHON}")
        resolution = read_report(json.loads(report_path.read_text(encoding="utf-8")))
    found = resolution.environment.get("python_version")
    if found != TARGET_PYTHON:
        raise JointDepsError(
            f"expected the image's Python {TARGET_PYTHON} to resolve, found {found} at {python}; "
            f"pass --python python{TARGET_PYTHON}"
        )
    return resolution


def uv_compile(uv: str, generation: Generation, constraints: Path | None) -> dict[str, str]:
    """The set uv resolves for the roots under the generation's overrides (its gaps removed), for the image's Python
    and platform: version per distribution."""
    overrides = [item.requirement for item in generation.overrides]
    overrides += [f"{gap.name}; {NEVER}" for gap in generation.gaps]
    roots = "".join(f"{name}=={version}\n" for name, version in generation.roots.items())
    with tempfile.TemporaryDirectory(prefix="glm53-joint-deps-") as scratch:
        override_path = Path(scratch) / "overrides.txt"
        override_path.write_text("\n".join(overrides) + "\n", encoding="utf-8")
        argv = [uv, "pip", "compile", "-", "--override", str(override_path), "--quiet", "--no-header", "--no-annotate"]
        argv += ["--python-version", TARGET_PYTHON, "--python-platform", TARGET_PLATFORM]
        argv += ["--constraint", str(constraints)] if constraints else []
        return parse_constraints(run_tool(argv, "uv", "uv", stdin=roots))


def resolve(python: str, uv: str, generation: Generation, constraints: Path | None) -> Resolution:
    """The joint set, under ``constraints`` when given. Without overrides pip's resolver finds it; with them uv does
    and pip reads the found distributions' metadata alone (``--no-deps``), the gaps added unread."""
    if not generation.overrides:
        pinned = ["-c", str(constraints)] if constraints else []
        return pip_report(python, [*pinned, *(f"{name}=={version}" for name, version in generation.roots.items())])
    versions = uv_compile(uv, generation, constraints)
    resolution = pip_report(python, ["--no-deps", *(f"{name}=={version}" for name, version in versions.items())])
    for gap in generation.gaps:
        resolution.versions[canonicalize_name(gap.name)] = gap.version
        resolution.requires[canonicalize_name(gap.name)] = ()
    return resolution


def check(python: str, uv: str, generation: Generation, constraints: Path) -> Resolution:
    """Resolve under ``constraints``; fail when a requirement is unmet beyond the documented exceptions or the file is
    not exactly the set."""
    try:
        pinned = parse_constraints(constraints.read_text(encoding="utf-8"))
    except OSError as exc:
        raise JointDepsError(f"expected the constraints file at {constraints} but could not read it: {exc}") from exc
    resolution = resolve(python, uv, generation, constraints)
    problems = problems_beyond_exceptions(resolution, generation) + drift(pinned, pins(resolution, generation))
    if problems:
        raise JointDepsError(
            f"{len(problems)} problem(s) with {constraints.name}: {'; '.join(problems)}; regenerate it with --write"
        )
    return resolution


def parse_args(argv: Sequence[str]) -> argparse.Namespace:
    """Command-line interface."""
    parser = argparse.ArgumentParser(prog=PROG, description="Resolve and check the serving image's joint set.")
    parser.add_argument("--vllm", default=DEFAULT_GENERATION, help=f"the vLLM generation ({', '.join(GENERATIONS)})")
    parser.add_argument("--python", default=f"python{TARGET_PYTHON}", help="the image's Python, whose pip resolves")
    parser.add_argument("--uv", default=str(Path(sys.executable).with_name("uv")), help="uv, for overridden sets")
    parser.add_argument("--constraints", type=Path, help="the constraints file (default: the generation's)")
    action = parser.add_mutually_exclusive_group(required=True)
    action.add_argument("--write", action="store_true", help="resolve fresh from the index and write the file")
    action.add_argument("--check", action="store_true", help="resolve under the file and check it")
    return parser.parse_args(list(argv))


def main(argv: Sequence[str]) -> int:
    """Write or check; exit 1 with one line on a problem."""
    args = parse_args(argv)
    try:
        generation = generation_named(args.vllm)
        constraints = args.constraints or generation.constraints
        if args.write:
            resolution = resolve(args.python, args.uv, generation, None)
            problems = problems_beyond_exceptions(resolution, generation)
            if problems:
                raise JointDepsError(f"the fresh resolution does not satisfy: {'; '.join(problems)}")
            constraints.write_text(render_constraints(pins(resolution, generation), generation), encoding="utf-8")
            print(f"{PROG}: wrote {len(pins(resolution, generation))} pins to {constraints}")
        else:
            resolution = check(args.python, args.uv, generation, constraints)
            print(f"{PROG}: {constraints} is the joint set ({len(resolution.versions)} distributions)")
        for line in generation.exceptions():
            print(f"{PROG}: documented exception: {line}")
    except JointDepsError as exc:
        print(f"{PROG}: error: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
