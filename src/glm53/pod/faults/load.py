"""The load a fault plays out under: concurrent clients storing new documents and reloading older ones.

Each client loops: send a new document with its own `cache_salt` (a cold prefill, which LMCache stores), then send
again the document it sent `lag` rounds before. By then vLLM's own prefix cache has usually evicted that one (the
fault pod runs with a small local KV cache), so the reload retrieves from LMCache while other requests run: a sidecar
fault then meets stores, lookups and retrieves in flight, as it would in production.

What LMCache held for a reloaded document is read from the server itself: 0.5.6 looks the whole prompt up whatever
vLLM holds locally (lmcache 0.5.6 lmcache/integration/vllm/lmcache_mp_connector.py:1295-1301) and labels its lookup
counters by `cache_salt` (lmcache/v1/mp_observability/subscribers/metrics/lookup.py:39-52), so the reload's salt's
`lmcache_mp_lookup_hit_tokens_total` is exactly what the server found for it (the cold send's lookup found nothing).
"""

from __future__ import annotations

import threading
import time
import uuid
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, replace

from glm53.chunks import served_tokens
from glm53.errors import Glm53Error
from glm53.exporter.upstream import UpstreamError, scrape
from glm53.validate.client import HttpStatusError, VllmClient
from glm53.validate.prompts import document_qa_prompt

HIT_METRIC = "lmcache_mp_lookup_hit_tokens_total"
# The lookup counters are updated on the server's observability thread; a reload's hits may show a moment later.
HIT_SETTLE_S = 1.0


@dataclass(frozen=True)
class LoadShape:
    """How the load looks: clients at once, document length in tokens, how far back a reload reaches, answer length."""

    clients: int = 2
    document_tokens: int = 1024
    lag: int = 2
    max_tokens: int = 4


@dataclass(frozen=True)
class Outcome:
    """One request as its client saw it; seconds are since the load began."""

    client: int
    kind: str  # "store" (a new document), "reload" (one sent `lag` rounds before), "revisit" (sent before a fault)
    started_s: float
    seconds: float
    result: str  # "ok", "hung", or "failed: <why>"
    # For a reload: when its document was first sent, what LMCache found for it, and the most it could find.
    stored_at_s: float | None = None
    hit_tokens: int | None = None
    expected_tokens: int = 0

    @property
    def failed(self) -> bool:
        return self.result.startswith("failed")

    @property
    def hung(self) -> bool:
        return self.result == "hung"


@dataclass(frozen=True)
class StoredDocument:
    """A document a client sent new (a cold prefill LMCache stored), kept so it can be sent again after a fault."""

    prompt: str
    salt: str
    stored_at_s: float


