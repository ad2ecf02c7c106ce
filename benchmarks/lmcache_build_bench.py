"""Benchmark: how long the LMCache source build takes, and what the Hopper-only arch list saves over LMCache's list.

Why: the serving image compiles LMCache from source (the published wheel does not load under vLLM 0.33's torch), and
CUDA device code is compiled once per GPU architecture. docker/vllm-lmcache/Dockerfile defaults TORCH_CUDA_ARCH_LIST
to "9.0" (H200) instead of LMCache's release list "7.5 8.0 8.6 8.9 9.0 10.0 12.0+PTX".

What is measured (on this machine, printed with the numbers):
1. the full build: docker/vllm-lmcache/build-lmcache.sh on the 0.5.6 sdist with TORCH_CUDA_ARCH_LIST=9.0 and
   MAX_JOBS=2 (wall seconds, including its verification) — or, with --build-record, the duration a previous run of the
   script recorded in its lmcache-build.json;
2. nvcc alone on a named subset of LMCache's CUDA translation units, once per arch list, one file at a time and
   ``--threads 1``, with the flags torch's cpp_extension gives the real build (include dirs, -std=c++20, -ccbin
   gcc-12, the CUDA defines, one -gencode per arch): wall and CPU seconds and their ratio. The 7-arch full build is
   not run (hours on 2 cores); an estimate scales the measured full build by the measured nvcc ratio and says so.

Needs scripts/setup.d/50-lmcache-build.sh (the build venv with torch and the sdist). Run:
``.venv/bin/python benchmarks/lmcache_build_bench.py [--build-record dist/lmcache-build.json] [--sources all]``.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]
BUILD_SCRIPT = REPO_ROOT / "docker" / "vllm-lmcache" / "build-lmcache.sh"
BUILD_PYTHON = REPO_ROOT / ".tools" / "lmcache-build-venv" / "bin" / "python"
SDIST = REPO_ROOT / ".tools" / "lmcache-dist" / "lmcache-0.5.6.tar.gz"
HOPPER = "9.0"
LMCACHE_DEFAULT = "7.5 8.0 8.6 8.9 9.0 10.0 12.0+PTX"
# The KV-cache copy kernels the multiprocess connector runs; the two largest .cu files of the extension.
DEFAULT_SUBSET = ("mem_kernels.cu", "mp_mem_kernels.cu")
# The nvcc flags torch 2.14's cpp_extension adds for LMCache's CUDAExtension (read from the build's build.ninja).
CUDA_FLAGS = (
    "-D__CUDA_NO_HALF_OPERATORS__",
    "-D__CUDA_NO_HALF_CONVERSIONS__",
    "-D__CUDA_NO_BFLOAT16_CONVERSIONS__",
    "-D__CUDA_NO_HALF2_OPERATORS__",
    "--expt-relaxed-constexpr",
    "--compiler-options",
    "-fPIC",
    "-D_GLIBCXX_USE_CXX11_ABI=1",
    "-DTORCH_API_INCLUDE_EXTENSION_H",
    "-DTORCH_EXTENSION_NAME=cuda_ops",
    "-std=c++20",
)
# Printed by the target python: torch's include dirs, the Python headers, the CUDA wheels' header dir (if any).
INCLUDE_QUERY = """
import importlib.util, json, pathlib, sysconfig
from torch.utils.cpp_extension import include_paths
spec = importlib.util.find_spec("nvidia")
nvidia = pathlib.Path(next(iter(spec.submodule_search_locations))) / "cu13" / "include" if spec else None
print(json.dumps({"includes": include_paths(device_type="cuda") + [sysconfig.get_paths()["include"]],
                  "cpath": str(nvidia) if nvidia and nvidia.is_dir() else ""}))
"""


@dataclass(frozen=True)
class Timing:
    """nvcc's cost for one arch list over the measured sources."""

    arch_list: str
    sources: tuple[str, ...]
    wall_s: float
    cpu_s: float


def gencode_flags(arch_list: str) -> list[str]:
    """``-gencode`` flags for a TORCH_CUDA_ARCH_LIST, as torch emits them: SASS per arch, plus PTX for ``+PTX``."""
    flags: list[str] = []
    for entry in arch_list.replace(";", " ").split():
        arch, _, ptx = entry.partition("+")
        number = arch.replace(".", "")
        flags.append(f"-gencode=arch=compute_{number},code=sm_{number}")
        if ptx == "PTX":
            flags.append(f"-gencode=arch=compute_{number},code=compute_{number}")
    return flags


def speedup(hopper: Timing, default: Timing) -> float:
    """How many times faster the Hopper-only list compiles than LMCache's default list (wall time)."""
    return default.wall_s / hopper.wall_s


