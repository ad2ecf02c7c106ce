"""Welch's unequal-variance t-test in pure Python, the statistic the seed's equivalence check reports.

The serving image carries no SciPy, and the test is small: the t statistic, the Welch-Satterthwaite degrees of freedom
and a two-sided p-value from Student's t distribution, written through the regularized incomplete beta function
(evaluated with its continued fraction). Tests compare every number with `scipy.stats.ttest_ind(equal_var=False)`.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from glm53.errors import Glm53Error

_CF_MAX_TERMS = 400
_CF_EPSILON = 3e-16
_TINY = 1e-300


@dataclass(frozen=True)
class Sample:
    """Mean, unbiased variance and size of one condition's observations."""

    mean: float
    variance: float
    n: int

    @classmethod
    def of(cls, values: Sequence[float]) -> Sample:
        """Mean and unbiased (n-1) variance; at least two values are needed for a variance."""
        n = len(values)
        if n < 2:
            raise Glm53Error(f"a t-test needs at least two observations per condition, got {n}")
        mean = math.fsum(values) / n
        variance = math.fsum((v - mean) ** 2 for v in values) / (n - 1)
        return cls(mean, variance, n)


@dataclass(frozen=True)
class WelchResult:
    """Welch's t-test of condition a against condition b."""

    a: Sample
    b: Sample
    t: float
    df: float
    p: float


def welch_t_test(a: Sequence[float], b: Sequence[float]) -> WelchResult:
    """Two-sided Welch's t-test; identical constant samples give p = 1, different constant samples p = 0."""
    sa, sb = Sample.of(a), Sample.of(b)
    qa, qb = sa.variance / sa.n, sb.variance / sb.n
    se2 = qa + qb
    if se2 == 0.0:
        # Both conditions reproduced one value exactly (GLM-5.3's greedy runs do): no spread to test against.
        if sa.mean == sb.mean:
            return WelchResult(sa, sb, 0.0, sa.n + sb.n - 2.0, 1.0)
        return WelchResult(sa, sb, math.copysign(math.inf, sa.mean - sb.mean), sa.n + sb.n - 2.0, 0.0)
    t = (sa.mean - sb.mean) / math.sqrt(se2)
    # Welch-Satterthwaite, written with the shares of se2 so tiny variances cannot underflow to 0/0.
    ra, rb = qa / se2, qb / se2
    df = 1.0 / (ra**2 / (sa.n - 1) + rb**2 / (sb.n - 1))
    return WelchResult(sa, sb, t, df, student_t_two_sided_p(t, df))


def student_t_two_sided_p(t: float, df: float) -> float:
    """P(|T| >= |t|) for Student's t with `df` degrees of freedom: I_{df/(df+t^2)}(df/2, 1/2)."""
    if df <= 0:
        raise Glm53Error(f"degrees of freedom must be positive, got {df}")
    if math.isinf(t):
        return 0.0
    return regularized_incomplete_beta(df / (df + t * t), df / 2.0, 0.5)


def regularized_incomplete_beta(x: float, a: float, b: float) -> float:
    """I_x(a, b) for 0 <= x <= 1 and a, b > 0.

    The continued fraction converges quickly for x < (a+1)/(a+b+2); above that the symmetry I_x(a,b) = 1 - I_{1-x}(b,a)
    moves the evaluation into the fast region.
    """
    if not 0.0 <= x <= 1.0:
        raise Glm53Error(f"the incomplete beta function needs 0 <= x <= 1, got {x}")
    if x in (0.0, 1.0):
        return x
    log_front = math.lgamma(a + b) - math.lgamma(a) - math.lgamma(b) + a * math.log(x) + b * math.log1p(-x)
    if x < (a + 1.0) / (a + b + 2.0):
        return math.exp(log_front) * _beta_continued_fraction(x, a, b) / a
    return 1.0 - math.exp(log_front) * _beta_continued_fraction(1.0 - x, b, a) / b


def _beta_continued_fraction(x: float, a: float, b: float) -> float:
    """The continued fraction of I_x(a, b), evaluated with the modified Lentz method."""

    def nonzero(value: float) -> float:
        return value if abs(value) >= _TINY else _TINY

    c = 1.0
    d = 1.0 / nonzero(1.0 - (a + b) * x / (a + 1.0))
    fraction = d
    for m in range(1, _CF_MAX_TERMS + 1):
        even = m * (b - m) * x / ((a + 2 * m - 1) * (a + 2 * m))
        odd = -(a + m) * (a + b + m) * x / ((a + 2 * m) * (a + 2 * m + 1))
        for coefficient in (even, odd):
            d = 1.0 / nonzero(1.0 + coefficient * d)
            c = nonzero(1.0 + coefficient / c)
            fraction *= c * d
        if abs(c * d - 1.0) < _CF_EPSILON:
            return fraction
    raise Glm53Error(f"the incomplete beta continued fraction did not converge for x={x}, a={a}, b={b}")
