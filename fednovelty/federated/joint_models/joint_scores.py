"""Scoring and adaptation of a trained FedGMM joint model: pure functions of a ``JointState``.

:func:`joint_log_components` gives ``log N(x; m1) + log P_m2(y | x)`` per row and pair,
:func:`joint_log_scores` the marginal, conditional and joint log-likelihoods under some
``pi``, and :func:`adapt_joint_weights` fits a new client's ``pi`` with every shared
parameter frozen, by :func:`fit_weights_map` (EM under a Dirichlet prior centred on the
global weights, so a few rows barely move them). Nothing here changes the state.
"""

from __future__ import annotations

import math
from numbers import Integral, Real
from typing import TYPE_CHECKING

import torch
from torch import Tensor, nn
from torch.func import functional_call

from fednovelty.federated.mixtures.em import client_average_weights
from fednovelty.mixture import WeightsFit, log_gaussian_prob

if TYPE_CHECKING:
    from fednovelty.federated.joint_models.joint import JointState


def log_likelihoods_of_labels(
    module: nn.Module, params: dict[str, Tensor], X: Tensor, y: Tensor
) -> Tensor:
    """``log P_theta(y_i | x_i)`` of each row, shape (n_samples,)."""
    logits = functional_call(module, params, (X,))
    return -nn.functional.cross_entropy(logits, y, reduction="none")


def global_log_joint_weights(state: JointState) -> Tensor:
    """Global ``log pi`` (M1, M2) as ``state.global_weights`` says (``EMConfig.global_weights``):
    ``"pooled"``, the summed joint counts normalised (sample-weighted); ``"client_average"``,
    the FedGMM paper's footnote 3, the unweighted mean of the clients' ``pi_c``
    (``state.client_joint_weights``) with ``10 * eps`` added to every cell and renormalised
    (:func:`~fednovelty.federated.mixtures.em.client_average_weights`). A state with no
    client weights falls back to the pooled ones."""
    if (
        getattr(state, "global_weights", "pooled") == "client_average"
        and state.client_joint_weights
    ):
        shape = state.joint_counts.shape
        flat = [w.reshape(-1).to(state.joint_counts) for w in state.client_joint_weights.values()]
        return client_average_weights(flat).reshape(shape).log()
    return (state.joint_counts / state.joint_counts.sum()).log()


def learner_log_probs(template: nn.Module, learners: list[dict[str, Tensor]], Z: Tensor) -> Tensor:
    """``log P_m2(y = k | z_i)`` for every learner and class, shape (n, M2, n_classes)."""
    with torch.no_grad():
        return torch.stack(
            [
                nn.functional.log_softmax(functional_call(template, p, (Z,)), dim=1)
                for p in learners
            ],
            dim=1,
        )


def joint_log_components(
    state: JointState,
    template: nn.Module,
    X: Tensor,
    y: Tensor | None = None,
    Z: Tensor | None = None,
    learners: list[dict[str, Tensor]] | None = None,
) -> Tensor:
    """``log N(x_i; m1) + log P_m2(y_i | z_i)``, shape (n, M1, M2); without ``y`` the
    Gaussian part alone, shape (n, M1, 1) (broadcasts against (M1, M2) weights).

    ``learners`` overrides ``state.learners`` (a Local client's own learners).
    """
    params = state.params
    log_n = log_gaussian_prob(X, params.means, params.precisions_cholesky, params.covariance_type)
    if y is None:
        return log_n.unsqueeze(2)
    log_probs = learner_log_probs(template, learners or state.learners, X if Z is None else Z)
    log_py = log_probs.gather(2, y.view(-1, 1, 1).expand(-1, log_probs.shape[1], 1)).squeeze(2)
    return log_n.unsqueeze(2) + log_py.unsqueeze(1)


