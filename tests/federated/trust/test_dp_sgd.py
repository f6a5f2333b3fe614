"""DP-SGD for the learners: per-row gradients against autograd row by row, clipping against
numpy, the noise against its calibration, one noise-free step against plain full-batch SGD,
and the accounting against closed forms (Gaussian differential privacy) and dp-accounting's
Renyi accountant (an independent method)."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from scipy.special import ndtr
from torch import nn
from torch.func import functional_call

from fednovelty.federated.core.learners import mlp_learner
from fednovelty.federated.trust.dp_sgd import (
    DPSGDSettings,
    calibrate_learning,
    clipped_gradient_sum,
    learning_epsilon,
    pair_settings,
    pair_units,
    per_row_gradients,
    private_gradient,
    private_sgd,
    release_blocks,
    steps_for_epochs,
)
from fednovelty.federated.trust.noise import SeededNoise, fresh_noise

F64 = torch.float64


def _learners(m: int = 2, seed: int = 0):
    torch.manual_seed(seed)
    template = mlp_learner(4, 3, hidden=5).to(F64)
    params = [
        {k: v.detach().clone() for k, v in mlp_learner(4, 3, hidden=5).to(F64).named_parameters()}
        for _ in range(m)
    ]
    return template, params


def _rows(n: int = 9, m: int = 2, seed: int = 1):
    g = torch.Generator().manual_seed(seed)
    X = torch.randn(n, 4, generator=g, dtype=F64)
    y = torch.randint(0, 3, (n,), generator=g)
    w = torch.rand(n, m, generator=g, dtype=F64)
    return X, y, 0.9 * w / w.sum(1, keepdim=True)


def _row_loss(template, params, x, label, w, offset=None):
    total = 0.0
    for m, p in enumerate(params):
        out = functional_call(template, p, (x,))
        if offset is not None:
            out = out + offset
        total = total + w[m] * nn.functional.cross_entropy(out, label)
    return total


def test_per_row_gradients_are_each_rows_own_autograd_gradient():
    template, params = _learners()
    X, y, w = _rows()
    offset = torch.randn(X.shape[0], 3, dtype=F64)
    grads = per_row_gradients(template, params, X, y, w, offset)
    for i in (0, 4, 8):
        leaves = [{k: v.clone().requires_grad_(True) for k, v in p.items()} for p in params]
        _row_loss(template, leaves, X[i : i + 1], y[i : i + 1], w[i], offset[i : i + 1]).backward()
        for m, p in enumerate(leaves):
            for k, v in p.items():
                assert torch.allclose(grads[m][k][i], v.grad, rtol=1e-10, atol=1e-12)


def test_clipping_scales_each_row_over_all_learners_to_the_bound():
    rng = np.random.default_rng(0)
    a, b = rng.normal(size=(6, 2, 3)), rng.normal(size=(6, 4))
    a[:3] *= 5  # the first rows are clipped, the last ones not
    a[3:], b[3:] = a[3:] / 4, b[3:] / 4
    grads = [{"a": torch.as_tensor(a)}, {"b": torch.as_tensor(b)}]
    sums, norms = clipped_gradient_sum(grads, 2.0)
    flat = np.concatenate([a.reshape(6, -1), b], axis=1)
    by_hand = np.linalg.norm(flat, axis=1)
    scale = np.minimum(1.0, 2.0 / by_hand)
    assert np.allclose(norms.numpy(), by_hand)
    assert np.allclose(sums[0]["a"].numpy(), (scale[:, None, None] * a).sum(0))
    assert np.allclose(sums[1]["b"].numpy(), (scale[:, None] * b).sum(0))
    assert (scale < 1).any() and (scale == 1).any()  # both cases are exercised


def _noise_draws(n: int, settings: DPSGDSettings) -> torch.Tensor:
    """40 steps' noisy gradients of no sampled row (the noise alone), flattened."""
    template, params = _learners(m=1)
    X, y, w = _rows(n=n, m=1)
    empty = torch.zeros(0, dtype=torch.long)
    return torch.cat(
        [
            torch.cat(
                [
                    g.flatten()
                    for g in private_gradient(
                        template, params, X, y, w, empty, settings, SeededNoise(s)
                    )[0].values()
                ]
            )
            for s in range(40)
        ]
    )


