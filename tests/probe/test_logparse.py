"""Log parsing against the seeds' literal lines, vLLM's decorated variants and garbage that must never raise."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from glm53.probe.logparse import (
    AttentionBlockSize,
    ChunkSizeRejected,
    EngineDied,
    EngineProcess,
    LineOrigin,
    MalformedLine,
    NegotiatedChunk,
    Record,
    ResolvedGeometry,
    RunStarted,
    ServerUnreachable,
    parse_line,
    parse_lines,
    parse_origin,
)

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "logs"
EXAMPLES = Path(__file__).resolve().parents[2] / "examples" / "logs"
FLASH_GROUPS = (1152, 1152, 1152, 1152, 1152, 0)
NO_ORIGIN = LineOrigin()
TP3 = LineOrigin("Worker_TP3", 812, 3)
ENGINE = LineOrigin("EngineCore", 41, None)
API = LineOrigin("APIServer", 1, None)


def generated(scenario: str, needle: str) -> str:
    """The first line of a generated example log (vLLM's and LMCache's own formatters) that contains `needle`."""
    text = (EXAMPLES / scenario / "vllm.log").read_text()
    return next(line.rstrip("\r") for line in text.split("\n") if needle in line)


@pytest.mark.parametrize(
    ("line", "expected"),
    [
        # Seed 000, verbatim (undecorated, the geometry cut with "...").
        (
            "Negotiated LMCache MP chunk size to 1152 (configured_min=256, required_alignment=1152)",
            NegotiatedChunk(1152, 256, 1152, NO_ORIGIN),
        ),
        (
            "Resolved LMCache MP geometry: group_tokens_per_block=[1152, 1152, 1152, 1152, 1152, 0], "
            "scheduler_block_size=1152, ...",
            ResolvedGeometry(FLASH_GROUPS, 1152, None, NO_ORIGIN),
        ),
        # Decorated as vLLM prints it, once per TP rank.
        (
            "(Worker_TP3 pid=812) INFO 11-29 07:00:01 [lmcache_mp_connector.py:668] Resolved LMCache MP geometry: "
            "group_tokens_per_block=[1152, 1152, 1152, 1152, 1152, 0], scheduler_block_size=1152, "
            "cache_model_name=zai-org/GLM-5.3-Flash",
            ResolvedGeometry(FLASH_GROUPS, 1152, "zai-org/GLM-5.3-Flash", TP3),
        ),
        (
            "(Worker_TP3 pid=812) INFO 11-29 07:00:01 [x.py:1] Resolved LMCache MP geometry: "
            "group_tokens_per_block=[64], scheduler_block_size=64, cache_model_name=zai-org/GLM-5.3",
            ResolvedGeometry((64,), 64, "zai-org/GLM-5.3", TP3),
        ),
        # The LMCache server's own decoration, and its source suffix in parentheses that is no process tag.
        (
            "[2026-11-29 07:00:01,123] LMCache INFO: Negotiated LMCache MP chunk size to 1152 (configured_min=256, "
            "required_alignment=1152) (server.py:211:lmcache.v1.multiprocess.server)",
            NegotiatedChunk(1152, 256, 1152, NO_ORIGIN),
        ),
        # vLLM's block-size line and its variants: a platform prefix, ANSI colours, another verb.
        (
            "(APIServer pid=1) INFO 11-29 07:00:01 [config.py:228] Setting attention block size to 1152 tokens to "
            "ensure that attention page size is >= mamba page size.",
            AttentionBlockSize(1152, LineOrigin("APIServer", 1, None)),
        ),
        (
            "\x1b[1;36m(EngineCore_DP0 pid=41)\x1b[0;0m INFO 11-29 07:00:01 [xpu.py:90] [XPU] Setting attention block "
            "size to 1152 tokens",
            AttentionBlockSize(1152, LineOrigin("EngineCore_DP0", 41, None)),
        ),
        ("Forcing attention block size to 64 tokens for GLM-5 sparse MLA.", AttentionBlockSize(64, NO_ORIGIN)),
        # Failures: the contract's refusal wording and the released 0.5.6 one, unreachable, engine death.
        (
            "(Worker_TP3 pid=812) ERROR 11-29 07:00:01 [m.py:751] ValueError: LMCache chunk size 256 must be a "
            "multiple of engine group 0 tokens_per_block 1152",
            ChunkSizeRejected(256, 1152, TP3),
        ),
        (
            "ValueError: group 0: lmcache_tokens_per_chunk 256 must be a multiple of tokens_per_block 1152",
            ChunkSizeRejected(256, 1152, NO_ORIGIN),
        ),
        (
            "(Worker_TP3 pid=812) ERROR 11-29 07:00:01 [a.py:316] Cannot reach the LMCache MP server at "
            "'tcp://127.0.0.1:5555' within 30.0s.",
            ServerUnreachable("tcp://127.0.0.1:5555", TP3),
        ),
        (
            "(EngineCore_DP0 pid=41) ERROR 11-29 07:00:01 [core.py:797] EngineCore failed to start.",
            EngineDied("EngineCore failed to start", LineOrigin("EngineCore_DP0", 41, None)),
        ),
        (
            "(APIServer pid=1) RuntimeError: Engine core initialization failed. See root cause above.",
            EngineDied("Engine core initialization failed", LineOrigin("APIServer", 1, None)),
        ),
    ],
)
def test_recognised_lines(line: str, expected: Record) -> None:
    assert parse_line(line) == expected


@pytest.mark.parametrize(
    ("scenario", "needle", "expected"),
    [
        # LMCache's own format, printed by the scheduler and every worker alike: no process tag.
        (
            "glm53-flash/healthy",
            "Resolved LMCache MP geometry",
            ResolvedGeometry(FLASH_GROUPS, 1152, "zai-org/GLM-5.3-Flash", NO_ORIGIN),
        ),
        ("glm53-flash/healthy", "Setting attention block size", AttentionBlockSize(1152, API)),
        # The released 0.5.6 wording ("group 0", no "engine"), in EngineCore's logged traceback.
        ("glm53-flash/wrong-chunk", "ValueError: LMCache chunk size", ChunkSizeRejected(256, 1152, ENGINE)),
        ("glm53-flash/wrong-chunk", "EngineCore failed to start", EngineDied("EngineCore failed to start", ENGINE)),
        (
            "glm53-flash/wrong-chunk",
            "RuntimeError: Engine core initialization failed",
            EngineDied("Engine core initialization failed", NO_ORIGIN),
        ),
        (
            "glm53-flash/sidecar-unreachable",
            "Cannot reach the LMCache MP server",
            ServerUnreachable("tcp://localhost:5555", NO_ORIGIN),
        ),
        # Both start banners: the plain one and the logo's version line.
        ("glm53-flash/plain-banner", "vLLM server version", RunStarted("0.33.0", "zai-org/GLM-5.3-Flash", API)),
        ("glm53-flash/healthy", "version 0.33.0", RunStarted("0.33.0", None, API)),
        ("glm53-flash/healthy", "(EngineCore pid=41)", EngineProcess(ENGINE)),
    ],
)
def test_generated_lines(scenario: str, needle: str, expected: Record) -> None:
    assert parse_line(generated(scenario, needle)) == expected


def test_the_coloured_logo_starts_a_run() -> None:
    lines = (FIXTURES / "coloured-flash.log").read_text().split("\n")
    records = [r for r in parse_lines(lines) if isinstance(r, RunStarted)]
    assert records == [RunStarted("0.33.0", None, API)]


def test_the_logo_and_multi_line_messages_carry_no_other_fact() -> None:
    # The logo's other lines, the LMCache warning's continuation lines and the traceback source lines are no facts.
    for scenario in ("glm53-flash/healthy", "glm53-flash/sidecar-unreachable", "glm53-flash/wrong-chunk"):
        lines = (EXAMPLES / scenario / "vllm.log").read_text().split("\n")
        for line in lines:
            if "[startup.py:" in line and "version 0.33.0" not in line:
                assert parse_line(line) is None
            if line.startswith(("This usually", "To ", "    ", "See ", "  File")):
                assert parse_line(line) is None


def test_engine_lines_are_reported_once_per_pid() -> None:
    line = generated("glm53-flash/healthy", "(EngineCore pid=41)")
    lines = [line, line, line.replace("pid=41", "pid=97"), line.replace("pid=41", "pid=97")]
    assert list(parse_lines(lines)) == [EngineProcess(ENGINE), EngineProcess(LineOrigin("EngineCore", 97, None))]


@pytest.mark.parametrize(
    ("line", "kind"),
    [
        # Seed 001's placeholder form carries no numbers at all.
        ("Resolved LMCache MP geometry: group_tokens_per_block=[...], scheduler_block_size=...", "geometry"),
        ("Resolved LMCache MP geometry: group_tokens_per_block=[1152, 11", "geometry"),  # half-written
        ("Resolved LMCache MP geometry: group_tokens_per_block=[99999999999, 0], scheduler_block_size=1", "geometry"),
        ("Resolved LMCache MP geometry: group_tokens_per_block=[1152], scheduler_block_size=12.5", "geometry"),
        ("Negotiated LMCache MP chunk size to 1e9 (configured_min=256, required_alignment=1152)", "negotiated chunk"),
        ("Negotiated LMCache MP chunk size to", "negotiated chunk"),
        ("Setting attention block size to N tokens", "attention block size"),
        ("Setting attention block size to -5 tokens", "attention block size"),
        ("LMCache chunk size 99999999999999 must be a multiple of tokens_per_block 1152", "chunk size error"),
    ],
)
def test_untrustworthy_lines_are_malformed(line: str, kind: str) -> None:
    record = parse_line(line)
    assert isinstance(record, MalformedLine)
    assert record.kind == kind
    assert record.text == line


@pytest.mark.parametrize(
    "line",
    [
        "",
        "(APIServer pid=1) INFO 11-29 07:00:01 [api_server.py:1910] vLLM API server version 0.33.0",
        "group 0: tokens_per_block 1152 must be a multiple of slots_per_block 288",  # a different upstream check
        "Cannot reach the LMCache MP server",  # no URL: the hint alone is no fact
        "\x00\x01\ufffd\ufffd",
    ],
)
def test_other_lines_carry_no_record(line: str) -> None:
    assert parse_line(line) is None


@pytest.mark.parametrize(
    ("line", "origin"),
    [
        ("(Worker_TP3 pid=812) INFO x", TP3),
        ("(Worker_PP1_TP2 pid=9) DEBUG x", LineOrigin("Worker_PP1_TP2", 9, 2)),
        ("(Worker_TP0_EP0 pid=9) DEBUG x", LineOrigin("Worker_TP0_EP0", 9, 0)),
        ("\x1b[0;36m(Worker_TP5_EP5 pid=9)\x1b[0;0m INFO x", LineOrigin("Worker_TP5_EP5", 9, 5)),
        ("(APIServer pid=1) Traceback (most recent call last):", LineOrigin("APIServer", 1, None)),
        ("(EngineCore_DP0) INFO x", LineOrigin("EngineCore_DP0", None, None)),
        ("INFO something (Worker_TP1 pid=4) later in the message", NO_ORIGIN),
        ("[2026-11-29 07:00:01,123] LMCache INFO: x (server.py:211:lmcache.v1.multiprocess.server)", NO_ORIGIN),
    ],
)
def test_origin_is_read_only_from_the_decoration(line: str, origin: LineOrigin) -> None:
    assert parse_origin(line) == origin


def test_origin_label() -> None:
    assert TP3.label == "Worker_TP3 pid=812"
    assert NO_ORIGIN.label == "unknown process"
    assert LineOrigin("EngineCore_DP0").label == "EngineCore_DP0"


def _fixture_lines(name: str) -> list[str]:
    return (FIXTURES / name).read_bytes().decode("utf-8", errors="replace").splitlines()


def test_garbage_fixture_yields_only_the_real_line_and_malformed_ones() -> None:
    records = list(parse_lines(_fixture_lines("garbage.log")))
    assert [type(r) for r in records] == [ResolvedGeometry, MalformedLine, MalformedLine]
    assert records[0] == ResolvedGeometry(FLASH_GROUPS, 1152, "zai-org/GLM-5.3-Flash", NO_ORIGIN)


def test_absurd_numbers_are_all_malformed() -> None:
    records = [r for r in parse_lines(_fixture_lines("absurd.log")) if not isinstance(r, EngineDied | EngineProcess)]
    assert [r.kind for r in records if isinstance(r, MalformedLine)] == [
        "geometry",
        "geometry",
        "attention block size",
        "chunk size error",
    ]
    assert len(records) == 4


def test_seed_fixture_lines() -> None:
    records = list(parse_lines(_fixture_lines("seed-flash.log")))
    assert records == [
        AttentionBlockSize(1152, NO_ORIGIN),
        NegotiatedChunk(1152, 256, 1152, NO_ORIGIN),
        ResolvedGeometry(FLASH_GROUPS, 1152, None, NO_ORIGIN),
    ]


@given(st.text(max_size=400))
def test_parse_line_never_raises(text: str) -> None:
    parse_line(text)


@given(st.text(alphabet="0123456789[], .-=xe\ufffd", max_size=60))
def test_parse_line_never_raises_on_mangled_facts(tail: str) -> None:
    for prefix in (
        "Resolved LMCache MP geometry: group_tokens_per_block=",
        "Negotiated LMCache MP chunk size to ",
        "Setting attention block size to ",
        "LMCache chunk size ",
    ):
        parse_line(prefix + tail)
