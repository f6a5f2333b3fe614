"""Natural-parameter averaging and moment matching of variational posteriors.

Each rule is checked against its own definition: the input back when all inputs agree, the
averaged expected sufficient statistics (moment matching), and the minimum of its divergence
(``sum_i w_i KL(q_i || p)`` for moment matching, ``sum_i w_i KL(p || q_i)`` for natural
averaging) under perturbations of every parameter, which the other rule's result does not
reach.
"""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch
from _tolerance import assert_close_scaled

from fednovelty.mixture.covariance import precisions_cholesky_from_covariances
from fednovelty.mixture.stats import stats_from_resp
from fednovelty.mixture.variational import VBPosterior, vb_m_step
from fednovelty.mixture.vb_aggregate import (
    aggregate_posteriors,
    dirichlet_from_expected_log,
    inverse_digamma,
    kl_posterior,
    scale_evidence,
    vb_expected_statistics,
)
from fednovelty.mixture.vb_prior import default_prior

torch.set_num_threads(1)

K = 3
# (n_features, covariance_type): the 1-D cases are the Normal-Gamma family.
CASES = [(3, "full"), (3, "diag"), (3, "spherical"), (3, "tied"), (1, "full"), (1, "spherical")]
WEIGHT_TYPES = ["dirichlet_process", "dirichlet_distribution"]


def _posterior(seed: int, d: int, ct: str, wt: str, scale: float = 1.0) -> VBPosterior:
    """A posterior from a VB M-step on random rows and random hard labels."""
    g = torch.Generator().manual_seed(seed)
    X = scale * torch.randn(40, d, generator=g, dtype=torch.float64) + seed
    prior = default_prior(X, K, ct, weight_concentration_prior_type=wt)
    labels = torch.randint(0, K, (X.shape[0],), generator=g)
    resp = torch.nn.functional.one_hot(labels, K).double()
    return vb_m_step(stats_from_resp(X, resp, ct, X.mean(0)), prior)


def _inputs(d: int, ct: str, wt: str) -> tuple[list[VBPosterior], torch.Tensor]:
    posteriors = [_posterior(i, d, ct, wt, scale=1.0 + i) for i in range(3)]
    return posteriors, torch.tensor([0.2, 0.5, 0.3], dtype=torch.float64)


def _forward(p: VBPosterior, posteriors, weights) -> float:
    return float(sum(w * kl_posterior(q, p) for w, q in zip(weights, posteriors, strict=True)))


def _reverse(p: VBPosterior, posteriors, weights) -> float:
    return float(sum(w * kl_posterior(p, q) for w, q in zip(weights, posteriors, strict=True)))


def _perturbed(p: VBPosterior, seed: int, eps: float) -> VBPosterior:
    """``p`` with every parameter moved by a relative ``eps`` in a random direction, inside
    the family (positive stays positive, covariances stay of their type and definite)."""
    g = torch.Generator().manual_seed(seed)

    def noise(t: torch.Tensor) -> torch.Tensor:
        return torch.randn(t.shape, generator=g, dtype=t.dtype)

    ct = p.covariance_type
    cov = p.covariances
    if ct in ("full", "tied"):
        root = torch.linalg.cholesky(cov)
        move = noise(cov)
        cov = root @ torch.matrix_exp(eps * 0.5 * (move + move.transpose(-1, -2))) @ root.mT
        cov = 0.5 * (cov + cov.mT)
    else:
        cov = cov * torch.exp(eps * noise(cov))
    d = p.n_features
    dof = (d - 1) + (p.degrees_of_freedom - (d - 1)) * torch.exp(eps * noise(p.degrees_of_freedom))
    variances = cov.diagonal(dim1=-2, dim2=-1) if ct in ("full", "tied") else cov
    spread = variances.sqrt().mean()
    wc = p.weight_concentration
    return VBPosterior(
        weight_concentration=wc * torch.exp(eps * noise(wc)),
        mean_precision=p.mean_precision * torch.exp(eps * noise(p.mean_precision)),
        means=p.means + eps * spread * noise(p.means),
        degrees_of_freedom=dof,
        covariances=cov,
        precisions_cholesky=precisions_cholesky_from_covariances(cov, ct),
        covariance_type=ct,
        weight_concentration_prior_type=p.weight_concentration_prior_type,
    )


def _assert_same(actual: VBPosterior, expected: VBPosterior, rtol: float) -> None:
    for name, value in expected.tensors().items():
        assert_close_scaled(getattr(actual, name), value, rtol=rtol, err_msg=name)


