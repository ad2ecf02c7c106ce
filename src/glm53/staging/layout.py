"""Where a staged repository lives in the Hugging Face cache, and the completion marker that says it is whole.

The cache layout is `huggingface_hub`'s own (2.4.0 `file_download.py:880-903`, the `hf_hub_download` docstring): under
`<cache>/models--<org>--<name>/`, `blobs/<etag>` holds each file's bytes (the etag is the sha256 of an LFS file, the
git blob id of any other), `snapshots/<commit>/<path>` links to its blob, `refs/<branch>` names a commit, and
`.locks/models--<org>--<name>/<etag>.lock` is the per-blob lock the client takes (`file_download.py:1249`). The
engine reads exactly this layout offline, so the stage step writes nothing else there but two things of its own:
- `blobs/<etag>.partial`: a download in progress, which a later attempt resumes (the client's own temporary files
  are unique per process and deleted on failure, so a killed client never resumes: `file_download.py:1996-2046`);
- `glm53-staged/<revision>.json`: the marker, written last, atomically, after every file was verified.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import quote

from glm53.errors import EXIT_FAILURE, Glm53Error

MARKER_DIR = "glm53-staged"
MARKER_VERSION = 1


def repo_folder(repo_id: str) -> str:
    """The cache folder of a model repository (`file_download.py:747-755`, repo_folder_name: `models--org--name`)."""
    return "--".join(["models", *repo_id.split("/")])


@dataclass(frozen=True)
class StagedFile:
    """One repository file as the marker records it: its size and the hash the hub lists for it."""

    path: str
    size: int
    etag: str  # the blob's name in the cache
    algorithm: str  # "sha256" (LFS files) or "git-sha1" (the git blob id of any other file)
    digest: str


@dataclass(frozen=True)
class RepoLayout:
    """The paths of one repository in one cache directory."""

    cache_dir: Path
    repo_id: str

    @property
    def storage(self) -> Path:
        return self.cache_dir / repo_folder(self.repo_id)

    def blob(self, etag: str) -> Path:
        return self.storage / "blobs" / etag

    def partial(self, etag: str) -> Path:
        return self.storage / "blobs" / f"{etag}.partial"

    def lock(self, etag: str) -> Path:
        return self.cache_dir / ".locks" / repo_folder(self.repo_id) / f"{etag}.lock"

    def snapshot(self, commit: str) -> Path:
        return self.storage / "snapshots" / commit

    def pointer(self, commit: str, path: str) -> Path:
        return self.snapshot(commit).joinpath(*path.split("/"))

    def ref(self, revision: str) -> Path:
        return self.storage / "refs" / revision

    def marker(self, revision: str) -> Path:
        return self.storage / MARKER_DIR / f"{quote(revision, safe='')}.json"


@dataclass(frozen=True)
class Marker:
    """What a completed staging left: the repository, the revision asked for, the commit it was, and every file."""

    repo_id: str
    revision: str
    commit: str
    files: tuple[StagedFile, ...]
    facts: Mapping[str, Any]  # how it went: seconds downloading and verifying, versions (for people, not for logic)

    @property
    def total_bytes(self) -> int:
        return sum(f.size for f in self.files)


def write_marker(layout: RepoLayout, marker: Marker) -> Path:
    """Write the marker atomically; the last thing a successful staging does."""
    path = layout.marker(marker.revision)
    path.parent.mkdir(parents=True, exist_ok=True)
    record = {
        "version": MARKER_VERSION,
        "repo": marker.repo_id,
        "revision": marker.revision,
        "commit": marker.commit,
        "files": [vars(f) for f in marker.files],
        "facts": dict(marker.facts),
    }
    temporary = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    temporary.write_text(json.dumps(record, indent=1, sort_keys=True) + "\n")
    with open(temporary, "rb") as handle:
        os.fsync(handle.fileno())
    os.replace(temporary, path)
    return path


def read_marker(layout: RepoLayout, revision: str) -> Marker | None:
    """The marker for `revision`, or None when there is none (or it is unreadable, which staging repairs)."""
    path = layout.marker(revision)
    try:
        record = json.loads(path.read_text())
    except FileNotFoundError:
        return None
    except (OSError, ValueError):
        return None
    try:
        if record["version"] != MARKER_VERSION or record["repo"] != layout.repo_id or record["revision"] != revision:
            return None
        files = tuple(StagedFile(**entry) for entry in record["files"])
        return Marker(layout.repo_id, revision, str(record["commit"]), files, dict(record.get("facts", {})))
    except (KeyError, TypeError):
        return None


def size_problems(layout: RepoLayout, commit: str, files: Sequence[StagedFile]) -> dict[str, str]:
    """Path -> what is wrong, for every file whose snapshot entry is missing or of another size than recorded.

    Cheap (one stat per file, through the snapshot's link to its blob): what a restart checks before the engine starts.
    """
    problems = {}
    for staged in files:
        pointer = layout.pointer(commit, staged.path)
        try:
            size = pointer.stat().st_size
        except FileNotFoundError:
            problems[staged.path] = "missing"
            continue
        except OSError as error:
            raise Glm53Error(
                f"cannot read {pointer} ({error.strerror}); check the weights volume's permissions (uid 10001)",
                EXIT_FAILURE,
            ) from None
        if size != staged.size:
            problems[staged.path] = f"{size} bytes, expected {staged.size}"
    return problems
