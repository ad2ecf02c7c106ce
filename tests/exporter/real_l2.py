"""The released `lmcache server` with an L2 tier, driven by LMCache's own CPU client: the generator of the five L2
`/metrics` pages the exporter and alert tests read (`fixtures/lmcache-l2-*.prom`).

The server is the chart's sidecar (`tests.support.real_lmcache.running_lmcache`'s command line and environment) with
its `--l2-adapter` replaced by the scenario's, or dropped: the flag is repeatable and each occurrence adds an adapter
(lmcache 0.5.6 lmcache/v1/distributed/l2_adapters/config.py:430-436), so it is swapped, not appended. Traffic is
`lmcache bench server --mode cpu` as in `real_lmcache.py`: one sequence is a cold request (lookup, store) and a warm one
(lookup, retrieve) of the seed's 8507 tokens at C = 1152, 7 chunks. Every chunk the server writes to L1 is also
stored to L2 (store_controller.py:600-700), and a lookup that misses L1 looks L2 up and loads what it finds
(prefetch_controller.py); the bench waits for that prefetch before it reads the lookup's result.

- `lmcache-l2-off.prom`, no L2 tier: one sequence. The adapter gauges say 0 and no L2 counter exists (an OTel counter
  appears with its first count).
- `lmcache-l2-fs.prom`, a healthy fs tier: a first server stores sequence 0 in a directory and stops; a second one on
  the same directory serves sequence 0 from L2 (its L1 is empty) and stores sequence 1.
- `lmcache-l2-fs-unreadable.prom`, an fs tier whose files cannot be read back: the directory's chunk files are cut to
  half their size and a third server serves sequence 0 again. The fs adapter's lookup only checks that the file
  exists and its load drops a short read (fs_l2_adapter.py:680-786), so every chunk the lookup promised fails to
  load (`reason="not_found"`, prefetch_controller.py:1483-1494); its store then skips the files that exist
  (fs_l2_adapter.py:614-616) and reports them stored.
- `lmcache-l2-resp-redis-killed.prom`, a shared tier whose Redis died: a server with a `resp` tier on a loopback
  redis-server with a password (`glm53.testing.redis_server`; the server reads the password from
  `LMCACHE_RESP_PASSWORD`, as the chart passes it) stores sequence 0, Redis is killed, and sequence 1 is sent. The
  failed store still counts a completed store request but no stored chunk (store_controller.py:755-795: the failure
  event carries no key_count_per_salt). The client does not reconnect: a Redis back on the same port gets no store
  from this server until it restarts (tried by hand, 45 s after Redis was back).
- `lmcache-l2-resp-unreachable-at-start.prom`, a shared tier whose Redis did not answer when the server started: the
  server starts, but each store to L2 stays in flight for good (`lmcache_mp_num_inflight_l2_stores`,
  store_controller.py:406-431, observed only for an adapter with a store in flight), no store ever completes (no
  completed counter at all), and each lookup's prefetch job stays active (`lmcache_mp_active_prefetch_jobs`): the
  bench gives up polling it after 50 polls of 50 ms (lmcache/cli/commands/bench/server_bench/helpers.py:321-341) and
  reads a miss. A Redis that comes up later changes nothing (tried by hand, 45 s after), and a Redis that refuses the
  password behaves the same (tried by hand; each client worker logs `AUTH failed: -WRONGPASS`). The chart's supervisor
  holds the server until Redis answers (`glm53.l2gate`); this is the server started anyway.

Re-generate after upgrading LMCache (see fixtures/README.md); about 80 s on 2 cores:

    .venv/bin/python -m tests.exporter.real_l2
"""

from __future__ import annotations

import json
import tempfile
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, replace
from pathlib import Path

from glm53.errors import Glm53Error
from glm53.exporter.upstream import Snapshot, parse_exposition
from glm53.testing.chart_sidecar import StandaloneSidecar, chart_sidecar
from glm53.testing.redis_server import redis_server
from glm53.testing.sidecar import serving
from tests.support.exporter_fakes import free_port
from tests.support.real_lmcache import (
    NO_BANNER,
    PROFILE,
    START_DEADLINE_SECONDS,
    http_get,
    send_one_request,
)

