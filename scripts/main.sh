#!/usr/bin/env bash
# The README's main job: set up the toolkit, then run the CPU-mock pod on this machine (LMCache sidecar + vLLM mock
# under `glm53 supervise`), wait for the startup probe, validate it and print the report. Arguments go to `glm53 pod`
# (e.g. `scripts/main.sh --profile glm53 --generation negotiating`, or `--fault recovery-mismatch` to see it fail).
set -euo pipefail

repo_root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$repo_root"
bash scripts/bootstrap.sh dev
exec .venv/bin/glm53 pod "$@"
