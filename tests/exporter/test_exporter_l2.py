"""LMCache's L2 tier through the exporter: its families pass through unchanged, and the captured pages show what the
alert reads (`Glm53LMCacheL2Failing`), on the real server's own numbers (`fixtures/lmcache-l2-*.prom`, `real_l2.py`).

The exporter adds one thing for the tier: LMCache's chunk counters are split by `cache_salt`, so under salted traffic
rate() never sees them grow, and its request counters count a failed store as completed; the failed store tasks each
server logs (`glm53_lmcache_l2_store_failures_total`) are the unsalted signal the alert sets against submitted stores.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from glm53.exporter.facts import is_store_failure
from glm53.exporter.upstream import Snapshot, parse_exposition
from tests.exporter.real_l2 import (
    FS_PAGE,
    FS_UNREADABLE_PAGE,
    L2_FAMILY_PREFIXES,
    OFF_PAGE,
    PAGE_FILES,
    RESP_KILLED_PAGE,
    RESP_UNREACHABLE_PAGE,
    L2Pages,
    capture,
)
from tests.support.exporter_fakes import LMCACHE_URL, VLLM_PAGE, VLLM_URL, copy_logs, wired

# One chunk of the bench's KV cache: 1152 tokens of 2 layers of one 64-wide float16 head (real_lmcache.KV_SHAPE).
CHUNK_BYTES = 1152 * 2 * 64 * 2
CHUNKS_PER_SEQUENCE = 7  # floor(8507 / 1152)

# Two consecutive lines of the real `lmcache server`'s log (lmcache 0.5.6, Redis killed under salted load:
# real_l2.py's scenario in the CPU pod): a store that reached L1, then one L2 store task that failed.
STORED_LINE = (
    "\x1b[32;20m[2026-12-04 23:08:26,646] LMCache INFO:\x1b[0m Stored 3456 tokens in 0.003 "
    "seconds \x1b[3m(lmcache_driven_transfer.py:834:lmcache.v1.multiprocess.modules.lmca"
    "che_driven_transfer)\x1b[0m"
)
STORE_FAILED_LINE = (
    "\x1b[33;20m[2026-12-04 23:08:26,648] LMCache WARNING:\x1b[0m Store task 650 to adapter"
    " 0 failed for keys: [ObjectKey(chunk_hash=b'.\\xe9\\xd7\\x96\\xd9\\xbf=![\\xa6|\\x15\\x0"
    "3M\\xfa+\\xdcD\\xc1\\x08{\\\\\\xd3:r\\xa9\\xb0\\xd2$\\xb6\\xea\\x1c', model_name='zai-org/GLM"
    "-5.3-Flash', kv_rank=67109888, object_group_id=0, cache_salt='fault-7f5203ae-1-5"
    "4'), ObjectKey(chunk_hash=b'\\x86\\xa8\\x84\\xa9\\xe0\\x9f\\x1c`|R\\x0f~\\xd9\\xef\\xdaA\\xf"
    "0\\xf2vs\\x02\\x1c\\xc0R\\xd8\\x1f\\xf1_\\xea\\xa8\\xf8\\x19', model_name='zai-org/GLM-5.3-"
    "Flash', kv_rank=67109888, object_group_id=0, cache_salt='fault-7f5203ae-1-54'), "
    "ObjectKey(chunk_hash=b'\\x9f!Fc?p\\xa6\\xca\\xea\\xaen\\x81\\xd9\\xc0V\\x07\\xea\\x92\\x8b\\x"
    "8f\\xe9&)H\\xc5\\x87}\\xe5\\x97\\x8b\\x047', model_name='zai-org/GLM-5.3-Flash', kv_ran"
    "k=67109888, object_group_id=0, cache_salt='fault-7f5203ae-1-54')] \x1b[3m(store_con"
    "troller.py:791:lmcache.v1.distributed.storage_controllers.store_controller)\x1b[0m"
)


def _page(path: Path) -> Snapshot:
    return parse_exposition(path.read_text(encoding="utf-8"))


def _l2_families(page: str) -> set[tuple[str, str]]:
    return {(f.name, f.type) for f in parse_exposition(page).families if f.name.startswith(L2_FAMILY_PREFIXES)}


@pytest.mark.parametrize("path", PAGE_FILES, ids=lambda path: path.stem)
def test_the_l2_families_pass_through_unchanged(path: Path, tmp_path: Path) -> None:
    page = _page(path)
    l2 = [sample for f in page.families if f.name.startswith(L2_FAMILY_PREFIXES) for sample in f.samples]
    assert l2, f"{path.name} has no L2 family"
    pages = {VLLM_URL: VLLM_PAGE, LMCACHE_URL: path.read_text(encoding="utf-8")}
    with wired(list(copy_logs(tmp_path)), pages) as (registry, _):
        for sample in l2:
            assert registry.get_sample_value(sample.name, sample.labels) == sample.value, sample


def test_without_an_l2_tier_no_adapter_is_attached_and_no_l2_counter_exists() -> None:
    """What the alert's silence on such a pod rests on: its L2 series are the adapter gauges at 0 (lmcache 0.5.6
    store_controller.py:282-291, prefetch_controller.py:537-545)."""
    page = _page(OFF_PAGE)
    assert _l2_families(OFF_PAGE.read_text(encoding="utf-8")) == {
        ("lmcache_mp_l2_store_adapters", "gauge"),
        ("lmcache_mp_l2_prefetch_adapters", "gauge"),
    }
    assert page.total("lmcache_mp_l2_store_adapters") == 0
    assert page.total("lmcache_mp_l2_prefetch_adapters") == 0


def test_a_healthy_fs_tier_stores_and_loads_every_chunk() -> None:
    """After a restart on the same directory the server loaded the first server's chunks (both lookups of the first
    prompt, 2 x 7 chunks) and stored the second prompt's 7."""
    page = _page(FS_PAGE)
    assert page.total("lmcache_mp_l2_store_submitted_objects_chunks_total") == CHUNKS_PER_SEQUENCE
    assert page.total("lmcache_mp_l2_store_completed_objects_chunks_total") == CHUNKS_PER_SEQUENCE
    assert page.total("lmcache_mp_l2_prefetch_load_submitted_objects_chunks_total") == 2 * CHUNKS_PER_SEQUENCE
    assert page.total("lmcache_mp_l2_prefetch_load_completed_chunks_total") == 2 * CHUNKS_PER_SEQUENCE
    assert page.total("lmcache_mp_l2_store_adapters") == 1  # state="active" 1, "draining" 0
    # The usage gauge is the process's own byte accounting (lmcache 0.5.6 l2_adapters/base.py:383-401, 436-472): the
    # restarted server counts the 7 chunks it wrote, not the 14 files in the directory (nor, in the pod, what the
    # supervisor's janitor deleted behind its back).
    assert page.total("lmcache_mp_l2_usage_bytes") == CHUNKS_PER_SEQUENCE * CHUNK_BYTES


