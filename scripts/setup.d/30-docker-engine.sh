#!/usr/bin/env bash
# Install a Docker engine (Debian's docker.io) and debootstrap so the Docker-marked tests can start their own daemon
# and build a base image without a registry. Installing only: tests/conftest.py starts and stops the engine.
set -euo pipefail

# Pinned to bookworm's versions: the daemon's API (1.41) and vfs behaviour are what the tests were measured against.
docker_io_version="20.10.24+dfsg1-1+deb12u1+b6"
debootstrap_version="1.0.128+nmu2+deb12u2"

installed_version() {
    dpkg-query --showformat='${Version}' --show "$1" 2>/dev/null || true
}

if [ "$(installed_version docker.io)" = "$docker_io_version" ] \
    && [ "$(installed_version debootstrap)" = "$debootstrap_version" ]; then
    exit 0
fi
if [ "$(id -u)" -ne 0 ]; then
    echo "30-docker-engine: installing docker.io and debootstrap needs root (apt-get); rerun as root" >&2
    exit 1
fi
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq
# No init system runs here, so keep the package's postinst from trying to start the daemon.
policy_rc_d=/usr/sbin/policy-rc.d
created_policy=false
if [ ! -e "$policy_rc_d" ]; then
    printf '#!/bin/sh\nexit 101\n' >"$policy_rc_d"
    chmod 0755 "$policy_rc_d"
    created_policy=true
fi
status=0
apt-get install -y -qq --no-install-recommends \
    "docker.io=$docker_io_version" "debootstrap=$debootstrap_version" || status=$?
if [ "$created_policy" = true ]; then
    rm -f "$policy_rc_d"
fi
exit "$status"
