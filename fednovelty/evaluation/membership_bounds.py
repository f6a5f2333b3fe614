"""The bounds differential privacy puts on any membership-inference attack.

A mechanism that is ``mu``-GDP (Dong, Roth and Su 2022) lets no attack's ROC rise above
``TPR = Phi(mu - Phi^-1(1 - FPR))`` (:func:`gdp_roc`), whose area is ``Phi(mu / sqrt 2)``
(:func:`gdp_auc_bound`); ``rounds`` releases of ``blocks`` Gaussian mechanisms of multiplier
``z`` are ``sqrt(rounds * blocks) / z``-GDP (:func:`gdp_mu`), and an ``(epsilon, delta)``
budget of a Gaussian mechanism fixes ``mu`` (:func:`gdp_mu_for_epsilon`). Any
``(epsilon, delta)``-DP mechanism keeps
``TPR <= min(e^eps FPR + delta, 1 - e^-eps (1 - delta - FPR))`` (Kairouz, Oh and
Viswanath 2015; :func:`dp_roc_bound`), whose area is :func:`dp_auc_bound`: looser than the
GDP bound of the same budget, since it holds for every mechanism. Both bound the test of one
fixed row added or removed; the usual members-vs-held-out AUC of one model compares a member
with a non-member, a replacement (two add/remove steps) apart, and is bounded by ``Phi(mu)``
(:func:`gdp_heldout_auc_bound`) or its ``(epsilon, delta)`` form
(:func:`dp_heldout_auc_bound`). The attacks these bound are in
:mod:`fednovelty.evaluation.membership`.
"""

from __future__ import annotations

import math

import numpy as np
from scipy.optimize import brentq
from scipy.stats import norm

from fednovelty.federated.trust.dp_split import STAT_BLOCKS


# --------------------------------------------------------------------------- bounds
def gdp_mu(noise_multiplier: float, rounds: int = 1, blocks: int = len(STAT_BLOCKS)) -> float:
    """The ``mu`` of ``rounds`` releases of ``blocks`` Gaussian mechanisms, each of noise
    ``noise_multiplier`` times its sensitivity: ``sqrt(rounds * blocks) / noise_multiplier``
    (``inf`` without noise).

    Raises:
        ValueError: a negative multiplier, ``rounds`` < 1 or ``blocks`` < 1.
    """
    if noise_multiplier < 0 or rounds < 1 or blocks < 1:
        raise ValueError(
            "noise_multiplier must be >= 0 and rounds, blocks >= 1; got "
            f"{noise_multiplier!r}, {rounds!r}, {blocks!r}."
        )
    return math.inf if noise_multiplier == 0 else math.sqrt(rounds * blocks) / noise_multiplier


def gdp_delta(mu: float, epsilon: float) -> float:
    """The ``delta`` a ``mu``-GDP mechanism spends at ``epsilon`` (Dong, Roth and Su,
    Corollary 2.13): ``Phi(-eps/mu + mu/2) - e^eps Phi(-eps/mu - mu/2)`` (the second term
    taken in log space, so a large ``epsilon`` does not overflow)."""
    tail = math.exp(epsilon + float(norm.logcdf(-epsilon / mu - mu / 2)))
    return float(norm.cdf(-epsilon / mu + mu / 2) - tail)


def gdp_mu_for_epsilon(epsilon: float, delta: float) -> float:
    """The ``mu`` of the Gaussian mechanism that spends exactly ``(epsilon, delta)``
    (:func:`gdp_delta` solved for ``mu``; ``inf`` for ``epsilon = inf``).

    Raises:
        ValueError: ``epsilon`` not positive or ``delta`` outside (0, 1).
    """
    if not epsilon > 0 or not 0 < delta < 1:
        raise ValueError(f"epsilon must be > 0 and delta in (0, 1); got {epsilon!r}, {delta!r}.")
    if math.isinf(epsilon):
        return math.inf
    high = 1.0
    while gdp_delta(high, epsilon) < delta:
        high *= 2
    return float(brentq(lambda mu: gdp_delta(mu, epsilon) - delta, 1e-9, high, xtol=1e-12))


def gdp_roc(mu: float, fpr: np.ndarray) -> np.ndarray:
    """The best ROC against a ``mu``-GDP mechanism: ``TPR = Phi(mu - Phi^-1(1 - FPR))``,
    same shape as ``fpr``."""
    return norm.cdf(mu - norm.ppf(1 - np.asarray(fpr, dtype=float)))


