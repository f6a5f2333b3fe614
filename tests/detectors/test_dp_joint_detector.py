"""``JointFedGMMDetector`` under ``Privacy.epsilon``: the budget split between the statistics and
the learners' DP-SGD, what the fit reports against an accountant run here, and the
refusals."""

from __future__ import annotations

import dp_accounting
import numpy as np
import pytest
from dp_accounting.pld import pld_privacy_accountant

from fednovelty import JointFedGMMDetector
from fednovelty.detectors.options import Initialisation, Privacy, Training

BOUNDS = ([-4.0] * 3, [4.0] * 3)


@pytest.fixture(scope="module")
def task():
    rng = np.random.default_rng(0)
    side = rng.integers(0, 2, 2400)
    X = rng.normal(0, 0.5, (2400, 3)) + np.array([[-1.5, 0, 0], [1.5, 0, 0]])[side]
    y = (X[:, 1] > 0).astype(int)
    return X, y, np.repeat(np.arange(4), 600)


def _fit(task, **params):
    X, y, groups = task
    options = dict(
        n_learners=2,
        max_iter=4,
        training=Training(local_epochs=1),
        initialisation=Initialisation(kmeans_rounds=2),
        random_state=0,
    )
    return JointFedGMMDetector(2, **{**options, **params}).fit(X, y, groups)


def test_the_fit_spends_its_budget_on_statistics_and_dp_sgd_together(task):
    det = _fit(task, privacy=Privacy(epsilon=2.0, bounds=BOUNDS, sample_rate=0.1))
    spent = det.privacy_spent_
    rounds = [r["kind"] for r in det.history_]
    assert spent["sgd_steps"] == rounds.count("joint_em") * 10  # ceil(1 / 0.1) a round
    assert spent["releases"] == len(rounds)  # every round is a release here
    # the accountant, run here on the composition the fit reports
    stats = dp_accounting.GaussianDpEvent(
        spent["noise_multiplier"] / np.sqrt(3 * spent["releases"] + rounds.count("joint_em") / 64)
    )
    step = dp_accounting.PoissonSampledDpEvent(
        0.1, dp_accounting.GaussianDpEvent(spent["sgd_noise_multiplier"])
    )
    accountant = pld_privacy_accountant.PLDAccountant(value_discretization_interval=1e-4)
    accountant.compose(
        dp_accounting.ComposedDpEvent(
            [stats, dp_accounting.SelfComposedDpEvent(step, spent["sgd_steps"])]
        )
    )
    epsilon = accountant.get_epsilon(1e-5)
    # the rounds spend the budget less the threshold's share (basic composition adds it)
    assert 1.8 < epsilon <= 2.0 - spent["threshold_epsilon"]
    assert abs(spent["epsilon"] - spent["threshold_epsilon"] - epsilon) <= 1e-6 * epsilon
    assert spent["epsilon_against_server"] == np.inf  # central: exact statistics
    X, y, _ = task
    assert (det.predict_y(X) == y).mean() > 0.85


def test_a_larger_learner_share_buys_less_gradient_noise(task):
    few = _fit(task, privacy=Privacy(epsilon=2.0, bounds=BOUNDS, learner_share=0.2))
    many = _fit(task, privacy=Privacy(epsilon=2.0, bounds=BOUNDS, learner_share=0.8))
    assert many.privacy_spent_["sgd_noise_multiplier"] < few.privacy_spent_["sgd_noise_multiplier"]
    assert many.privacy_spent_["noise_multiplier"] > few.privacy_spent_["noise_multiplier"]


def test_private_joint_fits_refuse_what_they_cannot_account_for(task):
    X, y, groups = task
    det = _fit(task, privacy=Privacy(epsilon=1.0, bounds=BOUNDS))
    with pytest.raises(ValueError, match=r"partial_fit under privacy\.epsilon"):
        det.partial_fit(X[:100], y[:100], groups[:100])
    local = _fit(task, aggregate_learners=False, privacy=Privacy(epsilon=1.0, bounds=BOUNDS))
    assert "sgd_steps" not in local.privacy_spent_  # the learners never leave the clients
