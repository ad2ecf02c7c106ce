#!/usr/bin/env bash
# Build an LMCache wheel from source against the torch that is already installed, then prove it links.
#
# Why: vLLM 0.33 pins torch 2.14.0, and the published LMCache wheels (compiled against torch 2.13) fail to import
# lmcache.cuda_ops under it with an undefined symbol. So LMCache is compiled in the environment that already holds the
# serving torch, with --no-build-isolation (its pyproject pins torch==2.13.0 for isolated builds) and --no-deps, by
# GCC 12 (torch 2.14's headers need a fully C++20-capable host compiler) for both the C++ side and nvcc's host side.
# The same script runs in docker/vllm-lmcache/Dockerfile's build stage and on a plain Linux host (CI).
#
# Usage: build-lmcache.sh [--source SRC] [--python PY] [--wheel-dir DIR] [--arch-list LIST] [--max-jobs N]
#                         [--nvcc-threads N] [--cuda-home DIR] [--no-verify]
# Every flag has an environment variable of the same meaning (flags win):
#   LMCACHE_SOURCE        what to build (default 0.5.6):
#                           0.5.6            a released sdist, fetched from the package index with pip;
#                           git:<ref>        a branch, tag or commit of LMCACHE_GIT_URL (default upstream GitHub),
#                                            for fixes newer than the last release (e.g. chunk-size negotiation);
#                           /path/to/src     a local source tree or sdist (.tar.gz).
#   PYTHON                the interpreter whose environment holds the target torch (default python3).
#   WHEEL_DIR             where the wheel and lmcache-build.json go (default ./dist).
#   TORCH_CUDA_ARCH_LIST  GPU architectures (default "9.0": Hopper, H200). Blackwell B200: "10.0". LMCache's own
#                         release list is "7.5 8.0 8.6 8.9 9.0 10.0 12.0+PTX" (every arch multiplies nvcc time).
#   MAX_JOBS              parallel compile jobs (default: number of CPUs). Each nvcc job peaks near 3 GiB of RAM.
#   NVCC_THREADS          nvcc --threads per job (default 1); only helps with several architectures.
#   CUDA_HOME             the CUDA 13.0 toolkit (default /usr/local/cuda).
#   HOST_CC / HOST_CXX    host compilers (default gcc-12 / g++-12).
#   LMCACHE_VERIFY=0      skip the verification (same as --no-verify); never do this for an image.
# ccache is used for host compiles when installed (/usr/lib/ccache ahead on PATH; CCACHE_DIR may be a cache mount).
set -euo pipefail

script_dir="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
prog="build-lmcache"

source_spec="${LMCACHE_SOURCE:-0.5.6}"
git_url="${LMCACHE_GIT_URL:-https://github.com/LMCache/LMCache.git}"
python="${PYTHON:-python3}"
wheel_dir="${WHEEL_DIR:-$PWD/dist}"
arch_list="${TORCH_CUDA_ARCH_LIST:-9.0}"
max_jobs="${MAX_JOBS:-$(nproc)}"
nvcc_threads="${NVCC_THREADS:-1}"
cuda_home="${CUDA_HOME:-/usr/local/cuda}"
host_cc="${HOST_CC:-gcc-12}"
host_cxx="${HOST_CXX:-g++-12}"
verify="${LMCACHE_VERIFY:-1}"

fail() {
    echo "$prog: error: $*" >&2
    exit 1
}

usage() {
    sed -n '2,/^set -euo/p' "${BASH_SOURCE[0]}" | sed -e '$d' -e 's/^# \{0,1\}//'
}

while [ $# -gt 0 ]; do
    case "$1" in
        --source) source_spec="$2"; shift 2 ;;
        --python) python="$2"; shift 2 ;;
        --wheel-dir) wheel_dir="$2"; shift 2 ;;
        --arch-list) arch_list="$2"; shift 2 ;;
        --max-jobs) max_jobs="$2"; shift 2 ;;
        --nvcc-threads) nvcc_threads="$2"; shift 2 ;;
        --cuda-home) cuda_home="$2"; shift 2 ;;
        --no-verify) verify=0; shift ;;
        -h | --help) usage; exit 0 ;;
        *) echo "$prog: error: unknown argument '$1'; see --help." >&2; exit 2 ;;
    esac
