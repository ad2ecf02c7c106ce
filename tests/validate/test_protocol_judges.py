"""The verdicts of the three checks, as pure functions over measured samples, with the seeds' numbers."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest

from glm53.chunks import loaded_tokens
from glm53.validate.prompts import boundary_lengths
from glm53.validate.protocol import (
    BoundaryResult,
    BoundaryRow,
    PerfSample,
    RunSample,
    judge_boundary,
    judge_equivalence,
    judge_perf,
)
from glm53.validate.report import ValidationReport, as_json, render_text, write_json


def runs(mean: float, hit: int, seed: int, n: int = 16) -> list[RunSample]:
    rng = random.Random(seed)
    return [RunSample(rng.gauss(mean, 0.05), hit, " 7311", True, 8507) for _ in range(n)]


def test_seed_000_table_passes() -> None:
    """Cold at -0.93 with no hit, cached at -0.94 with 8064 of 8507 tokens from LMCache: not different."""
    result = judge_equivalence(runs(-0.93, 0, 1), runs(-0.94, 8064, 2), 0.05, 8507)
    assert result.passed, result.failures
    assert result.welch.p >= 0.05


def test_shifted_cached_distribution_fails_with_p() -> None:
    result = judge_equivalence(runs(-0.93, 0, 1), runs(-1.33, 8507, 2), 0.05, 8507)
    assert not result.passed
    assert result.failures[0].startswith("the first-token log-probs differ between cold runs (mean -0.9")
    assert "Welch p = " in result.failures[0]
    assert result.failures[0].endswith("< alpha 0.05")


def test_no_lmcache_hit_fails() -> None:
    result = judge_equivalence(runs(-0.93, 0, 1), runs(-0.93, 0, 2), 0.05, 8507)
    assert result.failures == (
        "16 of 16 runs after the prefix-cache reset got no LMCache hit; the cache is not paying off (check the "
        "connector's kv-transfer-config and the LMCache server)",
    )


def test_cold_runs_with_hits_are_not_a_cold_reference() -> None:
    result = judge_equivalence(runs(-0.93, 1152, 1), runs(-0.93, 8064, 2), 0.05, 8507)
    assert result.failures == (
        "16 of 16 cold runs got an LMCache hit despite a unique cache_salt; the cold reference is not cold (the "
        "server ignores cache_salt)",
    )


def boundary_rows(chunk: int, served: dict[int, int], strict: bool) -> list[BoundaryRow]:
    return [
        BoundaryRow(length, loaded_tokens(length, chunk, strict), served.get(length, -1), None)
        for length in boundary_lengths(chunk)
    ]


def exact(chunk: int, strict: bool) -> list[BoundaryRow]:
    return [
        BoundaryRow(r.prompt_tokens, r.expected_tokens, r.expected_tokens, r.expected_tokens)
        for r in boundary_rows(chunk, {}, strict)
    ]


def judged_with(chunk: int, strict: bool, index: int, row: BoundaryRow) -> BoundaryResult:
    """The boundary verdict on rows that meet the bound everywhere except row `index`, which measured `row`."""
    rows = exact(chunk, strict)
    rows[index] = row
    return judge_boundary(chunk, strict, rows)


@pytest.mark.parametrize(("chunk", "strict"), [(1152, True), (256, False)])
def test_boundary_passes_when_every_hit_is_the_bound(chunk: int, strict: bool) -> None:
    assert judge_boundary(chunk, strict, exact(chunk, strict)).passed


def test_strict_bound_at_the_boundaries_is_the_seed_arithmetic() -> None:
    expected = [r.expected_tokens for r in exact(1152, True)]
    assert expected == [0, 0, 1152, 1152, 1152, 2304, 2304, 2304, 3456]


def test_a_full_prompt_hit_of_glm53_loads_one_token_fewer() -> None:
    """GLM-5.3 (one group, C = 256): at L = 256, 512, 768 the connector loads L-1 (need_to_load - 1), so a correct pod
    serves 255, 511, 767 there and whole chunks elsewhere."""
    expected = [r.expected_tokens for r in exact(256, False)]
    assert [r.prompt_tokens for r in exact(256, False)] == [255, 256, 257, 511, 512, 513, 767, 768, 769]
    assert expected == [0, 255, 256, 256, 511, 512, 512, 767, 768]
    assert judge_boundary(256, False, exact(256, False)).passed


def test_a_full_prompt_hit_served_in_full_is_refused_and_explained() -> None:
    assert judged_with(256, False, 4, BoundaryRow(512, 511, 512, 512)).failures == (
        "512 tokens served from LMCache for a 512-token prompt; at most 511 may be (only whole 256-token chunks are "
        "stored, less the last prompt token, which vLLM recomputes on a full-prompt hit)",
    )


def test_the_strict_prefix_never_sees_a_full_prompt_hit() -> None:
    """GLM-5.3-Flash looks up at most L-1 tokens, so at L = 2304 only 1152 can come back: L-1 is not its rule."""
    assert [loaded_tokens(n, 1152, True) for n in (1152, 2304, 8507)] == [0, 1152, 8064]


def test_recovery_mismatch_is_a_strict_prefix_violation() -> None:
    """Seed 004: a complete hit restored the whole prompt although the last token must be recomputed."""
    assert judged_with(1152, True, 4, BoundaryRow(2304, 1152, 2304, 2304)).failures == (
        "strict-prefix violation: 2304 tokens served from LMCache for a 2304-token prompt; at most 1152 may be (the "
        "last prompt token must be recomputed) — the recovery mismatch of seed 004",
    )


def test_a_violation_seen_only_in_usage_still_counts() -> None:
    failures = judged_with(1152, True, 1, BoundaryRow(1152, 0, 0, 1152)).failures
    assert failures[0].startswith("strict-prefix violation: 1152 tokens served")


def test_excess_for_single_group_model_names_whole_chunks() -> None:
    assert judged_with(256, False, 0, BoundaryRow(255, 0, 255, None)).failures == (
        "255 tokens served from LMCache for a 255-token prompt; at most 0 may be (only whole 256-token chunks are "
        "stored)",
    )


def test_fewer_tokens_than_the_bound_is_a_failure() -> None:
    assert judged_with(1152, True, 8, BoundaryRow(3457, 3456, 0, 0)).failures == (
        "only 0 tokens served from LMCache for a 3457-token prompt where 3456 should be (whole 1152-token chunks); "
        "the cache is not paying off",
    )


def test_a_wrong_answer_fails_seed_000_requires_all_correct() -> None:
    cached = runs(-0.94, 8064, 2)
    cached[3] = RunSample(-0.94, 8064, " 7312", False, 8507)
    result = judge_equivalence(runs(-0.93, 0, 1), cached, 0.05, 8507)
    assert result.failures == (
        "0 of 16 cold and 1 of 16 LMCache-served answers were wrong (e.g. ' 7312'); seed 000 requires every answer "
        "in both conditions to be correct",
    )


def test_unknown_answers_are_not_judged() -> None:
    """A user's own prompt comes without an answer (correct is None): nothing to judge."""
    unknown = [RunSample(s.logprob, s.hit_tokens, s.text, None, 8507) for s in runs(-0.93, 0, 1)]
    assert judge_equivalence(unknown, runs(-0.94, 8064, 2), 0.05, 8507).passed


