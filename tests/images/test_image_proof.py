"""The serving image cannot change without being built again: docs/serving-image.md must be the record of its inputs.

scripts/image-proof.sh builds the image for real (about half an hour on 2 cores and ~45 GB of disk, too much for every
CI run) and writes docs/serving-image.md from that run, with the hash of the image's inputs (the Dockerfile and the
files of docker/vllm-lmcache it copies). These tests are the cheap half that runs on every CI run: the record states
the hash of the inputs as they are now, every file the Dockerfile copies from its folder is an input, every in-image
check of the recorded run passed, and the generator (docker/vllm-lmcache/image_proof.py) writes what the first test
reads. A change to an input fails here, naming the file, until the proof is run again.
"""

from __future__ import annotations

import json
import re
import shlex
from pathlib import Path
from typing import Any

import pytest

from tests.support.dockerkit import REPO_ROOT, load_image_script

IMAGE_DIR = REPO_ROOT / "docker" / "vllm-lmcache"
RECORD = REPO_ROOT / "docs" / "serving-image.md"
proof = load_image_script(IMAGE_DIR / "image_proof.py")
# The checks the proof runs inside the image (the list); the record must show each one passing.
EXPECTED_CHECKS = (
    "imports",
    "verify-lmcache",
    "pip check /opt/venv",
    "pip check /opt/glm53/venv",
    "build-info.json vs constraints.txt",
    "base image label, no build leftovers",
    "non-root user",
    "glm53 probe (the chart's startupProbe)",
    "lmcache server argv (the chart's sidecar)",
    "vllm serve argv (the chart's engine)",
    "python3 for the chart's exec probes",
    "FlashInfer as vLLM sees it",
)


def record() -> str:
    assert RECORD.exists(), f"{RECORD} is missing; run `sudo scripts/image-proof.sh` to build the image and write it"
    return RECORD.read_text()


def test_the_record_is_of_the_inputs_as_they_are_now() -> None:
    text = record()
    now = proof.input_digests(REPO_ROOT)
    changed = sorted(path for path, digest in proof.recorded_digests(text).items() if now.get(path) != digest)
    added = sorted(set(now) - set(proof.recorded_digests(text)))

    assert proof.recorded_hash(text) == proof.inputs_hash(now), (
        f"expected docs/serving-image.md to record the serving image's inputs as they are, but "
        f"{', '.join(changed + added) or 'the input list'} changed since the recorded proof; run "
        "`scripts/image-proof.sh` (as root, ~30 min, ~45 GB free) to build the image again and rewrite the record"
    )


def copied_from_image_dir(dockerfile: str) -> set[str]:
    """Every path under docker/vllm-lmcache/ that a COPY of the Dockerfile takes from the build context."""
    joined = re.sub(r"\\\n", " ", dockerfile)
    sources: set[str] = set()
    for line in joined.splitlines():
        words = shlex.split(line.strip(), comments=False) if line.strip().startswith("COPY ") else []
        if not words or any(word.startswith("--from=") for word in words):
            continue
        sources |= {word for word in words[1:-1] if word.startswith("docker/vllm-lmcache/")}
    return sources


def test_every_file_the_dockerfile_copies_from_its_folder_is_an_input() -> None:
    copied = copied_from_image_dir((IMAGE_DIR / "Dockerfile").read_text())

    assert copied, "expected the Dockerfile to COPY files from docker/vllm-lmcache/"
    assert copied | {"docker/vllm-lmcache/Dockerfile"} == set(proof.INPUTS)


def test_the_recorded_run_passed_every_check() -> None:
    rows = re.findall(r"^\| ([^|]+?) \| (pass|\*\*FAIL\*\*) \| [0-9.]+ \|", record(), flags=re.MULTILINE)

    assert [name for name, _ in rows] == list(EXPECTED_CHECKS)
    assert [name for name, result in rows if result != "pass"] == []


def test_the_record_says_what_the_substitute_bases_cannot_prove() -> None:
    text = record()

    assert "## What these substitute bases cannot prove" in text
    assert proof.CANNOT_PROVE in text


