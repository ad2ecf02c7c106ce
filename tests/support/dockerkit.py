"""The Docker-marked tests' machinery: a private Docker engine, its base image, and Ansible runs against it.

`tests/conftest.py` turns these into session fixtures. Why one of each per session: CI has 2 cores, so starting the
daemon, importing the base image and building the mock image are paid once and shared by every test. The engine is
private — its own data root, and its exec root, pidfile and unix socket in a temporary directory, no bridge, no
iptables — so it touches nothing else on the host, and it is stopped by its PID at the end whatever the tests did. It
runs the overlay2 storage driver (a layer or a container costs only what it changes) on disk when the filesystem can be
overlayfs' upper layer (ext4, xfs: CI's is ext4), else on a private tmpfs when the kernel lets us mount one (we run as
root in CI), else vfs on disk, which copies every layer and every container's root filesystem file by file (measured
10 s per 130 MB on CI's disk). Disk first: the mock image is 5.5 GB with the real CPU engine, its build peaks at about
twice that, and on tmpfs all of it would be memory the real-engine pods of the other xdist worker need (24 GiB in all).

The data root persists across sessions when it can (overlay2 on disk): under `$GLM53_CACHE_DIR` (default ~/.cache/glm53,
outside the clone), one per daemon version and storage driver, so a later session, from this clone or a fresh one, finds
the previous build's layers in Docker's own cache: the playbook's builds of the mock and router images take 7-20 s
(measured; a new commit reinstalls only the toolkit's wheel) instead of 420-550 s (CI, cold), and the rest of the
playbook (the host's `pip wheel` runs, the smoke commands inside the images) about 90 s. Still verified on every run:
the playbook builds the images through Docker as always, a cache hit only where Docker's cache key (the instruction, its
parent, the files copied) is unchanged, and the tests check the image that comes out. Each session prunes what the build
does not need (see `_prune`), so the data root stays the size of one build however many commits pass. No registry is
reachable, so the base image is a debootstrapped Debian bookworm (`docker import`), cached as a tarball beside it (named
by its package list) so later runs and fresh clones skip debootstrap.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import importlib.util
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from types import ModuleType
from typing import IO, Any

import pytest
from docker.errors import DockerException, ImageNotFound
from docker.models.images import Image

import docker
from glm53.testing.processes import kill_group

REPO_ROOT = Path(__file__).resolve().parents[2]
TOOLS_BIN = REPO_ROOT / ".tools" / "bin"
BASE_IMAGE = "glm53/debian-base:bookworm"
# debootstrap's --include list: Python 3.11 plus venv (ensurepip) and its headers, tini (the images' PID 1), and
# libnuma1 and g++ (the real CPU engine links the one and compiles its kernels with the other, against Python.h),
# which the images' offline builds cannot fetch (docker/install-debs.sh checks they are the pinned versions), on top
# of minbase.
BASE_PACKAGES = ("python3", "python3-venv", "python3-dev", "ca-certificates", "tini", "libnuma1", "g++")
# The cache of scripts/setup.d/lib/cache.sh, which the setup scripts keep their tool environments in.
CACHE_DIR = Path(
    os.environ.get("GLM53_CACHE_DIR") or Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "glm53"
)
# The engine's persistent data roots and the base image's tarball.
DOCKER_CACHE = CACHE_DIR / "docker"
BASE_TARBALL = DOCKER_CACHE / f"debian-bookworm-minbase-{'-'.join(BASE_PACKAGES)}.tar"
# Package caches and documentation debootstrap leaves behind; vfs copies the rootfs per layer, so every MB counts.
BASE_PRUNE = (
    "var/cache/apt",
    "var/lib/apt/lists",
    "usr/share/doc",
    "usr/share/man",
    "usr/share/locale",
    "usr/share/info",
)
ENGINE_START_DEADLINE_S = 60.0
# Filesystems overlay2 runs on, as `stat --file-system --format=%T` names them (ext4 reads "ext2/ext3").
OVERLAY_BACKING_FILESYSTEMS = frozenset({"ext2/ext3", "xfs", "btrfs"})
ENGINE_STOP_DEADLINE_S = 30.0
# Cap of the engine's tmpfs when no disk can hold overlay2 (a cap, not a reservation; ~6 GB are used, 11 GB at the
# build's peak): the base image, the mock image (5.5 GB with torch, vLLM's CPU engine and LMCache) and the router
# image, the pods' writable layers and volumes, with the headroom the playbook's free-disk preflight asks for
# (glm53_images_min_free_gb: 13 GB for mock + router) on a rebuild.
ENGINE_TMPFS_SIZE = "20g"
# BuildKit's build cache kept by the start-up prune, where a docker CLI drives BuildKit (the legacy builder's cache is
# the images themselves, pruned by tag): room for the mock and router builds (11 GB at the mock build's peak).
ENGINE_BUILD_CACHE_KEEP_BYTES = 16 * 1024**3


@dataclass(frozen=True)
class DockerEngine:
    """A running private daemon: where to reach it and a client already connected to it."""

    base_url: str
    client: docker.DockerClient
    pid: int
    log_path: Path

    def env(self) -> dict[str, str]:
        """The process environment for a docker CLI (or Ansible) that must talk to this engine only."""
        return {**os.environ, "DOCKER_HOST": self.base_url, "PATH": tool_path()}


@dataclass(frozen=True)
class MockImageBuild:
    """The outcome of the session's `ansible-playbook ansible/build-images.yml` run for the mock image."""

    report_path: Path
    report: dict[str, Any]
    run: PlaybookRun


