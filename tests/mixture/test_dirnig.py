"""Dir-NIG relation markers (fednovelty.mixture.dirnig): Student-t against scipy, KLs
against Monte Carlo / scipy, conversions, pi_1, calibration, and the server's aggregation
of markers through vb_aggregate against a closed-form 1-D reference written here."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from _tolerance import assert_close_scaled
from scipy import stats

from fednovelty.mixture.dirnig import (
    check_markers,
    default_markers,
    free_from_markers,
    kl_dirichlet,
    kl_markers,
    kl_nig,
    marker_log_density,
    marker_to_posterior,
    markers_from_free,
    posterior_to_marker,
    same_class_logit,
    same_class_probability,
    soft_calibration_error,
    student_t_log_prob,
)
from fednovelty.mixture.vb_aggregate import aggregate_posteriors

D = torch.float64


def random_markers(seed: int, k: int = 3) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    m = torch.empty(2, 5, k, dtype=D)
    m[:, 0] = torch.rand(2, k, generator=g, dtype=D) * 3 + 0.3
    m[:, 1] = torch.randn(2, k, generator=g, dtype=D)
    m[:, 2:] = torch.rand(2, 3, k, generator=g, dtype=D) * 3 + 0.5
    return m


def test_student_t_matches_scipy() -> None:
    s = torch.linspace(-3, 5, 41, dtype=D)
    mean, kappa = torch.tensor([0.5, 2.0], dtype=D), torch.tensor([0.7, 4.0], dtype=D)
    alpha, beta = torch.tensor([1.5, 6.0], dtype=D), torch.tensor([0.4, 3.0], dtype=D)
    got = student_t_log_prob(s, mean, kappa, alpha, beta)
    for c in range(2):
        scale = np.sqrt(float(beta[c] * (kappa[c] + 1) / (alpha[c] * kappa[c])))
        want = stats.t(df=2 * float(alpha[c]), loc=float(mean[c]), scale=scale).logpdf(s.numpy())
        assert_close_scaled(got[:, c], want, rtol=1e-10)


def test_student_t_is_the_nig_predictive_by_monte_carlo() -> None:
    rng = np.random.default_rng(0)
    m, kappa, alpha, beta = 1.0, 2.0, 3.0, 1.5
    var = stats.invgamma(alpha, scale=beta).rvs(400_000, random_state=rng)
    mu = rng.normal(m, np.sqrt(var / kappa))
    x = rng.normal(mu, np.sqrt(var))
    grid = torch.tensor([0.0, 1.0, 2.0], dtype=D)
    density = student_t_log_prob(
        grid, *(torch.tensor([v], dtype=D) for v in (m, kappa, alpha, beta))
    )
    hist = [np.mean(np.abs(x - g) < 0.05) / 0.1 for g in grid.tolist()]
    assert_close_scaled(density[:, 0].exp(), hist, rtol=0.03)


def test_mixture_density_and_pi1() -> None:
    markers = random_markers(1)
    s = torch.linspace(0, 4, 9, dtype=D)
    for r in range(2):
        a, m, kappa, alpha, beta = markers[r]
        want = torch.logsumexp(
            (a / a.sum()).log() + student_t_log_prob(s, m, kappa, alpha, beta), 1
        )
        assert_close_scaled(marker_log_density(s, markers[r]), want)
    p1 = marker_log_density(s, markers[1]).exp() * 0.3
    p0 = marker_log_density(s, markers[0]).exp() * 0.7
    odds = torch.tensor(0.3 / 0.7, dtype=D).log()
    assert_close_scaled(same_class_probability(s, markers, odds), p1 / (p1 + p0))
    assert_close_scaled(same_class_logit(s, markers, odds), (p1 / p0).log())


def test_kl_dirichlet_against_monte_carlo() -> None:
    a, b = torch.tensor([1.5, 0.7, 3.0], dtype=D), torch.tensor([2.0, 1.0, 1.0], dtype=D)
    x = stats.dirichlet(a.numpy()).rvs(200_000, random_state=0)
    mc = np.mean(stats.dirichlet(a.numpy()).logpdf(x.T) - stats.dirichlet(b.numpy()).logpdf(x.T))
    assert_close_scaled(kl_dirichlet(a, b), mc, rtol=0.02)
    assert float(kl_dirichlet(a, a)) == pytest.approx(0.0, abs=1e-12)


def nig_logpdf(mu, var, m, kappa, alpha, beta):
    return stats.invgamma(alpha, scale=beta).logpdf(var) + stats.norm(
        m, np.sqrt(var / kappa)
    ).logpdf(mu)


def test_kl_nig_against_monte_carlo() -> None:
    q, p = (1.0, 2.0, 3.0, 1.5), (0.3, 0.8, 2.0, 2.5)
    rng = np.random.default_rng(1)
    var = stats.invgamma(q[2], scale=q[3]).rvs(300_000, random_state=rng)
    mu = rng.normal(q[0], np.sqrt(var / q[1]))
    mc = np.mean(nig_logpdf(mu, var, *q) - nig_logpdf(mu, var, *p))
    got = kl_nig(torch.tensor(q, dtype=D), torch.tensor(p, dtype=D))
    assert_close_scaled(got, mc, rtol=0.02)
    assert float(kl_nig(torch.tensor(q, dtype=D), torch.tensor(q, dtype=D))) == pytest.approx(
        0, abs=1e-12
    )


def test_kl_markers_sums_the_factors_and_is_zero_at_equality() -> None:
    q, p = random_markers(2), random_markers(3)
    want = sum(float(kl_dirichlet(q[r, 0], p[r, 0])) for r in range(2)) + float(
        sum(kl_nig(q[r, 1:, c], p[r, 1:, c]) for r in range(2) for c in range(3))
    )
    assert_close_scaled(kl_markers(q, p), want)
    assert float(kl_markers(q, q)) == pytest.approx(0.0, abs=1e-10)


def test_posterior_round_trip_and_kl_agree_with_vb_aggregate() -> None:
    from fednovelty.mixture.vb_aggregate import kl_posterior

    q, p = random_markers(4), random_markers(5)
    for r in range(2):
        post = marker_to_posterior(q[r])
        assert post.n_features == 1 and post.n_components == 3
        assert_close_scaled(posterior_to_marker(post), q[r])
        assert_close_scaled(post.covariances.reshape(-1), q[r, 4] / q[r, 3])
        want = kl_posterior(marker_to_posterior(q[r]), marker_to_posterior(p[r]))
        got = kl_dirichlet(q[r, 0], p[r, 0]) + kl_nig(q[r, 1:], p[r, 1:]).sum()
        assert_close_scaled(got, want, rtol=1e-9)


def test_free_parameters_round_trip_and_check() -> None:
    q = random_markers(6)
    assert_close_scaled(markers_from_free(free_from_markers(q)), q)
    assert check_markers(default_markers(3)) is not None
    with pytest.raises(ValueError, match="shape"):
        check_markers(torch.ones(2, 4, 3))
    bad = default_markers(2)
    bad[0, 3, 0] = -1
    with pytest.raises(ValueError, match="must be > 0"):
        check_markers(bad)


def test_soft_calibration_tends_to_the_binned_ece() -> None:
    g = torch.Generator().manual_seed(0)
    prob = torch.rand(4000, generator=g, dtype=D)
    target = (torch.rand(4000, generator=g, dtype=D) < prob**2).to(D)
    bins = torch.clamp((prob * 15).long(), max=14)
    ece = sum(
        (bins == b).sum() / 4000 * (target[bins == b].mean() - prob[bins == b].mean()).abs()
        for b in range(15)
        if (bins == b).any()
    )
    soft = soft_calibration_error(prob, target, 15, temperature=1e-7)
    assert_close_scaled(soft, ece, rtol=0.02)
    calibrated = (torch.rand(4000, generator=g, dtype=D) < prob).to(D)
    assert float(soft_calibration_error(prob, calibrated)) < float(
        soft_calibration_error(prob, target)
    )
    prob.requires_grad_(True)
    soft_calibration_error(prob, target).backward()
    assert torch.isfinite(prob.grad).all()
    with pytest.raises(ValueError, match="n_bins"):
        soft_calibration_error(prob, target, 0)


# ----------------------------------------------------------------- aggregation reference
def _gamma_shape(c: torch.Tensor) -> torch.Tensor:
    alpha = (3.0 - c + ((c - 3.0).square() + 24.0 * c).sqrt()) / (12.0 * c)
    for _ in range(50):
        f = alpha.log() - torch.digamma(alpha) - c
        alpha = (alpha - f / (1.0 / alpha - torch.polygamma(1, alpha))).clamp_min(alpha / 10)
    return alpha


def reference_moment(markers: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """Closed-form 1-D moment matching: E[1/s2], E[log s2], E[mu/s2], E[mu^2/s2] averaged
    (NIG) and Minka's fixed point on E[log w] (Dirichlet)."""
    w = w / w.sum()
    out = torch.empty_like(markers[0])
    for r in range(2):
        a = markers[:, r, 0]
        target = (w[:, None] * (torch.digamma(a) - torch.digamma(a.sum(1, keepdim=True)))).sum(0)
        new = (w[:, None] * a).sum(0)
        for _ in range(500):
            y = target + torch.digamma(new.sum())
            x = torch.where(y >= -2.22, y.exp() + 0.5, -1 / (y + 0.5772156649015329))
            for _ in range(10):
                x = x - (torch.digamma(x) - y) / torch.polygamma(1, x)
            new = x
        m, kappa, alpha, beta = markers[:, r, 1:].unbind(1)
        t1 = (w[:, None] * alpha / beta).sum(0)
        t2 = (w[:, None] * (beta.log() - torch.digamma(alpha))).sum(0)
        t3 = (w[:, None] * m * alpha / beta).sum(0)
        t4 = (w[:, None] * (1 / kappa + m.square() * alpha / beta)).sum(0)
        shape = _gamma_shape(t2 + t1.log())
        out[r] = torch.stack([new, t3 / t1, 1 / (t4 - t3.square() / t1), shape, shape / t1])
    return out


