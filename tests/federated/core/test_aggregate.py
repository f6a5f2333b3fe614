"""Server-side aggregation rules (``federated.core.aggregate``) against NumPy references.

Each client's statistics are computed here with NumPy from its rows and random
responsibilities; summed by the module they must equal NumPy's statistics of the pooled rows.
Ranges, centroids, mixtures and parameter averages are checked against sums, minima, maxima
and weighted means written out by hand, and every refusal by its message.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from _tolerance import assert_close_scaled

from fednovelty.federated.core.aggregate import (
    STATS_FIELDS,
    average_learners,
    average_params,
    learner_name,
    learners_tensors,
    merge_ranges,
    pool_centroids,
    released,
    stats_from_message,
    stats_message,
    sum_stats,
    total_variance,
    union_mixture,
)
from fednovelty.federated.core.base import Message, skipped_reply
from fednovelty.mixture import MixtureParams, SufficientStats, score_samples

K, D = 3, 4
COVARIANCE_TYPES = ("full", "tied", "diag", "spherical")


def rows_and_resp(seed: int, n: int) -> tuple[np.ndarray, np.ndarray]:
    """``n`` rows (n, D) and responsibilities (n, K) whose rows sum to 1."""
    rng = np.random.default_rng(seed)
    X = rng.normal(size=(n, D)) * rng.uniform(0.5, 3.0, size=D) + rng.normal(size=D) * 5
    return X, rng.dirichlet(np.ones(K), size=n)


def numpy_stats(X: np.ndarray, resp: np.ndarray, shift: np.ndarray, covariance_type: str) -> dict:
    """Counts, sums and second moments about ``shift`` (shape by covariance type), a
    log-likelihood of ``-2`` per row and the row count: NumPy, from the definitions."""
    c = X - shift
    second = {
        "full": np.einsum("nk,na,nb->kab", resp, c, c),
        "tied": np.einsum("n,na,nb->ab", resp.sum(1), c, c),
        "diag": resp.T @ c**2,
        "spherical": resp.T @ (c**2).sum(1),
    }[covariance_type]
    return {
        "counts": resp.sum(0),
        "sums": resp.T @ c,
        "second": second,
        "log_likelihood": np.array(-2.0 * len(X)),
        "n_samples": np.array(float(len(X))),
    }


def stats_reply(stats: dict, dtype=torch.float64) -> Message:
    return Message("em", {name: torch.tensor(value, dtype=dtype) for name, value in stats.items()})


# ----------------------------------------------------------------------------- replies
def test_released_leaves_the_skipped_replies_out_in_order() -> None:
    a, b = Message("em", {"n_samples": torch.tensor(3.0)}), Message("em", scalars={"x": 1})
    skipped = skipped_reply("em", "below the floor")
    assert released([skipped, a, skipped, b]) == [a, b]
    assert released(iter([skipped])) == []


def test_stats_message_carries_the_summed_fields_and_not_the_shift() -> None:
    X, resp = rows_and_resp(0, 30)
    shift = np.full(D, 0.5)
    fields = {k: torch.tensor(v) for k, v in numpy_stats(X, resp, shift, "diag").items()}
    stats = SufficientStats(shift=torch.tensor(shift), covariance_type="diag", **fields)
    message = stats_message(stats, "em")
    assert message.kind == "em" and message.scalars == {}
    assert set(message.tensors) == set(STATS_FIELDS) == set(fields)  # no "shift"
    for name, value in fields.items():
        assert torch.equal(message.tensors[name], value)


def test_stats_from_message_rebuilds_the_statistics_in_the_shifts_dtype() -> None:
    X, resp = rows_and_resp(1, 25)
    expected = numpy_stats(X, resp, np.zeros(D), "full")
    shift = torch.zeros(D, dtype=torch.float64)
    stats = stats_from_message(stats_reply(expected, torch.float32), shift, "full")
    assert stats.covariance_type == "full" and stats.shift is shift
    for name, value in expected.items():
        got = getattr(stats, name)
        assert got.dtype == torch.float64
        np.testing.assert_allclose(got.numpy(), value, rtol=1e-6)  # float32 on the wire


def test_stats_from_message_refuses_what_no_client_could_send() -> None:
    X, resp = rows_and_resp(2, 20)
    good = numpy_stats(X, resp, np.zeros(D), "diag")
    shift = torch.zeros(D, dtype=torch.float64)
    partial = stats_reply({k: v for k, v in good.items() if k != "second"})
    with pytest.raises(ValueError, match=r"statistics reply lacks tensors \['second'\]"):
        stats_from_message(partial, shift, "diag")
    wrong_width = r"has sums of shape \(3, 4\); expected \(n_components, 5\)"
    with pytest.raises(ValueError, match=wrong_width):
        stats_from_message(stats_reply(good), torch.zeros(5, dtype=torch.float64), "diag")
    for name, value, reason in [
        ("counts", np.array([1.0, math.nan, 2.0]), "non-finite values in 'counts'"),
        ("second", np.full((K, D), math.inf), "non-finite values in 'second'"),
        ("counts", np.array([1.0, -0.5, 2.0]), "negative counts"),
        ("n_samples", np.array(-1.0), "negative counts"),
    ]:
        with pytest.raises(ValueError, match=f"statistics reply has {reason}"):
            stats_from_message(stats_reply({**good, name: value}), shift, "diag")


# ----------------------------------------------------------------------------- sum_stats
@pytest.mark.parametrize("covariance_type", COVARIANCE_TYPES)
def test_sum_stats_equals_the_statistics_of_the_pooled_rows(covariance_type) -> None:
    parts = [rows_and_resp(seed, n) for seed, n in enumerate((17, 40, 23))]
    shift = np.array([1.0, -2.0, 0.5, 3.0])
    replies = [stats_reply(numpy_stats(X, r, shift, covariance_type)) for X, r in parts]
    replies.insert(1, skipped_reply("em", "below the floor"))  # left out
    total = sum_stats(replies, torch.tensor(shift), covariance_type)
    X = np.concatenate([X for X, _ in parts])
    resp = np.concatenate([r for _, r in parts])
    expected = numpy_stats(X, resp, shift, covariance_type)
    assert total.covariance_type == covariance_type
    for name, value in expected.items():
        assert_close_scaled(getattr(total, name), value, rtol=1e-12, err_msg=name)


def test_sum_stats_refuses_replies_it_cannot_add_by_name() -> None:
    shift = torch.zeros(D, dtype=torch.float64)
    X, resp = rows_and_resp(3, 20)
    good = numpy_stats(X, resp, np.zeros(D), "diag")
    with pytest.raises(ValueError, match="every reply was skipped"):
        sum_stats([skipped_reply("em", "below the floor")] * 2, shift, "diag")
    fewer = numpy_stats(X, resp[:, :2] / resp[:, :2].sum(1, keepdims=True), np.zeros(D), "diag")
    mismatch = r"Cannot merge statistics of shapes \(3, 4\) and \(2, 4\)"
    with pytest.raises(ValueError, match=mismatch):
        sum_stats([stats_reply(good), stats_reply(fewer)], shift, "diag")
    with pytest.raises(ValueError, match=r"expected \(n_components, 5\)"):
        sum_stats([stats_reply(good)] * 2, torch.zeros(5, dtype=torch.float64), "diag")
    noisy = {**good, "counts": good["counts"] - 100.0}  # differential-privacy noise
    with pytest.raises(ValueError, match="a statistics reply has negative counts"):
        sum_stats([stats_reply(good), stats_reply(noisy)], shift, "diag")
    summed = sum_stats([stats_reply(good), stats_reply(noisy)], shift, "diag", noisy=True)
    np.testing.assert_allclose(summed.counts.numpy(), 2 * good["counts"] - 100.0)


def test_sum_stats_names_a_non_finite_term_and_not_an_overflowing_sum() -> None:
    shift = torch.zeros(D, dtype=torch.float64)
    terms = [numpy_stats(*rows_and_resp(c, 40), np.zeros(D), "full") for c in range(3)]
    total = sum_stats([stats_reply(t) for t in terms], shift, "full")
    assert_close_scaled(total.second, sum(t["second"] for t in terms))
    broken = {**terms[0], "sums": terms[0]["sums"].copy()}
    broken["sums"][0, 0] = math.inf
    with pytest.raises(ValueError, match="non-finite values in 'sums'"):
        sum_stats([*map(stats_reply, terms), stats_reply(broken)], shift, "full")
    huge = [stats_reply({**t, "log_likelihood": np.array(-1.5e308)}) for t in terms[:2]]
    summed = sum_stats(huge, shift, "full")  # finite terms: summed, the sum is -inf
    assert summed.log_likelihood.item() == -math.inf


@pytest.mark.parametrize("covariance_type", COVARIANCE_TYPES)
def test_sum_stats_in_stacks_of_a_few_replies_equals_one_stack(covariance_type, monkeypatch):
    """A large federation's replies are summed a few at a time (``SUM_BYTES``): the same
    totals, and a broken reply in a later stack still refused by name."""
    from fednovelty.federated.core import aggregate

    shift = np.array([1.0, -2.0, 0.5, 3.0])
    parts = [rows_and_resp(seed, 10 + seed) for seed in range(7)]
    replies = [stats_reply(numpy_stats(X, r, shift, covariance_type)) for X, r in parts]
    whole = sum_stats(replies, torch.tensor(shift), covariance_type)
    monkeypatch.setattr(aggregate, "SUM_BYTES", 1)  # one reply a stack
    stacked = sum_stats(replies, torch.tensor(shift), covariance_type)
    X = np.concatenate([X for X, _ in parts])
    expected = numpy_stats(X, np.concatenate([r for _, r in parts]), shift, covariance_type)
    for name, value in expected.items():
        assert_close_scaled(getattr(stacked, name), value, rtol=1e-12, err_msg=name)
        assert_close_scaled(getattr(stacked, name), getattr(whole, name), rtol=1e-12)
    broken = {**numpy_stats(*parts[0], shift, covariance_type)}
    broken["counts"] = broken["counts"].copy()
    broken["counts"][1] = math.nan
    with pytest.raises(ValueError, match="non-finite values in 'counts'"):
        sum_stats([*replies, stats_reply(broken)], torch.tensor(shift), covariance_type)


@pytest.mark.parametrize("covariance_type", COVARIANCE_TYPES)
def test_total_variance_is_the_mean_feature_variance_of_the_rows(covariance_type) -> None:
    parts = [rows_and_resp(seed, n) for seed, n in enumerate((30, 12))]
    shift = np.array([0.3, 1.0, -4.0, 2.0])
    replies = [stats_reply(numpy_stats(X, r, shift, covariance_type)) for X, r in parts]
    stats = sum_stats(replies, torch.tensor(shift), covariance_type)
    pooled = np.concatenate([X for X, _ in parts])
    assert total_variance(stats) == pytest.approx(pooled.var(0).mean(), rel=1e-10)


# ----------------------------------------------------------------------------- centroids, ranges
def test_pool_centroids_concatenates_the_clients_centroids_and_counts() -> None:
    a = Message("centroids", {"centers": torch.ones(2, D), "counts": torch.tensor([3, 4])})
    b = Message(
        "centroids",
        {"centers": torch.full((1, D), 7.0), "counts": torch.tensor([5.0], dtype=torch.float64)},
    )
    empty = Message("centroids", {"centers": torch.zeros(0, D), "counts": torch.zeros(0)})
    centers, counts = pool_centroids([a, skipped_reply("centroids", "no"), empty, b])
    np.testing.assert_array_equal(centers.numpy(), np.vstack([np.ones((2, D)), np.full((1, D), 7)]))
    np.testing.assert_array_equal(counts.numpy(), [3.0, 4.0, 5.0])
    assert counts.dtype == centers.dtype == torch.float32
    none_centers, none_counts = pool_centroids([empty, skipped_reply("centroids", "no")])
    assert none_centers.shape == (0, 0) and none_counts.shape == (0,)
    assert none_counts.dtype == torch.float64


def _range_reply(X: np.ndarray) -> Message:
    tensors = {"min": X.min(0), "max": X.max(0), "n_samples": np.array(float(len(X)))}
    return Message("range", {k: torch.tensor(v) for k, v in tensors.items()})


def test_merge_ranges_is_the_minimum_and_maximum_over_every_row() -> None:
    parts = [rows_and_resp(seed, n)[0] for seed, n in enumerate((5, 31, 12))]
    nothing = Message(
        "range",
        {
            "min": torch.full((D,), -1e9, dtype=torch.float64),  # a client without rows
            "max": torch.full((D,), 1e9, dtype=torch.float64),
            "n_samples": torch.tensor(0.0, dtype=torch.float64),
        },
    )
    replies = [*map(_range_reply, parts), nothing, skipped_reply("range", "no")]
    low, high = merge_ranges(replies)
    pooled = np.concatenate(parts)
    np.testing.assert_array_equal(low.numpy(), pooled.min(0))
    np.testing.assert_array_equal(high.numpy(), pooled.max(0))
    with pytest.raises(ValueError, match="no client with data replied with its feature range"):
        merge_ranges([nothing, skipped_reply("range", "no")])


# ----------------------------------------------------------------------------- mixtures
def _diag_mixture(weights, means, scales) -> MixtureParams:
    means = torch.tensor(means, dtype=torch.float64)
    prec = 1.0 / torch.tensor(scales, dtype=torch.float64)
    return MixtureParams(torch.tensor(weights, dtype=torch.float64), means, prec, "diag")


def test_union_mixture_weights_by_client_size():
    a = _diag_mixture([0.25, 0.75], [[0.0, 0.0], [1.0, 1.0]], [[1.0, 2.0], [3.0, 4.0]])
    b = _diag_mixture([0.5, 0.3, 0.2], [[5.0, 5.0], [6.0, 6.0], [7.0, 7.0]], [[1.0, 1.0]] * 3)
    union = union_mixture([a, b], [100.0, 300.0])
    # r_ck |D_c| / |D| by hand: |D| = 400.
    expected = [0.25 * 0.25, 0.75 * 0.25, 0.5 * 0.75, 0.3 * 0.75, 0.2 * 0.75]
    np.testing.assert_allclose(union.weights.numpy(), expected, rtol=1e-12)
    assert union.covariance_type == "diag"
    assert union.n_components == 5
    np.testing.assert_array_equal(union.means.numpy(), np.vstack([a.means, b.means]))
    np.testing.assert_array_equal(
        union.precisions_cholesky.numpy(),
        np.vstack([a.precisions_cholesky, b.precisions_cholesky]),
    )


def test_union_mixture_of_tied_models_is_full():
    def tied(weights, means, cov):
        return MixtureParams.from_covariances(
            torch.tensor(weights, dtype=torch.float64),
            torch.tensor(means, dtype=torch.float64),
            torch.tensor(cov, dtype=torch.float64),
            "tied",
        )

    cov_a = [[2.0, 0.5], [0.5, 1.0]]
    cov_b = [[1.0, -0.2], [-0.2, 3.0]]
    a = tied([0.5, 0.5], [[0.0, 0.0], [1.0, 0.0]], cov_a)
    b = tied([1.0], [[4.0, 4.0]], cov_b)
    union = union_mixture([a, b], [2.0, 2.0])
    assert union.covariance_type == "full"
    assert union.precisions_cholesky.shape == (3, 2, 2)
    assert_close_scaled(union.weights.numpy(), [0.25, 0.25, 0.5], rtol=1e-12)
    assert_close_scaled(union.covariances.numpy(), np.stack([cov_a, cov_a, cov_b]), rtol=1e-12)
    # Densities of the union equal the size-weighted mixture of the client densities.
    X = torch.tensor([[0.3, -0.2], [3.0, 4.5], [10.0, -1.0]], dtype=torch.float64)
    expected = torch.logsumexp(
        torch.stack([score_samples(a, X) + np.log(0.5), score_samples(b, X) + np.log(0.5)]), 0
    )
    np.testing.assert_allclose(score_samples(union, X).numpy(), expected.numpy(), atol=1e-12)


def test_union_mixture_needs_a_model():
    with pytest.raises(ValueError, match="at least one"):
        union_mixture([], [])


def test_union_mixture_needs_one_size_per_model() -> None:
    a = _diag_mixture([1.0], [[0.0, 0.0]], [[1.0, 1.0]])
    with pytest.raises(ValueError, match="shorter"):
        union_mixture([a, a], [10.0])


# ----------------------------------------------------------------------------- parameter means
def test_average_params_is_the_weighted_mean_of_the_copies() -> None:
    rng = np.random.default_rng(4)
    current = {"w": torch.zeros(2, 3, dtype=torch.float32), "b": torch.zeros(3)}
    copies = [{"w": rng.normal(size=(2, 3)), "b": rng.normal(size=3)} for _ in range(4)]
    weights = np.array([0.5, 0.0, 2.0, 1.5])
    as_tensors = [{k: torch.tensor(v) for k, v in c.items()} for c in copies]  # float64
    averaged = average_params(current, as_tensors, torch.tensor(weights))
    for name in ("w", "b"):
        expected = sum(w * c[name] for w, c in zip(weights, copies, strict=True)) / weights.sum()
        np.testing.assert_allclose(averaged[name].numpy(), expected, rtol=1e-6)
        assert averaged[name].dtype == torch.float32  # current's dtype
        assert float(current[name].abs().sum()) == 0.0  # nothing given is modified
    unused = average_params(current, as_tensors, torch.zeros(4, dtype=torch.float64))
    assert unused == current and unused is not current


def test_learner_names_and_tensors_are_learner_by_learner() -> None:
    learners = [{"w": torch.ones(2), "b": torch.zeros(1)}, {"w": torch.full((2,), 3.0)}]
    assert learner_name(4, "w") == "learner.4.w"
    tensors = learners_tensors(learners)
    assert list(tensors) == ["learner.0.w", "learner.0.b", "learner.1.w"]
    assert tensors["learner.1.w"] is learners[1]["w"]


def test_learner_averaging_weights_each_learner_by_its_gammas():
    broadcast = [
        {"w": torch.zeros(2, 3, dtype=torch.float64), "b": torch.zeros(2, dtype=torch.float64)},
        {"w": torch.full((2, 3), 7.0, dtype=torch.float64), "b": torch.ones(2)},
    ]
    gen = torch.Generator().manual_seed(0)

    def draw(like):
        return torch.randn(like.shape, generator=gen, dtype=torch.float64)

    trained = [[{k: draw(v) for k, v in learner.items()} for learner in broadcast] for _ in "abc"]
    replies = [
        Message(
            "joint_em", {f"learner.{m2}.{k}": v for m2, lr in enumerate(t) for k, v in lr.items()}
        )
        for t in trained
    ]
    gammas = torch.tensor([[1.0, 0.0], [3.0, 0.0], [0.0, 0.0]], dtype=torch.float64)
    averaged = average_learners(broadcast, replies, gammas)
    for name in ("w", "b"):
        expected = (1.0 * trained[0][0][name] + 3.0 * trained[1][0][name]) / 4.0
        assert_close_scaled(averaged[0][name], expected, rtol=1e-12, err_msg=name)
        assert averaged[0][name].dtype == broadcast[0][name].dtype
        assert torch.equal(averaged[1][name], broadcast[1][name])  # no client used learner 1
    assert float(broadcast[0]["w"].abs().sum()) == 0.0  # the broadcast learners are unchanged
