"""The LMCache wheel compiled from source for the CPU host's build proof, cached outside the clone by its inputs.

Why: the source build (docker/vllm-lmcache/build-lmcache.sh on the 0.5.6 sdist, TORCH_CUDA_ARCH_LIST=9.0, MAX_JOBS=2)
takes 17-24 minutes on CI's two cores, the largest item of a CI run, and its result depends only on its inputs. So it
is built once per set of inputs and kept under `$GLM53_CACHE_DIR` (default `~/.cache/glm53`), keyed by a hash of
everything that goes into it: the sdist's bytes, the build and verification scripts, the pinned build requirements,
the torch of the build venv (version and CUDA), GCC 12's and nvcc's versions, the arch list and the Python. A changed
input is a new key, hence a new build. What is kept is the wheel, the build's record (lmcache-build.json) and what the
build printed; the wheel's SHA-256 is checked whenever the entry is read, and tests/images/test_lmcache_build.py
verifies the wheel against torch 2.14 on every run (nm and import), cached or not.

    lmcache_wheel.py --start       start the build in the background unless the entry exists or a build runs
    lmcache_wheel.py --wait SECS   print the entry as JSON, after waiting for a running build or building here

`scripts/test.sh` calls `--start` before the other installs when it runs the whole suite, so on a cold machine the
compile overlaps the downloads; the test calls `--wait`. Standard library only: it runs before any venv exists.
"""

from __future__ import annotations

import argparse
import contextlib
import fcntl
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

PROG = "lmcache-wheel"
REPO_ROOT = Path(__file__).resolve().parents[1]
IMAGE_DIR = REPO_ROOT / "docker" / "vllm-lmcache"
BUILD_SCRIPT = IMAGE_DIR / "build-lmcache.sh"
# Everything of this repository that the wheel depends on: what builds it and what proves it.
SCRIPT_INPUTS = (BUILD_SCRIPT, IMAGE_DIR / "verify_lmcache.py", IMAGE_DIR / "build-requirements.txt")
BUILD_PYTHON = REPO_ROOT / ".tools" / "lmcache-build-venv" / "bin" / "python"
SDIST = REPO_ROOT / ".tools" / "lmcache-dist" / "lmcache-0.5.6.tar.gz"
SETUP_SCRIPT = "scripts/setup.d/50-lmcache-build.sh"
ARCH_LIST = "9.0"
# Two jobs on CI's two cores; each nvcc job peaks near 3 GiB. Not part of the key: it changes speed, not the wheel.
MAX_JOBS = "2"
ENTRY = "entry.json"


class WheelCacheError(Exception):
    """A failure; its message is the one line printed."""


@dataclass(frozen=True)
class Inputs:
    """What the wheel is built from, by name; `key` hashes all of it."""

    facts: dict[str, str]

    @property
    def key(self) -> str:
        return hashlib.sha256(json.dumps(self.facts, sort_keys=True).encode()).hexdigest()[:24]


def sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as stream:
        for block in iter(lambda: stream.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def _output(argv: list[str]) -> str:
    try:
        return subprocess.run(argv, capture_output=True, text=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError) as error:
        raise WheelCacheError(
            f"expected `{' '.join(argv)}` to answer but it failed ({error}); run `bash {SETUP_SCRIPT}`"
        ) from error


def read_inputs(python: Path, sdist: Path, cuda_home: Path) -> Inputs:
    """The build's inputs as they are on this machine now."""
    if not python.exists() or not sdist.exists():
        raise WheelCacheError(
            f"expected the build venv at {python} and the sdist at {sdist}; run `bash {SETUP_SCRIPT}`"
        )
    torch = _output([str(python), "-c", "import torch, sys; print(torch.__version__, torch.version.cuda, sys.version)"])
    facts = {
        "sdist": sha256(sdist),
        **{path.name: sha256(path) for path in SCRIPT_INPUTS},
        "torch and python": torch,
        "gcc": _output(["g++-12", "-dumpfullversion"]),
        "nvcc": _output([str(cuda_home / "bin" / "nvcc"), "--version"]).splitlines()[-1],
        "arch_list": ARCH_LIST,
    }
    return Inputs(facts)


def cache_root() -> Path:
    default = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "glm53"
    return Path(os.environ.get("GLM53_CACHE_DIR") or default) / "lmcache-wheel"


def read_entry(directory: Path) -> dict[str, object] | None:
    """The finished entry in `directory`, or None when there is none or its wheel is not the one it recorded."""
    try:
        entry: dict[str, object] = json.loads((directory / ENTRY).read_text(encoding="utf-8"))
        wheel = directory / str(entry["wheel"])
        if sha256(wheel) == entry["wheel_sha256"]:
            return {**entry, "wheel": str(wheel), "directory": str(directory)}
    except (OSError, ValueError, KeyError):
        pass
    return None


@contextlib.contextmanager
def build_lock(root: Path, key: str, *, wait: bool) -> Iterator[bool]:
    """The key's build lock (flock, released when its holder dies); yields whether it is held."""
    root.mkdir(parents=True, exist_ok=True)
    with (root / f"{key}.lock").open("a") as lock:
        try:
            fcntl.flock(lock, fcntl.LOCK_EX if wait else fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            yield False
            return
        yield True


def build(inputs: Inputs, root: Path, python: Path, sdist: Path, cuda_home: Path, failed: Path) -> dict[str, object]:
    """Compile the wheel into a scratch directory next to the entry, then move the finished entry into place; a failed
    build's directory becomes `failed`."""
    directory = root / inputs.key
    scratch = Path(tempfile.mkdtemp(prefix=f"{inputs.key}.", suffix=".building", dir=root))
    argv = [
        "bash", str(BUILD_SCRIPT), "--source", str(sdist), "--python", str(python), "--wheel-dir", str(scratch),
        "--arch-list", ARCH_LIST, "--max-jobs", MAX_JOBS, "--nvcc-threads", "1", "--cuda-home", str(cuda_home),
    ]  # fmt: skip
    with (scratch / "build.out").open("w") as out, (scratch / "build.err").open("w") as err:
        done = subprocess.run(argv, stdout=out, stderr=err, stdin=subprocess.DEVNULL, check=False)
    if done.returncode != 0:
        shutil.rmtree(failed, ignore_errors=True)
        scratch.rename(failed)
        tail = (failed / "build.err").read_text(errors="replace").strip().splitlines()[-1:] or ["(no output)"]
        raise WheelCacheError(f"the LMCache build failed with exit {done.returncode}: {tail[0]} (log: {failed})")
    wheels = sorted(scratch.glob("lmcache-*.whl"))
    if len(wheels) != 1:
        raise WheelCacheError(f"expected one lmcache wheel in {scratch} after the build but found {len(wheels)}")
    entry = {"wheel": wheels[0].name, "wheel_sha256": sha256(wheels[0]), "inputs": inputs.facts}
    (scratch / ENTRY).write_text(json.dumps(entry, indent=2, sort_keys=True) + "\n", encoding="utf-8")
    shutil.rmtree(directory, ignore_errors=True)
    scratch.rename(directory)
    found = read_entry(directory)
    assert found is not None
    return {**found, "built_here": True}


def report_failure(root: Path, key: str) -> None:
    """Raise the background build's failure once: set aside, the next run builds again instead of repeating it."""
    failed = root / f"{key}.failed"
    if failed.exists():
        reported = root / f"{key}.failed-reported"
        shutil.rmtree(reported, ignore_errors=True)
        failed.rename(reported)
        tail = (reported / "build.err").read_text(errors="replace").strip().splitlines()[-1:] or ["(no output)"]
        raise WheelCacheError(f"the background LMCache build failed: {tail[0]} (log: {reported})")


def start(inputs: Inputs, root: Path) -> str:
    """Start a detached `--build-now` unless the entry exists or a build holds the lock; say which."""
    if read_entry(root / inputs.key) is not None:
        return "cached"
    shutil.rmtree(root / f"{inputs.key}.failed", ignore_errors=True)
    with build_lock(root, inputs.key, wait=False) as free:
        if not free:
            return "already building"
    log = root / f"{inputs.key}.background.log"
    with log.open("w") as out:
        subprocess.Popen(
            [sys.executable, __file__, "--build-now"],
            stdout=out,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,  # it outlives this script; the test waits for it
        )
    return f"building in the background (log: {log})"


def wait(inputs: Inputs, root: Path, python: Path, sdist: Path, cuda_home: Path, seconds: float) -> dict[str, object]:
    """The entry: cached, or after the running build ends (a failed one is reported), or built here."""
    directory = root / inputs.key
    deadline = time.monotonic() + seconds
    while True:
        found = read_entry(directory)
        if found is not None:
            return {**found, "built_here": False}
        with build_lock(root, inputs.key, wait=False) as free:
            if free:
                report_failure(root, inputs.key)
                # No build ran, or none for these inputs: build here (a failure is reported now, not again later).
                return build(inputs, root, python, sdist, cuda_home, root / f"{inputs.key}.failed-reported")
        if time.monotonic() > deadline:
            raise WheelCacheError(f"expected the running LMCache build to finish within {seconds:.0f} s but it did not")
        time.sleep(5)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog=PROG, description=__doc__.splitlines()[0])
    action = parser.add_mutually_exclusive_group(required=True)
    action.add_argument("--start", action="store_true", help="start the build in the background if needed")
    action.add_argument("--wait", type=float, metavar="SECONDS", help="print the entry, building or waiting first")
    action.add_argument("--build-now", action="store_true", help=argparse.SUPPRESS)
    action.add_argument("--key", action="store_true", help="print the inputs and their key")
    args = parser.parse_args(argv)
    python, sdist = BUILD_PYTHON, SDIST
    cuda_home = Path(os.environ.get("CUDA_HOME", "/usr/local/cuda"))
    root = cache_root()
    try:
        inputs = read_inputs(python, sdist, cuda_home)
        if args.key:
            print(json.dumps({"key": inputs.key, "inputs": inputs.facts}, indent=2, sort_keys=True))
        elif args.start:
            print(f"{PROG}: {start(inputs, root)}")
        elif args.build_now:
            with build_lock(root, inputs.key, wait=True):
                if read_entry(root / inputs.key) is None:
                    build(inputs, root, python, sdist, cuda_home, root / f"{inputs.key}.failed")
        else:
            print(json.dumps(wait(inputs, root, python, sdist, cuda_home, args.wait), indent=2, sort_keys=True))
    except WheelCacheError as error:
        print(f"{PROG}: error: {error}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
