#!/usr/bin/env bash
# Install checkov, the security scanner the chart tests run over the rendered manifests.
# It lives in its own virtual environment (.tools/checkov-venv) because its large, tightly pinned dependency tree
# would clash with the project's .venv. Idempotent and fast when already installed; puts `checkov` into .tools/bin.
set -euo pipefail

repo_root="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
checkov_version="3.3.30"
python="${PYTHON:-python3.11}"
venv="$repo_root/.tools/checkov-venv"
bin_dir="$repo_root/.tools/bin"
stamp="$venv/.glm53-checkov-$checkov_version"

if [ ! -f "$stamp" ]; then
    if ! command -v "$python" >/dev/null 2>&1; then
        echo "21-checkov.sh: $python not found; install Python 3.11 or set PYTHON=/path/to/python3.11" >&2
        exit 1
    fi
    [ -x "$venv/bin/python" ] || "$python" -m venv "$venv"
    "$venv/bin/python" -m pip install --quiet --disable-pip-version-check "pip==25.3"
    "$venv/bin/python" -m pip install --quiet --disable-pip-version-check "checkov==$checkov_version"
    touch "$stamp"
fi
mkdir -p "$bin_dir"
ln -sfn "$venv/bin/checkov" "$bin_dir/checkov"
# The stamp proves the pinned version was installed; `checkov --version` itself takes seconds, so it is not re-run.
if [ ! -x "$bin_dir/checkov" ]; then
    echo "21-checkov.sh: $bin_dir/checkov is not executable; delete $venv and re-run" >&2
    exit 1
fi
echo "21-checkov.sh: checkov $checkov_version at $bin_dir/checkov"
