"""``e_step_stats_many``: each set's statistics as the one-set E-step gives them, with the
CPU's cache blocking and with the blocking of other devices (none: every set in one block),
which is what a CUDA run takes and a CPU-only suite otherwise never runs."""

import pytest
import torch

from fednovelty.mixture import precisions_cholesky_from_covariances
from fednovelty.mixture.batched_stats import e_step_stats_many
from fednovelty.mixture.density import ComponentDensity
from fednovelty.mixture.stats import e_step_stats

K, D = 3, 4


def _params(covariance_type: str, generator: torch.Generator):
    means = torch.randn(K, D, generator=generator, dtype=torch.float64) * 2
    A = torch.randn(K, D, D, generator=generator, dtype=torch.float64)
    full = A @ A.transpose(1, 2) + torch.eye(D, dtype=torch.float64)
    covs = {
        "full": full,
        "tied": full[0],
        "diag": full.diagonal(dim1=1, dim2=2),
        "spherical": full.diagonal(dim1=1, dim2=2).mean(1),
    }[covariance_type]
    return means, precisions_cholesky_from_covariances(covs, covariance_type)


def _close(a: torch.Tensor, b: torch.Tensor) -> bool:
    return float((a - b).abs().max()) <= 1e-12 * max(1.0, float(b.abs().max()))


@pytest.fixture(params=["cpu blocks", "other devices' blocks"])
def blocking(request, monkeypatch):
    """The CPU's blocking, or the one ``block_rows`` gives a tensor off the CPU (asked with a
    ``meta`` tensor, so the real branch answers)."""
    if request.param != "cpu blocks":
        original = ComponentDensity.block_rows
        off_cpu = torch.empty(0, device="meta")
        monkeypatch.setattr(
            ComponentDensity, "block_rows", lambda self, like: original(self, off_cpu)
        )
    return request.param


@pytest.mark.parametrize("covariance_type", ["full", "tied", "diag", "spherical"])
def test_each_set_as_the_one_set_e_step(covariance_type, blocking):
    generator = torch.Generator().manual_seed(0)
    rows = [torch.randn(n, D, generator=generator, dtype=torch.float64) * 3 for n in (7, 30, 1)]
    log_weights = torch.log_softmax(torch.randn(3, K, generator=generator), 1).double()
    means, precisions_cholesky = _params(covariance_type, generator)
    shift = torch.cat(rows).mean(0)
    many = e_step_stats_many(
        rows, log_weights, means, precisions_cholesky, covariance_type, shift,
        squared_counts=True, row_log_likelihood=True,
    )  # fmt: skip
    for g, X in enumerate(rows):
        squared = torch.zeros(K, dtype=torch.float64)
        per_row = torch.zeros(X.shape[0], dtype=torch.float64)
        one = e_step_stats(
            X, log_weights[g], means, precisions_cholesky, covariance_type, shift,
            squared_counts=squared, row_log_likelihood=per_row,
        )  # fmt: skip
        for name in ("counts", "sums", "second", "log_likelihood", "n_samples"):
            assert _close(getattr(many, name)[g], getattr(one, name)), (blocking, name)
        assert _close(many.squared[g], squared)
        assert _close(many.row_log_likelihood[g, : X.shape[0]], per_row)


def test_other_devices_take_every_set_in_one_block():
    """The off-CPU answer is a count no buffer could hold: the batched E-step must cap it."""
    density = ComponentDensity.__new__(ComponentDensity)
    assert density.block_rows(torch.empty(0, device="meta")) > 2**40
