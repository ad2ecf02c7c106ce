#!/usr/bin/env bash
# The README's second command: set up everything on a fresh machine, then lint, type-check and run the whole suite.
# Extra arguments go to pytest (e.g. `scripts/test.sh -m "not docker"` or `scripts/test.sh tests/test_chunks.py`).
# The run ends with a budget report (tests/support/budget.py): the wall time of set-up, lint and pytest, and the slowest tests.
set -euo pipefail

repo_root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$repo_root"
started=$SECONDS
# The LMCache source build is the suite's longest item (17-24 min on 2 cores when it is not cached): its toolchain
# first and, for the whole suite, the build itself in the background (scripts/lmcache_wheel.py, cached outside the clone
# by its inputs), so that on a cold machine the compile overlaps the downloads below; its test waits for it.
lmcache_toolchain=scripts/setup.d/50-lmcache-build.sh
echo "== setup: $(basename "$lmcache_toolchain")"
bash "$lmcache_toolchain"
if [ $# -eq 0 ]; then
    nice -n 10 "${PYTHON:-python3.11}" scripts/lmcache_wheel.py --start
fi
bash scripts/bootstrap.sh dev
# External tools (Helm, linters, the Docker engine) install into .tools/, one script a concern.
for setup in scripts/setup.d/*.sh; do
    [ "$setup" != "$lmcache_toolchain" ] || continue
    echo "== setup: $(basename "$setup")"
    bash "$setup"
done
export PATH="$repo_root/.tools/bin:$repo_root/.venv/bin:$PATH"
setup_s=$((SECONDS - started))

echo "== ruff"
ruff check src tests benchmarks docker scripts
ruff format --check src tests benchmarks docker scripts
echo "== mypy"
# mypy's incremental cache kept outside the clone (35 s cold, 2 s warm on 2 cores): mypy keys it by its own version
# and options and checks every module's source hash on each run, so a changed file is checked again, never trusted.
MYPY_CACHE_DIR="${GLM53_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/glm53}/mypy" mypy
lint_s=$((SECONDS - started - setup_s))

echo "== pytest"
# Two workers: much of the suite waits on servers and held-back restarts (tests/conftest.py says what stays together).
# A later `-n 0` in the arguments runs everything in this process.
GLM53_BUDGET_PHASES="setup=$setup_s lint=$lint_s" pytest -n 2 "$@"