# ---- the generator -----------------------------------------------------------------------------------------------


def fake_results(directory: Path, inputs_hash: str) -> Path:
    """A results directory as scripts/image-proof.sh leaves it, with made-up numbers."""
    results = directory / "results"
    results.mkdir()
    values = {
        "inputs-hash": inputs_hash,
        "date": "2026-12-01T14:00:00Z",
        "bases-seconds": "150",
        "cold-seconds": "1500",
        "cold-rx-bytes": "4400000000",
        "cached-seconds": "9",
        "warm-seconds": "700",
        "warm-rx-bytes": "20000000",
        "devel-base-bytes": "700000000",
        "runtime-base-bytes": "250000000",
        "peak-data-root-kib": "25000000",
        "final-data-root-kib": "24000000",
        "total-seconds": "2500",
        "ca-bundle-sha": "0123456789abcdef",
    }
    for name, value in values.items():
        (results / name).write_text(value + "\n")
    checks: list[dict[str, Any]] = [
        {"name": name, "command": "true", "passed": True, "detail": "ok | fine", "seconds": 1.0}
        for name in EXPECTED_CHECKS
    ]
    image = {
        "id": "sha256:" + "ab" * 32,
        "bytes": 10_800_000_000,
        "tags": ["glm53/vllm-lmcache:0.1.0"],
        "build_args": {"CUDA_RUNTIME_IMAGE": "glm53-proof/cuda:13.0-runtime-bookworm", "BUILD_DATE": "x"},
        "builder": "buildkit",
        "host": "2 cores",
        "layers": [{"bytes": 1000 * i, "created_by": f"RUN step {i}"} for i in range(12)],
    }
    (results / "checks.json").write_text(json.dumps({"checks": checks, "image": image}))
    return results


def test_the_generated_record_states_the_hash_and_digests_the_test_reads(tmp_path: Path) -> None:
    digests = proof.input_digests(REPO_ROOT)
    results = fake_results(tmp_path, proof.inputs_hash(digests))

    text = proof.render(REPO_ROOT, results)

    assert proof.recorded_hash(text) == proof.inputs_hash(digests)
    assert proof.recorded_digests(text) == digests
    assert (
        "| **cold build** (empty data root, through the playbook) | **25 min 00 s (1500 s)**, 4.40 GB received |"
        in (text)
    )
    assert "| verify-lmcache | pass | 1.0 | ok \\| fine |" in text
    assert "BUILD_DATE" not in text


def test_the_generator_refuses_a_run_whose_inputs_changed_meanwhile(tmp_path: Path) -> None:
    results = fake_results(tmp_path, "0" * 64)

    with pytest.raises(proof.ProofError, match="an input changed during the run"):
        proof.render(REPO_ROOT, results)


CHART = """
kind: Deployment
spec:
  template:
    spec:
      initContainers:
        - name: lmcache
          args: [--log, /var/log/glm53/lmcache.log, --, lmcache, server, --chunk-size, "1152"]
      containers:
        - name: vllm
          args: [--log, /var/log/glm53/vllm.log, --, vllm, serve, zai-org/GLM-5.3-Flash, --port, "8000"]
          startupProbe:
            exec:
              command: [glm53, probe, startup, --profile, glm53-flash, --log, /var/log/glm53/vllm.log]
"""


def test_the_chart_command_lines_are_read_from_the_rendered_pod() -> None:
    commands = proof.chart_commands(CHART)

    assert commands == {
        "vllm": ["zai-org/GLM-5.3-Flash", "--port", "8000"],
        "lmcache": ["--chunk-size", "1152"],
        "probe": ["glm53", "probe", "startup", "--profile", "glm53-flash", "--log", "/var/log/glm53/vllm.log"],
    }


def test_a_pod_that_runs_something_else_is_refused_in_one_sentence() -> None:
    with pytest.raises(proof.ProofError, match=r"expected the vllm container to run vllm serve but it runs \['glm53'"):
        proof.chart_commands(CHART.replace("vllm, serve, zai-org", "glm53, mock, vllm, zai-org"))