class Load:
    """The clients, started and stopped together; `pause` holds them (an idle engine) until `resume`."""

    def __init__(
        self,
        engine_url: str,
        lmcache_url: str,
        model: str,
        shape: LoadShape,
        chunk_size: int,
        strict_prefix: bool,
        hang_s: float,
    ) -> None:
        self.engine_url = engine_url
        self.lmcache_url = lmcache_url.rstrip("/")
        self.model = model
        self.shape = shape
        self.expected = served_tokens(shape.document_tokens, chunk_size, strict_prefix)
        self.hang_s = hang_s
        self.outcomes: list[Outcome] = []
        self.stored: list[StoredDocument] = []
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._running = threading.Event()
        self._run = uuid.uuid4().hex[:8]
        self._began = time.monotonic()
        self._threads = [
            threading.Thread(target=self._client, args=(index,), name=f"load-{index}", daemon=True)
            for index in range(shape.clients)
        ]

    def now(self) -> float:
        return time.monotonic() - self._began

    def start(self, paused: bool = False) -> None:
        """Start the clients; `paused`: they wait for `resume` before their first request."""
        if not paused:
            self._running.set()
        for thread in self._threads:
            thread.start()

    def pause(self) -> None:
        self._running.clear()

    def resume(self) -> None:
        self._running.set()

    def snapshot(self) -> list[Outcome]:
        with self._lock:
            return list(self.outcomes)

    def stored_documents(self) -> list[StoredDocument]:
        with self._lock:
            return list(self.stored)

    def stop(self) -> list[Outcome]:
        self._stop.set()
        self._running.set()
        for thread in self._threads:
            thread.join(self.hang_s + 30)
        with self._lock:
            return list(self.outcomes)

    def _client(self, index: int) -> None:
        client = VllmClient(self.engine_url, timeout=self.hang_s)
        sent: deque[tuple[str, str, float]] = deque()
        round_ = 0
        while not self._stop.is_set():
            self._running.wait()
            if self._stop.is_set():
                return
            prompt = document_qa_prompt(self.shape.document_tokens, seed=index * 1_000_003 + round_).text
            salt = f"fault-{self._run}-{index}-{round_}"
            stored_at = self.now()
            outcome = self._send(client, index, "store", prompt, salt)
            self._record(outcome)
            if outcome.result == "ok":
                with self._lock:
                    self.stored.append(StoredDocument(prompt, salt, stored_at))
            sent.append((prompt, salt, stored_at))
            round_ += 1
            if len(sent) > self.shape.lag:
                old_prompt, old_salt, old_stored_at = sent.popleft()
                outcome = self._send(client, index, "reload", old_prompt, old_salt)
                hits = self._lmcache_hits(old_salt) if outcome.result == "ok" else None
                expected = self.expected
                self._record(replace(outcome, stored_at_s=old_stored_at, hit_tokens=hits, expected_tokens=expected))

    def revisit(self, documents: Sequence[StoredDocument]) -> list[Outcome]:
        """Send `documents` again, one after the other beside the running clients, each as a `revisit` outcome with
        what LMCache found for it this time: the lookup counter's growth for its salt (it starts again from nothing in
        a restarted server's process)."""
        client = VllmClient(self.engine_url, timeout=self.hang_s)
        outcomes = []
        for document in documents:
            before = self._salt_hits(document.salt) or 0
            outcome = self._send(client, -1, "revisit", document.prompt, document.salt)
            hits = self._lmcache_hits(document.salt, before) if outcome.result == "ok" else None
            outcomes.append(
                replace(outcome, stored_at_s=document.stored_at_s, hit_tokens=hits, expected_tokens=self.expected)
            )
        return outcomes

    def _send(self, client: VllmClient, index: int, kind: str, prompt: str, salt: str) -> Outcome:
        started = self.now()
        try:
            client.complete(self.model, prompt, max_tokens=self.shape.max_tokens, cache_salt=salt)
            result = "ok"
        except HttpStatusError as error:
            result = f"failed: HTTP {error.status}"
        except Glm53Error as error:
            result = "hung" if "no answer within" in error.message else f"failed: {error.message[:80]}"
        return Outcome(index, kind, started, self.now() - started, result)

    def _lmcache_hits(self, salt: str, before: int = 0) -> int | None:
        """What the server's lookup found for `salt` beyond `before` (its counter before this request); None when the
        server cannot be read (it is down)."""
        deadline = time.monotonic() + HIT_SETTLE_S
        while True:
            total = self._salt_hits(salt)
            if total is None:
                return None
            if total - before >= self.expected or time.monotonic() > deadline:
                return max(0, total - before)
            time.sleep(0.2)

    def _salt_hits(self, salt: str) -> int | None:
        """The server's lookup hit counter for `salt`; None when the server cannot be read."""
        try:
            snapshot = scrape(f"{self.lmcache_url}/metrics")
        except UpstreamError:
            return None
        return int(
            sum(
                s.value
                for family in snapshot.families
                for s in family.samples
                if s.name == HIT_METRIC and s.labels.get("cache_salt") == salt
            )
        )

    def _record(self, outcome: Outcome) -> None:
        with self._lock:
            self.outcomes.append(outcome)
