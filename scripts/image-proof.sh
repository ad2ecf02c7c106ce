#!/usr/bin/env bash
# The serving image, built for real on a CPU machine: make substitute base images, build the unchanged
# docker/vllm-lmcache/Dockerfile through `ansible-playbook ansible/build-images.yml`, check inside the image, record
# the result in docs/serving-image.md (generated from this run, never typed), stop the daemon and free its disk.
#
# Substitute bases (no registry is reachable here, so not nvidia/cuda): Debian bookworm from debootstrap, plus
#   - the host's CPython 3.12 under /usr/local, registered with dpkg as python3.12 / -dev / -venv so the Dockerfile's
#     `apt-get install python3.12 ...` is satisfied as it is on Ubuntu 24.04;
#   - devel only: the host's CUDA 13.0 toolkit (nvcc, headers, cudart) at /usr/local/cuda-13.0 (+ /usr/local/cuda);
#   - the host's CA bundle, read now (the build reaches the registries through a TLS-intercepting proxy, whose CA
#     changes), installed as a local CA so the image's own `ca-certificates` keeps it; and the host's apt sources.
# Engine: a private dockerd (Debian's docker.io 20.10: its CLI drives the daemon's BuildKit with DOCKER_BUILDKIT=1, no
# buildx, no `# syntax=` frontend image) with overlay2 on disk, no bridge; RUN steps use `--network host`. The daemon
# and so every build step run under `nice` (the machine is shared).
#
# Usage: scripts/image-proof.sh            the whole proof (about 30 min on 2 cores, ~45 GB of free disk at peak)
# Environment (all optional):
#   GLM53_PROOF_WORK     scratch root, removed at the end (default /var/tmp/glm53-image-proof; must be on disk)
#   GLM53_PROOF_CUDA     CUDA 13.0 toolkit to copy into the devel base (default /usr/local/cuda-13.0)
#   GLM53_PROOF_PYTHON   prefix of a CPython 3.12 install (default: the newest ~/.pyenv/versions/3.12.*)
#   GLM53_PROOF_MAX_JOBS LMCache's parallel compile jobs (default 2: the cores here)
#   GLM53_PROOF_NICE     niceness of the daemon and its builds (default 15)
#   GLM53_PROOF_WARM     1 (default): also time a warm rebuild (a new IMAGE_VERSION: the runtime stage again)
#   GLM53_PROOF_DOC      the record to write (default docs/serving-image.md)
#   GLM53_PROOF_KEEP     on-failure: when a step fails, leave the daemon running and its data in place (debugging;
#                        it prints how to stop it); 1: always; 0 (default): never
set -euo pipefail

repo_root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
prog=image-proof
work="${GLM53_PROOF_WORK:-/var/tmp/glm53-image-proof}"
cuda_src="${GLM53_PROOF_CUDA:-/usr/local/cuda-13.0}"
max_jobs="${GLM53_PROOF_MAX_JOBS:-2}"
niceness="${GLM53_PROOF_NICE:-15}"
warm="${GLM53_PROOF_WARM:-1}"
doc="${GLM53_PROOF_DOC:-$repo_root/docs/serving-image.md}"
keep="${GLM53_PROOF_KEEP:-0}"
docker_cli=/usr/bin/docker # Debian's docker.io client; a newer CLI without buildx cannot drive BuildKit
venv_python="$repo_root/.venv/bin/python"
proof_py="$repo_root/docker/vllm-lmcache/image_proof.py"
helm="$repo_root/.tools/bin/helm"
ansible_playbook="$repo_root/.tools/bin/ansible-playbook"
suite=bookworm
mirror=http://deb.debian.org/debian
devel_image=glm53-proof/cuda:13.0-devel-bookworm
runtime_image=glm53-proof/cuda:13.0-runtime-bookworm
# What CPython 3.12 needs from Debian (its extension modules' libraries), on top of minbase.
base_packages=ca-certificates,libssl3,libffi8,libsqlite3-0,zlib1g,libbz2-1.0,liblzma5,libreadline8,libncursesw6,libuuid1,libexpat1,libnsl2,libtirpc3,libcrypt1
min_free_gb=40

log() { printf '%s: %s\n' "$prog" "$*" >&2; }
fail() {
    log "error: $*"
    exit 1
}
now() { date +%s; }

