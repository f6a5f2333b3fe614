"""Mixtures of factor analysers: low-rank-plus-diagonal covariances with summable statistics.

Component ``k`` has covariance ``Sigma_k = W_k W_k^T + diag(psi_k)`` with factor loadings
``W_k`` (n_features, n_factors) and per-feature noise ``psi_k`` (n_features,); with
``isotropic=True`` every ``psi_k`` is one value repeated (mixtures of probabilistic PCA).
Nothing here forms a (n_features, n_features) matrix except :meth:`FactorParams.covariances`:

- densities use Woodbury's identity and the matrix determinant lemma with the (q, q)
  matrix ``M_k = I + W_k^T Psi_k^{-1} W_k = L_k L_k^T``:
  ``e^T Sigma^{-1} e = e^T Psi^{-1} e - |L^{-1} W^T Psi^{-1} e|^2`` and
  ``log det Sigma = 2 sum log diag L + sum log psi``, so one E-step costs O(N K d q);
- EM is Ghahramani & Hinton's (1996) on the augmented model ``x = [W, mu] [z; 1] + noise``:
  the E-step's statistics per component are ``n_k = sum r``, ``sum r x``, ``sum r x^2``
  (diagonal), ``sum r x E[z|x]^T`` (d, q), ``sum r E[z|x]`` (q,) and ``sum r E[z z^T|x]``
  (q, q), all about a shared ``shift`` (as :mod:`fednovelty.mixture.stats`), so statistics
  of disjoint rows taken under the same parameters **add** and the M-step on their sum is
  the M-step on the pooled rows (federated EM stays exact);
- the M-step solves for ``[W_k, mu_k]`` jointly and then ``psi_k``: an exact EM step (the
  log-likelihood never decreases), optionally MAP for ``psi`` under a
  :class:`~fednovelty.mixture.stats.CovariancePrior` (pseudo-rows of variance ``scale``);
- :mod:`fednovelty.mixture.factor_fit` starts EM from a partition (a summable sketch of each
  part's scatter, then probabilistic PCA's closed form) and runs it to convergence.

All functions are pure and take dtype and device from their inputs.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

import torch
from torch import Tensor

from fednovelty.mixture.containers import ComponentTensors, SummableStats
from fednovelty.mixture.model import MixtureParams
from fednovelty.mixture.stats import CovariancePrior

#: rows' working memory per chunk of the E-step (bytes of the (rows, K, q) buffers).
CHUNK_BYTES = 32 * 2**20


# ----------------------------------------------------------------------------- parameters
@dataclass(frozen=True)
class FactorParams(ComponentTensors):
    """A mixture of factor analysers.

    Attributes:
        weights: mixture weights, (n_components,), positive, summing to 1.
        means: (n_components, n_features).
        factors: loadings ``W``, (n_components, n_features, n_factors).
        psi: noise variances, (n_components, n_features), positive.
    """

    weights: Tensor
    means: Tensor
    factors: Tensor
    psi: Tensor

    def __post_init__(self) -> None:
        check_factor_params(self.weights, self.means, self.factors, self.psi)

    @property
    def n_factors(self) -> int:
        return self.factors.shape[2]

    def covariances(self) -> Tensor:
        """``W W^T + diag(psi)`` materialised, (n_components, n_features, n_features): for
        small ``n_features`` only (O(K d^2) memory)."""
        cov = self.factors @ self.factors.transpose(1, 2)
        return cov + torch.diag_embed(self.psi)

    def to_mixture_params(self) -> MixtureParams:
        """The same mixture as a ``full`` :class:`~fednovelty.mixture.model.MixtureParams`
        (materialises the covariances; small ``n_features`` only)."""
        return MixtureParams.from_covariances(self.weights, self.means, self.covariances(), "full")


def check_factor_params(weights: Tensor, means: Tensor, factors: Tensor, psi: Tensor) -> None:
    """Raise a ``ValueError`` naming the tensor unless the shapes agree
    (weights (K,), means (K, d), factors (K, d, q), psi (K, d)) with ``1 <= q < d``,
    ``psi > 0`` and every value finite."""
    if means.ndim != 2 or weights.shape != means.shape[:1]:
        raise ValueError(
            f"weights must be (n_components,) and means (n_components, n_features); got "
            f"{tuple(weights.shape)} and {tuple(means.shape)}."
        )
    k, d = means.shape
    if factors.ndim != 3 or factors.shape[:2] != (k, d):
        raise ValueError(
            f"factors must be (n_components, n_features, n_factors) = ({k}, {d}, q); got "
            f"{tuple(factors.shape)}."
        )
    check_n_factors(factors.shape[2], d)
    if psi.shape != (k, d):
        raise ValueError(
            f"psi must be (n_components, n_features) = ({k}, {d}); got {tuple(psi.shape)}."
        )
    for name, value in (("weights", weights), ("means", means), ("factors", factors), ("psi", psi)):
        if not bool(torch.isfinite(value).all()):
            raise ValueError(f"{name} has non-finite values; check the input rows and reg_covar.")
    if not bool((psi > 0).all()):
        raise ValueError(
            "psi (the noise variances) must be > 0; increase reg_covar or standardize the rows."
        )


def check_n_factors(n_factors: int, n_features: int) -> int:
    """``n_factors`` if ``1 <= n_factors <= n_features - 1``, else a ``ValueError`` that says
    what to use instead."""
    if isinstance(n_factors, bool) or not isinstance(n_factors, int) or n_factors < 1:
        raise ValueError(f"n_factors must be an integer >= 1, got {n_factors!r}.")
    if n_factors >= n_features:
        raise ValueError(
            f"n_factors={n_factors} needs n_factors <= n_features - 1 = {n_features - 1}; "
            "lower n_factors, or use a full covariance for so few features."
        )
    return n_factors


def check_rows(X: Tensor, n_features: int, what: str = "X") -> None:
    """Raise a ``ValueError`` unless ``X`` is (n_samples, n_features) and finite."""
    if X.ndim != 2 or X.shape[1] != n_features:
        raise ValueError(
            f"{what} must have shape (n_samples, {n_features}) to match the parameters; got "
            f"{tuple(X.shape)}."
        )
    if not bool(torch.isfinite(X).all()):
        raise ValueError(f"{what} has NaN or infinite values; impute or drop them first.")


def affine_factor_params(params: FactorParams, offset: Tensor, scale: Tensor) -> FactorParams:
    """The mixture of ``x = offset + scale * z`` when ``params`` is that of ``z`` (offset,
    scale: (n_features,)): means ``offset + scale mu``, loadings ``diag(scale) W``, noise
    ``scale^2 psi``."""
    return FactorParams(
        params.weights,
        offset + scale * params.means,
        scale.view(1, -1, 1) * params.factors,
        scale.square() * params.psi,
    )


def n_factor_parameters(n_components: int, n_features: int, n_factors: int, isotropic: bool) -> int:
    """Free parameters: weights, means, loadings up to rotation (``d q - q (q - 1) / 2``)
    and noise (``d`` or 1) per component."""
    per = n_features + n_features * n_factors - n_factors * (n_factors - 1) // 2
    per += 1 if isotropic else n_features
    return n_components * per + n_components - 1


# ----------------------------------------------------------------------------- densities
@dataclass(frozen=True)
class _Woodbury:
    """Per-component factors of ``Sigma^{-1}`` and ``log det Sigma``.

    ``inv_psi`` (K, d); ``proj`` = ``Psi^{-1} W L^{-T}`` (K, d, q); ``post_chol_inv_t`` =
    ``L^{-T}`` (K, q, q); ``log_det`` (K,), with ``M = I + W^T Psi^{-1} W = L L^T``."""

    inv_psi: Tensor
    proj: Tensor
    post_chol_inv_t: Tensor
    log_det: Tensor


def _woodbury(factors: Tensor, psi: Tensor) -> _Woodbury:
    """O(K d q^2) precomputation of the Woodbury factors (see :class:`_Woodbury`)."""
    q = factors.shape[2]
    inv_psi = 1.0 / psi
    scaled = inv_psi.unsqueeze(2) * factors  # Psi^{-1} W, (K, d, q)
    eye = torch.eye(q, dtype=factors.dtype, device=factors.device)
    M = eye + factors.transpose(1, 2) @ scaled
    L, info = torch.linalg.cholesky_ex(0.5 * (M + M.transpose(1, 2)))
    if bool((info > 0).any()):
        raise ValueError(
            "I + W^T Psi^{-1} W is not positive definite (loadings or noise out of range); "
            "increase reg_covar or standardize the rows."
        )
    inv_t = torch.linalg.solve_triangular(L, eye.expand_as(L), upper=False).transpose(1, 2)
    proj = scaled @ inv_t  # Psi^{-1} W L^{-T}
    log_det = 2 * torch.diagonal(L, dim1=1, dim2=2).log().sum(1) + psi.log().sum(1)
    return _Woodbury(inv_psi, proj, inv_t, log_det)


def _chunk_rows(n_components: int, n_features: int, n_factors: int, itemsize: int) -> int:
    """Rows per chunk so that the (rows, K, q) and (rows, d) buffers fit ``CHUNK_BYTES``."""
    width = 3 * n_components * n_factors + 2 * n_features + 4 * n_components
    return max(1, CHUNK_BYTES // (itemsize * width))


def _chunk_terms(
    centered: Tensor, centered_means: Tensor, wood: _Woodbury
) -> tuple[Tensor, Tensor]:
    """``log N(x_i; mu_k, Sigma_k)`` (n, K) and ``u_ik = L_k^{-1} W_k^T Psi_k^{-1} (x_i -
    mu_k)`` (n, K, q) of rows ``centered`` (n, d) against means ``centered_means`` (K, d),
    both about the same shift."""
    n, d = centered.shape
    k, _, q = wood.proj.shape
    # e^T Psi^{-1} e = x^2 . (1/psi) - 2 x . (m/psi) + m^2 . (1/psi), one GEMM each
    m_scaled = centered_means * wood.inv_psi
    maha = centered.square() @ wood.inv_psi.T - 2 * centered @ m_scaled.T
    maha = maha + (centered_means * m_scaled).sum(1)
    flat = wood.proj.permute(1, 0, 2).reshape(d, k * q)
    u = (centered @ flat).view(n, k, q) - torch.einsum("kd,kdq->kq", centered_means, wood.proj)
    maha = maha - u.square().sum(2)
    log_prob = -0.5 * (d * math.log(2 * math.pi) + wood.log_det + maha)
    return log_prob, u


def factor_log_prob(X: Tensor, params: FactorParams, chunk_size: int | None = None) -> Tensor:
    """``log N(x_i; mu_k, W_k W_k^T + diag(psi_k))`` for every row and component,
    (n_samples, n_components), in O(N K d q) time and without any (d, d) matrix.

    Args:
        X: rows, (n_samples, n_features).
        params: the mixture (its weights are not used).
        chunk_size: rows per chunk (default: buffers of ``CHUNK_BYTES``).
    """
    check_rows(X, params.n_features)
    wood = _woodbury(params.factors, params.psi)
    shift = params.weights @ params.means
    means = params.means - shift
    step = chunk_size or _chunk_rows(
        params.n_components, params.n_features, params.n_factors, X.element_size()
    )
    parts = [
        _far_rows_redone(X[s : s + step] - shift, means, wood) for s in range(0, X.shape[0], step)
    ]
    return torch.cat(parts) if parts else X.new_zeros(0, params.n_components)


def _far_rows_redone(centered: Tensor, centered_means: Tensor, wood: _Woodbury) -> Tensor:
    """``_chunk_terms``' log-densities (n, K), with the rows whose Woodbury difference
    ``e^T Psi^{-1} e - |u|^2`` overflowed (inf - inf: rows near the dtype's limit) taken
    again on ``e / s`` with ``s = max |e|``, then scaled by ``s^2``: a far row gets a very
    low (or ``-inf``) log-density, never NaN."""
    log_prob, _ = _chunk_terms(centered, centered_means, wood)
    bad = torch.isnan(log_prob).any(1)
    if not bool(bad.any()):
        return log_prob
    d = centered.shape[1]
    constant = d * math.log(2 * math.pi) + wood.log_det
    for i in torch.nonzero(bad).flatten().tolist():
        row = centered[i : i + 1]
        scale = torch.maximum(row.abs().amax(), centered_means.abs().amax()).clamp_min(1.0)
        small, _ = _chunk_terms(row / scale, centered_means / scale, wood)
        maha = (-2 * small[0] - constant).clamp_min(0.0) * scale.square()
        log_prob[i] = -0.5 * (constant + maha)
    return log_prob


def factor_score_samples(X: Tensor, params: FactorParams, chunk_size: int | None = None) -> Tensor:
    """``log p(x_i) = log sum_k pi_k N(x_i; mu_k, Sigma_k)``, (n_samples,)."""
    return torch.logsumexp(factor_log_prob(X, params, chunk_size) + params.weights.log(), dim=1)


# ----------------------------------------------------------------------------- statistics
@dataclass(frozen=True)
class FactorStats(SummableStats):
    """Sums over rows that determine the MFA M-step; merge with ``+`` (same shift, and
    taken under the same parameters).

    Attributes:
        counts: ``sum_i r_ik``, (n_components,).
        sums: ``sum_i r_ik (x_i - shift)``, (n_components, n_features).
        second: ``sum_i r_ik (x_i - shift)^2`` per feature, (n_components, n_features).
        xz: ``sum_i r_ik (x_i - shift) E[z | x_i, k]^T``, (n_components, n_features, n_factors).
        sum_z: ``sum_i r_ik E[z | x_i, k]``, (n_components, n_factors).
        zz: ``sum_i r_ik E[z z^T | x_i, k]``, (n_components, n_factors, n_factors).
        shift: the common reference point, (n_features,).
        log_likelihood: ``sum_i log p(x_i)`` under the E-step's parameters, ().
        n_samples: rows summed, ().
    """

    counts: Tensor
    sums: Tensor
    second: Tensor
    xz: Tensor
    sum_z: Tensor
    zz: Tensor
    shift: Tensor
    log_likelihood: Tensor
    n_samples: Tensor

    SUMMED = ("counts", "sums", "second", "xz", "sum_z", "zz", "log_likelihood", "n_samples")
    SHAPED = ("xz",)
    AXES = "(n_components, n_features, n_factors)"
    WHAT = "factor statistics"

    def tensors(self) -> dict[str, Tensor]:
        """The summed tensors by name (what crosses the wire; the shift is the server's)."""
        return {name: getattr(self, name) for name in self.SUMMED}


def zero_factor_stats(n_components: int, n_factors: int, shift: Tensor) -> FactorStats:
    """Statistics of zero rows (dtype and device of ``shift`` (n_features,))."""
    k, d, q = n_components, shift.shape[0], n_factors
    z = {"dtype": shift.dtype, "device": shift.device}
    return FactorStats(
        counts=torch.zeros(k, **z),
        sums=torch.zeros(k, d, **z),
        second=torch.zeros(k, d, **z),
        xz=torch.zeros(k, d, q, **z),
        sum_z=torch.zeros(k, q, **z),
        zz=torch.zeros(k, q, q, **z),
        shift=shift,
        log_likelihood=torch.zeros((), **z),
        n_samples=torch.zeros((), **z),
    )


def factor_e_step(
    X: Tensor,
    params: FactorParams,
    shift: Tensor,
    *,
    log_weights: Tensor | None = None,
    chunk_size: int | None = None,
    squared_counts: Tensor | None = None,
    row_log_likelihood: Tensor | None = None,
) -> FactorStats:
    """The E-step of rows ``X`` (n_samples, n_features) under ``params`` folded into
    :class:`FactorStats` about ``shift`` (n_features,), in O(N K d q) time, row chunks of
    bounded memory.

    With ``u_ik = L_k^{-1} W_k^T Psi_k^{-1} (x_i - mu_k)``: ``E[z | x_i, k] = L_k^{-T} u_ik``
    and ``E[z z^T | x_i, k] = M_k^{-1} + E[z] E[z]^T``.

    Args:
        log_weights: (n_components,) log weights of the responsibilities; default
            ``log params.weights``.
        squared_counts: if given, a (n_components,) tensor to which ``sum_i r_ik^2`` is
            added (with ``counts``: each component's effective rows, for a privacy floor).
        row_log_likelihood: if given, a (n_samples,) tensor filled with each row's
            ``log p(x_i)`` (the terms of the returned ``log_likelihood``).
    """
    check_rows(X, params.n_features)
    k, d, q = params.n_components, params.n_features, params.n_factors
    if X.shape[0] == 0:
        return zero_factor_stats(k, q, shift)
    wood = _woodbury(params.factors, params.psi)
    log_w = params.weights.log() if log_weights is None else log_weights
    means = params.means - shift
    stats = zero_factor_stats(k, q, shift)
    acc = {name: t.clone() for name, t in stats.tensors().items()}
    step = chunk_size or _chunk_rows(k, d, q, X.element_size())
    for start in range(0, X.shape[0], step):
        centered = X[start : start + step] - shift
        n = centered.shape[0]
        log_prob, u = _chunk_terms(centered, means, wood)
        weighted = log_prob + log_w
        log_norm = torch.logsumexp(weighted, dim=1, keepdim=True)
        resp = (weighted - log_norm).exp()
        ez = torch.einsum("nkp,kqp->nkq", u, wood.post_chol_inv_t)  # L^{-T} u
        rz = resp.unsqueeze(2) * ez
        acc["log_likelihood"] += log_norm.sum()
        if row_log_likelihood is not None:
            row_log_likelihood[start : start + n] = log_norm.squeeze(1)
        acc["counts"] += resp.sum(0)
        acc["sums"] += resp.T @ centered
        acc["second"] += resp.T @ centered.square()
        acc["sum_z"] += rz.sum(0)
        acc["xz"] += (centered.T @ rz.reshape(n, k * q)).view(d, k, q).transpose(0, 1)
        acc["zz"] += torch.einsum("nkp,nkq->kpq", rz, ez)
        if squared_counts is not None:
            squared_counts += resp.square().sum(0)
    post_cov = wood.post_chol_inv_t @ wood.post_chol_inv_t.transpose(1, 2)  # M^{-1}
    acc["zz"] = acc["zz"] + acc["counts"].view(-1, 1, 1) * post_cov
    acc["zz"] = 0.5 * (acc["zz"] + acc["zz"].transpose(1, 2))
    acc["n_samples"] = torch.tensor(float(X.shape[0]), dtype=X.dtype, device=X.device)
    return replace(stats, **acc)


def shrink_psi(psi: Tensor, nk: Tensor, prior: CovariancePrior | None, isotropic: bool) -> Tensor:
    """Noise variances ``psi`` (K, d) of components of ``nk`` (K,) rows, averaged over the
    features with ``isotropic``, then the MAP of ``prior`` (its ``strength`` pseudo-rows of
    variance ``scale``): ``(n_k psi + strength * scale) / (n_k + strength)``. The M-step's
    and the sketch start's (:mod:`fednovelty.mixture.factor_fit`) last step before
    ``reg_covar``."""
    if isotropic:
        psi = psi.mean(1, keepdim=True).expand_as(psi)
    if prior is None:
        return psi
    nu = float(prior.strength)
    target = prior.scale.to(psi.device, psi.dtype)
    if target.shape != psi.shape[1:]:
        raise ValueError(
            f"the prior's scale has shape {tuple(target.shape)}; expected ({psi.shape[1]},), "
            "one variance per feature."
        )
    if isotropic:
        target = target.mean().expand_as(target)
    w = (nk / (nk + nu)).unsqueeze(1)
    return w * psi + (1 - w) * target


def factor_m_step(
    stats: FactorStats,
    reg_covar: float = 1e-6,
    *,
    prior: CovariancePrior | None = None,
    isotropic: bool = False,
) -> FactorParams:
    """Parameters from (summed) statistics: ``[W_k, mu_k - shift] = B_k A_k^{-1}`` with
    ``A_k = [[zz, sum_z], [sum_z^T, n_k]]`` ((q+1, q+1)) and ``B_k = [xz, sums]`` ((d, q+1)),
    then ``psi_k = (second - rowsum([W_k, mu_k - shift] * B_k)) / n_k`` (its mean over
    features with ``isotropic``), MAP towards ``prior.scale`` with ``prior``, plus
    ``reg_covar``. Counts get ``10 * eps`` each, as the Gaussian M-step does (and ``zz``
    ``10 * eps * I``).
    """
    eps = torch.finfo(stats.counts.dtype).eps
    nk = stats.counts + 10 * eps
    k, _, q = stats.xz.shape
    A = stats.zz.new_empty(k, q + 1, q + 1)
    # the 10 eps of every count also backs E[z z^T] = I, so an empty component solves to
    # W = 0 and mu = shift instead of a singular system
    A[:, :q, :q] = stats.zz + 10 * eps * torch.eye(q, dtype=A.dtype, device=A.device)
    A[:, :q, q] = stats.sum_z
    A[:, q, :q] = stats.sum_z
    A[:, q, q] = nk
    B = torch.cat([stats.xz, stats.sums.unsqueeze(2)], dim=2)  # (K, d, q+1)
    augmented = torch.linalg.solve(A, B.transpose(1, 2)).transpose(1, 2)  # B A^{-1}
    psi = (stats.second - (augmented * B).sum(2)) / nk.unsqueeze(1)
    psi = shrink_psi(psi.clamp_min(0), nk, prior, isotropic) + reg_covar
    weights = nk / nk.sum()
    means = stats.shift + augmented[:, :, q]
    return FactorParams(weights, means, augmented[:, :, :q].contiguous(), psi.contiguous())
