"""What validation found, as a readable summary for a person and as JSON for a machine.

The summary leads with the numbers the seed's validation table shows (LMCache hit tokens and the mean first-token
log-prob per condition, Welch's p), then the boundary table, then the serial timing, then PASS/FAIL with the reasons.
"""

from __future__ import annotations

import dataclasses
import json
import math
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from glm53.errors import Glm53Error
from glm53.validate.continuations import ContinuationsResult
from glm53.validate.mixed import MixedResult
from glm53.validate.protocol import BoundaryResult, CheckResult, EquivalenceResult, PerfResult, PerfSample, RunSample


@dataclass(frozen=True)
class ValidationReport:
    base_url: str
    model: str
    profile: str
    equivalence: EquivalenceResult | None
    boundary: BoundaryResult | None
    perf: PerfResult | None
    seconds: float
    continuations: ContinuationsResult | None = None
    mixed: MixedResult | None = None

    @property
    def results(self) -> list[CheckResult]:
        checks = (self.equivalence, self.boundary, self.perf, self.continuations, self.mixed)
        return [r for r in checks if r is not None]

    @property
    def passed(self) -> bool:
        return all(r.passed for r in self.results)

    @property
    def failures(self) -> list[str]:
        return [failure for r in self.results for failure in r.failures]


def render_text(report: ValidationReport) -> str:
    lines = [f"validation of {report.model} at {report.base_url} (profile {report.profile})"]
    if report.equivalence is not None:
        lines += _equivalence_lines(report.equivalence)
    if report.boundary is not None:
        lines += _boundary_lines(report.boundary)
    if report.perf is not None:
        lines += _perf_lines(report.perf)
    if report.continuations is not None:
        lines += _continuations_lines(report.continuations)
    if report.mixed is not None:
        lines += _mixed_lines(report.mixed)
    verdict = "PASS" if report.passed else "FAIL"
    lines.append(f"result: {verdict} ({len(report.results)} checks in {report.seconds:.1f} s)")
    lines += [f"  - {failure}" for failure in report.failures]
    return "\n".join(lines)


def _status(passed: bool) -> str:
    return "pass" if passed else "FAIL"


def _mean_hit(samples: Sequence[RunSample] | Sequence[PerfSample]) -> float:
    return sum(s.hit_tokens for s in samples) / len(samples)


def _correct(samples: Sequence[RunSample]) -> str:
    judged = [s.correct for s in samples if s.correct is not None]
    return f", {sum(judged)}/{len(judged)} answers correct" if judged else ""


def _equivalence_lines(result: EquivalenceResult) -> list[str]:
    w = result.welch
    return [
        f"equivalence [{_status(result.passed)}]: {result.prompt_tokens}-token document-QA prompt, {w.a.n} runs per "
        "condition, temperature 0",
        f"  cold (unique cache_salt):        LMCache hit {_mean_hit(result.cold):.0f} tokens, mean first-token "
        f"log-prob {w.a.mean:.4f} (sd {math.sqrt(w.a.variance):.4f}){_correct(result.cold)}",
        f"  served from LMCache after reset: LMCache hit {_mean_hit(result.cached):.0f} of {result.prompt_tokens} "
        f"tokens, mean first-token log-prob {w.b.mean:.4f} (sd {math.sqrt(w.b.variance):.4f}){_correct(result.cached)}",
        f"  Welch's t-test: t = {w.t:.3f}, df = {w.df:.1f}, p = {w.p:.3g} (alpha {result.alpha:g})",
    ]


def _boundary_lines(result: BoundaryResult) -> list[str]:
    rule = (
        "strict prefix: floor((L-1)/C)*C"
        if result.strict_prefix
        else "whole chunks: floor(L/C)*C, L-1 on a full-prompt hit (vLLM recomputes the last token)"
    )
    lines = [f"boundary [{_status(result.passed)}]: chunk size C = {result.chunk_size}, {rule}"]
    lines.append(f"  {'prompt':>8} {'expected':>9} {'served':>7} {'usage':>7}")
    for row in result.rows:
        usage = "-" if row.usage_cached_tokens is None else str(row.usage_cached_tokens)
        mark = "" if row.served_tokens == row.expected_tokens else "  <-"
        lines.append(f"  {row.prompt_tokens:>8} {row.expected_tokens:>9} {row.served_tokens:>7} {usage:>7}{mark}")
    return lines


