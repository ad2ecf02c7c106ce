"""`glm53 exporter` as a command: one-line errors for bad input, a clean stop on SIGTERM, and no crash on upstreams
that are down or answer garbage."""

from __future__ import annotations

import signal
import socket
from pathlib import Path

import pytest

from glm53 import cli
from tests.support.exporter_fakes import copy_logs, free_port, glm53_child, http_pages, scrape_samples, wired


def _args(logs: tuple[Path, Path], *extra: str) -> list[str]:
    vllm, lmcache = logs
    return ["exporter", "--log", str(vllm), "--log", str(lmcache), "--profile", "glm53-flash", *extra]


def _run(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str]:
    code = cli.main(argv)
    return code, capsys.readouterr().err.strip()


def test_a_url_without_scheme_is_a_one_line_error(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    argv = _args(copy_logs(tmp_path), "--vllm-url", "127.0.0.1:8000", "--lmcache-url", "http://127.0.0.1:8080")
    assert _run(argv, capsys) == (
        2,
        "glm53 exporter: error: expected an http(s) URL such as http://127.0.0.1:8000, got '127.0.0.1:8000'; "
        "fix the URL flag",
    )


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (["--chunk-size", "-256"], "--chunk-size must be a positive integer, got -256"),
        (["--chunk-size", "0"], "--chunk-size must be a positive integer, got 0"),
        (["--tensor-parallel-size", "0"], "--tensor-parallel-size must be a positive integer, got 0"),
        (["--timeout", "0"], "--timeout must be a positive, finite number of seconds, got 0"),
        (["--timeout", "nan"], "--timeout must be a positive, finite number of seconds, got nan"),
        (["--timeout", "inf"], "--timeout must be a positive, finite number of seconds, got inf"),
        (["--port", "99999"], "--port must be a TCP port from 0 to 65535, got 99999"),
        (["--port", "-1"], "--port must be a TCP port from 0 to 65535, got -1"),
    ],
)
def test_bad_numbers_are_one_line_errors(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], flags: list[str], message: str
) -> None:
    urls = ["--vllm-url", "http://127.0.0.1:8000", "--lmcache-url", "http://127.0.0.1:8080"]
    assert _run(_args(copy_logs(tmp_path), *urls, *flags), capsys) == (2, f"glm53 exporter: error: {message}")


def test_a_log_that_is_a_directory_is_a_one_line_error(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Before: the exporter started and answered every scrape with HTTP 500 and an IsADirectoryError traceback."""
    urls = ["--vllm-url", "http://127.0.0.1:8000", "--lmcache-url", "http://127.0.0.1:8080"]
    argv = ["exporter", "--log", str(tmp_path), "--profile", "glm53-flash", *urls]
    assert _run(argv, capsys) == (
        2,
        f"glm53 exporter: error: --log {str(tmp_path)!r} is a directory; give the log file itself, e.g. "
        f"{str(tmp_path / 'vllm.log')!r}",
    )


def test_a_log_that_turns_into_a_directory_does_not_break_scrapes(tmp_path: Path) -> None:
    vllm, lmcache = copy_logs(tmp_path)
    with wired([vllm, lmcache]) as (registry, _):
        assert registry.get_sample_value("glm53_probe_status", {"status": "ready"}) == 1
        lmcache.unlink()
        lmcache.mkdir()
        assert registry.get_sample_value("glm53_probe_status", {"status": "ready"}) == 1
        assert registry.get_sample_value("glm53_upstream_up", {"target": "lmcache"}) == 1


def test_a_busy_port_is_a_one_line_error(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen(1)
        port = busy.getsockname()[1]
        urls = ["--vllm-url", "http://127.0.0.1:8000", "--lmcache-url", "http://127.0.0.1:8080"]
        argv = _args(copy_logs(tmp_path), *urls, "--host", "127.0.0.1", "--port", str(port))
        assert _run(argv, capsys) == (
            1,
            f"glm53 exporter: error: could not listen on 127.0.0.1:{port} (Address already in use); "
            "pick a free port with --port",
        )


@pytest.mark.slow
def test_upstreams_down_or_garbled_are_counted_and_the_exporter_keeps_serving(tmp_path: Path) -> None:
    port = free_port()
    with http_pages({"/metrics": (200, "<html>LMCache admin</html>\n")}) as garbled:
        urls = ["--vllm-url", f"http://127.0.0.1:{free_port()}", "--lmcache-url", garbled]
        argv = _args(copy_logs(tmp_path), *urls, "--host", "127.0.0.1", "--port", str(port), "--timeout", "0.5")
        with glm53_child(argv, tmp_path / "exporter.out") as exporter:
            exporter.wait_for("serving http://")
            scrape_samples(f"http://127.0.0.1:{port}/metrics")
            samples = scrape_samples(f"http://127.0.0.1:{port}/metrics")
            exporter.proc.send_signal(signal.SIGTERM)
            assert exporter.proc.wait(timeout=30) == 0
    assert samples[("glm53_upstream_errors_total", frozenset({("target", "vllm"), ("reason", "unreachable")}))] == 2
    assert samples[("glm53_upstream_errors_total", frozenset({("target", "lmcache"), ("reason", "malformed")}))] == 2
    assert samples[("glm53_upstream_up", frozenset({("target", "lmcache")}))] == 0
    assert samples[("glm53_geometry_matches_profile", frozenset())] == 1
    assert "glm53 exporter: stopped" in (tmp_path / "exporter.out").read_text()
