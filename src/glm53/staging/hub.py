"""The `huggingface_hub` calls the stage step makes, and what each failure means in one sentence.

Everything that talks to the hub is the real client, read in its 2.4.0 release (the version the serving image's
constraints and the CPU engine's lock file pin): the revision and file listing are `HfApi.model_info` and
`HfApi.list_repo_tree`, as `snapshot_download` itself calls them (`_snapshot_download.py:279-298`); each file's
etag, size and download location come from `get_hf_file_metadata`'s HEAD (`file_download.py:1618-1690`); the bytes
come through `http_get`, whose `resume_size` sends `Range: bytes=N-` and appends to a file that already holds the
first N bytes (`file_download.py:334-495`). What the client no longer does in 2.4.0 is resume across processes:
`hf_hub_download` writes to a temporary file unique to its process and deletes it when the download fails
(`file_download.py:1996-2046`, huggingface_hub PR #4228), so a killed download starts that file again from zero.
The stage step therefore keeps its own partial file per blob and hands its length to `http_get`.
"""

from __future__ import annotations

import errno
import os
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import httpx2
import huggingface_hub
from huggingface_hub import HfApi, constants, get_hf_file_metadata, hf_hub_url
from huggingface_hub.errors import (
    GatedRepoError,
    HfHubHTTPError,
    LocalEntryNotFoundError,
    RemoteEntryNotFoundError,
    RepositoryNotFoundError,
    RevisionNotFoundError,
)
from huggingface_hub.file_download import REGEX_COMMIT_HASH, http_get
from huggingface_hub.hf_api import RepoFile
from huggingface_hub.utils._headers import build_hf_headers
from huggingface_hub.utils._http import _is_same_or_hub_host

from glm53.errors import EXIT_FAILURE, Glm53Error

# The release whose code the calls and line numbers here were read from.
VERIFIED_VERSION = "2.4.0"
INSTALLED_VERSION = huggingface_hub.__version__


@dataclass(frozen=True)
class RepoEntry:
    """A file of the repository at one commit, as the hub lists it: its size and the hash that proves its bytes."""

    path: str
    size: int
    blob_id: str  # the git blob id (of the LFS pointer, for an LFS file)
    lfs_sha256: str | None  # the sha256 of an LFS file's content

    @property
    def algorithm(self) -> str:
        """The hash the client's own verification uses (`utils/_verification.py:118-128`)."""
        return "sha256" if self.lfs_sha256 else "git-sha1"

    @property
    def digest(self) -> str:
        return (self.lfs_sha256 or self.blob_id).lower()

    def repo_file(self) -> RepoFile:
        """The client's record of this file, as `HfApi.list_repo_tree` builds it (`hf_api.py:712-718`)."""
        lfs = {"size": self.size, "oid": self.lfs_sha256, "pointerSize": 0} if self.lfs_sha256 else None
        return RepoFile(path=self.path, size=self.size, oid=self.blob_id, lfs=lfs)  # type: ignore[no-untyped-call]


@dataclass(frozen=True)
class FileSource:
    """Where one file's bytes come from: its etag (its blob's name), its size, the URL and headers of the GET."""

    etag: str
    size: int | None
    url: str
    headers: dict[str, str]


