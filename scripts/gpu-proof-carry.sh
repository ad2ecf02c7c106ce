#!/usr/bin/env bash
# Fill the carry folder scripts/gpu-proof.sh reads on a GPU host that reaches no package index: run this where pip
# reaches one (no GPU, CUDA or compiler needed), then carry the folder along (the device tool's `carry`, or a copy).
# Python 3.12 x86-64 wheels, the lent H200 image's interpreter. Two kinds of folder:
#   to build LMCache (default)  CARRY/sdist/lmcache-V.tar.gz, CARRY/rt/*.whl, CARRY/wheels/*.whl (0.5.6: 47 MiB)
#   --wheel FILE                CARRY/rt/*.whl and CARRY/<FILE's name>, for runs that install the wheel an earlier
#                               run built (gpu-proof.sh --lmcache-wheel CARRY/<name>; no build or lmcache-tests stage;
#                               with 0.5.6's 14 MiB wheel: 47 MiB)
# where
#   sdist/lmcache-V.tar.gz      LMCache V's sdist: --sdist, else the one scripts/setup.d/50-lmcache-build.sh fetched
#                               (.tools/lmcache-dist/ or its cache), else downloaded from the index (below)
#   rt/*.whl                    scripts/gpu-proof-rt.txt (LMCache's runtime dependencies the image lacks)
#   wheels/*.whl                docker/vllm-lmcache/build-requirements.txt and what they need, less rt's
# A lent machine takes 64 MiB with the working tree (about 3 MiB): the script prints both sizes last.
#
# The download: a plain `pip download --no-binary lmcache lmcache==V` prepares the sdist's metadata in an isolated
# environment with torch, whose extension setup then stops without CUDA ("CUDA_HOME environment variable is not
# set"). As in 50-lmcache-build.sh it runs without build isolation, here in a throwaway venv that holds only LMCache's
# setuptools pins, and with LMCache's NO_NATIVE_EXT=1 (no extensions), so its metadata needs neither torch nor CUDA;
# the file saved is the index's own.
#
# Usage: scripts/gpu-proof-carry.sh [--carry DIR] [--lmcache-version V] [--sdist FILE] [--wheel FILE] [--python PY]
#   --carry DIR          the folder to fill (default .gpuproof; emptied first)
#   --lmcache-version V  the LMCache release whose sdist is carried (default 0.5.6; gpu-proof.sh's --lmcache-version)
#   --sdist FILE         the LMCache sdist, named lmcache-V.tar.gz (default: found or downloaded, above)
#   --wheel FILE         carry this LMCache wheel and rt/ only, no sdist and no build wheels
#   --python PY          the interpreter whose pip downloads (default .venv/bin/python when there, else python3)
set -euo pipefail

repo_root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$repo_root"
prog="gpu-proof-carry"
carry=".gpuproof"
lmcache_version="0.5.6"
sdist=""
wheel=""
python=".venv/bin/python"
[ -x "$python" ] || python="python3"
# LMCache's build-system setuptools pins (its pyproject.toml, 0.5.6 and 0.5.7rc2 alike), less torch and gRPC.
metadata_requirements=("setuptools>=77.0.3,<81.0.0" "setuptools_scm>=8" "packaging>=24.2" "wheel")

fail() {
    echo "$prog: error: $*" >&2
    exit 2
}

while [ $# -gt 0 ]; do
    case "$1" in
        --carry) [ $# -ge 2 ] || fail "expected a value after --carry."; carry="$2"; shift 2 ;;
        --lmcache-version) [ $# -ge 2 ] || fail "expected a value after --lmcache-version."; lmcache_version="$2"; shift 2 ;;
        --sdist) [ $# -ge 2 ] || fail "expected a value after --sdist."; sdist="$2"; shift 2 ;;
        --wheel) [ $# -ge 2 ] || fail "expected a value after --wheel."; wheel="$2"; shift 2 ;;
        --python) [ $# -ge 2 ] || fail "expected a value after --python."; python="$2"; shift 2 ;;
        -h | --help) sed -n '2,/^set -euo/p' "${BASH_SOURCE[0]}" | sed -e '$d' -e 's/^# \{0,1\}//'; exit 0 ;;
        *) fail "unknown argument '$1'; see --help." ;;
    esac
done

[[ "$lmcache_version" =~ ^[0-9]+(\.[0-9]+)+((a|b|rc)[0-9]+)?$ ]] \
    || fail "expected --lmcache-version like 0.5.6 or 0.5.7rc2 but got '$lmcache_version'."
"$python" -m pip --version >/dev/null 2>&1 \
    || fail "expected a Python with pip at '$python' but it has none; pass --python PY (or run: bash scripts/bootstrap.sh dev)."