def gdp_auc_bound(mu: float) -> float:
    """The area under :func:`gdp_roc`: ``Phi(mu / sqrt 2)`` (1 for ``mu = inf``), the largest
    AUC any membership attack reaches against a ``mu``-GDP mechanism.

    Raises:
        ValueError: ``mu`` negative.
    """
    if not mu >= 0:
        raise ValueError(f"mu must be >= 0; got {mu!r}.")
    return 1.0 if math.isinf(mu) else float(norm.cdf(mu / math.sqrt(2)))


def dp_roc_bound(epsilon: float, delta: float, fpr: np.ndarray) -> np.ndarray:
    """The largest TPR at each ``fpr`` against any ``(epsilon, delta)``-DP mechanism:
    ``min(1, e^eps FPR + delta, 1 - e^-eps (1 - delta - FPR))``, same shape as ``fpr``."""
    fpr = np.asarray(fpr, dtype=float)
    if math.isinf(epsilon):
        return np.ones_like(fpr)
    grow = math.exp(epsilon) * fpr + delta
    tail = 1 - math.exp(-epsilon) * (1 - delta - fpr)
    return np.minimum(1.0, np.minimum(grow, tail))


def dp_auc_bound(epsilon: float, delta: float) -> float:
    """The area under :func:`dp_roc_bound` (exact: the curve is linear between its knots at
    FPR = 0, ``(1 - delta) / (1 + e^eps)``, ``1 - delta`` and 1).

    Raises:
        ValueError: ``epsilon`` negative or ``delta`` outside [0, 1).
    """
    if not epsilon >= 0 or not 0 <= delta < 1:
        raise ValueError(f"epsilon must be >= 0 and delta in [0, 1); got {epsilon!r}, {delta!r}.")
    if math.isinf(epsilon):
        return 1.0
    knots = np.array([0.0, (1 - delta) / (1 + math.exp(epsilon)), 1 - delta, 1.0])
    values = dp_roc_bound(epsilon, delta, knots)
    return float(np.sum((values[1:] + values[:-1]) / 2 * np.diff(knots)))


def gdp_heldout_auc_bound(mu: float) -> float:
    """``Phi(mu)`` (1 for ``mu = inf``): the largest expected AUC of an attack that scores
    one model's training rows against held-out rows of the same distribution (the usual
    loss-attack evaluation, :func:`score_attack`), when the model is ``mu``-GDP under adding
    or removing a row.

    Why: for a member ``x`` and a non-member ``x'`` the comparison ``T = s(x) - s(x')`` of
    their scores tests ``D' + {x}`` against ``D' + {x'}``, datasets one replacement (two
    add/remove steps) apart, hence ``2 mu``-GDP apart; by exchangeability ``T > 0`` has
    true-positive rate ``A`` (the AUC) and false-positive rate ``1 - A``, and the point
    ``(1 - A, A)`` under the concave curve ``Phi(2 mu - Phi^-1(1 - FPR))`` gives
    ``Phi^-1(A) <= mu``. Looser than :func:`gdp_auc_bound` (``Phi(mu / sqrt 2)``), which
    bounds the add/remove test of one fixed row.

    Raises:
        ValueError: ``mu`` negative.
    """
    if not mu >= 0:
        raise ValueError(f"mu must be >= 0; got {mu!r}.")
    return 1.0 if math.isinf(mu) else float(norm.cdf(mu))


def dp_heldout_auc_bound(epsilon: float, delta: float) -> float:
    """The bound of :func:`gdp_heldout_auc_bound` for any ``(epsilon, delta)``-DP model:
    replacing a row is ``(2 eps, (1 + e^eps) delta)``-DP (group privacy), and the point
    ``(1 - A, A)`` inside that region gives ``A <= (e^(2 eps) + delta') / (1 + e^(2 eps))``
    with ``delta' = (1 + e^eps) delta`` (1 for ``epsilon = inf``).

    Raises:
        ValueError: ``epsilon`` negative or ``delta`` outside [0, 1).
    """
    if not epsilon >= 0 or not 0 <= delta < 1:
        raise ValueError(f"epsilon must be >= 0 and delta in [0, 1); got {epsilon!r}, {delta!r}.")
    if math.isinf(epsilon) or epsilon > 300:
        return 1.0
    grown, spread = math.exp(2 * epsilon), (1 + math.exp(epsilon)) * delta
    return float(min(1.0, (grown + spread) / (1 + grown)))
