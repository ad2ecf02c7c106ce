#!/usr/bin/env bash
# The README's main job: set up the toolkit (with the `pod` and `chart` extras: the real LMCache 0.5.6 server and Helm's
# engine), then run the pod the chart renders in mock mode on this machine (the real `lmcache server` as the sidecar +
# the vLLM stand-in, each under `glm53 supervise`), wait for its probes, validate it and print the report. Arguments go to `glm53 pod` (e.g.
# `scripts/main.sh --profile glm53`, or `--fault recovery-mismatch` to see it fail).
set -euo pipefail

repo_root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$repo_root"
bash scripts/bootstrap.sh dev
exec .venv/bin/glm53 pod "$@"