def test_the_noise_on_a_step_has_sigma_times_clip_over_the_public_batch():
    settings = DPSGDSettings(2.0, 0.5, 0.2, 1, expected_batch=10.0)
    draws = _noise_draws(50, settings)
    expected = 2.0 * 0.5 / 10.0
    assert abs(float(draws.std()) / expected - 1) < 0.03  # ~4,000 draws: 1 % standard error
    assert abs(float(draws.mean())) < 4 * expected / math.sqrt(draws.numel())


def test_the_divisor_never_reads_the_clients_row_count():
    """The noisy sum is divided by a public constant: two clients of 50 and 500 rows under
    the same settings release noise of one spread (divided by q * n before, a value the
    accountant never saw)."""
    settings = DPSGDSettings(2.0, 0.5, 0.2, 1, expected_batch=10.0)
    small, large = _noise_draws(50, settings), _noise_draws(500, settings)
    assert abs(float(large.std()) / float(small.std()) - 1) < 0.06
    with pytest.raises(ValueError, match="expected_batch"):
        DPSGDSettings(2.0, 0.5, 0.2, 1, expected_batch=0.0)


def test_without_noise_and_clipping_one_full_step_is_plain_gradient_descent():
    template, params = _learners()
    X, y, w = _rows()
    settings = DPSGDSettings(0.0, 1e9, 1.0, 1, expected_batch=9.0)
    trained = private_sgd(template, params, X, y, w, settings, SeededNoise(0), learning_rate=0.3)
    leaves = [{k: v.clone().requires_grad_(True) for k, v in p.items()} for p in params]
    loss = sum(_row_loss(template, leaves, X[i : i + 1], y[i : i + 1], w[i]) for i in range(9))
    (loss / 9).backward()
    for m, p in enumerate(leaves):
        for k, v in p.items():
            assert torch.allclose(trained[m][k], params[m][k] - 0.3 * v.grad, rtol=1e-9, atol=1e-12)
            assert not torch.equal(trained[m][k], params[m][k])


def test_dp_sgd_refuses_weights_a_row_could_use_to_exceed_the_bound():
    template, params = _learners()
    X, y, w = _rows()
    settings = DPSGDSettings(1.0, 1.0, 0.5, 1)
    with pytest.raises(ValueError, match="summing to at most 1"):
        private_sgd(template, params, X, y, 2 * w, settings, SeededNoise(0), learning_rate=0.1)
    with pytest.raises(ValueError, match="shape"):
        private_sgd(template, params, X, y, w[:, :1], settings, SeededNoise(0), learning_rate=1)


def test_the_sample_and_noise_are_fresh_unless_a_test_seed_is_given():
    template, params = _learners()
    X, y, w = _rows()
    settings = DPSGDSettings(1.0, 1.0, 0.5, 3)

    def train(source):
        return private_sgd(template, params, X, y, w, settings, source, learning_rate=0.1)

    one, two = train(fresh_noise()), train(fresh_noise())
    assert not torch.equal(*(next(iter(p[0].values())) for p in (one, two)))
    again, same = train(SeededNoise(3, 1, 0)), train(SeededNoise(3, 1, 0))
    assert torch.equal(*(next(iter(p[0].values())) for p in (again, same)))
    with pytest.raises(TypeError, match="NoiseSource"):
        train(torch.Generator().manual_seed(0))


def test_settings_name_what_is_wrong():
    with pytest.raises(ValueError, match="sample_rate"):
        DPSGDSettings(1.0, 1.0, 0.0, 1)
    with pytest.raises(ValueError, match="clip_norm"):
        DPSGDSettings(1.0, -1.0, 0.5, 1)
    with pytest.raises(ValueError, match="noise_multiplier"):
        DPSGDSettings(-1.0, 1.0, 0.5, 1)
    assert steps_for_epochs(2, 0.05) == 40 and steps_for_epochs(1, 0.3) == 4
    assert steps_for_epochs(0, 0.1) == 0


