"""The exporter's log side: follow the logs incrementally and turn what they said at start-up into facts to export.

It reuses the startup probe's pieces rather than parsing logs a second way: `glm53.probe.logtail.LogFollower` hands out
only the lines appended since the previous scrape (so a scrape costs the new bytes, not the log's size, and survives
`glm53 supervise`'s rotation), `glm53.probe.logparse` recognises the records, `glm53.probe.judge.StartupFacts`
accumulates them and `glm53.probe.judge.evaluate` gives the same verdict the kubelet's probe gives. The followers'
positions live in memory only: a restarted exporter reads the logs again from their start once, which is what rebuilds
its facts.

One fact the probe does not need is measured here: how long vLLM took from its first log line to the geometry line.
vLLM stamps its own lines `INFO 11-29 07:00:01` (no year, second resolution; vllm 0.33.0 vllm/logger.py); the geometry
line comes from LMCache's logger, stamped `[2026-11-29 07:02:11,400]` (lmcache 0.5.6 lmcache/logging.py), whose year is
dropped so both compare. `glm53 supervise` appends every restart of a container to the same file, so a run starts at
the first stamped line, at vLLM's start banner (`logparse.RunStarted`), or where the API server's pid changes.

One more is counted from the LMCache servers' own logs: their failed L2 store tasks. LMCache's chunk counters are
labelled by `cache_salt` (lmcache 0.5.6 lmcache/v1/mp_observability/subscribers/metrics/utils.py:20-34), so salted
traffic gives each salt a series born at its final value, which rate() never counts, and its unsalted request counters
count a failed store as completed (store_controller.py:755-795); the per-task failure line is the one unsalted signal.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from pathlib import Path

from glm53.chunks import required_alignment
from glm53.exporter.names import LMCACHE, is_lmcache
from glm53.probe.judge import GeometryFact, NegotiatedFact, StartupFacts, Status, evaluate
from glm53.probe.logparse import CONNECTOR_EVENTS, ConnectorEvent, Record, ResolvedGeometry, RunStarted, parse_line
from glm53.probe.logtail import LogFollower
from glm53.profiles import ModelProfile

# The probe's statuses as label values: ready, not_yet, wrong.
VERDICT_STATUSES = tuple(status.name.lower() for status in Status)
UNKNOWN_KIND = "unknown"

# Each scrape reads at most this much per call, looping to EOF: a 1 GiB backlog is parsed in bounded slices instead of
# as one list of ten million strings.
READ_SLICE_BYTES = 32 * 1024 * 1024

_VLLM_STAMP = re.compile(r"\b(?:DEBUG|INFO|WARNING|ERROR|CRITICAL) (\d\d)-(\d\d) (\d\d):(\d\d):(\d\d)\b")
_LMCACHE_STAMP = re.compile(r"\[\d{4}-(\d\d)-(\d\d) (\d\d):(\d\d):(\d\d),\d{3}\] LMCache ")
_API_SERVER_TAG = "(APIServer pid="
# vLLM stamps carry no year; a leap year accepts 02-29.
_STAMP_YEAR = 2000
# lmcache 0.5.6 lmcache/v1/distributed/storage_controllers/store_controller.py:791-796 logs one WARNING per failed store
# task: "Store task %d to adapter %d failed for keys: %s". The substring test keeps the common line cheap.
_STORE_FAILED_MARK = " failed for keys: "
_STORE_FAILED = re.compile(r"\bStore task \d+ to adapter \d+ failed for keys: ")


def lmcache_server_of(path: Path) -> str | None:
    """The `lmcache_server` label of an LMCache server's log (the chart names each log after its container:
    `lmcache.log` for the pod's one server, "" since its series carry no such label; `lmcache-<i>.log` with one server
    per rank, "<i>"), or None for any other log."""
    stem = path.stem
    if not is_lmcache(stem):
        return None
    return stem.removeprefix(LMCACHE).removeprefix("-")


def is_store_failure(line: str) -> bool:
    """Whether the line is LMCache's warning that one L2 store task failed."""
    return _STORE_FAILED_MARK in line and _STORE_FAILED.search(line) is not None


def vllm_timestamp(line: str) -> datetime | None:
    """The `MM-DD HH:MM:SS` stamp of a vLLM- or LMCache-formatted line (in a fixed leap year), or None without one."""
    match = _VLLM_STAMP.search(line, 0, 120) or _LMCACHE_STAMP.search(line, 0, 80)
    if match is None:
        return None
    month, day, hour, minute, second = (int(g) for g in match.groups())
    try:
        return datetime(_STAMP_YEAR, month, day, hour, minute, second)
    except ValueError:
        return None