def load_image_script(path: Path) -> ModuleType:
    """A Python file beside the Dockerfile as a module (they live in the image, not in the glm53 package)."""
    spec = importlib.util.spec_from_file_location(path.stem, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up while being created
    spec.loader.exec_module(module)
    return module


def tool_path() -> str:
    """PATH with the project's tools first and the sbin directories (dockerd, debootstrap) last."""
    return os.pathsep.join(
        [str(TOOLS_BIN), str(REPO_ROOT / ".venv" / "bin"), os.environ.get("PATH", ""), "/usr/sbin", "/sbin"]
    )


def require_tool(name: str, setup_script: str) -> str:
    """The absolute path of an external tool, or fail (not skip) naming the setup script that installs it."""
    found = shutil.which(name, path=tool_path())
    if found is None:
        pytest.fail(f"{name} not found on PATH or in .tools/bin; run `bash scripts/setup.d/{setup_script}` first")
    return found


def _wait_for_engine(process: subprocess.Popen[bytes], base_url: str, log_path: Path) -> docker.DockerClient:
    deadline = time.monotonic() + ENGINE_START_DEADLINE_S
    last_error = "no attempt yet"
    while time.monotonic() < deadline:
        if process.poll() is not None:
            pytest.fail(f"dockerd exited with {process.returncode} during start-up; log tail:\n{_tail(log_path)}")
        try:
            client = docker.DockerClient(base_url=base_url, version="auto", timeout=30)
            client.ping()
            return client
        except DockerException as error:
            last_error = str(error)
        time.sleep(0.2)
    pytest.fail(
        f"dockerd did not answer on {base_url} within {ENGINE_START_DEADLINE_S:.0f}s ({last_error}); "
        f"log tail:\n{_tail(log_path)}"
    )


def _tail(path: Path, lines: int = 20) -> str:
    return "\n".join(path.read_text(errors="replace").splitlines()[-lines:]) if path.exists() else "(no log)"


def _overlay_capable_disk(path: Path) -> bool:
    """Whether `path`'s filesystem can hold overlayfs' upper and work directories (overlay2's backing filesystems);
    not an overlayfs itself (a container's root), not a tmpfs."""
    kind = subprocess.run(
        ["stat", "--file-system", "--format=%T", str(path)], capture_output=True, text=True, check=False
    )
    return kind.stdout.strip() in OVERLAY_BACKING_FILESYSTEMS


def _mount_tmpfs(state: Path) -> bool:
    """Mount a private tmpfs on the engine's state directory; False (disk-backed, slower) when mounting is refused."""
    mount = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={ENGINE_TMPFS_SIZE},mode=0700", "glm53-dockerd", str(state)],
        capture_output=True,
        check=False,
    )
    return mount.returncode == 0


@dataclass(frozen=True)
class DataRoot:
    """Where the engine keeps its images and containers, on which storage driver, and what the ready line says of it.

    `lock_fds` are passed on to dockerd, so the lock on a persistent data root lasts as long as the daemon using it,
    even one that outlives a killed session."""

    path: Path
    driver: str
    storage: str
    origin: str
    lock_fds: tuple[int, ...] = ()


def _engine_key(dockerd: str, driver: str) -> str:
    """The name of a persistent data root: the storage driver and a hash of the daemon's version string.

    Why both: another dockerd release may migrate or misread the layout (image and layer metadata, its containerd's
    state) and cannot be trusted with another's data root, and a data root of one storage driver holds nothing another
    can use. One data root per pair keeps an upgraded daemon off the old one (which then simply goes unused)."""
    version = subprocess.run([dockerd, "--version"], capture_output=True, text=True, check=True).stdout.strip()
    return f"{driver}-{hashlib.sha256(version.encode()).hexdigest()[:12]}"


