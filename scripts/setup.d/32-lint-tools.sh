#!/usr/bin/env bash
# Install shellcheck (Debian) for the shell entry points' lint tests; linked into .tools/bin where tests look for it.
set -euo pipefail

repo_root="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
shellcheck_version="0.9.0-1"

if [ "$(dpkg-query --showformat='${Version}' --show shellcheck 2>/dev/null || true)" != "$shellcheck_version" ]; then
    if [ "$(id -u)" -ne 0 ]; then
        echo "32-lint-tools: installing shellcheck needs root (apt-get); rerun as root" >&2
        exit 1
    fi
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq
    apt-get install -y -qq --no-install-recommends "shellcheck=$shellcheck_version"
fi
mkdir -p "$repo_root/.tools/bin"
ln -sfn /usr/bin/shellcheck "$repo_root/.tools/bin/shellcheck"
