"""`glm53 exporter` as a command: one-line errors for bad input, a clean stop on SIGTERM, and no crash on upstreams
that are down or answer garbage."""

from __future__ import annotations

import signal
import socket
from pathlib import Path

import pytest
from exporter_fakes import copy_logs, free_port, glm53_child, http_pages, scrape_samples

from glm53 import cli


def _args(logs: tuple[Path, Path], *extra: str) -> list[str]:
    vllm, lmcache = logs
    return ["exporter", "--log", str(vllm), "--log", str(lmcache), "--profile", "glm53-flash", *extra]


def _run(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str]:
    code = cli.main(argv)
    return code, capsys.readouterr().err.strip()


def test_a_url_without_scheme_is_a_one_line_error(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    argv = _args(copy_logs(tmp_path), "--vllm-url", "127.0.0.1:8000", "--lmcache-url", "http://127.0.0.1:9090")
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
        (["--timeout", "0"], "--timeout must be a positive number of seconds, got 0"),
    ],
)
def test_non_positive_numbers_are_one_line_errors(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], flags: list[str], message: str
) -> None:
    urls = ["--vllm-url", "http://127.0.0.1:8000", "--lmcache-url", "http://127.0.0.1:9090"]
    assert _run(_args(copy_logs(tmp_path), *urls, *flags), capsys) == (2, f"glm53 exporter: error: {message}")


def test_a_busy_port_is_a_one_line_error(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen(1)
        port = busy.getsockname()[1]
        urls = ["--vllm-url", "http://127.0.0.1:8000", "--lmcache-url", "http://127.0.0.1:9090"]
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
