"""Run one server as a child process, copy its output to our stdout and to a size-capped log file, relay signals.

This is the container entrypoint of both images (behind `tini`, the image's PID 1). Kubernetes reads container
stdout, while the startup probe and the exporter tail a file on the shared log volume; the file must stay bounded on a
long-running pod, so it is rotated to `FILE.1` (one generation, replacing the previous one) before it would exceed the
cap. A rotated file is a new inode that starts small, which is what the probe's tailing logic expects. Forwarded
signals go to the child so the server can shut down cleanly, and our exit status is the child's (128 + signal number
when a signal killed it, like a shell).

The child's exit, not the end of its output, ends supervision: a server that leaves a background process behind
(`bash -c 'sleep 20 & exit 3'`) keeps the output pipe open in that orphan, and waiting for end-of-file would hold the
pod in Terminating for as long as the orphan lives. Orphans are re-parented to us (we register as the child
subreaper) or to us as PID 1 when no init runs in front, so we reap them too: a long-running server that forks helpers
would otherwise fill the process table with zombies.

A container started again in the same pod (the kubelet restarts a native sidecar at once the first time) can be held
back before its server starts (`--hold-after-restart`): the count of starts lives next to the log, on the pod's log
volume, which outlives the container but not the pod. The LMCache sidecar needs that: LMCache's connector only
registers its KV caches again after a heartbeat ping *failed* (lmcache 0.5.6
lmcache/integration/vllm/vllm_multi_process_adapter.py:593-614, 1716-1761), and the server answers a ping from any
instance, known or not (lmcache/v1/multiprocess/modules/management.py:105-120), so a server back before a ping timed
out is never told about the engine and rejects every store (LMCache #4642). Held longer than the ping period plus its
timeout, the restart is always seen.

With an L2 bound (`--l2-dir DIR --l2-max-bytes N`), the same process runs the janitor that keeps LMCache's filesystem
L2 directory under N bytes (`glm53.l2janitor`: that tier never evicts, and the emptyDir under it evicts the pod), from
before the server starts until supervision ends; its lines reach stdout and the log file like the server's. With a
shared tier (`--wait-for-resp HOST:PORT`), the server starts only once that Redis answers (`glm53.l2gate`: LMCache's
Redis client connects once, at start, and a failed connect leaves its lookups hanging).
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import select
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from types import FrameType
from typing import BinaryIO

from glm53.errors import Glm53Error
from glm53.l2gate import RespEndpoint, wait_for_tier
from glm53.l2janitor import Bound, Janitor

MIB = 1024 * 1024
# Shell conventions for a command that could not be started.
EXIT_NOT_FOUND = 127
EXIT_NOT_EXECUTABLE = 126
# What an init forwards: the kubelet's TERM, a terminal's INT/QUIT/HUP, and the user signals servers use for reloads.
FORWARDED_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGQUIT, signal.SIGUSR1, signal.SIGUSR2)
# How often we look for the child's exit and for zombies while its output is quiet.
POLL_SECONDS = 0.1
# After the child exited: how long output still in the pipe (or written by an orphan) is copied before we return.
DRAIN_SECONDS = 1.0
READ_BYTES = 64 * 1024
# A line longer than this (a progress bar redrawn with '\r') is written out unfinished rather than buffered forever.
MAX_PENDING_BYTES = 64 * 1024
# prctl(2): PR_SET_CHILD_SUBREAPER makes orphaned descendants ours instead of PID 1's; PR_GET_ reads the setting.
PR_SET_CHILD_SUBREAPER = 36
PR_GET_CHILD_SUBREAPER = 37


class RotatingLog:
    """An append-only log file that is renamed to `<path>.1` before a write would push it past `max_bytes`.

    Writes are serialised: the L2 janitor's thread writes its lines between the child's.
    """

    def __init__(self, path: Path, max_bytes: int) -> None:
        self.path = path
        self.max_bytes = max_bytes
        self._file = self._open()
        self._lock = threading.Lock()

    def _open(self) -> BinaryIO:
        return open(self.path, "ab")

    def write(self, data: bytes) -> None:
        with self._lock:
            size = self._file.tell()
            if size > 0 and size + len(data) > self.max_bytes:
                self._file.close()
                os.replace(self.path, self.path.with_name(self.path.name + ".1"))
                self._file = self._open()
            self._file.write(data)
            self._file.flush()

    def close(self) -> None:
        self._file.close()


class LineTee:
    """Copies a byte stream to the log line by line (rotation never splits a line) and to an echo stream."""

    def __init__(self, log: RotatingLog, echo: BinaryIO | None) -> None:
        self._log = log
        self._echo = echo
        self._pending = b""

    def feed(self, data: bytes) -> None:
        self._pending += data
        cut = self._pending.rfind(b"\n") + 1
        if not cut and len(self._pending) > MAX_PENDING_BYTES:
            cut = len(self._pending)
        if cut:
            self._emit(self._pending[:cut])
            self._pending = self._pending[cut:]

    def finish(self) -> None:
        """Write out an unterminated last line."""
        if self._pending:
            self._emit(self._pending)
            self._pending = b""

    def _emit(self, data: bytes) -> None:
        for line in data.splitlines(keepends=True):
            self._log.write(line)
        if self._echo is not None:
            try:
                self._echo.write(data)
                self._echo.flush()
            except BrokenPipeError:
                self._echo = None  # nobody reads our stdout any more; the log file still gets everything


def start_child(command: Sequence[str]) -> subprocess.Popen[bytes]:
    """Start `command` with stdout and stderr merged into one pipe, or fail the way a shell would."""
    try:
        return subprocess.Popen(list(command), stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    except FileNotFoundError:
        raise Glm53Error(f"command not found: {command[0]}", EXIT_NOT_FOUND) from None
    except PermissionError:
        raise Glm53Error(f"permission denied: {command[0]} is not executable", EXIT_NOT_EXECUTABLE) from None


def exit_status(returncode: int) -> int:
    """A child's exit status as a shell reports it: negative Popen codes (killed by signal N) become 128 + N."""
    return 128 - returncode if returncode < 0 else returncode


