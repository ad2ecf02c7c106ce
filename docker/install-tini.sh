#!/usr/bin/env bash
# Make Debian's tini, at exactly the version given, the image's PID 1 (shared by docker/mock and docker/router).
#
# Why a helper: tini reaps orphaned grandchildren and forwards signals to its one child, which neither `glm53
# supervise` nor the router's Python launcher does as PID 1. The public python:*-slim base lacks tini and installs it
# from the archive; CI's debootstrapped base carries it already (its builds have no network), so apt runs only when
# the installed version is not the pinned one. Either way the installed version is checked.
# Usage: install-tini.sh VERSION   (a Debian bookworm version such as 0.19.0-1+b3)
set -euo pipefail

want="${1:?usage: install-tini.sh VERSION}"
installed() { dpkg-query --showformat='${Version}' --show tini 2>/dev/null || true; }

if [ "$(installed)" != "$want" ]; then
    apt-get update
    apt-get install -y --no-install-recommends "tini=$want"
    rm -rf /var/lib/apt/lists/*
fi
found="$(installed)"
if [ "$found" != "$want" ]; then
    echo "install-tini: expected tini $want but found '${found:-nothing}'; fix TINI_VERSION or the base image" >&2
    exit 1
fi
