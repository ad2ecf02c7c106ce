"""The startup probe's judgement: from the facts vLLM and the LMCache server logged, is this pod's cache geometry right?

Pure core, no I/O: `StartupFacts` accumulates parsed log records (and round-trips through JSON, because each probe
invocation reads only the bytes added since the previous one and must remember what earlier bytes said), and
`evaluate` turns the facts into a `Verdict` against a model profile. The rules come from the seed recipes and the
released packages: every rank logs the same geometry of the profile's shape, the scheduler block size is the LCM of the
cacheable groups, and the chunk size the server really uses (negotiated if it logged so, else configured) is a multiple
of every cacheable group. All model facts come from the profile table; there is no per-model branch here.
"""

from __future__ import annotations

import enum
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass, field
from typing import TypeVar

from glm53.chunks import required_alignment, round_up
from glm53.logparse import (
    AttentionBlockSize,
    ChunkSizeRejected,
    EngineDied,
    MalformedLine,
    NegotiatedChunk,
    Record,
    ResolvedGeometry,
    ServerUnreachable,
)
from glm53.profiles import ModelProfile

EXIT_READY = 0
EXIT_NOT_YET = 3
EXIT_WRONG = 4

# Lines without a vLLM process tag (e.g. the seed's literal lines) are filed under this origin.
UNDECORATED = "undecorated"
# Malformed lines are quoted in messages, cut to this length so a probe message stays one readable line.
_QUOTE_CHARS = 160
STATE_VERSION = 1

_T = TypeVar("_T")


class Status(enum.Enum):
    READY = "ready"
    NOT_YET = "not yet"
    WRONG = "wrong"


_EXIT_CODES = {Status.READY: EXIT_READY, Status.NOT_YET: EXIT_NOT_YET, Status.WRONG: EXIT_WRONG}


@dataclass(frozen=True)
class Verdict:
    """The probe's answer: a status, the exit code the kubelet sees, and the one line `kubectl describe` shows."""

    status: Status
    exit_code: int
    message: str

    @classmethod
    def of(cls, status: Status, message: str) -> Verdict:
        return cls(status, _EXIT_CODES[status], f"{status.value}: {' '.join(message.split())}")


@dataclass(frozen=True)
class GeometryFact:
    groups: tuple[int, ...]
    scheduler_block_size: int | None
    cache_model_name: str | None
    rank: int | None


@dataclass(frozen=True)
class NegotiatedFact:
    resolved: int
    configured_min: int
    alignment: int


@dataclass(frozen=True)
class RefusalFact:
    chunk_size: int
    required_multiple: int
    source: str


@dataclass(frozen=True)
class UnreachableFact:
    url: str
    source: str


@dataclass(frozen=True)
class EngineDeathFact:
    reason: str
    source: str


