"""The slim toolkit never imports torch or LMCache: only the engine stand-in does, and only when it connects.

The probe runs every few seconds in every pod and must start fast (issue: under 150 ms cold); torch alone costs
seconds. `python -X importtime` lists every module a run imported, so a real `glm53 probe` run proves it.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

EXAMPLES = Path(__file__).resolve().parents[2] / "examples" / "logs" / "glm53-flash" / "healthy"
HEAVY = ("torch", "lmcache")


def imported_modules(importtime_stderr: str) -> set[str]:
    """Top-level package names from `-X importtime` lines (`import time: self | cumulative | name`)."""
    names = set()
    for line in importtime_stderr.splitlines():
        if line.startswith("import time:") and "|" in line:
            names.add(line.rsplit("|", 1)[1].strip().split(".")[0])
    return names


def test_a_probe_run_imports_neither_torch_nor_lmcache(tmp_path: Path) -> None:
    probe = ["probe", "startup", "--profile", "glm53-flash", "--chunk-size", "1152", "--state-dir", str(tmp_path)]
    logs = ["--log", str(EXAMPLES / "vllm.log"), "--log", str(EXAMPLES / "lmcache.log")]
    result = subprocess.run(
        [sys.executable, "-X", "importtime", "-m", "glm53", *probe, *logs],
        capture_output=True,
        text=True,
        timeout=60,
    )
    modules = imported_modules(result.stderr)
    assert "glm53" in modules, result.stderr[-2000:]  # the run really happened under -X importtime
    assert not modules & set(HEAVY)


def test_toolkit_modules_including_the_stand_ins_command_import_neither() -> None:
    code = (
        "import sys\n"
        "import glm53.cli, glm53.commands.probe, glm53.commands.exporter, glm53.commands.mock, glm53.commands.pod\n"
        "import glm53.exporter.server, glm53.pod.main_job, glm53.testing.sidecar\n"
        "import glm53.mock.vllm_server, glm53.mock.engine\n"
        f"print(sorted(m for m in sys.modules if m.split('.')[0] in {HEAVY!r}))\n"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "[]"
