"""Chunk arithmetic with the seeds' numbers, its properties, and `glm53 chunk` on the command line."""

from __future__ import annotations

import itertools
import json
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from glm53 import chunks
from glm53.commands.chunk import parse_prompt_lengths
from glm53.errors import Glm53Error

FLASH_GROUPS = (1152, 1152, 1152, 1152, 1152, 0)


@pytest.mark.parametrize(
    ("length", "chunk", "strict", "served", "share"),
    [
        (5040, 1024, False, 4096, "81.3%"),  # seed 001: GLM-5.3 at --chunk-size 1024
        (5040, 256, False, 4864, "96.5%"),  # seed 001: GLM-5.3 at --chunk-size 256
        (8507, 1152, True, 8064, "94.8%"),  # seed 000: GLM-5.3-Flash, 8064 of 8507 served from LMCache
        (1152, 1152, True, 0, "0.0%"),  # strict prefix: a prompt of exactly one chunk gets no hit
        (1153, 1152, True, 1152, "99.9%"),
    ],
)
def test_seed_coverage(length: int, chunk: int, strict: bool, served: int, share: str) -> None:
    result = chunks.coverage(length, chunk, strict)
    assert result.served_tokens == served
    assert f"{result.share:.1%}" == share
    assert result.recomputed_tokens == length - served


def test_seed_negotiation() -> None:
    assert chunks.negotiate_chunk_size(256, FLASH_GROUPS) == 1152
    assert chunks.negotiate_chunk_size(256, (64,)) == 256  # GLM-5.3: unchanged, so upstream logs no negotiated line
    assert chunks.required_alignment(FLASH_GROUPS) == 1152
    assert chunks.required_alignment((64, 96, 0)) == 192
    assert chunks.is_valid_chunk_size(1152, FLASH_GROUPS)
    assert not chunks.is_valid_chunk_size(256, FLASH_GROUPS)


@pytest.mark.parametrize(
    ("call", "message"),
    [
        (lambda: chunks.served_tokens(0, 256, False), "prompt length must be a positive integer, got 0"),
        (lambda: chunks.served_tokens(10, -1, False), "chunk size must be a positive integer, got -1"),
        (
            lambda: chunks.negotiate_chunk_size(0, (64,)),
            "configured minimum chunk size must be a positive integer, got 0",
        ),
        (lambda: chunks.required_alignment(()), "groups must list at least one tokens_per_block value"),
        (lambda: chunks.required_alignment((0, 0)), "every group has tokens_per_block 0 (all scratch)"),
        (lambda: chunks.required_alignment((64, -1)), "tokens_per_block values must be non-negative integers, got -1"),
        (lambda: chunks.recommend([], (64,), False), "the prompt-length distribution is empty"),
        (
            lambda: chunks.recommend([5040], (64,), False, chunk_overhead_tokens=-1),
            "the per-chunk overhead must be a whole",
        ),
        (
            lambda: chunks.parse_non_negative("-1", "--chunk-overhead-tokens"),
            "--chunk-overhead-tokens must be a whole number",
        ),
        (lambda: chunks.parse_positive("1.5", "--limit"), "--limit must be a positive integer, got '1.5'"),
        (lambda: chunks.parse_positive("9" * 40, "--limit"), "--limit must be a positive integer, got '" + "9" * 40),
        (
            lambda: chunks.parse_groups("1152,x"),
            "groups must be comma-separated non-negative integers like 1152,1152,0",
        ),
        (lambda: chunks.parse_groups(""), "groups must be comma-separated non-negative integers"),
    ],
)
def test_bad_input_raises_one_sentence(call: object, message: str) -> None:
    with pytest.raises(Glm53Error) as caught:
        call()  # type: ignore[operator]
    assert caught.value.message.startswith(message)
    assert caught.value.exit_code == 2


def test_parse_groups_accepts_the_geometry_lines_own_list() -> None:
    assert chunks.parse_groups("[1152, 1152, 1152, 1152, 1152, 0]") == FLASH_GROUPS


