"""`glm53 validate`: the seeds' cold-versus-cached validation protocol against a running vLLM, real or mock.

Exit 0 when every chosen check passes, 1 when one fails, 2 for usage errors and for a server that cannot be validated
(unreachable, dev mode off, a counter missing): those say what to enable in one line.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from pathlib import Path

from glm53.errors import EXIT_FAILURE, EXIT_OK
from glm53.validate.options import build_parser, config_from_args
from glm53.validate.progress import Progress
from glm53.validate.report import ValidationReport, render_text, write_json
from glm53.validate.runner import run_validation


def write_outputs(report: ValidationReport, json_path: Path | None, plot_path: Path | None) -> None:
    if json_path is not None:
        write_json(report, json_path)
    if plot_path is not None:
        from glm53.validate.plot import write_plot

        write_plot(report, plot_path)


def main(argv: Sequence[str]) -> int:
    args = build_parser().parse_args(argv)
    report = run_validation(config_from_args(args), Progress(sys.stderr))
    print(render_text(report))
    write_outputs(report, args.json, args.plot)
    return EXIT_OK if report.passed else EXIT_FAILURE
