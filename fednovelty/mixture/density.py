"""Component log-densities and responsibilities (the E-step kernels).

The formulas are scikit-learn's ``_estimate_log_gaussian_prob`` written as batched torch
operations. For full covariances one matrix product replaces sklearn's Python loop over
components: with the rows augmented by a column of ones,

    [X, 1] @ [[U_1 ... U_K], [-mu_1 U_1 ... -mu_K U_K]]  ->  (n_samples, n_components * n_features)

gives every ``y_ik = (x_i - mu_k) U_k`` in one GEMM (the subtraction of ``mu_k U_k`` rides in the
GEMM's accumulation instead of a separate pass over the large buffer). Then
``log N = -0.5 * ||y_ik||^2 + (log det U_k - 0.5 d log 2 pi)``. ``diag`` and ``spherical`` expand
the square the way scikit-learn does and also need one GEMM each.

Speed on CPU comes from touching the large ``(rows, n_components * n_features)`` buffer as few
times as possible and from reusing it: ``ComponentDensity`` keeps the parameter-dependent
factors and its work buffers between row chunks, so a chunked E-step allocates them once
(``fednovelty.mixture.stats.e_step_stats`` also reuses the same buffer for the second
moments). ``log_gaussian_prob`` is the one-shot functional form of the same kernels.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from fednovelty.mixture.covariance import check_covariance_type, log_det_cholesky

LOG_2PI = math.log(2 * math.pi)
#: Bytes of the (rows, n_components * n_features) work buffer processed at a time: small
#: enough to stay in a core's L2 cache between the GEMM that writes it and the passes that
#: read it back.
BLOCK_BYTES = int(__import__("os").environ.get("FEDNOVELTY_BLOCK_BYTES", 1 << 20))


class Workspace:
    """Reusable scratch buffers by name, grown on demand (never shrunk).

    ``get(name, shape, like)`` returns a view of at least ``prod(shape)`` elements with the dtype
    and device of ``like``; its contents are undefined. A view stays valid until the next
    ``get`` of the same name.
    """

    def __init__(self) -> None:
        self._buffers: dict[str, Tensor] = {}

    def get(self, name: str, shape: tuple[int, ...], like: Tensor) -> Tensor:
        numel = math.prod(shape)
        buffer = self._buffers.get(name)
        if (
            buffer is None
            or buffer.numel() < numel
            or buffer.dtype != like.dtype
            or buffer.device != like.device
        ):
            buffer = torch.empty(numel, dtype=like.dtype, device=like.device)
            self._buffers[name] = buffer
        return buffer[:numel].view(shape)


class ComponentDensity:
    """``log N(x_i | mu_k, Sigma_k) + offset_k`` for chunks of rows, shape (n_rows, n_components).

    Everything that depends only on the parameters (stacked factors, log-determinants) is
    computed once here.

    The kernels read *augmented* rows ``A`` of shape (n_rows, width) built by
    ``augment(X)`` (or written in place through ``rows_view``): ``A[:, :d]`` holds the rows and
    the other columns what the covariance type needs (ones for ``full``; ``x**2`` and ones for
    ``diag``; ``||x||**2`` and ones for ``spherical``). ``stats.e_step_stats`` reuses these
    extra columns for the moments.

    Args:
        means: shape (n_components, n_features).
        precisions_cholesky: shape per ``covariance_type``.
        covariance_type: ``full``, ``tied``, ``diag`` or ``spherical``.
        offset: added to every row's log-densities, shape (n_components,) (e.g. log weights);
            ``None`` for plain log-densities.
        workspace: where the large buffers live; a fresh one by default.
    """

    def __init__(
        self,
        means: Tensor,
        precisions_cholesky: Tensor,
        covariance_type: str,
        offset: Tensor | None = None,
        workspace: Workspace | None = None,
    ) -> None:
        check_covariance_type(covariance_type)
        self.covariance_type = covariance_type
        self.n_components, self.n_features = means.shape
        self.workspace = workspace if workspace is not None else Workspace()
        k, d = self.n_components, self.n_features
        # Constants are applied in scikit-learn's order, -0.5 * (d log 2 pi + maha) + log_det
        # (+ log pi): folding them into one bias would change the last bits of log-densities
        # of far-away rows (|log p| ~ 1e7), which the tests compare to sklearn to 1e-10.
        self.log_det = log_det_cholesky(precisions_cholesky, covariance_type, d)
        self.offset = offset
        if covariance_type == "full":
            # (d + 1, K * d): [U_1 ... U_K] over [-mu_1 U_1 ... -mu_K U_K].
            self.factors = torch.cat(
                [
                    precisions_cholesky.permute(1, 0, 2).reshape(d, k * d),
                    -torch.einsum("kd,kde->ke", means, precisions_cholesky).reshape(1, k * d),
                ]
            )
            self.width = d + 1
        elif covariance_type == "tied":
            self.factors = precisions_cholesky
            self.means_projected = means @ precisions_cholesky  # (K, d)
            self.width = d
        elif covariance_type == "diag":
            # maha = x^2 @ P^T - 2 x @ (mu P)^T + sum(mu^2 P): one GEMM on [x, x^2, 1].
            precisions = precisions_cholesky.square()
            self.factors = torch.cat(
                [
                    -2.0 * (means * precisions).T,
                    precisions.T,
                    (means.square() * precisions).sum(1).unsqueeze(0),
                ]
            )
            self.width = 2 * d + 1
        else:
            # maha = (||x||^2 - 2 x @ mu^T + ||mu||^2) * p: one GEMM on [x, ||x||^2, 1].
            precisions = precisions_cholesky.square()
            self.factors = torch.cat(
                [
                    -2.0 * means.T * precisions,
                    precisions.unsqueeze(0),
                    (means.square().sum(1) * precisions).unsqueeze(0),
                ]
            )
            self.width = d + 2

    # ------------------------------------------------------------------ augmented rows
    def augmented(self, n_rows: int, like: Tensor) -> Tensor:
        """The (n_rows, width) buffer of augmented rows; fill ``[:, :d]`` then ``complete``."""
        return self.workspace.get("augmented", (n_rows, self.width), like)

    def complete(self, A: Tensor) -> Tensor:
        """Fill the extra columns of ``A`` from its first ``n_features`` columns; returns ``A``."""
        d, ct = self.n_features, self.covariance_type
        x = A[:, :d]
        if ct == "full":
            A[:, d].fill_(1.0)
        elif ct == "diag":
            torch.square(x, out=A[:, d : 2 * d])
            A[:, 2 * d].fill_(1.0)
        elif ct == "spherical":
            torch.linalg.vector_norm(x, dim=1, out=A[:, d]).square_()
            A[:, d + 1].fill_(1.0)
        return A

    def augment(self, X: Tensor) -> Tensor:
        """Augmented copy of rows ``X`` (n_rows, n_features) in the workspace."""
        A = self.augmented(X.shape[0], X)
        A[:, : self.n_features].copy_(X)
        return self.complete(A)

    # ------------------------------------------------------------------ kernels
    def block_rows(self, like: Tensor) -> int:
        """Rows per cache block of the (rows, n_components * n_features) work buffer."""
        row_bytes = self.n_components * self.n_features * like.element_size()
        return max(16, BLOCK_BYTES // row_bytes)

    def scratch(self, n_rows: int, like: Tensor) -> Tensor:
        """The (n_rows, n_components * n_features) work buffer of the full/tied kernels; free
        for other use between calls."""
        return self.workspace.get("scratch", (n_rows, self.n_components * self.n_features), like)

    def log_prob(self, A: Tensor) -> Tensor:
        """Log-densities plus offset for augmented rows ``A``; a new (n_rows, n_components)."""
        n = A.shape[0]
        k, d, ct = self.n_components, self.n_features, self.covariance_type
        if ct in ("full", "tied"):
            # GEMM, square and row sums block by block, so that the (rows, K * d) buffer is
            # still in cache when it is squared and summed.
            maha = torch.empty(n, k, dtype=A.dtype, device=A.device)
            block = self.block_rows(A)
            y_all = self.scratch(min(n, block), A)
            for start in range(0, n, block):
                stop = min(n, start + block)
                y = y_all[: stop - start]
                if ct == "full":
                    torch.mm(A[start:stop], self.factors, out=y)  # y_ik = (x_i - mu_k) U_k
                else:
                    projected = A[start:stop] @ self.factors
                    torch.sub(
                        projected.unsqueeze(1),
                        self.means_projected.unsqueeze(0),
                        out=y.view(stop - start, k, d),
                    )
                torch.sum(y.square_().view(stop - start, k, d), 2, out=maha[start:stop])
        else:
            maha = A @ self.factors
        out = maha.add_(self.n_features * LOG_2PI).mul_(-0.5).add_(self.log_det)
        return out if self.offset is None else out.add_(self.offset)

    def __call__(self, X: Tensor) -> Tensor:
        """Log-densities plus offset for plain rows ``X`` (n_rows, n_features)."""
        return self.log_prob(self.augment(X))


def log_gaussian_prob(
    X: Tensor, means: Tensor, precisions_cholesky: Tensor, covariance_type: str
) -> Tensor:
    """Log-density of every sample under every component, ``log N(x_i; mu_k, Sigma_k)``.

    Args:
        X: samples, shape (n_samples, n_features).
        means: shape (n_components, n_features).
        precisions_cholesky: shape given by ``covariance_shape(covariance_type, ...)``.
        covariance_type: one of ``full``, ``tied``, ``diag``, ``spherical``.

    Returns:
        Log-densities, shape (n_samples, n_components).
    """
    return ComponentDensity(means, precisions_cholesky, covariance_type)(X)


def exp_flushed_(x: Tensor) -> Tensor:
    """``x.exp_()`` with results below the smallest normal number flushed to exactly 0.

    Vectorised ``exp`` on CPU takes a slow path (10-150x slower per element) for arguments whose
    result underflows (below about -87 in float32, -708 in float64), and log-responsibilities of
    far components live there. Such arguments are set to 0 before ``exp`` and their results to
    0 after; every other element is ``exp`` exactly.
    """
    under = x < math.log(torch.finfo(x.dtype).tiny)
    return x.masked_fill_(under, 0.0).exp_().masked_fill_(under, 0.0)


def logsumexp_rows(x: Tensor) -> Tensor:
    """``torch.logsumexp(x, dim=1)`` for (n_rows, n_columns), without the slow underflowing
    ``exp`` (see ``exp_flushed_``): the flushed terms are below half an ulp of the row sum,
    which is at least 1, so the result is the same to the last bit."""
    maxes = x.amax(dim=1, keepdim=True)
    maxes.masked_fill_(maxes.abs() == math.inf, 0.0)
    return exp_flushed_(x - maxes).sum(1).log_().add_(maxes.squeeze(1))


def normalize_rows_(weighted_log_prob: Tensor) -> tuple[Tensor, Tensor]:
    """Log-normaliser and responsibilities of (n_rows, n_components) ``log pi_k + log N``,
    overwriting the input with the responsibilities.

    ``log_prob_norm`` is ``torch.logsumexp(.., dim=1)`` to the last bit. The responsibilities
    are ``exp(w_ik - max_i) / sum_k exp(w_ik - max_i)``, reusing the exponentials of the
    log-sum-exp instead of computing ``exp(log_resp)`` again (equal to a few ulp);
    those below the smallest normal number are 0 (see ``exp_flushed_``).

    Returns:
        ``(log_prob_norm, resp)``, shapes (n_rows,) and (n_rows, n_components); ``resp`` is
        the input tensor.
    """
    maxes = weighted_log_prob.amax(dim=1, keepdim=True)
    maxes.masked_fill_(maxes.abs() == math.inf, 0.0)
    resp = exp_flushed_(weighted_log_prob.sub_(maxes))
    sums = resp.sum(1, keepdim=True)
    log_prob_norm = sums.log().add_(maxes).squeeze(1)
    return log_prob_norm, resp.div_(sums)


def log_responsibilities(weighted_log_prob: Tensor) -> tuple[Tensor, Tensor]:
    """Normalise ``log pi_k + log N(x_i | k)`` in log space.

    Args:
        weighted_log_prob: shape (n_samples, n_components).

    Returns:
        ``(log_prob_norm, log_resp)``: the per-sample log-likelihood ``log p(x_i)``, shape
        (n_samples,), and log-responsibilities, shape (n_samples, n_components).
    """
    log_prob_norm = logsumexp_rows(weighted_log_prob)
    return log_prob_norm, weighted_log_prob - log_prob_norm.unsqueeze(1)


def default_chunk_size(n_components: int, n_features: int, budget_bytes: int = 1 << 25) -> int:
    """Rows per chunk so that an (rows, n_components, n_features) float64 buffer fits
    ``budget_bytes`` (32 MiB by default): bounds peak memory and stays cache friendly."""
    return max(256, budget_bytes // (8 * max(1, n_components * n_features)))