results="$work/results"
state="$work/engine"
dockerd_pid=""
sampler_pid=""

# ---- preflight ---------------------------------------------------------------------------------------------------
preflight() {
    [ "$(id -u)" -eq 0 ] || fail "expected to run as root (debootstrap, dockerd, mounts) but uid is $(id -u); rerun as root."
    local tool
    for tool in "$docker_cli" /usr/sbin/dockerd /usr/sbin/debootstrap "$helm" "$ansible_playbook" "$venv_python"; do
        [ -x "$tool" ] || fail "expected $tool but it is missing; run scripts/bootstrap.sh (docker.io and debootstrap: scripts/setup.d/30-docker-engine.sh)."
    done
    "$docker_cli" --version | grep -q '^Docker version 20\.10\.' \
        || fail "expected Debian's docker.io 20.10 client at $docker_cli but found '$("$docker_cli" --version)'; run scripts/setup.d/30-docker-engine.sh."
    [ -x "$cuda_src/bin/nvcc" ] || fail "expected a CUDA 13.0 toolkit with bin/nvcc at $cuda_src but found none; set GLM53_PROOF_CUDA."
    "$cuda_src/bin/nvcc" --version | grep -q 'release 13\.0' \
        || fail "expected nvcc release 13.0 at $cuda_src but found '$("$cuda_src/bin/nvcc" --version | tail -1)'; set GLM53_PROOF_CUDA to a CUDA 13.0 toolkit."
    if [ -z "${GLM53_PROOF_PYTHON:-}" ]; then
        GLM53_PROOF_PYTHON="$(find "${HOME:-/root}/.pyenv/versions" -maxdepth 1 -name '3.12.*' 2>/dev/null | sort -V | tail -1)"
    fi
    python_src="${GLM53_PROOF_PYTHON:-}"
    if [ -z "$python_src" ] || [ ! -x "$python_src/bin/python3.12" ] || [ ! -e "$python_src/lib/libpython3.12.so.1.0" ]; then
        fail "expected a shared-library CPython 3.12 install (bin/python3.12, lib/libpython3.12.so.1.0) but found none at '${python_src:-~/.pyenv/versions/3.12.*}'; set GLM53_PROOF_PYTHON to its prefix."
    fi
    [ ! -e "$work" ] || fail "expected no $work (another proof running, or one killed before it cleaned up); stop it or remove $work."
    mkdir -p "$work"
    local free_gb
    free_gb="$(df --output=avail -BG "$work" | tail -1 | tr -dc 0-9)"
    [ "$free_gb" -ge "$min_free_gb" ] || {
        rmdir "$work"
        fail "expected at least $min_free_gb GB free under $work (the daemon's data root peaks near 35 GB with the warm rebuild) but found $free_gb GB; free disk or set GLM53_PROOF_WORK."
    }
    mkdir -p "$results"
    echo "$free_gb" >"$results/free-gb-before"
}

# ---- substitute bases --------------------------------------------------------------------------------------------
# A dpkg entry that says PACKAGE is installed, so `apt-get install PACKAGE` in the Dockerfile finds nothing to do.
register_package() {
    local root="$1" package="$2" version="$3" pkgdir
    pkgdir="$(mktemp -d "$work/deb.XXXX")"
    mkdir -p "$pkgdir/DEBIAN"
    cat >"$pkgdir/DEBIAN/control" <<EOF
Package: $package
Version: $version
Architecture: amd64
Maintainer: glm53-serving image proof <root@localhost>
Description: stand-in: CPython $version under /usr/local, copied from the build host by scripts/image-proof.sh
EOF
    dpkg-deb --build --root-owner-group "$pkgdir" "$pkgdir.deb" >/dev/null
    dpkg --root="$root" --force-script-chrootless --install "$pkgdir.deb" >/dev/null
    rm -rf "$pkgdir" "$pkgdir.deb"
}

