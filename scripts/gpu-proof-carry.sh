#!/usr/bin/env bash
# Fill the carry folder scripts/gpu-proof.sh reads on a GPU host that reaches no package index: run this where pip
# reaches one, then carry the folder along (the device tool's `carry`, or a copy). Python 3.12 x86-64 wheels, the
# lent H200 image's interpreter:
#   CARRY/sdist/lmcache-V.tar.gz       copied from --sdist under its own name (gpu-proof.sh --lmcache-version V reads
#                                      it; scripts/setup.d/50-lmcache-build.sh puts 0.5.6's in .tools)
#   CARRY/rt/*.whl                     scripts/gpu-proof-rt.txt (LMCache's runtime dependencies the image lacks)
#   CARRY/wheels/*.whl                 docker/vllm-lmcache/build-requirements.txt and what they need, less rt's
# About 48 MiB in all; the device tool carries at most 64 MiB with the working tree.
#
# Usage: scripts/gpu-proof-carry.sh [--carry DIR] [--sdist FILE] [--python PY]
#   --carry DIR    the folder to fill (default .gpuproof; emptied first)
#   --sdist FILE   the LMCache sdist, named lmcache-V.tar.gz (default .tools/lmcache-dist/lmcache-0.5.6.tar.gz)
#   --python PY    the interpreter whose pip downloads (default .venv/bin/python)
set -euo pipefail

repo_root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$repo_root"
prog="gpu-proof-carry"
carry=".gpuproof"
sdist=".tools/lmcache-dist/lmcache-0.5.6.tar.gz"
python=".venv/bin/python"

fail() {
    echo "$prog: error: $*" >&2
    exit 2
}

while [ $# -gt 0 ]; do
    case "$1" in
        --carry) [ $# -ge 2 ] || fail "expected a value after --carry."; carry="$2"; shift 2 ;;
        --sdist) [ $# -ge 2 ] || fail "expected a value after --sdist."; sdist="$2"; shift 2 ;;
        --python) [ $# -ge 2 ] || fail "expected a value after --python."; python="$2"; shift 2 ;;
        -h | --help) sed -n '2,/^set -euo/p' "${BASH_SOURCE[0]}" | sed -e '$d' -e 's/^# \{0,1\}//'; exit 0 ;;
        *) fail "unknown argument '$1'; see --help." ;;
    esac
done

[ -f "$sdist" ] || fail "expected the LMCache sdist at $sdist but it is missing; run scripts/setup.d/50-lmcache-build.sh or pass --sdist."
command -v "$python" >/dev/null 2>&1 || fail "expected the Python '$python' but it is missing; pass --python."
# gpu-proof.sh finds the sdist by version (CARRY/sdist/lmcache-V.tar.gz), so the file keeps pip's name.
[[ "$(basename "$sdist")" =~ ^lmcache-[0-9]+(\.[0-9]+)+((a|b|rc)[0-9]+)?\.tar\.gz$ ]] \
    || fail "expected --sdist to be named like lmcache-0.5.6.tar.gz but got '$(basename "$sdist")'."

# The lent host's interpreter and platform (KINDS.md: Python 3.12, x86-64); pip matches each manylinux tag exactly.
platform=(--only-binary=:all: --python-version 3.12 --implementation cp)
for tag in manylinux_2_34 manylinux_2_28 manylinux_2_27 manylinux_2_26 manylinux_2_17 manylinux2014 manylinux1; do
    platform+=(--platform "${tag}_x86_64")
done
pip=("$python" -m pip --disable-pip-version-check download --quiet)

rm -rf "$carry"
mkdir -p "$carry/sdist" "$carry/wheels" "$carry/rt"
cp "$sdist" "$carry/sdist/"
"${pip[@]}" --no-deps "${platform[@]}" -d "$carry/rt" -r scripts/gpu-proof-rt.txt
"${pip[@]}" "${platform[@]}" -d "$carry/wheels" -r docker/vllm-lmcache/build-requirements.txt
# The build searches rt/ too (gpu-proof.sh's build stage): carry each wheel once.
for wheel in "$carry"/rt/*.whl; do
    rm -f "$carry/wheels/$(basename "$wheel")"
done
du -sh "$carry"/* "$carry"
