"""The auditing estimator: Clopper-Pearson upper ends and the empirical epsilon lower bound,
against hand computations (SciPy's beta quantiles, the closed form of a zero count, the
errors of a threshold counted by hand)."""

import math

import numpy as np
import pytest
from scipy.stats import beta

from fednovelty.evaluation.membership_audit import (
    auc_interval,
    clopper_pearson_upper,
    epsilon_lower_bound,
    weighted_aucs,
)

DELTA = 1e-5


def test_clopper_pearson_upper_is_the_beta_quantile():
    assert clopper_pearson_upper(3, 20) == pytest.approx(beta.ppf(0.975, 4, 17), rel=1e-12)
    assert clopper_pearson_upper(3, 20, level=0.9) == pytest.approx(
        beta.ppf(0.95, 4, 17), rel=1e-12
    )
    # no successes: 1 - (alpha / 2)^(1 / n) in closed form; all successes: 1
    assert clopper_pearson_upper(0, 50) == pytest.approx(1 - 0.025 ** (1 / 50), rel=1e-12)
    assert clopper_pearson_upper(7, 7) == 1.0


@pytest.mark.parametrize(
    ("k", "n", "level"), [(-1, 5, 0.95), (6, 5, 0.95), (0, 0, 0.95), (1, 5, 1.0)]
)
def test_clopper_pearson_upper_rejects_bad_counts(k, n, level):
    with pytest.raises(ValueError, match="0 <= k <= n"):
        clopper_pearson_upper(k, n, level)


def test_perfect_separation_gives_the_zero_count_bound():
    """50 members above 50 non-members: at the best threshold no errors, so the bound is
    log((1 - delta - u) / u) with u = 1 - 0.025^(1/50) (about 2.57)."""
    found = epsilon_lower_bound(np.arange(50) + 100.0, np.arange(50.0), DELTA)
    u = 1 - 0.025 ** (1 / 50)
    assert found.epsilon == pytest.approx(math.log((1 - DELTA - u) / u), rel=1e-10)
    assert (found.false_positives, found.false_negatives) == (0, 0)
    assert found.threshold == 100.0


def test_a_fixed_threshold_counts_its_errors_by_hand():
    """Members [0.5, 2, 3, 4, 5], non-members [0, 1, 2.5, 6]; the rule score >= 2 misses one
    member (0.5) and calls two non-members (2.5, 6) members."""
    members, nonmembers = np.array([0.5, 2, 3, 4, 5]), np.array([0.0, 1, 2.5, 6])
    found = epsilon_lower_bound(members, nonmembers, DELTA, threshold=2.0, flipped=False)
    fpr_up, fnr_up = beta.ppf(0.975, 3, 2), beta.ppf(0.975, 2, 4)
    assert (found.false_positives, found.false_negatives) == (2, 1)
    assert found.fpr_upper == pytest.approx(fpr_up, rel=1e-12)
    assert found.fnr_upper == pytest.approx(fnr_up, rel=1e-12)
    expected = max(0.0, math.log((1 - DELTA - fnr_up) / fpr_up))
    assert found.epsilon == pytest.approx(expected, abs=1e-12)
    flipped = epsilon_lower_bound(members, nonmembers, DELTA, threshold=2.0, flipped=True)
    expected = max(0.0, math.log((1 - DELTA - fpr_up) / fnr_up))
    assert flipped.epsilon == pytest.approx(expected, abs=1e-12)


def test_the_best_threshold_is_the_maximum_over_thresholds_and_directions():
    rng = np.random.default_rng(0)
    members, nonmembers = rng.normal(1.5, 1, 200), rng.normal(0, 1, 200)
    found = epsilon_lower_bound(members, nonmembers, DELTA)
    by_hand = 0.0
    for t in np.unique(np.r_[members, nonmembers]):
        fpr_up = beta.ppf(0.975, np.sum(nonmembers >= t) + 1, np.sum(nonmembers < t))
        fnr_up = beta.ppf(0.975, np.sum(members < t) + 1, np.sum(members >= t))
        fpr_up = 1.0 if np.isnan(fpr_up) else fpr_up  # Beta(n + 1, 0): every one wrong
        fnr_up = 1.0 if np.isnan(fnr_up) else fnr_up
        for good, bad in ((1 - DELTA - fnr_up, fpr_up), (1 - DELTA - fpr_up, fnr_up)):
            if good > bad:
                by_hand = max(by_hand, math.log(good / bad))
    assert found.epsilon == pytest.approx(by_hand, rel=1e-10)
    assert 0 < found.epsilon < 3


def test_identical_scores_give_no_evidence():
    found = epsilon_lower_bound(np.zeros(30), np.zeros(30), DELTA)
    assert found.epsilon == 0.0


def test_empty_scores_are_refused():
    with pytest.raises(ValueError, match="at least one member"):
        epsilon_lower_bound(np.array([]), np.zeros(3), DELTA)


def test_weighted_aucs_are_roc_auc_score_on_the_repeated_rows():
    from sklearn.metrics import roc_auc_score

    rng = np.random.default_rng(3)
    pos, neg = np.round(rng.normal(0.5, 1, 30), 1), np.round(rng.normal(0, 1, 40), 1)  # ties
    pos_w = rng.integers(0, 4, (5, 30)).astype(float)
    neg_w = rng.integers(0, 4, (5, 40)).astype(float)
    got = weighted_aucs(pos, neg, pos_w, neg_w)
    for b in range(5):
        p, n = np.repeat(pos, pos_w[b].astype(int)), np.repeat(neg, neg_w[b].astype(int))
        labels = np.r_[np.ones(p.size), np.zeros(n.size)]
        assert abs(got[b] - roc_auc_score(labels, np.r_[p, n])) <= 1e-12


def test_the_bootstrap_interval_is_the_resampled_roc_auc_scores_percentiles():
    from sklearn.metrics import roc_auc_score

    rng = np.random.default_rng(4)
    pos, neg = np.round(rng.normal(0.4, 1, 25), 1), rng.normal(0, 1, 35)
    draws_rng = np.random.default_rng(7)
    labels = np.r_[np.ones(25), np.zeros(35)]
    draws = [
        roc_auc_score(labels, np.r_[draws_rng.choice(pos, 25), draws_rng.choice(neg, 35)])
        for _ in range(200)
    ]
    auc, low, high = auc_interval(pos, neg, n_boot=200, seed=7)
    assert abs(low - np.percentile(draws, 2.5)) <= 1e-12
    assert abs(high - np.percentile(draws, 97.5)) <= 1e-12
    assert abs(auc - roc_auc_score(labels, np.r_[pos, neg])) <= 1e-12
