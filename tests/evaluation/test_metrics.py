"""Metrics: agreement with sklearn.metrics, hand-made cases with known answers, bad inputs."""

from __future__ import annotations

import doctest

import numpy as np
import pytest
from sklearn.metrics import (
    average_precision_score,
    precision_recall_curve,
    roc_auc_score,
    roc_curve,
)

from fednovelty.evaluation import metrics
from fednovelty.evaluation.metrics import aupr_in, aupr_out, auroc, evaluate, fpr_at_95_tpr, max_f1

METRICS = [auroc, aupr_in, aupr_out, fpr_at_95_tpr, max_f1, evaluate]
KEYS = ["auroc", "aupr_in", "aupr_out", "fpr_at_95_tpr", "max_f1"]


def _random_case(seed: int, n: int = 300, *, tied: bool = False):
    rng = np.random.default_rng(seed)
    y = (rng.random(n) < 0.2).astype(int)
    y[:2] = [0, 1]
    scores = rng.normal(size=n) + 1.5 * y
    if tied:
        scores = np.round(scores, 1)  # many ties
    return y, scores


def _reference_fpr95(y, scores):
    """Brute force: lowest threshold-free definition, straight from the docstring."""
    novel, inlier = scores[y == 1], scores[y == 0]
    best = 1.0
    for t in np.unique(scores):
        if np.mean(novel >= t) >= 0.95:
            best = min(best, float(np.mean(inlier >= t)))
    return best


def _reference_max_f1(y, scores):
    best = 0.0
    for t in np.unique(scores):
        flagged = scores >= t
        tp = np.sum(flagged & (y == 1))
        if tp:
            p, r = tp / flagged.sum(), tp / y.sum()
            best = max(best, 2 * p * r / (p + r))
    return best


@pytest.mark.parametrize("seed", range(5))
@pytest.mark.parametrize("tied", [False, True])
def test_agrees_with_sklearn(seed, tied):
    y, s = _random_case(seed, tied=tied)
    assert auroc(y, s) == roc_auc_score(y, s)
    assert aupr_out(y, s) == average_precision_score(y, s)
    assert aupr_in(y, s) == average_precision_score(1 - y, -s)

    fpr, tpr, _ = roc_curve(y, s)
    assert fpr_at_95_tpr(y, s) == fpr[tpr >= 0.95].min()
    assert fpr_at_95_tpr(y, s) == pytest.approx(_reference_fpr95(y, s), abs=1e-12)

    p, r, _ = precision_recall_curve(y, s)
    with np.errstate(invalid="ignore"):
        f1 = np.nan_to_num(2 * p * r / (p + r))
    assert max_f1(y, s) == pytest.approx(f1.max(), abs=1e-12)
    assert max_f1(y, s) == pytest.approx(_reference_max_f1(y, s), abs=1e-12)


def test_evaluate_returns_all_five_as_floats():
    y, s = _random_case(0)
    result = evaluate(y, s)
    assert list(result) == KEYS
    assert all(type(v) is float for v in result.values())
    singles = {"auroc": auroc, "aupr_in": aupr_in, "aupr_out": aupr_out}
    singles |= {"fpr_at_95_tpr": fpr_at_95_tpr, "max_f1": max_f1}
    assert result == {k: f(y, s) for k, f in singles.items()}


def test_perfect_separation():
    y = [0, 0, 0, 1, 1]
    s = [0.1, 0.2, 0.3, 0.7, 0.9]
    assert evaluate(y, s) == {k: (0.0 if k == "fpr_at_95_tpr" else 1.0) for k in KEYS}


def test_reversed_scores():
    y = np.array([0, 0, 0, 1, 1])
    s = np.array([0.7, 0.8, 0.9, 0.1, 0.2])
    assert auroc(y, s) == 0.0
    assert fpr_at_95_tpr(y, s) == 1.0  # flagging both novel samples flags every inlier
    # Novel samples are ranked 4th and 5th: precision 1/4 at recall 1/2, 2/5 at recall 1.
    assert aupr_out(y, s) == pytest.approx(0.5 * 1 / 4 + 0.5 * 2 / 5)
    assert max_f1(y, s) == pytest.approx(2 * 0.4 / 1.4)


