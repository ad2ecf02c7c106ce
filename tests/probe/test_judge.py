"""The startup probe on logs written by the upstream formatters: a verdict per scenario, every failure's message, and
the real CLI with its saved state.

Every log line here comes from the generated example logs (tests/fixtures/generate_logs.py runs vLLM's and LMCache's
own logging code), or is such a line with its numbers changed, so the probe is tested on the formats real pods write.
"""

from __future__ import annotations

import contextlib
import importlib.util
import io
import json
import re
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from glm53 import cli
from glm53.probe.judge import EXIT_NOT_YET, EXIT_READY, EXIT_WRONG, StartupFacts, Status, Verdict, evaluate
from glm53.probe.logparse import parse_lines
from glm53.probe.logtail import LogFollower
from glm53.profiles import LMCACHE_DEFAULT_CHUNK_SIZE, get_profile
from tests.support.lmcache057 import NEGOTIATED

REPO = Path(__file__).resolve().parents[2]
EXAMPLES = REPO / "examples" / "logs"
FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "logs"
FLASH = get_profile("glm53-flash")
GLM53 = get_profile("glm53")
FLASH_GROUPS = [1152, 1152, 1152, 1152, 1152, 0]


def example(scenario: str) -> list[str]:
    """A generated vllm.log's lines as the follower hands them out (vLLM's continuation lines end in CR LF)."""
    return [line.rstrip("\r") for line in (EXAMPLES / scenario / "vllm.log").read_text().split("\n")[:-1]]


HEALTHY = example("glm53-flash/healthy")
PLAIN = example("glm53-flash/plain-banner")
GEOMETRY = next(line for line in HEALTHY if "Resolved LMCache MP geometry" in line)
BLOCK = next(line for line in HEALTHY if "Setting attention block size" in line)


def geometry_line(groups: list[int], sched: int) -> str:
    """The real geometry line with other numbers."""
    return GEOMETRY.replace(str(FLASH_GROUPS), str(groups)).replace(
        "scheduler_block_size=1152", f"scheduler_block_size={sched}"
    )


def block_line(n: int) -> str:
    return BLOCK.replace("size to 1152 tokens", f"size to {n} tokens")


def negotiated_line(resolved: int, configured_min: int, alignment: int) -> str:
    return NEGOTIATED.replace(
        "to 1152 (configured_min=256, required_alignment=1152)",
        f"to {resolved} (configured_min={configured_min}, required_alignment={alignment})",
    )


def start_lines() -> list[str]:
    """The plain banner and the block size line of a GLM-5.3-Flash start, as vLLM logs them."""
    return [PLAIN[0], BLOCK]


def flash_lines(n: int = 1152, tp: int = 4) -> list[str]:
    """A healthy start: banner, block size, then TP + 1 geometry lines."""
    return [PLAIN[0], block_line(n)] + [geometry_line([n] * 5 + [0], n)] * (tp + 1)


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
        "ready: GLM-5.3-Flash geometry [1152, 1152, 1152, 1152, 1152, 0] in all 5 connector lines (scheduler + 4 TP "
        "workers) since vLLM 0.33.0 started, scheduler_block_size 1152, chunk size 1152 (configured; no negotiation "
        "logged) is a multiple of 1152; N = 1152 as recorded for TP 4; nothing to change",
    )


def test_flash_ready_when_a_negotiating_server_rounded_256_up() -> None:
    result = verdict([*flash_lines(), negotiated_line(1152, 256, 1152)])
    assert result.status is Status.READY
    assert "chunk size 1152 (negotiated from 256)" in result.message


def test_flash_at_tp8_accepts_a_consistent_n_but_says_it_was_not_validated() -> None:
    result = verdict(flash_lines(2304, tp=8), tp=8, chunk=2304)
    assert result.exit_code == EXIT_READY
    assert result.message.endswith("N = 2304 was not validated at TP 8 (recorded for TP 4 only); nothing to change")


def test_glm53_at_another_tp_size_says_so() -> None:
    result = verdict([PLAIN[0]] + [geometry_line([64], 64)] * 5, "glm53", tp=4)
    assert result.status is Status.READY
    assert result.message.endswith("TP 4 was not validated (validated at TP 8); nothing to change")


