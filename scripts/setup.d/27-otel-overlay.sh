#!/usr/bin/env bash
# The OpenTelemetry of the vLLM 0.34.0 joint set (docker/vllm-lmcache/constraints-vllm0.34.0.txt: SDK 1.45, past
# LMCache 0.5.6's caps, see joint_deps.py) installed without dependencies into .venv/otel-vllm0.34.0/: an overlay that,
# first on PYTHONPATH, makes the venv's lmcache 0.5.6 import that set's opentelemetry-* and prometheus-client instead of
# its own. tests/images/test_otel_override_live.py runs the real server under it. The versions are the constraints
# file's pins, read here, so the overlay cannot drift from the set: a changed pin reinstalls it. Idempotent.
set -euo pipefail

repo_root="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
constraints="$repo_root/docker/vllm-lmcache/constraints-vllm0.34.0.txt"
overlay="$repo_root/.venv/otel-vllm0.34.0"
# The stamp, written last, lists the pins the overlay holds.
stamp="$overlay/PINS"

mapfile -t pins < <(grep -E '^(opentelemetry-[a-z-]+|prometheus-client)==' "$constraints")
if [ "${#pins[@]}" -eq 0 ]; then
    echo "27-otel-overlay.sh: expected opentelemetry-* pins in $constraints but found none" >&2
    exit 1
fi
if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$(printf '%s\n' "${pins[@]}")" ]; then
    exit 0
fi
rm -rf "$overlay.partial"
"$repo_root/.venv/bin/pip" install --quiet --no-deps --only-binary=:all: --target "$overlay.partial" "${pins[@]}"
printf '%s\n' "${pins[@]}" >"$overlay.partial/PINS"
rm -rf "$overlay"
mv "$overlay.partial" "$overlay"
echo "27-otel-overlay.sh: ${#pins[@]} pins of $(basename "$constraints") in $overlay (an overlay on the venv's lmcache 0.5.6)"
