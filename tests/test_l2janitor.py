"""The L2 janitor: which files a pass deletes (pure), a pass on disk, the thread, and the real `lmcache server`'s fs
tier kept under its bound by `glm53 supervise`, with what a lookup of a deleted chunk then finds."""

from __future__ import annotations

import os
import re
import threading
import time
from dataclasses import replace
from pathlib import Path

import pytest

from glm53.l2janitor import (
    STALE_TEMP_SECONDS,
    Bound,
    Entry,
    Janitor,
    Kind,
    Trim,
    classify,
    describe,
    select_deletions,
    trim,
)
from glm53.mock.connector import parse_connector_config
from glm53.mock.kv_client import KVClient, KVLayout
from glm53.testing.chart_sidecar import chart_sidecar
from tests.support.l2kit import SizeSampler, chunk_name, directory_bytes, supervised_fs_tier
from tests.support.mockproc import GLM53_MODEL, connector_json, http, poll

# A chunk file as the real adapter named it (the real-server test below, lmcache 0.5.6): GLM-5.3 on one rank
# (kv_rank 0x01000100: world size 1, rank 0, local world size 1), object group 0, salt "s".
REAL_NAME = "zai-org-SEP-GLM-5.3@0x01000100@0@1252bf7793b1898c3cae9c623e173a6cd40a7b2d19386a1814863abd882cbfcb@s.data"
NOW_NS = 10**18
SECOND_NS = 10**9


def chunk(name: str, size: int, mtime_s: int) -> Entry:
    return Entry(Path("/l2") / name, size, NOW_NS - 3600 * SECOND_NS + mtime_s * SECOND_NS, Kind.CHUNK)


def names(entries: tuple[Entry, ...]) -> list[str]:
    return [entry.path.name for entry in entries]


# ---------------------------------------------------------------------------------------------------------------
# Which files a pass deletes.


def test_within_the_bound_nothing_is_deleted() -> None:
    files = [chunk(f"c{i}", 100, i) for i in range(10)]
    assert select_deletions(files, 1000, NOW_NS) == ()


def test_over_the_bound_the_oldest_go_until_nine_tenths_of_it_remain() -> None:
    files = [chunk(f"c{i}", 100, i) for i in (5, 2, 9, 0, 7, 1, 3, 8, 6, 4)]  # listed in no order
    # 1000 bytes over a bound of 900: down to 810 or less, so two files go (800), the oldest ones.
    assert names(select_deletions(files, 900, NOW_NS)) == ["c0", "c1"]
    # 1000 over 999 (one byte too many): still down to 899, not just under the bound.
    assert names(select_deletions(files, 999, NOW_NS)) == ["c0", "c1"]


def test_ties_in_modification_time_go_in_path_order() -> None:
    files = [chunk("b", 100, 5), chunk("c", 100, 5), chunk("old", 100, 1), chunk("a", 100, 5)]
    assert names(select_deletions(files, 300, NOW_NS)) == ["old", "a"]


def test_a_temp_file_counts_but_is_not_deleted_while_it_may_be_written() -> None:
    writing = Entry(Path("/l2/x.tmp"), 500, NOW_NS - SECOND_NS, Kind.TEMP)
    files = [chunk(f"c{i}", 100, i) for i in range(5)]
    # 1000 bytes over 600: down to 540 takes all five chunk files, and the temp file stays (500 left).
    assert names(select_deletions([writing, *files], 600, NOW_NS)) == ["c0", "c1", "c2", "c3", "c4"]


def test_a_stale_temp_file_left_by_a_dead_server_goes_in_its_turn() -> None:
    left = Entry(Path("/l2/left.tmp"), 100, NOW_NS - 2 * 3600 * SECOND_NS, Kind.TEMP)
    files = [chunk("new", 100, 10), left, chunk("newer", 100, 20), chunk("oldest", 100, -3 * 3600)]
    # 400 bytes over 250: down to 225, two files, the oldest two whatever their kind.
    assert names(select_deletions(files, 250, NOW_NS)) == ["oldest", "left.tmp"]
    stale_ns = NOW_NS - int(STALE_TEMP_SECONDS * SECOND_NS)
    assert select_deletions([replace(left, mtime_ns=stale_ns + 1)], 50, NOW_NS) == ()
    assert names(select_deletions([replace(left, mtime_ns=stale_ns - 1)], 50, NOW_NS)) == ["left.tmp"]


