# shellcheck shell=bash
# Sourced by the setup scripts (`source "$(dirname "${BASH_SOURCE[0]}")/lib/cache.sh"`): tool environments kept
# outside the clone, keyed by their inputs, and the clone's own tool folder that links to them.
#
# Why: a fresh clone (every CI run) otherwise rebuilds each tool venv from scratch, about 4 minutes of unpacking on
# 2 cores. An environment lives in $GLM53_CACHE_DIR (default ~/.cache/glm53) under a name that hashes everything it
# is built from (its pins and the Python), so a changed pin is a new environment and never a stale one; .tools/ links
# to it. It is complete only once its builder finished (a stamp written last), and is built under a lock, so two runs
# at once build it once. Each setup script still checks its tool answers on every run.
set -euo pipefail  # the sourcing scripts' mode, which cached_venv's builders rely on

# The clone the setup scripts belong to (this file is its scripts/setup.d/lib/cache.sh).
repo_root="$(cd "$(dirname "${BASH_SOURCE[0]}")/../../.." && pwd)"
# Where the tests and scripts/test.sh look for tools (`link_tool`).
tools_bin="$repo_root/.tools/bin"

# The pip every tool environment is upgraded to first (part of each environment's inputs).
GLM53_PIP_PIN="pip==25.3"

glm53_cache_dir() {
    printf '%s\n' "${GLM53_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/glm53}"
}

# cached_venv NAME INPUTS BUILDER LINK: make sure the environment for INPUTS exists (running `BUILDER DIR` to make it
# when it does not), link LINK to it, and set CACHED_VENV to its directory. Call it plainly, not in `$(...)` or a
# condition: there bash would ignore `set -e` inside BUILDER and a failed install could be stamped complete.
cached_venv() {
    local name="$1" inputs="$2" builder="$3" link="$4"
    local key dir lock_fd
    key="$(printf '%s\n%s' "$inputs" "$("${PYTHON:-python3.11}" --version 2>&1)" | sha256sum | cut -c1-16)"
    dir="$(glm53_cache_dir)/venvs/$name-$key"
    mkdir -p "$(dirname "$dir")"
    exec {lock_fd}>"$dir.lock"
    flock "$lock_fd"
    if [ ! -f "$dir/.glm53-complete" ]; then
        rm -rf "$dir"
        "$builder" "$dir" >&2
        touch "$dir/.glm53-complete"
    fi
    flock --unlock "$lock_fd"
    exec {lock_fd}>&-
    mkdir -p "$(dirname "$link")"
    rm -rf "$link"
    ln -sfn "$dir" "$link"
    # shellcheck disable=SC2034  # the sourcing script reads it
    CACHED_VENV="$dir"
}

# new_venv WHO DIR: a fresh virtual environment at DIR, made by $PYTHON (default python3.11), with pip at
# GLM53_PIP_PIN; the first step of cached_venv's Python builders. WHO, the calling script, names the failure when that
# Python is missing.
new_venv() {
    local who="$1" dir="$2" python="${PYTHON:-python3.11}"
    if ! command -v "$python" >/dev/null 2>&1; then
        echo "$who: $python not found; install Python 3.11 or set PYTHON=/path/to/python3.11" >&2
        exit 1
    fi
    "$python" -m venv "$dir"
    venv_install "$dir" "$GLM53_PIP_PIN"
}

# venv_install DIR ARGS...: `pip install ARGS` into the environment at DIR, quietly.
venv_install() {
    local dir="$1"
    shift
    "$dir/bin/python" -m pip install --quiet --disable-pip-version-check "$@"
}

# link_tool TARGET NAME: $tools_bin/NAME, a link to TARGET.
link_tool() {
    mkdir -p "$tools_bin"
    ln -sfn "$1" "$tools_bin/$2"
}

# apt_download WHO DIR PACKAGE=VERSION...: the pinned .debs into DIR, fetched and checked against the signed archive by
# `apt-get download` (nothing is installed). When apt does not know the first package's version it updates its lists,
# as root only; WHO, the calling script, names the failure otherwise. DIR must be writable by apt's sandbox user
# (`_apt`; under /root it is not, and apt warns and fetches as root), so it is handed to that user when there is one.
apt_download() {
    local who="$1" dir="$2"
    shift 2
    local first="$1"
    if [[ "$(apt-cache madison "${first%%=*}")" != *"| ${first#*=} |"* ]]; then
        if [ "$(id -u)" -ne 0 ]; then
            echo "$who: apt knows no $first; run apt-get update as root and rerun" >&2
            exit 1
        fi
        apt-get update -qq
    fi
    if [ "$(id -u)" -eq 0 ] && id _apt >/dev/null 2>&1; then
        chown _apt "$dir"
    fi
    (cd "$dir" && apt-get download -qq "$@")
}
