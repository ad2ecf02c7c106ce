"""Entry point: `python3 benchmarks/gpu_proof COMMAND ...` (or `python -m gpu_proof`); see the package's docstring."""

from __future__ import annotations

import sys
from pathlib import Path

PACKAGE_DIR = Path(__file__).resolve().parent
# The one sys.path edit, and why: the GPU host runs this with a bare python3 (no venv, glm53 not installed), and
# `python3 benchmarks/gpu_proof` puts this folder itself first on sys.path, where the package's modules would shadow
# top-level ones (`server`, `stats`). So: benchmarks/ (this package under its own name; the TP rank processes it
# spawns inherit the path) and the repository's src/ (glm53) first, this folder not at all.
sys.path[:] = [str(PACKAGE_DIR.parent), str(PACKAGE_DIR.parents[1] / "src")] + [
    p for p in sys.path if Path(p or ".").resolve() != PACKAGE_DIR
]

from gpu_proof.cli import main  # noqa: E402

if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
