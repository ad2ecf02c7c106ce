"""Wait, after a prime, until the LMCache server has committed the prompt's chunks, so the reload cannot race the store.

Why a wait is needed at all: vLLM answers the priming request while its KV is still on the way into LMCache. The server
answers the connector's STORE before the chunks are readable: it queues `finish_write_by_owner` on its stream (lmcache
0.5.6 v1/multiprocess/modules/lmcache_driven_transfer.py:802-812; on CPU a 5 ms poller drains it,
v1/multiprocess/native_completion.py:62-67), and a lookup in between misses ("Staging objects are never readable",
v1/distributed/l1_manager.py:313-315). On a GPU the gap is a stream callback; on a loaded two-core machine it was long
enough for the reload to arrive inside it and find nothing, which failed a check that had nothing wrong with it.

The condition waited for is the server's own: `lmcache_mp_l1_write_chunks_total`, which the server counts per
`cache_salt` when the commit is done (v1/mp_observability/subscribers/metrics/l1.py: L1_WRITE_FINISHED), read from
the server's Prometheus page or from the pod exporter's, which passes LMCache's families through (several servers: one
group per `lmcache_server` label). Every server must have committed at least the prompt's whole chunks under the
prime's salt; with TP ranks sharing one server that is at least one rank's share.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

from prometheus_client.parser import text_string_to_metric_families

from glm53.errors import EXIT_USAGE, Glm53Error
from glm53.exporter.upstream import UpstreamError, fetch_text

COMMITTED_CHUNKS = "lmcache_mp_l1_write_chunks_total"
# The label the pod exporter gives each server's samples when a pod runs one LMCache server per rank.
SERVER_LABEL = "lmcache_server"
# A commit takes milliseconds (a few seconds on a loaded two-core machine); one that has not come by then was dropped
# (a degraded link, a dead sidecar), and the reload's miss that follows is the finding the checks report.
COMMIT_DEADLINE_S = 30.0
POLL_S = 0.1


@dataclass(frozen=True)
class CommitWatch:
    """The LMCache metrics page to read commits from, and how whole chunks are counted."""

    url: str
    chunk_size: int
    timeout: float

    def __post_init__(self) -> None:
        if not self.url.startswith(("http://", "https://")):
            raise Glm53Error(f"--lmcache-metrics must start with http:// or https://, got {self.url!r}", EXIT_USAGE)

    def committed(self, salt: str) -> list[float]:
        """Chunks committed under `salt`, one figure per server the page shows (a server without any: 0)."""
        return committed_per_server(self._page(), salt)

    def wait(self, salt: str, prompt_tokens: int) -> float | None:
        """Wait until every server committed the prompt's whole chunks under `salt`: the seconds it took, or None when
        the deadline passed."""
        chunks = prompt_tokens // self.chunk_size
        started = time.monotonic()
        while min(self.committed(salt)) < chunks:
            if time.monotonic() - started > COMMIT_DEADLINE_S:
                return None
            time.sleep(POLL_S)
        return time.monotonic() - started

    def _page(self) -> str:
        try:
            return fetch_text(self.url, self.timeout)
        except UpstreamError as error:
            raise Glm53Error(
                f"cannot read LMCache's metrics at {self.url} ({error.detail}); check --lmcache-metrics", EXIT_USAGE
            ) from None


def committed_per_server(exposition: str, salt: str) -> list[float]:
    """`COMMITTED_CHUNKS` under `salt`, summed per server. The servers are the `SERVER_LABEL` values any sample
    carries (the exporter of a pod with one server per rank), or the page's one server when none does."""
    servers: set[str] = set()
    committed: dict[str, float] = {}
    try:
        for family in text_string_to_metric_families(exposition):
            for sample in family.samples:
                server = sample.labels.get(SERVER_LABEL)
                if server is not None:
                    servers.add(server)
                if sample.name == COMMITTED_CHUNKS and sample.labels.get("cache_salt") == salt:
                    committed[server or ""] = committed.get(server or "", 0.0) + sample.value
    except ValueError as error:
        raise Glm53Error(f"LMCache's metrics page is not Prometheus text ({error}); check --lmcache-metrics") from None
    return [committed.get(server, 0.0) for server in sorted(servers or {""})]