def test_foreign_files_count_and_are_never_deleted() -> None:
    theirs = Entry(Path("/l2/notes.txt"), 900, 0, Kind.FOREIGN)
    files = [chunk("c0", 100, 0), chunk("c1", 100, 1)]
    assert names(select_deletions([theirs, *files], 800, NOW_NS)) == ["c0", "c1"]  # all it may, still over


@pytest.mark.parametrize(
    ("relative", "kind"),
    [
        (REAL_NAME, Kind.CHUNK),
        # The adapter's temp file beside it (fs_l2_adapter.py:531), or under relative_tmp_dir (:529).
        (str(Path(REAL_NAME).with_suffix(".tmp")), Kind.TEMP),
        (f"tmp/{REAL_NAME}", Kind.TEMP),
        (chunk_name(7), Kind.CHUNK),  # unsalted
        ("Qwen-SEP-Qwen2.5-0.5B@0x00000000@1f@00ff.data", Kind.CHUNK),  # dots in the model name
        ("x.data", Kind.FOREIGN),
        ("zai-org-SEP-GLM-5.3@0x01000100@0@1252bf.data.bak", Kind.FOREIGN),
        ("lost+found", Kind.FOREIGN),
    ],
)
def test_only_the_adapters_names_are_its_files(relative: str, kind: Kind) -> None:
    assert classify(Path(relative)) is kind


def test_the_line_says_what_went_and_what_is_left_of_the_bound() -> None:
    mib = 1024 * 1024
    line = describe(Bound(Path("/l2"), 1024 * mib), Trim(12, 48 * mib, int(870.1 * mib)))
    assert line == "l2 janitor: deleted 12 files (48.0 MiB), /l2 now 870 MiB of 1.00 GiB bound"
    assert describe(Bound(Path("/l2"), 2048), Trim(1, 1024, 1024)).startswith("l2 janitor: deleted 1 file (1.00 KiB)")


# ---------------------------------------------------------------------------------------------------------------
# A pass on disk, and the thread.


def write_chunks(directory: Path, count: int, size: int) -> None:
    """`count` chunk files, each one second older than the next."""
    directory.mkdir(parents=True, exist_ok=True)
    for index in range(count):
        path = directory / chunk_name(index)
        path.write_bytes(b"\0" * size)
        os.utime(path, ns=(NOW_NS + index * SECOND_NS, NOW_NS + index * SECOND_NS))


def test_a_pass_deletes_the_oldest_chunk_files_and_leaves_the_rest(tmp_path: Path) -> None:
    write_chunks(tmp_path, 10, 100)
    (tmp_path / "tmp").mkdir()
    (tmp_path / "tmp" / chunk_name(99)).write_bytes(b"\0" * 100)  # a temp file under relative_tmp_dir: counted
    # 1100 bytes over 1000: down to 900, the temp file's 100 included.
    assert trim(Bound(tmp_path, 1000)) == Trim(deleted=2, deleted_bytes=200, remaining_bytes=900)
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted([*(chunk_name(i) for i in range(2, 10)), "tmp"])


def test_a_pass_over_a_directory_not_made_yet_does_nothing(tmp_path: Path) -> None:
    assert trim(Bound(tmp_path / "l2", 1)) == Trim(0, 0, 0)


def test_a_failing_pass_is_reported_once_until_it_changes(tmp_path: Path) -> None:
    lines: list[str] = []
    where = tmp_path / "l2"
    where.write_text("a file where the directory should be")
    janitor = Janitor(Bound(where, 1), lines.append)
    janitor.run_pass()
    janitor.run_pass()
    assert lines == [f"l2 janitor: cannot keep {where} bounded: {where}: Not a directory"]
    where.unlink()
    janitor.run_pass()  # fine again: nothing to say
    where.write_text("again")
    janitor.run_pass()
    assert len(lines) == 2


def test_the_thread_trims_at_once_and_stops_when_told(tmp_path: Path) -> None:
    write_chunks(tmp_path, 10, 100)
    lines: list[str] = []
    with Janitor(Bound(tmp_path, 500), lines.append, interval_s=0.05):
        poll(lambda: bool(lines), "the janitor's first line")
    assert "l2-janitor" not in {thread.name for thread in threading.enumerate()}
    assert lines[0] == f"l2 janitor: deleted 6 files (600 B), {tmp_path} now 400 B of 500 B bound"
    assert directory_bytes(tmp_path) == 400


# ---------------------------------------------------------------------------------------------------------------
# The real server: LMCache 0.5.6's fs tier under `glm53 supervise --l2-dir D --l2-max-bytes N`.

