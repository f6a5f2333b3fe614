"""Scoring and adaptation of a trained FedGMM joint model: pure functions of a ``JointState``.

:func:`joint_log_components` gives ``log N(x; m1) + log P_m2(y | x)`` per row and pair,
:func:`joint_log_scores` the marginal, conditional and joint log-likelihoods under some
``pi``, and :func:`adapt_joint_weights` fits a new client's ``pi`` with every shared
parameter frozen, by :func:`~fednovelty.mixture.em.fit_weights_map` (EM under a Dirichlet
prior centred on the global weights, so a few rows barely move them).
Nothing here changes the state.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor, nn
from torch.func import functional_call

from fednovelty.federated.mixtures.paper_pooling import client_average_weights
from fednovelty.mixture import WeightsFit, log_gaussian_prob
from fednovelty.mixture.em import fit_weights_map


def global_log_joint_weights(state: Any) -> Tensor:
    """Global ``log pi`` (M1, M2) as ``state.global_weights`` says (``EMConfig.global_weights``):
    ``"pooled"``, the summed joint counts normalised (sample-weighted); ``"client_average"``,
    the FedGMM paper's footnote 3, the unweighted mean of the clients' ``pi_c``
    (``state.client_joint_weights``) with ``10 * eps`` added to every cell and renormalised
    (:func:`~fednovelty.federated.mixtures.paper_pooling.client_average_weights`). A state with no
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


def gaussian_log_densities(state: Any, X: Tensor) -> Tensor:
    """``log N(x_i; m1)`` of rows ``X`` (n, d) under each Gaussian of ``state.params``,
    shape (n, M1)."""
    params = state.params
    return log_gaussian_prob(X, params.means, params.precisions_cholesky, params.covariance_type)


def state_learner_log_probs(
    state: Any,
    template: nn.Module,
    X: Tensor,
    Z: Tensor | None = None,
    learners: list[dict[str, Tensor]] | None = None,
) -> Tensor:
    """:func:`learner_log_probs` (n, M2, n_classes) of ``learners`` (default
    ``state.learners``) on ``Z``, the learners' input rows (default ``X``)."""
    return learner_log_probs(template, learners or state.learners, X if Z is None else Z)


def joint_log_components(
    state: Any,
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
    log_n = gaussian_log_densities(state, X)
    if y is None:
        return log_n.unsqueeze(2)
    log_probs = state_learner_log_probs(state, template, X, Z, learners)
    log_py = log_probs.gather(2, y.view(-1, 1, 1).expand(-1, log_probs.shape[1], 1)).squeeze(2)
    return log_n.unsqueeze(2) + log_py.unsqueeze(1)


def joint_log_scores(
    state: Any,
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
    log_n = gaussian_log_densities(state, X)
    log_px = torch.logsumexp(log_n + torch.logsumexp(log_pi, dim=1), dim=1)
    log_probs = state_learner_log_probs(state, template, X, Z, learners)
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


def adapt_joint_weights(
    state: Any,
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
    (:func:`~fednovelty.mixture.em.fit_weights_map`). Nothing in ``state`` is modified.

    Returns:
        :func:`~fednovelty.mixture.em.fit_weights_map`'s result; ``log_weights`` (M1, M2) is
        usable as ``joint_log_scores(..., log_joint_weights=...)``.
    """
    log_components = joint_log_components(state, template, X, y, Z)
    return fit_weights_map(
        log_components,
        global_log_joint_weights(state),
        prior_rows,
        max_iter=max_iter,
        tol=tol,
    )
