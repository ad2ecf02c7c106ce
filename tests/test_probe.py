"""The startup probe: a verdict per scenario for both profiles, every failure mode's message, and the real CLI."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from glm53.logparse import parse_lines
from glm53.probe import EXIT_NOT_YET, EXIT_READY, EXIT_WRONG, StartupFacts, Status, Verdict, evaluate
from glm53.profiles import LMCACHE_DEFAULT_CHUNK_SIZE, get_profile

REPO = Path(__file__).resolve().parents[1]
EXAMPLES = REPO / "examples" / "logs"
FIXTURES = Path(__file__).parent / "fixtures" / "logs"
FLASH = get_profile("glm53-flash")
GLM53 = get_profile("glm53")


def block_line(n: int, process: str = "APIServer pid=1") -> str:
    return (
        f"({process}) INFO 11-29 07:00:01 [config.py:228] Setting attention block size to {n} tokens to ensure that "
        "attention page size is >= mamba page size."
    )


def geometry_line(rank: int, groups: list[int], sched: int, model: str = "zai-org/GLM-5.3-Flash") -> str:
    return (
        f"(Worker_TP{rank} pid={53 + rank}) INFO 11-29 07:00:02 [lmcache_mp_connector.py:668] Resolved LMCache MP "
        f"geometry: group_tokens_per_block={groups}, scheduler_block_size={sched}, cache_model_name={model}"
    )


def negotiated_line(resolved: int, configured_min: int, alignment: int) -> str:
    return (
        f"[2026-11-29 07:00:03,123] LMCache INFO: Negotiated LMCache MP chunk size to {resolved} "
        f"(configured_min={configured_min}, required_alignment={alignment}) "
        "(server.py:211:lmcache.v1.multiprocess.server)"
    )


def flash_lines(n: int = 1152, tp: int = 4) -> list[str]:
    return [block_line(n)] + [geometry_line(rank, [n] * 5 + [0], n) for rank in range(tp)]


def verdict(
    lines: list[str],
    profile_name: str = "glm53-flash",
    tp: int | None = None,
    chunk: int = LMCACHE_DEFAULT_CHUNK_SIZE,
    bytes_read: int = 1000,
) -> Verdict:
    profile = get_profile(profile_name)
    facts = StartupFacts()
    facts.add_all(parse_lines(lines))
    return evaluate(profile, tp or profile.tensor_parallel_size, chunk, facts, bytes_read)


def test_flash_ready_with_the_chunk_size_passed_explicitly() -> None:
    result = verdict(flash_lines(), chunk=1152)
    assert result == Verdict(
        Status.READY,
        EXIT_READY,
        "ready: GLM-5.3-Flash geometry [1152, 1152, 1152, 1152, 1152, 0] on all 4 TP ranks, scheduler_block_size "
        "1152, chunk size 1152 (configured; no negotiation logged) is a multiple of 1152; N = 1152 as recorded for "
        "TP 4",
    )


def test_flash_ready_when_a_negotiating_server_rounded_256_up() -> None:
    result = verdict([*flash_lines(), negotiated_line(1152, 256, 1152)])
    assert result.status is Status.READY
    assert "chunk size 1152 (negotiated from 256)" in result.message


def test_flash_at_tp8_accepts_a_consistent_n_but_says_it_was_not_validated() -> None:
    result = verdict(flash_lines(2304, tp=8), tp=8, chunk=2304)
    assert result.exit_code == EXIT_READY
    assert result.message.endswith("N = 2304 was not validated at TP 8 (recorded for TP 4 only)")


def test_glm53_ready_at_256_without_a_negotiated_line() -> None:
    lines = [geometry_line(rank, [64], 64, "zai-org/GLM-5.3") for rank in range(8)]
    result = verdict(lines, "glm53")
    assert result.status is Status.READY
    assert result.message == (
        "ready: GLM-5.3 geometry [64] on all 8 TP ranks, scheduler_block_size 64, chunk size 256 (configured; no "
        "negotiation logged) is a multiple of 64"
    )


def test_glm53_at_another_tp_size_says_so() -> None:
    result = verdict([geometry_line(rank, [64], 64) for rank in range(4)], "glm53", tp=4)
    assert result.status is Status.READY
    assert result.message.endswith("TP 4 was not validated (validated at TP 8)")


def test_seed_literal_lines_are_ready() -> None:
    lines = (FIXTURES / "seed-flash.log").read_text().splitlines()
    result = verdict(lines)
    assert result.status is Status.READY
    assert "logged by undecorated" in result.message


@pytest.mark.parametrize(
    ("lines", "profile_name", "message"),
    [
        (
            [],
            "glm53-flash",
            "not yet: vLLM is still loading: waiting for vLLM's 'Setting attention block size' line and the "
            "connector's 'Resolved LMCache MP geometry' line; read 1000 bytes of log so far",
        ),
        (
            [block_line(1152)],
            "glm53-flash",
            "not yet: vLLM is still loading: waiting for the connector's 'Resolved LMCache MP geometry' line; read "
            "1000 bytes of log so far",
        ),
        (
            ["Resolved LMCache MP geometry: group_tokens_per_block=[...], scheduler_block_size=..."],
            "glm53",
            "not yet: vLLM is still loading: waiting for the connector's 'Resolved LMCache MP geometry' line; read "
            "1000 bytes of log so far; 1 fact line(s) could not be parsed (last: geometry: Resolved LMCache MP "
            "geometry: group_tokens_per_block=[...], scheduler_block_size=...)",
        ),
        (
            flash_lines()[:3],
            "glm53-flash",
            "not yet: 2 of 4 TP ranks logged their geometry; waiting for the 'Resolved LMCache MP geometry' line of "
            "TP2, TP3 after reading 1000 bytes of log",
        ),
    ],
)
def test_not_yet(lines: list[str], profile_name: str, message: str) -> None:
    result = verdict(lines, profile_name, chunk=1152)
    assert (result.status, result.exit_code, result.message) == (Status.NOT_YET, EXIT_NOT_YET, message)


REFUSAL = (
    "(Worker_TP0 pid=53) ERROR 11-29 07:00:03 [multiproc_executor.py:751] ValueError: LMCache chunk size 256 must be "
    "a multiple of engine group 0 tokens_per_block 1152"
)
UNREACHABLE = (
    "(Worker_TP1 pid=54) ERROR 11-29 07:00:03 [adapter.py:316] Cannot reach the LMCache MP server at "
    "'tcp://127.0.0.1:5555' within 30.0s."
)
DEATH = "(EngineCore_DP0 pid=41) ERROR 11-29 07:00:04 [core.py:797] EngineCore failed to start."


@pytest.mark.parametrize(
    ("lines", "chunk", "message"),
    [
        (
            [*flash_lines(), REFUSAL, DEATH],
            256,
            "wrong: the LMCache connector (Worker_TP0) refused the chunk size: expected a multiple of 1152, found 256; "
            "set --chunk-size 1152 on the LMCache server (the released LMCache 0.5.6 does not negotiate it)",
        ),
        (
            [*flash_lines(), UNREACHABLE, DEATH],
            1152,
            "wrong: vLLM (Worker_TP1) cannot reach the LMCache MP server at 'tcp://127.0.0.1:5555'; expected the "
            "lmcache sidecar listening there: check that it runs and that lmcache.mp.host / lmcache.mp.port in "
            "--kv-transfer-config match its --host / --port",
        ),
        (
            [block_line(1152), DEATH, "(APIServer pid=1) RuntimeError: Engine core initialization failed."],
            1152,
            "wrong: vLLM's engine died during start-up (EngineCore_DP0: 'EngineCore failed to start'); expected it to "
            "load the model: read the lines above it in vLLM's log for the root cause",
        ),
        (
            # The released server at its default 256, caught from the geometry before the connector's refusal.
            flash_lines(),
            256,
            "wrong: expected the chunk size to be a multiple of every non-zero group (LCM 1152 of [1152, 1152, 1152, "
            "1152, 1152, 0]), found 256 (configured; no negotiation logged); set --chunk-size 1152 on the LMCache "
            "server",
        ),
        (
            [*flash_lines()[:4], geometry_line(3, [576] * 5 + [0], 576)],
            1152,
            "wrong: vLLM ranks disagree on the cache geometry: expected every rank to log the same, found Worker_TP0, "
            "Worker_TP1, Worker_TP2: group_tokens_per_block=[1152, 1152, 1152, 1152, 1152, 0], scheduler_block_size="
            "1152; Worker_TP3: group_tokens_per_block=[576, 576, 576, 576, 576, 0], scheduler_block_size=576; make "
            "every rank run the same model, TP size and attention backend, then restart the pod",
        ),
        (
            [geometry_line(rank, [64], 64) for rank in range(4)],
            1152,
            "wrong: expected group_tokens_per_block of the shape [N, N, N, N, N, 0] for GLM-5.3-Flash, found [64]; "
            "serve zai-org/GLM-5.3-Flash with the profile that matches it",
        ),
        (
            [geometry_line(rank, [1152, 1152, 1152, 1152, 576, 0], 1152) for rank in range(4)],
            1152,
            "wrong: expected group_tokens_per_block of the shape [N, N, N, N, N, 0] for GLM-5.3-Flash, found [1152, "
            "1152, 1152, 1152, 576, 0]; serve zai-org/GLM-5.3-Flash with the profile that matches it",
        ),
        (
            [geometry_line(rank, [1152] * 5 + [0], 576) for rank in range(4)],
            1152,
            "wrong: expected scheduler_block_size = LCM of the non-zero groups [1152, 1152, 1152, 1152, 1152, 0] = "
            "1152, found 576; the connector and vLLM disagree: use an LMCache build that matches vLLM",
        ),
        (
            flash_lines(576),
            1152,
            "wrong: expected N = 1152 for GLM-5.3-Flash at TP 4 (profile), found 576; check --tensor-parallel-size "
            "and the model (N changes with the TP size)",
        ),
        (
            [block_line(2304), *flash_lines()[1:]],
            1152,
            "wrong: expected vLLM's attention block size to equal the groups' N = 1152, found 'Setting attention block "
            "size' lines saying 2304; restart the pod so every process uses one block size",
        ),
        (
            [*flash_lines(), negotiated_line(1024, 256, 1152)],
            256,
            "wrong: expected the LMCache server to negotiate configured_min=256 up to the smallest multiple of the "
            "geometry's alignment 1152 (1152), found resolved=1024 with required_alignment=1152; restart the LMCache "
            "server so it negotiates against this vLLM's geometry",
        ),
        (
            [*flash_lines(), negotiated_line(576, 256, 576)],
            256,
            "wrong: expected the LMCache server to negotiate configured_min=256 up to the smallest multiple of the "
            "geometry's alignment 1152 (1152), found resolved=576 with required_alignment=576; restart the LMCache "
            "server so it negotiates against this vLLM's geometry",
        ),
        (
            flash_lines(tp=8),
            1152,
            "wrong: expected TP ranks 0..3 (--tensor-parallel-size 4), found a geometry line from rank 7; give the "
            "probe the TP size vLLM runs with",
        ),
    ],
)
def test_wrong(lines: list[str], chunk: int, message: str) -> None:
    result = verdict(lines, chunk=chunk)
    assert (result.status, result.exit_code, result.message) == (Status.WRONG, EXIT_WRONG, message)


def test_glm53_chunk_not_a_multiple_of_64() -> None:
    result = verdict([geometry_line(rank, [64], 64) for rank in range(8)], "glm53", chunk=100)
    assert result.exit_code == EXIT_WRONG
    assert result.message.endswith(
        "found 100 (configured; no negotiation logged); set --chunk-size 128 on the LMCache server"
    )


def test_a_restart_clears_the_failures_of_the_earlier_run() -> None:
    first_run = [*flash_lines(), UNREACHABLE, DEATH]
    assert verdict(first_run, chunk=1152).status is Status.WRONG
    facts = StartupFacts()
    facts.add_all(parse_lines([*first_run, *flash_lines()]))
    assert facts.restarts == 1
    assert evaluate(FLASH, 4, 1152, facts, 1).status is Status.READY


def test_facts_round_trip_through_json_and_combine() -> None:
    vllm, lmcache = StartupFacts(), StartupFacts()
    vllm.add_all(parse_lines([*flash_lines(), "Resolved LMCache MP geometry: group_tokens_per_block=[x]", DEATH]))
    lmcache.add_all(parse_lines([negotiated_line(1152, 256, 1152)]))
    for facts in (vllm, lmcache):
        assert StartupFacts.from_json(json.loads(json.dumps(facts.to_json()))) == facts
    combined = StartupFacts.combined([vllm, lmcache])
    assert combined.negotiated == lmcache.negotiated
    assert combined.geometries == vllm.geometries
    assert combined.malformed_count == 1


@pytest.mark.parametrize(
    ("data", "message"),
    [
        ("nope", "must be a JSON object"),
        ({"version": 99}, "version 99"),
        ({"version": 1}, "incomplete"),
        ({**StartupFacts().to_json(), "malformed_count": -1}, "non-negative"),
        ({**StartupFacts().to_json(), "geometries": {"Worker_TP0": {"groups": []}}}, "non-empty list"),
    ],
)
def test_corrupt_facts_are_refused(data: object, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        StartupFacts.from_json(data)


# --- the real command line, as the kubelet runs it ---


def run_probe(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "glm53", "probe", "startup", *args], capture_output=True, text=True, check=False
    )


@pytest.mark.parametrize(
    ("scenario", "chunk", "exit_code", "start"),
    [
        ("glm53-flash/healthy", "1152", EXIT_READY, "ready: GLM-5.3-Flash geometry"),
        ("glm53-flash/loading", "1152", EXIT_NOT_YET, "not yet: vLLM is still loading"),
        ("glm53-flash/ranks-disagree", "1152", EXIT_WRONG, "wrong: vLLM ranks disagree"),
        ("glm53-flash/negotiated", "256", EXIT_READY, "ready: GLM-5.3-Flash geometry"),
        ("glm53-flash/wrong-chunk", "256", EXIT_WRONG, "wrong: the LMCache connector (Worker_TP3) refused"),
        ("glm53/healthy", "256", EXIT_READY, "ready: GLM-5.3 geometry [64] on all 8 TP ranks"),
    ],
)
def test_cli_on_the_shipped_example_logs(scenario: str, chunk: str, exit_code: int, start: str, tmp_path: Path) -> None:
    logs = [f"--log={EXAMPLES / scenario / name}" for name in ("vllm.log", "lmcache.log")]
    profile = scenario.split("/")[0]
    result = run_probe("--profile", profile, "--chunk-size", chunk, *logs, "--state-dir", str(tmp_path))
    assert result.returncode == exit_code, result.stderr
    assert result.stdout.startswith(start)
    assert result.stdout.count("\n") == 1
    assert result.stderr == ""


def test_cli_reads_only_new_bytes_and_remembers_earlier_facts(tmp_path: Path) -> None:
    log = tmp_path / "vllm.log"
    log.write_text("\n".join(flash_lines()[:3]) + "\n")
    first = run_probe("--profile", "glm53-flash", "--chunk-size", "1152", "--log", str(log))
    assert first.returncode == EXIT_NOT_YET
    assert f"after reading {log.stat().st_size} bytes" in first.stdout
    (state,) = (tmp_path / ".probe").iterdir()  # default state dir: beside the first log
    with log.open("a") as handle:
        handle.write("\n".join(flash_lines()[3:]) + "\n")
    second = run_probe("--profile", "glm53-flash", "--chunk-size", "1152", "--log", str(log))
    assert second.returncode == EXIT_READY, second.stdout
    saved = json.loads(state.read_text())
    assert saved["position"]["offset"] == log.stat().st_size
    assert not list((tmp_path / ".probe").glob("*.tmp"))


def test_cli_discards_a_corrupt_state_file(tmp_path: Path) -> None:
    log = tmp_path / "vllm.log"
    log.write_text("\n".join(flash_lines()) + "\n")
    args = ("--profile", "glm53-flash", "--chunk-size", "1152", "--log", str(log))
    assert run_probe(*args).returncode == EXIT_READY
    (state,) = (tmp_path / ".probe").iterdir()
    state.write_bytes(b"\x00{not json")
    again = run_probe(*args)
    assert again.returncode == EXIT_READY
    assert json.loads(state.read_text())["version"] == 1


def test_cli_still_answers_when_the_state_cannot_be_saved(tmp_path: Path) -> None:
    log = tmp_path / "vllm.log"
    log.write_text("\n".join(flash_lines()) + "\n")
    blocker = tmp_path / "not-a-dir"
    blocker.write_text("")
    result = run_probe(
        "--profile", "glm53-flash", "--chunk-size", "1152", "--log", str(log), "--state-dir", str(blocker / "state")
    )
    assert result.returncode == EXIT_READY
    assert result.stdout.rstrip().endswith(f"[state not saved in {blocker / 'state'} (Not a directory)]")


def test_cli_missing_log_is_not_yet(tmp_path: Path) -> None:
    result = run_probe("--profile", "glm53", "--log", str(tmp_path / "absent.log"))
    assert result.returncode == EXIT_NOT_YET
    assert "read 0 bytes of log so far" in result.stdout


def test_cli_garbage_log_never_raises(tmp_path: Path) -> None:
    result = run_probe("--profile", "glm53-flash", "--log", str(FIXTURES / "garbage.log"), "--state-dir", str(tmp_path))
    assert result.returncode == EXIT_NOT_YET
    # The half-written last line is not handed out yet; the garbled one is reported, the real one counted.
    assert result.stdout.startswith("not yet: 1 of 4 TP ranks logged their geometry")
    assert "; 1 fact line(s) could not be parsed (last: geometry: (Worker_TP1 pid=54)" in result.stdout
    assert result.stderr == ""


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (
            ("--profile", "glm6", "--log", "x.log"),
            "glm53 probe: error: unknown profile 'glm6'; expected one of: glm53-flash, glm53",
        ),
        (
            ("--profile", "glm53", "--chunk-size", "0", "--log", "x.log"),
            "glm53 probe: error: --chunk-size must be a positive integer, got '0'",
        ),
        (
            ("--profile", "glm53", "--tensor-parallel-size", "four", "--log", "x.log"),
            "glm53 probe: error: --tensor-parallel-size must be a positive integer, got 'four'",
        ),
    ],
)
def test_cli_usage_errors(args: tuple[str, ...], message: str) -> None:
    result = run_probe(*args)
    assert result.returncode == 2
    assert result.stderr == message + "\n"


def test_probe_imports_only_the_standard_library_and_glm53() -> None:
    code = (
        "import sys; from glm53.cli import main; import glm53.commands.probe; "
        "heavy = {'yaml', 'zmq', 'prometheus_client', 'hypothesis', 'scipy', 'matplotlib'} & set(sys.modules); "
        "print(sorted(heavy))"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert result.stdout.strip() == "[]"


def test_ready_waits_until_the_backlog_is_read() -> None:
    facts = StartupFacts()
    facts.add_all(parse_lines(flash_lines()))
    result = evaluate(FLASH, 4, 1152, facts, 4096, unread_bytes=1000)
    assert (result.status, result.exit_code) == (Status.NOT_YET, EXIT_NOT_YET)
    assert result.message == (
        "not yet: still catching up on the log: read 4096 bytes, 1000 left for the next invocation; nothing wrong so "
        "far"
    )


def test_cli_reads_a_huge_backlog_over_several_invocations(tmp_path: Path) -> None:
    log = tmp_path / "vllm.log"
    noise = b"(EngineCore_DP0 pid=41) DEBUG 11-29 07:01:00 [core.py:812] waiting for work\n" * 200_000  # ~15 MiB
    log.write_bytes("\n".join(flash_lines()).encode() + b"\n" + noise)
    args = ("--profile", "glm53-flash", "--chunk-size", "1152", "--log", str(log), "--time-budget", "0.000001")
    first = run_probe(*args)
    assert first.returncode == EXIT_NOT_YET
    assert first.stdout.startswith("not yet: still catching up on the log: read 4194304 bytes")
    for _ in range(10):
        result = run_probe(*args)
        if result.returncode != EXIT_NOT_YET:
            break
    assert result.returncode == EXIT_READY, result.stdout


_NUMBERS = st.sampled_from([0, 1, 64, 256, 576, 1152, 2304, 99999999999])


@st.composite
def _fact_lines(draw: st.DrawFn) -> list[str]:
    templates = [
        lambda: block_line(draw(_NUMBERS)),
        lambda: geometry_line(
            draw(st.integers(0, 9)), draw(st.lists(_NUMBERS, min_size=0, max_size=7)), draw(_NUMBERS)
        ),
        lambda: negotiated_line(draw(_NUMBERS), draw(_NUMBERS), draw(_NUMBERS)),
        lambda: REFUSAL.replace("256", str(draw(_NUMBERS))),
        lambda: UNREACHABLE,
        lambda: DEATH,
        lambda: draw(st.text(max_size=40)),
    ]
    return [draw(st.sampled_from(templates))() for _ in range(draw(st.integers(0, 12)))]


@given(_fact_lines(), st.sampled_from(["glm53-flash", "glm53"]), st.integers(1, 8), st.sampled_from([64, 256, 1152]))
def test_any_log_gets_a_verdict_and_its_facts_survive_the_state_file(
    lines: list[str], profile_name: str, tp: int, chunk: int
) -> None:
    facts = StartupFacts()
    facts.add_all(parse_lines(lines))
    assert StartupFacts.from_json(json.loads(json.dumps(facts.to_json()))) == facts
    result = evaluate(get_profile(profile_name), tp, chunk, facts, 0)
    assert result.exit_code == {Status.READY: 0, Status.NOT_YET: 3, Status.WRONG: 4}[result.status]
    assert "\n" not in result.message
