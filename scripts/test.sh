#!/usr/bin/env bash
# The README's second command: set up everything on a fresh machine, then lint, type-check and run the whole suite.
# Extra arguments go to pytest (e.g. `scripts/test.sh -m "not docker"` or `scripts/test.sh tests/test_chunks.py`).
set -euo pipefail

repo_root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$repo_root"
bash scripts/bootstrap.sh dev
# External tools (Helm, linters, the Docker engine, the LMCache build toolchain) install into .tools/, one script a concern.
for setup in scripts/setup.d/*.sh; do
    [ -e "$setup" ] || continue
    echo "== setup: $(basename "$setup")"
    bash "$setup"
done
export PATH="$repo_root/.tools/bin:$repo_root/.venv/bin:$PATH"

echo "== ruff"
ruff check src tests benchmarks docker
ruff format --check src tests benchmarks docker
echo "== mypy"
mypy
echo "== pytest"
# Two workers: much of the suite waits on servers and held-back restarts (tests/conftest.py says what stays together).
# A later `-n 0` in the arguments runs everything in this process.
pytest -n 2 "$@"