FIXTURES = Path(__file__).resolve().parent / "fixtures"
OFF_PAGE = FIXTURES / "lmcache-l2-off.prom"
FS_PAGE = FIXTURES / "lmcache-l2-fs.prom"
FS_UNREADABLE_PAGE = FIXTURES / "lmcache-l2-fs-unreadable.prom"
RESP_KILLED_PAGE = FIXTURES / "lmcache-l2-resp-redis-killed.prom"
RESP_UNREACHABLE_PAGE = FIXTURES / "lmcache-l2-resp-unreachable-at-start.prom"
PAGE_FILES = (OFF_PAGE, FS_PAGE, FS_UNREADABLE_PAGE, RESP_KILLED_PAGE, RESP_UNREACHABLE_PAGE)
# The L2 tier's own families (lmcache 0.5.6 lmcache/v1/mp_observability/subscribers/metrics/l2.py, l2_failures.py,
# l2_throughput.py; the gauges of store_controller.py:272-291, prefetch_controller.py:517-545 and
# storage_manager.py:274-284, among them the in-flight stores and loads).
L2_FAMILY_PREFIXES = ("lmcache_mp_l2_", "lmcache_mp_num_inflight_l2_", "lmcache_mp_inflight_load_memory_usage")
# OTel names as the server's Prometheus page shows them: `lmcache_mp.l2_store_submitted_objects` with unit `chunks`
# becomes `lmcache_mp_l2_store_submitted_objects_chunks_total` (l2.py:62-76; the reader appends the unit and
# `_total`).
STORES_SUBMITTED = "lmcache_mp_l2_store_submitted_requests_total"
STORES_COMPLETED = "lmcache_mp_l2_store_completed_requests_total"
STORES_IN_FLIGHT = "lmcache_mp_num_inflight_l2_stores"
LOADS_COMPLETED = "lmcache_mp_l2_prefetch_load_completed_chunks_total"
LOAD_FAILURES = "lmcache_mp_l2_prefetch_failure_chunks_total"
SETTLE_DEADLINE_SECONDS = 20.0
# The resp adapter reads the password from here when its JSON has none (lmcache 0.5.6 resp_l2_adapter.py:148-154).
RESP_PASSWORD_ENV = "LMCACHE_RESP_PASSWORD"


@dataclass(frozen=True)
class L2Pages:
    """The five captured pages."""

    off: str
    fs: str
    fs_unreadable: str
    resp_killed: str
    resp_unreachable: str

    @classmethod
    def read(cls) -> L2Pages:
        """The pages as captured into the fixture files."""
        return cls(*(path.read_text(encoding="utf-8") for path in PAGE_FILES))

    def files(self) -> dict[Path, str]:
        pages = (self.off, self.fs, self.fs_unreadable, self.resp_killed, self.resp_unreachable)
        return dict(zip(PAGE_FILES, pages, strict=True))


def with_l2_adapter(argv: Sequence[str], adapter: Mapping[str, object] | None) -> tuple[str, ...]:
    """The sidecar's command line with its `--l2-adapter` flags (if any) replaced by the one `adapter` (None: no L2
    tier)."""
    kept: list[str] = []
    skip = False
    for arg in argv:
        if skip:
            skip = False
        elif arg == "--l2-adapter":
            skip = True
        elif not arg.startswith("--l2-adapter="):
            kept.append(arg)
    return tuple(kept) if adapter is None else (*kept, "--l2-adapter", json.dumps(adapter, sort_keys=True))


@contextmanager
def running_with_l2(
    workdir: Path, adapter: Mapping[str, object] | None, name: str, env: Mapping[str, str] | None = None
) -> Iterator[StandaloneSidecar]:
    """The chart's `lmcache server` on free loopback ports with `adapter` as its one L2 tier (None: none) and `env`
    added to its environment; stopped on exit."""
    sidecar = chart_sidecar(PROFILE, workdir)
    sidecar = replace(sidecar, argv=with_l2_adapter(sidecar.argv, adapter), env={**sidecar.env, **(env or {})})
    log = workdir / f"lmcache-{name}.log"
    with serving(sidecar.argv, {**sidecar.env, **NO_BANNER}, sidecar.http_port, log, START_DEADLINE_SECONDS):
        yield sidecar


def stores_settled(page: Snapshot) -> bool:
    """Every L2 store the server submitted has completed, successfully or not."""
    submitted = page.total(STORES_SUBMITTED)
    return submitted is not None and page.total(STORES_COMPLETED) == submitted


