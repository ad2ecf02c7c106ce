"""`glm53 stage-weights run` with the real huggingface_hub client (2.4.0) against the hub stand-in on loopback, serving
the tiny dense model `glm53 tiny-model` made: it stages and verifies, resumes a file after a SIGKILL with a Range
request, finds a truncated or corrupted file and fetches it again, ends a missing network, token or revision in one
line, keeps retrying in resident mode (its probe saying why) until the fault is fixed, and never downloads again once
its marker is there. Each run is a subprocess, as in the container.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

from glm53.pod.loopback import free_ports
from glm53.staging.layout import read_marker
from glm53.staging.status import EXIT_DONE, EXIT_FAILED, EXIT_NOT_YET, read_status
from glm53.testing.hub_standin import HostedRepo, HubStandIn
from tests.support.stagekit import REPO, WEIGHTS, layout, one_line, same_files, stage, start, wait_for

# The tiny model and the hub stand-in serving it (fixtures `tiny_dense`, `hosted`, `hub`), shared with the pod test.
pytest_plugins = ["tests.support.stagekit"]


def snapshot(cache: Path, hosted: HostedRepo) -> Path:
    return layout(cache).snapshot(hosted.commit)


def weights_blob(cache: Path, hosted: HostedRepo) -> Path:
    sha256 = hosted.files[WEIGHTS].sha256
    assert sha256 is not None
    return layout(cache).blob(sha256)


def stage_ok(cache: Path, endpoint: str, *extra: str) -> subprocess.CompletedProcess[str]:
    """A stage run that must succeed; its output is the failure message."""
    result = stage(cache, endpoint, *extra)
    assert result.returncode == 0, result.stdout + result.stderr
    return result


@pytest.fixture
def staged(hub: HubStandIn, tmp_path: Path) -> Path:
    """A cache the stage step has filled once from `hub`: where every restart and repair case starts."""
    cache = tmp_path / "hub"
    assert stage(cache, hub.endpoint).returncode == 0
    return cache


def test_the_real_client_stages_verifies_and_marks_the_tiny_model(
    hub: HubStandIn, hosted: HostedRepo, tiny_dense: Path, tmp_path: Path
) -> None:
    cache = tmp_path / "hub"
    result = stage_ok(cache, hub.endpoint)
    assert f"done: {REPO}@main (commit {hosted.commit[:12]}): 6 files" in result.stdout
    assert "verified 6.52 MiB" in result.stdout
    folder = snapshot(cache, hosted)
    assert sorted(p.name for p in folder.iterdir()) == sorted(hosted.files)
    assert same_files(tiny_dense, folder)  # the staged bytes are the model `glm53 tiny-model` made
    assert layout(cache).ref("main").read_text() == hosted.commit
    marker = read_marker(layout(cache), "main")
    assert marker is not None and marker.commit == hosted.commit and len(marker.files) == len(hosted.files)
    assert {f.path: f.algorithm for f in marker.files}[WEIGHTS] == "sha256"
    # Every byte came once, and the LFS file from the CDN (the hub redirected there).
    assert hub.served.content_bytes == {f.path: f.size for f in hosted.files.values()}
    assert any(path.startswith("/lfs/") for _, path, _ in hub.served.requests)
    # The client's own checks agree: its checksum verification against the hub, and its offline snapshot lookup.
    probe = (
        "import sys; from huggingface_hub import HfApi, snapshot_download\n"
        f"v = HfApi(endpoint={hub.endpoint!r}, token=False).verify_repo_checksums({REPO!r}, cache_dir={str(cache)!r})\n"
        "assert v.checked_count == 6 and not (v.mismatches or v.missing_paths), v\n"
        f"print(snapshot_download({REPO!r}, cache_dir={str(cache)!r}, local_files_only=True))\n"
    )
    check = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=60)
    assert check.returncode == 0, check.stderr
    assert check.stdout.strip() == str(folder)


def test_a_restart_with_the_marker_downloads_nothing_even_without_the_hub(hub: HubStandIn, staged: Path) -> None:
    cache = staged
    requests = len(hub.served.requests)
    (port,) = free_ports(1)  # nothing listens there: a rolling update with the hub out of reach
    again = stage_ok(cache, f"http://127.0.0.1:{port}")
    assert "checked (sizes) against the completion marker" in again.stdout and "nothing downloaded" in again.stdout
    assert len(hub.served.requests) == requests
    full = stage(cache, hub.endpoint, "--reverify", "full")
    assert full.returncode == 0 and "hashed again" in full.stdout, full.stdout
    assert len(hub.served.requests) == requests


def test_a_sigkill_mid_file_resumes_with_a_range_request(
    hub: HubStandIn, hosted: HostedRepo, tiny_dense: Path, tmp_path: Path
) -> None:
    cache = tmp_path / "hub"
    hub.faults.throttle_bytes_per_s = 1024 * 1024  # 6.3 MiB of weights: several seconds, so the kill lands inside
    blob = weights_blob(cache, hosted)
    partial = blob.with_name(blob.name + ".partial")
    first = start(cache, hub.endpoint, log=tmp_path / "first.log")
    try:
        wait_for("a partial file of at least 2 MiB", lambda: partial.exists() and partial.stat().st_size >= 2 << 20)
    finally:
        first.send_signal(signal.SIGKILL)
        first.wait()
    kept = partial.stat().st_size
    size = hosted.files[WEIGHTS].size
    assert 0 < kept < size and not blob.exists()
    hub.faults.throttle_bytes_per_s = None
    result = stage_ok(cache, hub.endpoint)
    assert f"{WEIGHTS}: resuming after" in result.stdout
    path = f"/lfs/{hosted.files[WEIGHTS].sha256}"
    assert hub.served.ranges(path)[-1] == f"bytes={kept}-"  # the real client's Range, from where the kill left it
    assert hub.served.by_range[(WEIGHTS, f"bytes={kept}-")] == size - kept  # only the rest was sent again
    assert not partial.exists() and same_files(tiny_dense, snapshot(cache, hosted))


def test_a_truncated_file_is_found_by_its_size_and_resumed(
    hub: HubStandIn, hosted: HostedRepo, tiny_dense: Path, staged: Path
) -> None:
    cache = staged
    blob = weights_blob(cache, hosted)
    half = blob.stat().st_size // 2
    os.truncate(blob, half)
    result = stage_ok(cache, hub.endpoint)
    assert f"1 of 6 staged files no longer match the completion marker: {WEIGHTS} ({half} bytes" in result.stdout
    assert hub.served.ranges(f"/lfs/{hosted.files[WEIGHTS].sha256}")[-1] == f"bytes={half}-"
    assert "verified 6.26 MiB" in result.stdout  # only the file that changed is hashed again
    assert same_files(tiny_dense, snapshot(cache, hosted))


def test_a_deleted_snapshot_link_is_relinked_without_a_download(
    hub: HubStandIn, hosted: HostedRepo, tiny_dense: Path, staged: Path
) -> None:
    cache = staged
    layout(cache).pointer(hosted.commit, WEIGHTS).unlink()  # the blob stays
    served = dict(hub.served.content_bytes)
    result = stage_ok(cache, hub.endpoint)
    assert f"no longer match the completion marker: {WEIGHTS} (missing)" in result.stdout
    assert hub.served.content_bytes == served and "downloaded 0 B" in result.stdout
    assert same_files(tiny_dense, snapshot(cache, hosted))


def test_a_corrupted_file_is_found_by_its_hash_and_fetched_again(
    hub: HubStandIn, hosted: HostedRepo, tiny_dense: Path, staged: Path
) -> None:
    cache = staged
    blob = weights_blob(cache, hosted)
    data = bytearray(blob.read_bytes())
    data[len(data) // 3] ^= 0x01  # one bit, same size: only a hash sees it
    blob.write_bytes(bytes(data))
    served_before = hub.served.content_bytes[WEIGHTS]
    result = stage_ok(cache, hub.endpoint, "--reverify", "full")
    expected = hosted.files[WEIGHTS].sha256
    assert expected is not None
    assert f"{WEIGHTS} (sha256 " in result.stdout and f"the hub lists {expected[:12]}): deleting it" in result.stdout
    assert hub.served.content_bytes[WEIGHTS] - served_before == hosted.files[WEIGHTS].size  # the whole file again
    assert same_files(tiny_dense, snapshot(cache, hosted))


def test_an_engine_downloaded_cache_is_adopted_by_hashing_not_downloading(
    hub: HubStandIn, hosted: HostedRepo, tiny_dense: Path, tmp_path: Path
) -> None:
    """A volume the engine filled itself before this chart version: the client's own snapshot_download, no marker."""
    cache = tmp_path / "hub"
    fill = f"from huggingface_hub import snapshot_download; snapshot_download({REPO!r}, cache_dir={str(cache)!r})"
    env = {**os.environ, "HF_ENDPOINT": hub.endpoint, "HF_HUB_DISABLE_PROGRESS_BARS": "1"}
    subprocess.run([sys.executable, "-c", fill], check=True, env=env, timeout=60, capture_output=True)
    served = dict(hub.served.content_bytes)
    result = stage_ok(cache, hub.endpoint)
    assert hub.served.content_bytes == served  # nothing fetched again
    assert "downloaded 0 B" in result.stdout and "verified 6.52 MiB" in result.stdout
    assert read_marker(layout(cache), "main") is not None


