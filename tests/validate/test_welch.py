"""Welch's t-test and the incomplete beta function against SciPy, which the serving image does not carry."""

from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy import special, stats

from glm53.errors import Glm53Error
from glm53.validate.stats import regularized_incomplete_beta, welch_t_test

# Millesimal values in [-50, 50]: log-prob-like magnitudes. (Spreads near 1e-160 make SciPy's own df underflow.)
finite = st.integers(min_value=-50_000, max_value=50_000).map(lambda i: i / 1000)
samples = st.lists(finite, min_size=2, max_size=40)


@pytest.mark.filterwarnings("ignore:Precision loss occurred:RuntimeWarning")
@settings(max_examples=300, deadline=None)
@given(samples, samples)
def test_welch_matches_scipy(a: list[float], b: list[float]) -> None:
    expected = stats.ttest_ind(a, b, equal_var=False)
    if not math.isfinite(expected.statistic):
        return  # a constant pair of samples; covered by the degenerate tests below
    result = welch_t_test(a, b)
    assert result.t == pytest.approx(expected.statistic, rel=1e-7, abs=1e-9)
    assert result.df == pytest.approx(expected.df, rel=1e-7)
    assert result.p == pytest.approx(expected.pvalue, rel=1e-6, abs=1e-12)


@pytest.mark.parametrize("seed", range(20))
def test_welch_matches_scipy_on_seed_sized_normal_samples(seed: int) -> None:
    """16 runs per condition around the seed's -0.93 and -0.94, as the equivalence check sees them."""
    rng = stats.norm
    cold = list(rng.rvs(loc=-0.93, scale=0.05, size=16, random_state=seed))
    cached = list(rng.rvs(loc=-0.94, scale=0.05, size=16, random_state=seed + 1000))
    expected = stats.ttest_ind(cold, cached, equal_var=False)
    result = welch_t_test(cold, cached)
    assert (result.t, result.df, result.p) == pytest.approx((expected.statistic, expected.df, expected.pvalue))


@settings(max_examples=300, deadline=None)
@given(
    st.floats(min_value=0.0, max_value=1.0),
    st.floats(min_value=0.05, max_value=200.0),
    st.floats(min_value=0.05, max_value=200.0),
)
def test_incomplete_beta_matches_scipy(x: float, a: float, b: float) -> None:
    assert regularized_incomplete_beta(x, a, b) == pytest.approx(float(special.betainc(a, b, x)), rel=1e-9, abs=1e-13)


def test_identical_constant_samples_are_not_different() -> None:
    """GLM-5.3's greedy runs reproduce each other exactly (seed 001): zero spread, equal means -> p = 1."""
    result = welch_t_test([-0.5] * 16, [-0.5] * 16)
    assert (result.t, result.p) == (0.0, 1.0)


def test_different_constant_samples_differ() -> None:
    result = welch_t_test([-0.5] * 4, [-0.9] * 4)
    assert result.p == 0.0
    assert result.t == math.inf


def test_one_observation_is_refused() -> None:
    with pytest.raises(Glm53Error, match="at least two observations per condition, got 1"):
        welch_t_test([1.0], [1.0, 2.0])


def test_incomplete_beta_outside_unit_interval_is_refused() -> None:
    with pytest.raises(Glm53Error, match=r"needs 0 <= x <= 1, got 1\.5"):
        regularized_incomplete_beta(1.5, 1.0, 1.0)
