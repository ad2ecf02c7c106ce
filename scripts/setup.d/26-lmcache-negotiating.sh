#!/usr/bin/env bash
# The negotiating LMCache generation, lmcache 0.5.7rc2 (a pre-release; 0.5.6 stays the pod's default), installed
# without its dependencies into .venv/lmcache-0.5.7rc2/: an overlay, where the mock image has it
# (/opt/glm53/lmcache-0.5.7rc2, the chart's PYTHONPATH with lmcache.generation=0.5.7rc2). First on PYTHONPATH, it makes
# the pod extra's Python import 0.5.7rc2 instead of 0.5.6 (its wheel is built against torch 2.13, the pod extra's, and needs nothing
# 0.5.6's environment lacks). tests/probe/test_negotiating_server_live.py starts the real server from it. Idempotent.
set -euo pipefail

repo_root="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
overlay="$repo_root/.venv/lmcache-0.5.7rc2"
pin="lmcache==0.5.7rc2"

if [ -d "$overlay/lmcache-0.5.7rc2.dist-info" ]; then
    exit 0
fi
rm -rf "$overlay.partial"
"$repo_root/.venv/bin/pip" install --quiet --no-deps --only-binary=:all: --target "$overlay.partial" "$pin"
if [ ! -d "$overlay.partial/lmcache-0.5.7rc2.dist-info" ]; then
    echo "26-lmcache-negotiating.sh: pip install $pin left no lmcache-0.5.7rc2.dist-info in $overlay.partial" >&2
    exit 1
fi
mv "$overlay.partial" "$overlay"
echo "26-lmcache-negotiating.sh: $pin in $overlay (an overlay on the pod extra's environment)"
