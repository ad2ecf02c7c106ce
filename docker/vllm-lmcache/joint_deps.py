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
# The two top-level distributions of the serving image; the Dockerfile installs them by name, so they are not pinned
# in the constraints file (an LMCACHE_SOURCE=git:<ref> build has another version).
ROOTS = {"vllm": "0.33.0", "lmcache": "0.5.6"}
# The image's Python (docker/vllm-lmcache/Dockerfile, ARG PYTHON_VERSION: Ubuntu 24.04's python3.12).
TARGET_PYTHON = "3.12"
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


class JointDepsError(Exception):
    """A problem with the joint set; its message is the one line printed."""


@dataclass(frozen=True)
class Resolution:
    """What pip's installation report says: version per distribution, each one's requirements, the marker env."""

    versions: dict[str, str]
    requires: dict[str, tuple[str, ...]]
    environment: dict[str, str]


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


def pins(resolution: Resolution) -> dict[str, str]:
    """The constraints: every resolved distribution but the roots, by canonical name."""
    return {name: version for name, version in resolution.versions.items() if name not in ROOTS}


def render_constraints(pinned: Mapping[str, str]) -> str:
    """The constraints file: the header, then ``name==version`` sorted by name."""
    lines = [f"{name}=={version}" for name, version in sorted(pinned.items())]
    return HEADER.format(python=TARGET_PYTHON, **ROOTS) + "\n".join(lines) + "\n"


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


def resolve(python: str, constraints: Path | None) -> Resolution:
    """Ask ``python``'s pip for the joint set (``--dry-run --ignore-installed``: nothing is installed)."""
    with tempfile.TemporaryDirectory(prefix="glm53-joint-deps-") as scratch:
        report_path = Path(scratch) / "report.json"
        argv = [
            python,
            "-m",
            "pip",
            "install",
            "--dry-run",
            "--ignore-installed",
            "--quiet",
            "--report",
            str(report_path),
        ]
        argv += ["-c", str(constraints)] if constraints else []
        argv += [f"{name}=={version}" for name, version in ROOTS.items()]
        try:
            done = subprocess.run(argv, capture_output=True, text=True, check=False)
        except OSError as exc:
            raise JointDepsError(
                f"expected a Python {TARGET_PYTHON} at {python!r} but could not run it: {exc}"
            ) from exc
        if done.returncode != 0:
            errors = [line for line in done.stderr.splitlines() if line.startswith("ERROR")] or [done.stderr.strip()]
            raise JointDepsError(f"pip could not resolve the joint set: {' '.join(errors)}")
        resolution = read_report(json.loads(report_path.read_text(encoding="utf-8")))
    found = resolution.environment.get("python_version")
    if found != TARGET_PYTHON:
        raise JointDepsError(
            f"expected the image's Python {TARGET_PYTHON} to resolve, found {found} at {python}; "
            f"pass --python python{TARGET_PYTHON}"
        )
    return resolution


def check(python: str, constraints: Path) -> Resolution:
    """Resolve under ``constraints``; fail when a requirement is unmet or the file is not exactly the set."""
    try:
        pinned = parse_constraints(constraints.read_text(encoding="utf-8"))
    except OSError as exc:
        raise JointDepsError(f"expected the constraints file at {constraints} but could not read it: {exc}") from exc
    resolution = resolve(python, constraints)
    problems = unmet_requirements(resolution, ROOTS) + drift(pinned, pins(resolution))
    if problems:
        raise JointDepsError(
            f"{len(problems)} problem(s) with {constraints.name}: {'; '.join(problems)}; regenerate it with --write"
        )
    return resolution


def parse_args(argv: Sequence[str]) -> argparse.Namespace:
    """Command-line interface."""
    parser = argparse.ArgumentParser(prog=PROG, description="Resolve and check the serving image's joint set.")
    parser.add_argument("--python", default=f"python{TARGET_PYTHON}", help="the image's Python, whose pip resolves")
    parser.add_argument("--constraints", type=Path, default=CONSTRAINTS, help="the constraints file")
    action = parser.add_mutually_exclusive_group(required=True)
    action.add_argument("--write", action="store_true", help="resolve fresh from the index and write the file")
    action.add_argument("--check", action="store_true", help="resolve under the file and check it")
    return parser.parse_args(list(argv))


def main(argv: Sequence[str]) -> int:
    """Write or check; exit 1 with one line on a problem."""
    args = parse_args(argv)
    try:
        if args.write:
            resolution = resolve(args.python, None)
            problems = unmet_requirements(resolution, ROOTS)
            if problems:
                raise JointDepsError(f"the fresh resolution does not satisfy: {'; '.join(problems)}")
            args.constraints.write_text(render_constraints(pins(resolution)), encoding="utf-8")
            print(f"{PROG}: wrote {len(pins(resolution))} pins to {args.constraints}")
        else:
            resolution = check(args.python, args.constraints)
            print(f"{PROG}: {args.constraints} is the joint set ({len(resolution.versions)} distributions)")
    except JointDepsError as exc:
        print(f"{PROG}: error: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
