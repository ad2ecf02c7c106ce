"""The stage step's status file, and the verdict its startup probe prints: the standard library only, since the kubelet
runs that probe every few seconds for the whole download.

The stage container rewrites the file (atomically) at every progress tick; `glm53 stage-weights status` reads it and
answers like the engine's startup probe does: exit 0 once the weights are staged and verified, 3 while staging goes on,
4 when the last attempt failed (the container retries by itself; the line says what to fix). The kubelet puts the line
into the pod's events (`Startup probe failed: ...`), which is where an operator looks first.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any

EXIT_DONE = 0
EXIT_NOT_YET = 3
EXIT_FAILED = 4


def write_status(path: Path, record: dict[str, Any]) -> None:
    """Replace the status file with `record` plus the time it was written; readers never see half a file."""
    path.parent.mkdir(parents=True, exist_ok=True)
    temporary = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    temporary.write_text(json.dumps({**record, "updatedAt": time.time()}, sort_keys=True) + "\n")
    os.replace(temporary, path)


def read_status(path: Path) -> tuple[int, str]:
    """(exit code, line) of the probe for the status file at `path`."""
    try:
        record = json.loads(path.read_text())
        phase, line = str(record["phase"]), str(record["line"])
    except FileNotFoundError:
        return EXIT_NOT_YET, f"not yet: the stage step has written no status to {path} yet"
    except (OSError, ValueError, KeyError, TypeError) as error:
        return EXIT_FAILED, f"failed: cannot read the stage step's status {path} ({error}); see its log"
    if phase == "done":
        return EXIT_DONE, line
    if phase == "failed":
        return EXIT_FAILED, f"{line} (retrying by itself; see `kubectl logs -c stage-weights`)"
    return EXIT_NOT_YET, line