def test_seed_literal_lines_are_one_connector_of_five() -> None:
    lines = (FIXTURES / "seed-flash.log").read_text().splitlines()
    result = verdict(lines)
    assert result.status is Status.NOT_YET
    assert result.message.startswith(
        "not yet: 1 of 5 'Resolved LMCache MP geometry' lines (scheduler + 4 TP workers) since the log began"
    )


@pytest.mark.parametrize(
    ("lines", "profile_name", "message"),
    [
        (
            [],
            "glm53-flash",
            "not yet: vLLM is still loading (no geometry line since the log began): waiting for vLLM's 'Setting "
            "attention block size' line and the connectors' 'Resolved LMCache MP geometry' lines; nothing to change "
            "yet, read 1000 bytes of log so far",
        ),
        (
            start_lines(),
            "glm53-flash",
            "not yet: vLLM is still loading (no geometry line since vLLM 0.33.0 started): waiting for the connectors' "
            "'Resolved LMCache MP geometry' lines; nothing to change yet, read 1000 bytes of log so far",
        ),
        (
            ["Resolved LMCache MP geometry: group_tokens_per_block=[...], scheduler_block_size=..."],
            "glm53",
            "not yet: vLLM is still loading (no geometry line since the log began): waiting for the connectors' "
            "'Resolved LMCache MP geometry' lines; nothing to change yet, read 1000 bytes of log so far; 1 fact "
            "line(s) could not be parsed (last: geometry: Resolved LMCache MP geometry: group_tokens_per_block=[...], "
            "scheduler_block_size=...)",
        ),
        (
            flash_lines()[:4],
            "glm53-flash",
            "not yet: 2 of 5 'Resolved LMCache MP geometry' lines (scheduler + 4 TP workers) since vLLM 0.33.0 "
            "started, all group_tokens_per_block=[1152, 1152, 1152, 1152, 1152, 0], scheduler_block_size=1152; "
            "nothing to change yet, waiting for the rest after reading 1000 bytes of log",
        ),
        (
            # Four lines are not five: the scheduler's is missing (the per-rank check on untagged lines).
            flash_lines()[:-1],
            "glm53-flash",
            "not yet: 4 of 5 'Resolved LMCache MP geometry' lines (scheduler + 4 TP workers) since vLLM 0.33.0 "
            "started, all group_tokens_per_block=[1152, 1152, 1152, 1152, 1152, 0], scheduler_block_size=1152; "
            "nothing to change yet, waiting for the rest after reading 1000 bytes of log",
        ),
    ],
)
def test_not_yet(lines: list[str], profile_name: str, message: str) -> None:
    result = verdict(lines, profile_name, chunk=1152)
    assert (result.status, result.exit_code, result.message) == (Status.NOT_YET, EXIT_NOT_YET, message)


@pytest.mark.parametrize(
    ("lines", "chunk", "message"),
    [
        (
            example("glm53-flash/wrong-chunk"),
            256,
            "wrong: the LMCache connector in EngineCore refused the chunk size: expected a multiple of the group's "
            "tokens_per_block 1152, found --chunk-size 256; set --chunk-size 1152 on the LMCache server (the released "
            "LMCache 0.5.6 does not negotiate it)",
        ),
        (
            example("glm53-flash/sidecar-unreachable"),
            1152,
            "wrong: vLLM's LMCache connector cannot reach the LMCache MP server at 'tcp://localhost:5555'; expected "
            "the lmcache sidecar listening there: check that it runs and that lmcache.mp.host / lmcache.mp.port in "
            "--kv-transfer-config match its --host / --port",
        ),
        (
            example("glm53-flash/restart-after-crash")[:30],
            1152,
            "wrong: vLLM's engine died during start-up in EngineCore ('EngineCore failed to start'); expected it to "
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
            # One disagreeing line is enough, whichever connector printed it and however many are still to come.
            [*flash_lines()[:3], geometry_line([576] * 5 + [0], 576)],
            1152,
            "wrong: the connectors disagree on the cache geometry: expected all 5 'Resolved LMCache MP geometry' "
            "lines since vLLM 0.33.0 started (scheduler + 4 TP workers) to be the same, found 1 x "
            "group_tokens_per_block=[1152, 1152, 1152, 1152, 1152, 0], scheduler_block_size=1152 and 1 x "
            "group_tokens_per_block=[576, 576, 576, 576, 576, 0], scheduler_block_size=576; make every rank run the "
            "same model, TP size and attention backend, then restart the pod",
        ),
        (
            [PLAIN[0], geometry_line([64], 64)],
            1152,
            "wrong: expected group_tokens_per_block of the shape [N, N, N, N, N, 0] for GLM-5.3-Flash, found [64]; "
            "serve zai-org/GLM-5.3-Flash with the profile that matches it",
        ),
        (
            [geometry_line([1152, 1152, 1152, 1152, 576, 0], 1152)],
            1152,
            "wrong: expected group_tokens_per_block of the shape [N, N, N, N, N, 0] for GLM-5.3-Flash, found [1152, "
            "1152, 1152, 1152, 576, 0]; serve zai-org/GLM-5.3-Flash with the profile that matches it",
        ),
        (
            [geometry_line(FLASH_GROUPS, 576)],
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
            [block_line(2304), geometry_line(FLASH_GROUPS, 1152)],
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
            flash_lines(tp=8),
            1152,
            "wrong: expected 5 'Resolved LMCache MP geometry' lines (scheduler + 4 TP workers) since vLLM 0.33.0 "
            "started, found 9; give the probe vLLM's --tensor-parallel-size, and keep vLLM's log level at INFO or "
            "below so its start banner marks each restart",
        ),
    ],
)
def test_wrong(lines: list[str], chunk: int, message: str) -> None:
    result = verdict(lines, chunk=chunk)
    assert (result.status, result.exit_code, result.message) == (Status.WRONG, EXIT_WRONG, message)


