"""What a run does (pure): the default cases, the `ipc` and `tp` settings, the plan `--dry-run` prints, and the
checks that refuse settings which cannot work before anything starts."""

from __future__ import annotations

import math
from dataclasses import dataclass

from . import PROG, ProofError
from .geometry import Case, gpu_bytes_for, request_bytes

# The GLM-5.3-Flash deployment's chunk (its N) and GLM-5.3's recommended 256 over the whole chunks-per-request curve;
# GLM-5.3 at 1152 at 8 chunks to compare chunk sizes at one per-token size (its 64-chunk request would be 7.4 GB).
# GLM-5.3-Flash at 256 does not exist: its blocks are 1152 tokens.
DEFAULT_CASES = ("glm53-flash@1152", "glm53@256", "glm53@1152:8")
# The TP runs: both models at their deployment chunk.
DEFAULT_TP_CASES = ("glm53-flash@1152", "glm53@256")

# vLLM's `--max-model-len`-sized requests are far longer; 64 chunks of 1152 tokens is 73,728 tokens.
DEFAULT_CHUNKS = (1, 4, 8, 16, 64)
# LMCache pins an L1 of up to 20 GB at start and grows it lazily beyond (lmcache 0.5.6
# lmcache/v1/distributed/config.py:293-297, init_size_in_bytes; --l1-use-lazy defaults to on, :805-821): the proof
# keeps every server's L1 within it, so that no timed store pays for pinning new host memory.
LMCACHE_L1_INIT_GB = 20.0
SERVER_LAYOUTS = ("one", "per-rank")


# The chart's lmcache.l2.type values the proof can run, as its plan names them.
L2_DESCRIPTIONS = {
    "fs": "fs (the chart's default), a temporary directory on this host's disk per server",
    "off": "off (L1 only)",
}


@dataclass(frozen=True)
class Settings:
    """What one `ipc` run does: per case and chunk count, `reps` timed requests after `warmup` untimed ones; at
    `all_real_at` chunks (0: never) also the pre-issue-26 all-real block ids, for cases with KDA groups."""

    cases: tuple[Case, ...]
    chunks: tuple[int, ...]
    reps: int
    warmup: int
    l1_size_gb: float | None  # None: sized per case (`l1_for`)
    device: str
    all_real_at: int = 8
    server_args: tuple[str, ...] = ()  # flags beyond the chart's sidecar flags, for experiments (--server-arg)
    l2: str = "fs"  # the chart's lmcache.l2.type: `fs` (its default, in a temporary directory here) or `off`

    @property
    def requests(self) -> int:
        return self.reps + self.warmup

    def points(self, case: Case) -> list[tuple[int, str]]:
        """(chunks, block layout) in the order they run."""
        points = [(c, "align") for c in (case.chunk_counts or self.chunks)]
        if self.all_real_at and case.hybrid:
            points.append((self.all_real_at, "all-real"))
        return points

    def max_chunks(self, case: Case) -> int:
        return max(c for c, _ in self.points(case))

    def l1_needed_gb(self, case: Case) -> float:
        """Every request stores new tokens, so L1 must hold all of them without evicting (plus a quarter spare)."""
        stored = sum(request_bytes(case, c, layout)[0] for c, layout in self.points(case))
        return stored * self.requests * 1.25 / 2**30

    def l1_for(self, case: Case) -> float:
        return self.l1_size_gb if self.l1_size_gb is not None else float(math.ceil(self.l1_needed_gb(case) + 0.5))


@dataclass(frozen=True)
class TpSettings:
    """What one `tp` run does: per case, rank count and server layout, one request of `chunks` chunks per round."""

    cases: tuple[Case, ...]
    ranks: tuple[int, ...]
    layouts: tuple[str, ...]
    chunks: int
    reps: int
    warmup: int
    device: str
    server_args: tuple[str, ...] = ()  # flags beyond the chart's sidecar flags, for experiments (--server-arg)
    l2: str = "fs"  # as Settings.l2

    @property
    def requests(self) -> int:
        return self.reps + self.warmup

    @staticmethod
    def writers(case: Case, ranks: int, layout: str) -> int:
        """Ranks that store: all of them, except for a pure-MLA model (KV replicated across TP ranks), where it is the
        first rank of each server (lmcache 0.5.6 lmcache/integration/vllm/vllm_multi_process_adapter.py:446-459;
        `mla_only`, lmcache/integration/vllm/utils.py:348-356: MLA and not hybrid; both models' attention is MLA).
        `run_tp_case` checks this against LMCache's own `ParallelStrategy` before it runs."""
        servers = ranks if layout == "per-rank" else 1
        return ranks if case.hybrid else servers

    def l1_per_server_gb(self, case: Case, ranks: int, layout: str) -> float:
        """What one server must hold without evicting: its writers' stores over all rounds, plus a quarter."""
        servers = ranks if layout == "per-rank" else 1
        stored = request_bytes(case, self.chunks)[0] * self.writers(case, ranks, layout) * self.requests
        return float(math.ceil(stored * 1.25 / servers / 2**30 + 0.5))


