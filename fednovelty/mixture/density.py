"""Component log-densities and responsibilities (the E-step kernels).

The formulas are scikit-learn's ``_estimate_log_gaussian_prob`` written as batched torch
operations. For full covariances one matrix product replaces sklearn's Python loop over
components: with the rows augmented by a column of ones,

    [X, 1] @ [[U_1 ... U_K], [-mu_1 U_1 ... -mu_K U_K]]  ->  (n_rows, n_components * n_features)

gives every ``y_ik = (x_i - mu_k) U_k`` in one GEMM (the subtraction of ``mu_k U_k`` rides in
the GEMM's accumulation instead of a separate pass over the large buffer), and
``log N = -0.5 * (d log 2 pi + ||y_ik||^2) + log det U_k``. ``diag`` and ``spherical`` expand
the square as scikit-learn does, as one GEMM on ``[x, x**2, 1]`` (``[x, ||x||**2, 1]``).

Where the time goes on CPU, and what is done about it (figures: ``benchmarks/README.md``,
"E-step kernels"):

* The two GEMMs of a full-covariance E-step are near the machine's peak; the passes over the
  (rows, K * d) buffer around them (square, row sums, the weighted copy for the second
  moments) are memory bound. ``ComponentDensity.log_prob`` therefore runs GEMM, square and
  sum block by block (``BLOCK_BYTES`` per thread, about L2 size), so the buffer is read back
  from cache, and the buffer is allocated once per call, not per chunk.
* ``exp`` of arguments whose result underflows takes a slow scalar path in torch's vectorised
  kernels; responsibilities of far components are exactly that
  (below -87 in float32). ``exp_flushed_`` keeps every argument in range and zeroes those
  results, and ``normalize_rows_`` reuses the log-sum-exp's exponentials as responsibilities.
* Constants of the log-density are applied in scikit-learn's order for plain log-densities
  (values match sklearn to ~1e-10 even at |log p| ~ 1e7) and folded into one bias (into the
  GEMM for diag/spherical) when an E-step offset ``log pi`` is given.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from fednovelty.mixture.covariance import check_covariance_type, log_det_cholesky

LOG_2PI = math.log(2 * math.pi)
#: Bytes per CPU thread of the (rows, n_components * n_features) work buffer processed at a
#: time: small enough to stay in a core's L2 cache between the GEMM that writes it and the
#: passes that read it back.
BLOCK_BYTES = 1 << 20


class Workspace:
    """Reusable scratch buffers by name, grown on demand (never shrunk).

    ``get(name, shape, like)`` returns a view of at least ``prod(shape)`` elements with the dtype
    and device of ``like``; its contents are undefined. A view stays valid until the next
    ``get`` of the same name. ``density(...)`` keeps the last :class:`ComponentDensity` built
    through it for calls with the same parameters.
    """

    def __init__(self) -> None:
        self._buffers: dict[str, Tensor] = {}
        self._density: tuple | None = None

    def density(
        self,
        means: Tensor,
        shift: Tensor,
        precisions_cholesky: Tensor,
        covariance_type: str,
        offset: Tensor | None = None,
    ) -> ComponentDensity:
        """``ComponentDensity(means - shift, precisions_cholesky, covariance_type, offset,
        self)``: the one the last call built where each of that call's arguments is the same
        tensor, unchanged since (same ``_version``), or holds the same values (same dtype,
        device and shape, ``torch.equal``), else a new one. The clients of a round that one
        process runs share the broadcast's parameters, so their factors are built once a
        round.
        """
        given = (means, shift, precisions_cholesky, offset)
        cached = self._density
        if (
            cached is not None
            and cached[0] == covariance_type
            and all(
                _unchanged(seen, t) or _same_values(kept, t)
                for seen, kept, t in zip(cached[1], cached[2], given, strict=True)
            )
        ):
            return cached[3]
        density = ComponentDensity(
            means - shift, precisions_cholesky, covariance_type, offset, workspace=self
        )
        seen = tuple(None if t is None else (t, t._version) for t in given)
        # copies: the values the density was built from, whatever becomes of the arguments
        kept = tuple(None if t is None else t.clone() for t in given)
        self._density = (covariance_type, seen, kept, density)
        return density

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


def _unchanged(seen: tuple[Tensor, int] | None, t: Tensor | None) -> bool:
    """``t`` is the tensor of ``seen`` (``(tensor, its _version then)``), not modified since
    (every in-place operation moves ``_version``)."""
    return seen is not None and seen[0] is t and t._version == seen[1]


def _same_values(a: Tensor | None, b: Tensor | None) -> bool:
    """Both ``None``, or tensors of one dtype, device and shape with equal values."""
    if a is None or b is None:
        return a is b
    return a.dtype == b.dtype and a.device == b.device and a.shape == b.shape and torch.equal(a, b)


class ComponentDensity:
    """``log N(x_i | mu_k, Sigma_k) + offset_k`` for chunks of rows, shape (n_rows, n_components).

    Everything that depends only on the parameters (stacked factors, log-determinants) is
    computed once here.

    The kernels read *augmented* rows ``A`` of shape (n_rows, width) built by ``augment(X)``
    (or by writing the rows into ``augmented(n, like)[:, :d]`` and calling ``complete``):
    ``[x, 1]`` for ``full`` and ``tied``, ``[x, x**2, 1]`` for ``diag``, ``[x, ||x||**2, 1]``
    for ``spherical``. ``stats.e_step_stats`` gets all its statistics but the full/tied
    second moments from one GEMM ``resp^T @ A``: sums, diagonal second moments or traces, and
    (from the ones) the counts.

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
        # Without an offset (plain log-densities) the constants are applied in scikit-learn's
        # order, -0.5 * (d log 2 pi + maha) + log_det, which reproduces sklearn's values to
        # about 1e-10 even for far-away rows (|log p| ~ 1e7). With an offset (the E-step) they
        # are folded into one bias (for diag/spherical into the GEMM): equal to a few ulp,
        # and 2-4 passes over the (rows, K) result fewer.
        self.log_det = log_det_cholesky(precisions_cholesky, covariance_type, d)
        self.offset = offset
        self.bias = None if offset is None else self.log_det - 0.5 * d * LOG_2PI + offset
        if covariance_type == "full":
            # (d + 1, K * d): [U_1 ... U_K] over [-mu_1 U_1 ... -mu_K U_K].
            self.factors = torch.cat(
                [
                    precisions_cholesky.permute(1, 0, 2).reshape(d, k * d),
                    -torch.bmm(means.unsqueeze(1), precisions_cholesky).reshape(1, k * d),
                ]
            )
            self.width = d + 1
        elif covariance_type == "tied":
            self.factors = precisions_cholesky
            self.means_projected = means @ precisions_cholesky  # (K, d)
            self.width = d + 1
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
        if self.bias is not None and covariance_type in ("diag", "spherical"):
            # -0.5 * maha + bias in the GEMM: scaling by -0.5 is exact; bias rides on the ones.
            self.factors = self.factors * -0.5
            self.factors[-1] += self.bias

    # ------------------------------------------------------------------ augmented rows
    def augmented(self, n_rows: int, like: Tensor) -> Tensor:
        """The (n_rows, width) buffer of augmented rows; fill ``[:, :d]`` then ``complete``."""
        return self.workspace.get("augmented", (n_rows, self.width), like)

    def complete(self, A: Tensor) -> Tensor:
        """Fill the extra columns of ``A`` from its first ``n_features`` columns; returns ``A``."""
        d, ct = self.n_features, self.covariance_type
        x = A[:, :d]
        if ct in ("full", "tied"):
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
        """Rows per cache block of the (rows, n_components * n_features) work buffer:
        ``BLOCK_BYTES`` per CPU thread; no blocking on other devices."""
        if like.device.type != "cpu":
            return 1 << 62
        row_bytes = self.n_components * self.n_features * like.element_size()
        return max(16, BLOCK_BYTES * torch.get_num_threads() // row_bytes)

    def blocks(self, n_rows: int, like: Tensor) -> list[tuple[int, int]]:
        """``(start, stop)`` of near-equal blocks of at most ``block_rows`` rows covering
        ``n_rows`` (at least one block)."""
        if n_rows == 0:
            return [(0, 0)]
        n_blocks = -(-n_rows // self.block_rows(like))
        size = -(-n_rows // n_blocks)
        return [(start, min(n_rows, start + size)) for start in range(0, n_rows, size)]

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
            blocks = self.blocks(n, A)
            y_all = self.scratch(blocks[0][1], A)
            for start, stop in blocks:
                y = y_all[: stop - start]
                if ct == "full":
                    torch.mm(A[start:stop], self.factors, out=y)  # y_ik = (x_i - mu_k) U_k
                else:
                    projected = A[start:stop, :d] @ self.factors
                    torch.sub(
                        projected.unsqueeze(1),
                        self.means_projected.unsqueeze(0),
                        out=y.view(stop - start, k, d),
                    )
                torch.sum(y.square_().view(stop - start, k, d), 2, out=maha[start:stop])
        elif self.bias is not None:
            return A @ self.factors  # factors already hold -0.5 and the bias
        else:
            maha = A @ self.factors
        if self.bias is not None:
            return maha.mul_(-0.5).add_(self.bias)
        return maha.add_(self.n_features * LOG_2PI).mul_(-0.5).add_(self.log_det)

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
    """``x.exp_()`` with results below ``e * tiny`` (``tiny`` the smallest normal number) set to
    exactly 0; NaN stays NaN.

    Vectorised ``exp`` on CPU takes a slow path for arguments whose
    result underflows (below about -87 in float32, -708 in float64), and log-responsibilities
    of far components live there. Arguments are clamped to ``log(tiny) + 1`` before ``exp``
    and multiplied by a 0/1 mask after (a float mask: ``masked_fill_`` and boolean masks are
    several times slower on CPU); every result at or above ``e * tiny`` is ``exp`` exactly.
    """
    floor = math.log(torch.finfo(x.dtype).tiny) + 1.0
    keep = torch.ge(x, floor, out=torch.empty_like(x))
    return x.clamp_min_(floor).exp_().mul_(keep)


def _finite_row_max(x: Tensor) -> Tensor:
    """Row maxima (n_rows, 1) clamped to the finite range. ``torch.logsumexp`` replaces
    infinite maxima by 0 instead; both give the same log-sum-exp (an all ``-inf`` row stays
    ``-inf``, a row with ``+inf`` stays ``+inf``) and clamping is one operation, not three."""
    big = torch.finfo(x.dtype).max
    return x.amax(dim=1, keepdim=True).clamp_(-big, big)


def logsumexp_rows(x: Tensor) -> Tensor:
    """``torch.logsumexp(x, dim=1)`` for (n_rows, n_columns), without the slow underflowing
    ``exp`` (see ``exp_flushed_``): the flushed terms are below half an ulp of the row sum,
    which is at least 1, so the result is the same to the last bit."""
    maxes = _finite_row_max(x)
    return exp_flushed_(x - maxes).sum(1).log_().add_(maxes.squeeze(1))


def normalize_rows_(weighted_log_prob: Tensor) -> tuple[Tensor, Tensor]:
    """Log-normaliser and responsibilities of (n_rows, n_components) ``log pi_k + log N``,
    overwriting the input with the responsibilities.

    ``log_prob_norm`` is ``torch.logsumexp(.., dim=1)`` to the last bit. The responsibilities
    are ``exp(w_ik - max_i) / sum_k exp(w_ik - max_i)``, reusing the exponentials of the
    log-sum-exp instead of computing ``exp(log_resp)`` again (equal to a few ulp);
    terms below ``e`` times the smallest normal number are 0 (see ``exp_flushed_``).

    Returns:
        ``(log_prob_norm, resp)``, shapes (n_rows,) and (n_rows, n_components); ``resp`` is
        the input tensor.
    """
    maxes = _finite_row_max(weighted_log_prob)
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
