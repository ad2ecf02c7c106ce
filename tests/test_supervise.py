"""`glm53 supervise` as a real process: tee to stdout and file, rotation at the cap, exit codes, signal forwarding."""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

DEADLINE = 20.0
TRAP_TERM = (
    "import signal, sys, time\n"
    "def bye(signum, frame):\n"
    "    print(f'child got signal {signum}', flush=True)\n"
    "    sys.exit(0)\n"
    "signal.signal(signal.SIGTERM, bye)\n"
    "print('ready', flush=True)\n"
    "time.sleep(60)\n"
)


def _supervise(log: Path, *command: str, max_log_mb: str | None = None) -> list[str]:
    cap = ["--max-log-mb", max_log_mb] if max_log_mb else []
    return [sys.executable, "-m", "glm53", "supervise", "--log", str(log), *cap, "--", *command]


def _wait_for_text(path: Path, text: str) -> None:
    end = time.monotonic() + DEADLINE
    while time.monotonic() < end:
        if path.exists() and text in path.read_text():
            return
        time.sleep(0.02)
    raise AssertionError(f"{text!r} never appeared in {path}")


def test_copies_stdout_and_stderr_to_both_and_exits_with_the_childs_status(tmp_path: Path) -> None:
    log = tmp_path / "server.log"
    log.write_text("earlier run\n")
    script = "echo out; echo err >&2; exit 3"
    result = subprocess.run(_supervise(log, "sh", "-c", script), capture_output=True, text=True, timeout=DEADLINE)
    assert result.returncode == 3
    assert result.stdout.splitlines() == ["out", "err"]
    assert log.read_text().splitlines() == ["earlier run", "out", "err"]  # appended, never truncated


def test_rotates_to_dot_one_before_the_cap_is_exceeded(tmp_path: Path) -> None:
    log = tmp_path / "server.log"
    # 0.001 MiB = 1048 bytes; 200 lines of 10 bytes rotate the file more than once.
    script = "for i in $(seq 1000 1199); do echo line-$i; done"
    result = subprocess.run(_supervise(log, "sh", "-c", script, max_log_mb="0.001"), capture_output=True, timeout=20)
    assert result.returncode == 0
    rotated = log.with_name("server.log.1")
    assert log.stat().st_size <= 1048 and rotated.stat().st_size <= 1048
    assert rotated.stat().st_size > 1048 - 10  # filled up to the cap before rotating
    tail = (rotated.read_text() + log.read_text()).splitlines()
    assert tail == [f"line-{i}" for i in range(1200 - len(tail), 1200)]
    assert not log.with_name("server.log.2").exists()


def test_a_missing_command_exits_127_with_one_line(tmp_path: Path) -> None:
    result = subprocess.run(
        _supervise(tmp_path / "s.log", "no-such-server-binary"), capture_output=True, text=True, timeout=DEADLINE
    )
    assert result.returncode == 127
    assert result.stderr == "glm53 supervise: error: command not found: no-such-server-binary\n"


def test_no_command_is_a_usage_error(tmp_path: Path) -> None:
    result = subprocess.run(_supervise(tmp_path / "s.log"), capture_output=True, text=True, timeout=DEADLINE)
    assert result.returncode == 2
    assert result.stderr.startswith("glm53 supervise: error: no command given")


def test_a_child_killed_by_a_signal_gives_128_plus_the_signal(tmp_path: Path) -> None:
    result = subprocess.run(_supervise(tmp_path / "s.log", "sh", "-c", "kill -9 $$"), capture_output=True, timeout=20)
    assert result.returncode == 128 + signal.SIGKILL


def test_sigterm_is_forwarded_and_a_clean_child_exit_is_ours(tmp_path: Path) -> None:
    log = tmp_path / "s.log"
    process = subprocess.Popen(_supervise(log, sys.executable, "-c", TRAP_TERM), stdout=subprocess.DEVNULL)
    try:
        _wait_for_text(log, "ready")
        process.send_signal(signal.SIGTERM)
        assert process.wait(timeout=DEADLINE) == 0
    finally:
        process.kill()
        process.wait()
    assert f"child got signal {int(signal.SIGTERM)}" in log.read_text()


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_a_child_that_dies_of_the_forwarded_signal_gives_128_plus_it(tmp_path: Path, sig: signal.Signals) -> None:
    log = tmp_path / "s.log"
    process = subprocess.Popen(_supervise(log, "sh", "-c", "echo ready; exec sleep 60"), stdout=subprocess.DEVNULL)
    try:
        _wait_for_text(log, "ready")
        process.send_signal(sig)
        assert process.wait(timeout=DEADLINE) == 128 + sig
    finally:
        process.kill()
        process.wait()