def _try_flock(handle: IO[str]) -> bool:
    """An exclusive flock on `handle`, without waiting: False when another process (a session, its dockerd) holds it."""
    try:
        fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return False
    return True


@contextlib.contextmanager
def _temporary_data_root(state: Path, reason: str) -> Iterator[DataRoot]:
    """A data root in the session's temporary directory, gone with it: overlay2 on its disk, else on a private tmpfs,
    else vfs on disk (see the module's docstring)."""
    on_disk = _overlay_capable_disk(state)
    in_memory = not on_disk and _mount_tmpfs(state)
    storage = "overlay2 on disk" if on_disk else "overlay2 on tmpfs" if in_memory else "vfs on disk"
    try:
        yield DataRoot(
            path=state / "data",
            driver="overlay2" if on_disk or in_memory else "vfs",
            storage=storage,
            origin=f"temporary data root: {reason}",
        )
    finally:
        if in_memory:
            # Lazy: a container mount left by a killed daemon must not keep the tmpfs (and its memory) attached.
            subprocess.run(["umount", "--lazy", str(state)], check=False)


@contextlib.contextmanager
def _data_root(dockerd: str, state: Path) -> Iterator[DataRoot]:
    """The persistent data root, `DOCKER_CACHE/engine-<key>`, when its disk can hold overlay2 and no one else uses it;
    else a temporary one, as every session had before.

    Only overlay2 on disk persists: a tmpfs dies with the session, and a vfs data root would keep a full copy of the
    file tree per layer. The lock file beside the data root makes a second session on this machine (another clone's
    CI run) fall back to a temporary data root instead of starting a second daemon on the same files."""
    DOCKER_CACHE.mkdir(parents=True, exist_ok=True)
    if not _overlay_capable_disk(DOCKER_CACHE):
        with _temporary_data_root(state, f"{DOCKER_CACHE} is on no filesystem overlay2 can use") as root:
            yield root
        return
    path = DOCKER_CACHE / f"engine-{_engine_key(dockerd, 'overlay2')}"
    lock = path.parent / f"{path.name}.lock"
    with lock.open("a") as handle:
        if _try_flock(handle):
            origin = "reused" if (path / "image").is_dir() else "new"
            yield DataRoot(
                path=path,
                driver="overlay2",
                storage="overlay2 on disk",
                origin=f"data root {origin}: {path}",
                lock_fds=(handle.fileno(),),
            )
            return
    with _temporary_data_root(state, f"{lock} is held by another session") as root:
        yield root


def _start_dockerd(dockerd: str, root: DataRoot, state: Path, base_url: str, log_path: Path) -> subprocess.Popen[bytes]:
    """dockerd on `root`, with its exec root, pidfile and socket in `state` (short: the managed containerd's unix
    sockets go under the exec root, and a socket path has a 108-byte limit)."""
    command = [
        dockerd,
        f"--storage-driver={root.driver}",
        "--iptables=false",
        "--ip6tables=false",
        "--bridge=none",
        f"--data-root={root.path}",
        f"--exec-root={state / 'exec'}",
        f"--pidfile={state / 'dockerd.pid'}",
        f"--host={base_url}",
    ]
    with log_path.open("wb") as log:
        return subprocess.Popen(
            command, stdout=log, stderr=subprocess.STDOUT, start_new_session=True, pass_fds=root.lock_fds
        )


def _superseded_tags(images: list[Image]) -> list[str]:
    """Every tag on an image that is not the newest (by creation) of the tag's repository."""
    newest: dict[str, tuple[datetime, str]] = {}
    for image in images:
        created = datetime.fromisoformat(image.attrs["Created"])
        for tag in image.tags:
            repository = tag.rpartition(":")[0]
            if repository not in newest or newest[repository][0] < created:
                newest[repository] = (created, image.id or "")
    return [tag for image in images for tag in image.tags if newest[tag.rpartition(":")[0]][1] != image.id]


def _prune(client: docker.DockerClient) -> None:
    """Remove what the session's builds do not need, so a persistent data root stays the size of one build.

    Stopped containers and unused volumes (a killed session leaves them, and they pin their images); then every tag but
    those of each repository's newest image, and the dangling images that leaves. Why by repository: a new commit's
    build moves the version tag to its image, but the revision tag (`-g<commit>`) keeps the previous image, whose
    layers would pile up commit after commit (5.5 GB each when the lock changes). Removing it takes its layers and the
    legacy builder's intermediate images with it, except those a newer image still stands on, and the newest images
    stay: they are the layer cache the next build hits. Last, BuildKit's build cache beyond its bound."""
    client.containers.prune()
    client.volumes.prune()
    for tag in _superseded_tags(client.images.list()):
        client.images.remove(tag)
    client.images.prune(filters={"dangling": True})
    client.api.prune_builds(keep_storage=ENGINE_BUILD_CACHE_KEEP_BYTES)