class Hub:
    """One endpoint and token; every call raises the client's own errors (`explain` turns them into a sentence)."""

    def __init__(self, endpoint: str | None, token: str | None) -> None:
        self.endpoint = (endpoint or constants.ENDPOINT).rstrip("/")
        # False, not None: with None the client would send a token it finds on the machine (utils/_headers.py:57-60).
        self.token: str | Literal[False] = token or False
        self.api = HfApi(endpoint=self.endpoint, token=self.token)

    def resolve(self, repo_id: str, revision: str) -> str:
        """The commit `revision` names now; a commit hash is its own answer (no call)."""
        if REGEX_COMMIT_HASH.fullmatch(revision):
            return revision
        sha = self.api.model_info(repo_id, revision=revision).sha
        if not sha:
            raise Glm53Error(
                f"the hub at {self.endpoint} answered for {repo_id}@{revision} without a commit (`sha`); check that "
                "weights.staging.endpoint is a Hugging Face Hub API",
                EXIT_FAILURE,
            )
        return sha

    def list_files(self, repo_id: str, commit: str) -> list[RepoEntry]:
        """Every file of the repository at `commit` (folders left out), in the hub's order."""
        entries = self.api.list_repo_tree(repo_id, recursive=True, revision=commit)
        return [_entry(item) for item in entries if isinstance(item, RepoFile)]

    def source(self, repo_id: str, commit: str, path: str) -> FileSource:
        """The HEAD of one file, and where its bytes are fetched from, with the headers the client would send."""
        url = hf_hub_url(repo_id, path, revision=commit, endpoint=self.endpoint)
        metadata = get_hf_file_metadata(url, token=self.token, endpoint=self.endpoint)
        if metadata.etag is None:
            raise Glm53Error(
                f"the hub's HEAD of {path} in {repo_id}@{commit[:12]} carries no ETag; check that "
                "weights.staging.endpoint is a Hugging Face Hub API",
                EXIT_FAILURE,
            )
        headers = build_hf_headers(token=self.token)
        target = url
        # As the client does (file_download.py:1818-1822): a redirect's target is fetched directly, and off the hub
        # (a CDN's signed URL) without the token; a Xet-backed file keeps the hub's URL and its redirects.
        if metadata.xet_file_data is None and metadata.location != url:
            target = metadata.location
            if not _is_same_or_hub_host(url, metadata.location):
                headers.pop("authorization", None)
        return FileSource(metadata.etag, metadata.size, target, headers)


def _entry(item: RepoFile) -> RepoEntry:
    return RepoEntry(item.path, int(item.size), item.blob_id, item.lfs.sha256 if item.lfs is not None else None)


# `http_get` writes what it receives in pieces of `constants.DOWNLOAD_CHUNK_SIZE` (10 MiB, read at each call:
# `constants.py:40`, `file_download.py:459`), so up to that much sits in memory, unseen by the progress line and lost
# to a kill. A smaller piece makes a kill lose at most this per file and the progress move smoothly; at hundreds of
# MB/s it is still only a few hundred writes a second.
WRITE_PIECE_BYTES = 1024 * 1024


def download(source: FileSource, partial: Path, size: int) -> int:
    """Fetch the rest of one file into `partial`, resuming after the bytes already there; the bytes fetched.

    `http_get` itself resumes up to five times within the call on a dropped connection (`file_download.py:468-486`)
    and raises when the total is not `size` (`:488-495`). A longer partial than the file is a stale one: discarded.
    """
    try:
        resume = partial.stat().st_size
    except FileNotFoundError:
        resume = 0
    if resume > size:
        partial.unlink()
        resume = 0
    partial.parent.mkdir(parents=True, exist_ok=True)
    constants.DOWNLOAD_CHUNK_SIZE = WRITE_PIECE_BYTES
    with open(partial, "ab") as handle:
        http_get(
            source.url,
            handle,
            resume_size=resume,
            headers=dict(source.headers),
            expected_size=size,
            displayed_filename=partial.name,
        )
        handle.flush()
        os.fsync(handle.fileno())  # the blob is renamed into place next: its bytes must be on the volume first
    return size - resume


@dataclass(frozen=True)
class Context:
    """What a failure sentence names: the repository, the revision, where the hub is, and where the token came from."""

    repo_id: str
    revision: str
    endpoint: str
    token_file: Path | None
    cache_dir: Path