def test_all_scores_tied_is_chance():
    y = [0, 1, 0, 1]
    s = [0.5, 0.5, 0.5, 0.5]
    assert auroc(y, s) == 0.5
    assert aupr_out(y, s) == 0.5
    assert aupr_in(y, s) == 0.5
    assert fpr_at_95_tpr(y, s) == 1.0
    assert max_f1(y, s) == pytest.approx(2 / 3)


def test_partial_tie_counts_half():
    # One novel/inlier pair tied, the other three pairs ordered correctly.
    y = [0, 0, 1, 1]
    s = [0.1, 0.5, 0.5, 0.9]
    assert auroc(y, s) == pytest.approx(3.5 / 4)
    assert fpr_at_95_tpr(y, s) == 0.5


def test_order_of_input_does_not_matter():
    y, s = _random_case(3, tied=True)
    perm = np.random.default_rng(0).permutation(len(y))
    assert evaluate(y, s) == evaluate(y[perm], s[perm])


def test_accepts_bool_labels_lists_and_float_labels():
    s = [0.1, 0.2, 0.8, 0.9]
    ref = evaluate([0, 0, 1, 1], s)
    assert evaluate([False, False, True, True], s) == ref
    assert evaluate(np.array([0.0, 0.0, 1.0, 1.0]), s) == ref


def test_inputs_not_modified():
    y, s = _random_case(1)
    y0, s0 = y.copy(), s.copy()
    evaluate(y, s)
    np.testing.assert_array_equal(y, y0)
    np.testing.assert_array_equal(s, s0)


@pytest.mark.parametrize("func", METRICS, ids=lambda f: f.__name__)
def test_length_mismatch(func):
    with pytest.raises(ValueError, match=r"same length; got 3 labels and 2 scores"):
        func([0, 1, 0], [0.1, 0.2])


@pytest.mark.parametrize("func", METRICS, ids=lambda f: f.__name__)
def test_not_binary(func):
    with pytest.raises(ValueError, match=r"y_true must contain only 0 .* found other values \[2\]"):
        func([0, 1, 2], [0.1, 0.2, 0.3])
    with pytest.raises(ValueError, match=r"y_true must contain only 0"):
        func(["in", "out", "in"], [0.1, 0.2, 0.3])


@pytest.mark.parametrize("func", METRICS, ids=lambda f: f.__name__)
def test_one_class_only(func):
    with pytest.raises(ValueError, match=r"only inlier \(0\) samples \(3 of them\)"):
        func([0, 0, 0], [0.1, 0.2, 0.3])
    with pytest.raises(ValueError, match=r"only novel \(1\) samples .* needs at least one"):
        func([1, 1], [0.1, 0.2])


@pytest.mark.parametrize("func", METRICS, ids=lambda f: f.__name__)
@pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf])
def test_non_finite_scores(func, bad):
    with pytest.raises(ValueError, match=r"scores contains 1 NaN or infinite .*first at index 2"):
        func([0, 1, 0], [0.1, 0.2, bad])


def test_other_bad_inputs():
    with pytest.raises(ValueError, match=r"must be 1-D .* y_true.shape=\(2, 2\)"):
        auroc([[0, 1], [1, 0]], [[0.1, 0.2], [0.3, 0.4]])
    with pytest.raises(ValueError, match=r"scores must be numbers"):
        auroc([0, 1], ["low", "high"])
    with pytest.raises(ValueError, match=r"empty"):
        auroc([], [])


def test_error_names_the_metric():
    with pytest.raises(ValueError, match=r"^fpr_at_95_tpr: "):
        fpr_at_95_tpr([0, 0], [0.1, 0.2])


def test_doctests():
    result = doctest.testmod(metrics, raise_on_error=False)
    assert result.attempted >= 6
    assert result.failed == 0