if [ -n "$wheel" ]; then
    [ -z "$sdist" ] || fail "expected --sdist or --wheel, not both: a wheel's run builds nothing."
    [ -f "$wheel" ] || fail "expected the LMCache wheel $wheel but it does not exist (run 1's --out folder holds it)."
    [[ "$(basename "$wheel")" == lmcache-*.whl ]] || fail "expected an LMCache wheel (lmcache-*.whl) but got '$(basename "$wheel")'."
elif [ -z "$sdist" ]; then
    for found in ".tools/lmcache-dist/lmcache-$lmcache_version.tar.gz" \
        "${GLM53_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/glm53}/lmcache-dist/lmcache-$lmcache_version.tar.gz"; do
        if [ -f "$found" ]; then
            sdist="$found"
            break
        fi
    done
else
    [ -f "$sdist" ] || fail "expected the LMCache sdist at $sdist but it is missing; leave --sdist out to download it."
    # gpu-proof.sh finds the sdist by version (CARRY/sdist/lmcache-V.tar.gz), so the file keeps pip's name.
    [[ "$(basename "$sdist")" =~ ^lmcache-[0-9]+(\.[0-9]+)+((a|b|rc)[0-9]+)?\.tar\.gz$ ]] \
        || fail "expected --sdist to be named like lmcache-0.5.6.tar.gz but got '$(basename "$sdist")'."
    lmcache_version="$(basename "$sdist" .tar.gz)"
    lmcache_version="${lmcache_version#lmcache-}"
fi

# The lent host's interpreter and platform (KINDS.md: Python 3.12, x86-64); pip matches each manylinux tag exactly.
platform=(--only-binary=:all: --python-version 3.12 --implementation cp)
for tag in manylinux_2_34 manylinux_2_28 manylinux_2_27 manylinux_2_26 manylinux_2_17 manylinux2014 manylinux1; do
    platform+=(--platform "${tag}_x86_64")
done
pip=("$python" -m pip --disable-pip-version-check download --quiet)
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT

# The wheel may lie in the folder emptied below: keep a copy first.
[ -z "$wheel" ] || cp "$wheel" "$work/"
rm -rf "$carry"
mkdir -p "$carry/rt"
"${pip[@]}" --no-deps "${platform[@]}" -d "$carry/rt" -r scripts/gpu-proof-rt.txt
if [ -n "$wheel" ]; then
    cp "$work/$(basename "$wheel")" "$carry/"
else
    mkdir -p "$carry/sdist" "$carry/wheels"
    if [ -n "$sdist" ]; then
        cp "$sdist" "$carry/sdist/"
    else
        echo "$prog: downloading the lmcache $lmcache_version sdist (metadata without CUDA: NO_NATIVE_EXT=1)"
        "$python" -m venv "$work/venv" || fail "expected '$python' to make a venv (python3-venv) but it failed; pass --python PY."
        "$work/venv/bin/python" -m pip install --quiet --disable-pip-version-check "${metadata_requirements[@]}"
        NO_NATIVE_EXT=1 "$work/venv/bin/python" -m pip --disable-pip-version-check download --quiet --no-deps \
            --no-build-isolation --no-binary lmcache -d "$carry/sdist" "lmcache==$lmcache_version"
    fi
    [ -f "$carry/sdist/lmcache-$lmcache_version.tar.gz" ] \
        || fail "expected $carry/sdist/lmcache-$lmcache_version.tar.gz after the download but it is missing."
    "${pip[@]}" "${platform[@]}" -d "$carry/wheels" -r docker/vllm-lmcache/build-requirements.txt
    # The build searches rt/ too (gpu-proof.sh's build stage): carry each wheel once.
    for rt_wheel in "$carry"/rt/*.whl; do
        rm -f "$carry/wheels/$(basename "$rt_wheel")"
    done
fi
du -sh "$carry"/*
# What a lent machine receives: the working tree (tracked and untracked files git does not ignore), this folder with
# it when git ignores it or it lies outside.
# (du skips, with a complaint, an index entry whose file is gone.)
tree_bytes="$({ git ls-files -z --cached --others --exclude-standard | du -cb --files0-from=- 2>/dev/null || true; } \
    | tail -n 1 | cut -f1)"
carry_inside="$(git ls-files --others --exclude-standard -- "$carry" 2>/dev/null || true)"
carry_bytes="$(du -sb "$carry" | cut -f1)"
[ -n "$carry_inside" ] || tree_bytes=$((tree_bytes + carry_bytes))
mib() { echo $((($1 + 524288) / 1048576)); }
echo "$prog: $carry holds $(mib "$carry_bytes") MiB; with the working tree $(mib "$tree_bytes") MiB (a lent machine takes 64 MiB)"