def _gdp_epsilon(mu: float, delta: float) -> float:
    """The epsilon of mu-GDP at delta, by bisection on Dong, Roth and Su's Corollary 2.13."""

    def delta_of(eps):
        return ndtr(-eps / mu + mu / 2) - math.exp(eps) * ndtr(-eps / mu - mu / 2)

    low, high = 0.0, 100.0
    for _ in range(200):
        middle = (low + high) / 2
        low, high = (middle, high) if delta_of(middle) > delta else (low, middle)
    return high


def test_full_batch_steps_compose_with_the_statistics_as_one_gaussian_mechanism():
    z, sigma, steps, blocks = 20.0, 3.0, 30, release_blocks(10, 10)
    mu = math.sqrt(blocks / z**2 + steps / sigma**2)
    expected = _gdp_epsilon(mu, 1e-5)
    got = learning_epsilon(z, blocks, sigma, 1.0, steps, 1e-5)
    assert got >= expected * (1 - 1e-3) and got < expected * 1.01  # PLD is pessimistic
    assert release_blocks(10, 10) == 30 + 10 / 64


def test_subsampled_steps_are_read_within_the_renyi_accountants_bound():
    import dp_accounting
    from dp_accounting.rdp import rdp_privacy_accountant

    q, sigma, steps = 0.05, 1.2, 400
    pld = learning_epsilon(30.0, 0, sigma, q, steps, 1e-5)
    rdp = rdp_privacy_accountant.RdpAccountant()
    event = dp_accounting.PoissonSampledDpEvent(q, dp_accounting.GaussianDpEvent(sigma))
    rdp.compose(dp_accounting.SelfComposedDpEvent(event, steps))
    loose = rdp.get_epsilon(1e-5)
    assert 0.6 * loose < pld <= loose * 1.001  # RDP is an upper bound, PLD tighter
    assert learning_epsilon(30.0, 3, 0.0, q, 10, 1e-5) == math.inf


def test_calibration_spends_the_budget_and_the_share_moves_the_noise():
    blocks, steps, q = release_blocks(12, 10), 200, 0.05
    z, sigma = calibrate_learning(1.0, 1e-5, blocks, steps, q, share=0.5)
    spent = learning_epsilon(z, blocks, sigma, q, steps, 1e-5)
    assert 0.99 < spent <= 1.0
    z_more, sigma_less = calibrate_learning(1.0, 1e-5, blocks, steps, q, share=0.8)
    assert z_more < z and sigma_less > sigma
    with pytest.raises(ValueError, match="epsilon"):
        calibrate_learning(0.0, 1e-5, blocks, steps, q)
    with pytest.raises(ValueError, match="calibrate_noise"):
        calibrate_learning(1.0, 1e-5, blocks, 0, q)


# ----------------------------------------------------------------- other losses, pairs
class _Linear(nn.Module):
    """``x @ w`` with one parameter ``w`` (f,): the losses below have gradients by hand."""

    def __init__(self, f: int):
        super().__init__()
        self.w = nn.Parameter(torch.zeros(f, dtype=F64))

    def forward(self, x):
        return x @ self.w


def test_a_row_loss_replaces_the_cross_entropy_row_by_row():
    """Squared error ``w_i (x_i.w - y_i)^2 / 2``: the gradient ``w_i (x_i.w - y_i) x_i``."""
    g = torch.Generator().manual_seed(3)
    X, target = torch.randn(7, 3, generator=g, dtype=F64), torch.randn(7, generator=g, dtype=F64)
    weight = torch.rand(7, 1, generator=g, dtype=F64)
    w = torch.randn(3, generator=g, dtype=F64)

    def squared(ps, x, label, wt):
        return wt[0] * (functional_call(_Linear(3), ps[0], (x,)) - label).square() / 2

    grads = per_row_gradients(_Linear(3), [{"w": w}], X, target, weight, row_loss=squared)
    Xn, tn, wn = X.numpy(), target.numpy(), weight.numpy()[:, 0]
    expected = (wn * (Xn @ w.numpy() - tn))[:, None] * Xn
    np.testing.assert_allclose(grads[0]["w"].numpy(), expected, rtol=1e-12)
    with pytest.raises(ValueError, match="offset"):
        per_row_gradients(_Linear(3), [{"w": w}], X, target, weight, torch.zeros(7, 1), squared)


