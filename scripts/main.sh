#!/usr/bin/env bash
# The README's main job: set up the toolkit (the real vLLM engine's pinned set, the `dev` extras and the negotiating
# LMCache pre-release's overlay for --lmcache-generation 0.5.7rc2), then run the pod the chart renders in mock mode on
# this machine (the real `lmcache server` as the sidecar + the real vLLM engine on a tiny CPU model, or its stand-in,
# each under `glm53 supervise`), wait for its probes, validate it and print the report. Arguments go to `glm53 pod`
# (e.g. `scripts/main.sh --profile tiny-hybrid`, or `--engine standin --fault recovery-mismatch` to see it fail).
set -euo pipefail

repo_root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$repo_root"
bash scripts/bootstrap.sh dev
bash scripts/setup.d/26-lmcache-negotiating.sh
bash scripts/setup.d/33-promtool.sh  # for --prometheus: the real Prometheus that evaluates the chart's alerts
exec .venv/bin/glm53 pod "$@"
