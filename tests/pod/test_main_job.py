"""The README's main job end to end: the CPU pod (the real LMCache server + the engine stand-in) on loopback, probed,
validated, and stopped without leftovers.

Every process the pod starts inherits a marker in its environment, so "no process left behind" is checked by looking
for that marker in /proc after the pod is gone, whatever became of the process tree. Synchronisation is by reading
the pod's own output lines and by polling with deadlines, never by sleeping.
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
import urllib.request
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from glm53.errors import Glm53Error
from glm53.pod.contract import LMCACHE_GENERATIONS
from glm53.pod.kubelet import kubelet
from glm53.pod.loopback import (
    EXIT_NOT_READY,
    RunningPod,
    free_ports,
    prepare_volumes,
    quiet,
    relocate,
    relocation_for,
    running_pod,
)
from glm53.pod.main_job import (
    PodAddresses,
    PodOptions,
    engine_and_profile,
    exporter_highlights,
    lmcache_release,
    pod_values,
    render_plans,
    require_lmcache_overlay,
    server_api_key,
    started_pod,
    totals,
    wait_pod_ready,
)
from glm53.profiles import get_profile
from tests.support.plan_edits import with_chunk_size

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


def test_lmcache_totals_sum_every_cache_salts_series() -> None:
    exposition = "\n".join(
        [
            "# TYPE lmcache_mp_lookup_hit_tokens_total counter",
            'lmcache_mp_lookup_hit_tokens_total{cache_salt="a",model_name="m"} 8064.0',
            'lmcache_mp_lookup_hit_tokens_total{cache_salt="b",model_name="m"} 1152.0',
            'lmcache_mp_lookup_hit_tokens_created{cache_salt="a",model_name="m"} 1.7e9',
            'lmcache_mp_num_finished_stores_total{device="cpu"} 12.0',
        ]
    )
    names = ("lmcache_mp_lookup_hit_tokens_total", "lmcache_mp_num_finished_stores_total")
    assert totals(exposition, names) == [
        "lmcache_mp_lookup_hit_tokens_total 9216 (sum of 2 series)",
        "lmcache_mp_num_finished_stores_total 12 (sum of 1 series)",
    ]


FLASH = get_profile("glm53-flash")


def test_the_main_job_runs_the_charts_mock_pod_with_the_real_lmcache_server() -> None:
    plans = render_plans(PodOptions(FLASH))
    sidecar, engine = plans.serving.container("lmcache"), plans.serving.container("vllm")
    assert [c.name for c in plans.serving.containers] == ["lmcache", "vllm", "exporter"]
    assert sidecar.sidecar and sidecar.served_argv[:2] == ("lmcache", "server")
    assert sidecar.option("--chunk-size") == "1152" and "--no-run-script-api-enabled" in sidecar.argv
    assert {("LMCACHE_TRACK_USAGE", "false"), ("DO_NOT_TRACK", "1")} <= set(sidecar.env)
    assert engine.served_argv[:3] == ("glm53", "mock", "vllm") and ("VLLM_SERVER_DEV_MODE", "1") in engine.env
    assert plans.test is not None and plans.test.containers[0].argv[:2] == ("glm53", "validate")


def test_the_main_jobs_values_are_an_install_not_a_second_pod() -> None:
    """Everything the main job chooses is a chart value; the fault goes through the mock's extra arguments."""
    values = pod_values(PodOptions(FLASH, fault="recovery-mismatch", values={"mock": {"l1SizeGb": 2}}))
    assert values["mock"] == {
        "enabled": True,
        "engine": "standin",
        "loadSeconds": 2,
        "vllmExtraArgs": ["--fault", "recovery-mismatch"],
        "l1SizeGb": 2,
    }
    assert values["probes"]["startup"] == {"periodSeconds": 1, "failureThreshold": 30}
    # The real engine gets 15 minutes to start and validation requests five minutes each (pod.py says why).
    real = pod_values(PodOptions(get_profile("tiny-dense"), engine="vllm", validate_args=("--runs", "8")))
    assert real["mock"]["engine"] == "vllm"
    assert real["probes"]["startup"] == {"periodSeconds": 1, "failureThreshold": 900}
    assert real["validation"]["extraArgs"] == ["--timeout", "300", "--pairs", "6", "--runs", "8"]
    engine = render_plans(PodOptions(FLASH, fault="recovery-mismatch")).serving.container("vllm")
    assert engine.argv[-2:] == ("--fault", "recovery-mismatch")


