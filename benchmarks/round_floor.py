"""What a federated EM round of many clients cannot skip, timed beside the round itself.

A round of ``n`` clients under ``K`` full Gaussians of width ``d`` does at least the work of
one centralized E-step (the clients' rows are the pooled rows), and its server gate checks
every reply's ``n_k S_k - s_k s_k^T`` for positive semi-definiteness: ``n * K`` Cholesky
factorisations of ``d x d`` matrices (``trust/batch_checks.py``), however the replies are
packed. Between them the replies' statistics are written by the clients and read by the
server at least once. :func:`floor_line` times these parts on one thread, next to the
centralized iteration, so that a round's ratio can be read against the least it could be:

- the pooled rows' E-step (:func:`~fednovelty.mixture.stats.e_step_stats`), and the same rows
  as the clients' batched E-steps (:func:`~fednovelty.mixture.batched_stats.
  e_step_stats_many` over :func:`~fednovelty.mixture.batched_stats.set_groups`, as the client
  step runs them, without release or packing);
- ``torch.linalg.cholesky_ex`` on ``n * K`` symmetric positive-definite ``d x d`` matrices in
  float64 (LAPACK's cost does not depend on the values once the matrix is positive definite);
- one copy of the replies' second moments as symmetric triangles, ``(n, K, d(d+1)/2)``.

Not an installed module: ``benchmarks`` is the repository's package of scripts.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence

import torch
from torch import Tensor

from fednovelty.mixture import MixtureParams
from fednovelty.mixture.batched_stats import budget_rows, e_step_stats_many, set_groups
from fednovelty.mixture.density import Workspace
from fednovelty.mixture.em import moment_shift
from fednovelty.mixture.stats import e_step_stats


def best_seconds(fn: Callable[[], object], repeats: int = 3) -> float:
    """The best wall time of ``repeats`` calls of ``fn``."""
    best = float("inf")
    for _ in range(repeats):
        started = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - started)
    return best


def batched_e_steps(clients: Sequence[Tensor], params: MixtureParams) -> None:
    """Every client's E-step statistics in the client step's groups (no release)."""
    k, d = params.means.shape
    groups, alone = set_groups([len(x) for x in clients], budget_rows(k, d))
    workspace, shift, log_weights = Workspace(), moment_shift(params), params.weights.log()
    args = (log_weights, params.means, params.precisions_cholesky, "full", shift)
    for group in groups:
        e_step_stats_many([clients[i] for i in group], *args, workspace=workspace)
    for i in alone:
        e_step_stats(clients[i], *args, workspace=workspace)


def positive_definite(n: int, d: int, seed: int = 0) -> Tensor:
    """(n, d, d) float64 symmetric positive-definite matrices ``W W^T + d I``, made exactly
    symmetric (a product's two triangles may round differently)."""
    generator = torch.Generator().manual_seed(seed)
    W = torch.randn(n, d, d, dtype=torch.float64, generator=generator)
    gram = W @ W.transpose(-1, -2)
    gram = (gram + gram.transpose(-1, -2)) / 2
    gram.diagonal(dim1=-2, dim2=-1).add_(d)
    return gram


def cholesky_seconds(n: int, d: int) -> float:
    """The best time of ``torch.linalg.cholesky_ex`` on :func:`positive_definite` (n, d, d)."""
    grams = positive_definite(n, d)
    if not bool((torch.linalg.cholesky_ex(grams)[1] == 0).all()):
        raise RuntimeError("the floor's matrices are not positive definite")
    return best_seconds(lambda: torch.linalg.cholesky_ex(grams))


def floor_line(
    pooled: Tensor, clients: Sequence[Tensor], params: MixtureParams, central_s: float
) -> str:
    """The parts above, each in seconds and as a multiple of ``central_s`` (one centralized
    iteration), and their sum with the pooled E-step: the least ratio a round can have."""
    k, d = params.means.shape
    n = len(clients)
    args = (params.weights.log(), params.means, params.precisions_cholesky, "full")
    pooled_s = best_seconds(lambda: e_step_stats(pooled, *args, moment_shift(params)))
    batched_s = best_seconds(lambda: batched_e_steps(clients, params))
    cholesky_s = cholesky_seconds(n * k, d)
    triangles = torch.zeros(n, k, d * (d + 1) // 2, dtype=torch.float64)
    copy_s = best_seconds(triangles.clone)
    floor = pooled_s + cholesky_s + copy_s

    def part(seconds: float) -> str:
        return f"{seconds:.3f} s ({seconds / central_s:.2f}x)"

    return (
        f"   the floor (one thread, best of 3; x = one centralized iteration, {central_s:.3f} s): "
        f"pooled E-step {part(pooled_s)}; the clients' E-steps batched {part(batched_s)}; "
        f"{n * k:,} Cholesky factorisations of {d} x {d} {part(cholesky_s)}; one copy of the "
        f"replies' triangles {part(copy_s)}; pooled E-step + factorisations + copy = "
        f"{floor / central_s:.2f}x"
    )
