"""The Gaussian mechanism on summed statistics, and the clipping that bounds its sensitivity.

A client's summed statistics of a mixture (``SufficientStats``: counts (K,), first moments
(K, d), second moments (K, d, d)) change by a bounded amount when one row is added or removed,
once every row is clipped to the L2 ball of radius ``bound`` around a public ``centre``
(:func:`clip_rows`): the row's responsibilities sum to 1, so the counts move by at most 1
(L2), the first moments by at most ``bound`` and the second moments by at most ``bound**2``
(Frobenius) - :func:`stats_sensitivities`. Gaussian noise of standard deviation
``noise_multiplier * sensitivity`` times the block's share of the release
(:mod:`~fednovelty.federated.trust.dp_split`) on each block (symmetric on the second moments,
:func:`~fednovelty.federated.trust.noise.add_gaussian`, drawn from fresh OS entropy) makes each
round's release a Gaussian mechanism.

A client's reply goes through :func:`private_reply`, which picks the mechanism of its private
form (:func:`noisy_stats`, :func:`noisy_moments`, :func:`noisy_scatter`); a trusted server's
noise on the sum over clients, or a private local fit's on its own statistics, through
:func:`private_sum`. :func:`recentre_stats` moves statistics between shifts (exact algebra).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import torch
from torch import Tensor

from fednovelty.federated.core.declarations import PRIVATE_RELEASES
from fednovelty.federated.trust.dp_split import block_multipliers
from fednovelty.federated.trust.noise import NoiseSource, add_gaussian, gaussian


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


def gaussian_noise(shape: tuple[int, ...], std: float, like: Tensor, source: NoiseSource) -> Tensor:
    """Independent N(0, std^2) noise of ``shape`` in ``like``'s dtype and device, drawn from
    ``source`` (:mod:`fednovelty.federated.trust.noise`: fresh OS entropy, never a seed)."""
    return gaussian(shape, std, like, source)


def recentre_stats(
    counts: Tensor, sums: Tensor, second: Tensor, delta: Tensor, covariance_type: str
) -> tuple[Tensor, Tensor]:
    """Statistics about a shift ``s`` re-expressed about ``t = s - delta``: rows ``v = x -
    s`` become ``v + delta``. Exact algebra on the sums, no rows needed.

    Args:
        counts: (K,); sums: (K, d) about ``s``; second: about ``s``, by ``covariance_type``
            (full (K, d, d), tied (d, d), diag (K, d), spherical (K,)).
        delta: ``s - t``, (d,).

    Returns:
        ``(sums, second)`` about ``t``, of the same shapes.
    """
    moved = sums + counts.unsqueeze(1) * delta
    if covariance_type == "full":
        cross = sums.unsqueeze(2) * delta + delta.unsqueeze(1) * sums.unsqueeze(1)
        return moved, second + cross + counts[:, None, None] * torch.outer(delta, delta)
    if covariance_type == "tied":
        total = sums.sum(0)
        cross = torch.outer(total, delta) + torch.outer(delta, total)
        return moved, second + cross + counts.sum() * torch.outer(delta, delta)
    if covariance_type == "diag":
        return moved, second + 2 * sums * delta + counts.unsqueeze(1) * delta.square()
    return moved, second + 2 * sums @ delta + counts * delta.square().sum()


def noisy_stats(
    tensors: Mapping[str, Tensor],
    shift: Tensor,
    covariance_type: str,
    multiplier: float,
    bound: float,
    source: NoiseSource,
    split: Mapping[str, float] | None = None,
) -> dict[str, Tensor]:
    """A stats reply's tensors with the Gaussian mechanism applied: the statistics are moved
    about the clipping centre (the origin), each block gets noise of ``multiplier`` times its
    sensitivity (:func:`stats_sensitivities`) and share (``split`` brought to ``sum_b 1 /
    s_b^2 = 3`` by :func:`block_multipliers`; ``None``: :data:`BLOCK_SPLIT`; symmetric on
    full and tied second moments),
    and they are moved back about ``shift``. The row count becomes the noisy counts' sum and
    the log-likelihood is withheld (0): a per-row log-likelihood has no bound.

    Args:
        tensors: ``counts`` (K,), ``sums`` (K, d), ``second``, ``n_samples`` (),
            ``log_likelihood`` () about ``shift`` (d,).
        multiplier: the client's noise multiplier (:attr:`DPPolicy.client_noise`).
        bound: the clipping radius ``B`` of the rows behind them.
        split: the blocks' shares (:func:`normalised_split`), or ``None``.

    Returns:
        The same names and shapes.
    """
    counts, sums, second = tensors["counts"], tensors["sums"], tensors["second"]
    zero = torch.zeros_like(shift)
    sums, second = recentre_stats(counts, sums, second, shift - zero, covariance_type)
    sens, z = stats_sensitivities(bound), block_multipliers(multiplier, split)
    if multiplier > 0:
        counts = add_gaussian(counts, z["counts"] * sens["counts"], source)
        sums = add_gaussian(sums, z["sums"] * sens["sums"], source)
        spread = z["second"] * sens["second"]
        second = add_gaussian(second, spread, source, symmetric=covariance_type in ("full", "tied"))
    sums, second = recentre_stats(counts, sums, second, zero - shift, covariance_type)
    out = dict(tensors)
    out.update(counts=counts, sums=sums, second=second)
    out["n_samples"] = counts.sum().clamp_min(0).reshape(tensors["n_samples"].shape)
    out["log_likelihood"] = torch.zeros_like(tensors["log_likelihood"])
    return out


def _noisy_sums(
    n: Tensor,
    total: Tensor,
    second: Tensor,
    multiplier: float,
    bound: float,
    source: NoiseSource,
    symmetric: bool = False,
) -> tuple[Tensor, Tensor, Tensor]:
    """The Gaussian mechanism on a row count ``n`` (), a sum of rows ``total`` (d,) and a
    sum of squares (d,) or of outer products (d, d; ``symmetric`` noise) ``second``, all
    about the origin, at sensitivities 1, ``bound`` and ``bound**2`` (block multipliers of
    ``multiplier``); the noisy count kept at least 1 (post-processing). Returns the count,
    the mean ``total / n`` (d,) and the noisy ``second``."""
    z = block_multipliers(multiplier)
    if multiplier > 0:
        n = add_gaussian(n, z["counts"], source)
        total = add_gaussian(total, z["sums"] * bound, source)
        second = add_gaussian(second, z["second"] * bound**2, source, symmetric=symmetric)
    n = n.clamp_min(1.0)
    return n, total / n, second


def noisy_moments(
    tensors: Mapping[str, Tensor],
    multiplier: float,
    bound: float,
    source: NoiseSource,
) -> dict[str, Tensor]:
    """A moments reply (``n_samples`` (), ``mean`` (d,), ``m2`` (d,): the row count, mean and
    sum of squared deviations) with the Gaussian mechanism applied to its sums about the
    origin: the count (sensitivity 1), the sum of rows (``B``) and the sum of squared
    values (``B**2``: a row's squares have L2 norm at most ``||x||^2``). The noisy count is
    kept at least 1 (post-processing) and the mean and ``m2`` rebuilt from the noisy sums,
    so that merging replies adds the noisy sums exactly."""
    n, mean, m2 = tensors["n_samples"], tensors["mean"], tensors["m2"]
    n, mean, squares = _noisy_sums(n, n * mean, m2 + n * mean.square(), multiplier, bound, source)
    return {**tensors, "n_samples": n, "mean": mean, "m2": squares - n * mean.square()}


def noisy_scatter(
    tensors: Mapping[str, Tensor],
    multiplier: float,
    bound: float,
    source: NoiseSource,
) -> dict[str, Tensor]:
    """A scatter reply (``n_samples`` (), ``mean`` (d,), ``scatter`` (d, d): the row count,
    mean and sum of outer products of deviations from the mean) with the Gaussian mechanism
    applied to its sums about the origin, as :func:`noisy_moments` does: the count (1), the
    sum of rows (``B``) and the sum of outer products (``B**2``, symmetric noise); the count
    is kept at least 1 and the mean and scatter rebuilt from the noisy sums."""
    n, mean, scatter = tensors["n_samples"], tensors["mean"], tensors["scatter"]
    outer = scatter + n * torch.outer(mean, mean)
    n, mean, outer = _noisy_sums(n, n * mean, outer, multiplier, bound, source, symmetric=True)
    return {**tensors, "n_samples": n, "mean": mean, "scatter": outer - n * torch.outer(mean, mean)}


def private_reply(
    release: str,
    tensors: Mapping[str, Tensor],
    broadcast: Any,
    covariance_type: str | None,
    multiplier: float,
    bound: float,
    source: NoiseSource,
) -> dict[str, Tensor]:
    """The tensors of a reply of release kind ``release`` (:data:`PRIVATE_RELEASES`) with
    the client's noise added (``multiplier`` 0: only the log-likelihood withheld and the row
    count derived from the counts, for a server that adds the noise)."""
    if release == "stats":
        shift = broadcast.tensors["shift"].to(tensors["sums"].device, tensors["sums"].dtype)
        return noisy_stats(tensors, shift, covariance_type, multiplier, bound, source)
    if release == "moments":
        return noisy_moments(tensors, multiplier, bound, source)
    if release == "scatter":
        return noisy_scatter(tensors, multiplier, bound, source)
    if release == "fit":  # the client half fitted under the policy's mechanism
        return dict(tensors)
    raise ValueError(f"unknown private release {release!r}; one of {PRIVATE_RELEASES}.")


def private_sum(
    stats: Any,
    multiplier: float,
    bound: float,
    source: NoiseSource,
    split: Mapping[str, float] | None = None,
) -> Any:
    """``SufficientStats`` (about ``stats.shift``) through the Gaussian mechanism of
    :func:`noisy_stats` (the blocks' shares ``split``, ``None``: :data:`BLOCK_SPLIT`): the
    trusted server's noise on the sum over clients (``"central"`` mode), or a client's on
    its own statistics (a private local fit)."""
    from dataclasses import replace

    tensors = {
        "counts": stats.counts,
        "sums": stats.sums,
        "second": stats.second,
        "n_samples": stats.n_samples,
        "log_likelihood": stats.log_likelihood,
    }
    out = noisy_stats(tensors, stats.shift, stats.covariance_type, multiplier, bound, source, split)
    return replace(stats, **out)
