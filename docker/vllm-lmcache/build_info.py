"""Write the serving image's build-info file: which vLLM, torch, LMCache, CUDA, GCC and arch list it holds.

Why: the failure this image exists to prevent is an LMCache extension compiled against a different torch than the
one serving. The runtime stage merges the facts ``build-lmcache.sh`` recorded at compile time (``lmcache-build.json``)
with the versions actually installed next to it, and refuses to write the file (failing the image build) when the
installed torch is not the torch LMCache was compiled against, or when an installed distribution is not the version
``constraints.txt`` pins (the joint vLLM + LMCache set, see joint_deps.py). Every installed distribution's version is
recorded under ``packages`` (what ``pip freeze`` would list). Standard library only.
"""

from __future__ import annotations

import argparse
import importlib.metadata
import json
import platform
import re
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path

PROG = "build-info"


class BuildInfoError(Exception):
    """A mismatch or unreadable input; its message is the one line printed."""


def merge(
    lmcache_build: Mapping[str, object], installed: Mapping[str, str], extra: Mapping[str, object]
) -> dict[str, object]:
    """The build-info record: compile-time facts plus installed versions; torch must match what LMCache was built on."""
    built_against = lmcache_build.get("torch_built_against")
    if built_against != installed["torch"]:
        raise BuildInfoError(
            f"expected the installed torch to be the one LMCache was compiled against ({built_against}) but found "
            f"{installed['torch']}; rebuild LMCache in an environment with the serving torch."
        )
    return {**lmcache_build, **installed, **extra}


def installed_versions(distributions: Sequence[str]) -> dict[str, str]:
    """Installed versions of ``distributions`` plus the interpreter's, keyed by distribution name."""
    versions = {"python": platform.python_version()}
    for name in distributions:
        try:
            versions[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError as exc:
            raise BuildInfoError(f"expected {name} installed for {sys.executable} but it is not.") from exc
    return versions


def read_pins(text: str) -> dict[str, str]:
    """``name==version`` lines of a constraints file by normalised name; comments and blank lines skipped."""
    pinned = {}
    for raw in text.splitlines():
        name, sep, version = raw.split("#", 1)[0].strip().partition("==")
        if sep:
            pinned[normalise(name)] = version.strip()
    return pinned


def normalise(name: str) -> str:
    """A distribution name as PEP 503 compares it (``Prometheus_Client`` is ``prometheus-client``)."""
    return re.sub(r"[-_.]+", "-", name.strip()).lower()


def unpinned(pinned: Mapping[str, str], packages: Mapping[str, str]) -> list[str]:
    """Each pinned distribution installed at another version (or missing), as ``name pinned X, installed Y``."""
    return [
        f"{name} pinned {version}, installed {packages.get(name, 'nothing')}"
        for name, version in sorted(pinned.items())
        if packages.get(name) != version
    ]


def all_installed() -> dict[str, str]:
    """Every distribution of this interpreter's environment, by normalised name (``pip freeze``'s set)."""
    return {normalise(dist.metadata["Name"]): dist.version for dist in importlib.metadata.distributions()}


def key_value(text: str) -> tuple[str, str]:
    """An argparse type for ``KEY=VALUE``."""
    key, sep, value = text.partition("=")
    if not sep or not key:
        raise argparse.ArgumentTypeError(f"expected KEY=VALUE but got {text!r}")
    return key, value


def parse_args(argv: Sequence[str]) -> argparse.Namespace:
    """Command-line interface."""
    parser = argparse.ArgumentParser(prog=PROG, description="Write /opt/glm53/build-info.json.")
    parser.add_argument("--lmcache-build", type=Path, required=True, help="lmcache-build.json from build-lmcache.sh")
    parser.add_argument("--output", type=Path, required=True, help="where to write build-info.json")
    parser.add_argument(
        "--constraints", type=Path, help="constraints.txt: every pinned distribution must be installed at its pin"
    )
    parser.add_argument(
        "--set",
        action="append",
        default=[],
        type=key_value,
        metavar="KEY=VALUE",
        help="extra facts (e.g. vcs_revision=...)",
    )
    return parser.parse_args(list(argv))


def main(argv: Sequence[str]) -> int:
    """Merge, check and write; exit 1 with one line on a mismatch."""
    args = parse_args(argv)
    try:
        try:
            lmcache_build = json.loads(args.lmcache_build.read_text(encoding="utf-8"))
        except (OSError, json.JSONDecodeError) as exc:
            raise BuildInfoError(f"expected a JSON file at {args.lmcache_build} but could not read it: {exc}.") from exc
        extra: dict[str, object] = dict(args.set)
        if args.constraints is not None:
            try:
                pinned = read_pins(args.constraints.read_text(encoding="utf-8"))
            except OSError as exc:
                raise BuildInfoError(
                    f"expected constraints at {args.constraints} but could not read them: {exc}."
                ) from exc
            packages = all_installed()
            mismatches = unpinned(pinned, packages)
            if mismatches:
                raise BuildInfoError(
                    f"expected the versions {args.constraints.name} pins but found {'; '.join(mismatches)}; "
                    "install with `pip install -c` or regenerate the file (joint_deps.py --write)."
                )
            extra["packages"] = packages
        record = merge(lmcache_build, installed_versions(["vllm", "torch", "lmcache"]), extra)
    except BuildInfoError as exc:
        print(f"{PROG}: error: {exc}", file=sys.stderr)
        return 1
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text(json.dumps(record, indent=2, sort_keys=True) + "\n", encoding="utf-8")
    print(f"{PROG}: wrote {args.output}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