def test_two_stage_steps_on_one_shared_volume_fetch_each_file_once(
    hub: HubStandIn, hosted: HostedRepo, tiny_dense: Path, tmp_path: Path
) -> None:
    """Replicas sharing a ReadWriteMany claim: the client's per-blob lock makes them split the work, not repeat it."""
    cache = tmp_path / "hub"
    hub.faults.throttle_bytes_per_s = 8 * 1024 * 1024
    runs = [start(cache, hub.endpoint, log=tmp_path / f"replica-{i}.log") for i in range(2)]
    assert [run.wait(timeout=120) for run in runs] == [0, 0]
    assert hub.served.content_bytes == {f.path: f.size for f in hosted.files.values()}
    assert same_files(tiny_dense, snapshot(cache, hosted))


def test_a_hub_serving_corrupt_bytes_ends_in_one_line_without_a_marker(
    hub: HubStandIn, hosted: HostedRepo, tiny_dense: Path, tmp_path: Path
) -> None:
    cache = tmp_path / "hub"
    hub.faults.corrupt.add(WEIGHTS)
    result = stage(cache, hub.endpoint)
    assert result.returncode == 1
    line = one_line(result.stderr)
    assert line.startswith(
        f"glm53 stage-weights: error: {WEIGHTS} of {REPO}@{hosted.commit[:12]} still does not match what the hub lists "
        "after 2 more downloads (sha256 "
    ), line
    assert read_marker(layout(cache), "main") is None
    assert hub.served.content_bytes[WEIGHTS] == 3 * hosted.files[WEIGHTS].size