def seconds_between(start: datetime, end: datetime) -> float:
    """end - start in seconds, across a New Year the stamps cannot show (12-31 23:59:59 -> 01-01 00:00:01)."""
    if end < start:  # the end is in the following (non-leap) year, where Feb 29 becomes Mar 1
        leap_day = (end.month, end.day) == (2, 29)
        end = end + timedelta(days=366) if leap_day else end.replace(year=end.year + 1)
    return (end - start).total_seconds()


@dataclass
class RunClock:
    """Per log file: when the current vLLM run logged its first stamped line and when it logged its geometry."""

    api_server_tag: str | None = None
    started: datetime | None = None
    geometry_at: datetime | None = None

    def observe(self, line: str, record: Record | None) -> None:
        # Called for every line of a possibly huge log: the common case (same API server, start known, no record)
        # costs three substring checks.
        tag = self.api_server_tag
        if not (tag and line.startswith(tag)) and line.startswith(_API_SERVER_TAG):
            if tag is not None:
                self._new_run(line)
            self.api_server_tag = line[: line.find(")") + 1]
        elif isinstance(record, RunStarted):  # in a container the restarted server often gets the same pid
            self._new_run(line)
        if self.started is None:
            self.started = vllm_timestamp(line)
        if record is not None and self.geometry_at is None and isinstance(record, ResolvedGeometry):
            self.geometry_at = vllm_timestamp(line)

    def _new_run(self, line: str) -> None:
        self.started = vllm_timestamp(line)
        self.geometry_at = None

    @property
    def geometry_after_start_seconds(self) -> float | None:
        if self.started is None or self.geometry_at is None:
            return None
        return seconds_between(self.started, self.geometry_at)


@dataclass
class LinkState:
    """After Ready: what the logs said about the engine's link to its sidecar, counted since the exporter began reading.

    Each connector adapter (the scheduler's, one per TP worker) logs its own heartbeat edges, so degraded mode is kept
    per process tag: the link is degraded while any adapter of the current vLLM run last said "unhealthy".
    """

    events: dict[str, int] = field(default_factory=lambda: dict.fromkeys(CONNECTOR_EVENTS, 0))
    unhealthy: set[str] = field(default_factory=set)

    def observe(self, record: Record) -> None:
        if isinstance(record, RunStarted):
            self.unhealthy.clear()  # a new vLLM run: its adapters start healthy
        elif isinstance(record, ConnectorEvent):
            self.events[record.event] += 1
            if record.event == "degraded":
                self.unhealthy.add(record.origin.label)
            elif record.event == "recovered":
                self.unhealthy.discard(record.origin.label)

    @property
    def degraded(self) -> bool:
        return bool(self.unhealthy)


@dataclass(frozen=True)
class LogFacts:
    """What the logs said so far, with the profile and configuration they are judged against."""

    profile: ModelProfile
    tensor_parallel_size: int
    chunk_size_flag: int | None
    attention_block_size: int | None
    negotiated: NegotiatedFact | None
    server_chunk_size: int | None
    geometry: GeometryFact | None
    geometry_after_start_seconds: float | None
    verdict_status: str
    bytes_read: tuple[tuple[str, int], ...] = ()
    # After Ready: the connector's link events so far (CONNECTOR_EVENTS' names) and whether it is degraded now.
    link_events: tuple[tuple[str, int], ...] = ()
    link_degraded: bool = False
    # Failed L2 store tasks each LMCache server logged so far, by its `lmcache_server` label ("" for the pod's one).
    l2_store_failures: tuple[tuple[str, int], ...] = ()

    @property
    def configured_chunk_size(self) -> int | None:
        """The minimum a negotiating server logged it started from, else the exporter's --chunk-size, else the size the
        server logged it started with; None while none is known."""
        if self.negotiated is not None:
            return self.negotiated.configured_min
        return self.chunk_size_flag if self.chunk_size_flag is not None else self.server_chunk_size

    @property
    def effective_chunk_size(self) -> int | None:
        """The negotiated size when the server logged one (it logs only a change), else the size the server logged it
        hashes with, else the configured size; None while none is known."""
        if self.negotiated is not None:
            return self.negotiated.resolved
        return self.server_chunk_size if self.server_chunk_size is not None else self.configured_chunk_size

    @property
    def required_alignment(self) -> int | None:
        if self.negotiated is not None:
            return self.negotiated.alignment
        if self.geometry is not None and any(self.geometry.groups):
            return required_alignment(self.geometry.groups)
        return None

    @property
    def unified_block_size(self) -> int | None:
        """The profile's measured N for this TP size; where none was measured, the N vLLM logged."""
        measured = self.profile.unified_block_size(self.tensor_parallel_size)
        return measured if measured is not None else self.attention_block_size

    @property
    def expected_groups(self) -> tuple[int, ...] | None:
        n = self.unified_block_size
        if n is None and self.profile.follows_unified_block_size:
            return None
        return self.profile.expected_groups(n)

    @property
    def geometry_matches(self) -> bool | None:
        """None until the geometry line appeared; then whether it lists the groups the profile expects."""
        if self.geometry is None:
            return None
        return self.geometry.groups == self.expected_groups

    @property
    def group_kinds(self) -> tuple[str, ...]:
        """The profile's kind for each resolved group; `unknown` for all when the group count differs."""
        if self.geometry is None:
            return ()
        groups = self.geometry.groups
        if len(groups) != len(self.profile.groups):
            return tuple(UNKNOWN_KIND for _ in groups)
        return tuple(g.kind for g in self.profile.groups)


