"""Summable sufficient statistics: M-step parity with scikit-learn and merge properties."""

from __future__ import annotations

import itertools
from dataclasses import replace

import numpy as np
import pytest
import torch
from _tolerance import assert_close_scaled
from hypothesis import given, settings
from hypothesis import strategies as st
from sklearn.mixture import _gaussian_mixture as skgm

from fednovelty.mixture.covariance import COVARIANCE_TYPES
from fednovelty.mixture.stats import (
    SufficientStats,
    e_step_stats,
    m_step,
    merge_stats,
    stats_from_resp,
    zero_stats,
)

SECOND_SHAPES = {
    "full": lambda k, d: (k, d, d),
    "tied": lambda k, d: (d, d),
    "diag": lambda k, d: (k, d),
    "spherical": lambda k, d: (k,),
}


def t(a, dtype=torch.float64) -> torch.Tensor:
    return torch.as_tensor(np.array(a, copy=True), dtype=dtype)


def assert_m_steps_equal(a: SufficientStats, b: SufficientStats, atol: float, reg=1e-6) -> None:
    for x, y, name in zip(m_step(a, reg), m_step(b, reg), ("weights", "means", "cov"), strict=True):
        torch.testing.assert_close(x, y, rtol=0, atol=atol, msg=lambda m, n=name: f"{n}: {m}")


def assert_stats_equal(a: SufficientStats, b: SufficientStats, rtol: float) -> None:
    """Same statistics up to ``rtol`` relative to each tensor's scale (sums over rows grow
    with the rows, to 1e4 here; summed in another order they differ in the last bits).
    ``rtol=0``: exactly equal."""
    assert a.covariance_type == b.covariance_type
    assert torch.equal(a.shift, b.shift)  # copied, not computed
    for name, x in a.tensors().items():
        y = getattr(b, name)
        assert x.shape == y.shape, name
        assert_close_scaled(x, y, rtol=rtol, err_msg=name)


def random_resp(rng: np.random.Generator, n: int, k: int) -> np.ndarray:
    return rng.dirichlet(np.full(k, 0.7), size=n)


def random_params(rng: np.random.Generator, covariance_type: str, k: int, d: int, make_covs):
    weights = rng.dirichlet(np.full(k, 2.0))
    means = rng.normal(scale=2.0, size=(k, d))
    covs = make_covs(rng, covariance_type, k, d)
    prec_chol = skgm._compute_precision_cholesky(covs, covariance_type)
    return t(weights).log(), t(means), t(prec_chol)


@pytest.fixture(params=COVARIANCE_TYPES)
def covariance_type(request) -> str:
    return request.param


# --- M-step parity --------------------------------------------------------------------


@pytest.mark.parametrize("shift_kind", ["zero", "mean", "far"])
@pytest.mark.parametrize("reg_covar", [0.0, 1e-3])
def test_m_step_matches_sklearn(covariance_type, shift_kind, reg_covar):
    rng = np.random.default_rng(7)
    X = rng.normal(size=(300, 4)) @ rng.normal(size=(4, 4)) + 3.0
    resp = random_resp(rng, 300, 3)
    shift = {"zero": np.zeros(4), "mean": X.mean(0), "far": np.array([10.0, -20.0, 5.0, 0.0])}
    stats = stats_from_resp(t(X), t(resp), covariance_type, t(shift[shift_kind]))
    weights, means, covs = m_step(stats, reg_covar)
    nk, sk_means, sk_covs = skgm._estimate_gaussian_parameters(X, resp, reg_covar, covariance_type)
    # Two implementations, relative to the scale. Covariances from second moments about a far
    # shift lose digits to cancellation (measured 3e-13 relative): looser for them.
    assert_close_scaled(weights, nk / nk.sum(), rtol=1e-12)
    assert_close_scaled(means, sk_means, rtol=1e-12)
    assert_close_scaled(covs, sk_covs, rtol=1e-10)
    assert covs.shape == sk_covs.shape


def test_m_step_matches_sklearn_on_one_hot_labels(covariance_type, dataset):
    """k-means style hard responsibilities (sklearn's default initialisation)."""
    labels = np.random.default_rng(0).integers(0, 3, size=dataset.shape[0])
    resp = np.eye(3)[labels]
    stats = stats_from_resp(t(dataset), t(resp), covariance_type, t(dataset.mean(0)))
    _, means, covs = m_step(stats, 1e-6)
    _, sk_means, sk_covs = skgm._estimate_gaussian_parameters(dataset, resp, 1e-6, covariance_type)
    assert_close_scaled(means, sk_means, rtol=1e-12)  # two implementations: round-off apart
    assert_close_scaled(covs, sk_covs, rtol=1e-12)