def test_glm53_chunk_not_a_multiple_of_64() -> None:
    result = verdict([geometry_line([64], 64)] * 9, "glm53", chunk=100)
    assert result.exit_code == EXIT_WRONG
    assert result.message.endswith(
        "found 100 (configured; no negotiation logged); set --chunk-size 128 on the LMCache server"
    )


def test_a_crash_before_any_geometry_line_and_a_restart_into_the_same_log_reach_ready() -> None:
    lines = example("glm53-flash/restart-after-crash")
    facts = StartupFacts()
    facts.add_all(parse_lines(lines))
    assert facts.restarts == 1
    assert evaluate(FLASH, 4, 1152, facts, 1).status is Status.READY


def test_a_new_engine_core_pid_starts_a_new_run_even_without_a_banner() -> None:
    first = [line for line in example("glm53-flash/wrong-chunk") if "[startup.py:" not in line]
    second = [line.replace("(EngineCore pid=41)", "(EngineCore pid=97)") for line in example("glm53-flash/healthy")]
    second = [line for line in second if "[startup.py:" not in line]
    assert verdict(first, chunk=1152).status is Status.WRONG
    result = verdict([*first, *second], chunk=1152)
    assert result.status is Status.READY, result.message


def test_worker_names_with_expert_parallelism_are_ranks() -> None:
    (record,) = parse_lines(
        [
            HEALTHY[0]
            .replace("(APIServer pid=1)", "(Worker_TP3_EP3 pid=56)")
            .replace("[startup.py:38] ", "[x.py:1] EngineCore failed to start.")
        ]
    )
    assert record.origin.rank == 3


def test_the_logo_and_the_coloured_formatter_start_a_run() -> None:
    coloured = (FIXTURES / "coloured-flash.log").read_text().replace("\r", "").splitlines()
    facts = StartupFacts()
    facts.add_all(parse_lines(coloured))
    assert facts.vllm_version == "0.33.0"
    assert evaluate(FLASH, 4, 1152, facts, 1).status is Status.READY


def test_facts_round_trip_through_json_and_combine() -> None:
    vllm, lmcache = StartupFacts(), StartupFacts()
    vllm.add_all(
        parse_lines([*example("glm53-flash/wrong-chunk"), "Resolved LMCache MP geometry: group_tokens_per_block=[x]"])
    )
    lmcache.add_all(parse_lines([negotiated_line(1152, 256, 1152)]))
    for facts in (vllm, lmcache):
        assert StartupFacts.from_json(json.loads(json.dumps(facts.to_json()))) == facts
    combined = StartupFacts.combined([vllm, lmcache])
    assert combined.negotiated == lmcache.negotiated
    assert combined.geometries == vllm.geometries
    assert combined.geometry_lines == 5
    assert combined.engine_pids == {"EngineCore": 41}
    assert combined.malformed_count == 1


