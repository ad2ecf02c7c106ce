"""Prove that LMCache's native extensions link against the torch installed next to them.

Why: the published LMCache wheels are compiled against an older torch; under vLLM 0.33's torch 2.14 their CUDA
extension fails on import with an undefined symbol, which surfaces only when a GPU pod starts. This check runs without
a GPU (build host, image build stage, runtime stage) and fails the build instead:

1. every undefined C++ symbol in a torch namespace (c10, at, torch, caffe2) that an extension ``.so`` needs must be
   exported by one of the installed torch libraries (``libc10*.so``, ``libtorch*.so``), checked with ``nm -D``;
2. every extension module imports under that torch (``lmcache.cuda_ops``, ``lmcache_native``, ``lmcache_fs``,
   ``lmcache_redis``) — loaded straight from its file, so the check needs none of LMCache's Python dependencies;
   ``--import-package`` additionally imports them through the ``lmcache`` package, as vLLM does.

The LMCache under test is the installed one, a directory holding the ``lmcache`` package (``--path``, e.g. a
``pip install --target`` dir) or a wheel (``--wheel``, unpacked to a temporary directory). Exit 0 when good, 1 with a
one-line message naming the first missing symbol (mangled and demangled) and the torch version otherwise.
Standard library only: it runs in the build stage before anything but torch and the build deps is installed.
"""

from __future__ import annotations

import argparse
import importlib
import importlib.machinery
import importlib.metadata
import importlib.util
import re
import subprocess
import sys
import tempfile
import zipfile
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

PROG = "verify-lmcache"
# Extension modules of LMCache 0.5.6; the CUDA one is what the broken wheel fails on. All must be present.
REQUIRED_EXTENSIONS = ("cuda_ops", "lmcache_native", "lmcache_fs", "lmcache_redis")
# Itanium-mangled names whose outermost scope is a torch namespace: functions/data (_ZN, const members _ZNK) and
# the typeinfo / vtable / typeinfo-name objects (_ZTI, _ZTV, _ZTS) of torch classes.
TORCH_SYMBOL = re.compile(r"^_Z(?:T[ISV])?NK?(?:3c10|2at|5torch|6caffe2)")
TORCH_LIBRARY_GLOBS = ("libc10*.so", "libtorch*.so")


class VerifyError(Exception):
    """A verification failure; its message is the one line printed."""


@dataclass(frozen=True)
class MissingSymbol:
    """A torch symbol an extension needs and the installed torch does not export."""

    extension: Path
    symbol: str
    missing_count: int


def torch_symbols(nm_output: str) -> set[str]:
    """Names of the defined dynamic symbols in ``nm -D --defined-only`` output, without version suffixes."""
    names: set[str] = set()
    for line in nm_output.splitlines():
        fields = line.split()
        if len(fields) >= 3:
            names.add(fields[2].split("@", 1)[0])
    return names


def undefined_torch_symbols(nm_output: str) -> list[str]:
    """Torch-namespace names in ``nm -D --undefined-only`` output, in nm's (sorted) order."""
    names = []
    for line in nm_output.splitlines():
        fields = line.split()
        if fields and fields[0] == "U" and len(fields) >= 2:
            name = fields[1].split("@", 1)[0]
            if TORCH_SYMBOL.match(name):
                names.append(name)
    return names


def first_missing(extension: Path, needed: Iterable[str], exported: set[str]) -> MissingSymbol | None:
    """The first needed symbol that ``exported`` lacks, with how many are missing in total."""
    missing = [name for name in needed if name not in exported]
    if not missing:
        return None
    return MissingSymbol(extension=extension, symbol=missing[0], missing_count=len(missing))


def run_tool(argv: Sequence[str]) -> str:
    """Run a binutils tool and return its stdout; a missing tool or a failure is a VerifyError."""
    try:
        done = subprocess.run(list(argv), capture_output=True, text=True, check=False)
    except FileNotFoundError as exc:
        raise VerifyError(f"expected `{argv[0]}` (binutils) on PATH but it is missing; install binutils.") from exc
    if done.returncode != 0:
        detail = done.stderr.strip().splitlines()[-1] if done.stderr.strip() else f"exit {done.returncode}"
        raise VerifyError(f"expected `{' '.join(argv)}` to succeed but it failed: {detail}.")
    return done.stdout


def demangle(symbol: str) -> str:
    """The C++ spelling of ``symbol`` (via c++filt), or the symbol itself when c++filt is unavailable."""
    try:
        return run_tool(["c++filt", symbol]).strip()
    except VerifyError:
        return symbol


def torch_location() -> tuple[Path, str]:
    """The installed torch's ``lib`` directory and version, found without importing torch."""
    spec = importlib.util.find_spec("torch")
    if spec is None or not spec.submodule_search_locations:
        raise VerifyError(
            f"expected torch installed for {sys.executable} but it is not; install the target torch first."
        )
    lib_dir = Path(next(iter(spec.submodule_search_locations))) / "lib"
    return lib_dir, importlib.metadata.version("torch")


def exported_torch_symbols(lib_dir: Path) -> set[str]:
    """Union of the dynamic symbols the torch shared libraries define."""
    libraries = sorted({path for pattern in TORCH_LIBRARY_GLOBS for path in lib_dir.glob(pattern)})
    if not any(path.name == "libc10_cuda.so" for path in libraries):
        raise VerifyError(f"expected a CUDA build of torch (libc10_cuda.so) in {lib_dir} but found none; install it.")
    exported: set[str] = set()
    for library in libraries:
        exported |= torch_symbols(run_tool(["nm", "-D", "--defined-only", str(library)]))
    return exported