def settled_page(server: StandaloneSidecar, done: Callable[[Snapshot], bool]) -> str:
    """The `/metrics` page once `done` holds and the event bus is drained: L2 stores complete on the adapter's own
    thread after the bench returns, and a subscriber thread turns their events into metrics (lmcache 0.5.6
    lmcache/v1/mp_observability/event_bus.py)."""
    deadline = time.monotonic() + SETTLE_DEADLINE_SECONDS
    while True:
        text = http_get(f"{server.http_url}/metrics")
        page = parse_exposition(text)
        if done(page) and page.total("lmcache_mp_event_bus_queue_depth") == 0:
            return text
        if time.monotonic() > deadline:
            raise Glm53Error(
                f"the server's L2 counters did not settle within {SETTLE_DEADLINE_SECONDS:g} s; see its log"
            )
        time.sleep(0.3)


def truncate_chunk_files(directory: Path) -> int:
    """Cut every chunk file of an fs tier to half its size; returns how many there were."""
    files = sorted(directory.rglob("*.data"))
    for path in files:
        with path.open("r+b") as chunk:
            chunk.truncate(path.stat().st_size // 2)
    return len(files)


def capture_fs(workdir: Path) -> tuple[str, str]:
    """A healthy fs tier's page after a restart, and the page of a server whose chunk files cannot be read back."""
    # Not a volume name of the pod: relocating the chart's sidecar empties a directory per emptyDir under `workdir`.
    tier = workdir / "fs-tier-of-this-capture"
    adapter: dict[str, object] = {"type": "fs", "base_path": str(tier)}
    with running_with_l2(workdir, adapter, "fs-first") as server:
        send_one_request(server, 0)
        settled_page(server, stores_settled)
    with running_with_l2(workdir, adapter, "fs-restarted") as server:
        send_one_request(server, 0)
        send_one_request(server, 1)
        healthy = settled_page(server, lambda page: stores_settled(page) and bool(page.total(LOADS_COMPLETED)))
    if truncate_chunk_files(tier) == 0:
        raise Glm53Error(f"the fs tier in {tier} holds no chunk files after two servers stored into it")
    with running_with_l2(workdir, adapter, "fs-unreadable") as server:
        send_one_request(server, 0)
        unreadable = settled_page(server, lambda page: stores_settled(page) and bool(page.total(LOAD_FAILURES)))
    return healthy, unreadable


def capture_off(workdir: Path) -> str:
    """The page of a server without an L2 tier after one sequence."""
    with running_with_l2(workdir, None, "off") as server:
        send_one_request(server, 0)
        return settled_page(server, lambda page: page.total("lmcache_mp_lookup_hit_tokens_total") == 8064)


def capture_resp_killed(workdir: Path) -> str:
    """The page of a server whose Redis tier was killed after one healthy sequence, after one more sequence."""
    with redis_server(workdir / "redis") as redis:
        adapter = {"type": "resp", "host": "127.0.0.1", "port": redis.port}
        with running_with_l2(workdir, adapter, "resp", {RESP_PASSWORD_ENV: redis.password}) as server:
            send_one_request(server, 0)
            settled_page(server, stores_settled)
            redis.kill()
            send_one_request(server, 1)
            return settled_page(server, lambda page: stores_settled(page) and page.total(STORES_SUBMITTED) == 2)


def capture_resp_unreachable(workdir: Path) -> str:
    """The page of a server whose Redis tier never answered, after one sequence: its one L2 store still in flight."""
    with running_with_l2(workdir, {"type": "resp", "host": "127.0.0.1", "port": free_port()}, "resp-none") as server:
        send_one_request(server, 0)
        return settled_page(
            server, lambda page: page.total(STORES_SUBMITTED) == 1 and page.total(STORES_IN_FLIGHT) == 1
        )


def capture() -> L2Pages:
    with tempfile.TemporaryDirectory() as workdir:
        scenarios = [Path(workdir) / name for name in ("off", "fs", "resp-killed", "resp-unreachable")]
        for scenario in scenarios:
            scenario.mkdir()
        off = capture_off(scenarios[0])
        healthy, unreadable = capture_fs(scenarios[1])
        killed = capture_resp_killed(scenarios[2])
        unreachable = capture_resp_unreachable(scenarios[3])
    return L2Pages(off=off, fs=healthy, fs_unreadable=unreadable, resp_killed=killed, resp_unreachable=unreachable)


def main() -> int:
    for path, page in capture().files().items():
        path.write_text(page, encoding="utf-8")
        print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
