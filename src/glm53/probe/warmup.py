"""The startup probe's last step: one request through the cache path, once the geometry is right.

Why: LMCache's connector starts its heartbeats lazily, the scheduler's at its first lookup and the worker's at its first
store or retrieve (lmcache 0.5.6 lmcache/integration/vllm/vllm_multi_process_adapter.py:827-843 and 1682-1705). Until
then an engine that registered its KV caches and served nothing is never pinged, so
- the server reaps it after `--worker-registration-grace-seconds` (default 3600 s, lmcache/v1/multiprocess/config.py:
  524-530; management.py:62-74), and the requests after that hang (LMCache #4715, #4795);
- a sidecar restarted before the first request goes unnoticed (no ping fails), so the engine never registers with the
  new server, which rejects every store (LMCache #4642).
One prompt of a whole chunk and one token more, answered with one token, stores that chunk and starts both heartbeats.
It carries its own `cache_salt`, so its chunk never serves, or is served by, real traffic. The probe holds Ready back
until the engine answered it, so Ready also means "the engine served a request through its sidecar".
"""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from dataclasses import dataclass

WARM_UP_SALT = "glm53-warm-up"


@dataclass(frozen=True)
class WarmUp:
    """Where and what the warm-up request is: the engine's base URL, its served model name, the chunk it must fill,
    and the API key vLLM was started with (`VLLM_API_KEY`), if any."""

    base_url: str
    model: str
    chunk_size: int
    token_id: int
    timeout_s: float
    api_key: str | None = None

    def body(self) -> dict[str, object]:
        return {
            "model": self.model,
            "prompt": [self.token_id] * (self.chunk_size + 1),
            "max_tokens": 1,
            "temperature": 0,
            "cache_salt": WARM_UP_SALT,
        }


def send(warm_up: WarmUp) -> str | None:
    """Send the warm-up completion; None once the engine answered it with a completion, else why not (one line)."""
    url = f"{warm_up.base_url.rstrip('/')}/v1/completions"
    headers = {"Content-Type": "application/json"}
    if warm_up.api_key:
        headers["Authorization"] = f"Bearer {warm_up.api_key}"
    request = urllib.request.Request(url, data=json.dumps(warm_up.body()).encode(), headers=headers, method="POST")
    try:
        with urllib.request.urlopen(request, timeout=warm_up.timeout_s) as response:
            answer = json.loads(response.read() or b"{}")
    except urllib.error.HTTPError as error:
        return f"{url} answered HTTP {error.code}"
    except (OSError, ValueError) as error:
        return f"{url}: {error}"
    if not isinstance(answer, dict) or not answer.get("choices"):
        return f"{url} answered without a completion"
    return None
