#!/usr/bin/env bash
# Virtual environments in which vLLM's own argument parser imports on CPU, one per engine generation the chart renders
# for (vllm.generation: 0.33.0, the default, and 0.34.0), for the chart's conformance tests
# (tests/chart/test_chart_argv_conformance.py: the rendered `vllm serve` argv must parse with that vLLM's parser and
# mean what the chart intends).
# vLLM's full dependency set needs torch 2.14 and CUDA wheels; parsing needs far less: torch 2.13.0+cpu, the vllm wheel
# without its dependencies (downloaded by 24-upstream-wheels.sh), and the pinned set in
# tests/chart/upstream-parsers-requirements.txt (the same for both generations: 0.34.0's parser imports with it), all
# installed with --no-deps so the set is exactly what is listed.
# LMCache 0.5.6's parser is imported from the project's .venv, which already has the package.
# Cost on a 2-core machine: about 1.9 GB on disk and about 60 s from local wheels per generation (a vllm wheel is about
# 336 MB, torch CPU about 190 MB), once per set of inputs (the cache of lib/cache.sh; .tools/upstream-parsers-venv-<generation>
# links to it).
set -euo pipefail

# shellcheck source=scripts/setup.d/lib/cache.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib/cache.sh"
requirements="$repo_root/tests/chart/upstream-parsers-requirements.txt"
torch_pin="torch==2.13.0+cpu"
torch_index="${GLM53_TORCH_CPU_INDEX:-https://download.pytorch.org/whl/cpu}"
generations=(0.33.0 0.34.0)

shopt -s nullglob
build_parsers_venv() {
    new_venv 25-upstream-parsers.sh "$1"
    # The CPU build: from local wheels (find-links) when present, else from PyTorch's CPU index.
    venv_install "$1" --no-deps --no-index "$torch_pin" 2>/dev/null \
        || venv_install "$1" --no-deps --index-url "$torch_index" "$torch_pin"
    venv_install "$1" --no-deps "$wheel"
    venv_install "$1" --no-deps -r "$requirements"
    VLLM_TARGET_DEVICE=cpu "$1/bin/python" -c "import vllm.entrypoints.cli.serve" \
        || { echo "25-upstream-parsers.sh: vLLM's parser does not import in $1; see the error above" >&2; exit 1; }
}

for generation in "${generations[@]}"; do
    wheels=("$repo_root"/.tools/upstream/vllm-"$generation"-*.whl)
    if [ "${#wheels[@]}" -ne 1 ]; then
        echo "25-upstream-parsers.sh: no vllm-$generation wheel in .tools/upstream; run scripts/setup.d/24-upstream-wheels.sh first" >&2
        exit 1
    fi
    wheel="${wheels[0]}"
    # The key names everything the venv is built from, so changing a pin builds a new one.
    inputs="$(sha256sum <"$requirements")$torch_pin$(basename "$wheel")"
    cached_venv upstream-parsers "$inputs" build_parsers_venv "$repo_root/.tools/upstream-parsers-venv-$generation"
    echo "25-upstream-parsers.sh: vLLM $generation's parser importable with $CACHED_VENV/bin/python"
done