def test_the_lmcache_generation_is_one_chart_value_and_the_runner_knows_the_charts_list() -> None:
    """`glm53 pod --lmcache-generation 0.5.7rc2` is lmcache.generation (with the Secret the runner fills for its API
    key); its rendered server negotiates (no --chunk-size) and every container imports the generation's overlay."""
    schema = json.loads((Path(__file__).resolve().parents[2] / "charts/glm53/values.schema.json").read_text())
    assert tuple(schema["properties"]["lmcache"]["properties"]["generation"]["enum"]) == LMCACHE_GENERATIONS
    options = PodOptions(get_profile("tiny-hybrid"), engine="vllm", lmcache_generation="0.5.7rc2")
    assert pod_values(options)["lmcache"] == {
        "generation": "0.5.7rc2",
        "apiKey": {"secretName": "glm53-lmcache-api-key"},
    }
    plans = render_plans(options)
    sidecar = plans.serving.container("lmcache")
    assert "--chunk-size" not in sidecar.argv and "--api-key-file" in sidecar.argv
    assert lmcache_release(sidecar) == lmcache_release(plans.serving.container("vllm")) == "0.5.7rc2"
    assert plans.test is not None and "--chunk-size" not in plans.test.containers[0].argv
    default = render_plans(PodOptions(get_profile("tiny-hybrid"), engine="vllm"))
    assert "lmcache" not in pod_values(PodOptions(FLASH)) and lmcache_release(default.serving.container("lmcache")) == (
        "0.5.6"
    )


def test_the_main_job_reads_a_keyed_servers_metrics_with_the_key_the_runner_wrote(tmp_path: Path) -> None:
    plan = render_plans(PodOptions(get_profile("tiny-hybrid"), engine="vllm", lmcache_generation="0.5.7rc2")).serving
    relocation = relocation_for(plan, tmp_path)
    prepare_volumes(relocation, tmp_path)
    sidecar = relocate(plan, relocation).container("lmcache")
    written = (relocation.volumes["lmcache-api-key"] / "api-key").read_text().strip()
    assert server_api_key(sidecar) == written
    assert server_api_key(render_plans(PodOptions(FLASH)).serving.container("lmcache")) is None


def test_a_generation_without_its_overlay_is_one_line(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sys, "prefix", str(tmp_path))
    with pytest.raises(Glm53Error) as error:
        require_lmcache_overlay("0.5.7rc2")
    assert error.value.message == (
        f"--lmcache-generation 0.5.7rc2 runs lmcache 0.5.7rc2 from {tmp_path}/lmcache-0.5.7rc2, which is missing; "
        "run bash scripts/setup.d/26-lmcache-negotiating.sh"
    )
    require_lmcache_overlay("0.5.6")  # the environment's own


def glm53_pod(*args: str) -> list[str]:
    """The main job with the engine stand-in (tests/pod/test_real_engine_pod.py runs it with the real engine)."""
    return [sys.executable, "-m", "glm53", "pod", "--engine", "standin", *args]


def run_pod_cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(glm53_pod(*args), capture_output=True, text=True, timeout=240, stdin=subprocess.DEVNULL)


def lmcache_total(stdout: str, name: str) -> float:
    line = next(line for line in stdout.splitlines() if line.startswith(f"  {name} "))
    return float(line.split()[1])


