"""`glm53 validate` as a user runs it against the CPU-mock pod: report on stdout, progress on stderr, JSON and PNG."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from glm53.pod.loopback import quiet
from glm53.pod.main_job import PodAddresses, PodOptions, render_plans, started_pod
from glm53.profiles import get_profile
from glm53.validate.prompts import document_qa_prompt
from tests.support.validate_fakes import run_glm53


@pytest.mark.slow
def test_validate_writes_report_json_and_plot(tmp_path: Path) -> None:
    prompt_file = tmp_path / "prompt.txt"
    prompt_file.write_text(document_qa_prompt(3000, seed=7).text, encoding="utf-8")
    json_path, plot_path = tmp_path / "report.json", tmp_path / "report.png"
    with started_pod(render_plans(PodOptions(get_profile("glm53"))), tmp_path / "pod", quiet) as pod:
        result = run_glm53(
            "validate",
            *("--base-url", PodAddresses.of(pod.plan).vllm, "--profile", "glm53", "--runs", "8", "--pairs", "6"),
            *("--prompt-file", str(prompt_file), "--json", str(json_path), "--plot", str(plot_path)),
            timeout=120,
        )
    assert result.returncode == 0, result.stdout + result.stderr
    assert "LMCache hit 2816 of 3000 tokens" in result.stdout  # whole 256-token chunks of a 3000-token prompt
    assert "answers correct" not in result.stdout  # a user's prompt comes without a known answer
    assert result.stdout.splitlines()[-1].startswith("result: PASS (5 checks in ")
    assert "equivalence: cold run 1/8: log-prob " in result.stderr.splitlines()[1]
    report = json.loads(json_path.read_text())
    assert report["passed"] is True
    # GLM-5.3 is one group: a full-prompt hit (L = 256, 512, 768) loads L-1, whole chunks otherwise.
    assert [row["hit_tokens"] for row in report["boundary"]["rows"]] == [0, 255, 256, 256, 511, 512, 512, 767, 768]
    assert len(report["perf"]["cached"]) == 8
    assert plot_path.read_bytes()[:4] == b"\x89PNG"
