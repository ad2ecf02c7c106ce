"""Scrape one upstream Prometheus endpoint (vLLM's `/metrics`, `lmcache server`'s HTTP port) into a parsed snapshot.

The exporter joins metrics that vLLM and LMCache expose separately, so every scrape of the exporter scrapes both.
An upstream that is down, slow, or answers with something that is not the text exposition format must cost at most
a short timeout and turn into an error the collector counts, never an exception out of `collect()`; hence the
narrow `UpstreamError` with a `reason` label value. Parsing is a pure function over the response text
(`prometheus_client.parser`, the same parser Prometheus' Python client ships), the fetch is a thin urllib edge.
"""

from __future__ import annotations

import json
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from prometheus_client.metrics_core import Metric
from prometheus_client.parser import text_string_to_metric_families

from glm53.errors import Glm53Error

# Prometheus scrapes the exporter with a 10 s timeout by default; both upstreams together must fit well inside it.
DEFAULT_TIMEOUT_SECONDS = 2.0
# A /metrics page larger than this is not a metrics page (or is a runaway label set); refuse it rather than parse it.
MAX_RESPONSE_BYTES = 32 * 1024 * 1024

# The values of the `reason` label on `glm53_upstream_errors_total`.
REASON_UNREACHABLE = "unreachable"
REASON_HTTP_STATUS = "http_status"
REASON_MALFORMED = "malformed"

# prometheus_client's process collector: when the process behind an endpoint started (Unix seconds).
START_TIME_SAMPLE = "process_start_time_seconds"


class UpstreamError(Exception):
    """One failed scrape of one upstream; `reason` is one of the REASON_* label values."""

    def __init__(self, reason: str, detail: str) -> None:
        super().__init__(f"{reason}: {detail}")
        self.reason = reason
        self.detail = detail


# A sample's identity across scrapes: its name and its sorted label pairs.
SampleKey = tuple[str, tuple[tuple[str, str], ...]]


@dataclass(frozen=True)
class Snapshot:
    """The metric families one upstream exposed at one scrape."""

    families: tuple[Metric, ...]

    def total(self, sample_name: str) -> float | None:
        """The sum of every sample called `sample_name` over all label sets, or None when none is exposed.

        vLLM labels its counters by `model_name` and `engine`, LMCache by `model_name` and `cache_salt`; the joined
        ratios are per deployment, so they add the label sets up.
        """
        values = [s.value for family in self.families for s in family.samples if s.name == sample_name]
        return sum(values) if values else None

    def counters(self) -> dict[SampleKey, float]:
        """Every counter sample (`*_total`) keyed by name and labels: what restart detection compares."""
        return {
            (s.name, tuple(sorted(s.labels.items()))): s.value
            for family in self.families
            if family.type == "counter"
            for s in family.samples
            if s.name.endswith("_total")
        }

    def families_with_prefix(self, prefixes: Iterable[str]) -> list[Metric]:
        """The families whose name starts with one of `prefixes` and that carry samples (for pass-through)."""
        wanted = tuple(prefixes)
        return [f for f in self.families if f.name.startswith(wanted) and f.samples]


def parse_exposition(text: str) -> Snapshot:
    """Parse Prometheus text exposition; anything else (an HTML error page, a truncated body) is `malformed`."""
    try:
        return Snapshot(tuple(text_string_to_metric_families(text)))
    except (ValueError, TypeError, IndexError, KeyError) as error:
        raise UpstreamError(REASON_MALFORMED, f"not Prometheus text exposition ({error})") from None


def metrics_url(url: str) -> str:
    """`url` with `/metrics` appended when it names only a host and port (`http://127.0.0.1:8080`)."""
    parts = urllib.parse.urlsplit(url)
    if parts.scheme not in {"http", "https"} or not parts.netloc:
        raise Glm53Error(f"expected an http(s) URL such as http://127.0.0.1:8000, got {url!r}; fix the URL flag")
    if parts.path in {"", "/"}:
        return urllib.parse.urlunsplit((parts.scheme, parts.netloc, "/metrics", parts.query, ""))
    return url