@pytest.mark.parametrize(
    ("profile", "hit"),
    [
        ("glm53-flash", "LMCache hit 8064 of 8507 tokens"),  # seed 000: strict prefix at C = 1152
        ("glm53", "LMCache hit 8448 of 8507 tokens"),  # whole 256-token chunks
    ],
)
def test_main_job_passes(profile: str, hit: str, marker: str) -> None:
    result = run_pod_cli("--profile", profile)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "pod: startup probe Ready: ready: " in result.stdout
    assert hit in result.stdout
    assert "result: PASS (5 checks in " in result.stdout
    assert re.fullmatch(
        r"pod: PASS in [\d.]+ s \(LMCache server start-up [\d.]+ s; all processes stopped\)",
        result.stdout.splitlines()[-1],
    )
    assert "Traceback" not in result.stderr
    # The exporter of the running pod shows the geometry facts and that LMCache served tokens.
    exporter = {
        line.split()[0]: float(line.split()[1]) for line in result.stdout.splitlines() if line.startswith("  glm53_")
    }
    assert exporter["glm53_geometry_matches_profile"] == 1.0
    assert exporter['glm53_probe_status{status="ready"}'] == 1.0
    assert exporter['glm53_prefix_cache_hit_tokens_total{scope="external"}'] > 0
    # The real server counted the hits itself; every vLLM-side external hit is one of its lookup hits (or L-1 of one).
    served = lmcache_total(result.stdout, "lmcache_mp_lookup_hit_tokens_total")
    assert served >= exporter['glm53_prefix_cache_hit_tokens_total{scope="external"}'] > 0
    assert lmcache_total(result.stdout, "lmcache_mp_lookup_requested_tokens_total") > served
    work = result.stdout.splitlines()[1].removeprefix("pod: work dir ")
    assert not Path(work).exists(), "a passing run without --workdir/--keep removes its temporary work dir"


def test_main_job_keeps_logs_and_report_in_the_workdir(tmp_path: Path, marker: str) -> None:
    result = run_pod_cli("--workdir", str(tmp_path))
    assert result.returncode == 0, result.stdout + result.stderr
    assert {"logs", "containers", "validation.json"} <= {p.name for p in tmp_path.iterdir()}
    assert {"vllm.log", "lmcache.log"} <= {p.name for p in (tmp_path / "logs").iterdir()}
    assert "Resolved LMCache MP geometry" in (tmp_path / "logs" / "vllm.log").read_text()
    assert "loopback: ports moved to free loopback ones: 5555->" in result.stdout
    assert f"pod: logs and report kept in {tmp_path}" in result.stderr


def test_recovery_mismatch_fault_fails_with_a_strict_prefix_violation(tmp_path: Path, marker: str) -> None:
    result = run_pod_cli("--fault", "recovery-mismatch", "--workdir", str(tmp_path))
    assert result.returncode == 1, result.stdout + result.stderr
    assert (
        # the fault drops the L-1 lookup; the full-prompt rule still loads one token fewer (connector:1341-1346)
        "  - strict-prefix violation: 2303 tokens served from LMCache for a 2304-token prompt; at most 1152 may be "
        "(the last prompt token must be recomputed) — the recovery mismatch of seed 004"
    ) in result.stdout.splitlines()
    assert result.stdout.splitlines()[-1].startswith("pod: FAIL in ")


def test_corrupt_restore_fault_fails_continuations_and_mixed_while_the_counters_look_right(
    tmp_path: Path, marker: str
) -> None:
    """The stand-in restores the wrong state (what LMCache's CPU path does to a hybrid): every check that compares
    outputs names the divergence; the boundary check, which counts tokens, passes."""
    result = run_pod_cli("--fault", "corrupt-restore", "--validate", "--runs 8", "--workdir", str(tmp_path))
    assert result.returncode == 1, result.stdout + result.stderr
    out = result.stdout
    assert "boundary [pass]" in out
    for check in ("equivalence", "continuations", "mixed"):
        assert f"{check} [FAIL]" in out
    assert "  - continuations: reloaded continuations agree with their cold control on " in out
    assert "— the mixed restore of LMCache issue #4247" in out


