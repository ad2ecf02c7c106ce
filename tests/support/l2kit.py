"""What the L2 janitor's tests share: chunk files named as LMCache's fs adapter names them, a directory's size over
time, and the real `lmcache server` with an fs L2 tier under `glm53 supervise --l2-dir ... --l2-max-bytes ...`."""

from __future__ import annotations

import json
import os
import threading
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, replace
from pathlib import Path

from glm53.testing.chart_sidecar import StandaloneSidecar
from tests.support.mockproc import Server, glm53, serving

# lmcache 0.5.6 fs_l2_adapter.py:99-121 for a key of this model, kv_rank 0, object group 0, no salt; the `{}` is the
# chunk hash, here an index, so that name order is write order.
CHUNK_NAME = "zai-org-SEP-GLM-5.3@0x00000000@0@{:064x}.data"
# How often `SizeSampler` looks: often enough to see every peak between two janitor passes (1 s apart).
SAMPLE_SECONDS = 0.02


def chunk_name(index: int) -> str:
    return CHUNK_NAME.format(index)


def directory_bytes(directory: Path) -> int:
    """The bytes of the regular files in `directory` (flat, as the fs adapter writes it); a file deleted meanwhile is
    not counted."""
    total = 0
    for entry in os.scandir(directory):
        try:
            total += entry.stat(follow_symlinks=False).st_size
        except FileNotFoundError:
            continue
    return total


class SizeSampler:
    """A thread recording `(seconds since start, bytes)` of a directory every SAMPLE_SECONDS until stopped."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self.samples: list[tuple[float, int]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._start = time.monotonic()

    def now(self) -> float:
        """Seconds since the sampler was made: the clock of its samples."""
        return time.monotonic() - self._start

    def __enter__(self) -> SizeSampler:
        self._thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self._stop.set()
        self._thread.join()

    def _run(self) -> None:
        while not self._stop.wait(SAMPLE_SECONDS):
            size = directory_bytes(self.directory) if self.directory.is_dir() else 0
            self.samples.append((self.now(), size))

    def peak(self) -> int:
        return max((size for _, size in self.samples), default=0)


def with_fs_tier(server_argv: Sequence[str], directory: Path) -> list[str]:
    """`lmcache server` ARGS with the fs L2 tier in `directory` as its only L2 adapter, and L1 only a write buffer.

    An `--l2-adapter` the chart renders is dropped (each one adds an adapter: two would write two directories). The
    `skip_l1` store policy (lmcache 0.5.6 v1/distributed/storage_controllers/store_policy.py:152-182) deletes a chunk
    from L1 once L2 has it, so every lookup goes to the directory, as it does in a pod once L1 evicted the chunk.
    """
    argv = list(server_argv)
    while "--l2-adapter" in argv:
        index = argv.index("--l2-adapter")
        del argv[index : index + 2]
    adapter = json.dumps({"type": "fs", "base_path": str(directory)})
    return [*argv, "--l2-adapter", adapter, "--l2-store-policy", "skip_l1"]


@dataclass(frozen=True)
class SupervisedTier:
    """The supervised server, its L2 directory and supervise's log file."""

    server: Server
    directory: Path
    log: Path


@contextmanager
def supervised_fs_tier(sidecar: StandaloneSidecar, workdir: Path, max_bytes: int) -> Iterator[SupervisedTier]:
    """The chart's `lmcache server` with an fs tier in `workdir/l2`, run by `glm53 supervise` with the janitor bounding
    that directory to `max_bytes`, healthy; stopped on exit."""
    directory, log = workdir / "l2", workdir / "lmcache.log"
    supervise = ["supervise", "--log", str(log), "--l2-dir", str(directory), "--l2-max-bytes", str(max_bytes), "--"]
    argv = glm53(*supervise, *with_fs_tier(sidecar.argv, directory))
    with serving(replace(sidecar, argv=tuple(argv)), workdir / "supervise.out") as server:
        yield SupervisedTier(server, directory, log)
