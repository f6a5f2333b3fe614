"""VGM2Classifier's differential privacy: the plan's noise against dp-accounting's own
composition of the round's events (the noisy row count's Gaussian and the Poisson-sampled
DP-SGD steps), ``privacy_spent_`` from the rounds that ran, and a private fit through the
client gate. The refusal of the prototype baseline and what every private estimator owes
(budget, fresh noise, saving) are in ``test_privacy_contract.py``."""

from __future__ import annotations

import math

import dp_accounting
import numpy as np
import pytest
from dp_accounting.pld import pld_privacy_accountant

from fednovelty.detectors._vgm2_privacy import vgm2_dp_plan
from fednovelty.detectors.options import Privacy, Training
from fednovelty.detectors.vgm2 import VGM2Classifier


def _epsilon_by_hand(z: float, sigma: float, rate: float, rounds: int, steps: int) -> float:
    """Each round: the row count with noise 8 z (sensitivity 1) and ``steps``
    Poisson-sampled Gaussian steps; composed in dp-accounting's PLD accountant."""
    count = dp_accounting.GaussianDpEvent(8 * z)
    step = dp_accounting.PoissonSampledDpEvent(rate, dp_accounting.GaussianDpEvent(sigma))
    events = [dp_accounting.SelfComposedDpEvent(count, rounds)]
    events.append(dp_accounting.SelfComposedDpEvent(step, rounds * steps))
    accountant = pld_privacy_accountant.PLDAccountant(value_discretization_interval=1e-4)
    accountant.compose(dp_accounting.ComposedDpEvent(events))
    return accountant.get_epsilon(1e-5)


def test_the_plan_spends_its_budget_by_dp_accounting() -> None:
    plan = vgm2_dp_plan(1.0, 1e-5, "local", 4, 20, 0.1, 1.0, 0.9, 3)
    z, sigma = plan.policy.noise_multiplier, plan.sgd.noise_multiplier
    spent = _epsilon_by_hand(z, sigma, 0.1, 4, 20)
    assert 0.97 <= spent <= 1.0 + 1e-6
    assert (plan.sgd.steps, plan.sgd.sample_rate, plan.sgd.clip_norm) == (20, 0.1, 1.0)
    assert plan.releases == 4 and plan.policy.mode == "local"
    assert (plan.policy.epsilon, plan.policy.delta) == (1.0, 1e-5)  # the client's own budget
    # the learners' share of mu^2 (Gaussian DP) is 0.9: the count's noise is the larger
    assert (8 * z) ** -2 * 4 < 0.2 * _gdp_mu(1.0) ** 2
    with pytest.raises(ValueError, match="rounds >= 1"):
        vgm2_dp_plan(1.0, 1e-5, "local", 0, 20, 0.1, 1.0, 0.9, 3)


def test_a_plan_without_dp_sgd_spends_the_whole_budget_on_the_counts() -> None:
    """Local's networks never leave the clients: 4 noisy row counts (one-bin histograms,
    noise ``8 z``) are all a fit releases, one Gaussian mechanism of ``mu = sqrt(4) / (8 z)``
    in Gaussian DP, which must be the budget's ``mu``."""
    plan = vgm2_dp_plan(1.0, 1e-5, "local", 4, 0, 0.1, 1.0, 0.9, 3)
    assert plan.sgd is None
    mu = math.sqrt(4) / (8 * plan.policy.noise_multiplier)
    assert mu == pytest.approx(_gdp_mu(1.0), rel=1e-3)


def _gdp_mu(epsilon: float, delta: float = 1e-5) -> float:
    """The mu of Gaussian DP whose (epsilon, delta) curve passes through the budget."""
    from scipy.optimize import brentq
    from scipy.stats import norm

    def gap(mu):
        return (
            norm.cdf(-epsilon / mu + mu / 2) - math.exp(epsilon) * norm.cdf(-epsilon / mu - mu / 2)
        ) - delta

    return brentq(gap, 1e-3, 20)


def test_privacy_spent_counts_the_rounds_that_ran() -> None:
    clf = VGM2Classifier(
        rounds=5, privacy=Privacy(epsilon=2.0, sample_rate=0.2), training=Training(local_epochs=1)
    )
    clf.n_clients_ = 3
    plan = clf._dp_plan()
    clf.history_ = [{"kind": "vgm2"}] * 3 + [{"kind": "vgm2", "failed": True}]
    clf._set_privacy_spent(plan)
    record = clf.privacy_spent_
    expected = _epsilon_by_hand(
        plan.policy.noise_multiplier, plan.sgd.noise_multiplier, 0.2, 3, plan.sgd.steps
    )
    assert record["epsilon"] == pytest.approx(expected, rel=2e-3)
    assert record["epsilon"] < record["epsilon_budget"] == 2.0
    assert record["sgd_steps"] == 3 * plan.sgd.steps == 3 * 5  # ceil(1 / 0.2) per round
    assert record["planned_releases"] == 5 and record["mode"] == "central"
    clf.set_params(privacy__epsilon=None)
    clf._set_privacy_spent(clf._dp_plan())
    assert not hasattr(clf, "privacy_spent_")


def test_a_private_fit_runs_through_the_gate_and_reports_what_it_spent() -> None:
    rng = np.random.default_rng(0)
    y = np.repeat([0, 1, 2, 3], 15)
    X = rng.normal(0, 0.3, (60, 5)) + np.eye(5)[y] * 3
    groups = np.repeat([0, 1], 30)
    clf = VGM2Classifier(
        rounds=2,
        hidden=8,
        embedding_dim=3,
        clients_per_round=2,
        random_state=0,
        privacy=Privacy(epsilon=1.0, mode="local", sample_rate=0.5),
        training=Training(local_epochs=1),
    ).fit(X, y, groups)
    assert [r["n_invalid"] for r in clf.history_] == [0, 0]
    assert all(r["n_replied"] == 2 for r in clf.history_)
    record = clf.privacy_spent_
    expected = _epsilon_by_hand(  # 2 rounds of ceil(1 / 0.5) = 2 steps
        record["noise_multiplier"], record["sgd_noise_multiplier"], 0.5, 2, 2
    )
    assert record["epsilon"] == pytest.approx(expected, rel=2e-3)
    assert 0.9 < record["epsilon"] <= 1.0 + 1e-6 and record["sgd_steps"] == 2 * 2
    assert np.isfinite(clf.markers_).all()
    assert clf.predict_y(X[:30], client=0).shape == (30,)