@pytest.mark.parametrize("signum", [signal.SIGTERM])  # SIGINT takes the same path (both raise KeyboardInterrupt)
def test_interrupted_pod_leaves_no_process(signum: int, tmp_path: Path, marker: str) -> None:
    # Wait until both servers run and validation has begun.
    stderr = interrupted(glm53_pod("--workdir", str(tmp_path)), "pod: vLLM ready at ", signum, marker, 1)
    assert "glm53 pod: interrupted" in stderr.splitlines()
    assert "Traceback" not in stderr


def _sigint_at_default() -> None:
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def interrupted(command: list[str], ready: str, signum: int, marker: str, at_least: int) -> str:
    """Run `command` until it prints a line starting with `ready`, check that `at_least` marked processes run, send
    `signum`; its stderr, once it has exited 130 (the interrupt's exit status).

    The command starts with SIGINT at its default, as in a terminal's foreground: a suite launched in the background of
    a non-interactive shell (`nohup ... &`) inherits SIGINT ignored, Python keeps an inherited SIG_IGN (it installs its
    KeyboardInterrupt handler only over SIG_DFL), and the command would then rightly shrug Ctrl-C off.
    """
    process = subprocess.Popen(
        command,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        stdin=subprocess.DEVNULL,
        preexec_fn=_sigint_at_default,
    )
    assert process.stdout is not None
    seen = []
    for line in process.stdout:
        seen.append(line)
        if line.startswith(ready):
            break
    assert len(marked_processes(marker)) >= at_least, f"{' '.join(command[2:4])} started too little; output: {seen}"
    process.send_signal(signum)
    _, stderr = process.communicate(timeout=60)
    assert process.returncode == 130, stderr
    return stderr


def test_port_already_taken_is_one_line_and_never_ready(tmp_path: Path, marker: str) -> None:
    plans = render_plans(PodOptions(FLASH))
    relocation = relocation_for(plans.serving, tmp_path)
    (vllm,) = free_ports(1)
    relocation = dataclasses.replace(relocation, ports={**relocation.ports, 8000: vllm})
    with socket.socket() as squatter:
        squatter.bind(("127.0.0.1", vllm))
        squatter.listen()
        with pytest.raises(Glm53Error) as caught, running_pod(plans.serving, tmp_path, quiet, relocation) as pod:
            wait_pod_ready(pod, quiet)
    assert caught.value.exit_code == EXIT_NOT_READY
    assert caught.value.message == (
        f"vllm exited with status 1 (glm53 mock: error: cannot bind the vLLM API server to 127.0.0.1:{vllm}: Address "
        f"already in use; stop the process using it or choose another --port); see {tmp_path / 'containers/vllm.log'}"
    )


def test_wrong_chunk_size_is_refused_at_engine_start(tmp_path: Path, marker: str) -> None:
    """Released LMCache 0.5.6 on 256 for GLM-5.3-Flash: the connector refuses it, the probe says so.

    The chart refuses to render this (lmcache.chunkSize must be a multiple of 1152), so the test edits the plan: the
    same --chunk-size in the sidecar and in the engine's startup probe, as a hand-edited Deployment would have.
    """
    plans = with_chunk_size(render_plans(PodOptions(FLASH)), 256)
    with pytest.raises(Glm53Error) as caught, started_pod(plans, tmp_path, lambda _: None):
        pass
    assert caught.value.exit_code == EXIT_NOT_READY
    assert "set --chunk-size 1152" in caught.value.message
    assert "EngineCore failed to start" in (tmp_path / "logs" / "vllm.log").read_text()


@contextmanager
def started(tmp_path: Path, validation: bool = True) -> Iterator[RunningPod]:
    """The main job's pod up and Ready, stopped on leaving."""
    with started_pod(render_plans(PodOptions(FLASH, validation=validation)), tmp_path, lambda _: None) as pod:
        yield pod