@pytest.mark.parametrize(
    ("data", "message"),
    [
        ("nope", "must be a JSON object"),
        ({"version": 99}, "version 99"),
        ({"version": 2}, "incomplete"),
        ({**StartupFacts().to_json(), "malformed_count": -1}, "non-negative"),
        ({**StartupFacts().to_json(), "geometries": {"x": {"groups": []}}}, "non-empty list"),
        ({**StartupFacts().to_json(), "engine_pids": {"EngineCore": "41"}}, "non-negative integer"),
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


def readme_verdicts() -> list[tuple[str, str, int, str]]:
    """(scenario, chunk size, exit code, message) from examples/logs/README.md's table: the README is the spec."""
    rows = re.findall(r"^\| `([\w/-]+)` \| (\d+) \| (\d) \| `([^`]+)` \|$", (EXAMPLES / "README.md").read_text(), re.M)
    return [(scenario, chunk, int(code), message) for scenario, chunk, code, message in rows]


def test_every_example_directory_has_a_verdict_in_the_readme() -> None:
    directories = {str(p.parent.relative_to(EXAMPLES)) for p in EXAMPLES.glob("*/*/vllm.log")}
    assert directories == {scenario for scenario, *_ in readme_verdicts()}


def probe_example(examples: Path, scenario: str, chunk: str, state_dir: Path) -> subprocess.CompletedProcess[str]:
    """`glm53 probe startup` on a scenario directory's two logs with its table row's chunk size. A re-run from the
    saved state must read nothing new and give the same verdict."""
    logs = [f"--log={examples / scenario / name}" for name in ("vllm.log", "lmcache.log")]
    args = ("--profile", scenario.split("/")[0], "--chunk-size", chunk, *logs, "--state-dir", str(state_dir))
    result = run_probe(*args)
    again = run_probe(*args)
    assert (again.returncode, again.stdout) == (result.returncode, result.stdout)
    return result


@pytest.mark.parametrize(("scenario", "chunk", "exit_code", "message"), readme_verdicts())
def test_cli_on_the_shipped_example_logs(
    scenario: str, chunk: str, exit_code: int, message: str, tmp_path: Path
) -> None:
    result = probe_example(EXAMPLES, scenario, chunk, tmp_path)
    assert (result.returncode, result.stdout, result.stderr) == (exit_code, message + "\n", "")


def assert_committed_logs_are_the_generators_output(monkeypatch: pytest.MonkeyPatch, vllm_version: str) -> None:
    """The committed logs of one vLLM generation are what its wheel's logging code writes today (CI has the wheels
    from scripts/setup.d/24-upstream-wheels.sh); skips when that vLLM wheel is absent."""
    spec = importlib.util.spec_from_file_location("generate_logs", FIXTURES.parent / "generate_logs.py")
    assert spec is not None and spec.loader is not None
    generator = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, spec.name, generator)  # its dataclasses look their module up there
    spec.loader.exec_module(generator)
    if not list(generator.DEFAULT_WHEELS.glob(f"vllm-{vllm_version}-*.whl")):
        pytest.skip(f"no vllm {vllm_version} wheel in {generator.DEFAULT_WHEELS}: run 24-upstream-wheels.sh")
    for relative, content in generator.render(generator.DEFAULT_WHEELS, vllm_version).items():
        assert (REPO / relative).read_bytes() == content, f"{relative} differs from tests/fixtures/generate_logs.py"


def test_committed_logs_are_the_generators_output(monkeypatch: pytest.MonkeyPatch) -> None:
    """Regenerate with `python tests/fixtures/generate_logs.py`."""
    assert_committed_logs_are_the_generators_output(monkeypatch, "0.33.0")


def write(path: Path, lines: list[str]) -> None:
    path.write_text("".join(line + "\n" for line in lines))


def append(path: Path, lines: list[str]) -> None:
    with path.open("a") as handle:
        handle.write("".join(line + "\n" for line in lines))


def test_cli_reads_only_new_bytes_and_remembers_earlier_facts(tmp_path: Path) -> None:
    log = tmp_path / "vllm.log"
    lines = flash_lines()
    write(log, lines[:5])
    first = run_probe("--profile", "glm53-flash", "--chunk-size", "1152", "--log", str(log))
    assert first.returncode == EXIT_NOT_YET
    assert first.stdout.startswith("not yet: 3 of 5")
    assert f"after reading {log.stat().st_size} bytes" in first.stdout
    (state,) = (tmp_path / ".probe").iterdir()  # default state dir: beside the first log
    append(log, lines[5:])
    second = run_probe("--profile", "glm53-flash", "--chunk-size", "1152", "--log", str(log))
    assert second.returncode == EXIT_READY, second.stdout
    saved = json.loads(state.read_text())
    assert saved["position"]["offset"] == log.stat().st_size
    (geometry,) = saved["facts"]["geometries"].values()
    assert geometry["lines"] == 5
    assert not list((tmp_path / ".probe").glob("*.tmp"))
    # A restart appended later starts counting again, from the saved state as from a full scan.
    append(log, flash_lines()[:4])
    third = run_probe("--profile", "glm53-flash", "--chunk-size", "1152", "--log", str(log))
    full = run_probe(
        "--profile", "glm53-flash", "--chunk-size", "1152", "--log", str(log), "--state-dir", str(tmp_path / "fresh")
    )
    assert (third.returncode, third.stdout) == (full.returncode, full.stdout) == (EXIT_NOT_YET, third.stdout)
    assert third.stdout.startswith("not yet: 2 of 5")


def test_cli_discards_a_corrupt_state_file(tmp_path: Path) -> None:
    log = tmp_path / "vllm.log"
    write(log, flash_lines())
    args = ("--profile", "glm53-flash", "--chunk-size", "1152", "--log", str(log))
    assert run_probe(*args).returncode == EXIT_READY
    (state,) = (tmp_path / ".probe").iterdir()
    state.write_bytes(b"\x00{not json")
    again = run_probe(*args)
    assert again.returncode == EXIT_READY
    assert json.loads(state.read_text())["version"] == 1


def test_cli_still_answers_when_the_state_cannot_be_saved(tmp_path: Path) -> None:
    log = tmp_path / "vllm.log"
    write(log, flash_lines())
    blocker = tmp_path / "not-a-dir"
    blocker.write_text("")
    result = run_probe(
        "--profile", "glm53-flash", "--chunk-size", "1152", "--log", str(log), "--state-dir", str(blocker / "state")
    )
    assert result.returncode == EXIT_READY
    assert result.stdout.rstrip().endswith(f"[state not saved in {blocker / 'state'} (Not a directory)]")


def test_cli_missing_log_is_not_yet_and_named(tmp_path: Path) -> None:
    absent = tmp_path / "absent.log"
    result = run_probe("--profile", "glm53", "--log", str(absent), "--state-dir", str(tmp_path / "state"))
    assert result.returncode == EXIT_NOT_YET
    assert result.stdout.startswith(f"not yet: no file at {absent} yet (check --log if it never appears); vLLM is")
    assert "read 0 bytes of log so far" in result.stdout
    assert result.stderr == ""


def test_cli_a_directory_as_log_is_one_line_of_usage_error(tmp_path: Path) -> None:
    result = run_probe("--profile", "glm53", "--log", str(tmp_path), "--state-dir", str(tmp_path / "state"))
    assert result.returncode == 2
    assert result.stdout == ""
    assert result.stderr == (
        f"glm53 probe: error: cannot read --log {tmp_path}: Is a directory; expected a readable log file, such as "
        "the vllm.log or lmcache.log that glm53 supervise writes\n"
    )


def test_cli_an_unreadable_log_is_one_line_of_usage_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    # Tests may run as root, for whom no file is unreadable: the follower's open fails as it would for anyone else.
    log = tmp_path / "vllm.log"
    write(log, flash_lines())

    def denied(self: LogFollower, max_bytes: int | None = None) -> list[str]:
        raise PermissionError(13, "Permission denied", str(self.path))

    monkeypatch.setattr(LogFollower, "read_new_lines", denied)
    code = cli.main(["probe", "startup", "--profile", "glm53", "--log", str(log), "--state-dir", str(tmp_path / "s")])
    assert code == 2
    assert capsys.readouterr().err == (
        f"glm53 probe: error: cannot read --log {log}: Permission denied; expected a readable log file, such as the "
        "vllm.log or lmcache.log that glm53 supervise writes\n"
    )


def test_cli_garbage_log_never_raises(tmp_path: Path) -> None:
    result = run_probe(
        "--profile",
        "glm53-flash",
        "--chunk-size",
        "1152",
        "--log",
        str(FIXTURES / "garbage.log"),
        "--state-dir",
        str(tmp_path),
    )
    assert result.returncode == EXIT_NOT_YET
    # The half-written last line is not handed out yet; the garbled one is reported, the real one counted.
    assert result.stdout.startswith("not yet: 1 of 5 'Resolved LMCache MP geometry' lines")
    assert (
        "; 1 fact line(s) could not be parsed (last: geometry: [2026-11-29 07:00:00,200] LMCache INFO: Resolved"
        in result.stdout
    )
    assert "\x1b" not in result.stdout
    assert result.stderr == ""


def test_cli_absurd_numbers_are_not_trusted(tmp_path: Path) -> None:
    result = run_probe("--profile", "glm53-flash", "--log", str(FIXTURES / "absurd.log"), "--state-dir", str(tmp_path))
    assert result.returncode == EXIT_WRONG
    assert result.stdout.startswith("wrong: vLLM's engine died during start-up in EngineCore")


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (
            ("--profile", "glm6", "--log", "x.log"),
            "glm53 probe: error: unknown profile 'glm6'; expected one of: glm53-flash, glm53, tiny-dense, tiny-hybrid",
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


@pytest.mark.parametrize("budget", ["nan", "inf", "-1", "soon"])
def test_cli_refuses_a_time_budget_that_is_no_number_of_seconds(budget: str) -> None:
    result = run_probe("--profile", "glm53", "--log", "x.log", "--time-budget", budget)
    assert result.returncode == 2
    assert result.stderr.count("\n") == 1
    assert f"argument --time-budget: expected a number of seconds >= 0 (0: no limit), got {budget!r}" in result.stderr


def test_probe_imports_only_the_standard_library_and_glm53() -> None:
    code = (
        "import sys; from glm53.cli import main; import glm53.commands.probe; "
        "heavy = {'yaml', 'zmq', 'prometheus_client', 'hypothesis', 'scipy', 'matplotlib', 'torch', 'lmcache'} "
        "& set(sys.modules); print(sorted(heavy))"
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
    engine_line = next(line for line in HEALTHY if line.startswith("(EngineCore pid=41)"))
    noise = (engine_line + "\n").encode() * 100_000  # ~15 MiB
    log.write_bytes("".join(line + "\n" for line in flash_lines()).encode() + noise)
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
# The lines of the failure examples that carry a record (banners, engine lines, errors), to mix with generated ones.
_EVENTS = [
    line
    for scenario in ("glm53-flash/wrong-chunk", "glm53-flash/sidecar-unreachable", "glm53-flash/restart-after-crash")
    for line in example(scenario)
    if list(parse_lines([line]))
]


@st.composite
def _fact_lines(draw: st.DrawFn) -> list[str]:
    templates = [
        lambda: block_line(draw(_NUMBERS)),
        lambda: geometry_line(draw(st.lists(_NUMBERS, min_size=0, max_size=7)), draw(_NUMBERS)),
        lambda: negotiated_line(draw(_NUMBERS), draw(_NUMBERS), draw(_NUMBERS)),
        lambda: draw(st.sampled_from(_EVENTS)),
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


_ARGV_WORDS = st.sampled_from(
    [
        "--profile",
        "glm53",
        "glm53-flash",
        "glm6",
        "--chunk-size",
        "--tensor-parallel-size",
        "--time-budget",
        "--log",
        "--state-dir",
        "0",
        "-1",
        "256",
        "1152",
        "nan",
        "inf",
        "1e309",
        "",
        ".",
        "absent.log",
        "\x00",
        "\ud800",
        "startup",
        "--help",
    ]
)


@given(st.lists(_ARGV_WORDS, max_size=8))
def test_no_command_line_raises_a_traceback(words: list[str]) -> None:
    """Whatever the arguments, the probe prints one line or argparse's usage and exits with a code."""
    with tempfile.TemporaryDirectory() as tmp, contextlib.chdir(tmp), contextlib.redirect_stdout(io.StringIO()):
        try:
            code = cli.main(["probe", "startup", *words, "--state-dir", tmp])
        except SystemExit as exit_:  # argparse's usage errors and --help
            code = exit_.code if isinstance(exit_.code, int) else 2
    assert code in (0, 2, EXIT_NOT_YET, EXIT_WRONG)