def _perf_lines(result: PerfResult) -> list[str]:
    def mean_ms(samples: Sequence[PerfSample], ttft: bool) -> str:
        values = [s.ttft_seconds if ttft else s.total_seconds for s in samples]
        return f"{1000 * sum(values) / len(values):.1f} ms"

    return [
        f"perf [{_status(result.passed)}]: {len(result.cold)} serial requests per condition",
        f"  cold:     mean TTFT {mean_ms(result.cold, True)}, mean total {mean_ms(result.cold, False)}",
        f"  reloaded: mean TTFT {mean_ms(result.cached, True)}, mean total {mean_ms(result.cached, False)}, "
        f"LMCache hit {_mean_hit(result.cached):.0f} tokens",
        f"  TTFT cold/reloaded {result.ttft_speedup:.2f}x, total {result.total_speedup:.2f}x, identical outputs "
        f"{100 * result.identical_share:.0f}%",
    ]


def _continuations_lines(result: ContinuationsResult) -> list[str]:
    diverged = sorted(p.treatment.first_divergence for p in result.pairs if p.treatment.first_divergence is not None)
    where = f", first divergence at token {diverged[len(diverged) // 2]} (median)" if diverged else ""
    return [
        f"continuations [{_status(result.passed)}]: {len(result.pairs)} pairs of {result.tokens}-token continuations "
        f"over 3 templates ({'bit-exact profile: must match exactly' if result.bit_exact else 'judged against cold'})",
        f"  reloaded vs cold: exact match {100 * result.exact_rate('treatment'):.0f}%, per-token agreement "
        f"{100 * result.mean_agreement('treatment'):.1f}%{where}",
        f"  cold vs cold (baseline): exact match {100 * result.exact_rate('baseline'):.0f}%, per-token agreement "
        f"{100 * result.mean_agreement('baseline'):.1f}%",
        f"  Welch's t-test on per-token agreement: p = {result.welch.p:.3g} (alpha {result.alpha:g})",
    ]


def _mixed_lines(result: MixedResult) -> list[str]:
    w = result.welch
    local = sum(s.local_tokens for s in result.mixed) / len(result.mixed)
    lmcache = sum(s.lmcache_tokens for s in result.mixed) / len(result.mixed)
    return [
        f"mixed [{_status(result.passed)}]: {result.prompt_tokens}-token prompt, its first {result.head_tokens} tokens "
        f"held by vLLM's prefix cache, {w.b.n} runs per condition (LMCache issue #4247)",
        f"  cold (unique cache_salt): mean first-token log-prob {w.a.mean:.4f} (sd {math.sqrt(w.a.variance):.4f})",
        f"  vLLM prefix cache {local:.0f} + LMCache {lmcache:.0f} tokens: mean first-token log-prob {w.b.mean:.4f} "
        f"(sd {math.sqrt(w.b.variance):.4f})",
        f"  Welch's t-test: t = {w.t:.3f}, df = {w.df:.1f}, p = {w.p:.3g} (alpha {result.alpha:g})",
    ]


def as_json(report: ValidationReport) -> dict[str, Any]:
    """The whole report, with derived figures (pass/fail, speed-ups) and non-finite numbers as null."""
    data: dict[str, Any] = _finite(dataclasses.asdict(report))
    data["passed"] = report.passed
    data["failures"] = report.failures
    for name, result in (
        ("equivalence", report.equivalence),
        ("boundary", report.boundary),
        ("perf", report.perf),
        ("continuations", report.continuations),
        ("mixed", report.mixed),
    ):
        if result is not None:
            data[name]["passed"] = result.passed
    if report.perf is not None:
        data["perf"] |= {
            "ttft_speedup": report.perf.ttft_speedup,
            "total_speedup": report.perf.total_speedup,
            "identical_share": report.perf.identical_share,
        }
    return data


def _finite(value: Any) -> Any:
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: _finite(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_finite(v) for v in value]
    return value


def write_json(report: ValidationReport, path: Path) -> None:
    try:
        path.write_text(json.dumps(as_json(report), indent=2) + "\n", encoding="utf-8")
    except OSError as error:
        raise Glm53Error(
            f"cannot write the JSON report to {str(path)!r} ({error}); pick a writable --json path"
        ) from None
