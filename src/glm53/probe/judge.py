"""The startup probe's judgement: from the facts vLLM and the LMCache server logged, is this pod's cache geometry right?

Pure core, no I/O: `StartupFacts` accumulates parsed log records (and round-trips through JSON, because each probe
invocation reads only the bytes added since the previous one and must remember what earlier bytes said), and
`evaluate` turns the facts into a `Verdict` against a model profile. The rules come from the seed recipes and the
released packages: every connector of a vLLM start logs the same geometry of the profile's shape, the scheduler block
size is the LCM of the cacheable groups, and the chunk size the server really uses (negotiated if it logged so, else
configured) is a multiple of every cacheable group. The server logs the size it started with (`TokenHasher
initialized: chunk_size=C`, lmcache 0.5.6 lmcache/v1/multiprocess/token_hasher.py:67): a configured size that differs
from it is wrong, and without a configured size it is the one judged; with neither, the probe waits rather than assume
the server's default. All model facts come from the profile table; there is no per-model branch here.

The geometry line carries no process tag (LMCache logs it through its own handler, lmcache 0.5.6 lmcache/logging.py:
66-81), so a run is judged by counting: lmcache 0.5.6 integration/vllm/lmcache_mp_connector.py:667-672 logs it in
`LMCacheMPConnector.__init__`, which vLLM runs once per TP worker (vllm 0.33.0 v1/worker/gpu_worker.py:887) and once
for the scheduler (v1/engine/core.py:163-180, after the workers): TP + 1 identical lines per start.
"""

from __future__ import annotations

import enum
import re
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass, field, replace
from typing import TypeVar

from glm53.chunks import required_alignment, round_up
from glm53.probe.logparse import (
    ENGINE_PROCESS,
    AttentionBlockSize,
    ChunkSizeRejected,
    EngineDied,
    LineOrigin,
    MalformedLine,
    NegotiatedChunk,
    Record,
    ResolvedGeometry,
    RunStarted,
    ServerChunkSize,
    ServerUnreachable,
)
from glm53.profiles import ModelProfile

EXIT_READY = 0
EXIT_NOT_YET = 3
EXIT_WRONG = 4

# Lines without a vLLM process tag (LMCache's own lines, raw tracebacks) are filed under this origin.
UNDECORATED = "undecorated"
# Malformed lines are quoted in messages, cut to this length so a probe message stays one readable line.
_QUOTE_CHARS = 160
STATE_VERSION = 2