def joint_log_scores(
    state: JointState,
    template: nn.Module,
    X: Tensor,
    y: Tensor | None = None,
    log_joint_weights: Tensor | None = None,
    Z: Tensor | None = None,
    learners: list[dict[str, Tensor]] | None = None,
) -> dict[str, Tensor]:
    """``log_px`` (n,), ``proba_y`` (n, n_classes) = Eq. 3's ``p(y | x)``, ``msp`` (n,) =
    its largest entry, and with labels ``y`` also ``log_pxy`` and ``log_py_given_x`` (n,).

    Everything is computed in log space: ``log p(x, y) = logsumexp_{m1, m2} [log pi(m1, m2)
    + log N(x; m1) + log P_m2(y | z)]`` (the paper's reference code adds ``pi`` instead of
    ``log pi`` here). ``p(y | x)`` is computed from responsibilities (``_log_proba_y``), so
    it sums to 1 even for rows far from every Gaussian; where every density underflows it
    comes from the weights ``pi`` alone: ``proba_y`` and ``log_py_given_x`` are never NaN.

    Args:
        log_joint_weights: ``log pi`` (M1, M2) of one client; default the global weights.
        Z: the learners' input rows when it differs from ``X``.
        learners: a Local client's own learners instead of ``state.learners``.
    """
    log_pi = global_log_joint_weights(state) if log_joint_weights is None else log_joint_weights
    params = state.params
    log_n = log_gaussian_prob(X, params.means, params.precisions_cholesky, params.covariance_type)
    log_px = torch.logsumexp(log_n + torch.logsumexp(log_pi, dim=1), dim=1)
    log_probs = learner_log_probs(template, learners or state.learners, X if Z is None else Z)
    # log sum_{m1,m2} pi N P(y|x) for every class: (n, n_classes)
    joint_all = torch.logsumexp(
        (log_pi.unsqueeze(0) + log_n.unsqueeze(2)).unsqueeze(3) + log_probs.unsqueeze(1),
        dim=(1, 2),
    )
    log_py_x = _log_proba_y(log_pi, log_n, log_probs)
    proba = log_py_x.exp()
    out = {"log_px": log_px, "proba_y": proba, "msp": proba.max(1).values}
    if y is not None:
        out["log_pxy"] = joint_all.gather(1, y.view(-1, 1)).squeeze(1)
        out["log_py_given_x"] = log_py_x.gather(1, y.view(-1, 1)).squeeze(1)
    return out


def _log_proba_y(log_pi: Tensor, log_n: Tensor, log_probs: Tensor) -> Tensor:
    """``log p(y = k | x)`` (n, n_classes) from ``log_pi`` (M1, M2), ``log_n`` (n, M1) and
    ``log_probs`` (n, M2, n_classes), as responsibilities times predictions: the Gaussians'
    responsibilities ``r(m1 | x)`` (a softmax, exact however small the densities), each
    split over the learners by ``pi(m2 | m1)``. Subtracting ``log p(x)`` from ``log p(x, y)``
    instead loses every digit when the densities are as small as 1e-300. Where every
    weighted density underflowed (``log pi N = -inf``) the weights alone decide."""
    log_pi_m1 = torch.logsumexp(log_pi, dim=1)  # (M1,)
    weighted = log_n + log_pi_m1  # (n, M1)
    log_r = torch.log_softmax(weighted, dim=1)
    far = torch.isneginf(weighted).all(dim=1)
    if bool(far.any()):
        log_r[far] = torch.log_softmax(log_pi_m1, dim=0)
    empty = torch.isneginf(log_pi_m1).unsqueeze(1)  # a Gaussian of weight 0 splits nothing
    log_split = torch.where(empty, -torch.inf, log_pi - log_pi_m1.unsqueeze(1))  # pi(m2 | m1)
    log_r_pairs = log_r.unsqueeze(2) + log_split.unsqueeze(0)  # (n, M1, M2)
    return torch.logsumexp(log_r_pairs.unsqueeze(3) + log_probs.unsqueeze(1), dim=(1, 2))


def check_prior_rows(prior_rows) -> float:
    """``prior_rows`` as a float, or a ``ValueError`` saying what is accepted."""
    if (
        isinstance(prior_rows, bool)
        or not isinstance(prior_rows, Real)
        or not math.isfinite(prior_rows)
        or prior_rows < 0
    ):
        raise ValueError(
            f"prior_rows must be a finite number >= 0 (pseudo-rows of the Dirichlet prior "
            f"centred on the global weights; 0 is maximum likelihood); got {prior_rows!r}."
        )
    return float(prior_rows)