install_python() {
    local root="$1" version
    version="$("$python_src/bin/python3.12" -c 'import platform; print(platform.python_version())')"
    install -D -m 0755 "$python_src/bin/python3.12" "$root/usr/local/bin/python3.12"
    cp -a "$python_src/lib/libpython3.12.so.1.0" "$root/usr/local/lib/"
    ln -sf libpython3.12.so.1.0 "$root/usr/local/lib/libpython3.12.so"
    mkdir -p "$root/usr/local/include"
    cp -a "$python_src/include/python3.12" "$root/usr/local/include/"
    # The standard library without its test suite, IDLE, Tk and whatever the host installed into site-packages.
    tar -C "$python_src/lib" --exclude='python3.12/test' --exclude='python3.12/idlelib' \
        --exclude='python3.12/tkinter' --exclude='python3.12/turtledemo' --exclude='python3.12/site-packages/*' \
        --exclude='__pycache__' -cf - python3.12 | tar -C "$root/usr/local/lib" -xf -
    ln -sf ../local/bin/python3.12 "$root/usr/bin/python3.12"
    # The binary's RUNPATH names the host prefix; the loader finds libpython through /usr/local/lib instead.
    chroot "$root" /sbin/ldconfig
    local package
    for package in "python3.12" "python3.12-dev" "python3.12-venv"; do
        register_package "$root" "$package" "$version-0glm53proof"
    done
    chroot "$root" /usr/bin/python3.12 -c 'import ssl, sqlite3, ctypes, lzma, bz2, venv, ensurepip' \
        || fail "expected the copied CPython 3.12 to import its extension modules in the base but it does not; see above."
    # What pip in the build will do first: reach the package index over TLS with the base's own trust store.
    chroot "$root" /usr/bin/python3.12 -c 'import urllib.request; urllib.request.urlopen("https://pypi.org/simple/pip/", timeout=30).read(1)' \
        || fail "expected the base's Python to reach https://pypi.org with the base's CA certificates but it cannot; see the error above (a proxy CA missing from /etc/ssl/certs/ca-certificates.crt on this host?)."
}

