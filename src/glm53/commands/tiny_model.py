"""`glm53 tiny-model --shape dense|hybrid --out DIR`: make a tiny CPU test model for the real vLLM engine.

The chart's mock mode with `mock.engine=vllm` runs this as an init container, so the model is made in the pod and no
hub is reached; `--check` verifies a directory against the manifest a build wrote (same inputs, same bytes).

A directory that already holds this shape's model, every file as its manifest names it, is left as it is: the weights
volume may be shared (replicas of a loopback fleet mount one directory, as pods mount one claim in a cluster), and a
second replica's init container must not rewrite files the first replica's engine is reading.
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Sequence
from pathlib import Path

from glm53 import tinymodels
from glm53.commands.parser import command_parser
from glm53.errors import EXIT_FAILURE, EXIT_OK, Glm53Error


def build_parser() -> argparse.ArgumentParser:
    parser = command_parser(
        "tiny-model",
        "Make a tiny CPU test model (a tokenizer trained here, a config, seeded random safetensors "
        "weights) that the real vLLM engine serves in mock mode; deterministic, never downloaded.",
    )
    parser.add_argument("--shape", required=True, choices=tuple(tinymodels.SHAPES), help="which model to make")
    parser.add_argument("--out", required=True, type=Path, help="directory to write (created if missing)")
    parser.add_argument(
        "--check", action="store_true", help="verify --out against its manifest instead of writing anything"
    )
    return parser


def check(shape: tinymodels.TinyShape, directory: Path) -> None:
    """The directory's files must be the ones its manifest names, byte for byte, for this shape."""
    try:
        manifest = json.loads((directory / tinymodels.MANIFEST).read_text())
    except (OSError, json.JSONDecodeError) as error:
        raise Glm53Error(f"{directory} holds no readable {tinymodels.MANIFEST} ({error}); build it first") from None
    if manifest.get("shape") != shape.name:
        raise Glm53Error(f"{directory} holds the {manifest.get('shape')!r} model, not {shape.name!r}", EXIT_FAILURE)
    found = tinymodels.manifest_of(directory)
    changed = sorted(name for name in {*found, *manifest["files"]} if found.get(name) != manifest["files"].get(name))
    if changed:
        raise Glm53Error(f"{directory} differs from its manifest in {', '.join(changed)}; build it again", EXIT_FAILURE)


def main(argv: Sequence[str]) -> int:
    args = build_parser().parse_args(argv)
    shape = tinymodels.get_shape(args.shape)
    if args.check:
        check(shape, args.out)
        print(f"glm53 tiny-model: {args.out} is the {shape.name} model its manifest names")
        return EXIT_OK
    try:
        check(shape, args.out)
    except Glm53Error:
        manifest = tinymodels.build(shape, args.out)
    else:
        print(f"glm53 tiny-model: {args.out} already holds the {shape.name} model its manifest names; left as it is")
        return EXIT_OK
    sizes = sum((args.out / name).stat().st_size for name in manifest)
    print(
        f"glm53 tiny-model: {shape.name} ({shape.architecture}) in {args.out}: {len(manifest)} files, "
        f"{sizes / 2**20:.1f} MiB, weights sha256 {manifest['model.safetensors'][:16]}"
    )
    return EXIT_OK
