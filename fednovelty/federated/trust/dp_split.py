"""How one release's privacy budget is split over the blocks of summed statistics.

A release of summed mixture statistics is one Gaussian mechanism per block
(:data:`STAT_BLOCKS`: counts, first moments, second moments). Block ``b`` gets noise of
multiplier ``z * s_b`` with ``sum_b 1 / s_b^2 = 3``, so that every split spends what three
blocks of multiplier ``z`` do and only how the noise falls on the blocks differs:
:data:`BLOCK_SPLIT` is the default, :func:`normalised_split` brings any proposal to that sum
and :func:`block_multipliers` gives each block's multiplier.

:func:`split_coefficients`, :func:`split_error`, :func:`optimal_split` and
:func:`stats_split` state a noisy M-step's first-order error under a split and the split
that minimises it (``benchmarks/dp_split.txt`` compares the splits).
"""

from __future__ import annotations

import math
from collections.abc import Mapping

#: the blocks of summed mixture statistics, each one Gaussian mechanism per round.
STAT_BLOCKS = ("counts", "sums", "second")


#: how one release's budget is split over its blocks: block ``b`` gets noise of multiplier
#: ``z * BLOCK_SPLIT[b]``, and ``sum_b 1 / BLOCK_SPLIT[b]^2 = 3``, so a release spends what
#: three blocks of multiplier ``z`` do (:func:`epsilon_spent` with ``blocks=3``). Counts and
#: first moments of many rows need little precision beside second moments, whose
#: sensitivity ``B**2`` dominates a covariance's error, so they give most of their share.
#: The split that minimises a noisy M-step's first-order error (:func:`stats_split`) gives
#: the first moments more; it does better only where a component's rows outweigh the noise
#: on its covariance (``benchmarks/dp_split.txt``). With fewer rows the server's floor on
#: the counts (twice their noise) shrinks noisy means towards the clipping centre, and this
#: split's noisier counts do better there; it stays the default.
BLOCK_SPLIT: dict[str, float] = {
    "counts": 8.0,
    "sums": 2.5,
    "second": 1 / math.sqrt(3 - 1 / 64 - 1 / 6.25),
}


def normalised_split(proposal: Mapping[str, float]) -> dict[str, float]:
    """A split of one release's budget (block -> share ``s_b``) scaled so that ``sum_b 1 /
    s_b^2 = 3``: whatever ``proposal`` says (a server's, a formula's), a release under the
    result is the Gaussian mechanism of three blocks of multiplier ``z`` (same ``mu``, same
    accounting); only how the noise falls on the blocks follows the proposal's ratios.

    Args:
        proposal: a positive finite share for each of :data:`STAT_BLOCKS`, no other key.

    Raises:
        ValueError: a block missing or extra, or a share that is not a positive finite
            number.
    """
    if set(proposal) != set(STAT_BLOCKS):
        raise ValueError(f"a split needs exactly the blocks {STAT_BLOCKS}; got {sorted(proposal)}.")
    shares = {}
    for block in STAT_BLOCKS:
        share = proposal[block]
        if isinstance(share, bool) or not (
            isinstance(share, int | float) and math.isfinite(share) and share > 0
        ):
            raise ValueError(f"split[{block!r}] must be a positive finite number; got {share!r}.")
        shares[block] = float(share)
    scale = math.sqrt(sum(1 / share**2 for share in shares.values()) / len(STAT_BLOCKS))
    return {block: share * scale for block, share in shares.items()}


