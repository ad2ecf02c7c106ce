#!/usr/bin/env bash
# Install redis-server (Debian bookworm's 7.0.15) for the shared L2 tier's tests: the CPU pod, the fault suite and the
# fleet reach a real Redis-protocol server on loopback through LMCache's `resp` L2 adapter (valkey-server is not in
# bookworm). Only the binary and the two libraries it links are taken: `apt-get download` fetches the pinned .debs
# (checked by apt against the signed archive) and they are unpacked into lib/cache.sh's cache of tool environments
# ($GLM53_CACHE_DIR/venvs/redis-<key>), so no service is installed or started; .tools/bin/redis-server is a wrapper
# that runs it against those libraries. Cold: about 3 s (1.3 MB); warm: 0.1 s, which only checks the version.
set -euo pipefail

# shellcheck source=scripts/setup.d/lib/cache.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib/cache.sh"
# Pinned to bookworm's versions (`apt-cache policy redis-tools libjemalloc2 liblzf1`).
redis_version="5:7.0.15-1~deb12u10"
packages=("redis-tools=$redis_version" "libjemalloc2=5.3.0-1" "liblzf1=3.6-3")

# BUILDER DIR for cached_venv: DIR ends up holding usr/bin/redis-server (redis-tools ships the server as
# redis-check-rdb, which acts as the server when called by that name) and usr/lib/x86_64-linux-gnu's two libraries.
build_redis() {
    # Removed when the script exits, whatever happened.
    download="$(mktemp -d)"
    trap 'rm -rf "$download"' EXIT
    apt_download 34-redis.sh "$download" "${packages[@]}"
    mkdir -p "$1"
    for deb in "$download"/*.deb; do
        dpkg-deb -x "$deb" "$1"
    done
    ln -sf redis-check-rdb "$1/usr/bin/redis-server"
    cat > "$1/redis-server" <<WRAPPER
#!/bin/sh
# redis-server from Debian's redis-tools $redis_version, run against the libraries unpacked beside it.
LD_LIBRARY_PATH="$1/usr/lib/x86_64-linux-gnu\${LD_LIBRARY_PATH:+:\$LD_LIBRARY_PATH}" exec "$1/usr/bin/redis-server" "\$@"
WRAPPER
    chmod +x "$1/redis-server"
}

cached_venv redis "${packages[*]}" build_redis "$repo_root/.tools/redis"
link_tool "$CACHED_VENV/redis-server" redis-server
found="$("$tools_bin/redis-server" --version)"
if [[ "$found" != "Redis server v=7.0.15 "* ]]; then
    echo "34-redis.sh: expected Redis server v=7.0.15 from redis-tools $redis_version, found '$found'" >&2
    exit 1
fi
echo "34-redis.sh: ${found%% sha=*} at $tools_bin/redis-server"