@dataclass
class StartupFacts:
    """What the logs said so far, per origin (vLLM process tag) where it matters.

    A geometry line from an origin that already logged one, or that logged a failure, means vLLM started again (the
    container restarted and `glm53 supervise` appended to the same log): the earlier run's geometry and failures are
    dropped so a failure that a restart fixed does not keep the probe failing forever. Block sizes and the server's
    negotiated line are kept (the latest per origin wins) because they precede the geometry of the run they belong to.
    """

    geometries: dict[str, GeometryFact] = field(default_factory=dict)
    block_sizes: dict[str, int] = field(default_factory=dict)
    negotiated: NegotiatedFact | None = None
    refusal: RefusalFact | None = None
    unreachable: UnreachableFact | None = None
    engine_death: EngineDeathFact | None = None
    malformed_count: int = 0
    last_malformed: str | None = None
    restarts: int = 0

    def add(self, record: Record) -> None:
        source = record.origin.process or UNDECORATED
        if isinstance(record, ResolvedGeometry):
            if source in self.geometries or source in self._failure_sources():
                self._start_new_run()
            self.geometries[source] = GeometryFact(
                record.group_tokens_per_block, record.scheduler_block_size, record.cache_model_name, record.origin.rank
            )
        elif isinstance(record, AttentionBlockSize):
            self.block_sizes[source] = record.tokens
        elif isinstance(record, NegotiatedChunk):
            self.negotiated = NegotiatedFact(record.resolved, record.configured_min, record.alignment)
        elif isinstance(record, ChunkSizeRejected):
            self.refusal = RefusalFact(record.chunk_size, record.required_multiple, source)
        elif isinstance(record, ServerUnreachable):
            self.unreachable = UnreachableFact(record.url, source)
        elif isinstance(record, EngineDied):
            # The first death line names the cause; the ones after it ("See root cause above") only echo it.
            self.engine_death = self.engine_death or EngineDeathFact(record.reason, source)
        elif isinstance(record, MalformedLine):
            self.malformed_count += 1
            self.last_malformed = f"{record.kind}: {record.text[:_QUOTE_CHARS]}"

    def add_all(self, records: Iterable[Record]) -> None:
        for record in records:
            self.add(record)

    def _failure_sources(self) -> set[str]:
        return {f.source for f in (self.refusal, self.unreachable, self.engine_death) if f is not None}

    def _start_new_run(self) -> None:
        self.geometries.clear()
        self.refusal = self.unreachable = self.engine_death = None
        self.malformed_count, self.last_malformed = 0, None
        self.restarts += 1

    @classmethod
    def combined(cls, parts: Iterable[StartupFacts]) -> StartupFacts:
        """One view over several logs (vLLM's and the LMCache server's are separate files with separate facts)."""
        total = cls()
        for part in parts:
            total.geometries.update(part.geometries)
            total.block_sizes.update(part.block_sizes)
            total.negotiated = part.negotiated or total.negotiated
            total.refusal = total.refusal or part.refusal
            total.unreachable = total.unreachable or part.unreachable
            total.engine_death = total.engine_death or part.engine_death
            total.malformed_count += part.malformed_count
            total.last_malformed = part.last_malformed or total.last_malformed
            total.restarts += part.restarts
        return total

    def to_json(self) -> dict[str, object]:
        data = asdict(self)
        data["version"] = STATE_VERSION
        return data

    @classmethod
    def from_json(cls, data: object) -> StartupFacts:
        """The facts `to_json` wrote; ValueError for anything else (the probe then discards the state)."""
        try:
            return cls._load(_object(data, "facts"))
        except (KeyError, TypeError) as error:
            raise ValueError(f"facts are incomplete: {error!r}") from None

    @classmethod
    def _load(cls, obj: dict[str, object]) -> StartupFacts:
        if obj.get("version") != STATE_VERSION:
            raise ValueError(f"facts have version {obj.get('version')!r}, expected {STATE_VERSION}")
        geometries = {
            _str(key, "geometry origin"): _geometry(value) for key, value in _object(obj["geometries"], "geo").items()
        }
        block_sizes = {
            _str(key, "block size origin"): _int(value, "block size")
            for key, value in _object(obj["block_sizes"], "block_sizes").items()
        }
        return cls(
            geometries=geometries,
            block_sizes=block_sizes,
            negotiated=_optional(obj["negotiated"], _negotiated),
            refusal=_optional(obj["refusal"], _refusal),
            unreachable=_optional(obj["unreachable"], _unreachable),
            engine_death=_optional(obj["engine_death"], _engine_death),
            malformed_count=_int(obj["malformed_count"], "malformed_count"),
            last_malformed=_optional(obj["last_malformed"], lambda v: _str(v, "last_malformed")),
            restarts=_int(obj["restarts"], "restarts"),
        )


def evaluate(
    profile: ModelProfile,
    tensor_parallel_size: int,
    configured_chunk_size: int,
    facts: StartupFacts,
    bytes_read: int,
    unread_bytes: int = 0,
) -> Verdict:
    """The verdict for `profile` at this TP size and configured LMCache `--chunk-size`, given what the logs said.

    `bytes_read` is how much log the facts come from, so a "not yet" says how far the probe got; `unread_bytes` is
    the backlog a time-limited invocation left for the next one: while it is not zero, "ready" is only "not yet".
    """
    verdict = _evaluate(profile, tensor_parallel_size, configured_chunk_size, facts, bytes_read)
    if verdict.status is Status.READY and unread_bytes:
        return Verdict.of(
            Status.NOT_YET,
            f"still catching up on the log: read {bytes_read} bytes, {unread_bytes} left for the next invocation; "
            "nothing wrong so far",
        )
    return verdict


