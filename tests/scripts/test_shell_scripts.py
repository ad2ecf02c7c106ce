"""Every shell entry point in the repository passes shellcheck (from `scripts/setup.d/32-lint-tools.sh`).

The scripts are thin, but they are what a person runs first and what CI runs at all; a quoting bug there breaks the
README's promise before any Python is reached.
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


def shell_scripts() -> list[Path]:
    """Tracked and new files that are shell scripts: `*.sh` and the `.ci/run` entry point."""
    listed = subprocess.run(
        ["git", "ls-files", "--cached", "--others", "--exclude-standard", "*.sh", ".ci/run"],
        cwd=REPO,
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split()
    return sorted(REPO / name for name in listed if (REPO / name).exists())


def test_the_known_entry_points_are_found() -> None:
    names = {path.relative_to(REPO).as_posix() for path in shell_scripts()}
    assert {".ci/run", "scripts/main.sh", "scripts/test.sh", "scripts/bootstrap.sh", "scripts/kind-smoke.sh"} <= names


@pytest.mark.parametrize("script", shell_scripts(), ids=lambda path: path.relative_to(REPO).as_posix())
def test_shellcheck_clean(script: Path) -> None:
    shellcheck = shutil.which("shellcheck")
    if shellcheck is None:
        pytest.fail("shellcheck not found; run `bash scripts/setup.d/32-lint-tools.sh`")
    result = subprocess.run(
        [shellcheck, "--severity=style", "--external-sources", str(script)], cwd=REPO, capture_output=True, text=True
    )
    assert result.returncode == 0, result.stdout + result.stderr


@pytest.mark.parametrize("script", shell_scripts(), ids=lambda path: path.relative_to(REPO).as_posix())
def test_strict_mode(script: Path) -> None:
    assert "set -euo pipefail" in script.read_text(encoding="utf-8"), f"{script} must `set -euo pipefail`"
