#!/usr/bin/env bash
# Download the released upstream wheels, without their dependencies, into .tools/upstream/: vllm 0.33.0 (~336 MB),
# vllm 0.34.0 (the opt-in engine generation, vllm.generation), lmcache 0.5.6 and vllm-router 0.1.17. The log-fixture generator (tests/fixtures/generate_logs.py) only reads their
# source; 25-upstream-parsers.sh installs the vllm wheel for the conformance tests. The wheels are kept in the cache of
# lib/cache.sh (.tools/upstream links there; a wheel's file name carries its version): one already there is not
# downloaded again.
set -euo pipefail

# shellcheck source=scripts/setup.d/lib/cache.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib/cache.sh"
dest="$(glm53_cache_dir)/upstream-wheels"
pip="$repo_root/.venv/bin/pip"
mkdir -p "$dest" "$repo_root/.tools"
rm -rf "$repo_root/.tools/upstream"
ln -sfn "$dest" "$repo_root/.tools/upstream"

for pin in vllm==0.33.0 vllm==0.34.0 lmcache==0.5.6 vllm-router==0.1.17; do
    name="${pin%%==*}"
    version="${pin##*==}"
    # Wheel file names spell the project with underscores (vllm_router-0.1.17-...whl).
    if compgen -G "$dest/${name//-/_}-${version}-*.whl" >/dev/null; then
        continue
    fi
    "$pip" download --quiet --no-deps --only-binary=:all: --dest "$dest" "$pin"
    if ! compgen -G "$dest/${name//-/_}-${version}-*.whl" >/dev/null; then
        echo "24-upstream-wheels.sh: pip download $pin left no ${name//-/_}-${version}-*.whl in $dest" >&2
        exit 1
    fi
done
echo "24-upstream-wheels.sh: vllm 0.33.0 and 0.34.0, lmcache 0.5.6 and vllm-router 0.1.17 wheels in $dest"
