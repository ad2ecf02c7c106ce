"""The startup probe and the exporter on the logs vLLM 0.34.0 (the opt-in engine generation) writes: the same verdicts
and facts as on 0.33.0's.

The 0.34.0 logs under tests/fixtures/logs/vllm-0.34.0/ are the same scenarios as examples/logs/ and the other generated
fixtures, generated from the 0.34.0 wheel (`tests/fixtures/generate_logs.py --vllm-version 0.34.0`). They differ from
0.33.0's in the version, the call sites' line numbers and the worker's model-load line; none of that may change what
the probe or the exporter concludes. examples/logs/README.md's table stays the one spec: each row's expectation here is
its 0.33.0 message with the version and the byte count of the 0.34.0 logs.
"""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path

import pytest

from glm53.exporter.facts import LogFacts, LogWatch
from glm53.probe.logparse import MalformedLine, Record, RunStarted, parse_lines
from glm53.probe.logtail import LogFollower
from glm53.profiles import get_profile
from tests.probe.test_judge import (
    EXAMPLES,
    FIXTURES,
    assert_committed_logs_are_the_generators_output,
    probe_example,
    readme_verdicts,
)

VERSION = "0.34.0"
ROOT = FIXTURES / f"vllm-{VERSION}"
EXAMPLES_034 = ROOT / "examples"
_BYTES_READ = re.compile(r"\b(read|reading) \d+ bytes\b")
_CALL_SITE_LINE = re.compile(r"(\[[\w.]+\.py:)\d+\]")


def counterpart(path: Path) -> Path:
    """The 0.33.0 file generated from the same scenario as the 0.34.0 file at `path`."""
    if path.is_relative_to(EXAMPLES_034):
        return EXAMPLES / path.relative_to(EXAMPLES_034)
    return FIXTURES / path.relative_to(ROOT)


def records_of(path: Path) -> list[Record]:
    """The records the probe and the exporter take from one whole log, read as they read it (bytes decoded, a
    half-written last line held back), with the line numbers of vLLM's call sites taken out of the unparsable lines
    they quote: the sites moved in 0.34."""
    return [
        dataclasses.replace(record, text=_CALL_SITE_LINE.sub(r"\g<1>N]", record.text))
        if isinstance(record, MalformedLine)
        else record
        for record in parse_lines(LogFollower(path).read_new_lines())
    ]


def test_committed_034_logs_are_the_generators_output(monkeypatch: pytest.MonkeyPatch) -> None:
    """Regenerate with `python tests/fixtures/generate_logs.py --vllm-version 0.34.0`."""
    assert_committed_logs_are_the_generators_output(monkeypatch, VERSION)


@pytest.mark.parametrize(("scenario", "chunk", "exit_code", "message"), readme_verdicts())
def test_cli_on_the_034_example_logs_says_what_the_readme_says(
    scenario: str, chunk: str, exit_code: int, message: str, tmp_path: Path
) -> None:
    size = sum((EXAMPLES_034 / scenario / name).stat().st_size for name in ("vllm.log", "lmcache.log"))
    expected = _BYTES_READ.sub(rf"\g<1> {size} bytes", message.replace("vLLM 0.33.0", f"vLLM {VERSION}"))
    result = probe_example(EXAMPLES_034, scenario, chunk, tmp_path)
    assert (result.returncode, result.stdout, result.stderr) == (exit_code, expected + "\n", "")


@pytest.mark.parametrize("path", sorted(ROOT.rglob("*.log")), ids=lambda path: str(path.relative_to(ROOT)))
def test_every_034_log_gives_the_records_of_its_033_counterpart(path: Path) -> None:
    """Banners, geometry, block sizes, refusals, engine deaths, pids and ranks, unparsable lines: record for record
    what the 0.33.0 log gives, with 0.34.0 in every banner. The probe's facts are built from these records alone."""
    expected = [
        dataclasses.replace(record, version=VERSION) if isinstance(record, RunStarted) else record
        for record in records_of(counterpart(path))
    ]
    assert expected  # every generated log has something the probe reads
    assert records_of(path) == expected


@pytest.mark.parametrize(("scenario", "chunk"), [(scenario, chunk) for scenario, chunk, *_ in readme_verdicts()])
def test_the_exporter_reads_the_034_logs_as_the_033_ones(scenario: str, chunk: str) -> None:
    """The exporter's facts (its verdict, geometry, chunk sizes, time from start to geometry) besides bytes read."""
    profile = get_profile(scenario.split("/")[0])

    def poll(examples: Path) -> LogFacts:
        logs = [examples / scenario / name for name in ("vllm.log", "lmcache.log")]
        facts = LogWatch(logs, profile, profile.tensor_parallel_size, int(chunk)).poll()
        return dataclasses.replace(facts, bytes_read=())

    assert poll(EXAMPLES_034) == poll(EXAMPLES)