def fetch_text(url: str, timeout: float = DEFAULT_TIMEOUT_SECONDS, api_key: str | None = None) -> str:
    """GET `url` and return its body as text, or raise `UpstreamError` (unreachable, non-200, oversized).

    `api_key` is sent as a bearer token: a negotiating LMCache server started with `--api-key-file` answers
    everything but `/` and `/healthcheck` with HTTP 401 without it (lmcache 0.5.7rc2 lmcache/security/http.py:45-99,
    lmcache/v1/multiprocess/http_auth.py:23)."""
    headers = {"Accept": "text/plain;version=0.0.4"}
    if api_key is not None:
        headers["Authorization"] = f"Bearer {api_key}"
    request = urllib.request.Request(url, headers=headers)
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            body: bytes = response.read(MAX_RESPONSE_BYTES + 1)
    except urllib.error.HTTPError as error:
        hint = " (it wants the server's API key: give the exporter --lmcache-api-key-file)" if error.code == 401 else ""
        raise UpstreamError(REASON_HTTP_STATUS, f"{url} answered HTTP {error.code}{hint}") from None
    except (urllib.error.URLError, OSError, ValueError) as error:
        raise UpstreamError(REASON_UNREACHABLE, f"{url}: {error}") from None
    if len(body) > MAX_RESPONSE_BYTES:
        raise UpstreamError(REASON_MALFORMED, f"{url} returned more than {MAX_RESPONSE_BYTES} bytes")
    return body.decode("utf-8", errors="replace")


def scrape(url: str, timeout: float = DEFAULT_TIMEOUT_SECONDS, api_key: str | None = None) -> Snapshot:
    """Fetch and parse one upstream's metrics page."""
    return parse_exposition(fetch_text(url, timeout, api_key))


def restarted(previous: Snapshot, current: Snapshot) -> bool:
    """True when two successful scrapes of one upstream came from different processes: it restarted in between.

    Evidence, any of: `process_start_time_seconds` changed (prometheus_client's process collector, which LMCache's
    `/metrics` carries); a counter went backwards; a counter vanished. Counters only grow while a process
    lives, and LMCache's OpenTelemetry counters never disappear once they appeared.
    """
    before, after = previous.total(START_TIME_SAMPLE), current.total(START_TIME_SAMPLE)
    if before is not None and after is not None and before != after:
        return True
    now = current.counters()
    return any(key not in now or now[key] < value for key, value in previous.counters().items())


def registered_engines(status_url: str, timeout: float = DEFAULT_TIMEOUT_SECONDS, api_key: str | None = None) -> int:
    """How many engine instances the LMCache server has registered, from its `GET /status`.

    lmcache 0.5.6 lmcache/v1/multiprocess/http_apis/info_api.py:63 serves the status of every module; the transfer
    module reports `registered_gpu_ids` (lmcache/v1/multiprocess/modules/lmcache_driven_transfer.py:406-428). Zero while
    the engine runs means the server does not know it: every store and retrieve is rejected (LMCache #4642).
    """
    try:
        status = json.loads(fetch_text(status_url, timeout, api_key))
    except json.JSONDecodeError as error:
        raise UpstreamError(REASON_MALFORMED, f"{status_url} did not answer JSON ({error.msg})") from None
    ids = _find_key(status, "registered_gpu_ids")
    if not isinstance(ids, list):
        raise UpstreamError(REASON_MALFORMED, f"{status_url} lists no registered_gpu_ids")
    return len(ids)


def _find_key(value: object, key: str) -> object:
    """The first value under `key` anywhere in a JSON document (the status nests it per module), else None."""
    if isinstance(value, dict):
        if key in value:
            return value[key]
        values: list[object] = list(value.values())
    elif isinstance(value, list):
        values = list(value)
    else:
        return None
    for item in values:
        found = _find_key(item, key)
        if found is not None:
            return found
    return None


def read_api_key(path: Path) -> str:
    """The key in an LMCache API key file, read as the server reads it: exactly one non-empty line, stripped (lmcache
    0.5.7rc2 lmcache/security/api_key.py:14-129); anything else is refused in one line."""
    try:
        lines = [line.strip() for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]
    except (OSError, UnicodeDecodeError) as error:
        raise Glm53Error(f"cannot read the LMCache API key file {str(path)!r}: {error}") from None
    if len(lines) != 1:
        raise Glm53Error(
            f"the LMCache API key file {str(path)!r} must hold exactly one non-empty line (the key), found {len(lines)}"
        )
    return lines[0]