done

# ---- preflight: every input checked before anything is compiled ------------------------------------------------
command -v "$python" >/dev/null 2>&1 || fail "expected the target Python '$python' but it is not on PATH; pass --python."
for compiler in "$host_cc" "$host_cxx"; do
    command -v "$compiler" >/dev/null 2>&1 \
        || fail "expected host compiler $compiler (GCC 12: torch 2.14 needs C++20) but it is missing; install gcc-12 g++-12."
done
[ -x "$cuda_home/bin/nvcc" ] || fail "expected nvcc at $cuda_home/bin/nvcc but it is missing; set CUDA_HOME to a CUDA 13.0 toolkit."
[[ "$max_jobs" =~ ^[1-9][0-9]*$ ]] || fail "expected MAX_JOBS to be a positive integer but got '$max_jobs'."
[[ "$nvcc_threads" =~ ^[1-9][0-9]*$ ]] || fail "expected NVCC_THREADS to be a positive integer but got '$nvcc_threads'."
[[ "$arch_list" =~ ^[0-9]+\.[0-9]+a?(\+PTX)?([\ \;][0-9]+\.[0-9]+a?(\+PTX)?)*$ ]] \
    || fail "expected TORCH_CUDA_ARCH_LIST like '9.0' or '7.5 8.0 9.0+PTX' but got '$arch_list'."
torch_version="$("$python" -c 'import importlib.metadata as m; print(m.version("torch"))' 2>/dev/null)" \
    || fail "expected torch installed for $python but it is not; install the target torch (e.g. vllm's pin) first."

# ---- toolchain environment ---------------------------------------------------------------------------------------
export TORCH_CUDA_ARCH_LIST="$arch_list" MAX_JOBS="$max_jobs" NVCC_THREADS="$nvcc_threads" CUDA_HOME="$cuda_home"
# torch's cpp_extension passes $CC to nvcc as -ccbin, so nvcc's host side is GCC 12 too; NVCC_CCBIN and CUDAHOSTCXX
# cover nvcc invocations and CMake-based builds that do not go through cpp_extension.
export CC="$host_cc" CXX="$host_cxx" CUDAHOSTCXX="$host_cxx" NVCC_CCBIN="$host_cxx"
# LMCache detects its CUDA build profile by finding nvcc on PATH.
export PATH="$cuda_home/bin:$PATH"
if command -v ccache >/dev/null 2>&1 && [ -d /usr/lib/ccache ]; then
    export PATH="/usr/lib/ccache:$PATH"
fi
# A host CUDA toolkit may lack library headers torch's headers include (cusparse.h, ...); torch's CUDA wheels ship
# them under site-packages/nvidia/cu13. A CUDA devel image has them already, so these are additions, not overrides.
nvidia_root="$("$python" -c 'import importlib.util as u, pathlib as p; s = u.find_spec("nvidia"); print(p.Path(next(iter(s.submodule_search_locations))) / "cu13" if s and s.submodule_search_locations else "")')"
if [ -n "$nvidia_root" ] && [ -d "$nvidia_root/include" ]; then
    export CPATH="${CPATH:+$CPATH:}$nvidia_root/include"
    export LIBRARY_PATH="${LIBRARY_PATH:+$LIBRARY_PATH:}$nvidia_root/lib"
fi

pip=("$python" -m pip --disable-pip-version-check)
"${pip[@]}" install --quiet -r "$script_dir/build-requirements.txt"

work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT

