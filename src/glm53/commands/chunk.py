"""`glm53 chunk`: the chunk-size arithmetic on the command line — coverage, negotiation, and a recommendation.

Operators choose LMCache's `--chunk-size` once per deployment and live with its cost on every request (the tail of
each prompt is recomputed), so these subcommands answer the three questions with the same pure functions the probe
uses: how much of a prompt is served, what a negotiating server settles on, and which chunk size pays off best over a
real prompt-length distribution (one integer a line, a CSV with a tokens/length column, or a JSON list; see
examples/prompt-lengths.txt).
"""

from __future__ import annotations

import argparse
import csv
import json
from collections.abc import Sequence
from pathlib import Path

from glm53.chunks import (
    DEFAULT_CHUNK_OVERHEAD_TOKENS,
    Recommendation,
    coverage,
    negotiate_chunk_size,
    parse_groups,
    parse_non_negative,
    parse_positive,
    recommend,
    required_alignment,
)
from glm53.commands.parser import command_parser
from glm53.errors import Glm53Error
from glm53.profiles import PROFILES, ModelProfile, get_profile

_LENGTH_COLUMN_HINTS = ("tokens", "length")
PROMPT_LENGTHS_FORMAT = (
    "FILE holds prompt lengths in tokens: one positive integer a line ('#' comments and blank lines ignored), or a CSV "
    "whose header names a column like 'tokens' or 'length', or a JSON list of integers. Example: "
    "examples/prompt-lengths.txt."
)


def _build_parser() -> argparse.ArgumentParser:
    parser = command_parser("chunk", "LMCache chunk-size arithmetic.")
    actions = parser.add_subparsers(dest="action", required=True, metavar="ACTION")
    cov = actions.add_parser("coverage", help="tokens of one prompt LMCache can serve at a chunk size")
    cov.add_argument("--prompt-tokens", required=True, metavar="L")
    cov.add_argument("--chunk-size", required=True, metavar="C")
    cov.add_argument("--strict-prefix", action="store_true", help="hybrid rule: at most floor((L-1)/C)*C")
    neg = actions.add_parser("negotiate", help="the chunk size a negotiating LMCache server settles on")
    neg.add_argument("--configured-min", required=True, metavar="M")
    neg.add_argument("--groups", required=True, metavar="G,G,...", help="group_tokens_per_block, e.g. 1152,1152,0")
    rec = actions.add_parser(
        "recommend",
        help="rank valid chunk sizes over a prompt-length distribution",
        description="Rank the valid chunk sizes for a workload: sizes the model was validated at first, then by net "
        "tokens (tokens served from LMCache minus a per-chunk overhead for the key hash, lookup and stored object). "
        + PROMPT_LENGTHS_FORMAT,
    )
    rec.add_argument("--prompt-lengths", required=True, type=Path, metavar="FILE", help=PROMPT_LENGTHS_FORMAT)
    model = rec.add_mutually_exclusive_group(required=True)
    model.add_argument(
        "--profile", metavar="NAME", help=f"model profile ({', '.join(PROFILES)}): its groups, rule and validated sizes"
    )
    model.add_argument("--groups", metavar="G,G,...", help="group_tokens_per_block, e.g. 64 or 1152,1152,0")
    rec.add_argument("--strict-prefix", action="store_true", help="hybrid rule: at most floor((L-1)/C)*C")
    rec.add_argument("--limit", default="16", metavar="K", help="consider the first K multiples (default %(default)s)")
    rec.add_argument(
        "--chunk-overhead-tokens",
        default=str(DEFAULT_CHUNK_OVERHEAD_TOKENS),
        metavar="T",
        help="prefill tokens one chunk's hash, lookup and metadata are worth (an assumption; "
        "default %(default)s, 0 ignores the cost)",
    )
    return parser


def parse_prompt_lengths(text: str, name: str) -> list[int]:
    """Prompt lengths from a file's text: a JSON list, a CSV with a header, or one integer a line (# comments)."""
    stripped = text.strip()
    if stripped.startswith("["):
        try:
            values = json.loads(stripped)
        except ValueError as error:
            raise Glm53Error(f"{name} looks like JSON but does not parse: {error}") from None
        if not isinstance(values, list) or any(isinstance(v, bool) or not isinstance(v, int) for v in values):
            raise Glm53Error(f"{name} must be a JSON list of integers like [5040, 8507]")
        lengths = [parse_positive(str(v), f"{name} entry {i}") for i, v in enumerate(values, 1)]
    else:
        lines = [(n, line) for n, line in enumerate(text.splitlines(), 1) if line.strip() and line[:1] != "#"]
        if lines and any(c.isalpha() for c in lines[0][1]):  # a header names its columns
            lengths = _csv_lengths(lines, name)
        else:
            lengths = [parse_positive(line, f"{name} line {n}") for n, line in lines]
    if not lengths:
        raise Glm53Error(f"{name} holds no prompt lengths; give one positive integer a line, a CSV or a JSON list")
    return lengths


