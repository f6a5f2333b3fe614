"""Measuring a membership-inference attack: its AUC, the AUC's error, and a lower bound on
epsilon.

AUCs are scikit-learn's ``roc_auc_score`` (:func:`membership_auc`, members the positive
class); :func:`auc_interval` gives a bootstrap interval (:func:`weighted_aucs`: every draw's
AUC at once) and :func:`auc_standard_error` the Hanley-McNeil standard error of an AUC from
its trial counts.

Auditing: :func:`epsilon_lower_bound` turns an attack's member and non-member scores into a
lower bound on the epsilon of whatever produced them (Jagielski, Ullman and Oprea 2020;
Nasr et al. 2021): at a threshold, the Clopper-Pearson upper bounds of the false-positive
and false-negative rates bound ``e^eps`` from below, since every ``(epsilon, delta)``-DP
mechanism keeps ``1 - delta - FNR <= e^eps FPR`` and ``1 - delta - FPR <= e^eps FNR``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
from scipy.stats import beta
from sklearn.metrics import roc_auc_score


# --------------------------------------------------------------------------- AUC and its error
def membership_auc(member_scores: np.ndarray, nonmember_scores: np.ndarray) -> float:
    """scikit-learn's ROC AUC of membership (members the positive class; higher score =
    guessed member) from scores of shapes (n_members,) and (n_nonmembers,)."""
    member_scores, nonmember_scores = np.ravel(member_scores), np.ravel(nonmember_scores)
    labels = np.r_[np.ones(member_scores.size), np.zeros(nonmember_scores.size)]
    return float(roc_auc_score(labels, np.r_[member_scores, nonmember_scores]))


def auc_standard_error(auc: float, n_members: int, n_nonmembers: int) -> float:
    """The standard error of an AUC estimated from ``n_members`` and ``n_nonmembers``
    independent scores (Hanley and McNeil 1982)."""
    q1, q2 = auc / (2 - auc), 2 * auc**2 / (1 + auc)
    variance = (
        auc * (1 - auc) + (n_members - 1) * (q1 - auc**2) + (n_nonmembers - 1) * (q2 - auc**2)
    ) / (n_members * n_nonmembers)
    return math.sqrt(max(variance, 0.0))


def weighted_aucs(
    member_scores: np.ndarray,
    nonmember_scores: np.ndarray,
    member_weights: np.ndarray,
    nonmember_weights: np.ndarray,
) -> np.ndarray:
    """ROC AUCs (B,) of ``B`` weighted copies of the scores: copy ``b`` holds member ``i``
    ``member_weights[b, i]`` times and non-member ``j`` ``nonmember_weights[b, j]`` times
    (weights (B, n_members) and (B, n_nonmembers), each row summing to its copy's size). The
    AUC is the Mann-Whitney statistic, a tie counted one half, which is what
    ``roc_auc_score`` gives on the copy; O(B (n_members + n_nonmembers) log n) in all."""
    order = np.argsort(nonmember_scores, kind="stable")
    sorted_neg = nonmember_scores[order]
    cumulative = np.concatenate(
        [np.zeros((member_weights.shape[0], 1)), np.cumsum(nonmember_weights[:, order], 1)], 1
    )
    below = np.searchsorted(sorted_neg, member_scores, side="left")
    at_or_below = np.searchsorted(sorted_neg, member_scores, side="right")
    beaten = cumulative[:, below] + 0.5 * (cumulative[:, at_or_below] - cumulative[:, below])
    pairs = member_weights.sum(1) * nonmember_weights.sum(1)
    return (member_weights * beaten).sum(1) / pairs


def auc_interval(
    member_scores: np.ndarray,
    nonmember_scores: np.ndarray,
    n_boot: int = 1000,
    level: float = 0.95,
    seed: int = 0,
) -> tuple[float, float, float]:
    """``(auc, low, high)``: :func:`membership_auc` and its percentile bootstrap interval at
    ``level``, members and non-members resampled separately ``n_boot`` times (each draw's
    AUC by :func:`weighted_aucs` on the draw's counts of each score)."""
    member_scores, nonmember_scores = np.ravel(member_scores), np.ravel(nonmember_scores)
    rng = np.random.default_rng(seed)
    n_pos, n_neg = member_scores.size, nonmember_scores.size
    pos_counts = np.empty((n_boot, n_pos))
    neg_counts = np.empty((n_boot, n_neg))
    for b in range(n_boot):  # the draws of rng.choice(scores, size), in its order
        pos_counts[b] = np.bincount(rng.integers(0, n_pos, n_pos), minlength=n_pos)
        neg_counts[b] = np.bincount(rng.integers(0, n_neg, n_neg), minlength=n_neg)
    draws = weighted_aucs(member_scores, nonmember_scores, pos_counts, neg_counts)
    tail = (1 - level) / 2 * 100
    low, high = np.percentile(draws, [tail, 100 - tail])
    return membership_auc(member_scores, nonmember_scores), float(low), float(high)


# --------------------------------------------------------------------------- empirical epsilon
def clopper_pearson_upper(k: int, n: int, level: float = 0.95) -> float:
    """The upper end of the two-sided Clopper-Pearson interval at ``level`` of a binomial
    rate from ``k`` successes in ``n`` trials: the ``1 - (1 - level) / 2`` quantile of
    ``Beta(k + 1, n - k)`` (1 when ``k = n``). The true rate exceeds it with probability at
    most ``(1 - level) / 2``.

    Raises:
        ValueError: ``n`` < 1, ``k`` outside ``[0, n]`` or ``level`` outside (0, 1).
    """
    if n < 1 or not 0 <= k <= n or not 0 < level < 1:
        raise ValueError(
            f"need n >= 1, 0 <= k <= n and level in (0, 1); got {k!r}, {n!r}, {level!r}."
        )
    if k == n:
        return 1.0
    return float(beta.ppf(1 - (1 - level) / 2, k + 1, n - k))


@dataclass(frozen=True)
class EpsilonLowerBound:
    """What :func:`epsilon_lower_bound` found.

    Attributes:
        epsilon: the lower bound (>= 0; 0 when the scores show nothing).
        threshold: the rule's threshold: ``score >= threshold`` is guessed member.
        flipped: ``False`` when the bound is ``log((1 - delta - FNR_up) / FPR_up)``,
            ``True`` when it is ``log((1 - delta - FPR_up) / FNR_up)``.
        fpr_upper, fnr_upper: the rule's Clopper-Pearson upper error rates.
        false_positives, false_negatives: the rule's errors among ``n_nonmembers`` and
            ``n_members`` scores.
    """

    epsilon: float
    threshold: float
    flipped: bool
    fpr_upper: float
    fnr_upper: float
    false_positives: int
    false_negatives: int
    n_members: int
    n_nonmembers: int


def _log_ratio(good: float, bad: float) -> float:
    """``log(good / bad)`` clipped at 0 (no evidence is epsilon 0)."""
    return math.log(good / bad) if good > bad else 0.0


def epsilon_lower_bound(
    member_scores: np.ndarray,
    nonmember_scores: np.ndarray,
    delta: float,
    level: float = 0.95,
    threshold: float | None = None,
    flipped: bool | None = None,
) -> EpsilonLowerBound:
    """A lower bound on epsilon from an attack's scores (higher = guessed member), shapes
    (n_members,) and (n_nonmembers,), each score from an independent run of the mechanism.

    The rule ``score >= t`` has false-positive rate ``FPR`` (non-members called members) and
    false-negative rate ``FNR``; an ``(epsilon, delta)``-DP mechanism (for the add/remove pair
    the members and non-members were run on) keeps ``e^eps >= (1 - delta - FNR) / FPR`` and
    ``e^eps >= (1 - delta - FPR) / FNR``. With the rates replaced by their Clopper-Pearson
    upper ends (:func:`clopper_pearson_upper`), the bound ``log((1 - delta - FNR_up) /
    FPR_up)`` (or the flipped one) is below the true epsilon with probability at least
    ``level`` (each upper end fails with probability at most ``(1 - level) / 2``).

    That holds for a threshold (and direction) fixed before the scores are seen, e.g. chosen
    on other runs. With ``threshold=None`` the best of every threshold (each distinct score)
    and both directions is returned: the usual auditing estimate, optimistic
    since it picks the best of many tests.

    Args:
        member_scores, nonmember_scores: the attack's scores of runs with and without the
            target.
        delta: the mechanism's delta.
        level: the confidence level of the Clopper-Pearson intervals.
        threshold: a fixed threshold, or ``None`` for the best one.
        flipped: with a fixed threshold, the direction (``None``: the better of both).

    Raises:
        ValueError: no member or no non-member scores.
    """
    members, nonmembers = np.ravel(member_scores), np.ravel(nonmember_scores)
    if members.size == 0 or nonmembers.size == 0:
        raise ValueError("need at least one member and one non-member score.")
    if threshold is None:
        candidates = np.unique(np.r_[members, nonmembers])
    else:
        candidates = np.array([float(threshold)])
    directions = (False, True) if flipped is None else (bool(flipped),)
    best = None
    for t in candidates:
        fp, fn = int(np.sum(nonmembers >= t)), int(np.sum(members < t))
        fpr_up = clopper_pearson_upper(fp, nonmembers.size, level)
        fnr_up = clopper_pearson_upper(fn, members.size, level)
        for flip in directions:
            good, bad = (1 - delta - fpr_up, fnr_up) if flip else (1 - delta - fnr_up, fpr_up)
            found = EpsilonLowerBound(
                _log_ratio(good, bad),
                float(t),
                flip,
                fpr_up,
                fnr_up,
                fp,
                fn,
                members.size,
                nonmembers.size,
            )
            errors = fp + fn  # ties (no evidence at all included): the fewest errors
            if best is None or (found.epsilon, -errors) > (
                best.epsilon,
                -(best.false_positives + best.false_negatives),
            ):
                best = found
    return best
