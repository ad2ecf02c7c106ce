"""One PNG with what a person wants to see after validation: log-prob distributions and TTFT per condition.

matplotlib is an optional extra (`glm53[plot]`) that the serving image does not carry, so it is imported only when
`--plot` is given, with the non-interactive Agg backend.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from glm53.errors import Glm53Error
from glm53.validate.report import ValidationReport


def write_plot(report: ValidationReport, path: Path) -> None:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise Glm53Error("--plot needs matplotlib; install the plot extra: pip install 'glm53[plot]'") from None
    figure, (left, right) = plt.subplots(1, 2, figsize=(11, 4.5))
    if report.equivalence is not None:
        series = {
            "cold": [s.logprob for s in report.equivalence.cold],
            "served from LMCache": [s.logprob for s in report.equivalence.cached],
        }
        _strip(left, series, "first-token log-prob")
        left.set_title(f"first-token log-prob per condition (Welch p = {report.equivalence.welch.p:.3g})")
    else:
        _empty(left, "equivalence not run")
    if report.perf is not None:
        series = {
            "cold": [1000 * s.ttft_seconds for s in report.perf.cold],
            "reloaded": [1000 * s.ttft_seconds for s in report.perf.cached],
        }
        _strip(right, series, "TTFT (ms)")
        right.set_title(f"time to first token per condition ({report.perf.ttft_speedup:.2f}x)")
    else:
        _empty(right, "perf not run")
    figure.suptitle(f"{report.model} via {report.base_url}: {'PASS' if report.passed else 'FAIL'}")
    figure.tight_layout()
    try:
        figure.savefig(path, dpi=100)
    except OSError as error:
        raise Glm53Error(f"cannot write the plot to {str(path)!r} ({error}); pick a writable --plot path") from None
    finally:
        plt.close(figure)


def _strip(axes: Any, series: dict[str, list[float]], label: str) -> None:
    """A box per condition with every observation drawn on top, so 16 points are seen, not summarised away."""
    names = list(series)
    axes.boxplot([series[n] for n in names], tick_labels=names, showfliers=False)
    for position, name in enumerate(names, start=1):
        values = series[name]
        offsets = [position + 0.12 * ((i % 5) - 2) / 2 for i in range(len(values))]
        axes.scatter(offsets, values, s=14, alpha=0.7)
    axes.set_ylabel(label)


def _empty(axes: Any, message: str) -> None:
    axes.text(0.5, 0.5, message, ha="center", va="center")
    axes.set_axis_off()