@contextlib.contextmanager
def child_subreaper() -> Iterator[bool]:
    """While inside, Linux re-parents our orphaned descendants to us so we can reap them; yields False where it can't.

    Set before the child starts, so that no orphan escapes in the first instant; the previous setting comes back on
    the way out, so a caller in a longer-lived process (a test) is left as it was.
    """
    if not sys.platform.startswith("linux"):
        yield False
        return
    libc = ctypes.CDLL(None, use_errno=True)  # the running interpreter links libc, which has prctl
    previous = ctypes.c_int(0)
    libc.prctl(PR_GET_CHILD_SUBREAPER, ctypes.byref(previous), 0, 0, 0)
    enabled = libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) == 0
    try:
        yield enabled
    finally:
        if enabled and not previous.value:
            libc.prctl(PR_SET_CHILD_SUBREAPER, 0, 0, 0, 0)


def reap(child: subprocess.Popen[bytes], reap_orphans: bool) -> int | None:
    """The child's Popen return code once it has exited, else None; with `reap_orphans`, also reap every exited orphan.

    Orphans are collected with waitpid(-1), which would also collect the child itself: its status is then recorded on
    the Popen object (the public `returncode`) so Popen never waits for a pid that is gone.
    """
    while reap_orphans and child.returncode is None:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            break
        if pid == 0:
            break
        if pid == child.pid:
            child.returncode = os.waitstatus_to_exitcode(status)
    return child.poll()


def _copy_ready(fd: int, tee: LineTee, timeout: float) -> bool:
    """Copy what the pipe holds within `timeout` seconds; False once it reached end-of-file."""
    ready, _, _ = select.select([fd], [], [], timeout)
    if not ready:
        return True
    try:
        data = os.read(fd, READ_BYTES)
    except BlockingIOError:
        return True
    tee.feed(data)
    return bool(data)


def copy_until_exit(child: subprocess.Popen[bytes], tee: LineTee, reap_orphans: bool) -> int:
    """Copy the child's output until it exits, then what is left for at most DRAIN_SECONDS; its Popen return code."""
    assert child.stdout is not None
    fd = child.stdout.fileno()
    os.set_blocking(fd, False)
    open_pipe = True
    returncode = reap(child, reap_orphans)
    while returncode is None:
        if open_pipe:
            open_pipe = _copy_ready(fd, tee, POLL_SECONDS)
        else:
            time.sleep(POLL_SECONDS)  # the child closed its output but still runs
        returncode = reap(child, reap_orphans)
    deadline = time.monotonic() + DRAIN_SECONDS
    while open_pipe and time.monotonic() < deadline:
        ready, _, _ = select.select([fd], [], [], POLL_SECONDS)
        if not ready:
            break  # the child is gone and its output is read: whoever still holds the pipe is an orphan
        open_pipe = _copy_ready(fd, tee, 0)
    tee.finish()
    reap(child, reap_orphans)
    return returncode