def test_a_failed_store_counts_a_completed_request_but_no_chunk() -> None:
    """Redis killed after the first prompt: both stores completed as requests, only the first one's chunks were
    stored (store_controller.py:755-795). Lookups against the dead Redis are plain misses: no failure counter."""
    page = _page(RESP_KILLED_PAGE)
    assert page.total("lmcache_mp_l2_store_submitted_requests_total") == 2
    assert page.total("lmcache_mp_l2_store_completed_requests_total") == 2
    assert page.total("lmcache_mp_l2_store_submitted_objects_chunks_total") == 2 * CHUNKS_PER_SEQUENCE
    assert page.total("lmcache_mp_l2_store_completed_objects_chunks_total") == CHUNKS_PER_SEQUENCE
    assert page.total("lmcache_mp_l2_prefetch_failure_chunks_total") is None


def test_a_redis_that_never_answered_keeps_the_store_in_flight() -> None:
    """No store ever completes, so neither completed counter exists; the store and both lookups' prefetch jobs stay."""
    page = _page(RESP_UNREACHABLE_PAGE)
    assert page.total("lmcache_mp_l2_store_submitted_objects_chunks_total") == CHUNKS_PER_SEQUENCE
    assert page.total("lmcache_mp_l2_store_completed_requests_total") is None
    assert page.total("lmcache_mp_l2_store_completed_objects_chunks_total") is None
    assert page.total("lmcache_mp_num_inflight_l2_stores") == 1
    assert page.total("lmcache_mp_active_prefetch_jobs") == 2


