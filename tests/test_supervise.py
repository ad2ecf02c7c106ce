"""`glm53 supervise` as a real process: tee to stdout and file, rotation at the cap, exit codes, signal forwarding."""

from __future__ import annotations

import contextlib
import os
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


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT, signal.SIGHUP])
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


def _kill_pid_in(path: Path) -> None:
    with contextlib.suppress(FileNotFoundError, ValueError, ProcessLookupError):
        os.kill(int(path.read_text()), signal.SIGKILL)


def test_returns_the_childs_status_at_once_although_an_orphan_holds_the_output_pipe(tmp_path: Path) -> None:
    # The case: `sleep 20 &` inherits the pipe, so waiting for end-of-file would take 20 s.
    orphan = tmp_path / "orphan.pid"
    script = f"echo before; sleep 20 & echo $! > {orphan}; exit 3"
    started = time.monotonic()
    try:
        result = subprocess.run(_supervise(tmp_path / "s.log", "bash", "-c", script), capture_output=True, timeout=20)
        elapsed = time.monotonic() - started
    finally:
        _kill_pid_in(orphan)
    assert result.returncode == 3
    assert elapsed < 5, f"supervise took {elapsed:.1f} s to return after its child exited"  # not 20 s
    assert result.stdout == b"before\n"
    assert (tmp_path / "s.log").read_text() == "before\n"


def _state_and_parent(pid: int) -> tuple[str, int] | None:
    """A process's state letter and parent pid from /proc, or None once it is gone (reaped)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except FileNotFoundError:
        return None
    return fields[0], int(fields[1])


@pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="needs Linux /proc")
def test_orphans_are_reparented_to_supervise_and_reaped(tmp_path: Path) -> None:
    # The subshell exits at once, orphaning `sleep 1`, which Linux hands to supervise (the child subreaper); when it
    # exits it must be reaped while the server still runs, not left a zombie until supervise ends.
    orphan = tmp_path / "orphan.pid"
    script = f"(sleep 1 & echo $! > {orphan}); echo ready; sleep 30"
    process = subprocess.Popen(_supervise(tmp_path / "s.log", "bash", "-c", script), stdout=subprocess.DEVNULL)
    try:
        _wait_for_text(tmp_path / "s.log", "ready")
        pid = int(orphan.read_text())
        seen = _state_and_parent(pid)
        assert seen is None or seen[1] == process.pid, f"orphan {pid} is {seen}, not a child of supervise"
        end = time.monotonic() + DEADLINE
        while _state_and_parent(pid) is not None and time.monotonic() < end:
            time.sleep(0.05)
        assert _state_and_parent(pid) is None, f"orphan {pid} is {_state_and_parent(pid)}, not reaped"
        assert process.poll() is None  # reaped while the server still runs
    finally:
        process.kill()
        process.wait()


@pytest.mark.parametrize("value", ["inf", "nan", "0", "-1", "x"])
def test_a_max_log_mb_that_is_not_a_positive_finite_number_is_one_line(tmp_path: Path, value: str) -> None:
    result = subprocess.run(
        _supervise(tmp_path / "s.log", "true", max_log_mb=value), capture_output=True, text=True, timeout=DEADLINE
    )
    assert result.returncode == 2
    assert result.stderr == (
        f"glm53 supervise: error: argument --max-log-mb: expected a positive finite number, got {value!r} "
        "(see `glm53 supervise --help`)\n"
    )


def test_a_huge_max_log_mb_means_never_rotate(tmp_path: Path) -> None:
    result = subprocess.run(_supervise(tmp_path / "s.log", "echo", "hi", max_log_mb="1e300"), capture_output=True)
    assert (result.returncode, (tmp_path / "s.log").read_text()) == (0, "hi\n")


def test_a_log_path_that_is_a_directory_is_one_line(tmp_path: Path) -> None:
    result = subprocess.run(_supervise(tmp_path, "true"), capture_output=True, text=True, timeout=DEADLINE)
    assert result.returncode == 2
    assert result.stderr == f"glm53 supervise: error: cannot append to the log file {tmp_path}: Is a directory\n"


def _can_be_pid_1() -> bool:
    probe = ["unshare", "--pid", "--fork", "--mount-proc", "true"]
    try:
        return subprocess.run(probe, capture_output=True, timeout=DEADLINE).returncode == 0
    except FileNotFoundError:
        return False


@pytest.mark.skipif(not _can_be_pid_1(), reason="needs unshare(1) and the right to create a PID namespace (root)")
def test_as_pid_1_it_reaps_orphans_and_returns_at_once(tmp_path: Path) -> None:
    # What happens in a container without tini in front: supervise is PID 1, every orphan of the namespace is its own.
    script = "(sleep 0.2 &); sleep 1; ps -eo stat= | grep -c '^Z' || true; sleep 20 & exit 5"
    command = ["unshare", "--pid", "--fork", "--mount-proc", *_supervise(tmp_path / "s.log", "bash", "-c", script)]
    started = time.monotonic()
    result = subprocess.run(command, capture_output=True, text=True, timeout=DEADLINE)
    assert (result.returncode, result.stdout) == (5, "0\n")  # no zombie left, the child's status at once
    assert time.monotonic() - started < 5