make_bases() {
    local started rootfs
    started="$(now)"
    rootfs="$work/rootfs"
    log "debootstrap $suite (minbase + $base_packages)"
    debootstrap --variant=minbase --include="$base_packages" "$suite" "$rootfs" "$mirror" >"$results/debootstrap.log" 2>&1 \
        || fail "expected debootstrap $suite to succeed but it failed; see $results/debootstrap.log."
    # The host's apt sources (its mirror), and its CA bundle as local CAs, one file per certificate:
    # update-ca-certificates (run whenever the image's ca-certificates is configured or upgraded) keeps them in
    # /etc/ssl/certs/ca-certificates.crt and hashes each into /etc/ssl/certs, where OpenSSL's default lookup (pip's
    # truststore) finds them; a many-certificate file would be left out of the hashes ("does not contain exactly one
    # certificate") and pip would not trust the proxy.
    rm -f "$rootfs/etc/apt/sources.list"
    cp /etc/apt/sources.list.d/*.sources "$rootfs/etc/apt/sources.list.d/" 2>/dev/null \
        || cp /etc/apt/sources.list "$rootfs/etc/apt/sources.list"
    local cas="$rootfs/usr/local/share/ca-certificates"
    mkdir -p "$cas"
    awk -v dir="$cas" '
        /-----BEGIN CERTIFICATE-----/ { n++; file = sprintf("%s/glm53-build-host-%03d.crt", dir, n) }
        file { print > file }
        /-----END CERTIFICATE-----/ { close(file); file = "" }' /etc/ssl/certs/ca-certificates.crt
    chroot "$rootfs" /usr/sbin/update-ca-certificates >"$results/update-ca-certificates.log" 2>&1
    # The pip that `python3.12 -m venv` brings (ensurepip's, 23.2.1 here) trusts only its own certifi bundle; the
    # Dockerfile's first `pip install pip==...` runs with it. A site-wide pip config points it at the system bundle.
    printf '[global]\ncert = /etc/ssl/certs/ca-certificates.crt\n' >"$rootfs/etc/pip.conf"
    sha256sum /etc/ssl/certs/ca-certificates.crt | cut -c1-16 >"$results/ca-bundle-sha"
    rm -rf "$rootfs"/var/cache/apt/* "$rootfs"/var/lib/apt/lists/* "$rootfs"/usr/share/doc "$rootfs"/usr/share/man
    install_python "$rootfs"

    # Runtime: the base as it is, plus the CUDA runtime library (nvidia/cuda's runtime images carry it).
    cp -a "$rootfs" "$work/runtime-root"
    mkdir -p "$work/runtime-root/usr/local/cuda-13.0/lib64"
    cp -a "$cuda_src"/lib64/libcudart.so* "$work/runtime-root/usr/local/cuda-13.0/lib64/"
    ln -s cuda-13.0 "$work/runtime-root/usr/local/cuda"
    # Devel: the whole toolkit.
    mv "$rootfs" "$work/devel-root"
    cp -a "$cuda_src" "$work/devel-root/usr/local/cuda-13.0"
    ln -s cuda-13.0 "$work/devel-root/usr/local/cuda"
    echo "$(($(now) - started))" >"$results/bases-seconds"
}

import_bases() {
    local path=/usr/local/cuda/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin
    tar -C "$work/devel-root" --numeric-owner -cf - . \
        | "$docker_cli" import --change "ENV PATH=$path" --change "ENV CUDA_HOME=/usr/local/cuda" \
            --change 'CMD ["/bin/bash"]' - "$devel_image" >/dev/null
    tar -C "$work/runtime-root" --numeric-owner -cf - . \
        | "$docker_cli" import --change "ENV PATH=$path" --change 'CMD ["/bin/bash"]' - "$runtime_image" >/dev/null
    rm -rf "$work/devel-root" "$work/runtime-root"
    "$docker_cli" image inspect --format '{{.Size}}' "$devel_image" >"$results/devel-base-bytes"
    "$docker_cli" image inspect --format '{{.Size}}' "$runtime_image" >"$results/runtime-base-bytes"
}

# ---- engine ------------------------------------------------------------------------------------------------------
start_engine() {
    mkdir -p "$state"
    export DOCKER_HOST="unix://$state/docker.sock"
    # Children inherit the niceness: containerd, runc and every RUN step of the builds.
    nice -n "$niceness" /usr/sbin/dockerd --storage-driver=overlay2 --iptables=false --ip6tables=false \
        --bridge=none --data-root="$state/data" --exec-root="$state/exec" --pidfile="$state/dockerd.pid" \
        --host="$DOCKER_HOST" >"$work/dockerd.log" 2>&1 &
    dockerd_pid=$!
    local i
    for i in $(seq 1 120); do
        if "$docker_cli" version >/dev/null 2>&1; then
            log "private dockerd ready (pid $dockerd_pid, data root $state/data)"
            return
        fi
        kill -0 "$dockerd_pid" 2>/dev/null || fail "expected dockerd to start but it exited; see $work/dockerd.log."
        sleep 0.5
        : "$i"
    done
    fail "expected dockerd to answer on $DOCKER_HOST within 60 s but it did not; see $work/dockerd.log."
}

# Peak disk of the daemon's data root, sampled every 20 s while the builds run.
start_sampler() {
    (
        peak=0
        while :; do
            used="$(nice -n 19 du -sxk "$state/data" 2>/dev/null | cut -f1 || echo 0)"
            [ "${used:-0}" -gt "$peak" ] && peak="$used" && echo "$peak" >"$results/peak-data-root-kib"
            sleep 20
        done
    ) &
    sampler_pid=$!
}

stop_engine() {
    if [ -n "$sampler_pid" ]; then
        kill "$sampler_pid" 2>/dev/null || true
        wait "$sampler_pid" 2>/dev/null || true
        sampler_pid=""
    fi
    if [ -n "$dockerd_pid" ] && kill -0 "$dockerd_pid" 2>/dev/null; then
        kill -TERM "$dockerd_pid"
        local i
        for i in $(seq 1 60); do
            kill -0 "$dockerd_pid" 2>/dev/null || break
            sleep 0.5
            : "$i"
        done
        kill -0 "$dockerd_pid" 2>/dev/null && kill -KILL "$dockerd_pid"
        wait "$dockerd_pid" 2>/dev/null || true
    fi
    dockerd_pid=""
}

cleanup() {
    local status=$?
    if [ -n "$dockerd_pid" ] && { [ "$keep" = 1 ] || { [ "$keep" = on-failure ] && [ "$status" -ne 0 ]; }; }; then
        [ -z "$sampler_pid" ] || kill "$sampler_pid" 2>/dev/null || true
        log "GLM53_PROOF_KEEP=1: dockerd (pid $dockerd_pid) left running at DOCKER_HOST=unix://$state/docker.sock; stop it with kill $dockerd_pid, then rm -rf $work"
        exit "$status"
    fi
    stop_engine
    if [ -d "$state" ]; then
        # A mount a killed step left behind must not keep the data root busy.
        grep -o " ${state}[^ ]*" /proc/mounts | sort -r | while read -r mnt; do umount -l "$mnt" 2>/dev/null || true; done
    fi
    [ -d "$work" ] && rm -rf "$work"
    log "daemon stopped and $work removed (exit $status)"
    exit "$status"
}

# Bytes received on every interface but loopback (the builds' RUN steps use the host's network): the build's downloads,
# plus whatever else this machine received meanwhile.
rx_bytes() { awk 'NR > 2 && $1 != "lo:" { sum += $2 } END { printf "%.0f\n", sum }' /proc/net/dev; }

# ---- build through the playbook ----------------------------------------------------------------------------------
playbook() {
    local name="$1" started rx
    local vars="$results/playbook-vars.json"
    [ -e "$vars" ] || "$venv_python" - "$vars" "$devel_image" "$runtime_image" "$max_jobs" "$results/images-report.json" "$docker_cli" <<'EOF'
import json, sys
out, devel, runtime, jobs, report, cli = sys.argv[1:]
json.dump({
    "glm53_images": ["serving"],
    "glm53_docker_cli": cli,
    "glm53_images_build_network": "host",
    "glm53_images_min_free_gb": {"serving": 30},
    "glm53_images_report": report,
    "glm53_images_serving_build_args": {"CUDA_DEVEL_IMAGE": devel, "CUDA_RUNTIME_IMAGE": runtime, "MAX_JOBS": jobs, "FLASHINFER_KERNELS": "none"},
}, open(out, "w"), indent=2)
EOF
    started="$(now)"
    rx="$(rx_bytes)"
    log "ansible-playbook build-images.yml ($name build)"
    local status=0
    (cd "$repo_root/ansible" && ANSIBLE_CONFIG="$repo_root/ansible/ansible.cfg" "$ansible_playbook" build-images.yml \
        -e "@$vars") >"$results/playbook-$name.log" 2>&1 || status=$?
    echo "$(($(now) - started))" >"$results/$name-seconds"
    echo "$(($(rx_bytes) - rx))" >"$results/$name-rx-bytes"
    # Each run's own report: the record compares the revisions the runs stamped.
    [ ! -e "$results/images-report.json" ] || cp "$results/images-report.json" "$results/images-report-$name.json"
    [ "$status" -eq 0 ] || {
        tail -40 "$results/playbook-$name.log" >&2
        fail "expected ansible-playbook build-images.yml ($name) to succeed but it exited $status; see above."
    }
}

# The warm build: the playbook again with a new IMAGE_VERSION, as a toolkit release builds it. The runtime stage
# declares IMAGE_VERSION, so every step of that stage runs again (apt, the venv copy, the LMCache wheel, the toolkit,
# build-info) with the apt and pip cache mounts the cold build filled; the base (vLLM) and build (LMCache compile)
# stages are cache hits. Its received bytes show whether the pip caches are used.
warm_build() {
    local vars="$results/playbook-vars.json"
    "$venv_python" - "$vars" <<'EOF2'
import json, sys
path = sys.argv[1]
values = json.load(open(path))
values["glm53_images_serving_build_args"]["IMAGE_VERSION"] = "warm"
json.dump(values, open(path, "w"), indent=2)
EOF2
    playbook warm
}

main() {
    preflight
    trap cleanup EXIT
    local started
    started="$(now)"
    date -u +%Y-%m-%dT%H:%M:%SZ >"$results/date"
    "$venv_python" "$proof_py" inputs --repo-root "$repo_root" >"$results/inputs-hash"
    make_bases
    start_engine
    start_sampler
    import_bases
    playbook cold
    playbook cached
    "$helm" template glm53 "$repo_root/charts/glm53" --kube-version 1.31.0 >"$results/chart.yaml"
    "$venv_python" "$proof_py" check --repo-root "$repo_root" --docker "$docker_cli" \
        --report "$results/images-report.json" --chart "$results/chart.yaml" --results "$results"
    if [ "$warm" = 1 ]; then
        warm_build
    fi
    du -sxk "$state/data" | cut -f1 >"$results/final-data-root-kib"
    echo "$(($(now) - started))" >"$results/total-seconds"
    "$venv_python" "$proof_py" render --repo-root "$repo_root" --results "$results" --output "$doc"
    log "wrote $doc"
}

main "$@"