def test_pair_units_are_a_cycle_of_the_sample():
    rows = torch.tensor([2, 5, 7, 11, 13])
    first, second = pair_units(rows, SeededNoise(0))
    assert sorted(first.tolist()) == sorted(second.tolist()) == rows.tolist()
    successor = dict(zip(first.tolist(), second.tolist(), strict=True))
    seen, row = [], first[0].item()
    for _ in range(5):  # one cycle through every sampled row
        seen.append(row)
        row = successor[row]
    assert row == first[0].item() and sorted(seen) == rows.tolist()
    alone_first, alone_second = pair_units(torch.tensor([4]), SeededNoise(0))
    assert alone_first.tolist() == alone_second.tolist() == [4]


def test_pair_settings_keep_the_noise_per_unit_of_sensitivity():
    base = DPSGDSettings(1.3, 0.9, 0.2, 5)
    pair = pair_settings(base)
    assert pair.clip_norm == pytest.approx(0.3, rel=1e-12)
    assert pair.noise_multiplier * pair.clip_norm == pytest.approx(1.3 * 0.9, rel=1e-12)
    assert (pair.sample_rate, pair.steps) == (0.2, 5)


def test_one_noise_free_pair_step_is_the_clipped_units_by_hand():
    """q = 1, sigma = 0, plain SGD at rate 1: the step is minus the sum over the cycle's
    units of ``grad (x_i.w - x_j.w - t)^2 / 2`` clipped to C / 3, over n."""
    g = torch.Generator().manual_seed(5)
    n, f, clip = 4, 3, 0.6
    X = torch.randn(n, f, generator=g, dtype=F64) * 3
    y = torch.arange(n)
    w0 = torch.randn(f, generator=g, dtype=F64)

    def pair_loss(ps, x, label, wt):
        out = functional_call(_Linear(f), ps[0], (x,))
        return wt[0] * (out[0] - out[1] - 0.5 * (label[0] - label[1])).square() / 2

    settings = DPSGDSettings(0.0, clip, 1.0, 1, expected_batch=float(n))
    seed = 11
    trained = private_sgd(
        _Linear(f),
        [{"w": w0}],
        X,
        y,
        torch.ones(n, 1, dtype=F64),
        settings,
        SeededNoise(seed),
        learning_rate=1.0,
        row_loss=pair_loss,
        pairs=True,
    )
    # the same draws by hand: the Poisson sample (all rows at q = 1), then the cycle
    replay = SeededNoise(seed)
    replay.uniform((n,))
    order = replay.permutation(n).numpy()
    Xn, wn, total = X.numpy(), w0.numpy(), np.zeros(f)
    for a, b in zip(order, np.roll(order, -1), strict=True):
        residual = Xn[a] @ wn - Xn[b] @ wn - 0.5 * (a - b)
        unit = residual * (Xn[a] - Xn[b])
        total += unit * min(1.0, clip / 3 / np.linalg.norm(unit))
    np.testing.assert_allclose(trained[0]["w"].numpy(), wn - total / n, rtol=1e-10)
    assert np.linalg.norm(total) <= n * clip / 3 * (1 + 1e-12)
    with pytest.raises(ValueError, match="pairs=True"):
        private_sgd(
            _Linear(f),
            [{"w": w0}],
            X,
            y,
            torch.ones(n, 1, dtype=F64),
            settings,
            SeededNoise(0),
            learning_rate=1.0,
            pairs=True,
        )