def test_no_network_ends_in_one_line(tmp_path: Path) -> None:
    (port,) = free_ports(1)
    result = stage(tmp_path / "hub", f"http://127.0.0.1:{port}")
    assert result.returncode == 1
    assert one_line(result.stderr) == (
        f"glm53 stage-weights: error: cannot reach the hub at http://127.0.0.1:{port} to stage {REPO}@main "
        "(ConnectError: [Errno 111] Connection refused), and the weights volume holds no complete copy of it; allow "
        "the pod's egress to the hub (a NetworkPolicy, or HTTPS_PROXY in weights.staging.extraEnv), or set "
        "weights.staging.endpoint to a mirror"
    )


def test_a_gated_repository_needs_a_granted_token(hosted: HostedRepo, tmp_path: Path) -> None:
    gated = HostedRepo(hosted.repo_id, hosted.commit, hosted.files, gated=True)
    good, bad = tmp_path / "good", tmp_path / "bad"
    good.write_text("hf_granted\n")
    bad.write_text("hf_other\n")
    with HubStandIn([gated], tokens=["hf_granted"]) as hub:
        missing = stage(tmp_path / "a", hub.endpoint)
        assert missing.returncode == 1
        assert one_line(missing.stderr) == (
            f"glm53 stage-weights: error: {REPO} is a gated repository and the hub at {hub.endpoint} refused it "
            "without a token (HTTP 401 GatedRepo); accept the model's terms on the hub, put a read token in a Secret "
            "and name it in weights.hfTokenSecret.name"
        )
        refused = stage(tmp_path / "b", hub.endpoint, "--token-file", str(bad))
        assert "(HTTP 403 GatedRepo): its account has not been granted access" in one_line(refused.stderr)
        absent = stage(tmp_path / "c", hub.endpoint, "--token-file", str(tmp_path / "nowhere"))
        assert f"no token file at {tmp_path / 'nowhere'}: the Secret named in weights.hfTokenSecret.name" in (
            one_line(absent.stderr)
        )
        granted = stage(tmp_path / "d", hub.endpoint, "--token-file", str(good))
        assert granted.returncode == 0, granted.stderr
        # The token went to the hub only: the CDN (another origin) gets none, as the client sends none to a CDN.
        assert any(path.startswith("/api/") for path in hub.served.with_token)
        assert [path for _, path, _ in hub.served.requests if path.startswith("/lfs/")]
        assert not [path for path in hub.served.with_token if path.startswith("/lfs/")]