def test_bit_exact_profile_requires_identical_outputs() -> None:
    cached = runs(-0.93, 8064, 2)
    cached[0] = RunSample(-0.93, 8064, " 7311.", True, 8507)
    assert judge_equivalence(runs(-0.93, 0, 1), cached, 0.05, 8507).passed  # GLM-5.3-Flash: outputs may vary
    assert judge_equivalence(runs(-0.93, 0, 1), cached, 0.05, 8507, bit_exact=True).failures == (
        "equivalence: the profile marks this model's outputs bit-exact, but its 16 cold and 16 LMCache-served runs "
        "gave 2 different outputs (' 7311', ' 7311.', ...); reloading from LMCache must not change a token",
    )
    assert judge_equivalence(runs(-0.93, 0, 1), runs(-0.93, 8064, 2), 0.05, 8507, bit_exact=True).passed


def test_bit_exact_perf_outputs_must_match() -> None:
    assert judge_perf(perf(0.2, 0, "a"), perf(0.05, 8064, "b"), bit_exact=True).failures == (
        "perf: the profile marks this model's outputs bit-exact, but its 4 cold and 4 LMCache-served runs gave 2 "
        "different outputs ('a', 'b', ...); reloading from LMCache must not change a token",
    )
    assert judge_perf(perf(0.2, 0), perf(0.05, 8064), bit_exact=True).passed


