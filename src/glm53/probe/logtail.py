"""Read only the bytes a log gained since last time, across truncation and rotation, with a position that can be saved.

The startup probe runs every few seconds for the whole model load and the exporter scrapes for the pod's whole life,
while a debug-level vLLM log can grow to gigabytes; rescanning it each time would make both cost more the longer the
pod lives. A `LogFollower` remembers the file's identity (device, inode), the byte offset it reached and the
incomplete last line, and `TailPosition` round-trips through JSON so the probe can carry it between invocations.

Rotation follows `glm53 supervise`: FILE is renamed to FILE.1 and a fresh FILE is opened. When FILE's inode changes,
the rest of the old inode is read from FILE.1 (if FILE.1 is that inode) before FILE is read from its start. A file
shorter than the saved offset was truncated in place and is read again from 0. A missing file means "nothing yet".
"""

from __future__ import annotations

import base64
import os
from dataclasses import dataclass, replace
from pathlib import Path
from typing import BinaryIO

# A partial line longer than this is cut and handed out as a line: the facts we look for are short, and a runaway
# line without a newline (binary junk) must not grow the state file or memory without bound.
MAX_PARTIAL_BYTES = 64 * 1024
_READ_BLOCK = 4 * 1024 * 1024
# Inode numbers are reused once a rotated generation is deleted, so a file is recognised by its inode *and* its first
# bytes (log lines start with timestamps and pids, so two generations rarely share them).
HEAD_BYTES = 64


@dataclass(frozen=True)
class TailPosition:
    """Where a follower stands in one log: which file (device, inode), how far, and the incomplete last line.

    `total_bytes` counts every byte consumed from this log over the follower's whole history (all invocations,
    all rotated generations), for "bytes read" in the probe's messages. `head` is the file's first bytes (up to
    HEAD_BYTES), which tell a new file that got a recycled inode number from the one we were reading.
    """

    device: int = 0
    inode: int = 0
    offset: int = 0
    partial: bytes = b""
    total_bytes: int = 0
    head: bytes = b""

    def to_json(self) -> dict[str, object]:
        return {
            "device": self.device,
            "inode": self.inode,
            "offset": self.offset,
            "partial": base64.b64encode(self.partial).decode("ascii"),
            "total_bytes": self.total_bytes,
            "head": base64.b64encode(self.head).decode("ascii"),
        }

    @classmethod
    def from_json(cls, data: object) -> TailPosition:
        """The position `to_json` wrote; ValueError for anything else (the caller then starts afresh)."""
        if not isinstance(data, dict):
            raise ValueError("a tail position must be a JSON object")
        device, inode, offset, total = (
            _non_negative_int(data, key) for key in ("device", "inode", "offset", "total_bytes")
        )
        partial, head = _bytes_field(data, "partial", MAX_PARTIAL_BYTES), _bytes_field(data, "head", HEAD_BYTES)
        return cls(device, inode, offset, partial, total, head)


class LogFollower:
    """Hands out the complete lines a log file gained since the last call, decoded as UTF-8 (bad bytes replaced)."""

    def __init__(self, path: Path, position: TailPosition | None = None) -> None:
        self.path = path
        self.position = position or TailPosition()
        # Bytes consumed by this follower object (this invocation), as opposed to `position.total_bytes`.
        self.bytes_read = 0

    @property
    def total_bytes_read(self) -> int:
        return self.position.total_bytes

    @property
    def rotated_path(self) -> Path:
        return self.path.with_name(self.path.name + ".1")

    def read_new_lines(self, max_bytes: int | None = None) -> list[str]:
        """Complete lines appended since the last call; at most about `max_bytes` of the current file (None: to EOF).

        With `max_bytes`, call again until nothing more is read to bound memory on a huge backlog.
        """
        try:
            handle = self.path.open("rb")
        except FileNotFoundError:
            return []
        with handle:
            stat = os.fstat(handle.fileno())
            lines: list[str] = []
            if not self._is_current(handle, stat):
                if self.position.inode:
                    lines += self._finish_rotated()
                self.position = replace(
                    self.position, device=stat.st_dev, inode=stat.st_ino, offset=0, partial=b"", head=b""
                )
            elif stat.st_size < self.position.offset:
                self.position = replace(self.position, offset=0, partial=b"", head=b"")
            lines += self._read_from(handle, max_bytes)
            return lines

    def unread_bytes(self) -> int:
        """Bytes of the current file beyond the position: all of it if FILE is a new file, 0 if it does not exist."""
        try:
            stat = self.path.stat()
        except FileNotFoundError:
            return 0
        same_file = (stat.st_dev, stat.st_ino) == (self.position.device, self.position.inode)
        return max(0, stat.st_size - self.position.offset) if same_file else stat.st_size

    def _is_current(self, handle: BinaryIO, stat: os.stat_result) -> bool:
        """True when `handle` is the file the position belongs to: same device and inode, same first bytes."""
        if (stat.st_dev, stat.st_ino) != (self.position.device, self.position.inode):
            return False
        head = self.position.head
        return not head or os.pread(handle.fileno(), len(head), 0) == head

    def _finish_rotated(self) -> list[str]:
        """The rest of the old inode, if FILE.1 is it; its unfinished last line ends there, so it is handed out too."""
        lines: list[str] = []
        try:
            with self.rotated_path.open("rb") as handle:
                if self._is_current(handle, os.fstat(handle.fileno())):
                    lines = self._read_from(handle, None)
        except FileNotFoundError:
            pass
        if self.position.partial:
            lines.append(_decode(self.position.partial))
        return lines

    def _read_from(self, handle: BinaryIO, max_bytes: int | None) -> list[str]:
        handle.seek(self.position.offset)
        lines: list[str] = []
        partial, offset, consumed = self.position.partial, self.position.offset, 0
        while max_bytes is None or consumed < max_bytes:
            block = handle.read(_READ_BLOCK if max_bytes is None else min(_READ_BLOCK, max_bytes - consumed))
            if not block:
                break
            consumed += len(block)
            offset += len(block)
            pieces = (partial + block).split(b"\n")
            partial = pieces.pop()
            lines += [_decode(piece) for piece in pieces]
            while len(partial) > MAX_PARTIAL_BYTES:
                lines.append(_decode(partial[:MAX_PARTIAL_BYTES]))
                partial = partial[MAX_PARTIAL_BYTES:]
        self.bytes_read += consumed
        head = self.position.head
        if len(head) < HEAD_BYTES and offset > len(head):
            head = os.pread(handle.fileno(), HEAD_BYTES, 0)
        self.position = replace(
            self.position, offset=offset, partial=partial, total_bytes=self.position.total_bytes + consumed, head=head
        )
        return lines


def _bytes_field(data: dict[object, object], key: str, cap: int) -> bytes:
    text = data.get(key)
    if not isinstance(text, str):
        raise ValueError(f"a tail position needs a base64 string {key!r}")
    try:
        value = base64.b64decode(text.encode("ascii"), validate=True)
    except (ValueError, UnicodeEncodeError) as error:
        raise ValueError(f"a tail position's {key!r} is not base64: {error}") from None
    if len(value) > cap:
        raise ValueError(f"a tail position's {key!r} exceeds {cap} bytes")
    return value


def _non_negative_int(data: dict[object, object], key: str) -> int:
    value = data.get(key)
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ValueError(f"a tail position needs a non-negative integer {key!r}, found {value!r}")
    return value


def _decode(raw: bytes) -> str:
    return raw.rstrip(b"\r").decode("utf-8", errors="replace")