def test_a_revision_the_repository_lacks_ends_in_one_line(hub: HubStandIn, tmp_path: Path) -> None:
    result = stage(tmp_path / "hub", hub.endpoint, "--revision", "v9")
    assert one_line(result.stderr) == (
        f"glm53 stage-weights: error: {REPO} has no revision 'v9' on the hub at {hub.endpoint} (HTTP 404 "
        "RevisionNotFound); set weights.revision to a branch, tag or commit of it"
    )


def test_a_pinned_commit_is_staged_and_resolves_offline(hub: HubStandIn, hosted: HostedRepo, tmp_path: Path) -> None:
    cache = tmp_path / "hub"
    result = stage(cache, hub.endpoint, "--revision", hosted.commit)
    assert result.returncode == 0, result.stderr
    assert not layout(cache).ref("main").exists()  # a commit needs no ref: the engine gets --revision <commit>
    assert read_marker(layout(cache), hosted.commit) is not None


def _scrape(port: int) -> str:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as response:
        return str(response.read().decode())


def _sample(page: str, name: str) -> float:
    values = [float(line.rsplit(" ", 1)[1]) for line in page.splitlines() if line.startswith(name + "{")]
    assert len(values) == 1, (name, page)
    return values[0]


@pytest.mark.slow
def test_resident_mode_retries_instead_of_crash_looping_and_its_probe_says_why(
    hosted: HostedRepo, tmp_path: Path
) -> None:
    """The chart's container: no hub at first (its probe and metrics say so, the process stays up), then the hub comes
    up on that address and the next attempt stages; SIGTERM ends it at once."""
    hub_port, metrics_port = free_ports(2)
    status = tmp_path / "status.json"
    args = ["--keep-running", "--status-file", str(status), "--metrics-port", str(metrics_port)]
    process = start(tmp_path / "hub", f"http://127.0.0.1:{hub_port}", *args, log=tmp_path / "stage.log")
    try:
        wait_for("a failed attempt", lambda: read_status(status)[0] == EXIT_FAILED, timeout=30)
        code, line = read_status(status)
        assert line.startswith(f"failed: cannot reach the hub at http://127.0.0.1:{hub_port} to stage {REPO}@main")
        assert line.endswith("(retrying by itself; see `kubectl logs -c stage-weights`)")
        assert process.poll() is None  # still running: no restart, no CrashLoopBackOff
        page = _scrape(metrics_port)
        assert _sample(page, "glm53_stage_failed") == 1 and _sample(page, "glm53_stage_done") == 0
        with HubStandIn([hosted], port=hub_port):
            wait_for("the retry to stage", lambda: read_status(status)[0] == EXIT_DONE, timeout=60)
        page = _scrape(metrics_port)
        assert _sample(page, "glm53_stage_done") == 1 and _sample(page, "glm53_stage_failed") == 0
        assert _sample(page, "glm53_stage_bytes") == hosted.total_bytes
        assert _sample(page, "glm53_stage_attempts_total") == 2
        assert process.poll() is None  # staying up to serve its status and metrics
    finally:
        started = time.monotonic()
        process.send_signal(signal.SIGTERM)
        code = process.wait(timeout=10)
    assert code == 0 and time.monotonic() - started < 5
    log = (tmp_path / "stage.log").read_text()
    assert "trying again in 10 s (attempt 1)" in log and "staying up to serve its status and metrics" in log


def test_progress_lines_name_bytes_files_rate_and_eta(hub: HubStandIn, hosted: HostedRepo, tmp_path: Path) -> None:
    hub.faults.throttle_bytes_per_s = 2 * 1024 * 1024
    status = tmp_path / "status.json"
    process = start(tmp_path / "hub", hub.endpoint, "--status-file", str(status), log=tmp_path / "stage.log")
    seen: list[tuple[int, str]] = []

    def downloading() -> bool:
        seen.append(read_status(status))
        return "MiB/s, ETA" in seen[-1][1]

    wait_for("a progress line with a rate", downloading, timeout=30)
    assert process.wait(timeout=60) == 0
    code, line = seen[-1]
    assert code == EXIT_NOT_YET
    assert line.startswith(f"downloading {REPO}@main (commit {hosted.commit[:12]}): ")
    assert " of 6.52 MiB (" in line and " of 6 files downloaded, " in line
    log = (tmp_path / "stage.log").read_text()
    assert "MiB/s, ETA " in log and read_status(status)[0] == EXIT_DONE