def explain(error: BaseException, context: Context) -> str:
    """One sentence for an operator: what happened, what was expected, and what to change."""
    target = f"{context.repo_id}@{context.revision}"
    token = f"the token in {context.token_file}" if context.token_file else "no token"
    if isinstance(error, Glm53Error):
        return error.message
    if isinstance(error, GatedRepoError):
        if context.token_file is None:
            return (
                f"{context.repo_id} is a gated repository and the hub at {context.endpoint} refused it without a token "
                f"(HTTP {error.response.status_code} GatedRepo); accept the model's terms on the hub, put a read "
                "token in a Secret and name it in weights.hfTokenSecret.name"
            )
        return (
            f"the hub at {context.endpoint} refused {context.token_file}'s token for the gated repository "
            f"{context.repo_id} (HTTP {error.response.status_code} GatedRepo): its account has not been granted "
            "access; accept the model's terms with that account, or put another account's token in the Secret"
        )
    if isinstance(error, RevisionNotFoundError):
        return (
            f"{context.repo_id} has no revision {context.revision!r} on the hub at {context.endpoint} (HTTP "
            f"{error.response.status_code} RevisionNotFound); set weights.revision to a branch, tag or commit of it"
        )
    if isinstance(error, RepositoryNotFoundError):
        return (
            f"the hub at {context.endpoint} shows no repository {context.repo_id} with {token} (HTTP "
            f"{error.response.status_code} RepoNotFound); check the repository id (vllm.model, or the profile's "
            "model id) and, for a private repository, the token in weights.hfTokenSecret"
        )
    if isinstance(error, RemoteEntryNotFoundError):
        return (
            f"a file the hub listed for {target} is gone from it (HTTP 404 EntryNotFound: {error.response.url}); "
            "the revision changed while it was staged: pin weights.revision to a commit"
        )
    if isinstance(error, HfHubHTTPError):
        code = error.response.status_code
        said = error.server_message or error.response.reason_phrase
        if code == 401:
            return (
                f"the hub at {context.endpoint} rejected {token} (HTTP 401: {said}); put a valid read token in the "
                "Secret named in weights.hfTokenSecret.name"
            )
        if code == 403:
            return (
                f"the hub at {context.endpoint} forbade {target} to {token} (HTTP 403: {said}); give the token read "
                "access to the repository"
            )
        return (
            f"the hub at {context.endpoint} answered HTTP {code} ({said}) for {target}; the stage step tries again "
            "by itself, nothing to change unless it persists"
        )
    if isinstance(error, httpx2.TransportError | LocalEntryNotFoundError | ConnectionError | TimeoutError):
        return (
            f"cannot reach the hub at {context.endpoint} to stage {target} ({type(error).__name__}: "
            f"{_first_line(error)}), and the weights volume holds no complete copy of it; allow the pod's egress to "
            "the hub (a NetworkPolicy, or HTTPS_PROXY in weights.staging.extraEnv), or set weights.staging.endpoint "
            "to a mirror"
        )
    if isinstance(error, OSError) and error.errno == errno.ENOSPC:
        return (
            f"the weights volume at {context.cache_dir} is full while staging {target}; grow the claim "
            "(weights.newPvc.size) or free it, and the stage step resumes where it stopped"
        )
    if isinstance(error, OSError) and error.errno in {errno.EACCES, errno.EPERM, errno.EROFS}:
        return (
            f"cannot write {error.filename or context.cache_dir} ({error.strerror}); the weights volume must be "
            "writable by uid 10001, or pre-staged and mounted with weights.readOnly=true (which skips staging)"
        )
    return f"staging {target} failed: {type(error).__name__}: {_first_line(error)}"


def _first_line(error: BaseException) -> str:
    lines = [line.strip() for line in str(error).splitlines() if line.strip()]
    return lines[0] if lines else "no message"


def transient(error: BaseException) -> bool:
    """Whether waiting can fix it: the network, the hub's 5xx and 429. The resident loop retries everything anyway
    (a fixed Secret is remounted into the running container), but backs off harder from what only a person fixes."""
    if isinstance(error, httpx2.TransportError | LocalEntryNotFoundError | ConnectionError | TimeoutError):
        return True
    return isinstance(error, HfHubHTTPError) and (
        error.response.status_code >= 500 or error.response.status_code == 429
    )


def files_needing(entries: Iterable[RepoEntry], present: dict[str, int]) -> int:
    """Bytes still to fetch, given the bytes already on the volume per path (complete blobs and partial files)."""
    return sum(max(0, entry.size - present.get(entry.path, 0)) for entry in entries)
