"""The stage step's procedure, and the resident loop the chart's stage container runs.

One attempt (`stage`), in order:
1. **Marker.** A completion marker for this revision whose files are all in the snapshot at their recorded sizes ends
   the attempt at once, without the network: a restart or a rolling update downloads nothing (with `--reverify full`
   every byte is hashed again first). A file that no longer matches (truncated, deleted, or hashing wrong) is fetched
   again, and only it.
2. **Listing.** The revision is resolved to a commit once (a marker keeps the commit it recorded, so a moving branch
   never changes what a replica serves until weights.revision changes) and the hub lists every file with its size and
   hash; a HEAD per file gives the blob's name (its etag) and the URL of its bytes.
3. **Room.** The bytes still missing must fit on the volume, or the attempt stops with a sentence saying so.
4. **Download.** Every missing blob is fetched into `<blob>.partial`, resuming after the bytes already there, under the
   client's own per-blob lock (two pods sharing a claim never write one blob together), then renamed into place.
5. **Layout.** `snapshot_download` at the commit, with every blob already there, lays out the snapshot exactly as the
   client does (links, the tree listing it checks offline) and fetches nothing; the branch gets its ref.
6. **Verification.** Every file the listing names is read back through the snapshot, as the engine will read it, and
   hashed by the client's own check (`verify_maps`: sha256 for LFS files, the git blob id for the rest); a wrong one
   is deleted and fetched again (twice at most), then the snapshot must resolve offline (`local_files_only`) as the
   engine's own lookup does.
7. **Marker.** Written last, atomically.

`run_resident` repeats failed attempts with a growing pause instead of exiting (a failed init container would
crash-loop), writing each failure as one line into the status file that the container's startup probe prints, and
stays up after success to keep serving its metrics.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import sys
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from pathlib import Path

from huggingface_hub import constants, snapshot_download
from huggingface_hub.file_download import _cache_commit_hash_for_specific_revision
from huggingface_hub.utils._fixes import WeakFileLock
from huggingface_hub.utils._verification import verify_maps
from huggingface_hub.utils.tqdm import disable_progress_bars

from glm53 import __version__
from glm53.errors import EXIT_FAILURE, Glm53Error
from glm53.staging import hub as hubcalls
from glm53.staging.hub import Context, FileSource, Hub, RepoEntry
from glm53.staging.layout import Marker, RepoLayout, StagedFile, read_marker, size_problems, write_marker
from glm53.staging.progress import MOVING_PHASES, Progress, RateMeter, human_bytes, human_duration
from glm53.staging.status import write_status

# How often a file whose bytes hash wrong is fetched again before the attempt gives up on it.
VERIFY_ROUNDS = 2
# The resident loop's pauses between attempts: a transient fault (network, the hub's 5xx) is retried soon, one only a
# person fixes (a token, a revision) less often; both double up to the cap.
RETRY_FIRST_S = {True: 10.0, False: 60.0}
RETRY_CAP_S = 600.0
Say = Callable[[str], None]


class StageFailure(Glm53Error):
    """A failed attempt, in one sentence; `transient` when waiting alone can fix it (the network, the hub's 5xx)."""

    def __init__(self, message: str, transient: bool) -> None:
        super().__init__(message, EXIT_FAILURE)
        self.transient = transient


@dataclass(frozen=True)
class StageConfig:
    repo_id: str
    revision: str
    cache_dir: Path
    endpoint: str | None = None
    token_file: Path | None = None
    max_workers: int = 8
    # What a marker found at the start is checked with: every file's size (seconds), or every byte hashed (minutes).
    reverify: str = "sizes"
    # A symlink to the staged snapshot (the chart's mock mode: the CPU engine loads its model from a path).
    link: Path | None = None
    progress_s: float = 30.0

    def context(self) -> Context:
        endpoint = (self.endpoint or constants.ENDPOINT).rstrip("/")
        return Context(self.repo_id, self.revision, endpoint, self.token_file, self.cache_dir)


@dataclass(frozen=True)
class StageResult:
    """What a successful attempt found and did."""

    commit: str
    snapshot: Path
    files: int
    total_bytes: int
    downloaded_bytes: int
    download_s: float
    verify_s: float
    verified_bytes: int
    from_marker: bool
    refetched: tuple[str, ...] = ()

    def summary(self) -> str:
        if self.from_marker and not self.downloaded_bytes:
            checked = "hashed again" if self.verified_bytes else "checked (sizes) against the completion marker"
            return f"{checked} in {_seconds(self.verify_s)}, nothing downloaded; served from {self.snapshot}"
        rate = self.downloaded_bytes / self.download_s if self.download_s > 0 else 0.0
        parts = [
            f"downloaded {human_bytes(self.downloaded_bytes)} in {self.download_s:.1f} s ({human_bytes(rate)}/s)",
            f"verified {human_bytes(self.verified_bytes)} in {self.verify_s:.1f} s",
        ]
        if self.refetched:
            parts.append(f"fetched again after a wrong size or hash: {', '.join(self.refetched)}")
        return "; ".join(parts) + f"; served from {self.snapshot}"


def _seconds(seconds: float) -> str:
    return f"{seconds:.2f} s" if seconds < 60 else human_duration(seconds)


@dataclass
class StageState:
    """Where the stage step stands, shared by the attempt, the reporter thread and the metrics collector."""

    repo_id: str
    revision: str
    progress: Progress = field(init=False)
    attempts: int = 0
    downloaded_bytes: int = 0  # fetched from the hub by this process (a resumed file counts only what it fetched)
    last_download_s: float | None = None
    last_verify_s: float | None = None
    retry_in_s: float | None = None
    # (bytes done, files done) while a phase moves them; the reporter samples it.
    live: Callable[[], tuple[int, int]] | None = None
    meter: RateMeter = field(default_factory=RateMeter)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def __post_init__(self) -> None:
        self.progress = Progress("starting", self.repo_id, self.revision)

    def update(self, **changes: object) -> Progress:
        with self.lock:
            if "phase" in changes and changes["phase"] != self.progress.phase:
                self.meter = RateMeter()
            self.progress = replace(self.progress, **changes)  # type: ignore[arg-type]
            return self.progress

    def current(self) -> Progress:
        """The progress, with the live counts and the rate over the last samples."""
        with self.lock:
            live, progress, meter = self.live, self.progress, self.meter
        if live is not None and progress.phase in MOVING_PHASES:
            done, files = live()
            meter.add(time.monotonic(), done)
            progress = replace(progress, bytes_done=done, files_done=files, rate=meter.rate())
        return progress

    def add_downloaded(self, count: int) -> None:
        with self.lock:
            self.downloaded_bytes += count


class Reporter:
    """Every second: the status file; every `progress_s` while bytes move: a line on the log."""

    def __init__(self, state: StageState, status_file: Path | None, progress_s: float, say: Say) -> None:
        self.state, self.status_file, self.progress_s, self.say = state, status_file, progress_s, say
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="stage-reporter", daemon=True)
        self._last_line = 0.0

    def __enter__(self) -> Reporter:
        self.write()
        self._thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self._stop.set()
        self._thread.join(timeout=5)
        self.write()

    def write(self) -> Progress:
        progress = self.state.current()
        if self.status_file is not None:
            with contextlib.suppress(OSError):  # a full log volume must not stop the download
                write_status(self.status_file, _status_record(progress, self.state))
        return progress

    def _run(self) -> None:
        while not self._stop.wait(1.0):
            progress = self.write()
            now = time.monotonic()
            if progress.phase in MOVING_PHASES and now - self._last_line >= self.progress_s:
                self._last_line = now
                self.say(f"stage-weights: {progress.line()}")