def validate(pod: RunningPod, *args: str) -> subprocess.Popen[str]:
    command = [sys.executable, "-m", "glm53", "validate", "--base-url", PodAddresses.of(pod.plan).vllm, *args]
    return subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def test_dev_mode_off_is_one_line(tmp_path: Path, marker: str) -> None:
    with started(tmp_path, validation=False) as pod:
        stdout, stderr = validate(pod).communicate(timeout=60)
    assert stderr.splitlines()[-1] == (
        "glm53 validate: error: POST /reset_prefix_cache?reset_external=false answered 404: vLLM's dev mode is off; "
        "start vLLM with VLLM_SERVER_DEV_MODE=1 (validation only)"
    )
    assert stdout == ""


def test_lmcache_killed_mid_run_the_stand_in_serves_on_and_registers_again(tmp_path: Path, marker: str) -> None:
    """The sidecar dies mid-validation and the kubelet starts it again (held back 25 s): the stand-in, like vLLM with
    LMCache's connector, keeps serving in degraded mode (LMCache's own adapters), registers its KV caches with the
    new server, and validation finishes instead of hanging."""
    with started(tmp_path) as pod, kubelet(pod, lambda _: None) as loop:
        run = validate(pod, "--checks", "equivalence,boundary", "--runs", "8", "--timeout", "60")
        assert run.stderr is not None
        seen: list[str] = []
        for line in run.stderr:
            seen.append(line)
            if line.startswith("equivalence: cold run 1/8"):
                os.killpg(pod.process("lmcache").process.pid, signal.SIGKILL)
                break
        else:
            pytest.fail(f"validation ended before its first cold run: {''.join(seen)[-2000:]}")
        run.communicate(timeout=600)
        vllm_log = tmp_path / "logs" / "vllm.log"
        deadline = time.monotonic() + 240  # the restart is held 25 s, then the server starts (up to a minute here)
        while "Finished re-registering KV caches" not in vllm_log.read_text() and time.monotonic() < deadline:
            time.sleep(1)
        assert pod.process("vllm").process.poll() is None  # the engine never exited
        health = urllib.request.urlopen(f"{PodAddresses.of(pod.plan).vllm}/health", timeout=10)
        assert health.status == 200
        assert [e.container for e in loop.restarts] == ["lmcache"]
    text = vllm_log.read_text()
    assert "LMCache server is unhealthy" in text and "Finished re-registering KV caches" in text
    assert "holding 25 s" in (tmp_path / "logs" / "lmcache.log").read_text()


@pytest.mark.parametrize(
    ("engine", "profile", "fault", "expected"),
    [
        (None, None, None, ("vllm", "tiny-dense")),
        ("standin", None, None, ("standin", "glm53-flash")),
        (None, None, "recovery-mismatch", ("standin", "glm53-flash")),
        ("vllm", None, None, ("vllm", "tiny-dense")),
        (None, "tiny-hybrid", None, ("vllm", "tiny-hybrid")),
        (None, "glm53", None, ("standin", "glm53")),
        (None, "tiny-dense", "recovery-mismatch", ("standin", "tiny-dense")),
        ("standin", "tiny-dense", None, ("standin", "tiny-dense")),
    ],
)
def test_engine_and_profile_default_from_each_other(
    engine: str | None, profile: str | None, fault: str | None, expected: tuple[str, str]
) -> None:
    chosen, chosen_profile = engine_and_profile(engine, profile, fault)
    assert (chosen, chosen_profile.name) == expected


def test_a_real_engine_for_a_glm_profile_or_with_a_fault_is_refused_in_one_line() -> None:
    with pytest.raises(Glm53Error) as error:
        engine_and_profile("vllm", "glm53", None)
    assert error.value.message == (
        "--engine vllm runs the real engine on a tiny CPU test model, which profile glm53 has none of (its weights "
        "and geometry need H200s); use --engine standin, or a profile with one: tiny-dense, tiny-hybrid"
    )
    with pytest.raises(Glm53Error) as error:
        engine_and_profile("vllm", "tiny-dense", "recovery-mismatch")
    assert error.value.message == "--fault recovery-mismatch is injected by the engine stand-in; add --engine standin"
