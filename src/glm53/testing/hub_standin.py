"""A stand-in of the Hugging Face Hub's file API on loopback, serving model repositories from local directories.

Why: the hub is out of reach from these machines, and the stage step must be proved with the real `huggingface_hub`
client (2.4.0) talking HTTP: listing, HEAD, redirects, ranges, error codes. This serves what that client calls, read
in its code, and uses the client's own header names (`huggingface_hub.constants`) and hash functions
(`huggingface_hub.utils.sha`):
- `GET /api/models/{repo}[/revision/{rev}]`: `HfApi.model_info` (`hf_api.py:3205-3218`; the fields `ModelInfo`
  reads, `:914-985`: id, sha, siblings with rfilename, size, blobId and lfs {size, sha256, pointerSize});
- `GET /api/models/{repo}/tree/{rev}?recursive=true`: `HfApi.list_repo_tree` (`hf_api.py:4018-4032`; a file entry
  is type, path, size, oid and lfs {oid, size, pointerSize}, `:712-718`; a folder is type, path, oid, `:761-763`);
- `HEAD|GET /{repo}/resolve/{rev}/{path}`: `get_hf_file_metadata` (`file_download.py:1664-1689`) reads X-Repo-Commit,
  X-Linked-Etag (else ETag), X-Linked-Size (else Content-Length) and Location. An LFS file answers 302 to a "CDN" on
  another origin (another port), as the hub redirects to its CDN, so the client stops at the redirect and sends no
  token there (`utils/_http.py:763-784`); a regular file answers itself, its ETag the git blob id;
- `HEAD|GET {cdn}/lfs/{sha256}`: the bytes, honouring `Range: bytes=N-` (`file_download.py:376-378`, the header
  `_adjust_range_header` builds, `utils/_http.py:1199-1233`) with 206 and Content-Range;
- errors as the hub words them, in X-Error-Code and X-Error-Message: RepoNotFound (401), RevisionNotFound (404),
  EntryNotFound (404), GatedRepo (401 without a token, 403 with one not granted), which `hf_raise_for_status` maps to
  its exceptions (`utils/_http.py:871-953`).
A repository's commit is a hash of its files' paths and blob ids, so it changes exactly when the files do. Faults a
test can set: a throttle (bytes per second, so a kill lands mid-file), files served with one byte flipped, and a
request log with the Range of every byte request.
"""

from __future__ import annotations

import argparse
import contextlib
import fnmatch
import hashlib
import json
import sys
import threading
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import parse_qs, quote, unquote, urlsplit

from huggingface_hub import constants
from huggingface_hub.utils.sha import git_hash, sha_fileobj

LOCALHOST = "127.0.0.1"
# What a new repository's .gitattributes sends to LFS, as the hub's default template does for weights and archives;
# tokenizer.json too, as most model repositories track it.
LFS_PATTERNS = ("*.safetensors", "*.bin", "*.pt", "*.pth", "*.ckpt", "*.h5", "*.msgpack", "*.onnx", "tokenizer.json")
_CHUNK = 64 * 1024


@dataclass(frozen=True)
class HostedFile:
    path: str
    source: Path | None  # None: the generated .gitattributes, held in `content`
    size: int
    blob_id: str  # git blob id: of the content, or of the LFS pointer
    sha256: str | None  # LFS files only
    pointer_size: int
    content: bytes = b""


@dataclass(frozen=True)
class HostedRepo:
    repo_id: str
    commit: str
    files: Mapping[str, HostedFile]
    gated: bool = False

    @property
    def total_bytes(self) -> int:
        return sum(f.size for f in self.files.values())


def _pointer(sha256: str, size: int) -> bytes:
    return f"version https://git-lfs.github.com/spec/v1\noid sha256:{sha256}\nsize {size}\n".encode()


def host_directory(repo_id: str, directory: Path, gated: bool = False) -> HostedRepo:
    """A repository of every file under `directory`, plus the .gitattributes that sends LFS_PATTERNS to LFS."""
    attributes = "".join(f"{p} filter=lfs diff=lfs merge=lfs -text\n" for p in LFS_PATTERNS).encode()
    files = {
        ".gitattributes": HostedFile(".gitattributes", None, len(attributes), git_hash(attributes), None, 0, attributes)
    }
    for source in sorted(p for p in directory.rglob("*") if p.is_file()):
        path = source.relative_to(directory).as_posix()
        size = source.stat().st_size
        if any(fnmatch.fnmatch(Path(path).name, pattern) for pattern in LFS_PATTERNS):
            with source.open("rb") as handle:
                sha256 = sha_fileobj(handle).hex()
            pointer = _pointer(sha256, size)
            files[path] = HostedFile(path, source, size, git_hash(pointer), sha256, len(pointer))
        else:
            files[path] = HostedFile(path, source, size, git_hash(source.read_bytes()), None, 0)
    commit = hashlib.sha1("".join(f"{f.path} {f.blob_id}\n" for f in files.values()).encode()).hexdigest()
    return HostedRepo(repo_id, commit, files, gated)