def count_start(log_path: Path) -> int:
    """This container's start number in the pod (1 for the first), counted in `<log>.starts` on the log volume."""
    counter = log_path.with_name(log_path.name + ".starts")
    try:
        previous = int(counter.read_text().strip() or 0) if counter.exists() else 0
    except (OSError, ValueError):
        previous = 1  # unreadable: a start happened before, so treat this one as a restart
    try:
        counter.write_text(f"{previous + 1}\n")
    except OSError as error:
        raise Glm53Error(f"cannot write the start counter {counter}: {error.strerror}") from None
    return previous + 1


def hold_restart(log: RotatingLog, start: int, hold_seconds: float) -> None:
    """On a restart, say why and wait `hold_seconds` before the server starts (SIGTERM meanwhile ends us, as 143)."""
    if start < 2 or hold_seconds <= 0:
        return
    announcer(log)(
        f"glm53 supervise: start {start} of this container in this pod: holding {hold_seconds:g} s before the "
        "server starts, so that the engine's heartbeat sees it gone and registers again (LMCache #4642)"
    )
    time.sleep(hold_seconds)


def announcer(log: RotatingLog) -> Callable[[str], None]:
    """How supervise says a line of its own (a hold, the janitor, the L2 gate): copied like the child's output, to
    stdout and the log, through a tee of its own, since the child's holds a partial line between reads."""
    tee = LineTee(log, sys.stdout.buffer)
    return lambda line: tee.feed(f"{line}\n".encode())


def _janitor(bound: Bound | None, log: RotatingLog) -> contextlib.AbstractContextManager[object]:
    """The L2 janitor for `bound`, its lines said by `announcer`, or nothing to run."""
    return contextlib.nullcontext() if bound is None else Janitor(bound, announcer(log))


def supervise(
    command: Sequence[str],
    log_path: Path,
    max_log_bytes: int,
    hold_after_restart_s: float = 0.0,
    l2_bound: Bound | None = None,
    l2_tier: RespEndpoint | None = None,
) -> int:
    """Run `command` until it exits, teeing its output; returns the exit status to use for ourselves.

    With `l2_bound`, a janitor keeps that directory under its bound from before the server starts (also while a
    restart is held: other servers of the pod may write the same directory) until supervision ends. With `l2_tier`,
    the server starts only once that Redis answers its credentials (`glm53.l2gate`).
    """
    if not command:
        raise Glm53Error("no command given; put the server command after `--`, e.g. -- vllm serve MODEL ...")
    try:
        log = RotatingLog(log_path, max_log_bytes)
    except OSError as error:
        raise Glm53Error(f"cannot append to the log file {log_path}: {error.strerror}") from None
    with contextlib.closing(log), _janitor(l2_bound, log):
        hold_restart(log, count_start(log_path), hold_after_restart_s)
        if l2_tier is not None:
            wait_for_tier(l2_tier, os.environ, announcer(log))
        return _run(command, log)


def _run(command: Sequence[str], log: RotatingLog) -> int:
    """Start the child with our signal handlers forwarding to it, and copy its output until it exits."""
    children: list[subprocess.Popen[bytes]] = []
    pending: list[int] = []

    def forward(signum: int, _frame: FrameType | None) -> None:
        # A signal that arrives while the child is still being started is delivered right after it starts.
        if not children:
            pending.append(signum)
        elif children[0].returncode is None:
            children[0].send_signal(signum)

    previous = {sig: signal.signal(sig, forward) for sig in FORWARDED_SIGNALS}
    try:
        with child_subreaper() as subreaper:
            child = start_child(command)
            children.append(child)
            for signum in pending:
                child.send_signal(signum)
            reap_orphans = subreaper or os.getpid() == 1
            return exit_status(copy_until_exit(child, LineTee(log, sys.stdout.buffer), reap_orphans))
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
