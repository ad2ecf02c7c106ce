"""The real negotiating LMCache server (lmcache 0.5.7rc2, from the overlay `scripts/setup.d/26-lmcache-negotiating.sh`
installs) started as the chart starts its sidecar, asked to negotiate by LMCache's own request client.

The sidecar is the tiny hybrid's rendered one less its `--chunk-size`, as `lmcache.generation=0.5.7rc2` renders it,
run from the overlay. The client sends what the tiny hybrid's connector sends, the LCM of its groups' token spans,
1152 (lmcache 0.5.7rc2 lmcache/integration/vllm/lmcache_mp_connector.py:290-323, sent as NEGOTIATE_CHUNK_SIZE while
the adapters are built, vllm_multi_process_adapter.py:249-271). So the lines the
probe reads here come from the real server in this run; the engine's lines are the captured run's
(tests/fixtures/logs/lmcache-0.5.7rc2/), whose connector asked the same.
"""

from __future__ import annotations

import contextlib
import os
import re
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from glm53.errors import Glm53Error
from glm53.exporter.upstream import UpstreamError, read_api_key, registered_engines, scrape
from glm53.pod.main_job import lmcache_overlay
from glm53.probe.judge import StartupFacts, Status, Verdict, evaluate
from glm53.probe.logparse import parse_lines
from glm53.profiles import get_profile
from glm53.testing.chart_sidecar import StandaloneSidecar, chart_sidecar
from glm53.testing.processes import stop_group
from tests.support.lmcache057 import captured

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]

REPO = Path(__file__).resolve().parents[2]
OVERLAY = lmcache_overlay("0.5.7rc2")
HYBRID = get_profile("tiny-hybrid")
ALIGNMENT = 1152
# The server's start on a busy 2-core machine: Python imports alone took 19 s of an idle one's 29 s.
START_S = 300.0
NEGOTIATE = (
    "import sys; from lmcache.v1.multiprocess.transport.factory import RequestClientFactory; "
    "client = RequestClientFactory.create(sys.argv[1]); "
    "print(client.negotiate_chunk_size(int(sys.argv[2])).result(timeout=60)); client.close()"
)
ANSI = re.compile(r"\x1b\[[0-9;]*m")


def overlay_env(env: dict[str, str]) -> dict[str, str]:
    assert (OVERLAY / "lmcache-0.5.7rc2.dist-info").is_dir(), (
        f"no lmcache 0.5.7rc2 overlay in {OVERLAY}: run bash scripts/setup.d/26-lmcache-negotiating.sh"
    )
    return {**env, "PYTHONPATH": str(OVERLAY)}


def negotiating_argv(sidecar: StandaloneSidecar, *extra: str) -> list[str]:
    """The rendered server command less `--chunk-size` (as lmcache.generation=0.5.7rc2 renders it), run by this
    Python."""
    argv = list(sidecar.argv)
    at = argv.index("--chunk-size")
    del argv[at : at + 2]
    assert argv[:2] == ["lmcache", "server"], argv
    return [sys.executable, "-m", "lmcache.cli.main", *argv[1:], *extra]


def healthy(url: str) -> bool:
    with contextlib.suppress(OSError), urllib.request.urlopen(f"{url}/healthcheck", timeout=5) as response:
        return bool(response.status == 200)
    return False


@contextlib.contextmanager
def negotiating_server(tmp_path: Path, *extra: str) -> Iterator[tuple[StandaloneSidecar, Path]]:
    sidecar = chart_sidecar("tiny-hybrid", tmp_path)
    log = tmp_path / "lmcache.log"
    with open(log, "wb") as output:
        server = subprocess.Popen(
            negotiating_argv(sidecar, *extra),
            stdout=output,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            env=overlay_env(sidecar.env),
            start_new_session=True,
        )
    try:
        deadline = time.monotonic() + START_S
        while not healthy(sidecar.http_url):
            assert server.poll() is None, log.read_text(errors="replace")[-3000:]
            assert time.monotonic() < deadline, "the 0.5.7rc2 server did not answer /healthcheck in time"
            time.sleep(1.0)
        yield sidecar, log
    finally:
        stop_group(server, 30)


def negotiate(sidecar: StandaloneSidecar, alignment: int) -> int:
    url = f"tcp://127.0.0.1:{sidecar.port}"
    done = subprocess.run(
        [sys.executable, "-c", NEGOTIATE, url, str(alignment)],
        capture_output=True,
        text=True,
        timeout=180,
        env=overlay_env(dict(os.environ)),
        check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return int(done.stdout.split()[-1])


def probed(server_log: Path, run: str) -> Verdict:
    facts = StartupFacts()
    facts.add_all(parse_lines(captured(run, "vllm")))
    facts.add_all(parse_lines(server_log.read_text(errors="replace").splitlines()))
    return evaluate(HYBRID, 1, None, facts, 1000)


def test_the_default_minimum_negotiates_the_seeds_line_behind_an_api_key(tmp_path: Path) -> None:
    key_file = tmp_path / "api-key"
    key_file.write_text("glm53-test-key\n")
    with negotiating_server(tmp_path, "--api-key-file", str(key_file)) as (sidecar, log):
        assert negotiate(sidecar, ALIGNMENT) == 1152
        server_lines = [ANSI.sub("", line) for line in log.read_text(errors="replace").splitlines()]
        negotiated = [line for line in server_lines if "Negotiated LMCache MP chunk size" in line]
        assert len(negotiated) == 1 and (
            "Negotiated LMCache MP chunk size to 1152 (configured_min=256, required_alignment=1152)" in negotiated[0]
        ), negotiated
        verdict = probed(log, "default")
        assert verdict.status is Status.READY, verdict.message
        assert "chunk size 1152 (negotiated from 256)" in verdict.message

        # The API key: /healthcheck stays public (the sidecar's probes use it), /metrics and /status want the key.
        with pytest.raises(UpstreamError, match=r"answered HTTP 401 \(it wants the server's API key"):
            scrape(f"{sidecar.http_url}/metrics")
        key = read_api_key(key_file)
        page = scrape(f"{sidecar.http_url}/metrics", api_key=key)
        assert any(family.name.startswith("lmcache_mp_") for family in page.families)
        assert registered_engines(f"{sidecar.http_url}/status", api_key=key) == 0


def test_a_minimum_of_2000_negotiates_2304_and_the_probe_refuses_it(tmp_path: Path) -> None:
    with negotiating_server(tmp_path, "--chunk-size", "2000") as (sidecar, log):
        assert negotiate(sidecar, ALIGNMENT) == 2304
        verdict = probed(log, "min2000")
    assert verdict.status is Status.WRONG
    assert "found 2304" in verdict.message and "set --chunk-size 1152 on the LMCache server" in verdict.message


def test_an_api_key_file_that_is_not_one_line_is_refused_in_one_line(tmp_path: Path) -> None:
    for text, found in (("", 0), ("a\nb\n", 2)):
        path = tmp_path / "key"
        path.write_text(text)
        with pytest.raises(Glm53Error, match=f"must hold exactly one non-empty line .the key., found {found}$"):
            read_api_key(path)
    with pytest.raises(Glm53Error, match="cannot read the LMCache API key file"):
        read_api_key(tmp_path / "missing")
