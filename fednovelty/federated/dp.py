"""Differential privacy for summed statistics: clipping, the Gaussian mechanism and its
accounting.

A client's summed statistics of a mixture (``SufficientStats``: counts (K,), first moments
(K, d), second moments (K, d, d)) change by a bounded amount when one row is added or removed,
once every row is clipped to the L2 ball of radius ``bound`` around a public ``centre``
(:func:`clip_rows`): the row's responsibilities sum to 1, so the counts move by at most 1
(L2), the first moments by at most ``bound`` and the second moments by at most ``bound**2``
(Frobenius) - :func:`stats_sensitivities`. Gaussian noise of standard deviation
``noise_multiplier * sensitivity`` on each block (symmetric on the second moments,
:func:`symmetric_noise`) makes each round's release a Gaussian mechanism; the budget spent over
the rounds is read from Google's ``dp-accounting`` (:func:`epsilon_spent`, the optional extra
``fednovelty[dp]``), and :func:`calibrate_noise` finds the multiplier that spends a given
``(epsilon, delta)``. Post-processing (:func:`positive_counts`, :func:`nearest_psd`) costs no
privacy.

Where the noise is added is one switch (:data:`MODES`): ``"central"`` (a trusted server adds it
once to the sum), ``"local"`` (each client adds all of it to its own statistics) or
``"distributed"`` (each of ``m`` clients adds ``1/m`` of the variance, so that the sum carries
the central noise: meant for secure sums, where the server sees only the sum).
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

#: where the noise is added (module docstring).
MODES = ("central", "local", "distributed")
#: the blocks of summed mixture statistics, each one Gaussian mechanism per round.
STAT_BLOCKS = ("counts", "sums", "second")


def clip_rows(X: Tensor, centre: Tensor, bound: float) -> Tensor:
    """Rows ``X`` (n, d) moved into the L2 ball of radius ``bound`` around ``centre`` (d,):
    a row farther out is scaled towards the centre onto the sphere; rows inside are kept.

    Raises:
        ValueError: ``bound`` not a positive finite number, or ``centre`` not (d,).
    """
    if not (isinstance(bound, int | float) and math.isfinite(bound) and bound > 0):
        raise ValueError(f"bound must be a positive finite number (an L2 radius); got {bound!r}.")
    if centre.shape != X.shape[1:]:
        raise ValueError(
            f"centre must have shape ({X.shape[1]},), one value per feature; got "
            f"{tuple(centre.shape)}."
        )
    offset = X - centre
    norms = torch.linalg.vector_norm(offset, dim=1, keepdim=True)
    scale = bound / norms.clamp_min(torch.finfo(X.dtype).tiny)
    return torch.where(norms > bound, centre + offset * scale, X)


def stats_sensitivities(bound: float) -> dict[str, float]:
    """The add/remove-one-row L2 sensitivity of each block of summed mixture statistics of
    rows clipped to radius ``bound`` around the centre the statistics are taken about:
    counts 1, first moments ``bound``, second moments ``bound**2`` (Frobenius)."""
    return {"counts": 1.0, "sums": float(bound), "second": float(bound) ** 2}


def noise_std(noise_multiplier: float, sensitivity: float, mode: str, n_clients: int = 1) -> float:
    """The standard deviation of the noise one party adds to a block of L2 ``sensitivity``:
    ``noise_multiplier * sensitivity`` (``"central"``, ``"local"``), or that over
    ``sqrt(n_clients)`` for each of ``n_clients`` clients (``"distributed"``: the sum carries
    the central noise).

    Raises:
        ValueError: an unknown ``mode``, a negative multiplier or sensitivity, or fewer than
            one client.
    """
    if mode not in MODES:
        raise ValueError(f"mode must be one of {MODES}; got {mode!r}.")
    if noise_multiplier < 0 or sensitivity < 0:
        raise ValueError(
            f"noise_multiplier and sensitivity must be >= 0; got {noise_multiplier!r}, "
            f"{sensitivity!r}."
        )
    if n_clients < 1:
        raise ValueError(f"n_clients must be >= 1; got {n_clients!r}.")
    std = float(noise_multiplier) * float(sensitivity)
    return std / math.sqrt(n_clients) if mode == "distributed" else std


def gaussian_noise(shape: tuple[int, ...], std: float, like: Tensor, generator=None) -> Tensor:
    """Independent N(0, std^2) noise of ``shape`` in ``like``'s dtype and device."""
    noise = torch.randn(shape, generator=generator, dtype=torch.float64)
    return (noise * std).to(dtype=like.dtype, device=like.device)


