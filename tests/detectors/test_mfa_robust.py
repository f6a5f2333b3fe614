"""FedMFADetector's robust option: one lying client of ten, ``Robustness(aggregation=
"trimmed")``.

The task: nine honest clients hold rows of two factor-analyser components in 6 features;
the tenth (the liar) holds rows about a far point ``FAR``, where a third of the test's
novel rows are planted, and claims 1e10 times its rows (every sum over rows it sends,
the factor statistics ``xz``, ``sum_z``, ``zz`` and the start's sketch included, scaled
from its first reply on). With the plain sum its rows own the model and the planted rows
score as normal; with the trimmed combination (:mod:`fednovelty.federated.trust.robust`) the
AUROC stays within 0.02 of the fit without the liar's client.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from _liars import lying_client
from sklearn.metrics import roc_auc_score

from fednovelty.detectors import FedMFADetector
from fednovelty.detectors.options import Robustness
from fednovelty.federated.core.base import Message
from fednovelty.federated.trust.robust import cap_replies

N_CLIENTS, LIAR, ROWS, D = 10, 9, 100, 6
FAR = np.full(D, 10.0)
TOLERANCE = 0.02
CONSISTENT = {
    "lie": "claim_rows",
    "pick": 0,
    "factor": 1e10,
    "every_round": True,
    "first_round": 0,
    "seed": 0,
}


def task():
    """``(X_train, groups, X_test, y_test)``: novel rows are the positive class."""
    rng = np.random.default_rng(0)
    loadings = rng.normal(size=(2, 2, D))
    centres = np.array([np.zeros(D), np.r_[np.full(3, 4.0), np.zeros(D - 3)]])

    def inliers(n):
        which = rng.integers(0, 2, n)
        z = rng.normal(size=(n, 2))
        noise = 0.3 * rng.normal(size=(n, D))
        return centres[which] + np.einsum("nq,nqd->nd", z, loadings[which]) + noise

    X = [FAR + 0.5 * rng.normal(size=(ROWS, D)) if c == LIAR else inliers(ROWS) for c in range(10)]
    groups = np.repeat(np.arange(N_CLIENTS), ROWS)
    planted = FAR + 0.5 * rng.normal(size=(60, D))
    X_test = np.r_[inliers(300), planted, rng.uniform(-10, 14, size=(60, D))]
    return np.concatenate(X), groups, X_test, np.r_[np.zeros(300), np.ones(120)]


TASK = task()


def _auroc(detector) -> float:
    _, _, X_test, y_test = TASK
    return float(roc_auc_score(y_test, detector.decision_function(X_test)))


def _detector(**settings) -> FedMFADetector:
    return FedMFADetector(n_components=2, n_factors=2, max_iter=10, random_state=0, **settings)


def _fit(attacked: bool, **settings) -> float:
    X, groups, _, _ = TASK
    if not attacked:
        keep = groups != LIAR
        return _auroc(_detector(**settings).fit(X[keep], groups=groups[keep]))
    with lying_client(LIAR, CONSISTENT):
        return _auroc(_detector(**settings).fit(X, groups=groups))


TRIMMED = {"robustness": Robustness(aggregation="trimmed", trim=0.2)}


def test_trimmed_aggregation_keeps_the_auroc_of_the_fit_without_the_liar() -> None:
    liar_free = _fit(False, **TRIMMED)
    attacked = _fit(True, **TRIMMED)
    assert liar_free > 0.95
    assert abs(attacked - liar_free) <= TOLERANCE, (attacked, liar_free)


def test_without_the_robust_option_the_liar_wins() -> None:
    """The task can fail: with the plain sum the liar's region scores as normal."""
    attacked = _fit(True)
    assert attacked < _fit(False) - 0.3, attacked


def test_median_is_refused_by_name() -> None:
    X, groups, _, _ = TASK
    with pytest.raises(ValueError, match="'sum', 'trimmed'"):
        _detector(robustness=Robustness(aggregation="median")).fit(X, groups=groups)


def test_the_cap_scales_every_sum_over_rows_of_a_factor_reply() -> None:
    """A capped client's factor statistics stay one data set's: ``xz``, ``sum_z``, ``zz``
    (and the start's ``sketch``) are sums over rows too, scaled with the counts."""

    def reply(n: float) -> Message:
        ones = {
            name: torch.ones(shape, dtype=torch.float64)
            for name, shape in {
                "counts": (2,),
                "sums": (2, 3),
                "second": (2, 3),
                "xz": (2, 3, 1),
                "sum_z": (2, 1),
                "zz": (2, 1, 1),
                "sketch": (2, 3, 2),
                "log_likelihood": (),
            }.items()
        }
        return Message("factor_em", {**ones, "n_samples": torch.tensor(n, dtype=torch.float64)})

    capped = cap_replies({0: reply(10.0), 1: reply(10.0), 2: reply(10.0), 3: reply(1e6)}, 2.0)
    for name, value in capped[3].tensors.items():
        assert torch.allclose(value, reply(1e6).tensors[name] * 20.0 / 1e6), name
