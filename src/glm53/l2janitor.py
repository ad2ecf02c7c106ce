"""Keep LMCache's filesystem L2 directory under a byte bound by deleting its oldest chunk files.

LMCache's fs L2 tier never evicts: the adapter declares no capacity, so the eviction controller skips it (lmcache 0.5.6
lmcache/v1/distributed/l2_adapters/fs_l2_adapter.py:450-455). The chart puts the directory on an emptyDir with a
`sizeLimit`, and crossing that limit makes the kubelet evict the whole pod, so `glm53 supervise --l2-dir` runs this
janitor beside the server: once the directory holds more than `max_bytes` it deletes the oldest chunk files until it
holds TRIM_TO of the bound (the gap keeps it from deleting a file or two after every write).

What the adapter writes (fs_l2_adapter.py, line numbers of 0.5.6):
- one file per chunk, directly in the directory, named after its key and ending in `.data` (:99-121, :502-503);
- each written to a temp file first, then renamed into place (:644-647); the temp file is the final name with `.tmp`
  (:531) beside it, or the same name in a sub-directory when `relative_tmp_dir` is set (:529), which the chart does
  not set. A temp file may be half written, so it is never deleted while it may still be written to; but its bytes
  count, as the kubelet counts them. One left behind by a server killed mid-write (the container restarts, the pod's
  emptyDir stays, and a second server of the pod may share the directory, so no moment is known to be free of
  writers) is deleted once it has not been written for STALE_TEMP_SECONDS;
- a store skips a key whose file exists (:614-616), a lookup is an existence check (:505-516), and a load that finds
  no file or a short one is a miss (:754-761, :769-770). So deleting a chunk file is always safe: a later lookup
  misses and the engine recomputes the chunk; a load that already opened the file keeps reading the inode (Linux
  frees it when the last descriptor closes); a load racing the delete is a miss, which the adapter expects
  (`submit_unlock`, :380-383).

Oldest first means by modification time, FIFO: a chunk file is written once and never rewritten (a store of an
existing key is skipped), and loads do not change it; access times would say which chunk was read last, but under
`relatime` or `noatime` mounts (the usual ones) they are not kept up to date, so they cannot rank chunks. LRU is what
the server's L1 does for the hot chunks anyway.

Only files named as the adapter names them are ever deleted, so a mistyped `--l2-dir` cannot cost anyone's files;
every file under the directory counts toward the bound, as it counts toward the emptyDir's limit.
"""

from __future__ import annotations

import enum
import os
import re
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType

from glm53.staging.progress import human_bytes

# Once over the bound, delete down to this share of it, so the next deletions wait for a tenth of the bound's writes.
TRIM_TO = 0.9
DEFAULT_INTERVAL_S = 1.0
# A temp file untouched this long was left by a server that died mid-write: a chunk file is written in one call
# (fs_l2_adapter.py:644-645), which takes well under a minute even for a chunk of gigabytes on a slow disk.
STALE_TEMP_SECONDS = 600.0
# fs_l2_adapter.py:99-121: `<model, / as -SEP->@<kv_rank as 0x%08x>@<object group, hex>@<chunk hash, hex>[@<salt>]`
# plus `.data` (:57), or `.tmp` for the temp file (:531). `@` can be in neither the model name nor the salt (:52-53).
_ADAPTER_NAME = re.compile(r"[^@/]+@0x[0-9a-f]{8,}@[0-9a-f]+@[0-9a-f]+(?:@[^@/]+)?\.(data|tmp)")


@dataclass(frozen=True)
class Bound:
    """A directory to keep under `max_bytes`: `glm53 supervise --l2-dir DIR --l2-max-bytes N`."""

    directory: Path
    max_bytes: int


class Kind(enum.Enum):
    """What a file under the L2 directory is, for the janitor."""

    CHUNK = "chunk"  # a finished chunk file: deletable
    TEMP = "temp"  # the adapter's temp file, maybe being written: deletable only once stale
    FOREIGN = "foreign"  # not the adapter's: counted, never deleted


@dataclass(frozen=True)
class Entry:
    """One file under the L2 directory."""

    path: Path
    size: int
    mtime_ns: int
    kind: Kind


@dataclass(frozen=True)
class Trim:
    """What one pass did: files it deleted, their bytes, and the directory's bytes after it."""

    deleted: int
    deleted_bytes: int
    remaining_bytes: int


def classify(relative: Path) -> Kind:
    """The kind of the file at `relative` (a path inside the L2 directory)."""
    match = _ADAPTER_NAME.fullmatch(relative.name)
    if match is None:
        return Kind.FOREIGN
    # In a sub-directory, a `.data` name is a temp file under `relative_tmp_dir` (fs_l2_adapter.py:528-529).
    finished = match.group(1) == "data" and len(relative.parts) == 1
    return Kind.CHUNK if finished else Kind.TEMP