@dataclass
class Faults:
    """What the stand-in does wrong on purpose; changeable while it runs."""

    throttle_bytes_per_s: float | None = None
    corrupt: set[str] = field(default_factory=set)  # paths served with one byte flipped


@dataclass
class Served:
    """What the stand-in answered: (method, path, Range header) per request, the paths asked for with a token, and
    bytes of content sent per file path (and per file path and Range)."""

    requests: list[tuple[str, str, str | None]] = field(default_factory=list)
    with_token: set[str] = field(default_factory=set)
    content_bytes: dict[str, int] = field(default_factory=dict)
    # (file path, Range header) -> content bytes sent for such requests
    by_range: dict[tuple[str, str | None], int] = field(default_factory=dict)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def ranges(self, path: str) -> list[str | None]:
        with self.lock:
            return [r for method, p, r in self.requests if method == "GET" and p == path]


def _url(server: ThreadingHTTPServer) -> str:
    """The base URL of one of the stand-in's loopback servers, on the port it was given."""
    return f"http://{LOCALHOST}:{server.server_address[1]}"


class HubStandIn:
    """The hub's file API for `repos` on two loopback servers: the hub and its "CDN"."""

    def __init__(self, repos: Sequence[HostedRepo], tokens: Sequence[str] = (), port: int = 0) -> None:
        self.repos = {repo.repo_id: repo for repo in repos}
        self.tokens = set(tokens)
        self.faults = Faults()
        self.served = Served()
        self._hub = ThreadingHTTPServer((LOCALHOST, port), _handler(self, cdn=False))
        self._cdn = ThreadingHTTPServer((LOCALHOST, 0), _handler(self, cdn=True))
        self._hub.daemon_threads = self._cdn.daemon_threads = True
        self._threads = [threading.Thread(target=s.serve_forever, daemon=True) for s in (self._hub, self._cdn)]

    @property
    def endpoint(self) -> str:
        return _url(self._hub)

    @property
    def cdn(self) -> str:
        return _url(self._cdn)

    def __enter__(self) -> HubStandIn:
        for thread in self._threads:
            thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        for server in (self._hub, self._cdn):
            server.shutdown()
            server.server_close()

    def blob(self, sha256: str) -> HostedFile | None:
        for repo in self.repos.values():
            for hosted in repo.files.values():
                if hosted.sha256 == sha256:
                    return hosted
        return None


class _Refused(Exception):
    def __init__(self, status: int, code: str, message: str, commit: str | None = None) -> None:
        super().__init__(message)
        self.status, self.code, self.message, self.commit = status, code, message, commit


