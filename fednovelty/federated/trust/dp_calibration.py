"""The epsilon a plan of Gaussian releases spends, and the noise that spends a given budget.

``rounds`` releases of ``blocks`` Gaussian mechanisms of multiplier ``z`` compose exactly into
one Gaussian mechanism (Gaussian differential privacy): :func:`epsilon_spent` reads its
epsilon from Google's ``dp-accounting`` (the optional extra ``fednovelty[dp]``), and
:func:`calibrate_noise` finds the smallest multiplier whose plan spends at most
``(epsilon, delta)``, for budgets up to :data:`MAX_EPSILON`. A plan is what a fit schedules
before it starts; what a client has actually released is charged to its own ledger
(:mod:`~fednovelty.federated.trust.ledger`).
"""

from __future__ import annotations

import math

from fednovelty.federated.trust.dp_split import STAT_BLOCKS
from fednovelty.federated.trust.ledger import accounting as _accounting

#: the largest budget :func:`calibrate_noise` calibrates for (beyond it the guarantee is void
#: and the accountant's privacy-loss distribution grows without bound).
MAX_EPSILON = 100.0


def epsilon_spent(
    noise_multiplier: float,
    rounds: int,
    delta: float,
    blocks: int = len(STAT_BLOCKS),
    resolution: float = 1e-4,
) -> float:
    """The epsilon that ``rounds`` releases spend at ``delta``, each release ``blocks``
    Gaussian mechanisms of multiplier ``noise_multiplier`` (one per block of statistics),
    read from dp-accounting's privacy-loss-distribution accountant. ``inf`` without noise.

    ``blocks`` mechanisms of multiplier ``z`` on disjoint blocks are one Gaussian mechanism of
    multiplier ``z / sqrt(blocks)`` on their concatenation (each block scaled by its
    sensitivity), and ``rounds`` Gaussian mechanisms compose exactly into one of multiplier
    ``z / sqrt(blocks * rounds)`` (Dong, Roth and Su's Gaussian differential privacy,
    Corollary 3.3): the accountant reads that one mechanism, which is tight and fast.

    ``resolution`` is the accountant's discretisation of the privacy loss (pessimistic: a
    coarser one reads a slightly larger epsilon, never a smaller one).

    Raises:
        ValueError: ``rounds`` < 0, ``blocks`` < 1 or ``delta`` outside (0, 1).
    """
    if rounds < 0 or blocks < 1:
        raise ValueError(f"rounds must be >= 0 and blocks >= 1; got {rounds!r}, {blocks!r}.")
    if not 0 < delta < 1:
        raise ValueError(f"delta must be in (0, 1); got {delta!r}.")
    if rounds == 0:
        return 0.0
    if noise_multiplier <= 0:
        return math.inf
    dp_accounting, pld = _accounting()
    accountant = pld.PLDAccountant(value_discretization_interval=resolution)
    event = dp_accounting.GaussianDpEvent(noise_multiplier / math.sqrt(blocks * rounds))
    accountant.compose(event)
    return float(accountant.get_epsilon(delta))


def _gdp_mu(epsilon: float, delta: float) -> float:
    """The ``mu`` of the Gaussian mechanism that is exactly ``(epsilon, delta)``-DP (Balle
    and Wang's analytic Gaussian mechanism, in Dong, Roth and Su's mu-GDP form), by
    bisection on ``delta(mu) = Phi(-eps/mu + mu/2) - e^eps Phi(-eps/mu - mu/2)``: the
    starting bracket of :func:`calibrate_noise`."""

    from scipy.special import log_ndtr, ndtr

    def delta_of(mu: float) -> float:  # e^eps Phi(x) as exp(eps + log Phi(x)): no overflow
        first = float(ndtr(-epsilon / mu + mu / 2))
        return first - math.exp(min(epsilon + float(log_ndtr(-epsilon / mu - mu / 2)), 700.0))

    low, high = 1e-6, 1.0
    while delta_of(high) < delta:
        high *= 2
    for _ in range(100):
        middle = (low + high) / 2
        low, high = (middle, high) if delta_of(middle) < delta else (low, middle)
    return low


def calibrate_noise(
    epsilon: float,
    delta: float,
    rounds: int,
    blocks: int = len(STAT_BLOCKS),
    tolerance: float = 1e-3,
) -> float:
    """The smallest noise multiplier (within ``tolerance``, relative) whose ``rounds``
    releases of ``blocks`` Gaussian mechanisms spend at most ``epsilon`` at ``delta``
    (:func:`epsilon_spent`), by bisection.

    Raises:
        ValueError: ``epsilon`` not in ``(0, MAX_EPSILON]``, or the arguments
            :func:`epsilon_spent` refuses.
    """
    if not (math.isfinite(epsilon) and 0 < epsilon <= MAX_EPSILON):
        raise ValueError(
            f"epsilon must be in (0, {MAX_EPSILON:g}]; got {epsilon!r} (a larger epsilon "
            "promises nothing; fit without differential privacy instead)."
        )

    def spent(z: float) -> float:  # the search reads a coarser (pessimistic) accountant
        return epsilon_spent(z, rounds, delta, blocks, resolution=1e-3)

    guess = math.sqrt(blocks * max(rounds, 1)) / _gdp_mu(epsilon, delta)
    low, high = 0.98 * guess, 1.02 * guess  # a bracket only: the accountant decides
    while spent(high) > epsilon:
        low, high = high, high * 1.5
    while low > 0 and spent(low) <= epsilon:
        high, low = low, low / 1.5
    while high - low > tolerance * high:
        middle = (low + high) / 2
        if spent(middle) > epsilon:
            low = middle
        else:
            high = middle
    while epsilon_spent(high, rounds, delta, blocks) > epsilon:  # the accountant of record
        high *= 1 + tolerance
    return high