def test_unreadable_chunk_files_fail_every_load_and_still_count_as_stored() -> None:
    """Every chunk the lookup found fails to load (not_found) and no chunk-loaded series appears; the load task still
    counts as completed, and the store of the recomputed prompt skips the existing (cut) files as stored."""
    page = _page(FS_UNREADABLE_PAGE)
    failures = [s for f in page.families for s in f.samples if s.name == "lmcache_mp_l2_prefetch_failure_chunks_total"]
    assert [(s.labels["reason"], s.value) for s in failures] == [("not_found", CHUNKS_PER_SEQUENCE)]
    assert page.total("lmcache_mp_l2_prefetch_load_submitted_objects_chunks_total") == CHUNKS_PER_SEQUENCE
    assert page.total("lmcache_mp_l2_prefetch_load_completed_chunks_total") is None
    assert page.total("lmcache_mp_l2_load_completed_requests_total") == 1
    assert page.total("lmcache_mp_l2_store_completed_objects_chunks_total") == CHUNKS_PER_SEQUENCE


def test_only_the_failed_store_task_line_counts_as_a_store_failure() -> None:
    assert is_store_failure(STORE_FAILED_LINE)
    assert not is_store_failure(STORED_LINE)


def test_failed_store_tasks_are_counted_per_server_log_from_zero(tmp_path: Path) -> None:
    """The pod's one server's counter carries no lmcache_server (as its pass-through series); it is exposed at 0
    before any failure, so rate() counts the first, and counts each failed task line the log gains."""
    vllm, lmcache = copy_logs(tmp_path)
    with wired([vllm, lmcache]) as (registry, _):
        assert registry.get_sample_value("glm53_lmcache_l2_store_failures_total", {}) == 0
        with lmcache.open("a", encoding="utf-8") as log:
            log.write(f"{STORED_LINE}\n{STORE_FAILED_LINE}\n{STORE_FAILED_LINE}\n")
        assert registry.get_sample_value("glm53_lmcache_l2_store_failures_total", {}) == 2
        assert registry.get_sample_value("glm53_lmcache_l2_store_failures_total", {}) == 2  # each line once


def test_per_rank_servers_logs_count_under_their_index(tmp_path: Path) -> None:
    vllm, lmcache = copy_logs(tmp_path)
    rank0, rank1 = lmcache.rename(tmp_path / "lmcache-0.log"), tmp_path / "lmcache-1.log"
    rank1.write_text(STORE_FAILED_LINE + "\n", encoding="utf-8")
    with wired([vllm, rank0, rank1]) as (registry, _):
        assert registry.get_sample_value("glm53_lmcache_l2_store_failures_total", {"lmcache_server": "0"}) == 0
        assert registry.get_sample_value("glm53_lmcache_l2_store_failures_total", {"lmcache_server": "1"}) == 1
        assert registry.get_sample_value("glm53_lmcache_l2_store_failures_total", {}) is None


@pytest.mark.slow
def test_the_fixtures_have_the_real_servers_l2_families() -> None:
    """The released `lmcache server` still exposes exactly the L2 families of each `fixtures/lmcache-l2-*.prom` in
    the same scenario; if not, regenerate them (fixtures/README.md). About 80 s on 2 cores (six server starts)."""
    captured = capture().files()
    for path, page in L2Pages.read().files().items():
        assert _l2_families(captured[path]) == _l2_families(page), path.name