def symmetric_noise(shape: tuple[int, ...], std: float, like: Tensor, generator=None) -> Tensor:
    """Noise for symmetric matrices (..., d, d): the upper triangle (diagonal included)
    N(0, std^2) independently, mirrored below, so a noisy second moment stays symmetric and
    the noise on the released upper triangle is the Gaussian mechanism's."""
    upper = torch.triu(gaussian_noise(shape, std, like, generator))
    return upper + upper.transpose(-1, -2) - torch.diag_embed(upper.diagonal(dim1=-2, dim2=-1))


def positive_counts(counts: Tensor, floor: float) -> Tensor:
    """Noisy counts (K,) kept at least ``floor`` (> 0): post-processing, no privacy cost."""
    return counts.clamp_min(floor)


def nearest_psd(matrices: Tensor, min_eigenvalue: float) -> Tensor:
    """Symmetric matrices (..., d, d) with every eigenvalue raised to at least
    ``min_eigenvalue`` (the nearest such matrix in Frobenius norm): a noisy covariance made
    positive definite by post-processing."""
    symmetric = (matrices + matrices.transpose(-1, -2)) / 2
    values, vectors = torch.linalg.eigh(symmetric)
    values = values.clamp_min(min_eigenvalue)
    return (vectors * values.unsqueeze(-2)) @ vectors.transpose(-1, -2)


# --------------------------------------------------------------------------- accounting
def _accounting():
    try:
        import dp_accounting
        from dp_accounting.pld import pld_privacy_accountant
    except ImportError:  # pragma: no cover - the extra is installed in the test environment
        raise ImportError(
            "differential privacy accounting needs Google's dp-accounting: "
            "pip install 'fednovelty[dp]'."
        ) from None
    return dp_accounting, pld_privacy_accountant


def epsilon_spent(
    noise_multiplier: float, rounds: int, delta: float, blocks: int = len(STAT_BLOCKS)
) -> float:
    """The epsilon that ``rounds`` releases spend at ``delta``, each release ``blocks``
    Gaussian mechanisms of multiplier ``noise_multiplier`` (one per block of statistics),
    read from dp-accounting's privacy-loss-distribution accountant. ``inf`` without noise.

    ``blocks`` mechanisms of multiplier ``z`` on disjoint blocks are one Gaussian mechanism of
    multiplier ``z / sqrt(blocks)`` on their concatenation (each block scaled by its
    sensitivity), which is what is composed.

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
    accountant = pld.PLDAccountant()
    event = dp_accounting.GaussianDpEvent(noise_multiplier / math.sqrt(blocks))
    accountant.compose(event, count=int(rounds))
    return float(accountant.get_epsilon(delta))


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
        ValueError: ``epsilon`` not positive and finite, or the arguments
            :func:`epsilon_spent` refuses.
    """
    if not (math.isfinite(epsilon) and epsilon > 0):
        raise ValueError(f"epsilon must be a positive finite number; got {epsilon!r}.")
    low, high = 0.0, 1.0
    while epsilon_spent(high, rounds, delta, blocks) > epsilon:
        low, high = high, high * 2
    while high - low > tolerance * high:
        middle = (low + high) / 2
        if epsilon_spent(middle, rounds, delta, blocks) > epsilon:
            low = middle
        else:
            high = middle
    return high