def _csv_lengths(lines: list[tuple[int, str]], name: str) -> list[int]:
    rows = list(csv.reader(line for _, line in lines))
    header = [cell.strip().lower() for cell in rows[0]]
    column = next((i for i, cell in enumerate(header) if any(h in cell for h in _LENGTH_COLUMN_HINTS)), None)
    if column is None:
        raise Glm53Error(
            f"{name}: expected a number a line or a CSV header with a column named like 'tokens' or 'length', "
            f"found {lines[0][1].strip()!r}"
        )
    lengths = []
    for (n, _), row in zip(lines[1:], rows[1:], strict=True):
        if column >= len(row):
            raise Glm53Error(f"{name} line {n} has no column {header[column]!r}; every row needs one")
        lengths.append(parse_positive(row[column], f"{name} line {n} column {header[column]!r}"))
    return lengths


def load_prompt_lengths(path: Path) -> list[int]:
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as error:
        reason = error.strerror if isinstance(error, OSError) and error.strerror else str(error)
        raise Glm53Error(f"cannot read the prompt-length file {str(path)!r}: {reason}") from None
    return parse_prompt_lengths(text, str(path))


def _coverage(args: argparse.Namespace) -> None:
    length = parse_positive(args.prompt_tokens, "--prompt-tokens")
    result = coverage(length, parse_positive(args.chunk_size, "--chunk-size"), args.strict_prefix)
    rule = " (strict prefix)" if result.strict_prefix else ""
    print(
        f"{result.prompt_tokens} prompt tokens at chunk size {result.chunk_size}{rule}: {result.served_tokens} served "
        f"from LMCache ({result.share:.1%}), {result.recomputed_tokens} recomputed"
    )


def _negotiate(args: argparse.Namespace) -> None:
    configured_min = parse_positive(args.configured_min, "--configured-min")
    groups = parse_groups(args.groups)
    resolved = negotiate_chunk_size(configured_min, groups)
    print(f"{resolved} (configured_min={configured_min}, required_alignment={required_alignment(groups)})")


def profile_groups(profile: ModelProfile) -> tuple[int, ...] | None:
    """The groups a profile reports at its validated TP size, or None where that depends on an unmeasured N."""
    n = profile.unified_block_size(profile.tensor_parallel_size)
    return profile.expected_groups(n) if n is not None or not profile.follows_unified_block_size else None


def _model_for(args: argparse.Namespace) -> tuple[tuple[int, ...], ModelProfile | None]:
    """The groups to rank for, and the profile whose validated sizes apply (named, or the one with these groups)."""
    if args.profile is not None:
        profile = get_profile(args.profile)
        groups = profile_groups(profile)
        if groups is None:
            raise Glm53Error(
                f"{profile.display_name}'s groups are not known at TP {profile.tensor_parallel_size}; "
                "pass --groups as the geometry line lists them"
            )
        return groups, profile
    groups = parse_groups(args.groups)
    return groups, next((p for p in PROFILES.values() if profile_groups(p) == groups), None)


def _why(profile: ModelProfile | None, strict_prefix: bool, overhead: int) -> list[str]:
    if profile is None:
        first = "No profile has these groups, so no size counts as validated (--profile NAME names one)."
    else:
        sizes = ", ".join(str(size) for size in profile.validated_chunk_sizes)
        first = (
            f"Validated sizes first: {profile.display_name} (profile {profile.name}) was validated at {sizes}; "
            "other sizes were never run with it."
        )
    rule = "floor((L-1)/C)*C of an L-token prompt (strict prefix)" if strict_prefix else "whole chunks of each prompt"
    return [
        first,
        f"Then by net tokens = served - {overhead} x chunks: LMCache serves {rule}, and every chunk costs a key "
        f"hash, a lookup and a stored object (--chunk-overhead-tokens), so a smaller chunk is not free.",
    ]


def _row(r: Recommendation) -> str:
    validated = "yes" if r.validated else "no"
    return (
        f"{r.chunk_size:>8}  {validated:>9}  {r.served_tokens:>13}  {r.served_share:>6.1%}  {r.chunks:>6}  "
        f"{r.net_tokens:>10}  {r.prompts_with_hit}/{r.prompts}"
    )


def _recommend(args: argparse.Namespace) -> None:
    groups, profile = _model_for(args)
    strict_prefix = args.strict_prefix or (profile is not None and profile.strict_prefix)
    limit = parse_positive(args.limit, "--limit")
    overhead = parse_non_negative(args.chunk_overhead_tokens, "--chunk-overhead-tokens")
    lengths = load_prompt_lengths(args.prompt_lengths)
    validated = profile.validated_chunk_sizes if profile is not None else ()
    ranked = recommend(lengths, groups, strict_prefix, limit, validated, overhead)
    rule = "strict prefix (hybrid)" if strict_prefix else "whole chunks"
    print(f"{len(lengths)} prompts, {sum(lengths)} tokens, groups {list(groups)}, {rule}; best first:")
    print(
        f"{'chunk':>8}  {'validated':>9}  {'served tokens':>13}  {'share':>6}  {'chunks':>6}  {'net tokens':>10}  "
        "prompts with a hit"
    )
    for r in ranked:
        print(_row(r))
    for line in _why(profile, strict_prefix, overhead):
        print(line)


def main(argv: Sequence[str]) -> int:
    args = _build_parser().parse_args(list(argv))
    {"coverage": _coverage, "negotiate": _negotiate, "recommend": _recommend}[args.action](args)
    return 0