PROFILE = "glm53"  # chunk size 256
CHUNK_TOKENS = 256
# The stand-in's worker registers one layer of 4 bytes per token (glm53.mock.kv_client), one rank: a file per chunk.
CHUNK_FILE_BYTES = CHUNK_TOKENS * 4
PROMPT_TOKENS = 4 * CHUNK_TOKENS
PROMPT_BYTES = 4 * CHUNK_FILE_BYTES
MAX_BYTES = 2 * PROMPT_BYTES
PROMPTS = 24
PAUSE_SECONDS = 0.1  # between stores: some 30 KiB a second, four times the bound between two passes
# A janitor pass comes every second; what was stored within this window may not have been seen by one yet.
WINDOW_SECONDS = 2.0
UVICORN_SHUTDOWN = "INFO:     Shutting down"  # uvicorn/server.py: the server stops accepting requests
LINE = re.compile(r"l2 janitor: deleted \d+ files? \(.+\), (?P<dir>\S+) now (?P<now>.+) of 8\.00 KiB bound")


def prompt(index: int) -> list[int]:
    return list(range(index * 10_000, index * 10_000 + PROMPT_TOKENS))


@pytest.mark.slow  # a real server and, in this process, LMCache's client with torch
def test_the_real_fs_tier_stays_bounded_and_a_deleted_chunk_is_a_miss(tmp_path: Path) -> None:
    """The stand-in's KV path stores prompts faster than the bound allows between two passes: the directory never
    holds more than the bound plus what was stored since the last pass, the oldest prompt's chunks go first, and a
    lookup of it then misses (no error, no load), while the newest prompt still loads from the directory."""
    pytest.importorskip("lmcache")
    segments = set(Path("/dev/shm").glob(f"lmcache_kv_{os.getpid()}_*"))
    with supervised_fs_tier(chart_sidecar(PROFILE, tmp_path), tmp_path, MAX_BYTES) as tier:
        kv = KVClient(parse_connector_config(connector_json(tier.server.port)), threading.Event())
        try:
            assert kv.chunk_size() == CHUNK_TOKENS
            kv.connect(KVLayout(GLM53_MODEL, 1, (64,), 64, PROMPT_TOKENS))
            stored: list[float] = []  # when each store began, on the sampler's clock
            with SizeSampler(tier.directory) as sampler:
                for index in range(PROMPTS):
                    stored.append(sampler.now())
                    kv.lookup(prompt(index), "s", False, f"store-{index}")
                    kv.store(prompt(index), "s", (0, PROMPT_TOKENS), f"store-{index}")
                    kv.end_session(f"store-{index}")
                    time.sleep(PAUSE_SECONDS)
            for at, size in sampler.samples:
                recent = sum(1 for began in stored if at - WINDOW_SECONDS < began <= at)
                assert size <= MAX_BYTES + recent * PROMPT_BYTES, f"{size} bytes at {at:.2f} s"

            poll(lambda: directory_bytes(tier.directory) <= MAX_BYTES, "the next pass", WINDOW_SECONDS * 5)
            files = list(tier.directory.iterdir())
            assert {classify(Path(f.name)) for f in files} == {Kind.CHUNK}
            assert {f.stat().st_size for f in files} == {CHUNK_FILE_BYTES}

            assert kv.lookup(prompt(0), "s", False, "first-again") == 0  # its files are gone: a miss
            kv.end_session("first-again")
            last = prompt(PROMPTS - 1)
            assert kv.lookup(last, "s", False, "last-again") == PROMPT_TOKENS  # from the directory (L1 kept nothing)
            assert kv.retrieve(last, "s", (0, PROMPT_TOKENS), 0, "last-again")
            kv.end_session("last-again")
            assert http(f"{tier.server.http_url}/healthcheck")[0] == 200
        finally:
            kv.close()
            for segment in set(Path("/dev/shm").glob(f"lmcache_kv_{os.getpid()}_*")) - segments:
                segment.unlink()  # LMCache leaves the workers' SHM segments behind (so does the real engine)
    log = tier.log.read_text()
    reports = [match for match in map(LINE.match, log.splitlines()) if match]
    assert len(reports) >= 2 and all(match["dir"] == str(tier.directory) for match in reports)
    # Up to the server's shutdown: a CI run on a loaded machine saw uvicorn log an ERROR while LMCache's HTTP lifespan
    # shut down (after "Waiting for application shutdown."), once every request here had been answered; how the server
    # stops is not what this test is about.
    serving_part = log.partition(UVICORN_SHUTDOWN)[0]
    assert UVICORN_SHUTDOWN in log
    assert not [line for line in serving_part.splitlines() if re.search(r"ERROR|Traceback|failed to load", line)]
