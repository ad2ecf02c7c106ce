"""Stopping a child that was started alone in its own process group (`start_new_session=True`), with what it forked.

The pod runner has the same in `glm53.pod.loopback.ContainerProcess.stop` (SIGTERM, grace, SIGKILL to the group); it
works on its own container type, and the pod never imports this package, so the tests' children (plain `Popen`s) use
these two.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
from typing import Any


def kill_group(process: subprocess.Popen[Any]) -> None:
    """SIGKILL to the whole group `process` leads (the session leader's pid is the group id), if any of it is left.

    Not reaped here: the caller waits (or drains the pipes with `communicate`)."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(process.pid, signal.SIGKILL)


def stop_group(process: subprocess.Popen[Any], grace_s: float) -> int:
    """SIGTERM to the group, SIGKILL to whatever of it is left after `grace_s` (stragglers included, even when the
    leader has already exited); reaped. The leader's exit status: negative for the signal that ended it."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(process.pid, signal.SIGTERM)
    with contextlib.suppress(subprocess.TimeoutExpired):
        process.wait(grace_s)
    kill_group(process)
    return process.wait()
