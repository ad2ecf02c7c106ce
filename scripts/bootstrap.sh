#!/usr/bin/env bash
# Create (or reuse) the project's virtual environment and install the toolkit with pinned dependencies.
# Sourced by the README's two commands; safe to run repeatedly.
set -euo pipefail

repo_root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
venv="${GLM53_VENV:-$repo_root/.venv}"
python="${PYTHON:-python3.11}"
extras="${1:-dev}"

if ! command -v "$python" >/dev/null 2>&1; then
    echo "bootstrap: $python not found; install Python 3.11 or set PYTHON=/path/to/python3.11" >&2
    exit 2
fi
if [ ! -x "$venv/bin/python" ]; then
    "$python" -m venv "$venv"
fi
stamp="$venv/.glm53-installed-$extras"
if [ ! -f "$stamp" ] || [ "$repo_root/pyproject.toml" -nt "$stamp" ]; then
    "$venv/bin/python" -m pip install --quiet --disable-pip-version-check "pip==25.3"
    "$venv/bin/python" -m pip install --quiet --disable-pip-version-check -e "${repo_root}[${extras}]"
    touch "$stamp"
    # The README's commands call `glm53`, which lives in the venv: say once, on install, how to reach it.
    echo "bootstrap: installed glm53 into $venv; \`source $venv/bin/activate\` puts it on PATH" >&2
fi