@contextlib.contextmanager
def private_engine() -> Iterator[DockerEngine]:
    """Start `dockerd` (overlay2 on disk, else on tmpfs, else vfs; no bridge or iptables) on its own socket, prune its
    data root; stop it by PID."""
    dockerd = require_tool("dockerd", "30-docker-engine.sh")
    state = Path(tempfile.mkdtemp(prefix="glm53-dockerd-"))
    with contextlib.ExitStack() as cleanup:
        cleanup.callback(shutil.rmtree, state, ignore_errors=True)
        root = cleanup.enter_context(_data_root(dockerd, state))
        log_path = state / "dockerd.log"
        base_url = f"unix://{state / 'docker.sock'}"
        process = _start_dockerd(dockerd, root, state, base_url, log_path)
        cleanup.callback(_stop, process)
        started = time.monotonic()
        client = _wait_for_engine(process, base_url, log_path)
        cleanup.callback(client.close)
        ready_s = time.monotonic() - started
        _prune(client)
        layers_gb = client.df()["LayersSize"] / 1e9
        print(
            f"\ndocker engine: ready in {ready_s:.1f}s at {base_url} (pid {process.pid}, {root.storage}, "
            f"{root.origin}, {layers_gb:.1f} GB of image layers after pruning)"
        )
        yield DockerEngine(base_url=base_url, client=client, pid=process.pid, log_path=log_path)


def _stop(process: subprocess.Popen[bytes]) -> None:
    """SIGTERM the daemon by PID (it stops its containers and its managed containerd), SIGKILL after the deadline."""
    if process.poll() is not None:
        return
    process.send_signal(signal.SIGTERM)
    try:
        process.wait(timeout=ENGINE_STOP_DEADLINE_S)
    except subprocess.TimeoutExpired:
        kill_group(process)
        process.wait(timeout=ENGINE_STOP_DEADLINE_S)


def _build_base_tarball() -> None:
    debootstrap = require_tool("debootstrap", "30-docker-engine.sh")
    BASE_TARBALL.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="glm53-debootstrap-") as scratch:
        root = Path(scratch) / "root"
        subprocess.run(
            [debootstrap, "--variant=minbase", f"--include={','.join(BASE_PACKAGES)}", "bookworm", str(root)],
            check=True,
            stdout=subprocess.DEVNULL,
            env={**os.environ, "PATH": tool_path()},
        )
        for relative in BASE_PRUNE:
            target = root / relative
            shutil.rmtree(target, ignore_errors=True)
            target.mkdir(parents=True, exist_ok=True)
        partial = BASE_TARBALL.with_suffix(".partial")
        subprocess.run(["tar", "-C", str(root), "--numeric-owner", "-cf", str(partial), "."], check=True)
        partial.replace(BASE_TARBALL)


@dataclass(frozen=True)
class PlaybookRun:
    """An `ansible-playbook` run read through the `ansible.posix.json` callback (no parsing of the text output)."""

    returncode: int
    stats: dict[str, int]
    failures: tuple[tuple[str, str], ...]  # (task name, message) of each failed task
    task_results: dict[str, list[dict[str, Any]]]

    def describe(self) -> str:
        """Exit code, recap and each failed task's message, for assertion messages."""
        failures = "; ".join(f"{task}: {message}" for task, message in self.failures)
        return f"exit {self.returncode}, stats {self.stats}, failures: {failures or 'none'}"


def _read_json_callback(returncode: int, stdout: str) -> PlaybookRun:
    output: dict[str, Any] = json.loads(stdout[stdout.index("{") :])
    failures: list[tuple[str, str]] = []
    task_results: dict[str, list[dict[str, Any]]] = {}
    for play in output.get("plays", []):
        for task in play.get("tasks", []):
            name = str(task["task"]["name"])
            for result in task.get("hosts", {}).values():
                task_results.setdefault(name, []).append(result)
                if result.get("failed"):
                    # A failed command's own error output (e.g. the image build's) ends the message.
                    stderr = str(result.get("stderr", ""))[-1500:]
                    failures.append((name, str(result.get("msg", "")) + (f"; stderr: {stderr}" if stderr else "")))
    stats: dict[str, int] = output.get("stats", {}).get("localhost", {})
    return PlaybookRun(returncode=returncode, stats=stats, failures=tuple(failures), task_results=task_results)