def test_stats_from_resp_fields(covariance_type):
    rng = np.random.default_rng(1)
    X, resp, shift = rng.normal(size=(50, 3)), random_resp(rng, 50, 2), rng.normal(size=3)
    stats = stats_from_resp(t(X), t(resp), covariance_type, t(shift))
    c = X - shift
    np.testing.assert_allclose(stats.counts.numpy(), resp.sum(0), atol=1e-12)
    np.testing.assert_allclose(stats.sums.numpy(), resp.T @ c, atol=1e-12)
    full = np.einsum("nk,nd,ne->kde", resp, c, c)
    expected = {
        "full": full,
        "tied": full.sum(0),
        "diag": np.einsum("kdd->kd", full),
        "spherical": np.einsum("kdd->k", full),
    }[covariance_type]
    np.testing.assert_allclose(stats.second.numpy(), expected, atol=1e-12)
    assert stats.n_samples.item() == 50
    assert stats.log_likelihood.item() == 0
    assert stats.n_components == 2 and stats.n_features == 3


def test_m_step_float32_with_large_offset(covariance_type):
    """Moments about a nearby shift keep float32 covariances accurate despite a 1e4 offset."""
    rng = np.random.default_rng(2)
    X = 1e4 + rng.normal(size=(2000, 3)) * np.array([1.0, 0.5, 2.0])
    resp = random_resp(rng, 2000, 2)
    shift = X.mean(0)
    _, m64, c64 = m_step(stats_from_resp(t(X), t(resp), covariance_type, t(shift)), 1e-6)
    X32, r32, s32 = (t(a, torch.float32) for a in (X, resp, shift))
    w32, m32, c32 = m_step(stats_from_resp(X32, r32, covariance_type, s32), 1e-6)
    assert w32.dtype == m32.dtype == c32.dtype == torch.float32
    np.testing.assert_allclose(m32.double().numpy(), m64.numpy(), rtol=1e-5)
    np.testing.assert_allclose(c32.double().numpy(), c64.numpy(), rtol=0, atol=2e-3)


# --- E-step statistics ----------------------------------------------------------------


def test_e_step_stats_match_sklearn(sklearn_fit, covariance_type, dataset):
    gm = sklearn_fit(dataset, covariance_type)
    shift = t(dataset.mean(0) + 0.5)
    stats = e_step_stats(
        t(dataset),
        t(gm.weights_).log(),
        t(gm.means_),
        t(gm.precisions_cholesky_),
        covariance_type,
        shift,
    )
    expected_ll = gm.score_samples(dataset).sum()
    np.testing.assert_allclose(stats.log_likelihood.item(), expected_ll, rtol=1e-12, atol=1e-9)
    assert stats.n_samples.item() == dataset.shape[0]
    # Equal to the statistics of sklearn's responsibilities, and so to sklearn's M-step.
    resp = gm.predict_proba(dataset)
    from_resp = stats_from_resp(t(dataset), t(resp), covariance_type, shift)
    assert_stats_equal(stats, replace(from_resp, log_likelihood=stats.log_likelihood), rtol=1e-12)
    _, means, covs = m_step(stats, gm.reg_covar)
    _, sk_means, sk_covs = skgm._estimate_gaussian_parameters(
        dataset, resp, gm.reg_covar, covariance_type
    )
    # our responsibilities vs sklearn's: round-off apart, amplified in the covariances
    # (second moments minus squared means; measured 1.4e-13 relative)
    assert_close_scaled(means, sk_means, rtol=1e-12)
    assert_close_scaled(covs, sk_covs, rtol=1e-10)


@pytest.mark.parametrize("chunk_size", [1, 7, 64, 599, 600, 10_000])
def test_e_step_stats_chunk_size_invariant(covariance_type, chunk_size, aniso, random_covariances):
    params = random_params(np.random.default_rng(4), covariance_type, 3, 3, random_covariances)
    shift = t(aniso.mean(0))
    X = t(aniso)
    reference = e_step_stats(X, *params, covariance_type, shift)
    chunked = e_step_stats(X, *params, covariance_type, shift, chunk_size=chunk_size)
    assert_stats_equal(chunked, reference, rtol=1e-12)


def test_e_step_stats_empty_is_zero(covariance_type):
    shift = t([1.0, 2.0])
    weights = t([0.5, 0.5]).log()
    means, prec_chol = torch.zeros(2, 2, dtype=torch.float64), torch.ones(2, dtype=torch.float64)
    if covariance_type == "full":
        prec_chol = torch.eye(2, dtype=torch.float64).repeat(2, 1, 1)
    elif covariance_type == "tied":
        prec_chol = torch.eye(2, dtype=torch.float64)
    elif covariance_type == "diag":
        prec_chol = torch.ones(2, 2, dtype=torch.float64)
    empty = torch.zeros(0, 2, dtype=torch.float64)
    stats = e_step_stats(empty, weights, means, prec_chol, covariance_type, shift)
    assert_stats_equal(stats, zero_stats(2, 2, covariance_type, shift), rtol=0)


