#!/usr/bin/env bash
# Install promtool and the Prometheus server, both from Debian bookworm's `prometheus` package: promtool for the alert
# rules' unit tests (tests/exporter/test_alert_rules.py runs `promtool test rules` on every alert the chart renders) and
# to check a rules file before a server loads it; the server for the tests that evaluate the chart's alerts and
# dashboard on a running CPU pod, and for `glm53 pod --prometheus` (glm53.pod.prometheus).
# Only the two binaries are taken: `apt-get download` fetches the pinned .deb (apt checks it against the signed
# archive) and promtool and prometheus alone are unpacked from it, so no Prometheus service, user or config is
# installed and nothing is started here. They live in lib/cache.sh's cache of tool environments
# ($GLM53_CACHE_DIR/venvs/promtool-<key>), keyed by the package version and the binaries taken, and
# .tools/bin/promtool and .tools/bin/prometheus link to them. Cold: about 4 s (a 19 MB download, 98 MB unpacked);
# warm: 0.2 s, which only checks the version each binary answers.
set -euo pipefail

# shellcheck source=scripts/setup.d/lib/cache.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib/cache.sh"
# Pinned to bookworm's version (`apt-cache policy prometheus`): the rule tests were measured against its PromQL engine.
prometheus_version="2.42.0+ds-5+deb12u1"
# The package's binaries taken (part of the cache key: an environment holding fewer is another environment).
binaries=(promtool prometheus)

# BUILDER DIR for cached_venv: DIR ends up holding usr/bin/<each of binaries> and nothing else.
build_binaries() {
    # Removed when the script exits, whatever happened.
    download="$(mktemp -d)"
    trap 'rm -rf "$download"' EXIT
    apt_download 33-promtool.sh "$download" "prometheus=$prometheus_version"
    mkdir -p "$1"
    dpkg-deb --fsys-tarfile "$download"/prometheus_*.deb | tar -x -C "$1" "${binaries[@]/#/./usr/bin/}"
}

cached_venv promtool "prometheus=$prometheus_version ${binaries[*]}" build_binaries "$repo_root/.tools/promtool"
for binary in "${binaries[@]}"; do
    link_tool "$CACHED_VENV/usr/bin/$binary" "$binary"
    found="$("$tools_bin/$binary" --version 2>&1)"
    found="${found%%$'\n'*}"  # its first line: "<binary>, version ... (branch: ..., revision: <package version>)"
    if [[ "$found" != "$binary, version "*"revision: $prometheus_version)" ]]; then
        echo "33-promtool.sh: expected $binary of prometheus $prometheus_version, found '$found' in $tools_bin" >&2
        exit 1
    fi
    echo "33-promtool.sh: $found at $tools_bin/$binary"
done