_T = TypeVar("_T")
# Colour codes (LMCache's are always on) and other control characters must not reach `kubectl describe`.
_UNPRINTABLE = re.compile(r"\x1b\[[\d;]*m|[\x00-\x1f\x7f]")


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
    """One geometry the connectors of the current run logged, and how many of its lines appeared."""

    groups: tuple[int, ...]
    scheduler_block_size: int | None
    cache_model_name: str | None
    lines: int = 1

    @property
    def text(self) -> str:
        return f"group_tokens_per_block={list(self.groups)}, scheduler_block_size={self.scheduler_block_size}"


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
    """What the logs said since the current vLLM run began.

    A run begins at vLLM's start banner, or where an engine-core process of the same name logs under a new pid (a
    restarted container appends to the same log through `glm53 supervise`, and in a pod's pid namespace the new
    processes often get the old pids, so the banner is the main boundary). The earlier run's geometry, block sizes
    and failures are dropped, so a failure that a restart fixed does not keep the probe failing forever. The
    server's negotiated line and its logged chunk size are kept: the LMCache server is a separate process whose start is
    no vLLM run boundary (a restarted server logs its size again, and the latest line wins).
    `geometries` maps each distinct geometry text to its fact, in the order first seen.
    """

    geometries: dict[str, GeometryFact] = field(default_factory=dict)
    block_sizes: dict[str, int] = field(default_factory=dict)
    negotiated: NegotiatedFact | None = None
    server_chunk_size: int | None = None
    refusal: RefusalFact | None = None
    unreachable: UnreachableFact | None = None
    engine_death: EngineDeathFact | None = None
    malformed_count: int = 0
    last_malformed: str | None = None
    restarts: int = 0
    vllm_version: str | None = None
    engine_pids: dict[str, int] = field(default_factory=dict)

    @property
    def geometry_lines(self) -> int:
        return sum(g.lines for g in self.geometries.values())

    def add(self, record: Record) -> None:
        self._observe_engine(record.origin)
        source = record.origin.process or UNDECORATED
        if isinstance(record, RunStarted):
            self._start_new_run()
            self.vllm_version = record.version
        elif isinstance(record, ResolvedGeometry):
            self._count_geometry(
                GeometryFact(record.group_tokens_per_block, record.scheduler_block_size, record.cache_model_name)
            )
        elif isinstance(record, AttentionBlockSize):
            self.block_sizes[source] = record.tokens
        elif isinstance(record, NegotiatedChunk):
            self.negotiated = NegotiatedFact(record.resolved, record.configured_min, record.alignment)
        elif isinstance(record, ServerChunkSize):
            self.server_chunk_size = record.chunk_size
        elif isinstance(record, ChunkSizeRejected):
            # A traceback is printed twice (the engine's log line and multiprocessing's report); the first names the
            # process.
            self.refusal = self.refusal or RefusalFact(record.chunk_size, record.required_multiple, source)
        elif isinstance(record, ServerUnreachable):
            self.unreachable = self.unreachable or UnreachableFact(record.url, source)
        elif isinstance(record, EngineDied):
            # The first death line names the cause; the ones after it ("See root cause above") only echo it.
            self.engine_death = self.engine_death or EngineDeathFact(record.reason, source)
        elif isinstance(record, MalformedLine):
            self.malformed_count += 1
            self.last_malformed = f"{record.kind}: {_printable(record.text)[:_QUOTE_CHARS]}"

    def add_all(self, records: Iterable[Record]) -> None:
        for record in records:
            self.add(record)

    def _count_geometry(self, fact: GeometryFact) -> None:
        known = self.geometries.get(fact.text)
        self.geometries[fact.text] = fact if known is None else replace(known, lines=known.lines + fact.lines)

    def _observe_engine(self, origin: LineOrigin) -> None:
        if origin.pid is None or origin.process is None or not origin.process.startswith(ENGINE_PROCESS):
            return
        known = self.engine_pids.get(origin.process)
        if known is not None and known != origin.pid:
            self._start_new_run()
        self.engine_pids[origin.process] = origin.pid

    def _start_new_run(self) -> None:
        if self.geometries or self.block_sizes or self.engine_pids or self._failed:
            self.restarts += 1
        self.geometries.clear()
        self.block_sizes.clear()
        self.engine_pids.clear()
        self.refusal = self.unreachable = self.engine_death = None
        self.malformed_count, self.last_malformed = 0, None

    @property
    def _failed(self) -> bool:
        return any(f is not None for f in (self.refusal, self.unreachable, self.engine_death))

    @classmethod
    def combined(cls, parts: Iterable[StartupFacts]) -> StartupFacts:
        """One view over several logs (vLLM's and the LMCache server's are separate files with separate facts)."""
        total = cls()
        for part in parts:
            for geometry in part.geometries.values():
                total._count_geometry(geometry)
            total.block_sizes.update(part.block_sizes)
            total.negotiated = part.negotiated or total.negotiated
            if part.server_chunk_size is not None:
                total.server_chunk_size = part.server_chunk_size
            total.refusal = total.refusal or part.refusal
            total.unreachable = total.unreachable or part.unreachable
            total.engine_death = total.engine_death or part.engine_death
            total.malformed_count += part.malformed_count
            total.last_malformed = part.last_malformed or total.last_malformed
            total.restarts += part.restarts
            total.vllm_version = total.vllm_version or part.vllm_version
            total.engine_pids.update(part.engine_pids)
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
            _str(key, "geometry text"): _geometry(value) for key, value in _object(obj["geometries"], "geo").items()
        }
        return cls(
            geometries=geometries,
            block_sizes=_int_map(obj["block_sizes"], "block size"),
            negotiated=_optional(obj["negotiated"], _negotiated),
            # A state saved before this fact existed lacks the key: it is "incomplete", discarded and the log rescanned,
            # since trusting it would lose a TokenHasher line already read past.
            server_chunk_size=_optional_int(obj["server_chunk_size"], "server_chunk_size"),
            refusal=_optional(obj["refusal"], _refusal),
            unreachable=_optional(obj["unreachable"], _unreachable),
            engine_death=_optional(obj["engine_death"], _engine_death),
            malformed_count=_int(obj["malformed_count"], "malformed_count"),
            last_malformed=_optional(obj["last_malformed"], lambda v: _str(v, "last_malformed")),
            restarts=_int(obj["restarts"], "restarts"),
            vllm_version=_optional(obj["vllm_version"], lambda v: _str(v, "vllm_version")),
            engine_pids=_int_map(obj["engine_pids"], "engine pid"),
        )


