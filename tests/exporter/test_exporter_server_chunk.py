"""`glm53 exporter` and the chunk size the LMCache server logs at start (lmcache 0.5.6
lmcache/v1/multiprocess/token_hasher.py:67, `TokenHasher initialized: chunk_size=C, ...`): without `--chunk-size` that
size is judged, never an assumed 256, and it is exported as `glm53_server_chunk_size_tokens`.

The logs are the generated GLM-5.3-Flash TP 4 examples (tests/fixtures/generate_logs.py): the server's lmcache.log
says chunk_size=1152. The upstream URLs point at closed ports; only the log facts are read here."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
from prometheus_client.registry import CollectorRegistry

from glm53 import cli
from glm53.commands.exporter import build_parser, build_registry
from tests.support.exporter_fakes import copy_logs, free_port


@contextmanager
def exporter(logs: list[Path], *flags: str) -> Iterator[CollectorRegistry]:
    """The registry `glm53 exporter --log ... --profile glm53-flash FLAGS` serves, without serving it."""
    argv = [arg for log in logs for arg in ("--log", str(log))] + ["--profile", "glm53-flash", *flags]
    argv += ["--vllm-url", f"http://127.0.0.1:{free_port()}", "--lmcache-url", f"http://127.0.0.1:{free_port()}"]
    registry, collector = build_registry(build_parser().parse_args([*argv, "--timeout", "0.5"]))
    try:
        yield registry
    finally:
        collector.close()


def status(registry: CollectorRegistry) -> str:
    (current,) = [
        s for s in ("ready", "not_yet", "wrong") if registry.get_sample_value("glm53_probe_status", {"status": s})
    ]
    return current


def test_without_chunk_size_a_healthy_1152_pod_is_ready(tmp_path: Path) -> None:
    """Before: `--chunk-size` defaulted to 256 and this pod was reported wrong."""
    with exporter(list(copy_logs(tmp_path))) as registry:
        assert status(registry) == "ready"
        assert registry.get_sample_value("glm53_server_chunk_size_tokens") == 1152
        assert registry.get_sample_value("glm53_configured_chunk_size_tokens") == 1152
        assert registry.get_sample_value("glm53_effective_chunk_size_tokens") == 1152


def test_told_another_size_than_the_server_logged_is_wrong_as_the_probe_says(tmp_path: Path) -> None:
    logs = list(copy_logs(tmp_path))
    with exporter(logs, "--chunk-size", "256") as registry:
        assert status(registry) == "wrong"
        # What the deployment said, what the server runs with: the gauges show the two numbers the probe names.
        assert registry.get_sample_value("glm53_configured_chunk_size_tokens") == 256
        assert registry.get_sample_value("glm53_server_chunk_size_tokens") == 1152
        assert registry.get_sample_value("glm53_effective_chunk_size_tokens") == 1152
    probe = ["probe", "startup", "--profile", "glm53-flash", "--chunk-size", "256", "--state-dir", str(tmp_path / "s")]
    assert cli.main([*probe, *(arg for log in logs for arg in ("--log", str(log)))]) == 4


def test_without_the_servers_log_or_a_chunk_size_it_is_not_yet_and_the_sizes_are_absent(tmp_path: Path) -> None:
    vllm, _ = copy_logs(tmp_path)
    with exporter([vllm]) as registry:
        assert status(registry) == "not_yet"
        for name in ("server", "configured", "effective"):
            assert registry.get_sample_value(f"glm53_{name}_chunk_size_tokens") is None
        assert registry.get_sample_value("glm53_geometry_matches_profile") == 1


def test_a_chunk_size_flag_still_stands_in_for_a_server_log_that_is_not_read(tmp_path: Path) -> None:
    vllm, _ = copy_logs(tmp_path)
    with exporter([vllm], "--chunk-size", "1152") as registry:
        assert status(registry) == "ready"
        assert registry.get_sample_value("glm53_server_chunk_size_tokens") is None
        assert registry.get_sample_value("glm53_effective_chunk_size_tokens") == 1152


def test_the_help_says_where_the_default_comes_from(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        build_parser().parse_args(["--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert "(default: the size the server logs; not_yet until it does)" in text
    assert "256" not in text
