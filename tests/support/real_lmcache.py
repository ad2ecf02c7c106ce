"""The released `lmcache server` on loopback, driven by LMCache's own CPU client: the source of every LMCache `/metrics`
page the exporter tests read, and the generator of `fixtures/lmcache-metrics.prom`.

`lmcache server` serves `/metrics` on its HTTP port (the FastAPI front's metrics route, lmcache 0.5.6
lmcache/v1/internal_api_server/common/metrics_api.py:14-20) and opens no `--prometheus-port` listener: it starts the
cache server with `start_prometheus_http_server=False` (lmcache/v1/multiprocess/http_server.py:84-90; the OTel setup
then logs "standalone metrics HTTP server disabled", lmcache/v1/mp_observability/otel_init.py:116-129).

Traffic comes from `lmcache bench server --mode cpu`: one request of the seed's 8507 tokens at C = 1152. The bench looks
the prompt up before storing it (a miss) and again before retrieving it (a hit), so the page carries the seed's numbers:
2 x 8064 tokens requested (only whole chunks count, lmcache/v1/multiprocess/modules/lookup.py:230-233) and 8064 hit.
Re-generate the fixture after upgrading LMCache (see fixtures/README.md):

    .venv/bin/python -m tests.support.real_lmcache
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from glm53.testing.chart_sidecar import StandaloneSidecar, chart_sidecar
from glm53.testing.sidecar import serving

FIXTURE = Path(__file__).resolve().parents[1] / "exporter" / "fixtures" / "lmcache-metrics.prom"
LMCACHE = Path(sys.executable).with_name("lmcache")
# The seed's model: GLM-5.3-Flash's pod serves C = 1152 (its N at TP 4), as the chart renders it.
PROFILE = "glm53-flash"
PROMPT_TOKENS = 8507
# One MLA-style group (kv_size 1) of 64-token blocks, enough blocks for the whole prompt (144 * 64 = 9216 tokens).
KV_SHAPE = "(1,144,64,1,64):float16:2"
START_DEADLINE_SECONDS = 60.0
SETTLE_DEADLINE_SECONDS = 15.0
# No start-up banner in the logs (lmcache 0.5.6 lmcache/banner.py:28,62).
NO_BANNER = {"LMCACHE_DISABLE_BANNER": "1"}
# The bench client's environment: without these it sends a usage report (lmcache/usage_telemetry/identity.py:31-40).
# The server takes the chart's opt-outs with the rest of its environment.
QUIET_ENV = {"LMCACHE_TRACK_USAGE": "false", "DO_NOT_TRACK": "1", **NO_BANNER}


def http_get(url: str) -> str:
    with urllib.request.urlopen(url, timeout=5) as response:
        return bytes(response.read()).decode()


@contextmanager
def running_lmcache(workdir: Path) -> Iterator[StandaloneSidecar]:
    """`lmcache server` as GLM-5.3-Flash's pod runs it (the chart's sidecar) on free loopback ports; stopped on exit."""
    sidecar = chart_sidecar(PROFILE, workdir)
    log = workdir / "lmcache-server.log"
    with serving(sidecar.argv, {**sidecar.env, **NO_BANNER}, sidecar.http_port, log, START_DEADLINE_SECONDS):
        yield sidecar


def send_one_request(server: StandaloneSidecar, sequence: int = 0) -> None:
    """One bench sequence of PROMPT_TOKENS tokens: a cold request (lookup misses, store) and a warm one (lookup hits,
    retrieve), lmcache 0.5.6 lmcache/cli/commands/bench/server_bench/cases/baseline.py:106-112. `sequence` picks the
    prompt's tokens, the same on every server for the same number (baseline.py:90-112)."""
    args = ["bench", "server", "--rpc-url", f"tcp://127.0.0.1:{server.port}", "--url", server.http_url]
    args += ["--mode", "cpu", "--transfer-mode", "lmcache_driven", "--kvcache-shape-spec", KV_SHAPE]
    # The bench's own pause between its cold and its warm request (its default is 0.5 s): without it the warm lookup can
    # race the store on a busy machine and miss.
    args += ["--num-tokens", str(PROMPT_TOKENS), "--start", str(sequence), "--end", str(sequence + 1)]
    args += ["--interval", "1", "-q"]
    env = {**os.environ, **QUIET_ENV}
    bench = subprocess.run([str(LMCACHE), *args], capture_output=True, text=True, env=env, timeout=120, check=False)
    if bench.returncode != 0:
        raise RuntimeError(f"lmcache bench server failed ({bench.returncode}):\n{bench.stdout}{bench.stderr}")


def settled_metrics(server: StandaloneSidecar) -> str:
    """The `/metrics` page once the server has turned the request's events into metrics.

    A subscriber thread drains LMCache's event bus into the OTel instruments (lmcache 0.5.6
    lmcache/v1/mp_observability/event_bus.py), so a page read right after the request may lack some families: wait
    until the lookup counters are there, the queue is empty and two reads in a row show the same families.
    """
    deadline = time.monotonic() + SETTLE_DEADLINE_SECONDS
    previous: set[str] = set()
    while True:
        page = http_get(f"{server.http_url}/metrics")
        families = {line.split()[2] for line in page.splitlines() if line.startswith("# TYPE ")}
        settled = "lmcache_mp_event_bus_queue_depth 0.0" in page and families == previous
        if (settled and "lmcache_mp_lookup_hit_tokens_total" in families) or time.monotonic() > deadline:
            return page
        previous = families
        time.sleep(0.5)


def capture(workdir: Path) -> str:
    """The real server's `/metrics` page after one request."""
    with running_lmcache(workdir) as server:
        send_one_request(server)
        return settled_metrics(server)


def main() -> int:
    with tempfile.TemporaryDirectory() as workdir:
        FIXTURE.write_text(capture(Path(workdir)), encoding="utf-8")
    print(f"wrote {FIXTURE}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