# ---- resolve the source --------------------------------------------------------------------------------------------
case "$source_spec" in
    git:*)
        pip_source="git+$git_url@${source_spec#git:}"
        ;;
    /* | ./* | ../*)
        [ -e "$source_spec" ] || fail "expected LMCache source at $source_spec but it does not exist."
        pip_source="$(cd "$(dirname "$source_spec")" && pwd)/$(basename "$source_spec")"
        ;;
    *)
        [[ "$source_spec" =~ ^[0-9]+(\.[0-9]+)*((a|b|rc)[0-9]+)?$ ]] \
            || fail "expected LMCACHE_SOURCE to be a release (0.5.6), git:<ref> or a path but got '$source_spec'."
        # `pip download --no-binary :all:` would prepare the sdist's metadata in an isolated env that needs
        # torch==2.13.0; without isolation (build deps and the target torch present) it only runs egg_info.
        "${pip[@]}" download --quiet --no-deps --no-build-isolation --no-binary lmcache --dest "$work/sdist" \
            "lmcache==$source_spec"
        pip_source="$(echo "$work"/sdist/lmcache-*.tar.gz)"
        [ -f "$pip_source" ] || fail "expected pip to fetch the lmcache $source_spec sdist but it did not; check the index."
        ;;
esac

# ---- build ---------------------------------------------------------------------------------------------------------
gcc_version="$("$host_cxx" -dumpfullversion)"
cuda_version="$("$cuda_home/bin/nvcc" --version | sed -n 's/.*release [0-9.]*, V\([0-9.]*\).*/\1/p')"
echo "$prog: building $source_spec for torch $torch_version, CUDA $cuda_version, GCC $gcc_version," \
    "arch list '$arch_list', MAX_JOBS=$max_jobs NVCC_THREADS=$nvcc_threads"
started=$SECONDS
# --no-cache-dir: pip's wheel cache is keyed by the source, not by the torch it was compiled against, so a cached
# wheel could carry exactly the ABI mismatch this script exists to prevent (ccache still speeds up recompiles).
"${pip[@]}" wheel --no-cache-dir --no-deps --no-build-isolation --wheel-dir "$work/wheel" "$pip_source"
duration=$((SECONDS - started))
built=("$work"/wheel/lmcache-*.whl)
[ -f "${built[0]}" ] || fail "expected pip to produce an lmcache wheel in $work/wheel but it did not."
mkdir -p "$wheel_dir"
cp "${built[0]}" "$wheel_dir/"
wheel="$wheel_dir/$(basename "${built[0]}")"
echo "$prog: built $wheel in ${duration}s"

# Build facts for the image's build-info.json (docker/vllm-lmcache/build_info.py merges them with vLLM's).
LMCACHE_BUILD_WHEEL="$(basename "$wheel")" LMCACHE_BUILD_SOURCE="$source_spec" LMCACHE_BUILD_TORCH="$torch_version" \
    LMCACHE_BUILD_CUDA="$cuda_version" LMCACHE_BUILD_GCC="$gcc_version" LMCACHE_BUILD_SECONDS="$duration" \
    "$python" - "$wheel_dir/lmcache-build.json" <<'PY'
import json, os, sys
env = os.environ
wheel = env["LMCACHE_BUILD_WHEEL"]
facts = {
    "lmcache_version": wheel.split("-")[1],
    "lmcache_source": env["LMCACHE_BUILD_SOURCE"],
    "lmcache_wheel": wheel,
    "torch_built_against": env["LMCACHE_BUILD_TORCH"],
    "cuda": env["LMCACHE_BUILD_CUDA"],
    "gcc": env["LMCACHE_BUILD_GCC"],
    "torch_cuda_arch_list": env["TORCH_CUDA_ARCH_LIST"],
    "max_jobs": int(env["MAX_JOBS"]),
    "nvcc_threads": int(env["NVCC_THREADS"]),
    "build_seconds": int(env["LMCACHE_BUILD_SECONDS"]),
}
with open(sys.argv[1], "w", encoding="utf-8") as out:
    json.dump(facts, out, indent=2, sort_keys=True)
    out.write("\n")
PY

# ---- verify --------------------------------------------------------------------------------------------------------
if [ "$verify" = "1" ]; then
    "$python" "$script_dir/verify_lmcache.py" --wheel "$wheel"
fi