def test_recommend_without_a_chunk_cost_ranks_by_served_tokens_and_the_smaller_chunk_on_ties() -> None:
    ranked = chunks.recommend([5040, 5040], (64,), False, limit=16, chunk_overhead_tokens=0)
    assert ranked[0].chunk_size == 64
    assert ranked[0].served_tokens == 2 * (5040 // 64 * 64)
    by_size = {r.chunk_size: r for r in ranked}
    assert by_size[256].served_tokens == 2 * 4864  # seed 001
    assert by_size[1024].served_tokens == 2 * 4096
    assert all(a.served_tokens >= b.served_tokens for a, b in itertools.pairwise(ranked))
    tie = chunks.recommend([128, 128], (64,), False, chunk_overhead_tokens=0)
    assert [r.chunk_size for r in tie] == [64, 128]  # a tie: the smaller first


def test_a_smaller_chunk_pays_for_its_lookups() -> None:
    # 5040 tokens: 64 serves 4992 in 78 chunks, 256 serves 4864 in 19; at 16 tokens a chunk 256 nets 4560 > 3744.
    by_size = {r.chunk_size: r for r in chunks.recommend([5040], (64,), False)}
    assert (by_size[64].chunks, by_size[64].net_tokens) == (78, 4992 - 16 * 78)
    assert (by_size[256].chunks, by_size[256].net_tokens) == (19, 4864 - 16 * 19)
    assert by_size[256].net_tokens > by_size[64].net_tokens


def test_validated_sizes_rank_first_then_by_net_tokens() -> None:
    ranked = chunks.recommend([5040], (64,), False, validated=(256, 1024))
    assert [(r.chunk_size, r.validated, r.served_tokens) for r in ranked[:2]] == [(256, True, 4864), (1024, True, 4096)]
    assert not any(r.validated for r in ranked[2:])
    assert all(a.net_tokens >= b.net_tokens for a, b in itertools.pairwise(ranked[2:]))


def test_validated_sizes_beyond_the_limit_are_still_ranked() -> None:
    ranked = chunks.recommend([5040], (64,), False, limit=2, validated=(1024, 100))  # 100 is not a multiple of 64
    assert sorted(r.chunk_size for r in ranked) == [64, 128, 1024]
    assert ranked[0].chunk_size == 1024


@given(st.integers(1, 10**7), st.integers(1, 10**5), st.booleans())
def test_served_is_a_multiple_of_the_chunk_and_at_most_the_prompt(length: int, chunk: int, strict: bool) -> None:
    served = chunks.served_tokens(length, chunk, strict)
    assert 0 <= served <= length
    assert served % chunk == 0
    assert length - served <= chunk  # only the tail (at most one chunk) is recomputed
    assert chunks.served_tokens(length, chunk, True) <= chunks.served_tokens(length, chunk, False)


@given(st.integers(1, 10**6), st.lists(st.integers(0, 4096), min_size=1, max_size=8).filter(any))
def test_negotiated_size_is_the_smallest_aligned_one_above_the_minimum(minimum: int, groups: list[int]) -> None:
    resolved = chunks.negotiate_chunk_size(minimum, groups)
    alignment = chunks.required_alignment(groups)
    assert resolved % alignment == 0
    assert all(resolved % g == 0 for g in groups if g)
    assert resolved >= minimum
    assert resolved - alignment < minimum  # minimal: one alignment less would fall below the minimum
    assert chunks.round_up(minimum, alignment) == resolved


# --- prompt-length files ---


@pytest.mark.parametrize(
    ("text", "lengths"),
    [
        ("5040\n8507\n\n# a comment\n1200\n", [5040, 8507, 1200]),
        ("id,prompt_tokens,answer\na,5040,x\nb,8507,y\n", [5040, 8507]),
        ("Prompt Length\n5040\n", [5040]),
        ("[5040, 8507]", [5040, 8507]),
    ],
)
def test_prompt_length_formats(text: str, lengths: list[int]) -> None:
    assert parse_prompt_lengths(text, "f") == lengths


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("", "f holds no prompt lengths; give one positive integer a line, a CSV or a JSON list"),
        ("5040\n0\n", "f line 2 must be a positive integer, got '0'"),
        ("5040\n-3\n", "f line 2 must be a positive integer, got '-3'"),
        ("5040\n12.5\n", "f line 2 must be a positive integer, got '12.5'"),
        ("id,answer\na,b\n", "f: expected a number a line or a CSV header with a column named like 'tokens' or "),
        ("x,tokens\n5040\n", "f line 2 has no column 'tokens'"),
        ("tokens\nmany\n", "f line 2 column 'tokens' must be a positive integer, got 'many'"),
        ("[5040, true]", "f must be a JSON list of integers like [5040, 8507]"),
        ("[5040,", "f looks like JSON but does not parse"),
    ],
)
def test_bad_prompt_length_files(text: str, message: str) -> None:
    with pytest.raises(Glm53Error) as caught:
        parse_prompt_lengths(text, "f")
    assert caught.value.message.startswith(message)


# --- the command line ---


def run_chunk(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "glm53", "chunk", *args], capture_output=True, text=True, check=False)


def chunk_output(*args: str) -> str:
    """What `glm53 chunk ARGS` prints; it must succeed."""
    result = run_chunk(*args)
    assert result.returncode == 0, result.stderr
    return result.stdout