def plan_lines(settings: Settings, tp: TpSettings | None = None) -> list[str]:
    """The human-readable plan: one line per case with its geometry and byte counts, then the TP runs."""
    lines = [
        f"{PROG}: device={settings.device} requests={settings.requests} (timed {settings.reps}) per chunk count; "
        f"block ids as vLLM 0.33's align mode"
        + (f" (and all-real at {settings.all_real_at} chunks for KDA models)" if settings.all_real_at else "")
    ]
    for case in settings.cases:
        groups = ", ".join(
            f"{g.kind}[{g.tokens_per_block}]" + ("" if g.cacheable else " (skipped)") for g in case.groups
        )
        per_point = ", ".join(
            f"{c}{'' if layout == 'align' else ' all-real'}: "
            + "/".join(f"{b / 2**20:.1f}" for b in request_bytes(case, c, layout))
            for c, layout in settings.points(case)
        )
        lines.append(
            f"  {case.name}: {case.layers} tensors in {len(case.groups)} groups ({groups}); "
            f"{case.bytes_per_token:,.0f} B/token, {case.chunk_bytes / 2**20:.1f} MiB/chunk; "
            f"MiB stored/restored per request by chunks: {per_point}; "
            f"GPU {gpu_bytes_for(case, settings.max_chunks(case)) / 2**30:.1f} GiB, L1 {settings.l1_for(case):g} GB"
        )
    if settings.l2 != "fs":
        lines.append(f"  ipc servers' L2 tier, not the chart's: {L2_DESCRIPTIONS[settings.l2]}")
    if settings.server_args:
        lines.append(f"  ipc server flags beyond the chart's: {' '.join(settings.server_args)}")
    return lines if tp is None else lines + tp_plan_lines(tp)


def tp_plan_lines(tp: TpSettings) -> list[str]:
    lines = [f"  tp servers' L2 tier, not the chart's: {L2_DESCRIPTIONS[tp.l2]}"] if tp.l2 != "fs" else []
    lines += [f"  tp server flags beyond the chart's: {' '.join(tp.server_args)}"] if tp.server_args else []
    for case in tp.cases:
        for ranks in tp.ranks:
            for layout in tp.layouts:
                stored, restored = request_bytes(case, tp.chunks)
                servers = ranks if layout == "per-rank" else 1
                lines.append(
                    f"  tp {case.label} x{ranks} single-GPU, {servers} server{'s' if servers > 1 else ''} "
                    f"({layout}): {tp.chunks} chunks, {stored / 2**20:.1f}/{restored / 2**20:.1f} MiB stored/restored "
                    f"per writing/reading rank, {tp.writers(case, ranks, layout)} writing, "
                    f"{tp.requests} rounds (timed {tp.reps}), "
                    f"L1 {tp.l1_per_server_gb(case, ranks, layout):g} GB per server"
                )
    return lines


def check_settings(settings: Settings) -> None:
    """Refuse settings that cannot work before anything starts."""
    if not settings.chunks or min(settings.chunks) < 1 or settings.reps < 1 or settings.warmup < 0:
        raise ProofError("expected --chunks >= 1, --reps >= 1 and --warmup >= 0")
    if settings.all_real_at < 0:
        raise ProofError(f"expected --all-real-at >= 0 (0: off) but got {settings.all_real_at}")
    for case in settings.cases:
        needed = settings.l1_needed_gb(case)
        if settings.l1_size_gb is not None and needed > settings.l1_size_gb:
            raise ProofError(
                f"{case.name} stores {needed:.1f} GB over the run but --l1-size-gb is "
                f"{settings.l1_size_gb:g}; raise it or lower --chunks/--reps"
            )
        if settings.l1_for(case) > LMCACHE_L1_INIT_GB:
            raise ProofError(
                f"{case.name} needs an L1 of {settings.l1_for(case):g} GB, more than the {LMCACHE_L1_INIT_GB:g} GB a "
                f"server pins at start (it grows lazily beyond, inside timed stores); lower --chunks/--reps or give "
                f"the case fewer chunks (like {case.label}:8)"
            )


def check_tp_settings(tp: TpSettings) -> None:
    if not tp.ranks or min(tp.ranks) < 1 or tp.chunks < 1 or tp.reps < 1 or tp.warmup < 0:
        raise ProofError("expected --ranks >= 1, --tp-chunks >= 1, --tp-reps >= 1 and --warmup >= 0")
    for layout in tp.layouts:
        if layout not in SERVER_LAYOUTS:
            raise ProofError(f"expected --layouts from {', '.join(SERVER_LAYOUTS)} but got {layout!r}")
    for case in tp.cases:
        for ranks in tp.ranks:
            for layout in tp.layouts:
                per_server = tp.l1_per_server_gb(case, ranks, layout)
                if per_server > LMCACHE_L1_INIT_GB:
                    raise ProofError(
                        f"tp {case.label} x{ranks} ({layout}) needs an L1 of {per_server:g} GB per server, more than "
                        f"the {LMCACHE_L1_INIT_GB:g} GB a server pins at start; lower --tp-chunks or --tp-reps"
                    )
