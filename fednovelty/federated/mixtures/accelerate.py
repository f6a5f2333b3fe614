"""Server-side acceleration of federated EM: SQUAREM with a likelihood safeguard.

The server holds every round's summed statistics, so it can extrapolate between EM maps at
no cost to the clients (Varadhan & Roland, *Simple and globally convergent methods for
accelerating the convergence of any EM algorithm*, Scand. J. Statist. 2008, scheme S3).
With ``theta_1 = M(theta_0)`` and ``theta_2 = M(theta_1)`` the EM map's two last steps,
``r = theta_1 - theta_0`` and ``v = theta_2 - 2 theta_1 + theta_0``, the next broadcast is

    theta' = theta_0 - 2 alpha r + alpha^2 v,    alpha = -|r| / |v| clamped to [-alpha_max, -1]

(``alpha = -1`` gives ``theta_2``, plain EM's two steps). The parameters are extrapolated as
log-weights (renormalised), means and covariances, in the rounds' units; a point whose
covariances are not positive definite is pulled back towards ``theta_2`` (``alpha <- (alpha -
1) / 2``). **Safeguard**: the clients' summed log-likelihood at ``theta'`` comes back with
the next round; a point below ``log L(theta_1)`` is rejected, the run goes on from
``theta_2`` (whose likelihood EM guarantees) and ``alpha_max`` shrinks fourfold, while an
accepted point at ``alpha_max`` lets it grow fourfold. ``alpha_max`` starts at 4 (Varadhan
and Roland's first bound of 1 would leave a fit of three rounds without a step). One cycle
costs two rounds: the EM map at the accepted point is the next cycle's ``theta_1``.

:class:`Squarem` is the server's state of it; :func:`extrapolate` the pure step.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import Tensor

from fednovelty.exceptions import SingularCovarianceError
from fednovelty.mixture import (
    MixtureParams,
    covariances_from_precisions_cholesky,
    precisions_cholesky_from_covariances,
)

__all__ = ["ACCELERATIONS", "Squarem", "extrapolate"]

#: the server's choices: plain EM, or SQUAREM with the likelihood safeguard.
ACCELERATIONS: tuple[str, ...] = ("none", "squarem")

#: most halvings of ``alpha`` towards -1 before the point falls back to ``theta_2``.
MAX_BACKTRACKS = 10


def _coordinates(params: MixtureParams) -> tuple[Tensor, Tensor, Tensor]:
    """``(log weights (K,), means (K, d), covariances (covariance_shape))`` of ``params``."""
    covariances = covariances_from_precisions_cholesky(
        params.precisions_cholesky, params.covariance_type
    )
    return params.weights.log(), params.means, covariances


def _params(coordinates: tuple[Tensor, Tensor, Tensor], covariance_type: str) -> MixtureParams:
    """The mixture of extrapolated coordinates (weights renormalised).

    Raises:
        SingularCovarianceError: a covariance is not positive definite.
    """
    log_weights, means, covariances = coordinates
    precisions_cholesky = precisions_cholesky_from_covariances(covariances, covariance_type)
    return MixtureParams(torch.softmax(log_weights, 0), means, precisions_cholesky, covariance_type)


def extrapolate(
    theta0: MixtureParams, theta1: MixtureParams, theta2: MixtureParams, alpha_max: float
) -> tuple[MixtureParams, float]:
    """SQUAREM's S3 point from three successive EM iterates (module docstring).

    Args:
        theta0, theta1, theta2: ``theta1 = M(theta0)``, ``theta2 = M(theta1)``; one
            covariance type, (K,) weights, (K, d) means.
        alpha_max: the largest step length ``|alpha|`` allowed (>= 1).

    Returns:
        ``(point, alpha)``; ``alpha = -1`` and ``point is theta2`` when the extrapolation has
        nothing to add (``v = 0``, ``|r| <= |v|`` or ``alpha_max = 1``) or no point with
        positive definite covariances was found.
    """
    c0, c1, c2 = (_coordinates(theta) for theta in (theta0, theta1, theta2))
    r = [b - a for a, b in zip(c0, c1, strict=True)]
    v = [c - 2 * b + a for a, b, c in zip(c0, c1, c2, strict=True)]
    r_norm = math.sqrt(sum(float(t.square().sum()) for t in r))
    v_norm = math.sqrt(sum(float(t.square().sum()) for t in v))
    if not v_norm > 0 or not math.isfinite(r_norm / v_norm):
        return theta2, -1.0
    alpha = -min(max(r_norm / v_norm, 1.0), float(alpha_max))
    for _ in range(MAX_BACKTRACKS):
        if alpha >= -1.0:
            break
        point = [a - 2 * alpha * dr + alpha**2 * dv for a, dr, dv in zip(c0, r, v, strict=True)]
        if all(bool(torch.isfinite(t).all()) for t in point):
            try:
                return _params(tuple(point), theta0.covariance_type), alpha
            except SingularCovarianceError:
                pass
        alpha = (alpha - 1.0) / 2.0
    return theta2, -1.0


@dataclass
class Squarem:
    """The server's SQUAREM cycle (module docstring).

    Attributes:
        stage: what the round just answered was: ``"start"`` (a cycle's ``theta_0``),
            ``"second"`` (its ``theta_1``) or ``"check"`` (an extrapolated point).
        anchor: ``theta_0`` of the running cycle.
        anchor_ll, first_ll: mean log-likelihoods of ``theta_0`` and ``theta_1``.
        fallback: ``theta_2`` while an extrapolated point is checked.
        alpha, alpha_max: the last step length and its bound.
        accepted, rejected: extrapolated points kept and refused so far.
    """

    stage: str = "start"
    anchor: MixtureParams | None = None
    first_ll: float = -math.inf
    fallback: MixtureParams | None = None
    alpha: float = -1.0
    alpha_max: float = 4.0
    accepted: int = 0
    rejected: int = 0

    def step(
        self, broadcast: MixtureParams, mapped: MixtureParams, log_likelihood: float
    ) -> tuple[MixtureParams, MixtureParams]:
        """Fold one round in: the round broadcast ``broadcast``, whose clients' summed
        statistics gave the mean ``log_likelihood`` and the M-step's ``mapped``.

        Returns:
            ``(the next round's broadcast, the best mixture known now)``: the latter is what
            the fit ends with if it stops here (``mapped``, or ``theta_2`` after a refused
            point or while one is checked).
        """
        if self.stage == "check":
            if log_likelihood >= self.first_ll:
                self.accepted += 1
                if self.alpha <= -self.alpha_max:
                    self.alpha_max *= 4.0
                self.stage, self.anchor = "second", broadcast
                return mapped, mapped
            self.rejected += 1
            self.alpha_max = max(1.0, self.alpha_max / 4.0)
            fallback, self.fallback, self.stage = self.fallback, None, "start"
            return fallback, fallback
        if self.stage == "start" or self.anchor is None:
            self.stage, self.anchor = "second", broadcast
            return mapped, mapped
        self.first_ll = log_likelihood
        point, self.alpha = extrapolate(self.anchor, broadcast, mapped, self.alpha_max)
        if self.alpha >= -1.0:  # nothing to add: theta_2 opens the next cycle
            if self.alpha_max == 1.0:  # the bound was the step: let the next one grow
                self.alpha_max = 4.0
            self.stage = "start"
            return mapped, mapped
        self.stage, self.fallback = "check", mapped
        return point, mapped
