#!/usr/bin/env bash
# Install promtool (Debian bookworm's `prometheus` package) for the alert rules' unit tests
# (tests/exporter/test_alert_rules.py runs `promtool test rules` on every alert the chart renders).
# Only the binary is taken: `apt-get download` fetches the pinned .deb (apt checks it against the signed archive) and
# promtool alone is unpacked from it, so no Prometheus service is installed and the 48 MB prometheus binary is never
# written. It lives in lib/cache.sh's cache of tool environments ($GLM53_CACHE_DIR/venvs/promtool-<key>), keyed by the
# package version, and .tools/bin/promtool links to it. Cold: about 4 s (a 19 MB download); warm: 0.15 s, which only
# checks the version the linked binary answers.
set -euo pipefail

# shellcheck source=scripts/setup.d/lib/cache.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib/cache.sh"
# Pinned to bookworm's version (`apt-cache policy prometheus`): the rule tests were measured against its PromQL engine.
prometheus_version="2.42.0+ds-5+deb12u1"

known_to_apt() {
    [[ "$(apt-cache madison prometheus)" == *"| $prometheus_version |"* ]]
}

# BUILDER DIR for cached_venv: DIR ends up holding usr/bin/promtool and nothing else.
build_promtool() {
    if ! known_to_apt; then
        if [ "$(id -u)" -ne 0 ]; then
            echo "33-promtool.sh: apt knows no prometheus=$prometheus_version; run apt-get update as root and rerun" >&2
            exit 1
        fi
        apt-get update -qq
    fi
    # Fetched into a directory apt's sandbox user may write (under /root it may not, and apt warns and fetches as
    # root); removed when the script exits, whatever happened.
    download="$(mktemp -d)"
    trap 'rm -rf "$download"' EXIT
    if [ "$(id -u)" -eq 0 ] && id _apt >/dev/null 2>&1; then
        chown _apt "$download"
    fi
    (cd "$download" && apt-get download -qq "prometheus=$prometheus_version")
    mkdir -p "$1"
    dpkg-deb --fsys-tarfile "$download"/prometheus_*.deb | tar -x -C "$1" ./usr/bin/promtool
}

cached_venv promtool "prometheus=$prometheus_version" build_promtool "$repo_root/.tools/promtool"
link_tool "$CACHED_VENV/usr/bin/promtool" promtool
found="$("$tools_bin/promtool" --version 2>&1)"
found="${found%%$'\n'*}"  # its first line: "promtool, version ... (branch: ..., revision: <package version>)"
if [[ "$found" != *"revision: $prometheus_version)"* ]]; then
    echo "33-promtool.sh: expected promtool from prometheus $prometheus_version, found '$found' at $tools_bin/promtool" >&2
    exit 1
fi
echo "33-promtool.sh: $found at $tools_bin/promtool"
