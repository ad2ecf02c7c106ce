"""Pure arithmetic and wording of the stage step's progress: bytes, files, rate over a window, ETA, one status line.

The same line goes to the stage container's log every few seconds, into the status file the startup probe prints (so
`kubectl describe pod` shows it as a probe event), and its numbers into the metrics.
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass

# Phases of one staging attempt, in order, and the two it ends in.
PHASES = ("starting", "checking", "resolving", "downloading", "verifying", "linking", "done", "failed")
# The phases that move bytes: only they have live counts, a rate and an ETA.
MOVING_PHASES = frozenset({"downloading", "verifying"})
_UNITS = ("B", "KiB", "MiB", "GiB", "TiB", "PiB")


def human_bytes(count: float) -> str:
    """`count` bytes in binary units with three significant digits: 0 B, 512 B, 6.26 MiB, 702 GiB."""
    if count < 1024:
        return f"{max(count, 0):.0f} B"
    exponent = min(int(math.log(count, 1024)), len(_UNITS) - 1)
    value = count / 1024**exponent
    if value >= 1023.95 and exponent < len(_UNITS) - 1:  # rounding up to the next unit: 1024 MiB -> 1.00 GiB
        exponent, value = exponent + 1, value / 1024
    digits = 2 if value < 10 else 1 if value < 100 else 0
    return f"{value:.{digits}f} {_UNITS[exponent]}"


def human_duration(seconds: float) -> str:
    """A duration as an operator reads an ETA: 42s, 3m05s, 1h44m, 2d03h."""
    seconds = max(0, round(seconds))
    if seconds < 60:
        return f"{seconds}s"
    minutes, secs = divmod(seconds, 60)
    if minutes < 60:
        return f"{minutes}m{secs:02d}s"
    hours, minutes = divmod(minutes, 60)
    if hours < 48:
        return f"{hours}h{minutes:02d}m"
    days, hours = divmod(hours, 24)
    return f"{days}d{hours:02d}h"


class RateMeter:
    """Bytes per second over the last `window_s` seconds of samples (a whole run's average would hide a stall)."""

    def __init__(self, window_s: float = 30.0) -> None:
        self.window_s = window_s
        self._samples: deque[tuple[float, float]] = deque()

    def add(self, now: float, total_bytes: float) -> None:
        self._samples.append((now, total_bytes))
        while len(self._samples) > 2 and now - self._samples[1][0] >= self.window_s:
            self._samples.popleft()

    def rate(self) -> float | None:
        """None until two samples at least a tenth of a second apart exist."""
        if len(self._samples) < 2:
            return None
        (t0, b0), (t1, b1) = self._samples[0], self._samples[-1]
        return None if t1 - t0 < 0.1 else max(0.0, (b1 - b0) / (t1 - t0))


def eta_seconds(done: float, total: float, rate: float | None) -> float | None:
    """Seconds left at `rate`; None when there is no rate yet (or it is zero) and 0 when nothing is left."""
    if done >= total:
        return 0.0
    if not rate:
        return None
    return (total - done) / rate


@dataclass(frozen=True)
class Progress:
    """Where one staging attempt stands."""

    phase: str
    repo_id: str
    revision: str
    commit: str | None = None
    bytes_done: int = 0
    bytes_total: int = 0
    files_done: int = 0
    files_total: int = 0
    rate: float | None = None  # bytes per second, downloading or hashing, whichever the phase does
    detail: str = ""  # why it failed, or what a phase is doing beyond the counts

    @property
    def eta(self) -> float | None:
        return eta_seconds(self.bytes_done, self.bytes_total, self.rate)

    @property
    def fraction(self) -> float:
        return 1.0 if self.bytes_total == 0 else self.bytes_done / self.bytes_total

    def target(self) -> str:
        commit = f" (commit {self.commit[:12]})" if self.commit and self.commit != self.revision else ""
        return f"{self.repo_id}@{self.revision}{commit}"

    def line(self) -> str:
        """One line: what is being staged and how far it got, or why it failed."""
        if self.phase == "failed":
            return f"failed: {self.detail}"
        if self.phase == "done":
            return f"done: {self.target()}: {self.files_total} files, {human_bytes(self.bytes_total)}; {self.detail}"
        if self.phase in MOVING_PHASES:
            verb = "downloaded" if self.phase == "downloading" else "verified"
            rate = "measuring the rate" if self.rate is None else f"{human_bytes(self.rate)}/s"
            eta = self.eta
            left = "ETA unknown" if eta is None else f"ETA {human_duration(eta)}"
            counts = (
                f"{human_bytes(self.bytes_done)} of {human_bytes(self.bytes_total)} ({100 * self.fraction:.1f} %), "
                f"{self.files_done} of {self.files_total} files {verb}, {rate}, {left}"
            )
            return f"{self.phase} {self.target()}: {counts}{f'; {self.detail}' if self.detail else ''}"
        return f"{self.phase} {self.target()}{f': {self.detail}' if self.detail else ''}"
