"""The budget report's last lines name each failed phase and what failed, as CI's truncated log keeps only its tail."""

from __future__ import annotations

from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]

pytest_plugins = ["pytester"]


def test_a_failed_run_ends_with_one_line_per_failure(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PYTHONPATH", str(REPO))
    pytester.makepyfile(
        test_sample="""
        import pytest

        def test_ok():
            pass

        def test_assertion():
            values = [1, 2]
            assert len(values) == 3, "two values"

        @pytest.fixture
        def broken():
            raise RuntimeError("no server\\nsecond line")

        def test_setup_error(broken):
            pass
        """
    )
    result = pytester.runpytest_subprocess("-p", "tests.support.budget", "-p", "no:cacheprovider")
    lines = result.outlines
    failures = [line for line in lines if line.startswith("budget: failed: ")]
    assert failures == [
        "budget: failed: test_sample.py::test_assertion (call): AssertionError: two values | assert 2 == 3 | "
        "+  where 2 = len([1, 2])",
        "budget: failed: test_sample.py::test_setup_error (setup): RuntimeError: no server | second line",
    ]
    assert lines[-2:] == failures  # the report's very last lines