class LogWatch:
    """Follows the given logs; each `poll()` reads what they gained and returns the facts accumulated so far."""

    def __init__(
        self, paths: Sequence[Path], profile: ModelProfile, tensor_parallel_size: int, chunk_size: int | None
    ) -> None:
        """`chunk_size` is the exporter's --chunk-size, None when none was given: the server's logged size then."""
        self._followers = [LogFollower(path) for path in paths]
        # One StartupFacts and one clock per file, as the probe keeps them: restarts are recognised per file.
        self._facts = [StartupFacts() for _ in paths]
        self._clocks = [RunClock() for _ in paths]
        self._link = LinkState()
        self._servers = [lmcache_server_of(path) for path in paths]
        self._store_failures = [0 for _ in paths]
        self._profile = profile
        self._tp = tensor_parallel_size
        self._chunk_size = chunk_size

    def poll(self) -> LogFacts:
        for index, (follower, facts, clock) in enumerate(zip(self._followers, self._facts, self._clocks, strict=True)):
            try:
                self._store_failures[index] += _consume(follower, facts, clock, self._link)
            except OSError:
                # The command refuses an unreadable log at start; one that turns unreadable later (replaced by a
                # directory, permissions changed) is skipped until it is readable again, so the scrape still answers.
                continue
        facts = StartupFacts.combined(self._facts)
        bytes_read = sum(f.total_bytes_read for f in self._followers)
        verdict = evaluate(self._profile, self._tp, self._chunk_size, facts, bytes_read)
        delays = [c.geometry_after_start_seconds for c in self._clocks if c.geometry_after_start_seconds is not None]
        block_sizes = set(facts.block_sizes.values())
        return LogFacts(
            profile=self._profile,
            tensor_parallel_size=self._tp,
            chunk_size_flag=self._chunk_size,
            # Ranks that disagree leave N unknown here; the verdict (wrong) says why.
            attention_block_size=block_sizes.pop() if len(block_sizes) == 1 else None,
            negotiated=facts.negotiated,
            server_chunk_size=facts.server_chunk_size,
            geometry=next(iter(facts.geometries.values()), None),
            geometry_after_start_seconds=delays[0] if delays else None,
            verdict_status=verdict.status.name.lower(),
            bytes_read=tuple((str(f.path), f.total_bytes_read) for f in self._followers),
            link_events=tuple(self._link.events.items()),
            link_degraded=self._link.degraded,
            # Every server's log is counted from the first scrape on, at 0 until it fails, so rate() sees the first one.
            l2_store_failures=tuple(
                (server, count)
                for server, count in zip(self._servers, self._store_failures, strict=True)
                if server is not None
            ),
        )


def _consume(follower: LogFollower, facts: StartupFacts, clock: RunClock, link: LinkState) -> int:
    """Parse everything the file gained, in bounded slices, into `facts`, `clock` and `link`; return the failed L2
    store tasks it logged."""
    store_failures = 0
    while True:
        before = follower.total_bytes_read
        for line in follower.read_new_lines(READ_SLICE_BYTES):
            store_failures += is_store_failure(line)
            record = parse_line(line)
            if record is not None:
                facts.add(record)
                link.observe(record)
            clock.observe(line, record)
        if follower.total_bytes_read - before < READ_SLICE_BYTES:  # a short slice: the end of the file was reached
            return store_failures
