"""The progress display: one line per step in logs and pipes, one rewritten line on a terminal."""

from __future__ import annotations

import io

from glm53.validate.progress import Progress


def test_pipe_gets_one_line_per_step() -> None:
    stream = io.StringIO()
    progress = Progress(stream)
    progress.step("boundary: 1/9")
    progress.step("boundary: 2/9")
    progress.done()
    assert stream.getvalue() == "boundary: 1/9\nboundary: 2/9\n"


def test_terminal_line_is_rewritten_in_place_and_ended_once() -> None:
    stream = io.StringIO()
    progress = Progress(stream, in_place=True)
    progress.step("equivalence: cold run 10/16")
    progress.step("perf: 1/16")
    progress.done()
    assert stream.getvalue() == "\requivalence: cold run 10/16\rperf: 1/16                 \n"