def _evaluate(
    profile: ModelProfile,
    tensor_parallel_size: int,
    configured_chunk_size: int,
    facts: StartupFacts,
    bytes_read: int,
) -> Verdict:
    failure = _failure(facts)
    if failure is not None:
        return failure
    if not facts.geometries:
        return _waiting_for_geometry(profile, facts, bytes_read)
    disagreement = _ranks_disagree(facts.geometries)
    if disagreement is not None:
        return Verdict.of(Status.WRONG, disagreement)
    rank_problem = _rank_coverage(facts, tensor_parallel_size, bytes_read)
    if rank_problem is not None:
        return rank_problem
    geometry = next(iter(facts.geometries.values()))
    return _check_geometry(profile, tensor_parallel_size, configured_chunk_size, facts, geometry)


def _failure(facts: StartupFacts) -> Verdict | None:
    # The refusal and the unreachable server are causes; the engine's death is usually their consequence.
    if facts.refusal is not None:
        refusal = facts.refusal
        fix = round_up(refusal.chunk_size, max(refusal.required_multiple, 1))
        return Verdict.of(
            Status.WRONG,
            f"the LMCache connector ({refusal.source}) refused the chunk size: expected a multiple of "
            f"{refusal.required_multiple}, found {refusal.chunk_size}; set --chunk-size {fix} on the LMCache server "
            "(the released LMCache 0.5.6 does not negotiate it)",
        )
    if facts.unreachable is not None:
        return Verdict.of(
            Status.WRONG,
            f"vLLM ({facts.unreachable.source}) cannot reach the LMCache MP server at {facts.unreachable.url!r}; "
            "expected the lmcache sidecar listening there: check that it runs and that lmcache.mp.host / "
            "lmcache.mp.port in --kv-transfer-config match its --host / --port",
        )
    if facts.engine_death is not None:
        return Verdict.of(
            Status.WRONG,
            f"vLLM's engine died during start-up ({facts.engine_death.source}: {facts.engine_death.reason!r}); "
            "expected it to load the model: read the lines above it in vLLM's log for the root cause",
        )
    return None


def _waiting_for_geometry(profile: ModelProfile, facts: StartupFacts, bytes_read: int) -> Verdict:
    missing = "the connector's 'Resolved LMCache MP geometry' line"
    if profile.follows_unified_block_size and not facts.block_sizes:
        missing = f"vLLM's 'Setting attention block size' line and {missing}"
    return Verdict.of(
        Status.NOT_YET,
        f"vLLM is still loading: waiting for {missing}; read {bytes_read} bytes of log so far{_malformed_note(facts)}",
    )


def _malformed_note(facts: StartupFacts) -> str:
    if not facts.malformed_count:
        return ""
    return f"; {facts.malformed_count} fact line(s) could not be parsed (last: {facts.last_malformed})"


def _ranks_disagree(geometries: dict[str, GeometryFact]) -> str | None:
    distinct: dict[tuple[tuple[int, ...], int | None], list[str]] = {}
    for source, geometry in sorted(geometries.items()):
        distinct.setdefault((geometry.groups, geometry.scheduler_block_size), []).append(source)
    if len(distinct) < 2:
        return None
    found = "; ".join(
        f"{', '.join(sources)}: group_tokens_per_block={list(groups)}, scheduler_block_size={sched}"
        for (groups, sched), sources in distinct.items()
    )
    return (
        f"vLLM ranks disagree on the cache geometry: expected every rank to log the same, found {found}; make every "
        "rank run the same model, TP size and attention backend, then restart the pod"
    )