def test_zero_stats_shapes_and_dtype(covariance_type):
    shift = torch.zeros(4, dtype=torch.float32)
    z = zero_stats(3, 4, covariance_type, shift)
    assert z.counts.shape == (3,)
    assert z.sums.shape == (3, 4)
    assert z.second.shape == SECOND_SHAPES[covariance_type](3, 4)
    assert z.log_likelihood.shape == z.n_samples.shape == ()
    for tensor in z.tensors().values():
        assert tensor.dtype == torch.float32
        assert not tensor.any()
    assert set(z.tensors()) == {
        "counts",
        "sums",
        "second",
        "shift",
        "log_likelihood",
        "n_samples",
    }


# --- merge properties -----------------------------------------------------------------


def _merge_tree(stats: list[SufficientStats], picks: list[int]) -> SufficientStats:
    """Merge by repeatedly adding two entries chosen by ``picks`` (any association)."""
    pool = list(stats)
    choices = iter(picks)
    while len(pool) > 1:
        pick = next(choices, 0)
        a = pool.pop(pick % len(pool))
        b = pool.pop((pick // 7) % len(pool))
        pool.insert((pick // 49) % (len(pool) + 1), b + a)
    return pool[0]


@settings(max_examples=60, deadline=None)
@given(
    covariance_type=st.sampled_from(COVARIANCE_TYPES),
    seed=st.integers(0, 2**32 - 1),
    n_samples=st.integers(0, 40),
    n_parts=st.integers(1, 6),
    n_extra_empty=st.integers(0, 2),
    data=st.data(),
)
def test_any_partition_and_merge_order_gives_pooled_m_step(
    covariance_type, seed, n_samples, n_parts, n_extra_empty, data
):
    rng = np.random.default_rng(seed)
    k, d = 3, 2
    X = t(rng.normal(scale=2.0, size=(n_samples, d)) + rng.normal(scale=5.0, size=d))
    weights = rng.dirichlet(np.full(k, 2.0))
    means = rng.normal(scale=3.0, size=(k, d))
    covs = {
        "full": lambda: np.stack([np.eye(d) + 0.3 * np.ones((d, d))] * k) * rng.uniform(0.5, 2),
        "tied": lambda: np.eye(d) * rng.uniform(0.5, 2),
        "diag": lambda: rng.uniform(0.3, 3.0, size=(k, d)),
        "spherical": lambda: rng.uniform(0.3, 3.0, size=k),
    }[covariance_type]()
    params = (
        t(weights).log(),
        t(means),
        t(skgm._compute_precision_cholesky(covs, covariance_type)),
    )
    shift = t(rng.normal(size=d))

    assignment = np.array(
        data.draw(
            st.lists(st.integers(0, n_parts - 1), min_size=n_samples, max_size=n_samples),
            label="assignment",
        ),
        dtype=int,
    )
    parts = [
        e_step_stats(X[torch.as_tensor(assignment == p)], *params, covariance_type, shift)
        for p in range(n_parts)
    ]
    parts += [zero_stats(k, d, covariance_type, shift) for _ in range(n_extra_empty)]
    order = data.draw(st.permutations(range(len(parts))), label="order")
    picks = data.draw(st.lists(st.integers(0, 10_000), max_size=3 * len(parts)), label="picks")

    pooled = e_step_stats(X, *params, covariance_type, shift)
    sequential = merge_stats(parts[i] for i in order)
    tree = _merge_tree([parts[i] for i in order], picks)
    for merged in (sequential, tree):
        assert_stats_equal(merged, pooled, rtol=1e-12)
        assert_m_steps_equal(merged, pooled, atol=1e-9)
        assert merged.n_samples.item() == n_samples


@settings(max_examples=30, deadline=None)
@given(
    covariance_type=st.sampled_from(COVARIANCE_TYPES),
    seed=st.integers(0, 2**32 - 1),
    sizes=st.lists(st.integers(0, 15), min_size=1, max_size=5),
)
def test_stats_from_resp_partition_invariant(covariance_type, seed, sizes):
    rng = np.random.default_rng(seed)
    n = sum(sizes)
    X, resp, shift = rng.normal(size=(n, 3)), random_resp(rng, n, 2), rng.normal(size=3)
    bounds = np.cumsum([0, *sizes])
    parts = [
        stats_from_resp(t(X[a:b]), t(resp[a:b]), covariance_type, t(shift))
        for a, b in itertools.pairwise(bounds)
    ]
    pooled = stats_from_resp(t(X), t(resp), covariance_type, t(shift))
    merged = merge_stats(reversed(parts))
    assert_stats_equal(merged, pooled, rtol=1e-12)
    assert_m_steps_equal(merged, pooled, atol=1e-9)


def test_stats_from_resp_of_zero_rows_is_zero(covariance_type):
    """A client with no rows contributes zero statistics, whatever the route."""
    shift = t([1.0, -1.0, 0.5])
    empty_X, empty_resp = (
        torch.zeros(0, 3, dtype=torch.float64),
        torch.zeros(0, 2, dtype=torch.float64),
    )
    stats = stats_from_resp(empty_X, empty_resp, covariance_type, shift)
    assert_stats_equal(stats, zero_stats(2, 3, covariance_type, shift), rtol=0)


def test_merge_rejects_different_shift(covariance_type):
    a = zero_stats(2, 3, covariance_type, torch.zeros(3, dtype=torch.float64))
    b = zero_stats(2, 3, covariance_type, torch.ones(3, dtype=torch.float64))
    with pytest.raises(ValueError, match="shift"):
        a + b
    with pytest.raises(ValueError, match="shift"):
        merge_stats([a, a, b])


def test_merge_rejects_different_covariance_type():
    shift = torch.zeros(3, dtype=torch.float64)
    a = zero_stats(2, 3, "full", shift)
    b = zero_stats(2, 3, "diag", shift)
    with pytest.raises(ValueError, match="'full' and 'diag'"):
        a + b


@pytest.mark.parametrize(("k", "d"), [(3, 3), (2, 4)])
def test_merge_rejects_different_shapes(covariance_type, k, d):
    a = zero_stats(2, 3, covariance_type, torch.zeros(3, dtype=torch.float64))
    b = zero_stats(k, d, covariance_type, torch.zeros(d, dtype=torch.float64))
    with pytest.raises(ValueError, match=rf"\(2, 3\) and \({k}, {d}\)"):
        a + b


def test_merge_stats_needs_at_least_one():
    with pytest.raises(ValueError, match="at least one"):
        merge_stats([])


def test_adding_a_non_stats_object_is_a_type_error():
    a = zero_stats(2, 3, "full", torch.zeros(3, dtype=torch.float64))
    with pytest.raises(TypeError):
        a + 1.0


def test_merge_does_not_modify_operands(covariance_type):
    rng = np.random.default_rng(0)
    shift = t(np.zeros(3))
    a = stats_from_resp(
        t(rng.normal(size=(5, 3))), t(random_resp(rng, 5, 2)), covariance_type, shift
    )
    before = {name: x.clone() for name, x in a.tensors().items()}
    merge_stats([a, a, a])
    for name, x in a.tensors().items():
        assert torch.equal(x, before[name]), name


@pytest.mark.parametrize("bad", ["Full", "none"])
def test_unknown_covariance_type(bad):
    with pytest.raises(ValueError, match="'full', 'tied', 'diag', 'spherical'"):
        stats_from_resp(torch.zeros(2, 3), torch.ones(2, 1), bad, torch.zeros(3))
    with pytest.raises(ValueError, match="'full', 'tied', 'diag', 'spherical'"):
        zero_stats(2, 3, bad, torch.zeros(3))


@pytest.mark.parametrize("covariance_type", ["full", "tied", "diag", "spherical"])
@pytest.mark.parametrize("chunk_size", [1, 7, 64, None])
def test_stats_from_resp_in_chunks_equals_one_pass(covariance_type, chunk_size):
    """Chunked statistics add up to those of one pass over all rows (to round-off); zero rows
    give zero statistics of the right shapes."""
    gen = torch.Generator().manual_seed(3)
    X = torch.randn(50, 4, dtype=torch.float64, generator=gen) * 3 + 10
    resp = torch.softmax(torch.randn(50, 3, dtype=torch.float64, generator=gen), dim=1)
    shift = X.mean(0)
    whole = stats_from_resp(X, resp, covariance_type, shift, chunk_size=50)
    chunked = stats_from_resp(X, resp, covariance_type, shift, chunk_size=chunk_size)
    for name in ("counts", "sums", "second"):
        assert_close_scaled(getattr(chunked, name), getattr(whole, name), rtol=1e-12)
    empty = stats_from_resp(X[:0], resp[:0], covariance_type, shift, chunk_size=chunk_size)
    assert empty.second.shape == whole.second.shape and not empty.second.any()
    assert empty.sums.shape == (3, 4) and float(empty.counts.sum()) == 0.0