def _image_layers(engine: DockerEngine, name: str) -> list[str]:
    """The diff IDs of image `name`'s layers (the sha256 of each uncompressed layer tar); empty when it is missing."""
    try:
        return list(engine.client.images.get(name).attrs["RootFS"]["Layers"])
    except ImageNotFound:
        return []


def _tar_digest(path: Path) -> str:
    """The diff ID a `docker import` of the uncompressed tarball `path` gives its one layer."""
    with path.open("rb") as tarball:
        return f"sha256:{hashlib.file_digest(tarball, 'sha256').hexdigest()}"


def import_base_image(engine: DockerEngine) -> str:
    """`glm53/debian-base:bookworm` in the engine, imported from the cached debootstrap tarball (made when missing)
    unless the engine's image already has exactly that tarball as its one layer.

    Why not import every time: an import stamps the image with the time of import, so each one is a new image ID and
    every image built FROM it misses Docker's layer cache. A persistent data root keeps the last import; its layer's
    diff ID, checked against the tarball's digest on every run, proves it is the same file tree."""
    started = time.monotonic()
    if not BASE_TARBALL.exists():
        _build_base_tarball()
    layers = [_tar_digest(BASE_TARBALL)]
    imported = _image_layers(engine, BASE_IMAGE) != layers
    if imported:
        repository, tag = BASE_IMAGE.split(":")
        engine.client.api.import_image(src=str(BASE_TARBALL), repository=repository, tag=tag)
    found = _image_layers(engine, BASE_IMAGE)
    if found != layers:
        pytest.fail(
            f"docker import of {BASE_TARBALL} gave {BASE_IMAGE} the layers {found}, expected {layers}; "
            "delete the tarball and rerun"
        )
    how = "imported" if imported else "already in the engine"
    print(f"\nbase image: {BASE_IMAGE} {how}, ready in {time.monotonic() - started:.1f}s")
    return BASE_IMAGE


def run_playbook(playbook: str, extra_vars: dict[str, Any], env: dict[str, str], *options: str) -> PlaybookRun:
    """Run one of this repository's playbooks with JSON extra vars and read its result as JSON."""
    ansible_playbook = require_tool("ansible-playbook", "31-ansible.sh")
    completed = subprocess.run(
        [ansible_playbook, str(REPO_ROOT / "ansible" / playbook), "-e", json.dumps(extra_vars), *options],
        cwd=REPO_ROOT / "ansible",
        env={
            **env,
            "ANSIBLE_CONFIG": str(REPO_ROOT / "ansible" / "ansible.cfg"),
            "ANSIBLE_STDOUT_CALLBACK": "ansible.posix.json",
        },
        capture_output=True,
        text=True,
        check=False,
    )
    if "{" not in completed.stdout:
        pytest.fail(
            f"ansible-playbook {playbook} printed no JSON result (exit {completed.returncode}): {completed.stderr}"
        )
    return _read_json_callback(completed.returncode, completed.stdout)


def mock_build_vars(base_image: str, report_path: Path) -> dict[str, Any]:
    """The playbook variables CI uses: the offline images (mock, router), the debootstrapped base, no build network."""
    return {
        "glm53_images": ["mock", "router"],
        "glm53_images_wheel_base_image": base_image,
        "glm53_images_build_network": "none",
        "glm53_images_report": str(report_path),
    }


def build_mock_image(engine: DockerEngine, base_image: str, report_path: Path) -> MockImageBuild:
    """Build the mock and router images through `ansible/build-images.yml` as CI documents it; fail with its errors."""
    started = time.monotonic()
    run = run_playbook("build-images.yml", mock_build_vars(base_image, report_path), engine.env())
    assert run.returncode == 0, f"build-images.yml failed: {run.describe()}"
    report: dict[str, Any] = json.loads(report_path.read_text())
    sizes = ", ".join(
        f"{entry['image']} {engine.client.images.get(entry['id']).attrs['Size'] / 1e9:.2f} GB"
        for entry in report["images"]
    )
    print(f"\nmock and router images: built through Ansible in {time.monotonic() - started:.1f}s ({sizes})")
    return MockImageBuild(report_path=report_path, report=report, run=run)


def built_image(build: MockImageBuild, name: str) -> dict[str, Any]:
    """The build report's entry of image `name` (mock or router)."""
    entries = [entry for entry in build.report["images"] if entry["image"] == name]
    assert len(entries) == 1, f"expected one {name} entry in the build report, found {build.report['images']}"
    entry: dict[str, Any] = entries[0]
    return entry