def perf(ttft: float, hit: int, text: str = "same") -> list[PerfSample]:
    return [PerfSample(ttft, ttft * 2, text, hit) for _ in range(4)]


def test_perf_ratios_and_identical_share() -> None:
    result = judge_perf(perf(0.2, 0), perf(0.05, 8064))
    assert result.passed
    assert result.ttft_speedup == pytest.approx(4.0)
    assert result.total_speedup == pytest.approx(4.0)
    assert result.identical_share == 1.0
    assert judge_perf(perf(0.2, 0, "a"), perf(0.05, 8064, "b")).identical_share == 0.0


def test_perf_without_a_reload_fails() -> None:
    assert judge_perf(perf(0.2, 0), perf(0.2, 0)).failures == (
        "4 of 4 reloaded requests got no LMCache hit, so they did not measure a reload",
    )


def full_report(passed_boundary: bool = True) -> ValidationReport:
    rows = exact(1152, True)
    if not passed_boundary:
        rows[4] = BoundaryRow(2304, 1152, 2304, 2304)
    return ValidationReport(
        "http://127.0.0.1:8000",
        "zai-org/GLM-5.3-Flash",
        "glm53-flash",
        judge_equivalence(runs(-0.93, 0, 1), runs(-0.94, 8064, 2), 0.05, 8507),
        judge_boundary(1152, True, rows),
        judge_perf(perf(0.2, 0), perf(0.05, 8064)),
        3.5,
    )


def test_text_report_shows_the_seed_table_and_the_verdict() -> None:
    text = render_text(full_report())
    assert "LMCache hit 8064 of 8507 tokens" in text
    assert "16/16 answers correct" in text
    assert "Welch's t-test: t = " in text
    assert "TTFT cold/reloaded 4.00x" in text
    assert text.splitlines()[-1] == "result: PASS (3 checks in 3.5 s)"


def test_text_report_lists_failures() -> None:
    lines = render_text(full_report(passed_boundary=False)).splitlines()
    assert "result: FAIL (3 checks in 3.5 s)" in lines
    assert lines[-1].startswith("  - strict-prefix violation: 2304 tokens served from LMCache")
    assert "      2304      1152    2304    2304  <-" in lines


def test_json_report_round_trips(tmp_path: Path) -> None:
    path = tmp_path / "report.json"
    write_json(full_report(passed_boundary=False), path)
    data = json.loads(path.read_text())
    assert data["passed"] is False
    assert data["boundary"]["passed"] is False
    assert data["equivalence"]["passed"] is True
    assert data["equivalence"]["welch"]["b"]["n"] == 16
    assert data["perf"]["ttft_speedup"] == pytest.approx(4.0)
    assert data == as_json(full_report(passed_boundary=False)) | {"seconds": data["seconds"]}


def test_plot_is_written(tmp_path: Path) -> None:
    from glm53.validate.plot import write_plot

    path = tmp_path / "validation.png"
    write_plot(full_report(), path)
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_no_hit_at_any_length_is_one_sentence() -> None:
    rows = [BoundaryRow(r.prompt_tokens, r.expected_tokens, 0, 0) for r in exact(1152, True)]
    assert judge_boundary(1152, True, rows).failures == (
        "LMCache served nothing for any of the 7 prompts that span a whole 1152-token chunk; the cache is not paying "
        "off (is the LMCache server up and the connector pointed at it?)",
    )
