"""Combining variational posteriors: natural-parameter averaging and moment matching.

Given posteriors ``q_1 .. q_n`` of one variational family (:class:`VBPosterior`: a Dirichlet
or stick-breaking Beta distribution on the weights times Normal-Wishart components, component
``c`` aligned across them) and weights ``w_i >= 0`` summing to one, two rules give one
posterior ``p`` of the same family:

* ``how="natural"``: the weighted average of the natural parameters. It minimises the
  *reverse* (mode-seeking, exclusive) divergence ``sum_i w_i KL(p || q_i)``: for an
  exponential family ``sum_i w_i KL(p || q_i) = KL(p || q_bar) + const`` with ``q_bar`` the
  member whose natural parameters are the average. Dirichlet ``alpha`` (each stick's Beta
  ``(a, b)``) and Normal-Wishart ``(beta, beta m, W^-1 + beta m m^T, nu)`` average linearly:
  ``beta = sum w beta_i``, ``m = sum w beta_i m_i / beta``,
  ``W^-1 = sum w W_i^-1 + sum w beta_i (m_i - m)(m_i - m)^T``, ``nu = sum w nu_i``.
* ``how="moment"``: the member whose expected sufficient statistics are the weighted
  averages of the inputs'. It minimises the *forward* (mass-covering, inclusive) divergence
  ``sum_i w_i KL(q_i || p)``. The statistics are ``log pi`` (Dirichlet; ``log v``,
  ``log(1 - v)`` per stick), ``Lambda``, ``log det Lambda``, ``Lambda mu``,
  ``mu^T Lambda mu``. Matching gives ``covariances = E[Lambda]^-1`` (the average expected
  precision, inverted), ``m = E[Lambda]^-1 E[Lambda mu]``,
  ``1 / beta = (sum w d / beta_i + sum w (m_i - m)^T P_i (m_i - m)) / d`` (``P_i`` the
  inputs' expected precisions; the centred form of ``E[mu^T Lambda mu]`` avoids
  cancellation), ``nu`` the root of ``E_p[log det Lambda] = average`` (a monotone 1-D
  equation, bisection in ``log(nu - d + 1)``) and the Dirichlet (Beta) parameters from the
  average ``E[log pi]`` (Minka's fixed-point equation ``alpha_k = psi^-1(psi(alpha_0) +
  E[log pi_k])``, solved for ``alpha_0`` by bisection, which always converges).

The covariance types share one convention, scikit-learn's: a component's precision
``Lambda`` is Wishart with a *structured* scale (``diag``: diagonal, ``spherical``: a multiple
of the identity, ``tied``: one Wishart shared by every component's Normal), ``covariances``
the normalised ``W^-1 / nu``. That family is curved in natural coordinates (the natural
parameter ``W^-1 + beta m m^T`` of a component is full even when ``W^-1`` is diagonal), so
both rules are computed on full matrices and then projected onto the structure, the exact
projection of each rule's divergence: for the reverse divergence the diagonal (``diag``) or
the mean of the diagonal (``spherical``) of the averaged ``W^-1`` with ``nu``, ``beta``,
``m`` unchanged; for the forward one the same of the average ``E[Lambda]`` (already
diagonal or spherical for inputs of that type). One feature (``n_features == 1``, ``full``
or ``spherical``) is the Normal-Gamma family (a Normal-Inverse-Gamma on the variance).

``tied`` posteriors are joint over all components (one shared Wishart), so they take one
weight per posterior; the other types factorise over components and also accept a weight per
posterior *and component* (``weights`` of shape ``(n_posteriors, n_components)``: component
``c`` combines with column ``c``; the weight distribution uses the rows' sums), which is what
a server needs when the clients' evidence for a component differs.

:func:`kl_posterior` is ``KL(q || p)`` of the whole family (weights plus components; for
``tied`` the shared Wishart is counted once).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch
from torch import Tensor

from fednovelty.mixture.covariance import log_det_cholesky
from fednovelty.mixture.dirnig import kl_dirichlet
from fednovelty.mixture.variational import VBPosterior
from fednovelty.mixture.vb_prior import VBPrior

AGGREGATION_RULES: tuple[str, ...] = ("natural", "moment")

__all__ = [
    "AGGREGATION_RULES",
    "aggregate_posteriors",
    "dirichlet_from_expected_log",
    "inverse_digamma",
    "kl_posterior",
    "scale_evidence",
    "vb_expected_statistics",
    "wishart_dof_from_gap",
]

#: bisection steps of the 1-D root finds (on a log scale: far below float64 round-off).
_BISECTION_STEPS = 120


# --------------------------------------------------------------------------- special functions


def inverse_digamma(y: Tensor, n_iter: int = 8) -> Tensor:
    """``x`` with ``digamma(x) = y``, elementwise, any shape (Minka's start and Newton steps;
    the digamma is increasing on ``x > 0``)."""
    x = torch.where(y >= -2.22, torch.exp(y) + 0.5, -1.0 / (y + 0.5772156649015329))
    for _ in range(n_iter):
        x = x - (torch.digamma(x) - y) / torch.polygamma(1, x)
        x = x.clamp_min(torch.finfo(x.dtype).tiny)
    return x


def _wishart_log_gap(dof: Tensor, n_features: int) -> Tensor:
    """``log det E[Lambda] - E[log det Lambda]`` of a Wishart: ``d log(nu / 2) -
    sum_j digamma((nu - j) / 2)``, > 0 and decreasing in ``nu``; same shape as ``dof``."""
    j = torch.arange(n_features, dtype=dof.dtype, device=dof.device)
    return n_features * torch.log(0.5 * dof) - torch.digamma(0.5 * (dof.unsqueeze(-1) - j)).sum(-1)


def wishart_dof_from_gap(gap: Tensor, n_features: int, upper: Tensor) -> Tensor:
    """The degrees of freedom ``nu > n_features - 1`` of a Wishart whose
    ``log det E[Lambda] - E[log det Lambda]`` is ``gap`` (> 0), any shape.

    ``upper``: a value of ``nu`` (same shape) at which the gap is at most ``gap`` (e.g. the
    largest input's); bisection in ``log(nu - d + 1)``.
    """
    d1 = n_features - 1.0
    hi = torch.log(upper - d1)
    lo = hi.clone()
    for _ in range(2000):  # widen down until the gap at lo is >= gap
        short = _wishart_log_gap(d1 + torch.exp(lo), n_features) < gap
        if not bool(short.any()):
            break
        lo = torch.where(short, lo - 2.0, lo)
    for _ in range(_BISECTION_STEPS):
        mid = 0.5 * (lo + hi)
        above = _wishart_log_gap(d1 + torch.exp(mid), n_features) > gap
        lo, hi = torch.where(above, mid, lo), torch.where(above, hi, mid)
    return d1 + torch.exp(0.5 * (lo + hi))


def dirichlet_from_expected_log(expected_log: Tensor) -> Tensor:
    """Dirichlet parameters ``alpha`` (same shape) with ``E[log pi] = expected_log``.

    Args:
        expected_log: ``(..., J)``, ``J >= 2``, each row the expected log of a point on the
            simplex (so ``sum_j exp(row_j) < 1``).

    Minka's fixed point ``alpha_j = psi^-1(psi(s) + E[log pi_j])`` holds at the solution for
    ``s = sum_j alpha_j``; ``g(s) = sum_j psi^-1(psi(s) + E[log pi_j]) - s`` is positive
    below the unique root and negative above, so ``s`` is found by bisection in ``log s``.
    """
    L = expected_log

    def g(log_s: Tensor) -> Tensor:
        s = torch.exp(log_s)
        return inverse_digamma(torch.digamma(s).unsqueeze(-1) + L).sum(-1) - s

    zeros = L.new_zeros(L.shape[:-1])
    lo, hi = zeros.clone(), zeros.clone()
    for _ in range(2000):
        low = g(lo) <= 0
        high = g(hi) >= 0
        if not bool(low.any()) and not bool(high.any()):
            break
        lo = torch.where(low, lo - 2.0, lo)
        hi = torch.where(high, hi + 2.0, hi)
    for _ in range(_BISECTION_STEPS):
        mid = 0.5 * (lo + hi)
        positive = g(mid) > 0
        lo, hi = torch.where(positive, mid, lo), torch.where(positive, hi, mid)
    s = torch.exp(0.5 * (lo + hi))
    return inverse_digamma(torch.digamma(s).unsqueeze(-1) + L)


# --------------------------------------------------------------------------- components


def _full_components(posterior: VBPosterior) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """Components on full matrices: ``(dof (G,), covariances (G, d, d), precisions (G, d,
    d), log_det_precisions (G,))`` with ``G = n_components`` (``1`` for tied);
    ``precisions`` is ``E[Lambda] = covariances^-1``."""
    ct = posterior.covariance_type
    d = posterior.n_features
    cov, U = posterior.covariances, posterior.precisions_cholesky
    log_det = 2 * log_det_cholesky(U, ct, d)
    if ct == "full":
        return posterior.degrees_of_freedom, cov, U @ U.transpose(-1, -2), log_det
    if ct == "tied":
        return (
            posterior.degrees_of_freedom.reshape(1),
            cov.unsqueeze(0),
            (U @ U.T).unsqueeze(0),
            log_det.reshape(1),
        )
    eye = torch.eye(d, dtype=cov.dtype, device=cov.device)
    if ct == "diag":
        return (
            posterior.degrees_of_freedom,
            torch.diag_embed(cov),
            torch.diag_embed(U.square()),
            log_det,
        )
    return (
        posterior.degrees_of_freedom,
        cov.view(-1, 1, 1) * eye,
        U.square().view(-1, 1, 1) * eye,
        log_det,
    )


def _groups(posterior: VBPosterior) -> Tensor:
    """Index of each component's Wishart, (n_components,)."""
    k = posterior.n_components
    device = posterior.means.device
    if posterior.covariance_type == "tied":
        return torch.zeros(k, dtype=torch.long, device=device)
    return torch.arange(k, device=device)


def _project(matrices: Tensor, covariance_type: str) -> Tensor:
    """Full matrices (G, d, d) onto the structure of ``covariance_type``: the matrices
    (full), the one matrix (tied, (d, d)), their diagonals (diag, (G, d)) or the means of
    their diagonals (spherical, (G,))."""
    if covariance_type == "full":
        return 0.5 * (matrices + matrices.transpose(-1, -2))
    if covariance_type == "tied":
        return 0.5 * (matrices[0] + matrices[0].T)
    diagonal = torch.diagonal(matrices, dim1=-2, dim2=-1)
    return diagonal if covariance_type == "diag" else diagonal.mean(-1)


def _unproject(projected: Tensor, covariance_type: str, n_features: int) -> Tensor:
    """Inverse of :func:`_project` for a structured tensor: full matrices (G, d, d)."""
    if covariance_type == "full":
        return projected
    if covariance_type == "tied":
        return projected.unsqueeze(0)
    if covariance_type == "diag":
        return torch.diag_embed(projected)
    eye = torch.eye(n_features, dtype=projected.dtype, device=projected.device)
    return projected.view(-1, 1, 1) * eye


def _invert_structured(matrices: Tensor, covariance_type: str) -> Tensor:
    """``inverse(project(matrices))`` in ``covariance_type``'s shape."""
    projected = _project(matrices, covariance_type)
    if covariance_type in ("diag", "spherical"):
        return 1.0 / projected
    chol = torch.linalg.cholesky(projected)
    inverse = torch.cholesky_inverse(chol)
    return 0.5 * (inverse + inverse.transpose(-1, -2))


def vb_expected_statistics(posterior: VBPosterior) -> dict[str, Tensor]:
    """Expected sufficient statistics of the variational family under ``posterior``.

    Returns:
        ``log_weights``: ``E[log pi_k]`` (n_components,) for the Dirichlet distribution, or
        ``(E[log v_k], E[log(1 - v_k)])`` stacked, (2, n_components), for the sticks;
        ``precision``: ``E[Lambda]``, (G, d, d) (``G`` = n_components, 1 for tied; full
        matrices for every type); ``log_det_precision``: ``E[log det Lambda]``, (G,);
        ``precision_mean``: ``E[Lambda_k mu_k]``, (n_components, d);
        ``mean_quadratic``: ``E[mu_k^T Lambda_k mu_k]``, (n_components,).
    """
    wc = posterior.weight_concentration
    if posterior.weight_concentration_prior_type == "dirichlet_process":
        total = torch.digamma(wc[0] + wc[1])
        log_weights = torch.stack([torch.digamma(wc[0]) - total, torch.digamma(wc[1]) - total])
    else:
        log_weights = torch.digamma(wc) - torch.digamma(wc.sum())
    d = posterior.n_features
    dof, _, precision, log_det = _full_components(posterior)
    per_component = precision[_groups(posterior)]
    m = posterior.means
    pm = torch.einsum("kde,ke->kd", per_component, m)
    return {
        "log_weights": log_weights,
        "precision": precision,
        "log_det_precision": log_det - _wishart_log_gap(dof, d),
        "precision_mean": pm,
        "mean_quadratic": d / posterior.mean_precision + (m * pm).sum(-1),
    }


# --------------------------------------------------------------------------- checks


def _check(posteriors: Sequence[VBPosterior], weights) -> tuple[list[VBPosterior], Tensor]:
    """Validated posteriors (moved to the first's dtype and device) and weights,
    (n_posteriors,) or (n_posteriors, n_components), with a positive sum (per column)."""
    if isinstance(posteriors, VBPosterior) or not isinstance(posteriors, Sequence):
        raise ValueError("posteriors must be a sequence (list or tuple) of VBPosterior.")
    if len(posteriors) == 0:
        raise ValueError("posteriors is empty; give at least one VBPosterior.")
    first = posteriors[0]
    if not isinstance(first, VBPosterior):
        raise ValueError(f"posteriors[0] is a {type(first).__name__}, not a VBPosterior.")
    like = {"dtype": first.means.dtype, "device": first.means.device}
    out = []
    for i, post in enumerate(posteriors):
        if not isinstance(post, VBPosterior):
            raise ValueError(f"posteriors[{i}] is a {type(post).__name__}, not a VBPosterior.")
        for name in (
            "n_components",
            "n_features",
            "covariance_type",
            "weight_concentration_prior_type",
        ):
            if getattr(post, name) != getattr(first, name):
                raise ValueError(
                    f"posteriors[{i}] has {name}={getattr(post, name)!r} but posteriors[0] "
                    f"has {getattr(first, name)!r}; aggregate posteriors of one family."
                )
        tensors = {k: v.to(**like) for k, v in post.tensors().items()}
        if not all(bool(torch.isfinite(v).all()) for v in tensors.values()):
            raise ValueError(f"posteriors[{i}] holds NaN or inf.")
        out.append(
            VBPosterior(
                **tensors,
                covariance_type=post.covariance_type,
                weight_concentration_prior_type=post.weight_concentration_prior_type,
            )
        )
    w = torch.as_tensor(weights).to(**like)
    n, k = len(out), first.n_components
    if tuple(w.shape) not in ((n,), (n, k)):
        raise ValueError(
            f"weights must have shape ({n},) (one per posterior) or ({n}, {k}) (per posterior "
            f"and component), got {tuple(w.shape)}."
        )
    if w.ndim == 2 and first.covariance_type == "tied":
        raise ValueError(
            "weights per component need independent components; covariance_type='tied' "
            f"shares one Wishart: give weights of shape ({n},)."
        )
    if not bool(torch.isfinite(w).all()) or bool((w < 0).any()):
        raise ValueError("weights must be finite and >= 0.")
    total = w.sum(0)
    if not bool((total > 0).all()):
        raise ValueError(
            "weights sum to 0 (for some component); give a positive weight to at least one "
            "posterior (per component)."
        )
    return out, w


# --------------------------------------------------------------------------- aggregation


def _weighted(w: Tensor, values: Tensor) -> Tensor:
    """``sum_i w_i values_i`` with ``w`` (n,) or (n, K) broadcast over ``values`` (n, K, ...)."""
    extra = values.ndim - w.ndim
    return (w.reshape(*w.shape, *([1] * extra)) * values).sum(0)


def _aggregate_weights(posteriors: list[VBPosterior], w: Tensor, how: str) -> Tensor:
    wc = torch.stack([p.weight_concentration for p in posteriors])  # (n, K) or (n, 2, K)
    if how == "natural":
        return _weighted(w, wc)
    stats = torch.stack([vb_expected_statistics(p)["log_weights"] for p in posteriors])
    mean_log = _weighted(w, stats)
    if posteriors[0].weight_concentration_prior_type == "dirichlet_process":
        return dirichlet_from_expected_log(mean_log.T).T  # one Beta per stick
    if mean_log.shape[0] == 1:  # one component: every Dirichlet is the same point mass
        return _weighted(w, wc)
    return dirichlet_from_expected_log(mean_log)


def aggregate_posteriors(
    posteriors: Sequence[VBPosterior], weights, how: str = "moment"
) -> VBPosterior:
    """One posterior from several of one family, components aligned (module docstring).

    Args:
        posteriors: ``n_posteriors`` posteriors with equal ``n_components``, ``n_features``,
            ``covariance_type`` and ``weight_concentration_prior_type``; component ``c`` of
            each describes the same thing. Any covariance type; ``n_features`` may be 1.
        weights: ``(n_posteriors,)`` (or ``(n_posteriors, n_components)`` for every type but
            tied), finite, ``>= 0``, not all 0 (per component); normalised here. A
            posterior of weight 0 does not count.
        how: ``"natural"`` (average natural parameters: minimises ``sum_i w_i KL(p ||
            q_i)``) or ``"moment"`` (match expected sufficient statistics: minimises
            ``sum_i w_i KL(q_i || p)``).

    Returns:
        The combined posterior (dtype and device of ``posteriors[0]``).

    Raises:
        ValueError: naming ``posteriors``, ``weights`` or ``how``.
    """
    if how not in AGGREGATION_RULES:
        raise ValueError(f"how must be one of {AGGREGATION_RULES}, got {how!r}.")
    posts, raw = _check(posteriors, weights)
    first = posts[0]
    ct, d = first.covariance_type, first.n_features
    w = raw / raw.sum(0)
    w_group = raw.sum(1) / raw.sum() if raw.ndim == 2 else w  # the weight distribution
    weight_concentration = _aggregate_weights(posts, w_group, how)

    parts = [_full_components(p) for p in posts]
    dof = torch.stack([p[0] for p in parts])  # (n, G)
    cov = torch.stack([p[1] for p in parts])  # (n, G, d, d)
    prec = torch.stack([p[2] for p in parts])
    log_det = torch.stack([p[3] for p in parts])  # (n, G)
    beta = torch.stack([p.mean_precision for p in posts])  # (n, K)
    means = torch.stack([p.means for p in posts])  # (n, K, d)
    groups = _groups(first)
    w_comp = w if w.ndim == 2 else w.unsqueeze(1).expand(-1, first.n_components)
    w_wish = w_comp if ct != "tied" else w.unsqueeze(1)  # (n, G)

    if how == "natural":
        new_beta = _weighted(w_comp, beta)
        new_means = _weighted(w_comp, beta.unsqueeze(-1) * means) / new_beta.unsqueeze(-1)
        new_dof = _weighted(w_wish, dof)
        diff = means - new_means  # (n, K, d)
        spread = (w_comp * beta).unsqueeze(-1).unsqueeze(-1) * (
            diff.unsqueeze(-1) * diff.unsqueeze(-2)
        )  # (n, K, d, d)
        spread = spread.sum(0)
        spread = torch.zeros_like(cov[0]).index_add(0, groups, spread)  # (G, d, d)
        scale_inverse = _weighted(w_wish, dof.unsqueeze(-1).unsqueeze(-1) * cov) + spread
        covariances = _project(scale_inverse / new_dof.view(-1, 1, 1), ct)
    else:
        A = _weighted(w_wish, prec)  # (G, d, d): average E[Lambda]
        A_proj = _unproject(_project(A, ct), ct, d)
        chol = torch.linalg.cholesky(A_proj)
        b = _weighted(w_comp, torch.einsum("nkde,nke->nkd", prec[:, groups], means))
        new_means = torch.cholesky_solve(b.unsqueeze(-1), chol[groups]).squeeze(-1)
        diff = means - new_means
        quad = torch.einsum("nkd,nkde,nke->nk", diff, prec[:, groups], diff)
        new_beta = d / _weighted(w_comp, d / beta + quad)
        log_det_A = 2 * torch.log(torch.diagonal(chol, dim1=-2, dim2=-1)).sum(-1)  # (G,)
        gap = log_det_A - _weighted(w_wish, log_det) + _weighted(w_wish, _wishart_log_gap(dof, d))
        upper = torch.where(w_wish > 0, dof, dof.new_tensor(0.0)).amax(0)
        new_dof = wishart_dof_from_gap(gap.clamp_min(torch.finfo(gap.dtype).tiny), d, upper)
        covariances = _invert_structured(A, ct)
    if ct == "tied":
        new_dof = new_dof.reshape(())
    kind = first.weight_concentration_prior_type
    return VBPosterior.from_covariances(
        weight_concentration, new_beta, new_means, new_dof, covariances, ct, kind
    )


# --------------------------------------------------------------------------- divergence


def _log_multigamma(x: Tensor, n_features: int) -> Tensor:
    j = torch.arange(n_features, dtype=x.dtype, device=x.device)
    return 0.25 * n_features * (n_features - 1) * math.log(math.pi) + torch.lgamma(
        x.unsqueeze(-1) - 0.5 * j
    ).sum(-1)


def _multidigamma(x: Tensor, n_features: int) -> Tensor:
    j = torch.arange(n_features, dtype=x.dtype, device=x.device)
    return torch.digamma(x.unsqueeze(-1) - 0.5 * j).sum(-1)


def kl_posterior(q: VBPosterior, p: VBPosterior) -> Tensor:
    """``KL(q || p)`` of two posteriors of one family (module docstring), shape ().

    The weights' Dirichlet (or every stick's Beta) plus, per component, the Wishart of the
    precision and the expected KL of the Normal of the mean given the precision (for tied,
    the shared Wishart once plus every component's Normal).

    Raises:
        ValueError: the two are not of one family (see :func:`aggregate_posteriors`).
    """
    (q, p), _ = _check([q, p], [1.0, 1.0])
    d = q.n_features
    wq, wp = q.weight_concentration, p.weight_concentration
    if q.weight_concentration_prior_type == "dirichlet_process":
        kl_weights = kl_dirichlet(wq.T, wp.T).sum()
    else:
        kl_weights = kl_dirichlet(wq, wp)
    nu_q, _, prec_q, log_det_q = _full_components(q)
    nu_p, cov_p, _, log_det_p = _full_components(p)
    # Wishart scales V = E[Lambda] / nu: log det V = log det E[Lambda] - d log nu.
    log_v_q = log_det_q - d * nu_q.log()
    log_v_p = log_det_p - d * nu_p.log()
    trace = (nu_p / nu_q) * torch.einsum("gde,ged->g", cov_p, prec_q)  # tr(V_p^-1 V_q)
    kl_wishart = (
        0.5 * nu_p * (log_v_p - log_v_q)
        + 0.5 * nu_q * (trace - d)
        + _log_multigamma(0.5 * nu_p, d)
        - _log_multigamma(0.5 * nu_q, d)
        + 0.5 * (nu_q - nu_p) * _multidigamma(0.5 * nu_q, d)
    ).sum()
    ratio = p.mean_precision / q.mean_precision
    diff = q.means - p.means
    quad = torch.einsum("kd,kde,ke->k", diff, prec_q[_groups(q)], diff)
    kl_normal = 0.5 * (d * ratio - d - d * ratio.log() + p.mean_precision * quad).sum()
    return kl_weights + kl_wishart + kl_normal


# --------------------------------------------------------------------------- evidence


def scale_evidence(posterior: VBPosterior, prior: VBPrior, factor: Tensor) -> VBPosterior:
    """The components of ``posterior`` with their evidence scaled by ``factor``: in
    natural coordinates ``eta_0 + factor_k (eta_k - eta_0)``, the prior ``eta_0`` kept once
    (``p_0 (q / p_0)^factor``, normalised). For a posterior that is the prior plus the
    statistics of ``n`` rows this is the posterior of ``factor * n`` such rows: ``beta``,
    ``nu`` and the scatter grow, ``m`` moves away from the prior mean.

    Args:
        posterior: full, diag or spherical components (weights are returned unchanged).
        prior: its prior (same covariance type and width).
        factor: (n_components,) >= 1 (1 leaves a component as it is).

    A component whose evidence is not positive in every part (``beta <= beta_0`` or
    ``nu <= nu_0``, which moment matching can give when the inputs disagree) or whose scaled
    scale matrix is not positive definite is returned unchanged. Diag and spherical scale
    matrices are projected as :func:`aggregate_posteriors` does.

    Raises:
        ValueError: tied posteriors, or ``factor`` of the wrong shape or < 1.
    """
    ct = posterior.covariance_type
    if ct == "tied":
        raise ValueError("scale_evidence needs independent components; got covariance_type 'tied'.")
    if prior.covariance_type != ct or prior.n_features != posterior.n_features:
        raise ValueError("prior must have the posterior's covariance_type and n_features.")
    k, d = posterior.n_components, posterior.n_features
    like = {"dtype": posterior.means.dtype, "device": posterior.means.device}
    factor = torch.as_tensor(factor).to(**like)
    if tuple(factor.shape) != (k,) or not bool((factor >= 1).all()):
        raise ValueError(f"factor must have shape ({k},) and values >= 1.")
    beta0, nu0 = float(prior.mean_precision), float(prior.degrees_of_freedom)
    m0 = prior.mean.to(**like)
    cov0 = prior.covariance.to(**like)
    scale0 = _unproject(cov0.unsqueeze(0) if ct != "spherical" else cov0.reshape(1), ct, d)[0]
    dof, cov, _, _ = _full_components(posterior)
    beta, m = posterior.mean_precision, posterior.means
    new_beta = beta0 + factor * (beta - beta0)
    new_dof = nu0 + factor * (dof - nu0)
    new_means = (beta0 * m0 + factor.unsqueeze(1) * (beta.unsqueeze(1) * m - beta0 * m0)) / (
        new_beta.unsqueeze(1)
    )

    # T = W^-1 + beta m m^T is natural; W^-1 of the result from the scaled T
    def outer(b: Tensor, v: Tensor) -> Tensor:
        return b.reshape(-1, 1, 1) * (v.unsqueeze(-1) * v.unsqueeze(-2))

    t0 = scale0 + beta0 * torch.outer(m0, m0)
    t = dof.reshape(-1, 1, 1) * cov + outer(beta, m)
    scale_inverse = t0 + factor.reshape(-1, 1, 1) * (t - t0) - outer(new_beta, new_means)
    scale_inverse = 0.5 * (scale_inverse + scale_inverse.transpose(-1, -2))
    new_cov_full = scale_inverse / new_dof.reshape(-1, 1, 1)
    ok = (beta > beta0) & (dof > nu0) & (torch.linalg.cholesky_ex(new_cov_full).info == 0)
    ok = ok & torch.isfinite(new_cov_full).flatten(1).all(1)
    keep = ~ok
    new_beta = torch.where(keep, beta, new_beta)
    new_dof = torch.where(keep, dof, new_dof)
    new_means = torch.where(keep.unsqueeze(1), m, new_means)
    new_cov_full = torch.where(keep.reshape(-1, 1, 1), cov, new_cov_full)
    covariances = _project(new_cov_full, ct)
    wc, kind = posterior.weight_concentration, posterior.weight_concentration_prior_type
    return VBPosterior.from_covariances(wc, new_beta, new_means, new_dof, covariances, ct, kind)
