"""Run the chosen checks in the protocol's order against one server and gather them into a report.

Shared by `glm53 validate` (against any deployment) and `glm53 pod` (against the CPU-mock pod it just started).
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field, replace

from glm53.errors import Glm53Error
from glm53.profiles import ModelProfile
from glm53.validate.client import VllmClient
from glm53.validate.commits import CommitWatch
from glm53.validate.continuations import DEFAULT_PAIRS, DEFAULT_TOKENS, TEMPLATES, check_continuations
from glm53.validate.mixed import check_mixed
from glm53.validate.progress import Progress
from glm53.validate.prompts import QaPrompt, document_qa_prompt
from glm53.validate.protocol import CHECKS, Target, check_boundary, check_equivalence, check_perf
from glm53.validate.report import ValidationReport

DEFAULT_RUNS = 16  # the seed's 16 runs per condition
# Below 8 runs per condition Welch's t-test has so few degrees of freedom that even a clear shift of the first-token
# log-prob gives p > alpha: a "pass" would mean nothing. The seed protocol runs 16 + 16.
MIN_RUNS = 8
DEFAULT_ALPHA = 0.05
DEFAULT_TIMEOUT = 60.0


# Where a validation's reloads come from: LMCache's memory (L1), or its L2 tier (lmcache.l2) with L1 emptied first.
RELOAD_SOURCES = ("l1", "l2")


@dataclass(frozen=True)
class ValidationConfig:
    base_url: str
    profile: ModelProfile
    checks: tuple[str, ...] = CHECKS
    runs: int = DEFAULT_RUNS
    # Paired continuations (seed 004's third stage): how many pairs, and tokens per continuation.
    pairs: int = DEFAULT_PAIRS
    continuation_tokens: int = DEFAULT_TOKENS
    alpha: float = DEFAULT_ALPHA
    # The chunk size the LMCache server runs with; None means the profile's recommended one.
    chunk_size: int | None = None
    prompt: QaPrompt = field(default_factory=document_qa_prompt)
    # The served model to ask; None means the first one /v1/models lists.
    model: str | None = None
    timeout: float = DEFAULT_TIMEOUT
    # LMCache's metrics page (the server's or the pod exporter's): after each prime, wait there for the commit.
    lmcache_metrics: str | None = None
    # Where the reloads come from: `l1` (LMCache's memory) or `l2` (its L2 tier: LMCache's L1 is emptied first).
    reload_from: str = "l1"

    def __post_init__(self) -> None:
        """Refuse, in one line, settings that make validation meaningless or hang (NaN and infinity included)."""
        if self.runs < MIN_RUNS:
            raise Glm53Error(
                f"--runs must be at least {MIN_RUNS} per condition (the seed protocol runs 16 + 16; fewer leave "
                f"Welch's t-test too few degrees of freedom to tell the conditions apart), got {self.runs}"
            )
        if self.pairs < len(TEMPLATES):
            raise Glm53Error(f"--pairs must be at least {len(TEMPLATES)} (one per template), got {self.pairs}")
        if self.continuation_tokens <= 0:
            raise Glm53Error(f"--continuation-tokens must be a positive number, got {self.continuation_tokens}")
        if not 0.0 < self.alpha < 1.0:
            raise Glm53Error(f"--alpha must lie strictly between 0 and 1, got {self.alpha}")
        if self.chunk_size is not None and self.chunk_size <= 0:
            raise Glm53Error(f"--chunk-size must be a positive number of tokens, got {self.chunk_size}")
        if self.reload_from not in RELOAD_SOURCES:
            raise Glm53Error(f"--reload-from takes {' or '.join(RELOAD_SOURCES)}, got {self.reload_from!r}")
        if not (math.isfinite(self.timeout) and self.timeout > 0):
            raise Glm53Error(f"--timeout must be a positive, finite number of seconds, got {self.timeout}")

    @property
    def effective_chunk_size(self) -> int:
        return self.chunk_size or self.profile.recommended_chunk_size


def run_validation(config: ValidationConfig, progress: Progress) -> ValidationReport:
    start = time.perf_counter()
    client = VllmClient(config.base_url, config.timeout)
    progress.step(f"validate: connecting to {client.base_url}")
    commits = (
        CommitWatch(config.lmcache_metrics, config.effective_chunk_size, config.timeout)
        if config.lmcache_metrics
        else None
    )
    target = Target.connect(client, config.model, progress, commits, config.reload_from)
    # A model that cannot answer (the tiny CPU test models' random weights) has its answers left unjudged.
    prompt = config.prompt if config.profile.answers_questions else replace(config.prompt, answer=None)
    try:
        equivalence = (
            check_equivalence(target, prompt, config.runs, config.alpha, config.profile.bit_exact_outputs)
            if "equivalence" in config.checks
            else None
        )
        boundary = (
            check_boundary(
                target, config.effective_chunk_size, config.profile.strict_prefix, config.profile.prompt_token_ids
            )
            if "boundary" in config.checks
            else None
        )
        perf = (
            check_perf(target, prompt, config.runs, config.profile.bit_exact_outputs)
            if "perf" in config.checks
            else None
        )
        profile, chunk = config.profile, config.effective_chunk_size
        continuations = (
            check_continuations(
                target,
                chunk,
                config.pairs,
                config.continuation_tokens,
                config.alpha,
                profile.bit_exact_outputs,
                profile.prompt_token_ids,
            )
            if "continuations" in config.checks
            else None
        )
        mixed = (
            check_mixed(target, chunk, config.runs, config.alpha, profile.bit_exact_outputs, profile.prompt_token_ids)
            if "mixed" in config.checks
            else None
        )
    finally:
        progress.done()
    return ValidationReport(
        client.base_url,
        target.model,
        config.profile.name,
        equivalence,
        boundary,
        perf,
        time.perf_counter() - start,
        continuations,
        mixed,
    )