@pytest.mark.parametrize("how", ["natural", "moment"])
@pytest.mark.parametrize("wt", WEIGHT_TYPES)
@pytest.mark.parametrize(("d", "ct"), CASES)
def test_equal_inputs_give_the_input(d, ct, wt, how):
    q = _posterior(0, d, ct, wt)
    weights = torch.tensor([0.1, 0.6, 0.3], dtype=torch.float64)
    _assert_same(aggregate_posteriors([q, q, q], weights, how), q, rtol=1e-9)


@pytest.mark.parametrize("wt", WEIGHT_TYPES)
@pytest.mark.parametrize(("d", "ct"), CASES)
def test_moment_matching_matches_expected_statistics(d, ct, wt):
    posteriors, weights = _inputs(d, ct, wt)
    p = aggregate_posteriors(posteriors, weights, "moment")
    got = vb_expected_statistics(p)
    per_input = [vb_expected_statistics(q) for q in posteriors]
    for name, value in got.items():
        expected = sum(w * s[name] for w, s in zip(weights, per_input, strict=True))
        assert_close_scaled(value, expected, rtol=1e-9, err_msg=name)


@pytest.mark.parametrize("wt", WEIGHT_TYPES)
@pytest.mark.parametrize(("d", "ct"), CASES)
def test_natural_averaging_averages_natural_parameters(d, ct, wt):
    posteriors, weights = _inputs(d, ct, wt)
    p = aggregate_posteriors(posteriors, weights, "natural")

    def avg(name):
        return sum(w * getattr(q, name) for w, q in zip(weights, posteriors, strict=True))

    assert_close_scaled(p.weight_concentration, avg("weight_concentration"), rtol=1e-12)
    assert_close_scaled(p.mean_precision, avg("mean_precision"), rtol=1e-12)
    assert_close_scaled(p.degrees_of_freedom, avg("degrees_of_freedom"), rtol=1e-12)
    beta_m = sum(
        w * q.mean_precision.unsqueeze(1) * q.means
        for w, q in zip(weights, posteriors, strict=True)
    )
    assert_close_scaled(p.mean_precision.unsqueeze(1) * p.means, beta_m, rtol=1e-12)


@pytest.mark.parametrize("wt", WEIGHT_TYPES)
@pytest.mark.parametrize(("d", "ct"), CASES)
def test_each_rule_minimises_its_divergence(d, ct, wt):
    posteriors, weights = _inputs(d, ct, wt)
    natural = aggregate_posteriors(posteriors, weights, "natural")
    moment = aggregate_posteriors(posteriors, weights, "moment")
    for objective, best, other in ((_forward, moment, natural), (_reverse, natural, moment)):
        at_best = objective(best, posteriors, weights)
        assert objective(other, posteriors, weights) > at_best
        for seed in range(6):
            moved = objective(_perturbed(best, seed, 1e-3), posteriors, weights)
            assert moved >= at_best - 1e-10 * abs(at_best), (objective.__name__, seed)


@pytest.mark.parametrize("how", ["natural", "moment"])
def test_per_component_weights_combine_each_component_alone(how):
    posteriors, _ = _inputs(3, "full", "dirichlet_distribution")
    weights = torch.tensor([[1.0, 0.0, 2.0], [1.0, 3.0, 0.0], [0.0, 1.0, 2.0]], dtype=torch.float64)
    p = aggregate_posteriors(posteriors, weights, how)
    for c in range(K):
        alone = aggregate_posteriors(posteriors, weights[:, c], how)
        for name in ("means", "mean_precision", "degrees_of_freedom", "covariances"):
            assert_close_scaled(getattr(p, name)[c], getattr(alone, name)[c], rtol=1e-10)
    by_rows = aggregate_posteriors(posteriors, weights.sum(1), how)
    assert_close_scaled(p.weight_concentration, by_rows.weight_concentration, rtol=1e-12)


def test_zero_weight_posterior_does_not_count():
    posteriors, _ = _inputs(3, "diag", "dirichlet_process")
    weights = torch.tensor([0.0, 0.4, 0.6], dtype=torch.float64)
    for how in ("natural", "moment"):
        _assert_same(
            aggregate_posteriors(posteriors, weights, how),
            aggregate_posteriors(posteriors[1:], weights[1:], how),
            rtol=1e-10,
        )