def extension_files(package_dir: Path) -> dict[str, Path]:
    """The required extension modules' files in the ``lmcache`` package directory, by module name."""
    suffixes = tuple(importlib.machinery.EXTENSION_SUFFIXES)
    found: dict[str, Path] = {}
    for path in sorted(package_dir.iterdir()):
        for suffix in suffixes:
            if path.name.endswith(suffix):
                found[path.name[: -len(suffix)]] = path
                break
    absent = [name for name in REQUIRED_EXTENSIONS if name not in found]
    if absent:
        raise VerifyError(
            f"expected LMCache extension modules {', '.join(REQUIRED_EXTENSIONS)} in {package_dir} but "
            f"{', '.join(absent)} is missing; build LMCache with its native extensions (CUDA_HOME set)."
        )
    return {name: found[name] for name in REQUIRED_EXTENSIONS}


def check_symbols(extensions: dict[str, Path], torch_lib: Path, torch_version: str) -> None:
    """Fail on the first torch symbol some extension needs that the installed torch does not export."""
    exported = exported_torch_symbols(torch_lib)
    for path in extensions.values():
        needed = undefined_torch_symbols(run_tool(["nm", "-D", "--undefined-only", str(path)]))
        missing = first_missing(path, needed, exported)
        if missing is not None:
            raise VerifyError(
                f"{missing.extension.name} needs undefined symbol {missing.symbol} ({demangle(missing.symbol)}) "
                f"that torch {torch_version} does not export ({missing.missing_count} torch symbols missing); "
                "rebuild LMCache from source against this torch (docker/vllm-lmcache/build-lmcache.sh)."
            )


def load_extension(name: str, path: Path) -> None:
    """Import one extension module from its file, bypassing ``lmcache/__init__.py`` and its dependencies."""
    spec = importlib.util.spec_from_file_location(f"lmcache.{name}", path)
    if spec is None or spec.loader is None:
        raise VerifyError(f"expected an importable extension module at {path} but Python cannot load it.")
    module = importlib.util.module_from_spec(spec)
    # Registered before it runs: cuda_ops' init imports lmcache.lmcache_native (lmcache 0.5.6
    # csrc/cuda/pybind.cpp:23), i.e. the package __init__, which on a GPU host imports cuda_ops again; finding it in
    # sys.modules there keeps pybind11 from registering its types twice ("StagingCopy is already registered").
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)


def check_imports(extensions: dict[str, Path], torch_version: str, import_package: bool) -> None:
    """Import every extension under the installed torch (which must be imported first, as LMCache does)."""
    importlib.import_module("torch")
    for name, path in extensions.items():
        try:
            if import_package:
                importlib.import_module(f"lmcache.{name}")
            else:
                load_extension(name, path)
        except ImportError as exc:
            first_line = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
            raise VerifyError(f"import of lmcache.{name} failed under torch {torch_version}: {first_line}") from exc


def package_dir_under(root: Path) -> Path:
    """The ``lmcache`` package directory inside ``root``."""
    package = root / "lmcache"
    if not (package / "__init__.py").is_file():
        raise VerifyError(f"expected an lmcache package at {package} but found none; pass the install or wheel path.")
    return package


def installed_package_dir() -> Path:
    """The ``lmcache`` package directory the interpreter would import, found without importing it."""
    spec = importlib.util.find_spec("lmcache")
    if spec is None or not spec.submodule_search_locations:
        raise VerifyError(f"expected lmcache installed for {sys.executable} but it is not; pass --wheel or --path.")
    return Path(next(iter(spec.submodule_search_locations)))


def verify(package_dir: Path, import_package: bool) -> str:
    """Run both checks for the package in ``package_dir``; return the success line."""
    torch_lib, torch_version = torch_location()
    extensions = extension_files(package_dir)
    check_symbols(extensions, torch_lib, torch_version)
    sys.path.insert(0, str(package_dir.parent))
    check_imports(extensions, torch_version, import_package)
    return f"{PROG}: ok: {', '.join(extensions)} in {package_dir} link and import under torch {torch_version}"


def parse_args(argv: Sequence[str]) -> argparse.Namespace:
    """Command-line interface: which LMCache to verify and how deep to import."""
    parser = argparse.ArgumentParser(prog=PROG, description=__doc__.splitlines()[0] if __doc__ else None)
    source = parser.add_mutually_exclusive_group()
    source.add_argument("--wheel", type=Path, help="an LMCache wheel to unpack and verify")
    source.add_argument("--path", type=Path, help="a directory holding the lmcache package (e.g. pip --target dir)")
    parser.add_argument(
        "--import-package",
        action="store_true",
        help="import through the lmcache package (needs LMCache's runtime dependencies installed)",
    )
    return parser.parse_args(list(argv))


def main(argv: Sequence[str]) -> int:
    """Verify and print one line; exit 0 when good, 1 on a verification failure."""
    args = parse_args(argv)
    try:
        if args.wheel is not None:
            with tempfile.TemporaryDirectory(prefix="verify-lmcache-") as unpacked:
                try:
                    with zipfile.ZipFile(args.wheel) as wheel:
                        wheel.extractall(unpacked)
                except (OSError, zipfile.BadZipFile) as exc:
                    raise VerifyError(
                        f"expected a readable wheel at {args.wheel} but could not open it: {exc}."
                    ) from exc
                print(verify(package_dir_under(Path(unpacked)), args.import_package))
        else:
            package = package_dir_under(args.path) if args.path is not None else installed_package_dir()
            print(verify(package, args.import_package))
    except VerifyError as exc:
        print(f"{PROG}: error: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