@pytest.mark.parametrize(
    ("args", "output"),
    [
        (
            ("coverage", "--prompt-tokens", "5040", "--chunk-size", "1024"),
            "5040 prompt tokens at chunk size 1024: 4096 served from LMCache (81.3%), 944 recomputed\n",
        ),
        (
            ("coverage", "--prompt-tokens", "5040", "--chunk-size", "256"),
            "5040 prompt tokens at chunk size 256: 4864 served from LMCache (96.5%), 176 recomputed\n",
        ),
        (
            ("coverage", "--prompt-tokens", "8507", "--chunk-size", "1152", "--strict-prefix"),
            "8507 prompt tokens at chunk size 1152 (strict prefix): 8064 served from LMCache (94.8%), 443 recomputed\n",
        ),
        (
            ("negotiate", "--configured-min", "256", "--groups", "1152,1152,1152,1152,1152,0"),
            "1152 (configured_min=256, required_alignment=1152)\n",
        ),
    ],
)
def test_cli_outputs(args: tuple[str, ...], output: str) -> None:
    result = run_chunk(*args)
    assert (result.returncode, result.stdout, result.stderr) == (0, output, "")


def test_cli_recommend_table(tmp_path: Path) -> None:
    lengths = tmp_path / "lengths.json"
    lengths.write_text(json.dumps([5040, 8507, 1200]))
    output = chunk_output(
        "recommend",
        "--prompt-lengths",
        str(lengths),
        "--groups",
        "1152,1152,1152,1152,1152,0",
        "--strict-prefix",
        "--limit",
        "3",
    )
    assert output.splitlines() == [
        "3 prompts, 14747 tokens, groups [1152, 1152, 1152, 1152, 1152, 0], strict prefix (hybrid); best first:",
        "   chunk  validated  served tokens   share  chunks  net tokens  prompts with a hit",
        "    1152        yes          13824   93.7%      12       13632  3/3",
        "    2304         no          11520   78.1%       5       11440  2/3",
        "    3456         no          10368   70.3%       3       10320  2/3",
        "Validated sizes first: GLM-5.3-Flash (profile glm53-flash) was validated at 1152; other sizes were never run "
        "with it.",
        "Then by net tokens = served - 16 x chunks: LMCache serves floor((L-1)/C)*C of an L-token prompt (strict "
        "prefix), and every chunk costs a key hash, a lookup and a stored object (--chunk-overhead-tokens), so a "
        "smaller chunk is not free.",
    ]


EXAMPLE_LENGTHS = Path(__file__).resolve().parents[1] / "examples" / "prompt-lengths.txt"


@pytest.mark.parametrize("model", [("--profile", "glm53"), ("--groups", "64")])
def test_cli_recommends_glm53s_validated_256_on_the_example_file(model: tuple[str, str]) -> None:
    output = chunk_output("recommend", "--prompt-lengths", str(EXAMPLE_LENGTHS), *model)
    rows = [line.split() for line in output.splitlines()[2:] if line.split()[0].isdigit()]
    assert [row[:2] for row in rows[:2]] == [["256", "yes"], ["1024", "yes"]]
    assert "GLM-5.3 (profile glm53) was validated at 256, 1024" in output


def test_cli_without_a_known_profile_says_nothing_is_validated(tmp_path: Path) -> None:
    output = chunk_output("recommend", "--prompt-lengths", str(EXAMPLE_LENGTHS), "--groups", "32", "--limit", "4")
    assert "No profile has these groups, so no size counts as validated" in output
    assert [line.split()[1] for line in output.splitlines()[2:6]] == ["no"] * 4


def test_cli_recommend_help_states_the_file_format() -> None:
    result = run_chunk("recommend", "--help")
    assert "one positive integer a line" in " ".join(result.stdout.split())
    assert "examples/prompt-lengths.txt" in result.stdout


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (("coverage", "--prompt-tokens", "0", "--chunk-size", "256"), "--prompt-tokens must be a positive integer"),
        (("coverage", "--prompt-tokens", "5040", "--chunk-size", "abc"), "--chunk-size must be a positive integer"),
        (("negotiate", "--configured-min", "256", "--groups", "0,0"), "every group has tokens_per_block 0"),
        (("negotiate", "--configured-min", "-256", "--groups", "64"), "--configured-min must be a positive integer"),
        (
            ("recommend", "--prompt-lengths", "/nonexistent/lengths.txt", "--groups", "64"),
            "cannot read the prompt-length file '/nonexistent/lengths.txt': No such file or directory",
        ),
        (
            ("recommend", "--prompt-lengths", "x", "--groups", "64", "--chunk-overhead-tokens", "nan"),
            "--chunk-overhead-tokens must be a whole number >= 0, got 'nan'",
        ),
        (
            ("recommend", "--prompt-lengths", "x", "--groups", "64", "--profile", "glm53"),
            "argument --profile: not allowed with argument --groups",
        ),
        (("recommend", "--prompt-lengths", "x", "--profile", "glm99"), "unknown profile 'glm99'"),
    ],
)
def test_cli_bad_input_is_one_line_and_exit_2(args: tuple[str, ...], message: str) -> None:
    result = run_chunk(*args)
    assert result.returncode == 2
    assert result.stderr.startswith(f"glm53 chunk: error: {message}")
    assert result.stderr.count("\n") == 1