def _status_record(progress: Progress, state: StageState) -> dict[str, object]:
    return {
        "phase": progress.phase,
        "line": progress.line(),
        "repo": progress.repo_id,
        "revision": progress.revision,
        "commit": progress.commit,
        "bytesDone": progress.bytes_done,
        "bytesTotal": progress.bytes_total,
        "filesDone": progress.files_done,
        "filesTotal": progress.files_total,
        "rate": progress.rate,
        "attempts": state.attempts,
        "retryInSeconds": state.retry_in_s,
    }


def read_token(path: Path | None) -> str | None:
    """The token in the mounted Secret's file, read at every attempt so that a fixed Secret is picked up."""
    if path is None:
        return None
    try:
        token = path.read_text().strip()
    except FileNotFoundError:
        raise Glm53Error(
            f"no token file at {path}: the Secret named in weights.hfTokenSecret.name has no key "
            "weights.hfTokenSecret.key, or is not mounted; put the token there",
            EXIT_FAILURE,
        ) from None
    if not token:
        raise Glm53Error(f"the token file {path} is empty; put a read token into the Secret", EXIT_FAILURE)
    return token


class Downloads:
    """The bytes of the files being staged: complete blobs plus the partial files now growing (sampled by stat)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._complete_bytes = 0
        self._complete_files = 0
        self._growing: dict[str, Path] = {}

    def complete(self, size: int) -> None:
        with self._lock:
            self._complete_bytes += size
            self._complete_files += 1

    @contextlib.contextmanager
    def growing(self, etag: str, partial: Path) -> Iterator[None]:
        with self._lock:
            self._growing[etag] = partial
        try:
            yield
        finally:
            with self._lock:
                self._growing.pop(etag, None)

    def now(self) -> tuple[int, int]:
        with self._lock:
            growing, done, files = list(self._growing.values()), self._complete_bytes, self._complete_files
        for partial in growing:
            with contextlib.suppress(OSError):
                done += partial.stat().st_size
        return done, files


def _fits(layout: RepoLayout, missing: int) -> None:
    try:
        free = shutil.disk_usage(layout.cache_dir).free
    except OSError:
        return  # nothing to measure yet: the mkdir below reports the real problem
    if missing > free:
        raise Glm53Error(
            f"the weights volume at {layout.cache_dir} has {human_bytes(free)} free, but {human_bytes(missing)} of "
            f"{layout.repo_id} are still to be staged; grow the claim (weights.newPvc.size) or free it",
            EXIT_FAILURE,
        )


def _present(layout: RepoLayout, etag: str) -> int:
    """Bytes of a blob already on the volume: the blob itself, else its partial file."""
    for path in (layout.blob(etag), layout.partial(etag)):
        with contextlib.suppress(FileNotFoundError):
            return path.stat().st_size
    return 0


def _verify(
    layout: RepoLayout, commit: str, entries: list[RepoEntry], state: StageState, workers: int
) -> tuple[dict[str, str], int]:
    """Path -> what is wrong, for the files whose snapshot entry has the wrong size or hash; and the bytes hashed.

    Sizes first (a stat each), then the client's own hash check per file, `workers` files at a time (hashlib releases
    the GIL while it hashes, so threads use every core).
    """
    bad: dict[str, str] = {}
    done = [0, 0]
    lock = threading.Lock()

    def check(entry: RepoEntry) -> None:
        pointer = layout.pointer(commit, entry.path)
        try:
            size = pointer.stat().st_size
        except FileNotFoundError:
            problem: str | None = "missing from the snapshot"
        else:
            problem = None if size == entry.size else f"{size} bytes, the hub lists {entry.size}"
        if problem is None:
            result = verify_maps(
                remote_by_path={entry.path: entry.repo_file()},
                local_by_path={entry.path: pointer},
                revision=commit,
                verified_path=layout.snapshot(commit),
            )
            for mismatch in result.mismatches:
                problem = (
                    f"{mismatch['algorithm']} {mismatch['actual'][:12]}, the hub lists {mismatch['expected'][:12]}"
                )
        with lock:
            done[0] += entry.size
            done[1] += 1
            if problem is not None:
                bad[entry.path] = problem

    state.live = lambda: (done[0], done[1])
    state.update(phase="verifying", bytes_done=0, files_done=0, bytes_total=sum(e.size for e in entries))
    state.update(files_total=len(entries))
    with ThreadPoolExecutor(max_workers=workers, thread_name_prefix="stage-verify") as pool:
        list(pool.map(check, entries))
    state.live = None
    return bad, done[0]


def stage(config: StageConfig, state: StageState, say: Say) -> StageResult:
    """One attempt; raises on any failure (the caller words it with `hub.explain`)."""
    disable_progress_bars()  # the client's tqdm bars would flood the container log; the reporter says it in lines
    layout = RepoLayout(config.cache_dir, config.repo_id)
    started = time.monotonic()
    state.update(phase="checking", detail="looking for a completion marker")
    marker = read_marker(layout, config.revision)
    suspects: dict[str, str] = {}
    wrong_hash: set[str] = set()  # of the listed size but hashing wrong: deleted before the download
    if marker is not None:
        state.update(commit=marker.commit, files_total=len(marker.files), bytes_total=marker.total_bytes)
        suspects = size_problems(layout, marker.commit, marker.files)
        verified_bytes = 0
        if not suspects and config.reverify == "full":
            entries = [_from_staged(f) for f in marker.files]
            suspects, verified_bytes = _verify(layout, marker.commit, entries, state, config.max_workers)
            wrong_hash = set(suspects)
        if not suspects:
            if verified_bytes:
                state.last_verify_s = time.monotonic() - started
            return _finish(config, layout, marker.commit, marker.files, state, say, started, 0, 0.0, verified_bytes)
        listed = ", ".join(f"{path} ({why})" for path, why in sorted(suspects.items())[:3])
        say(
            f"stage-weights: {len(suspects)} of {len(marker.files)} staged files no longer match the completion "
            f"marker: {listed}; fetching them again"
        )

    token = read_token(config.token_file)
    hub = Hub(config.endpoint, token)
    state.update(phase="resolving", detail=f"asking {hub.endpoint} for the revision and its files")
    commit = marker.commit if marker is not None else hub.resolve(config.repo_id, config.revision)
    state.update(commit=commit)
    entries = hub.list_files(config.repo_id, commit)
    if not entries:
        raise Glm53Error(
            f"the hub lists no files for {config.repo_id}@{commit[:12]}; check the repository", EXIT_FAILURE
        )
    state.update(files_total=len(entries), bytes_total=sum(e.size for e in entries), detail="")

    with ThreadPoolExecutor(max_workers=config.max_workers, thread_name_prefix="stage-head") as pool:
        found = pool.map(lambda e: _source(hub, config, commit, e), entries)
        sources = dict(zip([e.path for e in entries], found, strict=True))
    for entry in entries:
        if entry.path in wrong_hash:
            say(f"stage-weights: {entry.path} ({suspects[entry.path]}): deleting it")
            _discard(layout, sources[entry.path].etag)
    _fits(layout, sum(max(0, e.size - _present(layout, sources[e.path].etag)) for e in entries))

    downloads = Downloads()
    state.live = downloads.now
    state.update(phase="downloading")
    download_started = time.monotonic()
    with ThreadPoolExecutor(max_workers=config.max_workers, thread_name_prefix="stage-get") as pool:
        fetched = sum(pool.map(lambda e: _fetch(layout, e, sources[e.path], downloads, state, say), entries))
    download_s = time.monotonic() - download_started
    state.live = None
    state.last_download_s = download_s

    state.update(phase="linking", detail="laying out the snapshot with the client (every blob is already there)")
    _layout_snapshot(config, hub, commit)

    to_check = entries if marker is None else [e for e in entries if e.path in suspects]
    verify_started = time.monotonic()
    refetched: list[str] = []
    bad, verified_bytes = _verify(layout, commit, to_check, state, config.max_workers)
    for _round in range(VERIFY_ROUNDS):
        if not bad:
            break
        for path, why in sorted(bad.items()):
            say(f"stage-weights: {path}: {why}: deleting it and fetching it again")
            _discard(layout, sources[path].etag)
            refetched.append(path)
        again = [e for e in entries if e.path in bad]
        state.update(phase="downloading")
        redo = Downloads()
        state.live = redo.now
        fetched += sum(_fetch(layout, e, sources[e.path], redo, state, say) for e in again)
        _layout_snapshot(config, hub, commit)
        bad, more = _verify(layout, commit, again, state, config.max_workers)
        verified_bytes += more
    if bad:
        path, why = sorted(bad.items())[0]
        raise Glm53Error(
            f"{path} of {config.repo_id}@{commit[:12]} still does not match what the hub lists after "
            f"{VERIFY_ROUNDS} more downloads ({why}); the hub, a proxy or the volume corrupts it: check the proxy "
            "(weights.staging.endpoint, HTTPS_PROXY) and the volume",
            EXIT_FAILURE,
        )
    verify_s = time.monotonic() - verify_started
    state.last_verify_s = verify_s
    files = tuple(StagedFile(e.path, e.size, sources[e.path].etag, e.algorithm, e.digest) for e in entries)
    return _finish(
        config, layout, commit, files, state, say, started, fetched, download_s, verified_bytes, verify_s, refetched
    )


def _from_staged(staged: StagedFile) -> RepoEntry:
    return RepoEntry(
        staged.path,
        staged.size,
        staged.etag if staged.algorithm == "git-sha1" else "",
        staged.digest if staged.algorithm == "sha256" else None,
    )


def _source(hub: Hub, config: StageConfig, commit: str, entry: RepoEntry) -> FileSource:
    source = hub.source(config.repo_id, commit, entry.path)
    if source.etag.lower() != entry.digest:
        raise Glm53Error(
            f"the hub's HEAD of {entry.path} names blob {source.etag[:12]}, but its listing gives {entry.algorithm} "
            f"{entry.digest[:12]}; the hub (or a proxy at weights.staging.endpoint) is inconsistent",
            EXIT_FAILURE,
        )
    if source.size is not None and source.size != entry.size:
        raise Glm53Error(
            f"the hub's HEAD of {entry.path} says {source.size} bytes, but its listing says {entry.size}; the hub "
            "(or a proxy at weights.staging.endpoint) is inconsistent",
            EXIT_FAILURE,
        )
    return source


@contextlib.contextmanager
def _blob_locked(layout: RepoLayout, etag: str) -> Iterator[None]:
    """Hold the client's own per-blob lock (creating its folder first), so that no other pod sharing the claim, nor a
    client in it, writes the blob meanwhile."""
    lock = layout.lock(etag)
    lock.parent.mkdir(parents=True, exist_ok=True)
    with WeakFileLock(lock):
        yield


def _discard(layout: RepoLayout, etag: str) -> None:
    with _blob_locked(layout, etag):
        layout.blob(etag).unlink(missing_ok=True)
        layout.partial(etag).unlink(missing_ok=True)


def _fetch(
    layout: RepoLayout, entry: RepoEntry, source: FileSource, downloads: Downloads, state: StageState, say: Say
) -> int:
    """Make sure the blob is on the volume; the bytes fetched for it. A blob of the listed size counts as present
    here: the verification pass proves its bytes."""
    blob, partial = layout.blob(source.etag), layout.partial(source.etag)
    with _blob_locked(layout, source.etag):
        with contextlib.suppress(FileNotFoundError):
            size = blob.stat().st_size
            if size == entry.size:
                downloads.complete(entry.size)
                return 0
            if size < entry.size and not partial.exists():
                os.replace(blob, partial)  # a short blob: the start of the file, resumed (verification proves it)
                say(f"stage-weights: {entry.path}: truncated to {size} of {entry.size} bytes on the volume")
            else:
                blob.unlink()
        with contextlib.suppress(FileNotFoundError):
            resumed = partial.stat().st_size
            if 0 < resumed < entry.size:
                say(f"stage-weights: {entry.path}: resuming after {human_bytes(resumed)} of {human_bytes(entry.size)}")
        with downloads.growing(source.etag, partial):
            fetched = hubcalls.download(source, partial, entry.size)
        os.replace(partial, blob)
    downloads.complete(entry.size)
    state.add_downloaded(fetched)
    return fetched


def _layout_snapshot(config: StageConfig, hub: Hub, commit: str) -> None:
    """The client's own snapshot at the commit: its links into `blobs/` and its tree listing (which its offline
    lookup checks for completeness, `_snapshot_download.py:551-585`); every blob is there, so it fetches nothing."""
    snapshot_download(
        config.repo_id,
        revision=commit,
        cache_dir=config.cache_dir,
        endpoint=hub.endpoint,
        token=hub.token,
        max_workers=config.max_workers,
    )


def _finish(
    config: StageConfig,
    layout: RepoLayout,
    commit: str,
    files: tuple[StagedFile, ...],
    state: StageState,
    say: Say,
    started: float,
    fetched: int,
    download_s: float,
    verified_bytes: int,
    verify_s: float | None = None,
    refetched: Iterable[str] = (),
) -> StageResult:
    from_marker = verify_s is None
    if verify_s is None:
        verify_s = time.monotonic() - started
    # The branch's ref, as the client writes it (file_download.py:727-744): the engine, offline, resolves
    # `--revision main` (or no revision) through it.
    _cache_commit_hash_for_specific_revision(str(layout.storage), config.revision, commit)
    offline = snapshot_download(
        config.repo_id, revision=config.revision, cache_dir=config.cache_dir, local_files_only=True
    )
    if Path(str(offline)) != layout.snapshot(commit):
        raise Glm53Error(
            f"offline, the client resolves {config.repo_id}@{config.revision} to {offline}, not to the staged "
            f"{layout.snapshot(commit)}; remove the stale ref {layout.ref(config.revision)}",
            EXIT_FAILURE,
        )
    facts = {
        "downloadedBytes": fetched,
        "downloadSeconds": round(download_s, 3),
        "verifiedBytes": verified_bytes,
        "verifySeconds": round(verify_s, 3),
        "stagedAt": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "glm53": __version__,
        "huggingface_hub": hubcalls.INSTALLED_VERSION,
    }
    if not from_marker or fetched:
        write_marker(layout, Marker(config.repo_id, config.revision, commit, files, facts))
    if config.link is not None:
        _link(config.link, layout.snapshot(commit))
    result = StageResult(
        commit,
        layout.snapshot(commit),
        len(files),
        sum(f.size for f in files),
        fetched,
        download_s,
        verify_s,
        verified_bytes,
        from_marker,
        tuple(refetched),
    )
    state.update(
        phase="done",
        commit=commit,
        files_done=len(files),
        files_total=len(files),
        bytes_done=result.total_bytes,
        bytes_total=result.total_bytes,
        detail=result.summary(),
        rate=None,
    )
    return result


def _link(link: Path, snapshot: Path) -> None:
    """`link` -> the snapshot, relative so it resolves wherever the volume is mounted; replaced atomically."""
    if link.exists() and not link.is_symlink():
        raise Glm53Error(
            f"{link} exists and is not a link to a staged snapshot; remove it (the stage step links it itself)",
            EXIT_FAILURE,
        )
    link.parent.mkdir(parents=True, exist_ok=True)
    temporary = link.with_name(f".{link.name}.{os.getpid()}.link")
    temporary.unlink(missing_ok=True)
    temporary.symlink_to(os.path.relpath(snapshot, link.parent))
    os.replace(temporary, link)


def attempt_once(config: StageConfig, state: StageState, say: Say) -> StageResult:
    """One attempt; a failure becomes one sentence (the CLI's one line and non-zero exit)."""
    state.attempts += 1
    try:
        return stage(config, state, say)
    except Exception as error:
        line = hubcalls.explain(error, config.context())
        state.update(phase="failed", detail=line)
        raise StageFailure(line, hubcalls.transient(error)) from None
    finally:
        state.live = None


def run_resident(config: StageConfig, state: StageState, say: Say, stop: threading.Event) -> StageResult | None:
    """Attempt until one succeeds (or `stop` is set), pausing longer after each failure; None when stopped first."""
    pause: float | None = None
    while not stop.is_set():
        state.retry_in_s = None
        try:
            return attempt_once(config, state, say)
        except StageFailure as error:
            first = RETRY_FIRST_S[error.transient]
            pause = first if pause is None else min(RETRY_CAP_S, pause * 2)
            state.retry_in_s = pause
            say(f"stage-weights: failed: {error.message}; trying again in {pause:.0f} s (attempt {state.attempts})")
            stop.wait(pause)
    return None


def say_to_stdout(line: str) -> None:
    print(line, file=sys.stdout, flush=True)
