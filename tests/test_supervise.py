"""`glm53 supervise` as a real process: tee to stdout and file, rotation at the cap, exit codes, signal forwarding, and
the L2 janitor (`--l2-dir`, `--l2-max-bytes`) bounding a directory its child writes."""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path

import pytest

from tests.support.l2kit import CHUNK_NAME, chunk_name

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


def _supervise(log: Path, *command: str, max_log_mb: str | None = None, l2: Sequence[str] = ()) -> list[str]:
    cap = ["--max-log-mb", max_log_mb] if max_log_mb else []
    return [sys.executable, "-m", "glm53", "supervise", "--log", str(log), *cap, *l2, "--", *command]


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


# A stand-in for LMCache's fs adapter: writes chunk files as it does (temp file, then renamed into place), one every
# PAUSE seconds, and after each write records (seconds, bytes in the directory, bytes written so far) to OUT.
CHUNK_WRITER = """
import json, os, sys, time
directory, name, count, size, pause, out = sys.argv[1:]
os.makedirs(directory, exist_ok=True)

def held():
    total = 0
    for entry in os.scandir(directory):
        try:
            total += entry.stat().st_size
        except FileNotFoundError:
            pass
    return total

samples, start = [], time.monotonic()
for index in range(int(count)):
    final = os.path.join(directory, name.format(index))
    temp = final[: -len('.data')] + '.tmp'
    with open(temp, 'wb') as file:
        file.write(bytes(int(size)))
    os.replace(temp, final)
    samples.append((time.monotonic() - start, held(), (index + 1) * int(size)))
    time.sleep(float(pause))
with open(out, 'w') as file:
    json.dump(samples, file)
print('writer done', flush=True)
"""
CHUNK_BYTES = 4096
L2_MAX_BYTES = 16 * CHUNK_BYTES
CHUNKS = 200
PAUSE = 0.02  # some 160 KiB a second: 2.5 times the bound between two janitor passes
# A pass comes every second; what was written within this window may not have been seen by one yet.
WINDOW = 2.0


def test_the_l2_janitor_keeps_a_directory_bounded_and_says_so_in_the_log(tmp_path: Path) -> None:
    directory, log, record = tmp_path / "l2", tmp_path / "s.log", tmp_path / "samples.json"
    l2 = ["--l2-dir", str(directory), "--l2-max-bytes", str(L2_MAX_BYTES)]
    writer = [sys.executable, "-c", CHUNK_WRITER, str(directory), CHUNK_NAME, str(CHUNKS), str(CHUNK_BYTES)]
    result = subprocess.run(
        _supervise(log, *writer, str(PAUSE), str(record), l2=l2), capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 0, result.stderr
    samples = json.loads(record.read_text())
    for at, held, written in samples:
        recent = written - max((w for t, _, w in samples if t <= at - WINDOW), default=0)
        assert held <= L2_MAX_BYTES + recent, f"{held} bytes at {at:.2f} s, {recent} written in the {WINDOW:g} s before"
    assert samples[-1][2] >= 10 * L2_MAX_BYTES  # what the directory would hold without the janitor
    # Oldest first: what is left is the newest files, all of them up to the last one written.
    left = sorted(path.name for path in directory.iterdir())
    assert left == [chunk_name(index) for index in range(CHUNKS - len(left), CHUNKS)]
    line = re.compile(rf"l2 janitor: deleted \d+ files? \(.+\), {re.escape(str(directory))} now .+ of 64\.0 KiB bound")
    assert any(line.fullmatch(text) for text in log.read_text().splitlines()), log.read_text()
    assert any(line.fullmatch(text) for text in result.stdout.splitlines())


@pytest.mark.parametrize(
    ("l2", "message"),
    [
        (["--l2-dir", "d"], "--l2-dir needs --l2-max-bytes: give both to bound the L2 directory, or neither"),
        (["--l2-max-bytes", "9"], "--l2-max-bytes needs --l2-dir: give both to bound the L2 directory, or neither"),
        (
            ["--l2-dir", "d", "--l2-max-bytes", "0"],
            "argument --l2-max-bytes: expected a whole number of at least 1, got '0'",
        ),
        (
            ["--l2-dir", "d", "--l2-max-bytes", "1e9"],
            "argument --l2-max-bytes: expected a whole number of at least 1, got '1e9'",
        ),
    ],
)
def test_the_l2_flags_go_together_and_the_bound_is_a_byte_count(tmp_path: Path, l2: list[str], message: str) -> None:
    result = subprocess.run(_supervise(tmp_path / "s.log", "true", l2=l2), capture_output=True, text=True, timeout=20)
    assert (result.returncode, result.stderr) == (
        2,
        f"glm53 supervise: error: {message} (see `glm53 supervise --help`)\n",
    )


def test_an_l2_dir_that_is_a_file_is_one_line(tmp_path: Path) -> None:
    afile = tmp_path / "l2"
    afile.write_text("")
    l2 = ["--l2-dir", str(afile), "--l2-max-bytes", "1"]
    result = subprocess.run(_supervise(tmp_path / "s.log", "true", l2=l2), capture_output=True, text=True, timeout=20)
    assert (result.returncode, result.stderr) == (
        2,
        f"glm53 supervise: error: --l2-dir {afile} is not a directory; give the fs L2 adapter's base_path\n",
    )