def evaluate(
    profile: ModelProfile,
    tensor_parallel_size: int,
    configured_chunk_size: int | None,
    facts: StartupFacts,
    bytes_read: int,
    unread_bytes: int = 0,
) -> Verdict:
    """The verdict for `profile` at this TP size and configured LMCache `--chunk-size`, given what the logs said.

    `configured_chunk_size` is None when the caller was not told one: the server's logged size is judged then, and
    until the server logs it a verdict that depends on the chunk size is "not yet", never one made on a default.
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
    configured_chunk_size: int | None,
    facts: StartupFacts,
    bytes_read: int,
) -> Verdict:
    failure = _failure(facts)
    if failure is not None:
        return failure
    # The server's own size is known from its start, long before vLLM's geometry: a mismatch is wrong at once.
    mismatch = _server_chunk_problem(configured_chunk_size, facts)
    if mismatch is not None:
        return Verdict.of(Status.WRONG, mismatch)
    if not facts.geometries:
        return _waiting_for_geometry(profile, facts, bytes_read)
    expected = tensor_parallel_size + 1
    if len(facts.geometries) > 1:
        found = " and ".join(f"{g.lines} x {g.text}" for g in facts.geometries.values())
        return Verdict.of(
            Status.WRONG,
            f"the connectors disagree on the cache geometry: expected all {expected} 'Resolved LMCache MP geometry' "
            f"lines since {_run_text(facts)} (scheduler + {tensor_parallel_size} TP workers) to be the same, "
            f"found {found}; make every rank run the same model, TP size and attention backend, then restart the pod",
        )
    geometry = next(iter(facts.geometries.values()))
    problem = _geometry_problem(profile, tensor_parallel_size, facts, geometry)
    if problem is not None:
        return Verdict.of(Status.WRONG, problem)
    if geometry.lines > expected:
        return Verdict.of(
            Status.WRONG,
            f"expected {expected} 'Resolved LMCache MP geometry' lines (scheduler + {tensor_parallel_size} TP workers) "
            f"since {_run_text(facts)}, found {geometry.lines}; give the probe vLLM's --tensor-parallel-size, and keep "
            "vLLM's log level at INFO or below so its start banner marks each restart",
        )
    if geometry.lines < expected:
        return Verdict.of(
            Status.NOT_YET,
            f"{geometry.lines} of {expected} 'Resolved LMCache MP geometry' lines (scheduler + {tensor_parallel_size} "
            f"TP workers) since {_run_text(facts)}, all {geometry.text}; nothing to change yet, waiting for the rest "
            f"after reading {bytes_read} bytes of log{_malformed_note(facts)}",
        )
    effective = _effective_chunk(configured_chunk_size, facts)
    if effective is None:
        return Verdict.of(
            Status.NOT_YET,
            f"all {geometry.lines} 'Resolved LMCache MP geometry' lines since {_run_text(facts)} say {geometry.text}, "
            "but the chunk size is unknown: no --chunk-size was given and no 'TokenHasher initialized: chunk_size=C' "
            f"line from the LMCache server in the {bytes_read} bytes of log read; nothing to change yet while the "
            "server starts; if it never logs it, pass the server's --chunk-size to the probe or add the server's log "
            f"(--log .../lmcache.log, LMCache's log level INFO){_malformed_note(facts)}",
        )
    chunk_problem = _chunk_problem(*effective, geometry)
    if chunk_problem is not None:
        return Verdict.of(Status.WRONG, chunk_problem)
    return _ready(profile, tensor_parallel_size, effective, facts, geometry)


def _run_text(facts: StartupFacts) -> str:
    """How the current run is named in messages: by the version its banner announced, when one was seen."""
    if facts.vllm_version is None:
        return "the log began" if not facts.restarts else f"vLLM's latest start ({facts.restarts} earlier in this log)"
    again = f" again ({facts.restarts} earlier start(s) in this log)" if facts.restarts else ""
    return f"vLLM {facts.vllm_version} started{again}"


def _failure(facts: StartupFacts) -> Verdict | None:
    # The refusal and the unreachable server are causes; the engine's death is usually their consequence.
    if facts.refusal is not None:
        refusal = facts.refusal
        fix = round_up(refusal.chunk_size, max(refusal.required_multiple, 1))
        return Verdict.of(
            Status.WRONG,
            f"the LMCache connector{_in(refusal.source)} refused the chunk size: expected a multiple of the "
            f"group's tokens_per_block {refusal.required_multiple}, found --chunk-size {refusal.chunk_size}; set "
            f"--chunk-size {fix} on the LMCache server (the released LMCache 0.5.6 does not negotiate it)",
        )
    if facts.unreachable is not None:
        return Verdict.of(
            Status.WRONG,
            f"vLLM's LMCache connector{_in(facts.unreachable.source)} cannot reach the LMCache MP server at "
            f"{facts.unreachable.url!r}; "
            "expected the lmcache sidecar listening there: check that it runs and that lmcache.mp.host / "
            "lmcache.mp.port in --kv-transfer-config match its --host / --port",
        )
    if facts.engine_death is not None:
        return Verdict.of(
            Status.WRONG,
            f"vLLM's engine died during start-up{_in(facts.engine_death.source)} ({facts.engine_death.reason!r}); "
            "expected it to load the model: read the lines above it in vLLM's log for the root cause",
        )
    return None


def _printable(text: str) -> str:
    return _UNPRINTABLE.sub("", text)


def _in(source: str) -> str:
    """` in EngineCore` for a vLLM-tagged line; nothing for LMCache's lines and raw tracebacks (they name no one)."""
    return "" if source == UNDECORATED else f" in {source}"