def _handler(hub: HubStandIn, cdn: bool) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"  # keep-alive, as the client's pooled connections expect

        def log_message(self, format: str, *args: object) -> None:
            """Quiet: the request log is `hub.served`."""

        def do_HEAD(self) -> None:
            self._answer(head=True)

        def do_GET(self) -> None:
            self._answer(head=False)

        def _answer(self, head: bool) -> None:
            url = urlsplit(self.path)
            path = unquote(url.path)
            with hub.served.lock:
                hub.served.requests.append((self.command, path, self.headers.get("Range")))
                if self.headers.get("Authorization"):
                    hub.served.with_token.add(path)
            try:
                if cdn:
                    self._cdn(path, head)
                elif path.startswith("/api/models/"):
                    self._api(path[len("/api/models/") :], parse_qs(url.query))
                elif "/resolve/" in path:
                    self._resolve(path, head)
                else:
                    raise _Refused(404, "EntryNotFound", f"no route {path}")
            except _Refused as refused:
                headers = {"X-Error-Code": refused.code, "X-Error-Message": refused.message}
                if refused.commit:
                    headers[constants.HUGGINGFACE_HEADER_X_REPO_COMMIT] = refused.commit
                self._send(refused.status, json.dumps({"error": refused.message}).encode(), headers, head)
            except (BrokenPipeError, ConnectionResetError):
                pass  # the client went away (a killed stage step): nothing to answer

        # --- the hub ----------------------------------------------------------------------------------------------

        def _repo(self, repo_id: str) -> HostedRepo:
            repo = hub.repos.get(repo_id)
            if repo is None:
                raise _Refused(401, "RepoNotFound", "Repository not found")
            if repo.gated:
                token = self.headers.get("Authorization", "").removeprefix("Bearer ").strip()
                if not token:
                    raise _Refused(
                        401,
                        "GatedRepo",
                        f"Access to model {repo_id} is restricted. You must have access "
                        "to it and be authenticated to access it. Please log in.",
                    )
                if token not in hub.tokens:
                    raise _Refused(
                        403,
                        "GatedRepo",
                        f"Access to model {repo_id} is restricted and you are not in the authorized list.",
                    )
            return repo

        def _commit(self, repo: HostedRepo, revision: str) -> str:
            if revision in {"main", repo.commit}:
                return repo.commit
            raise _Refused(404, "RevisionNotFound", f"Invalid rev id: {revision}")

        def _split_repo(self, rest: str) -> tuple[str, str]:
            """(repo id, what follows it): ids are `org/name`."""
            parts = rest.split("/", 2)
            if len(parts) < 2:
                raise _Refused(404, "RepoNotFound", "Repository not found")
            return "/".join(parts[:2]), parts[2] if len(parts) > 2 else ""

        def _api(self, rest: str, query: Mapping[str, list[str]]) -> None:
            repo_id, tail = self._split_repo(rest)
            repo = self._repo(repo_id)
            body: object
            if tail == "" or tail.startswith("revision/"):
                commit = self._commit(repo, tail.removeprefix("revision/") or "main")
                blobs = query.get("blobs", ["false"])[0].lower() == "true"
                body = {
                    "_id": repo.commit,
                    "id": repo.repo_id,
                    "modelId": repo.repo_id,
                    "sha": commit,
                    "private": False,
                    "gated": "manual" if repo.gated else False,
                    "disabled": False,
                    "siblings": [self._sibling(f, blobs) for f in repo.files.values()],
                }
            elif tail.startswith("tree/"):
                revision, _, prefix = tail.removeprefix("tree/").partition("/")
                self._commit(repo, revision)
                recursive = query.get("recursive", ["false"])[0].lower() == "true"
                body = self._tree(repo, prefix.strip("/"), recursive)
            else:
                raise _Refused(404, "EntryNotFound", f"no API route {tail}")
            self._send(200, json.dumps(body).encode(), {"Content-Type": "application/json"}, False)

        @staticmethod
        def _sibling(hosted: HostedFile, blobs: bool) -> dict[str, object]:
            if not blobs:
                return {"rfilename": hosted.path}
            entry: dict[str, object] = {"rfilename": hosted.path, "size": hosted.size, "blobId": hosted.blob_id}
            if hosted.sha256:
                entry["lfs"] = {"size": hosted.size, "sha256": hosted.sha256, "pointerSize": hosted.pointer_size}
            return entry

        @staticmethod
        def _tree(repo: HostedRepo, prefix: str, recursive: bool) -> list[dict[str, object]]:
            under = [f for f in repo.files.values() if not prefix or f.path.startswith(prefix + "/")]
            entries: list[dict[str, object]] = []
            folders: set[str] = set()
            for hosted in under:
                relative = hosted.path[len(prefix) + 1 :] if prefix else hosted.path
                parts = relative.split("/")
                for depth in range(1, len(parts)):
                    folder = "/".join(([prefix] if prefix else []) + parts[:depth])
                    if folder not in folders and (recursive or depth == 1):
                        folders.add(folder)
                        oid = hashlib.sha1(folder.encode()).hexdigest()
                        entries.append({"type": "directory", "oid": oid, "size": 0, "path": folder})
                if len(parts) > 1 and not recursive:
                    continue
                entry: dict[str, object] = {
                    "type": "file",
                    "oid": hosted.blob_id,
                    "size": hosted.size,
                    "path": hosted.path,
                }
                if hosted.sha256:
                    entry["lfs"] = {"oid": hosted.sha256, "size": hosted.size, "pointerSize": hosted.pointer_size}
                entries.append(entry)
            return entries

        def _resolve(self, path: str, head: bool) -> None:
            repo_part, _, rest = path.lstrip("/").partition("/resolve/")
            repo = self._repo(repo_part)
            revision, _, file_path = rest.partition("/")
            commit = self._commit(repo, unquote(revision))
            hosted = repo.files.get(file_path)
            if hosted is None:
                raise _Refused(404, "EntryNotFound", "Entry not found", commit)
            headers = {constants.HUGGINGFACE_HEADER_X_REPO_COMMIT: commit, "Accept-Ranges": "bytes"}
            if hosted.sha256 is not None:
                headers |= {
                    "Location": f"{hub.cdn}/lfs/{hosted.sha256}?filename={quote(Path(file_path).name)}",
                    constants.HUGGINGFACE_HEADER_X_LINKED_ETAG: f'"{hosted.sha256}"',
                    constants.HUGGINGFACE_HEADER_X_LINKED_SIZE: str(hosted.size),
                    "ETag": f'"{hosted.blob_id}"',
                }
                self._send(302, b"", headers, head)
                return
            self._content(hosted, {**headers, "ETag": f'"{hosted.blob_id}"'}, head)

        # --- the CDN ----------------------------------------------------------------------------------------------

        def _cdn(self, path: str, head: bool) -> None:
            hosted = hub.blob(path.removeprefix("/lfs/"))
            if hosted is None:
                raise _Refused(404, "EntryNotFound", "no such object")
            self._content(hosted, {"ETag": f'"{hosted.sha256}"', "Accept-Ranges": "bytes"}, head)

        def _content(self, hosted: HostedFile, headers: dict[str, str], head: bool) -> None:
            start = _range_start(self.headers.get("Range"), hosted.size)
            if start is None:
                self._send(416, b"", {"Content-Range": f"bytes */{hosted.size}"}, head)
                return
            status = 206 if self.headers.get("Range") else 200
            if status == 206:
                headers["Content-Range"] = f"bytes {start}-{hosted.size - 1}/{hosted.size}"
            self._head(status, headers, hosted.size - start)
            if not head:
                self._stream(hosted, start)

        def _stream(self, hosted: HostedFile, start: int) -> None:
            """The file's bytes from `start`, read from disk piece by piece (a weights file need not fit in memory)."""
            flip = hosted.size // 2 if hosted.path in hub.faults.corrupt else -1
            key = (hosted.path, self.headers.get("Range"))
            with contextlib.ExitStack() as stack:
                source = None if hosted.source is None else stack.enter_context(hosted.source.open("rb"))
                offset = start
                while offset < hosted.size:
                    if source is None:
                        chunk = hosted.content[offset : offset + _CHUNK]
                    else:
                        source.seek(offset)
                        chunk = source.read(min(_CHUNK, hosted.size - offset))
                    if offset <= flip < offset + len(chunk):
                        at = flip - offset
                        chunk = chunk[:at] + bytes([chunk[at] ^ 0xFF]) + chunk[at + 1 :]
                    self.wfile.write(chunk)
                    offset += len(chunk)
                    with hub.served.lock:
                        hub.served.content_bytes[hosted.path] = hub.served.content_bytes.get(hosted.path, 0) + len(
                            chunk
                        )
                        hub.served.by_range[key] = hub.served.by_range.get(key, 0) + len(chunk)
                    if hub.faults.throttle_bytes_per_s:
                        time.sleep(len(chunk) / hub.faults.throttle_bytes_per_s)

        def _head(self, status: int, headers: Mapping[str, str], length: int) -> None:
            self.send_response(status)
            for name, value in headers.items():
                self.send_header(name, value)
            self.send_header("Content-Length", str(length))
            self.end_headers()

        def _send(self, status: int, body: bytes, headers: Mapping[str, str], head: bool) -> None:
            self._head(status, headers, len(body))
            if not head:
                self.wfile.write(body)

    return Handler


