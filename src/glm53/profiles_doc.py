"""Keep the README's model table generated from the profiles table, so the docs cannot drift from what is deployed.

`python -m glm53.profiles_doc README.md` rewrites the block between the `profiles-table` markers; a test fails when the
committed README differs from what this module renders.
"""

from __future__ import annotations

import sys
from pathlib import Path

from glm53.profiles import PROFILES, ModelProfile

START_MARKER = "<!-- profiles-table:start -->"
END_MARKER = "<!-- profiles-table:end -->"


def _groups_cell(profile: ModelProfile) -> str:
    tp = profile.tensor_parallel_size
    n = profile.unified_block_size(tp)
    groups = ", ".join(str(g) for g in profile.expected_groups(n))
    if profile.follows_unified_block_size:
        return f"`[{groups}]` (N = {n} at TP {tp} only)"
    return f"`[{groups}]`"


def _chunk_cell(profile: ModelProfile) -> str:
    others = [str(c) for c in profile.validated_chunk_sizes if c != profile.recommended_chunk_size]
    validated = f" (also validated: {', '.join(others)})" if others else ""
    return f"{profile.recommended_chunk_size}{validated}"


HEADER = (
    "| model | profile | architecture | GPUs (TP) | cache groups (`group_tokens_per_block`) | `--chunk-size` |\n"
    "| --- | --- | --- | --- | --- | --- |"
)


def _row(p: ModelProfile) -> str:
    model = f"`{p.model_id}` | `{p.name}` | `{p.architecture}`, {p.num_layers} layers"
    # A tiny CPU test model runs on the real engine's CPU backend, not on GPUs.
    where = "CPU test model" if p.tiny_model else f"{p.gpus}"
    return f"| {model} | {where} (TP {p.tensor_parallel_size}) | {_groups_cell(p)} | {_chunk_cell(p)} |"


def markdown_table() -> str:
    """The Markdown table: a header and one row per profile, in table order."""
    return "\n".join([HEADER, *(_row(p) for p in PROFILES.values())])


def render(text: str) -> str:
    """`text` with the block between the markers replaced by freshly rendered rows."""
    head, found_start, rest = text.partition(START_MARKER)
    _, found_end, tail = rest.partition(END_MARKER)
    if not found_start or not found_end:
        raise SystemExit(f"profiles_doc: the markers {START_MARKER} and {END_MARKER} are missing")
    return f"{head}{START_MARKER}\n{markdown_table()}\n{END_MARKER}{tail}"


def main(argv: list[str]) -> int:
    for name in argv:
        path = Path(name)
        path.write_text(render(path.read_text(encoding="utf-8")), encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