def split_coefficients(
    n_features: int,
    n_components: int,
    mean_sq: float | None = None,
    variance: float | None = None,
) -> dict[str, float]:
    """The weight ``A_b`` of each block's noise in the expected error of a noisy M-step:
    the expected KL divergence from the true mixture to the one the M-step computes from
    noisy counts, first and second moments is, to first order in the noise,
    ``(z / n_k)^2 * sum_b A_b * s_b^2`` for components of ``n_k`` rows each (block ``b``
    noised with multiplier ``z * s_b``, :func:`block_multipliers`). In units of the clipping
    radius (``B = 1``), for a component of mean ``mu`` (about the clipping centre, ``|mu|^2
    = mean_sq``) and covariance ``v I`` (``v = variance``) in ``d = n_features`` dimensions
    and ``K = n_components`` equal weights:

    - counts: ``(K - 1) / (2 K)`` (the weights) ``+ |mu|^2 / (2 v)`` (the mean, divided by a
      noisy count) ``+ |mu mu^T - v I|_F^2 / (4 v^2)`` (the covariance, likewise);
    - first moments: ``d / (2 v)`` (the mean) ``+ (d + 1) |mu|^2 / (2 v^2)`` (the covariance:
      second moments about the centre minus the noisy mean's outer product);
    - second moments: ``d^2 / (4 v^2)`` (symmetric noise on ``d^2`` entries).

    ``n_k`` divides every term alike, so the split that minimises the error does not depend
    on the row count at first order, only on ``d``, ``K`` and where the components lie. The
    default ``mean_sq`` and ``variance`` need no rows: ``K`` components tiling the cube of
    half-width ``1 / sqrt(d)`` whose corners touch the clipping sphere (``|mu|^2 = 1 / 3``,
    ``v = K^(-2/d) / (3 d)``: a uniform cell centre and a uniform cell's variance).

    Raises:
        ValueError: ``n_features`` or ``n_components`` < 1, or a non-positive ``mean_sq``
            or ``variance``.
    """
    d, k = int(n_features), int(n_components)
    if d < 1 or k < 1:
        raise ValueError(
            f"n_features and n_components must be >= 1; got {n_features!r}, {n_components!r}."
        )
    mu2 = 1 / 3 if mean_sq is None else float(mean_sq)
    v = k ** (-2 / d) / (3 * d) if variance is None else float(variance)
    if not (mu2 > 0 and v > 0 and math.isfinite(mu2) and math.isfinite(v)):
        raise ValueError(
            f"mean_sq and variance must be positive finite numbers; got {mean_sq!r}, {variance!r}."
        )
    spread = mu2**2 - 2 * v * mu2 + d * v * v  # |mu mu^T - v I|_F^2
    return {
        "counts": (k - 1) / (2 * k) + mu2 / (2 * v) + spread / (4 * v * v),
        "sums": d / (2 * v) + (d + 1) * mu2 / (2 * v * v),
        "second": d * d / (4 * v * v),
    }


def split_error(split: Mapping[str, float], coefficients: Mapping[str, float]) -> float:
    """``sum_b A_b s_b^2``: the first-order error of a noisy M-step under ``split`` per unit
    ``(z / n_k)^2`` (:func:`split_coefficients`)."""
    return float(sum(coefficients[b] * split[b] ** 2 for b in STAT_BLOCKS))


def optimal_split(coefficients: Mapping[str, float]) -> dict[str, float]:
    """The split that minimises :func:`split_error` subject to ``sum_b 1 / s_b^2 = 3``: by
    Lagrange, ``A_b s_b^2 = lambda / s_b^2``, so block ``b``'s budget ``1 / s_b^2`` is
    ``3 sqrt(A_b) / sum_c sqrt(A_c)`` and the error ``(sum_b sqrt(A_b))^2 / 3``.

    Raises:
        ValueError: a block missing or a coefficient not a positive finite number.
    """
    roots = {}
    for block in STAT_BLOCKS:
        value = coefficients.get(block)
        if value is None or not (math.isfinite(value) and value > 0):
            raise ValueError(
                f"coefficients[{block!r}] must be a positive finite number; got {value!r}."
            )
        roots[block] = math.sqrt(value)
    total = sum(roots.values())
    return {b: math.sqrt(total / (len(STAT_BLOCKS) * root)) for b, root in roots.items()}


def stats_split(n_features: int, n_components: int) -> dict[str, float]:
    """The split of a summed-statistics release of ``n_components`` components in
    ``n_features`` dimensions that minimises the M-step's first-order error with the
    row-free reference of :func:`split_coefficients`: public numbers only."""
    return optimal_split(split_coefficients(n_features, n_components))


def block_multipliers(
    noise_multiplier: float, split: Mapping[str, float] | None = None
) -> dict[str, float]:
    """The noise multiplier of each block of one release: ``noise_multiplier`` times the
    block's share of ``split`` brought to ``sum_b 1 / s_b^2 = 3`` (:func:`normalised_split`;
    ``None``: :data:`BLOCK_SPLIT`)."""
    shares = BLOCK_SPLIT if split is None else normalised_split(split)
    return {block: noise_multiplier * share for block, share in shares.items()}
