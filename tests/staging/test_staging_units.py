"""The stage step's pure parts and edges: progress wording, the status file its probe reads, the marker, the metrics,
the dashboard's staging panels, and the command's bad input (one line, non-zero exit)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import promql_parser
import pytest
from prometheus_client import generate_latest

from glm53.staging.layout import Marker, RepoLayout, StagedFile, read_marker, size_problems, write_marker
from glm53.staging.metrics import registry_for, sample_names
from glm53.staging.progress import Progress, RateMeter, eta_seconds, human_bytes, human_duration
from glm53.staging.stager import StageState
from glm53.staging.status import EXIT_DONE, EXIT_FAILED, EXIT_NOT_YET, read_status, write_status

DASHBOARD = Path(__file__).resolve().parents[2] / "charts/glm53/files/glm53-dashboard.json"


@pytest.mark.parametrize(
    ("count", "text"),
    [(0, "0 B"), (512, "512 B"), (6559328, "6.26 MiB"), (1023.99 * 2**20, "1.00 GiB"), (702 * 2**30, "702 GiB")],
)
def test_human_bytes(count: float, text: str) -> None:
    assert human_bytes(count) == text


@pytest.mark.parametrize(("seconds", "text"), [(42, "42s"), (185, "3m05s"), (6240, "1h44m"), (3 * 86400, "3d00h")])
def test_human_duration(seconds: float, text: str) -> None:
    assert human_duration(seconds) == text


def test_the_rate_is_over_a_window_and_the_eta_follows_it() -> None:
    meter = RateMeter(window_s=30)
    assert meter.rate() is None
    for second in range(0, 61):
        meter.add(float(second), second * 100.0 if second < 40 else 4000.0)  # a stall after 40 s
    rate = meter.rate()
    assert rate is not None and rate < 100  # the window sees the stall; a whole-run average would say ~66
    assert eta_seconds(50, 100, 10.0) == 5.0 and eta_seconds(100, 100, None) == 0.0 and eta_seconds(1, 2, 0) is None


def test_the_progress_line_names_bytes_files_rate_and_eta() -> None:
    progress = Progress("downloading", "zai-org/GLM-5.3", "main", "ab" * 20, 12 * 2**30, 700 * 2**30, 3, 163, 2**27)
    assert progress.line() == (
        "downloading zai-org/GLM-5.3@main (commit abababababab): 12.0 GiB of 700 GiB (1.7 %), 3 of 163 files "
        "downloaded, 128 MiB/s, ETA 1h31m"
    )
    assert Progress("failed", "r/m", "main", detail="why").line() == "failed: why"


def test_the_status_probe_answers_like_a_startup_probe(tmp_path: Path) -> None:
    path = tmp_path / "stage" / "status.json"
    assert read_status(path) == (EXIT_NOT_YET, f"not yet: the stage step has written no status to {path} yet")
    write_status(path, {"phase": "downloading", "line": "downloading r/m@main: ..."})
    assert read_status(path) == (EXIT_NOT_YET, "downloading r/m@main: ...")
    write_status(path, {"phase": "failed", "line": "failed: no token"})
    assert read_status(path) == (
        EXIT_FAILED,
        "failed: no token (retrying by itself; see `kubectl logs -c stage-weights`)",
    )
    write_status(path, {"phase": "done", "line": "done: r/m@main"})
    assert read_status(path) == (EXIT_DONE, "done: r/m@main")
    path.write_text("{")
    code, line = read_status(path)
    assert code == EXIT_FAILED and line.startswith(f"failed: cannot read the stage step's status {path} (")


def test_the_marker_round_trips_and_names_what_changed(tmp_path: Path) -> None:
    layout = RepoLayout(tmp_path, "org/model")
    commit = "c" * 40
    files = (
        StagedFile("a.json", 3, "e" * 40, "git-sha1", "e" * 40),
        StagedFile("w/x.safetensors", 5, "f" * 64, "sha256", "f" * 64),
    )
    write_marker(layout, Marker("org/model", "refs/pr/1", commit, files, {"verifySeconds": 1.0}))
    assert layout.marker("refs/pr/1").name == "refs%2Fpr%2F1.json"
    marker = read_marker(layout, "refs/pr/1")
    assert marker is not None and marker.files == files and marker.total_bytes == 8
    assert read_marker(RepoLayout(tmp_path, "org/other"), "refs/pr/1") is None
    layout.pointer(commit, "a.json").parent.mkdir(parents=True)
    layout.pointer(commit, "a.json").write_text("abc")
    assert size_problems(layout, commit, files) == {"w/x.safetensors": "missing"}
    layout.pointer(commit, "w/x.safetensors").parent.mkdir(parents=True)
    layout.pointer(commit, "w/x.safetensors").write_text("ab")
    assert size_problems(layout, commit, files) == {"w/x.safetensors": "2 bytes, expected 5"}
    layout.marker("refs/pr/1").write_text("not json")
    assert read_marker(layout, "refs/pr/1") is None  # unreadable: staging repairs it


def test_the_metrics_say_bytes_done_and_failed() -> None:
    state = StageState("org/model", "main")
    state.update(phase="downloading", bytes_done=5, bytes_total=10, files_total=2)
    page = generate_latest(registry_for(state)).decode()
    assert 'glm53_stage_bytes{repo="org/model",revision="main"} 5.0' in page
    assert 'glm53_stage_expected_bytes{repo="org/model",revision="main"} 10.0' in page
    assert 'glm53_stage_phase{phase="downloading",repo="org/model",revision="main"} 1.0' in page
    assert 'glm53_stage_done{repo="org/model",revision="main"} 0.0' in page
    state.update(phase="failed", detail="no network")
    assert 'glm53_stage_failed{repo="org/model",revision="main"} 1.0' in generate_latest(registry_for(state)).decode()


def test_the_dashboards_staging_panels_use_only_the_stage_steps_metrics() -> None:
    dashboard = json.loads(DASHBOARD.read_text())
    panels = [p for p in dashboard["panels"] if "stage" in json.dumps(p.get("targets", []))]
    assert {p["title"] for p in panels} == {"Weights staged", "Stage step", "Staging rate"}
    names: set[str] = set()
    for panel in panels:
        for target in panel["targets"]:
            expr = target["expr"].replace("$__rate_interval", "5m")

            def visit(node: promql_parser.Expr) -> None:
                if isinstance(node, promql_parser.VectorSelector):
                    names.add(str(node.name))

            promql_parser.walk(promql_parser.parse(expr), visit)
    assert names and names <= sample_names(), sorted(names - sample_names())


def glm53(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "glm53", "stage-weights", *args], capture_output=True, text=True)


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["run"], "the following arguments are required: --repo"),
        (["run", "--repo", "r/m", "--max-workers", "0"], "expected a whole number of at least 1, got '0'"),
        (["run", "--repo", "r/m", "--reverify", "hash"], "invalid choice: 'hash'"),
        (["run", "--repo", "r/m", "--metrics-port", "70000"], "expected a port from 0 (none) to 65535, got '70000'"),
        ([], "the following arguments are required: COMMAND"),
    ],
)
def test_bad_input_gets_one_line_and_a_usage_exit(args: list[str], message: str) -> None:
    result = glm53(*args)
    assert result.returncode == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and message in lines[0], result.stderr


def test_the_status_command_is_the_probe(tmp_path: Path) -> None:
    status = tmp_path / "status.json"
    assert glm53("status", "--status-file", str(status)).returncode == EXIT_NOT_YET
    write_status(status, {"phase": "done", "line": "done: r/m@main"})
    result = glm53("status", "--status-file", str(status))
    assert (result.returncode, result.stdout.strip()) == (EXIT_DONE, "done: r/m@main")


def test_the_status_probe_imports_no_hub_client() -> None:
    """The kubelet runs it every few seconds for hours: the standard library only, as `glm53 probe` does."""
    code = "import sys, glm53.commands.stage_weights; print(sorted(m for m in sys.modules if 'hugging' in m))"
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert result.stdout.strip() == "[]"