def test_float32_and_kl_of_itself_is_zero():
    posteriors, weights = _inputs(3, "full", "dirichlet_process")
    single = [
        VBPosterior(
            **{k: v.float() for k, v in q.tensors().items()},
            covariance_type=q.covariance_type,
            weight_concentration_prior_type=q.weight_concentration_prior_type,
        )
        for q in posteriors
    ]
    p = aggregate_posteriors(single, weights.tolist(), "moment")
    assert p.means.dtype == torch.float32
    reference = aggregate_posteriors(posteriors, weights, "moment")
    assert_close_scaled(p.means, reference.means, rtol=1e-4)
    assert abs(float(kl_posterior(posteriors[0], posteriors[0]))) < 1e-9
    assert float(kl_posterior(posteriors[0], posteriors[1])) > 0


def test_special_functions_invert():
    x = torch.tensor([1e-3, 0.5, 1.0, 7.0, 1e5], dtype=torch.float64)
    assert_close_scaled(inverse_digamma(torch.digamma(x)), x, rtol=1e-10)
    alpha = torch.tensor([[0.3, 2.0, 5.0], [400.0, 1.0, 1e4]], dtype=torch.float64)
    log_pi = torch.digamma(alpha) - torch.digamma(alpha.sum(-1, keepdim=True))
    assert_close_scaled(dirichlet_from_expected_log(log_pi)[0], alpha[0], rtol=1e-9)
    assert_close_scaled(dirichlet_from_expected_log(log_pi)[1], alpha[1], rtol=1e-6)


def test_errors_name_the_argument():
    posteriors, weights = _inputs(3, "full", "dirichlet_process")
    with pytest.raises(ValueError, match="how"):
        aggregate_posteriors(posteriors, weights, "mean")
    with pytest.raises(ValueError, match="posteriors is empty"):
        aggregate_posteriors([], [], "moment")
    with pytest.raises(ValueError, match="posteriors must be a sequence"):
        aggregate_posteriors(posteriors[0], [1.0], "moment")
    with pytest.raises(ValueError, match=r"posteriors\[1\] is a"):
        aggregate_posteriors([posteriors[0], "x"], [1.0, 1.0], "moment")
    with pytest.raises(ValueError, match="weights must be finite and >= 0"):
        aggregate_posteriors(posteriors, [1.0, -1.0, 1.0], "moment")
    with pytest.raises(ValueError, match="weights sum to 0"):
        aggregate_posteriors(posteriors, [0.0, 0.0, 0.0], "natural")
    with pytest.raises(ValueError, match="weights must have shape"):
        aggregate_posteriors(posteriors, [1.0, 1.0], "natural")
    other_type = _posterior(0, 3, "diag", "dirichlet_process")
    with pytest.raises(ValueError, match=r"posteriors\[1\] has covariance_type"):
        aggregate_posteriors([posteriors[0], other_type], [1.0, 1.0], "moment")
    other_weights = _posterior(0, 3, "full", "dirichlet_distribution")
    with pytest.raises(ValueError, match="weight_concentration_prior_type"):
        kl_posterior(posteriors[0], other_weights)
    narrow = _posterior(0, 1, "full", "dirichlet_process")
    with pytest.raises(ValueError, match="n_features"):
        aggregate_posteriors([posteriors[0], narrow], [1.0, 1.0], "natural")
    tied, _ = _inputs(3, "tied", "dirichlet_process")
    with pytest.raises(ValueError, match="tied"):
        aggregate_posteriors(tied, torch.ones(3, K), "moment")


@pytest.mark.parametrize(("d", "ct"), [c for c in CASES if c[1] != "tied"])
def test_scale_evidence_is_the_posterior_of_scaled_statistics(d, ct):
    g = torch.Generator().manual_seed(5)
    X = torch.randn(50, d, generator=g, dtype=torch.float64) * 2 + 1
    prior = default_prior(X, K, ct)
    resp = torch.softmax(torch.randn(50, K, generator=g, dtype=torch.float64), 1)
    stats = stats_from_resp(X, resp, ct, X.mean(0))
    posterior = vb_m_step(stats, prior)
    factor = torch.tensor([1.0, 3.0, 7.5], dtype=torch.float64)
    scaled = replace(
        stats,
        counts=stats.counts * factor,
        sums=stats.sums * factor.unsqueeze(1),
        second=stats.second * factor.reshape(-1, *[1] * (stats.second.ndim - 1)),
    )
    expected = vb_m_step(scaled, prior)
    got = scale_evidence(posterior, prior, factor)
    for name in ("mean_precision", "means", "degrees_of_freedom", "covariances"):
        assert_close_scaled(getattr(got, name), getattr(expected, name), rtol=1e-9, err_msg=name)
    with pytest.raises(ValueError, match="factor"):
        scale_evidence(posterior, prior, torch.tensor([0.5, 1.0, 1.0], dtype=torch.float64))