def _waiting_for_geometry(profile: ModelProfile, facts: StartupFacts, bytes_read: int) -> Verdict:
    missing = "the connectors' 'Resolved LMCache MP geometry' lines"
    if profile.follows_unified_block_size and not facts.block_sizes:
        missing = f"vLLM's 'Setting attention block size' line and {missing}"
    return Verdict.of(
        Status.NOT_YET,
        f"vLLM is still loading (no geometry line since {_run_text(facts)}): waiting for {missing}; nothing to "
        f"change yet, read {bytes_read} bytes of log so far{_malformed_note(facts)}",
    )


def _malformed_note(facts: StartupFacts) -> str:
    if not facts.malformed_count:
        return ""
    return f"; {facts.malformed_count} fact line(s) could not be parsed (last: {facts.last_malformed})"


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


def _geometry_problem(
    profile: ModelProfile, tensor_parallel_size: int, facts: StartupFacts, geometry: GeometryFact
) -> str | None:
    """What is wrong with a geometry as soon as its first line appears (more lines of it cannot fix it), or None."""
    groups = geometry.groups
    unified, shape_problem = _unified_size_from_groups(profile, groups)
    if shape_problem is not None:
        return shape_problem
    alignment = required_alignment(groups)
    if geometry.scheduler_block_size is not None and geometry.scheduler_block_size != alignment:
        return (
            f"expected scheduler_block_size = LCM of the non-zero groups {list(groups)} = {alignment}, found "
            f"{geometry.scheduler_block_size}; the connector and vLLM disagree: use an LMCache build that matches vLLM"
        )
    block_problem = _block_size_problem(profile, tensor_parallel_size, facts, unified)
    if block_problem is not None:
        return block_problem
    negotiated = facts.negotiated
    if negotiated is not None and (
        negotiated.alignment != alignment or negotiated.resolved != round_up(negotiated.configured_min, alignment)
    ):
        return (
            f"expected the LMCache server to negotiate configured_min={negotiated.configured_min} up to the "
            f"smallest multiple of the geometry's alignment {alignment} "
            f"({round_up(negotiated.configured_min, alignment)}), found resolved={negotiated.resolved} with "
            f"required_alignment={negotiated.alignment}; restart the LMCache server so it negotiates against "
            "this vLLM's geometry"
        )
    if negotiated is not None and negotiated.resolved not in profile.validated_chunk_sizes:
        return _unvalidated_negotiation(profile, negotiated, alignment)
    return None


