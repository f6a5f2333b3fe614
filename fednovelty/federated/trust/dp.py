"""Differential privacy for summed statistics: clipping, the Gaussian mechanism and its
accounting.

A client's summed statistics of a mixture (``SufficientStats``: counts (K,), first moments
(K, d), second moments (K, d, d)) change by a bounded amount when one row is added or removed,
once every row is clipped to the L2 ball of radius ``bound`` around a public ``centre``
(:func:`clip_rows`): the row's responsibilities sum to 1, so the counts move by at most 1
(L2), the first moments by at most ``bound`` and the second moments by at most ``bound**2``
(Frobenius) - :func:`stats_sensitivities`. Gaussian noise of standard deviation
``noise_multiplier * sensitivity`` on each block (symmetric on the second moments,
:func:`~fednovelty.federated.trust.noise.add_gaussian`, drawn from fresh OS entropy) makes each
round's release a Gaussian mechanism; the budget spent over the rounds is read from
Google's ``dp-accounting`` (:func:`epsilon_spent`, the optional extra ``fednovelty[dp]``),
and :func:`calibrate_noise` finds the multiplier that spends a given ``(epsilon, delta)``.
Post-processing (:func:`positive_counts`, :func:`nearest_psd`) costs no privacy.

Where the noise is added is one switch (:data:`MODES`): ``"central"`` (a trusted server adds it
once to the sum), ``"local"`` (each client adds all of it to its own statistics) or
``"distributed"`` (each of ``m`` clients adds ``1/m`` of the variance, so that the sum carries
the central noise: meant for secure sums, where the server sees only the sum).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import KW_ONLY, dataclass
from typing import Any

import torch
from torch import Tensor

from fednovelty.federated.core.declarations import PRIVATE_RELEASES
from fednovelty.federated.trust.ledger import PrivacyLedger, gaussian_cost, within_budget
from fednovelty.federated.trust.ledger import accounting as _accounting
from fednovelty.federated.trust.noise import NoiseSource, add_gaussian, gaussian, noise_source

#: where the noise is added (module docstring).
MODES = ("central", "local", "distributed")
#: the largest budget :func:`calibrate_noise` calibrates for (beyond it the guarantee is void
#: and the accountant's privacy-loss distribution grows without bound).
MAX_EPSILON = 100.0
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


def gaussian_noise(shape: tuple[int, ...], std: float, like: Tensor, source: NoiseSource) -> Tensor:
    """Independent N(0, std^2) noise of ``shape`` in ``like``'s dtype and device, drawn from
    ``source`` (:mod:`fednovelty.federated.trust.noise`: fresh OS entropy, never a seed)."""
    return gaussian(shape, std, like, source)


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


# --------------------------------------------------------------------------- the policy
@dataclass(frozen=True)
class DPPolicy:
    """A client's differential-privacy settings: its own, never read from a message.

    Every row a private round works on is clipped to the L2 ball of radius ``clip_norm``
    around the origin of the units the round works in (z-scores after a standardisation,
    the public box's units with ``bounds``); every released block of summed statistics gets
    Gaussian noise of ``noise_multiplier`` times its sensitivity (:func:`noise_std`), added
    by the client (``"local"``, ``"distributed"``) or by a trusted server (``"central"``),
    drawn from fresh OS entropy (:mod:`fednovelty.federated.trust.noise`). Every noisy release is
    charged to the client's own ledger (:mod:`fednovelty.federated.trust.ledger`) and refused when
    it would take the client past ``epsilon`` at ``delta``.

    Attributes:
        noise_multiplier: ``z`` >= 0 (0: clipping without noise, no guarantee).
        clip_norm: ``B`` > 0, the L2 radius rows are clipped to.
        mode: one of :data:`MODES`.
        n_clients: ``m`` >= 1, in ``"distributed"`` mode the fewest clients whose replies a
            round's sum holds: each adds ``z / sqrt(m)``, so a sum of ``m' >= m`` replies
            carries at least the noise ``z`` (a sum of fewer carries ``z sqrt(m' / m)``, and
            the fit's ``privacy_spent_`` reports it).
        epsilon: the client's budget (keyword-only; ``None``: no budget, every release
            allowed).
        delta: the budget's delta (keyword-only).
        insecure_seed: TESTING ONLY (keyword-only): draw the noise from this seed
            (:class:`~fednovelty.federated.trust.noise.SeededNoise`) so that two runs compare bit
            for bit. Whoever knows the seed re-draws the noise: such a client has no privacy
            guarantee. ``None`` (the default): fresh OS entropy.

    Raises:
        ValueError: a field out of range, naming it.
    """

    noise_multiplier: float
    clip_norm: float
    mode: str = "central"
    n_clients: int = 1
    _: KW_ONLY
    epsilon: float | None = None
    delta: float = 1e-5
    insecure_seed: int | None = None

    def __post_init__(self) -> None:
        z, bound = self.noise_multiplier, self.clip_norm
        if isinstance(z, bool) or not (isinstance(z, int | float) and math.isfinite(z) and z >= 0):
            raise ValueError(f"DPPolicy.noise_multiplier must be a finite number >= 0; got {z!r}.")
        if isinstance(bound, bool) or not (
            isinstance(bound, int | float) and math.isfinite(bound) and bound > 0
        ):
            raise ValueError(f"DPPolicy.clip_norm must be a positive finite number; got {bound!r}.")
        if self.mode not in MODES:
            raise ValueError(f"DPPolicy.mode must be one of {MODES}; got {self.mode!r}.")
        if (
            isinstance(self.n_clients, bool)
            or not isinstance(self.n_clients, int)
            or (self.n_clients < 1)
        ):
            raise ValueError(f"DPPolicy.n_clients must be an int >= 1; got {self.n_clients!r}.")
        eps = self.epsilon
        if eps is not None and (
            isinstance(eps, bool)
            or not isinstance(eps, int | float)
            or not (math.isfinite(eps) and eps > 0)
        ):
            raise ValueError(
                f"DPPolicy.epsilon must be a positive finite number or None; got {eps!r}."
            )
        if isinstance(self.delta, bool) or not (
            isinstance(self.delta, int | float) and 0 < self.delta < 1
        ):
            raise ValueError(f"DPPolicy.delta must be in (0, 1); got {self.delta!r}.")
        seed = self.insecure_seed
        if seed is not None and (isinstance(seed, bool) or not isinstance(seed, int)):
            raise ValueError(f"DPPolicy.insecure_seed must be an int or None; got {seed!r}.")

    @property
    def client_noise(self) -> float:
        """The multiplier of the noise the client itself adds: ``z`` (local), ``z /
        sqrt(m)`` (distributed), 0 (central: the server adds it to the sum)."""
        if self.mode == "central":
            return 0.0
        return noise_std(self.noise_multiplier, 1.0, self.mode, self.n_clients)

    @property
    def sum_noise(self) -> float:
        """The multiplier of the noise on the sum of all clients' releases: ``z`` (central,
        distributed), ``z * sqrt(m)`` (local, each of ``m`` clients adds ``z``)."""
        if self.mode == "local":
            return self.noise_multiplier * math.sqrt(self.n_clients)
        return self.noise_multiplier


#: the streams of one release's draws: the gate's noise, and the client step's own
#: mechanisms (DP-SGD's samples and noise, a private fit's start, a noisy choice).
GATE_STREAM, STEP_STREAM = 0, 1


def release_noise(
    policy: DPPolicy, client_id: int, release: int, stream: int = GATE_STREAM
) -> NoiseSource:
    """Where one client's ``release``-th noisy release draws from: fresh OS entropy, or
    with the policy's ``insecure_seed`` (tests only) a :class:`SeededNoise` keyed by the
    client, the release and the ``stream`` (:data:`GATE_STREAM`, :data:`STEP_STREAM`), so
    that even a test seed never feeds two mechanisms one stream."""
    return noise_source(policy.insecure_seed, int(client_id), int(release), int(stream))


def charge(
    ledger: PrivacyLedger,
    policy: DPPolicy,
    blocks: float,
    sgd: tuple[float, float, int] | None = None,
) -> PrivacyLedger | None:
    """The client's ``ledger`` after one more noisy release of ``blocks`` Gaussian
    mechanisms of the policy's multiplier ``z`` (and DP-SGD steps ``sgd = (sigma, rate,
    steps)``), or ``None`` when that would take it past the policy's budget. The ledger
    itself is not changed: the caller keeps the result once the release leaves."""
    after = ledger.after(gaussian_cost(policy.noise_multiplier, blocks), sgd)
    return after if within_budget(after, policy.epsilon, policy.delta) else None


# --------------------------------------------------------------------------- statistics
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
    total, squares = n * mean, m2 + n * mean.square()
    z = block_multipliers(multiplier)
    if multiplier > 0:
        n = add_gaussian(n, z["counts"], source)
        total = add_gaussian(total, z["sums"] * bound, source)
        squares = add_gaussian(squares, z["second"] * bound**2, source)
    n = n.clamp_min(1.0)
    mean = total / n
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
    total, outer = n * mean, scatter + n * torch.outer(mean, mean)
    z = block_multipliers(multiplier)
    if multiplier > 0:
        n = add_gaussian(n, z["counts"], source)
        total = add_gaussian(total, z["sums"] * bound, source)
        outer = add_gaussian(outer, z["second"] * bound**2, source, symmetric=True)
    n = n.clamp_min(1.0)
    mean = total / n
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


def plausible_stats(
    stats: Any, bound: float, min_count: float, min_variance: float, second_noise: float = 0.0
) -> Any:
    """Noisy summed statistics post-processed (no privacy cost) into statistics some rows in
    the clipping ball could have produced: counts at least ``min_count``; each component's
    mean inside the ball of radius ``bound`` around the origin; its covariance's
    eigenvalues (variances for ``diag``, the mean variance for ``spherical``) between
    ``min_variance`` and ``bound**2``. The row count is the counts' sum.

    ``second_noise`` (the standard deviation of the noise on each entry of the summed second
    moments) raises each component's floor to the noise's typical spectral norm on its
    covariance, ``2 * second_noise * sqrt(d) / n_k``: a direction whose variance is below the
    noise is not trusted, so a noisy M-step cannot make a thin component that captures a
    slab of rows and starves the others.

    Args:
        stats: ``SufficientStats`` about ``stats.shift`` (d,).
        bound: the clipping radius ``B``; min_count > 0; min_variance > 0;
            second_noise >= 0.
    """
    from dataclasses import replace

    ct = stats.covariance_type
    counts = positive_counts(stats.counts, min_count)
    shift = stats.shift
    means = shift + stats.sums / counts.unsqueeze(1)
    norms = torch.linalg.vector_norm(means, dim=1, keepdim=True)
    means = torch.where(norms > bound, means * (bound / norms.clamp_min(1e-300)), means)
    offsets = means - shift  # the kept means about the shift
    top = float(bound) ** 2
    d = shift.shape[0]
    floors = (2 * second_noise * math.sqrt(d) / counts).clamp(min_variance, top)
    if ct == "full":
        cov = stats.second / counts[:, None, None] - (stats.sums / counts.unsqueeze(1)).unsqueeze(
            2
        ) * (stats.sums / counts.unsqueeze(1)).unsqueeze(1)
        cov = _bounded_eigen(cov, floors, top)
        second = counts[:, None, None] * (cov + offsets.unsqueeze(2) * offsets.unsqueeze(1))
    elif ct == "tied":
        n = counts.sum()
        scatter = stats.second - (stats.sums.T / counts) @ stats.sums
        low = (2 * second_noise * math.sqrt(d) / n).clamp(min_variance, top)
        cov = _bounded_eigen((scatter / n).unsqueeze(0), low.reshape(1), top)[0]
        second = n * cov + (offsets.T * counts) @ offsets
    elif ct == "diag":
        var = stats.second / counts.unsqueeze(1) - (stats.sums / counts.unsqueeze(1)).square()
        var = torch.minimum(torch.maximum(var, floors.unsqueeze(1)), var.new_tensor(top))
        second = counts.unsqueeze(1) * (var + offsets.square())
    else:
        var = stats.second / counts - (stats.sums / counts.unsqueeze(1)).square().sum(1)
        var = torch.minimum(torch.maximum(var, floors * d), var.new_tensor(top))
        second = counts * (var + offsets.square().sum(1))
    return replace(
        stats,
        counts=counts,
        sums=counts.unsqueeze(1) * offsets,
        second=second,
        n_samples=counts.sum().reshape(stats.n_samples.shape),
    )


def _bounded_eigen(matrices: Tensor, low: Tensor, high: float) -> Tensor:
    """Symmetric matrices (k, d, d) with eigenvalues clamped into ``[low_k, high]`` (``low``
    (k,))."""
    symmetric = (matrices + matrices.transpose(-1, -2)) / 2
    values, vectors = torch.linalg.eigh(symmetric)
    values = torch.minimum(torch.maximum(values, low.unsqueeze(-1)), values.new_tensor(high))
    return (vectors * values.unsqueeze(-2)) @ vectors.transpose(-1, -2)


# --------------------------------------------------------------------------- accounting
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


def server_noise(config: Any, rounds: int, stream: int = 0) -> NoiseSource:
    """The draws of the trusted server's ``"central"`` noise in the round after ``rounds``
    counted rounds: fresh OS entropy, or ``config.dp_insecure_seed``'s (tests only), one
    stream per mechanism of the round (``stream``: 0 the statistics, 1 a histogram)."""
    seed = getattr(config, "dp_insecure_seed", None)
    return noise_source(seed, 0xD1FF, int(rounds), int(stream))