def select_deletions(entries: Iterable[Entry], max_bytes: int, now_ns: int) -> tuple[Entry, ...]:
    """The files to delete, oldest first: none while the total is within `max_bytes`, else enough of the deletable
    ones to bring it to TRIM_TO of the bound (or all of them, when the rest alone is over it).

    Ties in modification time (coarse file-system clocks) are broken by path, so a pass is the same however the
    directory lists its files.
    """
    files = list(entries)
    total = sum(entry.size for entry in files)
    if total <= max_bytes:
        return ()
    stale_before = now_ns - int(STALE_TEMP_SECONDS * 1e9)

    def deletable(entry: Entry) -> bool:
        return entry.kind is Kind.CHUNK or (entry.kind is Kind.TEMP and entry.mtime_ns < stale_before)

    target = int(max_bytes * TRIM_TO)
    chosen: list[Entry] = []
    for entry in sorted(filter(deletable, files), key=lambda e: (e.mtime_ns, str(e.path))):
        if total <= target:
            break
        chosen.append(entry)
        total -= entry.size
    return tuple(chosen)


def describe(bound: Bound, result: Trim) -> str:
    """The line a pass that deleted something prints."""
    files = "file" if result.deleted == 1 else "files"
    return (
        f"l2 janitor: deleted {result.deleted} {files} ({human_bytes(result.deleted_bytes)}), {bound.directory} now "
        f"{human_bytes(result.remaining_bytes)} of {human_bytes(bound.max_bytes)} bound"
    )


def scan(directory: Path) -> list[Entry]:
    """Every regular file under `directory` (sub-directories too: their bytes count), without following links.

    A file that disappears while being listed is skipped; a directory that does not exist yet (the server creates it
    when it starts, fs_l2_adapter.py:263) holds nothing.
    """
    entries: list[Entry] = []
    pending = [directory]
    while pending:
        folder = pending.pop()
        try:
            listing = list(os.scandir(folder))
        except FileNotFoundError:
            continue
        for item in listing:
            try:
                if item.is_dir(follow_symlinks=False):
                    pending.append(Path(item.path))
                elif item.is_file(follow_symlinks=False):
                    stat = item.stat(follow_symlinks=False)
                    path = Path(item.path)
                    entries.append(Entry(path, stat.st_size, stat.st_mtime_ns, classify(path.relative_to(directory))))
            except FileNotFoundError:
                continue
    return entries


def remove(entries: Sequence[Entry]) -> tuple[int, int]:
    """Delete `entries`; (files deleted, their bytes). One already gone (a delete through LMCache's API) is skipped."""
    deleted = deleted_bytes = 0
    for entry in entries:
        try:
            entry.path.unlink()
        except FileNotFoundError:
            continue
        deleted += 1
        deleted_bytes += entry.size
    return deleted, deleted_bytes


def trim(bound: Bound) -> Trim:
    """One pass: scan the directory, delete what `select_deletions` chooses."""
    entries = scan(bound.directory)
    chosen = select_deletions(entries, bound.max_bytes, time.time_ns())
    deleted, deleted_bytes = remove(chosen)
    # Chosen files that were already gone are gone all the same.
    remaining = sum(entry.size for entry in entries) - sum(entry.size for entry in chosen)
    return Trim(deleted, deleted_bytes, remaining)


class Janitor:
    """`trim` every `interval_s` seconds in a daemon thread, from `start()` (the first pass at once) to `stop()`.

    Each pass that deleted something is reported as one line through `report`, and so is a pass that failed (a
    permission problem, say), once until the failure changes or a pass succeeds: the thread must outlive a bad pass,
    since a janitor that stopped quietly would let the directory grow until the pod is evicted.
    """

    def __init__(self, bound: Bound, report: Callable[[str], None], interval_s: float = DEFAULT_INTERVAL_S) -> None:
        self.bound = bound
        self.interval_s = interval_s
        self._report = report
        self._stopping = threading.Event()
        self._thread = threading.Thread(target=self._run, name="l2-janitor", daemon=True)
        self._last_error = ""

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        """Stop after the pass in progress, if any; no line is reported after this returns."""
        self._stopping.set()
        if self._thread.is_alive():
            self._thread.join()

    def __enter__(self) -> Janitor:
        self.start()
        return self

    def __exit__(
        self, _type: type[BaseException] | None, _value: BaseException | None, _traceback: TracebackType | None
    ) -> None:
        self.stop()

    def _run(self) -> None:
        while True:
            self.run_pass()
            if self._stopping.wait(self.interval_s):
                return

    def run_pass(self) -> None:
        """One pass: what the thread runs at start and then every `interval_s`."""
        try:
            result = trim(self.bound)
        except OSError as error:
            where = error.filename or self.bound.directory
            message = f"l2 janitor: cannot keep {self.bound.directory} bounded: {where}: {error.strerror or error}"
            if message != self._last_error:
                self._report(message)
            self._last_error = message
            return
        self._last_error = ""
        if result.deleted:
            self._report(describe(self.bound, result))
