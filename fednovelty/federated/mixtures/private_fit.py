"""A differentially private local Gaussian-mixture fit: DP-EM (Park, Foulds, Chaudhuri and
Welling, AISTATS 2017) for the one-shot methods, whose clients fit a mixture on their own rows
and upload it once (FedGenGMM, the local baseline).

The fit works on the rows minus a public ``centre``, clipped once to the L2 ball of radius
``clip_norm`` around it (sensitivities 1, ``B`` and ``B**2``). Every EM iteration releases
the E-step's summed statistics through the Gaussian mechanism of
:mod:`fednovelty.federated.trust.dp_mechanism` (:func:`noisy_release`, a thin wrapper of
:func:`~fednovelty.federated.trust.dp_mechanism.noisy_stats`: the budget of one release is
split over the blocks by :data:`~fednovelty.federated.trust.dp_split.BLOCK_SPLIT`), and the
noisy sums are post-processed at no privacy cost by
:func:`~fednovelty.federated.trust.dp_postprocess.plausible_stats` (counts floored, means in
the ball, covariance eigenvalues between the noise's typical spectral norm on a covariance
and ``B**2``) before the M-step.

``n_iter`` iterations are ``n_iter`` releases, each spending what three Gaussian mechanisms
of multiplier ``z`` do (:attr:`PrivateFitInfo.accounting` for
:func:`~fednovelty.federated.trust.dp_calibration.epsilon_spent`). The stopping rule is the
fixed ``n_iter`` (a rule on the log-likelihood would cost budget) and the start is public
(:func:`public_init`: farthest points among random points in the ball, no row read).
Uploading the final mixture is post-processing, and so is :attr:`PrivateFitInfo.noisy_rows`
(the sum of the last release's noisy counts), the row count to send beside it. What it costs
is in ``docs/differential_privacy.md``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

import torch
from torch import Tensor

from fednovelty.federated.trust.dp_calibration import calibrate_noise, epsilon_spent
from fednovelty.federated.trust.dp_mechanism import clip_rows, private_sum
from fednovelty.federated.trust.dp_postprocess import plausible_stats
from fednovelty.federated.trust.dp_split import BLOCK_SPLIT, STAT_BLOCKS
from fednovelty.federated.trust.noise import NoiseSource, fresh_noise
from fednovelty.mixture import CovariancePrior, MixtureParams
from fednovelty.mixture.covariance import check_covariance_type
from fednovelty.mixture.stats import SufficientStats, e_step_stats, m_step

#: the initialisations :func:`private_em` accepts by name.
INITS = ("public", "random")
#: random candidate points per component among which ``"public"`` picks spread means.
CANDIDATES_PER_COMPONENT = 64


@dataclass(frozen=True)
class PrivateFitInfo:
    """What a DP-EM fit spent and how.

    Attributes:
        n_iter: EM iterations run (noisy releases of the statistics).
        noise_multiplier: the noise std over each block's sensitivity.
        blocks: Gaussian mechanisms per iteration (counts, first and second moments: 3).
        clip_norm: the L2 radius the rows were clipped to.
        n_clipped: rows that lay outside the ball (known to the client only; not released).
        noisy_rows: the sum of the last release's noisy counts (at least 0): a row count
            that is post-processing of the releases (the true count is not).
        delta: the delta the budget is stated at (``None`` unless a budget was asked for).
        epsilon: :func:`~fednovelty.federated.trust.dp_calibration.epsilon_spent` at ``delta``
            (``None`` without ``delta``; ``inf`` without noise).
    """

    n_iter: int
    noise_multiplier: float
    blocks: int
    clip_norm: float
    n_clipped: int
    noisy_rows: float = 0.0
    delta: float | None = None
    epsilon: float | None = None

    @property
    def accounting(self) -> tuple[float, int, int]:
        """``(noise_multiplier, rounds, blocks)`` for ``epsilon_spent``."""
        return self.noise_multiplier, self.n_iter, self.blocks

    def epsilon_at(self, delta: float) -> float:
        """The epsilon this fit spent at ``delta``."""
        return epsilon_spent(self.noise_multiplier, self.n_iter, delta, self.blocks)


# --------------------------------------------------------------------------- checks
def _positive_number(value, name: str, what: str) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise ValueError(f"{name} must be a positive finite number ({what}); got {value!r}.")
    if value <= 0:
        raise ValueError(f"{name} must be a positive finite number ({what}); got {value!r}.")
    return float(value)


def _check_arguments(X, n_components, noise_multiplier, n_iter, reg_covar, prior) -> None:
    if not isinstance(X, Tensor) or X.ndim != 2 or not X.is_floating_point():
        shape = tuple(X.shape) if isinstance(X, Tensor) else type(X).__name__
        raise ValueError(
            f"X must be a floating-point tensor of shape (n_samples, n_features); got {shape}."
        )
    if not bool(torch.isfinite(X).all()):
        raise ValueError("X has NaN or infinite values; impute or drop those rows first.")
    if isinstance(n_components, bool) or not isinstance(n_components, int) or n_components < 1:
        raise ValueError(f"n_components must be a positive int; got {n_components!r}.")
    if isinstance(n_iter, bool) or not isinstance(n_iter, int) or n_iter < 1:
        raise ValueError(
            f"n_iter must be a positive int (the fixed number of noisy EM iterations); "
            f"got {n_iter!r}."
        )
    if (
        isinstance(noise_multiplier, bool)
        or not isinstance(noise_multiplier, int | float)
        or not math.isfinite(noise_multiplier)
        or noise_multiplier < 0
    ):
        raise ValueError(
            "noise_multiplier must be a finite number >= 0 (noise std over sensitivity; "
            f"0 for no privacy); got {noise_multiplier!r}."
        )
    if not (isinstance(reg_covar, int | float) and math.isfinite(reg_covar) and reg_covar >= 0):
        raise ValueError(f"reg_covar must be a finite number >= 0; got {reg_covar!r}.")
    if prior is not None and not isinstance(prior, CovariancePrior):
        raise ValueError(f"prior must be a CovariancePrior or None; got {type(prior).__name__}.")
    if prior is not None and prior.scale.shape != (X.shape[1],):
        raise ValueError(
            f"prior.scale must have shape ({X.shape[1]},), one variance per feature; got "
            f"{tuple(prior.scale.shape)}."
        )


def _public_centre(centre, X: Tensor) -> Tensor:
    d = X.shape[1]
    if centre is None:
        return X.new_zeros(d)
    centre = torch.as_tensor(centre, dtype=X.dtype, device=X.device)
    if centre.shape != (d,):
        raise ValueError(
            f"centre must have shape ({d},), one value per feature (a public point, not "
            f"computed from the rows); got {tuple(centre.shape)}."
        )
    if not bool(torch.isfinite(centre).all()):
        raise ValueError("centre has NaN or infinite values.")
    return centre


# --------------------------------------------------------------------------- initialisation
def _uniform_in_ball(
    n: int, d: int, radius: float, source: NoiseSource | torch.Generator, like: Tensor
) -> Tensor:
    """``n`` points uniform in the L2 ball of ``radius`` around 0, shape (n, d), drawn from
    a noise source or (a public start, which reads no row) a torch generator."""
    if isinstance(source, torch.Generator):
        direction = torch.randn(n, d, generator=source, dtype=torch.float64)
        uniform = torch.rand(n, 1, generator=source, dtype=torch.float64)
    else:
        direction, uniform = source.normal((n, d)), source.uniform((n, 1))
    direction = direction / torch.linalg.vector_norm(direction, dim=1, keepdim=True)
    radii = radius * uniform ** (1.0 / d)
    return (direction * radii).to(dtype=like.dtype, device=like.device)


def _farthest_points(candidates: Tensor, k: int) -> Tensor:
    """``k`` rows of ``candidates`` (m, d) chosen greedily, each the farthest from those chosen
    (the first is the candidate farthest from the candidates' centre, 0)."""
    chosen = [int(torch.linalg.vector_norm(candidates, dim=1).argmax())]
    distance = torch.linalg.vector_norm(candidates - candidates[chosen[0]], dim=1)
    for _ in range(1, k):
        chosen.append(int(distance.argmax()))
        distance = torch.minimum(
            distance, torch.linalg.vector_norm(candidates - candidates[chosen[-1]], dim=1)
        )
    return candidates[chosen]


def _init_covariances(variance: float, k: int, d: int, covariance_type: str, like: Tensor):
    eye = torch.eye(d, dtype=like.dtype, device=like.device)
    if covariance_type == "full":
        return variance * eye.expand(k, d, d).clone()
    if covariance_type == "tied":
        return variance * eye
    if covariance_type == "diag":
        return like.new_full((k, d), variance)
    return like.new_full((k,), variance)


def public_init(
    n_components: int,
    n_features: int,
    *,
    clip_norm: float,
    centre: Tensor,
    covariance_type: str = "full",
    how: str = "public",
    source: NoiseSource | torch.Generator | None = None,
) -> MixtureParams:
    """Starting parameters that depend only on public values (the clip ball), never on rows.

    Means (n_components, n_features): ``"public"`` picks them by farthest-point selection
    among ``CANDIDATES_PER_COMPONENT * n_components`` points uniform in the ball of radius
    ``clip_norm / 2`` around ``centre`` (spread apart, inside where clipped rows lie);
    ``"random"`` draws them uniform in that ball. Weights are equal; every covariance is
    ``(clip_norm / 2)**2 / n_features`` times the identity (per-feature spread of the half ball),
    so the first E-step splits the rows softly by nearness. dtype and device of ``centre``.

    Raises:
        ValueError: an unknown ``how`` or ``covariance_type``.
    """
    check_covariance_type(covariance_type)
    if how not in INITS:
        raise ValueError(f"init must be one of {INITS} or a MixtureParams; got {how!r}.")
    k, d, radius = n_components, n_features, clip_norm / 2
    source = fresh_noise() if source is None else source
    if how == "public":
        candidates = _uniform_in_ball(CANDIDATES_PER_COMPONENT * k, d, radius, source, centre)
        offsets = _farthest_points(candidates, k)
    else:
        offsets = _uniform_in_ball(k, d, radius, source, centre)
    weights = centre.new_full((k,), 1.0 / k)
    covariances = _init_covariances(radius**2 / d, k, d, covariance_type, centre)
    return MixtureParams.from_covariances(weights, centre + offsets, covariances, covariance_type)


# --------------------------------------------------------------------------- one iteration
def noisy_release(
    stats: SufficientStats,
    *,
    noise_multiplier: float,
    clip_norm: float,
    source: NoiseSource | None = None,
) -> SufficientStats:
    """One noisy release: ``stats`` of rows clipped to radius ``clip_norm`` around the origin,
    taken about the origin (``stats.shift`` must be zeros: :func:`private_em` works on rows
    minus the public centre), through :func:`fednovelty.federated.trust.dp_mechanism.private_sum`.
    Block ``b`` (counts (K,), sums (K, d), second moments) gets N(0, (z * BLOCK_SPLIT[b] *
    sensitivity_b)^2) per entry (sensitivities 1, ``clip_norm``, ``clip_norm**2``; symmetric
    on full and tied second moments); the log-likelihood is withheld (0) and ``n_samples`` is
    the sum of the noisy counts (at least 0), so nothing un-noised leaves.

    Raises:
        ValueError: ``stats.shift`` not zero (the sensitivities hold about the clip centre).
    """
    if bool(stats.shift.ne(0).any()):
        raise ValueError(
            "noisy_release needs statistics about the clip centre (shift zero); take them "
            "on rows minus the public centre."
        )
    source = fresh_noise() if source is None else source
    return private_sum(stats, float(noise_multiplier), float(clip_norm), source)


def second_moment_noise(noise_multiplier: float, clip_norm: float) -> float:
    """The standard deviation of the noise on one entry of a released second moment:
    ``z * BLOCK_SPLIT["second"] * clip_norm**2``."""
    return float(noise_multiplier) * BLOCK_SPLIT["second"] * float(clip_norm) ** 2


# --------------------------------------------------------------------------- the fit
def private_em(
    X: Tensor,
    n_components: int,
    *,
    noise_multiplier: float,
    clip_norm: float,
    centre: Tensor | None = None,
    n_iter: int = 10,
    covariance_type: str = "full",
    reg_covar: float = 1e-6,
    prior: CovariancePrior | None = None,
    init: str | MixtureParams = "public",
    min_count: float = 1.0,
    min_variance: float | None = None,
    noise_floor: float = 1.0,
    source: NoiseSource | None = None,
    init_generator: torch.Generator | None = None,
) -> tuple[MixtureParams, PrivateFitInfo]:
    """DP-EM: ``n_iter`` EM iterations on rows ``X`` whose summed statistics are released with
    Gaussian noise each iteration (module docstring), from a public start.

    Args:
        X: rows in the working units, shape (n_samples, n_features); its dtype and device are
            the fit's.
        n_components: K.
        noise_multiplier: noise std over each block's sensitivity (0: plain EM on clipped rows).
        clip_norm: the public L2 radius B rows are clipped to around ``centre``.
        centre: public centre of the clip ball and of the moments, shape (n_features,);
            zeros by default.
        n_iter: the fixed number of iterations (each one release of three blocks).
        covariance_type: ``full``, ``tied``, ``diag`` or ``spherical``.
        reg_covar: added to every covariance's diagonal (as scikit-learn).
        prior: optional :class:`~fednovelty.mixture.CovariancePrior` (MAP M-steps), which
            keeps a component backed by few noisy rows near its target shape.
        init: ``"public"`` / ``"random"`` (:func:`public_init`) or given starting parameters
            (which must not have been computed from the rows without being accounted for).
        min_count: floor of every noisy count (> 0), in rows.
        min_variance: floor of every covariance eigenvalue before ``reg_covar`` is added
            (> 0); ``reg_covar`` by default (``1e-12 * clip_norm**2`` if that is 0).
        noise_floor: scales the noise-aware eigenvalue floor of
            :func:`~fednovelty.federated.trust.dp_postprocess.plausible_stats` (``2 * sigma *
            sqrt(d) / n_k``, ``sigma`` the noise's std on a second-moment entry,
            :func:`second_moment_noise`); 1 is that floor, 0 turns it off.
        source: the draws of the noise (:mod:`fednovelty.federated.trust.noise`); ``None``: fresh
            OS entropy.
        init_generator: the draws of the public start (it reads no row, so ``random_state``
            may seed it); ``None``: ``source``'s.

    Returns:
        ``(params, info)``: the final :class:`~fednovelty.mixture.MixtureParams` (dtype and
        device of ``X``) and :class:`PrivateFitInfo` (``accounting`` for ``epsilon_spent``).

    Raises:
        ValueError: an argument of the wrong type, shape or range (the message names it).
    """
    _check_arguments(X, n_components, noise_multiplier, n_iter, reg_covar, prior)
    clip_norm = _positive_number(clip_norm, "clip_norm", "the public L2 radius of the rows")
    min_count = _positive_number(min_count, "min_count", "the floor of a noisy count, in rows")
    if min_variance is None:
        min_variance = float(reg_covar) if reg_covar > 0 else 1e-12 * clip_norm**2
    min_variance = _positive_number(min_variance, "min_variance", "an eigenvalue floor")
    if not (
        isinstance(noise_floor, int | float) and math.isfinite(noise_floor) and noise_floor >= 0
    ):
        raise ValueError(
            f"noise_floor must be a finite number >= 0 (eigenvalue floor in units of the "
            f"noise's std on a covariance entry); got {noise_floor!r}."
        )
    check_covariance_type(covariance_type)
    centre = _public_centre(centre, X)
    d = X.shape[1]
    if isinstance(init, MixtureParams):
        if init.means.shape != (n_components, d) or init.covariance_type != covariance_type:
            raise ValueError(
                f"init must have {n_components} components of {d} features and covariance "
                f"type {covariance_type!r}; got means {tuple(init.means.shape)}, "
                f"{init.covariance_type!r}."
            )
        params = init.to(device=X.device, dtype=X.dtype)
    elif isinstance(init, str):
        params = public_init(
            n_components,
            d,
            clip_norm=clip_norm,
            centre=centre,
            covariance_type=covariance_type,
            how=init,
            source=source if init_generator is None else init_generator,
        )
    else:
        raise ValueError(f"init must be one of {INITS} or a MixtureParams; got {init!r}.")
    origin = torch.zeros_like(centre)
    rows = clip_rows(X - centre, origin, clip_norm)  # the fit's frame: the centre is 0
    n_clipped = int((torch.linalg.vector_norm(X - centre, dim=1) > clip_norm).sum())
    params = _moved(params, -centre)
    second_noise = float(noise_floor) * second_moment_noise(noise_multiplier, clip_norm)
    noisy_rows = 0.0
    for _ in range(n_iter):
        stats = e_step_stats(
            rows,
            params.weights.log(),
            params.means,
            params.precisions_cholesky,
            covariance_type,
            origin,
        )
        released = noisy_release(
            stats, noise_multiplier=noise_multiplier, clip_norm=clip_norm, source=source
        )
        noisy_rows = float(released.n_samples)
        kept = plausible_stats(released, clip_norm, min_count, min_variance, second_noise)
        weights, means, cov = m_step(kept, float(reg_covar), prior)
        params = MixtureParams.from_covariances(
            weights / weights.sum(), means, cov, covariance_type
        )
    info = PrivateFitInfo(
        n_iter=n_iter,
        noise_multiplier=float(noise_multiplier),
        blocks=len(STAT_BLOCKS),
        clip_norm=clip_norm,
        n_clipped=n_clipped,
        noisy_rows=noisy_rows,
    )
    return _moved(params, centre), info


def _moved(params: MixtureParams, offset: Tensor) -> MixtureParams:
    """``params`` with every mean moved by ``offset`` (n_features,)."""
    return MixtureParams(
        params.weights, params.means + offset, params.precisions_cholesky, params.covariance_type
    )


def private_em_for_budget(
    X: Tensor,
    n_components: int,
    *,
    epsilon: float,
    delta: float,
    n_iter: int = 10,
    clip_norm: float,
    **kwargs,
) -> tuple[MixtureParams, PrivateFitInfo]:
    """:func:`private_em` with the noise multiplier that spends ``(epsilon, delta)`` over
    ``n_iter`` iterations of three blocks
    (:func:`~fednovelty.federated.trust.dp_calibration.calibrate_noise`); ``epsilon=inf`` fits
    without noise. Other keyword arguments go to :func:`private_em`.

    Returns:
        ``(params, info)``; ``info.epsilon`` is the budget actually spent at ``info.delta``
        (at most ``epsilon``).

    Raises:
        ValueError: ``epsilon`` not positive, ``delta`` outside (0, 1), or what
            :func:`private_em` refuses.
    """
    if isinstance(epsilon, bool) or not isinstance(epsilon, int | float) or not epsilon > 0:
        raise ValueError(
            f"epsilon must be a positive number (math.inf: no noise); got {epsilon!r}."
        )
    if isinstance(delta, bool) or not isinstance(delta, int | float) or not 0 < delta < 1:
        raise ValueError(f"delta must be in (0, 1), e.g. 1e-5; got {delta!r}.")
    if isinstance(n_iter, bool) or not isinstance(n_iter, int) or n_iter < 1:
        raise ValueError(f"n_iter must be a positive int; got {n_iter!r}.")
    if math.isinf(epsilon):
        z = 0.0
    else:
        z = calibrate_noise(float(epsilon), float(delta), rounds=n_iter, blocks=len(STAT_BLOCKS))
    params, info = private_em(
        X, n_components, noise_multiplier=z, clip_norm=clip_norm, n_iter=n_iter, **kwargs
    )
    return params, replace(info, delta=float(delta), epsilon=info.epsilon_at(float(delta)))
