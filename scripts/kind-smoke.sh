#!/usr/bin/env bash
# The kind-cluster smoke test of the chart in CPU-mock mode: from nothing to a validated mock deployment and back.
# Thin entry point: prepares the toolkit's virtual environment, then hands every argument to `glm53 kind-smoke`
# (see `scripts/kind-smoke.sh --help`; `--dry-run` prints each step without needing any tool).
set -euo pipefail

repo_root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$repo_root"
bash scripts/bootstrap.sh dev
# The repository's own tool folder (helm, ansible-playbook from scripts/setup.d/) is searched after the user's PATH.
export PATH="$PATH:$repo_root/.tools/bin"
exec "${GLM53_VENV:-$repo_root/.venv}/bin/glm53" kind-smoke "$@"