def fit_weights_map(
    log_components: Tensor,
    log_prior_weights: Tensor,
    prior_rows: float,
    *,
    max_iter: int = 100,
    tol: float = 1e-6,
) -> WeightsFit:
    """Mixture weights by MAP EM under a Dirichlet prior centred on ``g``, every component
    density frozen.

    The prior on ``w`` is ``Dirichlet(1 + prior_rows * g)`` with ``g = exp(log_prior_weights)``
    (a new client's global weights): ``prior_rows`` pseudo-rows spread as ``g``. EM from
    ``g`` maximises ``sum_i log sum_k w_k p_k(x_i) + prior_rows * sum_k g_k log w_k``; its
    M-step is ``w_k = (sum_i q_i(k) + prior_rows * g_k) / (n + prior_rows)`` with
    ``q_i(k) ∝ w_k p_k(x_i)``. So ``n`` rows move the weights by at most
    ``n / (n + prior_rows)`` of the way to their own maximum-likelihood weights: 5 rows
    against 10 pseudo-rows a third of the way, 500 rows 98 %. ``prior_rows = 0`` is
    maximum likelihood (:func:`~fednovelty.mixture.fit_weights`). Components of weight 0 in
    ``g`` stay at 0 (an x-only adaptation keeps the learner split within each Gaussian).

    Args:
        log_components: ``log p_k(x_i)``, shape (n_samples, *K) (e.g. (n, M1) or
            (n, M1, M2)); trailing size-1 axes broadcast against the weights.
        log_prior_weights: ``log g``, shape K, summing to one in probability; the start.
        prior_rows: the prior's strength in pseudo-rows, a finite number >= 0.
        max_iter: maximum iterations (>= 1).
        tol: stop when the penalised objective per row changes by less than this.

    Returns:
        :class:`~fednovelty.mixture.WeightsFit`; ``mean_log_likelihoods`` are the rows' mean
        log-likelihoods (without the prior) before each update.
    """
    tau = check_prior_rows(prior_rows)
    if log_components.ndim < 1 or log_components.shape[0] == 0:
        raise ValueError("fit_weights_map needs at least one row in log_components.")
    if isinstance(max_iter, bool) or not isinstance(max_iter, Integral) or max_iter < 1:
        raise ValueError(f"max_iter must be an integer >= 1, got {max_iter!r}.")
    total = float(torch.logsumexp(log_prior_weights.reshape(-1), dim=0).exp())
    if not math.isfinite(total) or abs(total - 1.0) > 1e-6:
        raise ValueError(
            f"log_prior_weights must be log-probabilities summing to 1; they sum to {total:.6g} "
            "in probability. Pass the global weights' logarithm."
        )
    shape, n = log_prior_weights.shape, log_components.shape[0]
    log_g = log_prior_weights
    log_prior_mass = log_g + math.log(tau) if tau > 0 else torch.full_like(log_g, -math.inf)
    log_w = log_g
    trace, lls = [log_w.exp()], []
    previous, converged = None, False
    for _ in range(max_iter):
        joint = (log_components + log_w).reshape(n, -1)
        log_norm = torch.logsumexp(joint, dim=1, keepdim=True)
        ll = float(log_norm.mean())
        lls.append(ll)
        objective = ll
        if tau > 0:  # every w_k with g_k > 0 is then > 0
            kept = torch.where(log_g.isneginf(), 0.0, log_w)
            objective += tau * float((log_g.exp() * kept).sum()) / n
        log_counts = torch.logsumexp(joint - log_norm, dim=0).reshape(shape)
        log_w = torch.logaddexp(log_counts, log_prior_mass) - math.log(n + tau)
        trace.append(log_w.exp())
        if previous is not None and abs(objective - previous) < tol:
            converged = True
            break
        previous = objective
    return WeightsFit(
        log_weights=log_w,
        trace=torch.stack(trace),
        mean_log_likelihoods=torch.as_tensor(lls, dtype=log_w.dtype),
        n_iter=len(lls),
        converged=converged,
    )


def adapt_joint_weights(
    state: JointState,
    template: nn.Module,
    X: Tensor,
    y: Tensor | None = None,
    Z: Tensor | None = None,
    *,
    prior_rows: float = 0.0,
    max_iter: int = 100,
    tol: float = 1e-6,
) -> WeightsFit:
    """A new client's ``pi`` (M1, M2) by EM with every shared parameter frozen.

    With labels the E-step uses ``pi N(x; m1) P_m2(y | z)``; without, ``pi N(x; m1)`` (x-only
    EM: the Gaussian weights move, the learner split within each Gaussian keeps the global
    proportions). Starts from the global weights; with ``prior_rows > 0`` the fit is MAP
    under a Dirichlet prior of that many pseudo-rows centred on them
    (:func:`fit_weights_map`). Nothing in ``state`` is modified.

    Returns:
        :func:`fit_weights_map`'s result; ``log_weights`` (M1, M2) is usable as
        ``joint_log_scores(..., log_joint_weights=...)``.
    """
    log_components = joint_log_components(state, template, X, y, Z)
    return fit_weights_map(
        log_components,
        global_log_joint_weights(state),
        prior_rows,
        max_iter=max_iter,
        tol=tol,
    )
