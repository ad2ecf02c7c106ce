#!/usr/bin/env bash
# Toolchain for compiling LMCache from source on a CPU-only host (issue 5.2), used by
# tests/images/test_lmcache_build.py and benchmarks/lmcache_build_bench.py:
#   - GCC 12 (torch 2.14's headers need a fully C++20-capable host compiler; Debian bookworm's default is 12),
#   - nvcc from the CUDA 13.0 toolkit (torch 2.14's default CUDA build is cu130; not installable with apt here),
#   - .tools/lmcache-build-venv: Python 3.11 + the target torch + LMCache's pinned build dependencies,
#   - .tools/lmcache-dist: the LMCache sdist (what we build) and the published wheel (what the test shows broken).
# Both live in the cache of lib/cache.sh (the venv keyed by its pins), which .tools/ links to. Idempotent: every step
# checks first. scripts/lmcache_wheel.py builds (and caches) the wheel itself.
set -euo pipefail

# shellcheck source=scripts/setup.d/lib/cache.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib/cache.sh"
tools="$repo_root/.tools"
dist="$(glm53_cache_dir)/lmcache-dist"
cuda_home="${CUDA_HOME:-/usr/local/cuda}"
build_requirements="$repo_root/docker/vllm-lmcache/build-requirements.txt"

# torch 2.14.1, not vLLM 0.33's 2.14.0: the CUDA 13.0 wheel of 2.14.1 is what this CI's package mirror carries, and
# both are the same ABI generation that breaks the published LMCache wheel (compiled against 2.13).
torch_version="2.14.1"
lmcache_version="0.5.6"
gcc_apt_version="12.2.0-14+deb12u1"
cuda_major_minor="13.0"

fail() {
    echo "50-lmcache-build: $*" >&2
    exit 1
}

ensure_gcc12() {
    if command -v gcc-12 >/dev/null 2>&1 && command -v g++-12 >/dev/null 2>&1; then
        return
    fi
    [ "$(id -u)" -eq 0 ] || fail "gcc-12/g++-12 are missing and installing them needs root; run: apt-get install -y gcc-12 g++-12"
    apt-get update -qq
    # Pinned to bookworm's build; fall back to the candidate when the mirror has moved on to a newer point release.
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "gcc-12=$gcc_apt_version" "g++-12=$gcc_apt_version" \
        || DEBIAN_FRONTEND=noninteractive apt-get install -y -qq gcc-12 g++-12
}

check_nvcc() {
    local nvcc="$cuda_home/bin/nvcc"
    [ -x "$nvcc" ] || fail "expected the CUDA $cuda_major_minor toolkit's nvcc at $nvcc but it is missing; install CUDA $cuda_major_minor there or set CUDA_HOME to it."
    local release
    release="$("$nvcc" --version | sed -n 's/.*release \([0-9][0-9]*\.[0-9][0-9]*\).*/\1/p')"
    [ "$release" = "$cuda_major_minor" ] || fail "expected nvcc $cuda_major_minor at $nvcc but found release '${release:-unknown}'; point CUDA_HOME at a CUDA $cuda_major_minor toolkit."
}

build_venv() {
    new_venv 50-lmcache-build "$1"
    venv_install "$1" "torch==$torch_version" -r "$build_requirements"
}

ensure_dist() {
    mkdir -p "$dist"
    rm -rf "$tools/lmcache-dist"
    ln -sfn "$dist" "$tools/lmcache-dist"
    if ! compgen -G "$dist/lmcache-$lmcache_version.tar.gz" >/dev/null; then
        # A plain `pip download --no-binary :all:` prepares the sdist's metadata in an isolated env that needs
        # torch==2.13.0; without isolation (build deps + torch already in the venv) pip only runs egg_info.
        "$venv/bin/python" -m pip download --quiet --disable-pip-version-check --no-deps --no-build-isolation \
            --no-binary lmcache --dest "$dist" "lmcache==$lmcache_version"
    fi
    if ! compgen -G "$dist/lmcache-$lmcache_version-*.whl" >/dev/null; then
        "$venv/bin/python" -m pip download --quiet --disable-pip-version-check --no-deps --only-binary lmcache \
            --python-version 3.11 --dest "$dist" "lmcache==$lmcache_version"
    fi
}

ensure_gcc12
check_nvcc
mkdir -p "$tools"
cached_venv lmcache-build "torch==$torch_version $GLM53_PIP_PIN $(sha256sum <"$build_requirements")" build_venv \
    "$tools/lmcache-build-venv"
venv="$CACHED_VENV"
ensure_dist