def _unvalidated_negotiation(profile: ModelProfile, negotiated: NegotiatedFact, alignment: int) -> str:
    """A negotiated size the profile was not validated at: the minimum that negotiates to a validated one is the fix.

    A negotiating server (lmcache 0.5.7rc2 engine_context.py:269-322) rounds its --chunk-size up to the alignment, so
    a validated size V that is a multiple of the alignment negotiates to itself."""
    validated = ", ".join(map(str, profile.validated_chunk_sizes))
    fits = [size for size in profile.validated_chunk_sizes if size % alignment == 0]
    fix = (
        f"set --chunk-size {fits[0]} on the LMCache server (lmcache.chunkSize={fits[0]}), which negotiates to itself"
        if fits
        else f"none of them is a multiple of the alignment {alignment}: serve the model its profile describes"
    )
    return (
        f"expected a chunk size that {profile.display_name} was validated at ({validated}), found "
        f"{negotiated.resolved}: the LMCache server negotiated configured_min={negotiated.configured_min} up to it "
        f"(required_alignment={negotiated.alignment}); {fix}"
    )


def _chunk_problem(chunk: int, chunk_source: str, geometry: GeometryFact) -> str | None:
    """The chunk size against the geometry, judged once every connector line is in: a negotiating server settles its
    size when the first TP worker's connector asks (lmcache 0.5.7rc2 vllm_multi_process_adapter.py:249-271), just
    after that worker logged its geometry line and before the scheduler's (captured in
    tests/fixtures/logs/lmcache-0.5.7rc2/), so until then the server's first `TokenHasher` size is its minimum."""
    alignment = required_alignment(geometry.groups)
    if chunk % alignment == 0:
        return None
    return (
        f"expected the chunk size to be a multiple of every non-zero group (LCM {alignment} of "
        f"{list(geometry.groups)}), found {chunk} ({chunk_source}); set --chunk-size {round_up(chunk, alignment)} on "
        "the LMCache server"
    )


def _effective_chunk(configured_chunk_size: int | None, facts: StartupFacts) -> tuple[int, str] | None:
    """The chunk size the server uses and where it comes from: negotiated when it logged so, else configured, else the
    size the server logged; None while none of them is known (no default stands in for it)."""
    if facts.negotiated is not None:
        return facts.negotiated.resolved, f"negotiated from {facts.negotiated.configured_min}"
    if configured_chunk_size is not None:
        # Equal to the server's logged size when it logged one: `_server_chunk_problem` refused any other.
        return configured_chunk_size, "configured; no negotiation logged"
    if facts.server_chunk_size is not None:
        return facts.server_chunk_size, "the LMCache server's, from its log; no negotiation logged"
    return None


def _server_chunk_problem(configured_chunk_size: int | None, facts: StartupFacts) -> str | None:
    """The configured size against the one the server logged it hashes with; a negotiation that turned the one into
    the other (its configured_min and resolved size are the two numbers) explains a difference."""
    server = facts.server_chunk_size
    if configured_chunk_size is None or server is None or configured_chunk_size == server:
        return None
    negotiated = facts.negotiated
    if negotiated is not None and {configured_chunk_size, server} <= {negotiated.configured_min, negotiated.resolved}:
        return None
    unexplained = (
        "" if negotiated is None else ", and its 'Negotiated LMCache MP chunk size' line does not relate the two"
    )
    return (
        f"expected the LMCache server to run with the --chunk-size the probe was told ({configured_chunk_size}), "
        f"found chunk_size={server} in its log ('TokenHasher initialized'){unexplained}; pass the server's size "
        f"(--chunk-size {server}) to the probe, or fix the chart's lmcache.chunkSize so the server starts with "
        f"{configured_chunk_size}"
    )


def _ready(
    profile: ModelProfile,
    tensor_parallel_size: int,
    effective_chunk: tuple[int, str],
    facts: StartupFacts,
    geometry: GeometryFact,
) -> Verdict:
    unified, _ = _unified_size_from_groups(profile, geometry.groups)
    alignment = required_alignment(geometry.groups)
    chunk, chunk_source = effective_chunk
    return Verdict.of(
        Status.READY,
        f"{profile.display_name} geometry {list(geometry.groups)} in all {geometry.lines} connector lines "
        f"(scheduler + {tensor_parallel_size} TP workers) since {_run_text(facts)}, scheduler_block_size "
        f"{alignment}, chunk size {chunk} ({chunk_source}) is a multiple of {alignment}"
        f"{_validation_note(profile, tensor_parallel_size, unified)}; nothing to change",
    )


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
        _int(obj["lines"], "lines"),
    )


def _int_map(value: object, what: str) -> dict[str, int]:
    return {_str(key, f"{what} key"): _int(item, what) for key, item in _object(value, what).items()}


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
