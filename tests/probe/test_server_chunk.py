"""The LMCache server's own chunk size, as its log states it, in the parser and in the startup probe's verdicts.

lmcache 0.5.6 lmcache/v1/multiprocess/token_hasher.py:67 logs `TokenHasher initialized: chunk_size=C,
hash_algorithm=blake3` when the server starts. Every line here is that line as the generator wrote it into the example
logs (LMCache's own logger and formatter, tests/fixtures/generate_logs.py), or that line with its number changed.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from glm53.probe.judge import EXIT_NOT_YET, EXIT_READY, EXIT_WRONG, StartupFacts, Status, Verdict, evaluate
from glm53.probe.logparse import LineOrigin, MalformedLine, ServerChunkSize, parse_line, parse_lines
from glm53.profiles import get_profile
from tests.support.lmcache057 import NEGOTIATED

EXAMPLES = Path(__file__).resolve().parents[2] / "examples" / "logs"
FLASH = get_profile("glm53-flash")
NO_ORIGIN = LineOrigin()


def _lines(scenario: str, name: str) -> list[str]:
    return [line.rstrip("\r") for line in (EXAMPLES / scenario / name).read_text().split("\n")[:-1]]


HEALTHY = _lines("glm53-flash/healthy", "vllm.log")
SERVER_1152 = _lines("glm53-flash/healthy", "lmcache.log")
HASHER = next(line for line in SERVER_1152 if "TokenHasher initialized" in line)


def hasher_line(chunk: str | int) -> str:
    """The generated TokenHasher line with another number in it."""
    return HASHER.replace("chunk_size=1152,", f"chunk_size={chunk},")


def judged(lines: list[str], chunk: int | None) -> Verdict:
    facts = StartupFacts()
    facts.add_all(parse_lines(lines))
    return evaluate(FLASH, 4, chunk, facts, 1000)


# --- the parser ---


def test_the_generated_line_is_the_servers_chunk_size() -> None:
    assert HASHER == (
        "\x1b[32;20m[2026-11-29 07:00:00,200] LMCache INFO:\x1b[0m TokenHasher initialized: chunk_size=1152, "
        "hash_algorithm=blake3 \x1b[3m(token_hasher.py:67:lmcache.v1.multiprocess.token_hasher)\x1b[0m"
    )
    assert parse_line(HASHER) == ServerChunkSize(1152, NO_ORIGIN)


@pytest.mark.parametrize(
    ("line", "expected"),
    [
        ("TokenHasher initialized: chunk_size=256, hash_algorithm=blake3", ServerChunkSize(256, NO_ORIGIN)),
        # The connector's own hasher (KV events on) logs through LMCache's handler too, inside vLLM's log.
        (
            "(Worker_TP3 pid=812) TokenHasher initialized: chunk_size=2304, hash_algorithm=sha256_cbor",
            ServerChunkSize(2304, LineOrigin("Worker_TP3", 812, 3)),
        ),
    ],
)
def test_variants(line: str, expected: ServerChunkSize) -> None:
    assert parse_line(line) == expected


@pytest.mark.parametrize(
    "line",
    [
        hasher_line("1e9"),
        hasher_line("-256"),
        hasher_line("0"),
        hasher_line("99999999999999"),
        hasher_line("11\ufffd52"),
        "TokenHasher initialized: chunk_s",  # half-written
    ],
)
def test_untrustworthy_numbers_are_malformed(line: str) -> None:
    record = parse_line(line)
    assert record == MalformedLine("server chunk size", line.strip(), NO_ORIGIN)


def test_a_malformed_line_is_named_in_the_probes_message() -> None:
    result = judged([hasher_line("x")], 1152)
    assert result.status is Status.NOT_YET
    assert result.message.endswith(
        "; 1 fact line(s) could not be parsed (last: server chunk size: [2026-11-29 07:00:00,200] LMCache INFO: "
        "TokenHasher initialized: chunk_size=x, hash_algorithm=blake3 "
        "(token_hasher.py:67:lmcache.v1.multiprocess.token_hasher))"
    )


# --- the probe ---


def test_a_matching_size_is_ready_as_before() -> None:
    result = judged([*SERVER_1152, *HEALTHY], 1152)
    assert result == judged(HEALTHY, 1152)
    assert result.status is Status.READY
    assert "chunk size 1152 (configured; no negotiation logged)" in result.message


MISMATCH = (
    "wrong: expected the LMCache server to run with the --chunk-size the probe was told (256), found chunk_size=1152 "
    "in its log ('TokenHasher initialized'); pass the server's size (--chunk-size 1152) to the probe, or fix the "
    "chart's lmcache.chunkSize so the server starts with 256"
)


def test_a_size_the_server_did_not_log_is_wrong_and_names_both() -> None:
    """Before: told 256 and judged on 256, while the server really ran with 1152 (a healthy pod said wrong)."""
    result = judged([*SERVER_1152, *HEALTHY], 256)
    assert (result.status, result.exit_code, result.message) == (Status.WRONG, EXIT_WRONG, MISMATCH)


def test_the_mismatch_is_wrong_before_vllm_logged_its_geometry() -> None:
    assert judged(SERVER_1152, 256).message == MISMATCH


def test_a_mismatch_a_negotiation_does_not_explain_says_so() -> None:
    result = judged([hasher_line(512), NEGOTIATED, *HEALTHY], 256)
    assert result.message == (
        "wrong: expected the LMCache server to run with the --chunk-size the probe was told (256), found "
        "chunk_size=512 in its log ('TokenHasher initialized'), and its 'Negotiated LMCache MP chunk size' line does "
        "not relate the two; pass the server's size (--chunk-size 512) to the probe, or fix the chart's "
        "lmcache.chunkSize so the server starts with 256"
    )


@pytest.mark.parametrize(("told", "logged"), [(256, 1152), (1152, 256), (256, 256)])
def test_a_negotiation_explains_a_difference(told: int, logged: int) -> None:
    result = judged([hasher_line(logged), NEGOTIATED, *HEALTHY], told)
    assert result.status is Status.READY, result.message
    assert "chunk size 1152 (negotiated from 256)" in result.message


def test_without_a_chunk_size_the_servers_logged_size_is_judged() -> None:
    """Before: no --chunk-size meant 256, and the healthy 1152 pod was wrong."""
    result = judged([*SERVER_1152, *HEALTHY], None)
    assert (result.status, result.exit_code) == (Status.READY, EXIT_READY)
    assert "chunk size 1152 (the LMCache server's, from its log; no negotiation logged) is a multiple of 1152" in (
        result.message
    )


def test_without_a_chunk_size_the_servers_256_is_wrong_for_flash() -> None:
    result = judged([hasher_line(256), *HEALTHY], None)
    assert result.message == (
        "wrong: expected the chunk size to be a multiple of every non-zero group (LCM 1152 of [1152, 1152, 1152, "
        "1152, 1152, 0]), found 256 (the LMCache server's, from its log; no negotiation logged); set --chunk-size "
        "1152 on the LMCache server"
    )


def test_without_any_chunk_size_the_probe_says_not_yet_rather_than_guess() -> None:
    result = judged(HEALTHY, None)
    assert (result.status, result.exit_code, result.message) == (
        Status.NOT_YET,
        EXIT_NOT_YET,
        "not yet: all 5 'Resolved LMCache MP geometry' lines since vLLM 0.33.0 started say "
        "group_tokens_per_block=[1152, 1152, 1152, 1152, 1152, 0], scheduler_block_size=1152, but the chunk size is "
        "unknown: no --chunk-size was given and no 'TokenHasher initialized: chunk_size=C' line from the LMCache "
        "server in the 1000 bytes of log read; nothing to change yet while the server starts; if it never logs it, "
        "pass the server's --chunk-size to the probe or add the server's log (--log .../lmcache.log, LMCache's log "
        "level INFO)",
    )


def test_without_any_chunk_size_a_negotiated_line_is_enough() -> None:
    assert judged([*HEALTHY, NEGOTIATED], None).status is Status.READY


def test_the_chunk_size_is_not_needed_to_see_other_faults() -> None:
    wrong_shape = _lines("glm53-flash/wrong-shape", "vllm.log")
    assert judged(wrong_shape, None).message.startswith("wrong: expected group_tokens_per_block of the shape")


def test_the_servers_size_survives_a_vllm_restart_and_a_server_restart_replaces_it() -> None:
    facts = StartupFacts()
    facts.add_all(parse_lines([*SERVER_1152, *_lines("glm53-flash/restart-after-crash", "vllm.log")]))
    assert facts.restarts == 1
    assert facts.server_chunk_size == 1152
    facts.add_all(parse_lines([hasher_line(2304)]))
    assert facts.server_chunk_size == 2304


def test_the_servers_size_round_trips_and_combines() -> None:
    vllm, lmcache = StartupFacts(), StartupFacts()
    vllm.add_all(parse_lines(HEALTHY))
    lmcache.add_all(parse_lines(SERVER_1152))
    assert StartupFacts.from_json(json.loads(json.dumps(lmcache.to_json()))) == lmcache
    assert StartupFacts.combined([vllm, lmcache]).server_chunk_size == 1152
    assert StartupFacts.combined([lmcache, vllm]).server_chunk_size == 1152


def test_a_state_saved_before_the_servers_size_was_kept_is_refused() -> None:
    """Trusting it would lose a TokenHasher line already read past; the probe discards it and rescans the log."""
    old = StartupFacts().to_json()
    del old["server_chunk_size"]
    with pytest.raises(ValueError, match="facts are incomplete: KeyError\\('server_chunk_size'\\)"):
        StartupFacts.from_json(old)


_SIZES = st.sampled_from(["0", "64", "256", "1152", "2304", "99999999999", "x", ""])


@given(
    st.lists(st.one_of(_SIZES.map(hasher_line), st.sampled_from([*HEALTHY, NEGOTIATED])), max_size=40),
    st.sampled_from([None, 256, 1152]),
)
def test_any_mix_gets_a_one_line_verdict_and_survives_the_state_file(lines: list[str], chunk: int | None) -> None:
    facts = StartupFacts()
    facts.add_all(parse_lines(lines))
    assert StartupFacts.from_json(json.loads(json.dumps(facts.to_json()))) == facts
    result = evaluate(FLASH, 4, chunk, facts, 0)
    assert result.exit_code == {Status.READY: 0, Status.NOT_YET: 3, Status.WRONG: 4}[result.status]
    assert "\n" not in result.message
    if result.status is Status.READY:
        assert chunk is not None or facts.server_chunk_size is not None or facts.negotiated is not None


# --- the real command line ---


def run_probe(tmp_path: Path, scenario: str, *flags: str) -> subprocess.CompletedProcess[str]:
    logs = [f"--log={EXAMPLES / scenario / name}" for name in ("vllm.log", "lmcache.log")]
    profile = scenario.split("/")[0]
    command = [sys.executable, "-m", "glm53", "probe", "startup", "--profile", profile, *flags, *logs]
    return subprocess.run([*command, "--state-dir", str(tmp_path)], capture_output=True, text=True, check=False)


@pytest.mark.parametrize(
    ("scenario", "exit_code"),
    [
        ("glm53-flash/healthy", EXIT_READY),
        ("glm53/healthy", EXIT_READY),
        ("glm53-flash/partial-geometry", EXIT_NOT_YET),
        ("glm53-flash/wrong-chunk", EXIT_WRONG),
    ],
)
def test_cli_without_chunk_size_reads_it_from_the_servers_log(scenario: str, exit_code: int, tmp_path: Path) -> None:
    result = run_probe(tmp_path, scenario)
    assert (result.returncode, result.stderr) == (exit_code, "")
    if exit_code == EXIT_READY:
        assert "(the LMCache server's, from its log; no negotiation logged)" in result.stdout


def test_cli_told_another_size_than_the_server_logged_is_wrong(tmp_path: Path) -> None:
    result = run_probe(tmp_path, "glm53-flash/healthy", "--chunk-size", "256")
    assert (result.returncode, result.stdout, result.stderr) == (EXIT_WRONG, MISMATCH + "\n", "")


def test_cli_help_says_where_the_default_comes_from() -> None:
    result = subprocess.run(
        [sys.executable, "-m", "glm53", "probe", "startup", "--help"], capture_output=True, text=True, check=True
    )
    text = " ".join(result.stdout.split())
    assert "(default: the size the server logs; not yet until it does)" in text
    assert "default 256" not in text
