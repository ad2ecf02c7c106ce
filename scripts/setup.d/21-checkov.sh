#!/usr/bin/env bash
# Install checkov, the security scanner the chart tests run over the rendered manifests.
# It lives in its own virtual environment (.tools/checkov-venv, a link into the cache of lib/cache.sh) because its
# large, tightly pinned dependency tree would clash with the project's .venv. Puts `checkov` into .tools/bin.
set -euo pipefail

# shellcheck source=scripts/setup.d/lib/cache.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib/cache.sh"
checkov_version="3.3.30"

build_checkov_venv() {
    new_venv 21-checkov.sh "$1"
    venv_install "$1" "checkov==$checkov_version"
}

cached_venv checkov "checkov==$checkov_version $GLM53_PIP_PIN" build_checkov_venv "$repo_root/.tools/checkov-venv"
venv="$CACHED_VENV"
link_tool "$venv/bin/checkov" checkov
# The environment's key proves the pinned version was installed; `checkov --version` itself takes seconds.
if [ ! -x "$tools_bin/checkov" ]; then
    echo "21-checkov.sh: $tools_bin/checkov is not executable; delete $venv and re-run" >&2
    exit 1
fi
echo "21-checkov.sh: checkov $checkov_version at $tools_bin/checkov"