def _rank_coverage(facts: StartupFacts, tensor_parallel_size: int, bytes_read: int) -> Verdict | None:
    ranks = {g.rank for g in facts.geometries.values() if g.rank is not None}
    if not ranks:  # undecorated or single-process logs: one geometry line is all there is
        return None
    if max(ranks) >= tensor_parallel_size:
        return Verdict.of(
            Status.WRONG,
            f"expected TP ranks 0..{tensor_parallel_size - 1} (--tensor-parallel-size {tensor_parallel_size}), found "
            f"a geometry line from rank {max(ranks)}; give the probe the TP size vLLM runs with",
        )
    missing = [f"TP{rank}" for rank in range(tensor_parallel_size) if rank not in ranks]
    if missing:
        return Verdict.of(
            Status.NOT_YET,
            f"{len(ranks)} of {tensor_parallel_size} TP ranks logged their geometry; waiting for the 'Resolved LMCache "
            f"MP geometry' line of {', '.join(missing)} after reading {bytes_read} bytes of log"
            + _malformed_note(facts),
        )
    return None


def _shape(profile: ModelProfile) -> str:
    return "[" + ", ".join("N" if g.tokens_per_block is None else str(g.tokens_per_block) for g in profile.groups) + "]"


def _unified_size_from_groups(profile: ModelProfile, groups: tuple[int, ...]) -> tuple[int | None, str | None]:
    """N as the geometry carries it (None for fixed-size profiles), or a problem when the groups miss the shape."""
    shape_problem = (
        f"expected group_tokens_per_block of the shape {_shape(profile)} for {profile.display_name}, found "
        f"{list(groups)}; serve {profile.model_id} with the profile that matches it"
    )
    if len(groups) != len(profile.groups):
        return None, shape_problem
    follows = {size for group, size in zip(profile.groups, groups, strict=True) if group.tokens_per_block is None}
    fixed_ok = all(
        size == group.tokens_per_block
        for group, size in zip(profile.groups, groups, strict=True)
        if group.tokens_per_block is not None
    )
    if not fixed_ok or len(follows) > 1 or 0 in follows:
        return None, shape_problem
    return (follows.pop() if follows else None), None


def _check_geometry(
    profile: ModelProfile,
    tensor_parallel_size: int,
    configured_chunk_size: int,
    facts: StartupFacts,
    geometry: GeometryFact,
) -> Verdict:
    groups = geometry.groups
    unified, shape_problem = _unified_size_from_groups(profile, groups)
    if shape_problem is not None:
        return Verdict.of(Status.WRONG, shape_problem)
    alignment = required_alignment(groups)
    if geometry.scheduler_block_size is not None and geometry.scheduler_block_size != alignment:
        return Verdict.of(
            Status.WRONG,
            f"expected scheduler_block_size = LCM of the non-zero groups {list(groups)} = {alignment}, found "
            f"{geometry.scheduler_block_size}; the connector and vLLM disagree: use an LMCache build that matches vLLM",
        )
    block_problem = _block_size_problem(profile, tensor_parallel_size, facts, unified)
    if block_problem is not None:
        return Verdict.of(Status.WRONG, block_problem)
    chunk, chunk_source = configured_chunk_size, "configured; no negotiation logged"
    if facts.negotiated is not None:
        negotiated = facts.negotiated
        if negotiated.alignment != alignment or negotiated.resolved != round_up(negotiated.configured_min, alignment):
            return Verdict.of(
                Status.WRONG,
                f"expected the LMCache server to negotiate configured_min={negotiated.configured_min} up to the "
                f"smallest multiple of the geometry's alignment {alignment} "
                f"({round_up(negotiated.configured_min, alignment)}), found resolved={negotiated.resolved} with "
                f"required_alignment={negotiated.alignment}; restart the LMCache server so it negotiates against "
                "this vLLM's geometry",
            )
        chunk, chunk_source = negotiated.resolved, f"negotiated from {negotiated.configured_min}"
    if chunk % alignment != 0:
        return Verdict.of(
            Status.WRONG,
            f"expected the chunk size to be a multiple of every non-zero group (LCM {alignment} of {list(groups)}), "
            f"found {chunk} ({chunk_source}); set --chunk-size {round_up(chunk, alignment)} on the LMCache "
            "server",
        )
    return Verdict.of(
        Status.READY,
        f"{profile.display_name} geometry {list(groups)} {_sources_text(facts.geometries)}, "
        f"scheduler_block_size {alignment}, chunk size {chunk} ({chunk_source}) is a multiple of {alignment}"
        f"{_validation_note(profile, tensor_parallel_size, unified)}",
    )


