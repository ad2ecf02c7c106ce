"""Log lines decorated the way vLLM and the LMCache server decorate theirs, printed to stdout.

The startup probe and the exporter parse the real servers' logs, so the mocks must write the same decoration:
vLLM prefixes `(APIServer pid=1) INFO 11-29 07:00:01 [config.py:228] `, TP workers log as `(Worker_TP0 pid=...)`;
the LMCache server writes `[2026-11-29 07:00:01,123] LMCache INFO: <message> (server.py:211:<module>)`. Only the
format lives here; which lines are logged is the servers' business.
"""

from __future__ import annotations

import os
import sys
import threading
import time
from dataclasses import dataclass

_lock = threading.Lock()


def _emit(line: str) -> None:
    with _lock:
        sys.stdout.write(line + "\n")
        sys.stdout.flush()


def vllm_line(process: str, pid: int, level: str, source: str, message: str, now: float) -> str:
    """`(APIServer pid=1) INFO 11-29 07:00:01 [config.py:228] message`."""
    stamp = time.strftime("%m-%d %H:%M:%S", time.localtime(now))
    return f"({process} pid={pid}) {level} {stamp} [{source}] {message}"


def lmcache_line(level: str, message: str, source: str, now: float) -> str:
    """`[2026-11-29 07:00:01,123] LMCache INFO: message (server.py:211:lmcache.v1.multiprocess.server)`."""
    stamp = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(now))
    millis = int((now % 1) * 1000)
    return f"[{stamp},{millis:03d}] LMCache {level}: {message} ({source})"


@dataclass(frozen=True)
class VllmLogger:
    """Writes vLLM-decorated lines for one (simulated) process; `pid` defaults to ours."""

    process: str
    pid: int = os.getpid()

    def log(self, level: str, source: str, message: str) -> None:
        _emit(vllm_line(self.process, self.pid, level, source, message, time.time()))

    def info(self, source: str, message: str) -> None:
        self.log("INFO", source, message)

    def warning(self, source: str, message: str) -> None:
        self.log("WARNING", source, message)

    def error(self, source: str, message: str) -> None:
        self.log("ERROR", source, message)


def lmcache_log(level: str, message: str, source: str = "server.py:211:lmcache.v1.multiprocess.server") -> None:
    _emit(lmcache_line(level, message, source, time.time()))
