"""The README's main job end to end: the CPU-mock pod on loopback, probed, validated, and stopped without leftovers.

Every process the pod starts inherits a marker in its environment, so "no process left behind" is checked by looking
for that marker in /proc after the pod is gone, whatever became of the process tree. Synchronisation is by reading
the pod's own output lines and by polling with deadlines, never by sleeping.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from glm53.errors import Glm53Error
from glm53.pod import (
    EXIT_NOT_READY,
    PodPorts,
    PodSpec,
    RunningPod,
    exporter_highlights,
    free_ports,
    run_pod,
    running_pod,
    wait_ready,
)
from glm53.pod import wait_startup_probe as probe_until_ready
from glm53.profiles import get_profile
from glm53.validate.progress import SilentProgress

MARKER = "GLM53_POD_TEST_MARKER"
pytestmark = pytest.mark.slow


@pytest.fixture
def marker(monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    """A marker the processes started by this test inherit; after the test none of them may still run."""
    value = uuid.uuid4().hex
    monkeypatch.setenv(MARKER, value)
    yield value
    assert_no_process_left(value)


def marked_processes(value: str) -> list[int]:
    needle = f"{MARKER}={value}".encode()
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            if needle in (entry / "environ").read_bytes().split(b"\0"):
                found.append(int(entry.name))
        except OSError:
            continue  # exited meanwhile, or a zombie
    return found


def assert_no_process_left(value: str, deadline_seconds: float = 10.0) -> None:
    """SIGKILLed processes need a moment to die: poll until none is left, fail after the deadline."""
    deadline = time.monotonic() + deadline_seconds
    while (left := marked_processes(value)) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not left, f"processes left behind: {left}"


def test_exporter_highlights_keep_only_the_facts_an_operator_opens_first() -> None:
    exposition = "\n".join(
        [
            "# HELP glm53_geometry_matches_profile 1 when the geometry matches",
            "glm53_geometry_matches_profile 1.0",
            'glm53_log_read_bytes_total{log="vllm.log"} 2048.0',
            'glm53_prefix_cache_hit_ratio{scope="external"} 0.45',
            "lmcache_mp_l1_memory_usage_bytes 1.0",
        ]
    )
    assert exporter_highlights(exposition) == [
        "glm53_geometry_matches_profile 1.0",
        'glm53_prefix_cache_hit_ratio{scope="external"} 0.45',
    ]


def glm53_pod(*args: str) -> list[str]:
    return [sys.executable, "-m", "glm53", "pod", *args]


def run_pod_cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(glm53_pod(*args), capture_output=True, text=True, timeout=150, stdin=subprocess.DEVNULL)


@pytest.mark.parametrize(
    ("profile", "generation", "hit"),
    [
        ("glm53-flash", "released", "LMCache hit 8064 of 8507 tokens"),  # seed 000: strict prefix at C = 1152
        ("glm53-flash", "negotiating", "LMCache hit 8064 of 8507 tokens"),  # negotiated 256 -> 1152
        ("glm53", "released", "LMCache hit 8448 of 8507 tokens"),  # whole 256-token chunks
        ("glm53", "negotiating", "LMCache hit 8448 of 8507 tokens"),
    ],
)
def test_main_job_passes(profile: str, generation: str, hit: str, marker: str) -> None:
    result = run_pod_cli("--profile", profile, "--generation", generation)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "pod: startup probe Ready: ready: " in result.stdout
    assert hit in result.stdout
    assert "result: PASS (3 checks in " in result.stdout
    assert result.stdout.splitlines()[-1].startswith("pod: PASS in ")
    assert "Traceback" not in result.stderr
    # The exporter of the running pod shows the geometry facts and that LMCache served tokens.
    exporter = {
        line.split()[0]: float(line.split()[1]) for line in result.stdout.splitlines() if line.startswith("  glm53_")
    }
    assert exporter["glm53_geometry_matches_profile"] == 1.0
    assert exporter['glm53_probe_status{status="ready"}'] == 1.0
    assert exporter['glm53_prefix_cache_hit_tokens_total{scope="external"}'] > 0
    work = result.stdout.splitlines()[1].removeprefix("pod: work dir ")
    assert not Path(work).exists(), "a passing run without --workdir/--keep removes its temporary work dir"


def test_main_job_keeps_logs_and_report_in_the_workdir(tmp_path: Path, marker: str) -> None:
    result = run_pod_cli("--workdir", str(tmp_path))
    assert result.returncode == 0, result.stdout + result.stderr
    assert {"vllm.log", "lmcache.log", "validation.json"} <= {p.name for p in tmp_path.iterdir()}
    assert "Resolved LMCache MP geometry" in (tmp_path / "vllm.log").read_text()
    assert f"pod: logs and report kept in {tmp_path}" in result.stderr


def test_recovery_mismatch_fault_fails_with_a_strict_prefix_violation(tmp_path: Path, marker: str) -> None:
    result = run_pod_cli("--fault", "recovery-mismatch", "--workdir", str(tmp_path))
    assert result.returncode == 1, result.stdout + result.stderr
    assert (
        "  - strict-prefix violation: 2304 tokens served from LMCache for a 2304-token prompt; at most 1152 may be "
        "(the last prompt token must be recomputed) — the recovery mismatch of seed 004"
    ) in result.stdout.splitlines()
    assert result.stdout.splitlines()[-1].startswith("pod: FAIL in ")


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM])
def test_interrupted_pod_leaves_no_process(signum: int, tmp_path: Path, marker: str) -> None:
    pod = subprocess.Popen(
        glm53_pod("--workdir", str(tmp_path)),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        stdin=subprocess.DEVNULL,
    )
    assert pod.stdout is not None
    seen = []
    for line in pod.stdout:  # wait until both servers run and validation has begun
        seen.append(line)
        if line.startswith("pod: vLLM ready at "):
            break
    assert marked_processes(marker), f"the pod started nothing; output: {seen}"
    pod.send_signal(signum)
    _, stderr = pod.communicate(timeout=60)
    assert pod.returncode == 130, stderr
    assert "glm53 pod: interrupted" in stderr.splitlines()
    assert "Traceback" not in stderr


def spec_for(tmp_path: Path, *, dev_mode: bool = True, chunk_size_override: int | None = None) -> PodSpec:
    return PodSpec(
        get_profile("glm53-flash"),
        tmp_path,
        PodPorts.free(),
        dev_mode=dev_mode,
        chunk_size_override=chunk_size_override,
    )


def test_port_already_taken_is_one_line_and_never_ready(tmp_path: Path, marker: str) -> None:
    vllm, lmcache, http, metrics, exporter = free_ports(5)
    with socket.socket() as squatter:
        squatter.bind(("127.0.0.1", vllm))
        squatter.listen()
        spec = PodSpec(get_profile("glm53-flash"), tmp_path, PodPorts(vllm, lmcache, http, metrics, exporter))
        with pytest.raises(Glm53Error) as caught:
            run_pod(spec, lambda _: None, SilentProgress())
    assert caught.value.exit_code == EXIT_NOT_READY
    assert caught.value.message == (
        f"vllm exited with status 1 (glm53 mock: error: cannot bind the vLLM API server to 127.0.0.1:{vllm}: Address "
        f"already in use; stop the process using it or choose another --port); see {tmp_path / 'vllm.log'}"
    )


def test_wrong_chunk_size_is_refused_by_the_startup_probe(tmp_path: Path, marker: str) -> None:
    """Released LMCache 0.5.6 with the default 256 for GLM-5.3-Flash: the connector refuses it, the probe says so."""
    with pytest.raises(Glm53Error) as caught:
        run_pod(spec_for(tmp_path, chunk_size_override=256), lambda _: None, SilentProgress())
    assert caught.value.exit_code == EXIT_NOT_READY
    assert caught.value.message.startswith("the startup probe failed: wrong: ")
    assert "set --chunk-size 1152 on the LMCache server" in caught.value.message


@contextmanager
def started(spec: PodSpec) -> Iterator[RunningPod]:
    """The pod up and Ready, stopped on leaving."""
    with running_pod(spec, lambda _: None) as pod:
        probe_until_ready(pod, lambda _: None)
        wait_ready(pod)
        yield pod


def validate(pod: RunningPod, *args: str) -> subprocess.Popen[str]:
    command = [sys.executable, "-m", "glm53", "validate", "--base-url", pod.spec.vllm_url, *args]
    return subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def test_dev_mode_off_is_one_line(tmp_path: Path, marker: str) -> None:
    with started(spec_for(tmp_path, dev_mode=False)) as pod:
        stdout, stderr = validate(pod).communicate(timeout=60)
    assert stderr.splitlines()[-1] == (
        "glm53 validate: error: POST /reset_prefix_cache?reset_external=false answered 404: vLLM's dev mode is off; "
        "start vLLM with VLLM_SERVER_DEV_MODE=1 (validation only)"
    )
    assert stdout == ""


def test_lmcache_killed_mid_run_fails_clearly_without_hanging(tmp_path: Path, marker: str) -> None:
    with started(spec_for(tmp_path)) as pod:
        run = validate(pod, "--checks", "equivalence,boundary", "--runs", "4", "--timeout", "20")
        assert run.stderr is not None
        for line in run.stderr:
            if line.startswith("equivalence: cold run 1/4"):
                os.killpg(pod.process("lmcache").process.pid, signal.SIGKILL)
                break
        stdout, _ = run.communicate(timeout=120)
    assert run.returncode == 1, stdout
    lines = stdout.splitlines()
    assert "result: FAIL (2 checks in " in lines[-3]
    assert lines[-2] == (
        "  - 4 of 4 runs after the prefix-cache reset got no LMCache hit; the cache is not paying off (check the "
        "connector's kv-transfer-config and the LMCache server)"
    )
    assert lines[-1] == (
        "  - LMCache served nothing for any of the 7 prompts that span a whole 1152-token chunk; the cache is not "
        "paying off (is the LMCache server up and the connector pointed at it?)"
    )