def reference_natural(markers: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """NIG natural parameters (-(beta + kappa m^2/2), -(alpha + 3/2), kappa m, -kappa/2) and
    the Dirichlet's a - 1, averaged."""
    w = (w / w.sum())[:, None]
    out = torch.empty_like(markers[0])
    for r in range(2):
        a, m, kappa, alpha, beta = markers[:, r].unbind(1)
        kb = (w * kappa).sum(0)
        mb = (w * kappa * m).sum(0) / kb
        eta1 = (w * (beta + 0.5 * kappa * m.square())).sum(0)
        out[r] = torch.stack([(w * a).sum(0), mb, kb, (w * alpha).sum(0), eta1 - 0.5 * kb * mb**2])
    return out


@pytest.mark.parametrize("how", ["moment", "natural"])
def test_vb_aggregate_on_markers_matches_the_1d_closed_form(how) -> None:
    from fednovelty.federated.bayesian.vgm2_markers import aggregate_priors

    markers = [random_markers(s) for s in (7, 8, 9)]
    w = torch.tensor([100.0, 250.0, 40.0], dtype=D)
    got = aggregate_priors(markers, w, how)
    ref = (reference_moment if how == "moment" else reference_natural)(torch.stack(markers), w)
    assert_close_scaled(got, ref, rtol=1e-6)
    same = aggregate_priors([markers[0], markers[0]], w[:2], how)
    assert_close_scaled(same, markers[0], rtol=1e-6)


def test_moment_matching_minimises_the_summed_forward_kl() -> None:
    """Prop. 1: the moment-matched prior has a smaller sum_k w_k KL(q_k || p) than the
    natural average and than perturbations of itself."""
    from fednovelty.federated.bayesian.vgm2_markers import aggregate_priors

    markers = [random_markers(s) for s in (10, 11)]
    w = torch.tensor([1.0, 3.0], dtype=D)

    def loss(p):
        return float(sum(wk * kl_markers(q, p) for wk, q in zip(w, markers, strict=True)))

    best = aggregate_priors(markers, w, "moment")
    assert loss(best) <= loss(aggregate_priors(markers, w, "natural")) + 1e-9
    for field in range(5):
        for scale in (0.97, 1.03):
            moved = best.clone()
            moved[:, field] *= scale
            assert loss(best) <= loss(moved) + 1e-9
    _ = aggregate_posteriors  # the rule under test lives there