def _sources_text(geometries: dict[str, GeometryFact]) -> str:
    ranks = sorted(g.rank for g in geometries.values() if g.rank is not None)
    return f"on all {len(ranks)} TP ranks" if ranks else f"logged by {', '.join(sorted(geometries))}"


def _block_size_problem(
    profile: ModelProfile, tensor_parallel_size: int, facts: StartupFacts, unified: int | None
) -> str | None:
    if unified is None:  # fixed-size groups: vLLM's unified block size does not shape this model's cache
        return None
    logged = sorted(set(facts.block_sizes.values()))
    if len(logged) > 1 or (logged and logged[0] != unified):
        return (
            f"expected vLLM's attention block size to equal the groups' N = {unified}, found 'Setting attention block "
            f"size' lines saying {', '.join(map(str, logged))}; restart the pod so every process uses one block size"
        )
    recorded = profile.unified_block_size(tensor_parallel_size)
    if recorded is not None and unified != recorded:
        return (
            f"expected N = {recorded} for {profile.display_name} at TP {tensor_parallel_size} (profile), found "
            f"{unified}; check --tensor-parallel-size and the model (N changes with the TP size)"
        )
    return None


def _validation_note(profile: ModelProfile, tensor_parallel_size: int, unified: int | None) -> str:
    if unified is not None and profile.unified_block_size(tensor_parallel_size) is None:
        measured = ", ".join(f"TP {tp}" for tp in sorted(profile.unified_block_size_by_tp)) or "no TP size"
        return f"; N = {unified} was not validated at TP {tensor_parallel_size} (recorded for {measured} only)"
    if unified is not None:
        return f"; N = {unified} as recorded for TP {tensor_parallel_size}"
    if tensor_parallel_size != profile.tensor_parallel_size:
        return f"; TP {tensor_parallel_size} was not validated (validated at TP {profile.tensor_parallel_size})"
    return ""


# --- JSON loading helpers: strict, so a corrupt state file is detected and discarded rather than trusted. ---


def _object(value: object, what: str) -> dict[str, object]:
    if not isinstance(value, dict):
        raise ValueError(f"{what} must be a JSON object")
    return value


def _int(value: object, what: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ValueError(f"{what} must be a non-negative integer, found {value!r}")
    return value


def _str(value: object, what: str) -> str:
    if not isinstance(value, str):
        raise ValueError(f"{what} must be a string, found {value!r}")
    return value


def _optional_int(value: object, what: str) -> int | None:
    return None if value is None else _int(value, what)


def _optional(value: object, load: Callable[[object], _T]) -> _T | None:
    return None if value is None else load(value)


def _geometry(value: object) -> GeometryFact:
    obj = _object(value, "geometry")
    groups = obj["groups"]
    if not isinstance(groups, list) or not groups:
        raise ValueError("geometry groups must be a non-empty list")
    return GeometryFact(
        tuple(_int(g, "group") for g in groups),
        _optional_int(obj["scheduler_block_size"], "scheduler_block_size"),
        _optional(obj["cache_model_name"], lambda v: _str(v, "cache_model_name")),
        _optional_int(obj["rank"], "rank"),
    )


def _negotiated(value: object) -> NegotiatedFact:
    obj = _object(value, "negotiated")
    return NegotiatedFact(*(_int(obj[key], key) for key in ("resolved", "configured_min", "alignment")))


def _refusal(value: object) -> RefusalFact:
    obj = _object(value, "refusal")
    return RefusalFact(_int(obj["chunk_size"], "chunk_size"), _int(obj["required_multiple"], "required"), _source(obj))


def _unreachable(value: object) -> UnreachableFact:
    obj = _object(value, "unreachable")
    return UnreachableFact(_str(obj["url"], "url"), _source(obj))


def _engine_death(value: object) -> EngineDeathFact:
    obj = _object(value, "engine_death")
    return EngineDeathFact(_str(obj["reason"], "reason"), _source(obj))


def _source(obj: dict[str, object]) -> str:
    return _str(obj["source"], "source")
