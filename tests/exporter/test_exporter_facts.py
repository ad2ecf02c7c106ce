"""The exporter's log side: incremental reading, restarts appended to the same file, rotation, log timestamps."""

from __future__ import annotations

from datetime import datetime
from pathlib import Path

from glm53.exporter.facts import LogWatch, seconds_between, vllm_timestamp
from glm53.profiles import get_profile
from tests.support.exporter_fakes import MODEL, copy_logs, geometry_lines

FLASH_GROUPS = [1152, 1152, 1152, 1152, 1152, 0]


def _watch(*paths: Path, chunk: int = 1152) -> LogWatch:
    return LogWatch(list(paths), get_profile("glm53-flash"), 4, chunk)


def _restart_lines(pid: int, start: str, geometry_at: str) -> str:
    """A second vLLM run as `glm53 supervise` appends it: vLLM's start banner, then LMCache's geometry line from the
    scheduler and all four TP workers."""
    banner = (
        f"(APIServer pid={pid}) INFO 11-29 {start} [startup.py:27] vLLM server version 0.33.0, serving model {MODEL}"
    )
    at = datetime.fromisoformat(f"2026-11-29 {geometry_at}")
    return banner + "\n" + geometry_lines(FLASH_GROUPS, 1152, at, count=5)


def test_each_poll_reads_only_the_bytes_appended_since_the_last(tmp_path: Path) -> None:
    vllm, lmcache = copy_logs(tmp_path)
    watch = _watch(vllm, lmcache)
    first = dict(watch.poll().bytes_read)
    assert first == {str(vllm): vllm.stat().st_size, str(lmcache): lmcache.stat().st_size}
    assert dict(watch.poll().bytes_read) == first  # nothing new: nothing read
    extra = "(APIServer pid=1) INFO 11-29 07:05:00 [loggers.py:1] Engine 000: Avg prompt throughput: 8507 tokens/s\n"
    with vllm.open("a") as handle:
        handle.write(extra)
    assert dict(watch.poll().bytes_read)[str(vllm)] == first[str(vllm)] + len(extra)


def test_a_restart_appended_to_the_log_restarts_the_clock(tmp_path: Path) -> None:
    vllm, _ = copy_logs(tmp_path)
    watch = _watch(vllm)
    assert watch.poll().geometry_after_start_seconds is not None
    with vllm.open("a") as handle:
        handle.write(_restart_lines(pid=7, start="08:00:00", geometry_at="08:00:45"))
    facts = watch.poll()
    assert facts.geometry_after_start_seconds == 45
    assert facts.verdict_status == "ready"


def test_a_restart_with_the_same_pid_is_recognised_by_the_start_banner(tmp_path: Path) -> None:
    vllm, _ = copy_logs(tmp_path)
    watch = _watch(vllm)
    assert watch.poll().geometry_after_start_seconds is not None
    with vllm.open("a") as handle:  # in a container the restarted API server often gets the same pid again
        handle.write(_restart_lines(pid=1, start="08:00:00", geometry_at="08:00:30"))
    assert watch.poll().geometry_after_start_seconds == 30


def test_rotation_keeps_the_facts_and_reads_the_new_file(tmp_path: Path) -> None:
    vllm, _ = copy_logs(tmp_path)
    watch = _watch(vllm)
    size = vllm.stat().st_size
    assert watch.poll().verdict_status == "ready"
    vllm.rename(tmp_path / "vllm.log.1")
    vllm.write_text(_restart_lines(pid=8, start="09:00:00", geometry_at="09:01:00"))
    facts = watch.poll()
    assert facts.geometry_after_start_seconds == 60
    assert dict(facts.bytes_read)[str(vllm)] == size + vllm.stat().st_size
    assert facts.geometry is not None and facts.geometry.groups == (1152, 1152, 1152, 1152, 1152, 0)


def test_vllm_and_lmcache_timestamps() -> None:
    assert vllm_timestamp("(APIServer pid=1) INFO 11-29 07:00:01 [config.py:228] x") == datetime(2000, 11, 29, 7, 0, 1)
    leap_day = "(Worker_TP0 pid=1) WARNING 02-29 23:59:59 [a.py:1] leap day"
    assert vllm_timestamp(leap_day) == datetime(2000, 2, 29, 23, 59, 59)
    lmcache = geometry_lines(FLASH_GROUPS, 1152, datetime(2026, 11, 29, 7, 0, 1), count=1)
    assert vllm_timestamp(lmcache) == datetime(2000, 11, 29, 7, 0, 1)  # the year dropped, as vLLM's stamps have none
    assert vllm_timestamp("(APIServer pid=1) INFO 13-40 07:00:01 [x.py:1] impossible date") is None
    assert vllm_timestamp("Traceback (most recent call last):") is None


def test_seconds_between_spans_new_year() -> None:
    assert seconds_between(datetime(2000, 12, 31, 23, 59, 58), datetime(2000, 1, 1, 0, 0, 3)) == 5
