"""Local EM against scikit-learn's ``GaussianMixture``: same start, same path."""

from __future__ import annotations

import math
import warnings

import numpy as np
import pytest
import torch
from _tolerance import assert_close_scaled
from hypothesis import given, settings
from hypothesis import strategies as st
from sklearn.exceptions import ConvergenceWarning
from sklearn.mixture import GaussianMixture

from fednovelty.mixture.covariance import COVARIANCE_TYPES, precisions_cholesky_from_precisions
from fednovelty.mixture.em import (
    EMResult,
    check_n_samples,
    fit_em,
    fit_gmm,
    fit_gmm_bic,
    kmeans_init,
    moment_shift,
    params_from_stats,
)
from fednovelty.mixture.model import MixtureParams, bic, score_samples
from fednovelty.mixture.stats import stats_from_resp


def t(a, dtype=torch.float64) -> torch.Tensor:
    return torch.as_tensor(np.array(a, copy=True), dtype=dtype)


def gen(seed: int = 0) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


@pytest.fixture(params=COVARIANCE_TYPES)
def covariance_type(request) -> str:
    return request.param


def rough_start(X: np.ndarray, covariance_type: str, seed: int = 1) -> GaussianMixture:
    """A poor starting point (random rows, one EM step) so that the path is long."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)
        return GaussianMixture(
            3,
            covariance_type=covariance_type,
            init_params="random_from_data",
            max_iter=1,
            random_state=seed,
        ).fit(X)


def sklearn_from(start: GaussianMixture, X: np.ndarray, **kwargs) -> GaussianMixture:
    gm = GaussianMixture(
        start.n_components,
        covariance_type=start.covariance_type,
        weights_init=start.weights_,
        means_init=start.means_,
        precisions_init=start.precisions_,
        **kwargs,
    )
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)
        return gm.fit(X)


def init_from(start: GaussianMixture, dtype=torch.float64) -> MixtureParams:
    """Our MixtureParams for sklearn's start; the factor is taken from ``precisions_`` with
    the same flip-Cholesky that sklearn applies to ``precisions_init``."""
    ct = start.covariance_type
    return MixtureParams(
        t(start.weights_, dtype),
        t(start.means_, dtype),
        precisions_cholesky_from_precisions(t(start.precisions_, dtype), ct),
        ct,
    )


# --- parity with scikit-learn ---------------------------------------------------------


@pytest.mark.parametrize("tol", [1e-3, 1e-5])
def test_em_path_matches_sklearn(covariance_type, dataset, tol):
    start = rough_start(dataset, covariance_type)
    gm = sklearn_from(start, dataset, tol=tol, max_iter=150)
    result = fit_em(t(dataset), init_from(start), tol=tol, max_iter=150)

    assert isinstance(result, EMResult)
    assert result.n_iter == gm.n_iter_ == len(result.lower_bounds)
    assert result.converged == gm.converged_
    # Two implementations along a path of up to 150 iterations: round-off grows with the path
    # and with the conditioning (precision factors reach 95), so compare relative to scale.
    assert_close_scaled(result.lower_bounds, gm.lower_bounds_, rtol=1e-9)
    params = result.params
    assert params.covariance_type == covariance_type
    assert_close_scaled(params.weights, gm.weights_, rtol=1e-9)
    assert_close_scaled(params.means, gm.means_, rtol=1e-9)
    assert_close_scaled(params.covariances, gm.covariances_, rtol=1e-9)
    assert_close_scaled(params.precisions_cholesky, gm.precisions_cholesky_, rtol=1e-9)


def test_em_path_has_several_iterations(dataset):
    """Guard for the parity test: the starts are rough enough to give a real path."""
    start = rough_start(dataset, "full")
    assert fit_em(t(dataset), init_from(start), tol=1e-5).n_iter >= 3


@pytest.mark.parametrize("reg_covar", [0.0, 1e-2])
def test_em_path_matches_sklearn_reg_covar(covariance_type, aniso, reg_covar):
    start = rough_start(aniso, covariance_type, seed=3)
    gm = sklearn_from(start, aniso, tol=1e-4, max_iter=60, reg_covar=reg_covar)
    result = fit_em(t(aniso), init_from(start), tol=1e-4, max_iter=60, reg_covar=reg_covar)
    assert result.n_iter == gm.n_iter_
    assert_close_scaled(result.lower_bounds, gm.lower_bounds_, rtol=1e-9)  # two implementations
    np.testing.assert_allclose(result.params.covariances.numpy(), gm.covariances_, atol=1e-8)


def test_em_chunk_size_does_not_change_the_path(covariance_type, aniso):
    start = init_from(rough_start(aniso, covariance_type))
    whole = fit_em(t(aniso), start, tol=1e-4)
    chunked = fit_em(t(aniso), start, tol=1e-4, chunk_size=37)
    assert whole.n_iter == chunked.n_iter
    # chunks sum the statistics in another order: round-off apart, relative to the scale
    assert_close_scaled(chunked.lower_bounds, whole.lower_bounds, rtol=1e-11)
    for name, x in chunked.params.tensors().items():
        assert_close_scaled(x, whole.params.tensors()[name], rtol=1e-10, err_msg=name)


def test_em_max_iter(covariance_type, aniso):
    start = init_from(rough_start(aniso, covariance_type))
    none = fit_em(t(aniso), start, max_iter=0)
    assert none.n_iter == 0 and not none.converged and none.lower_bounds == []
    assert none.params is start
    capped = fit_em(t(aniso), start, tol=0.0, max_iter=4)
    assert capped.n_iter == 4 and not capped.converged


def test_em_does_not_modify_inputs(covariance_type, aniso):
    X = t(aniso)
    start = init_from(rough_start(aniso, covariance_type))
    X_before = X.clone()
    start_before = {k: v.clone() for k, v in start.tensors().items()}
    fit_em(X, start, max_iter=5)
    assert torch.equal(X, X_before)
    for name, tensor in start.tensors().items():
        assert torch.equal(tensor, start_before[name]), name


# --- monotonicity ---------------------------------------------------------------------


def smallest_variance(params: MixtureParams) -> float:
    covs = params.covariances
    if params.covariance_type in ("full", "tied"):
        return torch.linalg.eigvalsh(covs).min().item()
    return covs.min().item()


@settings(max_examples=40, deadline=None)
@given(
    seed=st.integers(0, 2**32 - 1),
    covariance_type=st.sampled_from(COVARIANCE_TYPES),
    n_components=st.integers(1, 4),
)
def test_log_likelihood_never_decreases(seed, covariance_type, n_components):
    """EM's monotonicity, as sklearn tests it: reg_covar=0, so each M-step is the exact
    maximiser. Starts are the M-step of random soft responsibilities (every covariance a
    weighted covariance of all rows). A component that collapses onto a point or a line
    (smallest variance < 1e-4) ends the path: there the likelihood is unbounded and the
    variance is round-off of E[x^2] - m^2, so the sign of a step is noise, in sklearn too."""
    rng = np.random.default_rng(seed)
    n, d = 150, 2
    centers = rng.normal(scale=3.0, size=(3, d))
    rotation, _ = np.linalg.qr(rng.normal(size=(d, d)))
    factor = rotation * rng.uniform(0.5, 1.5, size=d)
    X = t(centers[rng.integers(0, 3, size=n)] + rng.normal(size=(n, d)) @ factor)
    resp = rng.dirichlet(np.ones(n_components), size=n)
    params = params_from_stats(
        stats_from_resp(X, t(resp), covariance_type, X.mean(0)), reg_covar=0.0
    )
    lower_bounds = []
    for _ in range(30):
        step = fit_em(X, params, tol=0.0, max_iter=1, reg_covar=0.0)
        lower_bounds.append(step.lower_bounds[0])
        params = step.params
        if smallest_variance(params) < 1e-4:
            break
    assert len(lower_bounds) >= 3
    steps = np.diff(lower_bounds)
    assert steps.min() >= -1e-10, steps


# --- float32 --------------------------------------------------------------------------


def test_em_float32_close_to_float64(covariance_type, blobs):
    X, _ = blobs
    start = rough_start(X, covariance_type)
    r64 = fit_em(t(X), init_from(start), tol=0.0, max_iter=8)
    r32 = fit_em(t(X, torch.float32), init_from(start, torch.float32), tol=0.0, max_iter=8)
    for tensor in r32.params.tensors().values():
        assert tensor.dtype == torch.float32
    np.testing.assert_allclose(r32.lower_bounds, r64.lower_bounds, rtol=1e-5, atol=1e-4)
    np.testing.assert_allclose(r32.params.weights.double(), r64.params.weights, atol=1e-4)
    np.testing.assert_allclose(r32.params.means.double(), r64.params.means, atol=1e-3)
    np.testing.assert_allclose(
        r32.params.covariances.double(), r64.params.covariances, rtol=1e-3, atol=1e-3
    )


# --- fit_gmm and model selection ------------------------------------------------------


def test_fit_gmm_matches_sklearn_log_likelihood(sklearn_fit, covariance_type, blobs):
    X, _ = blobs
    result = fit_gmm(t(X), 3, covariance_type=covariance_type, generator=gen(0))
    ours = score_samples(result.params, t(X)).mean().item()
    theirs = sklearn_fit(X, covariance_type).score(X)
    assert abs(ours - theirs) < 1e-2, (ours, theirs)
    assert result.converged
    assert result.lower_bounds[-1] == pytest.approx(ours, abs=1e-3)


def test_fit_gmm_is_deterministic_per_generator_seed(aniso):
    a = fit_gmm(t(aniso), 3, generator=gen(5))
    b = fit_gmm(t(aniso), 3, generator=gen(5))
    assert a.lower_bounds == b.lower_bounds
    for name, x in a.params.tensors().items():
        assert torch.equal(x, b.params.tensors()[name]), name


def test_kmeans_init_matches_hard_assignment_m_step(covariance_type, blobs):
    X, labels = blobs
    init = kmeans_init(t(X), 3, covariance_type, reg_covar=1e-6, generator=gen(0))
    # Well separated blobs: k-means finds the true clusters, so the init is their M-step.
    order = np.argsort(init.means[:, 0].numpy())  # true centres sorted by first coordinate
    for j, true in zip(order, range(3), strict=True):
        np.testing.assert_allclose(init.means[j].numpy(), X[labels == true].mean(0), atol=1e-10)
        assert init.weights[j].item() == pytest.approx(1 / 3, abs=1e-12)


@pytest.mark.parametrize("covariance_type", ["full", "diag"])
def test_fit_gmm_bic_selects_true_k(covariance_type, blobs):
    X, _ = blobs
    best, bics = fit_gmm_bic(t(X), range(1, 7), covariance_type=covariance_type, generator=gen(0))
    assert best.params.n_components == 3
    assert sorted(bics) == [1, 2, 3, 4, 5, 6]
    assert min(bics, key=bics.get) == 3
    assert bics[3] == pytest.approx(bic(best.params, t(X)), rel=1e-12)


def sklearn_with(params: MixtureParams, n_features: int) -> GaussianMixture:
    """A sklearn GaussianMixture carrying exactly ``params`` (no fitting)."""
    gm = GaussianMixture(params.n_components, covariance_type=params.covariance_type)
    gm._set_parameters(
        (
            params.weights.numpy(),
            params.means.numpy(),
            params.covariances.numpy(),
            params.precisions_cholesky.numpy(),
        )
    )
    gm.n_features_in_ = n_features
    return gm


@pytest.mark.parametrize("n_components", [1, 3])
def test_bic_equals_sklearn_bic_of_same_parameters(covariance_type, dataset, n_components):
    params = fit_gmm(
        t(dataset), n_components, covariance_type=covariance_type, generator=gen(1)
    ).params
    expected = sklearn_with(params, dataset.shape[1]).bic(dataset)
    assert bic(params, t(dataset)) == pytest.approx(expected, rel=1e-12, abs=1e-8)


def test_fit_gmm_bic_skips_candidates_above_n_samples():
    X = t(np.random.default_rng(0).normal(size=(5, 2)))
    _, bics = fit_gmm_bic(X, [1, 2, 9], covariance_type="spherical", generator=gen(0))
    assert sorted(bics) == [1, 2]
    with pytest.raises(ValueError, match="candidates <= n_samples"):
        fit_gmm_bic(X, [6, 7], generator=gen(0))


def test_check_n_samples_message():
    check_n_samples(3, 3)
    with pytest.raises(ValueError, match=r"X has 2 sample\(s\) but n_components=3") as info:
        check_n_samples(2, 3)
    assert "need n_samples >= n_components" in str(info.value)
    assert "Lower n_components or provide more data" in str(info.value)
    with pytest.raises(ValueError, match=r"^client 7 has 1 sample\(s\)"):
        check_n_samples(1, 4, what="client 7")


def test_fit_gmm_too_few_samples():
    X = t(np.random.default_rng(0).normal(size=(2, 3)))
    with pytest.raises(ValueError, match=r"X has 2 sample\(s\) but n_components=3"):
        fit_gmm(X, 3, generator=gen(0))


def test_moment_shift_is_mixture_mean():
    params = MixtureParams(t([0.25, 0.75]), t([[0.0, 4.0], [4.0, 0.0]]), t([1.0, 2.0]), "spherical")
    np.testing.assert_allclose(moment_shift(params).numpy(), [3.0, 1.0])


def test_fit_weights_recovers_mixing_proportions_and_never_descends():
    """Frozen true component densities: weights-only EM finds the sampling proportions."""
    from fednovelty.mixture import fit_weights

    gen = torch.Generator().manual_seed(0)
    true = torch.tensor([0.7, 0.2, 0.1], dtype=torch.float64)
    z = torch.multinomial(true, 4000, replacement=True, generator=gen)
    means = torch.tensor([-4.0, 0.0, 4.0], dtype=torch.float64)
    x = means[z] + torch.randn(4000, generator=gen, dtype=torch.float64)
    log_comp = -0.5 * (x[:, None] - means) ** 2 - 0.5 * math.log(2 * math.pi)
    fit = fit_weights(log_comp, torch.full((3,), 1 / 3, dtype=torch.float64).log(), tol=1e-10)
    empirical = torch.bincount(z, minlength=3) / 4000.0
    torch.testing.assert_close(fit.log_weights.exp(), empirical.double(), atol=0.02, rtol=0)
    assert fit.converged and fit.trace.shape == (fit.n_iter + 1, 3)
    assert bool((fit.mean_log_likelihoods.diff() >= -1e-12).all())
    # a fixed point: one more E-step reproduces the weights
    q = torch.softmax(log_comp + fit.log_weights, dim=1)
    torch.testing.assert_close(q.mean(0), fit.log_weights.exp(), atol=1e-6, rtol=0)
    with pytest.raises(ValueError, match="at least one row"):
        fit_weights(log_comp[:0], fit.log_weights)