def timed(argv: Sequence[str], env: dict[str, str]) -> tuple[float, float]:
    """Run a command to completion; its wall seconds and its children's CPU seconds. A failure aborts the benchmark."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    started = time.monotonic()
    done = subprocess.run(list(argv), env=env, capture_output=True, text=True, check=False)
    wall = time.monotonic() - started
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if done.returncode != 0:
        tail = done.stderr.strip().splitlines()[-3:] or done.stdout.strip().splitlines()[-3:]
        sys.exit(f"lmcache_build_bench: error: `{argv[0]}` failed (exit {done.returncode}): {' | '.join(tail)}")
    return wall, (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


def compile_sources(csrc: Path, sources: Sequence[str], arch_list: str, includes: Sequence[str], cpath: str) -> Timing:
    """Compile each source with nvcc for ``arch_list`` (one at a time) and add up the cost."""
    cuda_home = Path(os.environ.get("CUDA_HOME", "/usr/local/cuda"))
    env = dict(os.environ)
    if cpath:
        env["CPATH"] = f"{env['CPATH']}:{cpath}" if env.get("CPATH") else cpath
    wall = cpu = 0.0
    with tempfile.TemporaryDirectory(prefix="lmcache-bench-obj-") as out:
        for source in sources:
            argv = [str(cuda_home / "bin" / "nvcc"), "-c", str(csrc / "cuda" / source), "-o", f"{out}/{source}.o"]
            argv += [f"-I{csrc}", *(f"-I{path}" for path in includes), f"-I{cuda_home / 'include'}"]
            argv += [*CUDA_FLAGS, *gencode_flags(arch_list), "-ccbin", "gcc-12", "--threads", "1"]
            source_wall, source_cpu = timed(argv, env)
            wall += source_wall
            cpu += source_cpu
    return Timing(arch_list=arch_list, sources=tuple(sources), wall_s=wall, cpu_s=cpu)


def full_build_seconds(python: Path, sdist: Path) -> float:
    """Wall seconds of the real build script (Hopper list, MAX_JOBS=2), verification included."""
    with tempfile.TemporaryDirectory(prefix="lmcache-bench-wheel-") as wheel_dir:
        argv = ["bash", str(BUILD_SCRIPT), "--source", str(sdist), "--python", str(python), "--wheel-dir", wheel_dir]
        argv += ["--arch-list", HOPPER, "--max-jobs", "2", "--nvcc-threads", "1"]
        wall, _ = timed(argv, dict(os.environ))
    return wall


def parse_args(argv: Sequence[str]) -> argparse.Namespace:
    """Command-line interface."""
    parser = argparse.ArgumentParser(prog="lmcache_build_bench", description=__doc__.splitlines()[0] if __doc__ else "")
    parser.add_argument("--python", type=Path, default=BUILD_PYTHON, help="interpreter with the target torch")
    parser.add_argument("--sdist", type=Path, default=SDIST, help="LMCache sdist to measure")
    parser.add_argument(
        "--sources", default=",".join(DEFAULT_SUBSET), help="comma-separated csrc/cuda/*.cu names, or 'all'"
    )
    parser.add_argument("--build-record", type=Path, help="take the full-build duration from this lmcache-build.json")
    parser.add_argument("--json", type=Path, help="also write the results here")
    return parser.parse_args(list(argv))


def main(argv: Sequence[str]) -> int:
    """Measure and print; exit 1 with one line when the toolchain is missing."""
    args = parse_args(argv)
    if not args.python.exists() or not args.sdist.exists() or shutil.which("gcc-12") is None:
        print(
            "lmcache_build_bench: error: expected the LMCache build toolchain (.tools/lmcache-build-venv, the sdist, "
            "gcc-12) but it is missing; run `bash scripts/setup.d/50-lmcache-build.sh`.",
            file=sys.stderr,
        )
        return 1
    if args.build_record is not None:
        build_s = float(json.loads(args.build_record.read_text(encoding="utf-8"))["build_seconds"])
        build_how = f"recorded by build-lmcache.sh in {args.build_record}"
    else:
        build_s = full_build_seconds(args.python, args.sdist)
        build_how = "measured now"
    query = subprocess.run([str(args.python), "-c", INCLUDE_QUERY], capture_output=True, text=True, check=True)
    paths = json.loads(query.stdout)
    with tempfile.TemporaryDirectory(prefix="lmcache-bench-src-") as unpacked:
        with tarfile.open(args.sdist) as sdist:
            sdist.extractall(unpacked, filter="data")
        csrc = next(Path(unpacked).glob("lmcache-*/csrc"))
        sources = (
            sorted(p.name for p in (csrc / "cuda").glob("*.cu")) if args.sources == "all" else args.sources.split(",")
        )
        hopper = compile_sources(csrc, sources, HOPPER, paths["includes"], paths["cpath"])
        default = compile_sources(csrc, sources, LMCACHE_DEFAULT, paths["includes"], paths["cpath"])
    ratio = speedup(hopper, default)
    print(
        f"full LMCache 0.5.6 build, TORCH_CUDA_ARCH_LIST={HOPPER}, MAX_JOBS=2, {os.cpu_count()} CPUs: "
        f"{build_s:.0f} s ({build_how})"
    )
    print(f"nvcc only, {len(sources)} of LMCache's CUDA translation units ({', '.join(sources)}), one at a time:")
    for timing in (hopper, default):
        print(f"  TORCH_CUDA_ARCH_LIST={timing.arch_list!r}: {timing.wall_s:.1f} s wall, {timing.cpu_s:.1f} s CPU")
    print(
        f"speed-up of the Hopper-only list over LMCache's default list: {ratio:.2f}x wall, "
        f"{default.cpu_s / hopper.cpu_s:.2f}x CPU (nvcc on the subset above)"
    )
    print(
        f"estimate, not measured: a full build with the default list ~ {build_s * ratio:.0f} s "
        f"(full Hopper build x nvcc ratio; host-only C++ files do not scale, so this is an upper bound)"
    )
    if args.json is not None:
        args.json.write_text(
            json.dumps(
                {
                    "full_build_hopper_s": build_s,
                    "full_build_source": build_how,
                    "nvcc_sources": sources,
                    "nvcc_hopper": {"arch_list": HOPPER, "wall_s": hopper.wall_s, "cpu_s": hopper.cpu_s},
                    "nvcc_default": {"arch_list": LMCACHE_DEFAULT, "wall_s": default.wall_s, "cpu_s": default.cpu_s},
                    "speedup_wall": ratio,
                },
                indent=2,
            )
            + "\n",
            encoding="utf-8",
        )
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