def _range_start(header: str | None, size: int) -> int | None:
    """The first byte a `bytes=N-` request wants (0 without one); None when it lies beyond the file."""
    if not header:
        return 0
    spec = header.removeprefix("bytes=").split("-", 1)[0]
    start = int(spec) if spec.isdigit() else 0
    return start if start < size or size == 0 else None


@contextlib.contextmanager
def serving(repos: Sequence[HostedRepo], tokens: Sequence[str] = ()) -> Iterator[HubStandIn]:
    with HubStandIn(repos, tokens) as hub:
        yield hub


def main(argv: Sequence[str] | None = None) -> int:
    """`python -m glm53.testing.hub_standin --repo glm53/tiny-dense=DIR [--gated --token T] [--port P]`."""
    parser = argparse.ArgumentParser(prog="python -m glm53.testing.hub_standin", description=__doc__.splitlines()[0])
    parser.add_argument("--repo", action="append", required=True, metavar="ID=DIR", help="a repository to serve")
    parser.add_argument("--gated", action="store_true", help="every repository needs one of the --token values")
    parser.add_argument("--token", action="append", default=[], help="a token the gated repositories accept")
    parser.add_argument("--port", type=int, default=0, help="the hub's port (default: a free one)")
    parser.add_argument("--throttle-mib-s", type=float, help="serve file contents at most this fast")
    args = parser.parse_args(argv)
    repos = []
    for spec in args.repo:
        repo_id, _, directory = spec.partition("=")
        repos.append(host_directory(repo_id, Path(directory), gated=args.gated))
    with HubStandIn(repos, args.token, args.port) as hub:
        if args.throttle_mib_s:
            hub.faults.throttle_bytes_per_s = args.throttle_mib_s * 2**20
        for repo in repos:
            print(
                f"serving {repo.repo_id} (commit {repo.commit}, {len(repo.files)} files) at {hub.endpoint}", flush=True
            )
        with contextlib.suppress(KeyboardInterrupt):
            threading.Event().wait()
    return 0


if __name__ == "__main__":
    sys.exit(main())
