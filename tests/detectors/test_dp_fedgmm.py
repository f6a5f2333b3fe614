"""FedGMMDetector under differential privacy: the budget it spends (read from dp-accounting,
checked here against the closed form of composed Gaussian mechanisms), what it refuses, what
it saves, and what the noise costs on a task where the non-private detector is near perfect.
What every private estimator owes (fresh noise, privacy_spent_ saved and dropped, the
refusal of init_params='subset' and of the PCA front end) is in
``test_privacy_contract.py``."""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy.stats import norm
from sklearn.metrics import roc_auc_score

from fednovelty import FedGMMDetector
from fednovelty.detectors.options import ClientSampling, Initialisation, Prior, Privacy, Robustness
from fednovelty.federated.trust.dp_split import BLOCK_SPLIT

D = 4
BOUNDS = (np.full(D, -8.0), np.full(D, 10.0))


@pytest.fixture(scope="module")
def task():
    rng = np.random.default_rng(0)
    X = np.vstack([rng.normal(0, 1, (6000, D)), rng.normal(4, 1, (6000, D))])
    groups = rng.integers(0, 6, len(X))
    inliers = np.vstack([rng.normal(0, 1, (300, D)), rng.normal(4, 1, (300, D))])
    novel = rng.uniform(-5, 9, (300, D))
    return X, groups, np.vstack([inliers, novel]), np.r_[np.zeros(600), np.ones(300)]


def _fit(task, **settings):
    X, groups, _, _ = task
    options = {
        "max_iter": 8,
        "initialisation": Initialisation(kmeans_rounds=2),
        "mixture_weights": "global",
        "random_state": 0,
    }
    return FedGMMDetector(2, **{**options, **settings}).fit(X, groups=groups)


def _gdp_delta(epsilon: float, mu: float) -> float:
    """delta(epsilon) of a mu-GDP mechanism (Dong, Roth and Su, Corollary 2.13)."""
    return norm.cdf(-epsilon / mu + mu / 2) - math.exp(epsilon) * norm.cdf(-epsilon / mu - mu / 2)


def test_the_fit_spends_its_budget_and_no_more(task):
    det = _fit(task, privacy=Privacy(epsilon=1.0, bounds=BOUNDS))
    spent = det.privacy_spent_
    assert spent["releases"] == spent["planned_releases"] == 1 + 2 + 8  # moments, Lloyd, EM
    assert spent["epsilon"] <= 1.0 and spent["epsilon"] > 0.99
    # independently: the fit is a composition of 3 * releases Gaussian mechanisms of
    # multiplier z (the block split keeps that), i.e. mu-GDP with mu = sqrt(3 r) / z
    mu = math.sqrt(3 * spent["releases"]) / spent["noise_multiplier"]
    rounds = spent["epsilon"] - spent["threshold_epsilon"]  # the threshold's share apart
    assert _gdp_delta(rounds, mu) == pytest.approx(1e-5, rel=0.05)
    assert sum(1 / share**2 for share in BLOCK_SPLIT.values()) == pytest.approx(3, rel=1e-12)
    assert spent["mode"] == "central" and spent["clip"] == pytest.approx(1.5 * math.sqrt(D))
    assert det.lower_bounds_ == []  # the clients withhold their log-likelihoods
    assert det.n_iter_ == 8


@pytest.mark.filterwarnings("ignore:Federated EM did not converge")
def test_the_noise_costs_little_on_a_large_federation(task):
    _, _, X_test, y_test = task
    plain = _fit(task, tol=0.0)
    private = _fit(task, privacy=Privacy(epsilon=1.0, bounds=BOUNDS))
    local = _fit(task, privacy=Privacy(epsilon=1.0, bounds=BOUNDS, mode="local"))
    reference = roc_auc_score(y_test, plain.decision_function(X_test))
    for det in (private, local):
        assert roc_auc_score(y_test, det.decision_function(X_test)) > reference - 0.01
    assert not np.allclose(private.means_, plain.means_, rtol=1e-6)  # the noise is there


def test_more_rounds_buy_more_noise_per_round(task):
    few = _fit(task, max_iter=4, privacy=Privacy(epsilon=2.0, bounds=BOUNDS))
    many = _fit(task, max_iter=16, privacy=Privacy(epsilon=2.0, bounds=BOUNDS))
    ratio = many.privacy_spent_["noise_multiplier"] / few.privacy_spent_["noise_multiplier"]
    assert ratio == pytest.approx(math.sqrt((1 + 2 + 16) / (1 + 2 + 4)), rel=0.02)


@pytest.mark.parametrize(
    ("settings", "match"),
    [
        ({"bounds": (np.zeros(D), np.ones(D + 1))}, "shape \\(2, 4\\)"),
        ({"bounds": (np.ones(D), np.zeros(D))}, "low < high"),
        (
            {
                "bounds": BOUNDS,
                "mode": "distributed",
                "robustness": Robustness(aggregation="trimmed"),
            },
            'aggregation="sum"',
        ),
    ],
)
def test_settings_without_a_private_form_are_refused_before_any_round(task, settings, match):
    fields = {k: settings.pop(k) for k in ("bounds", "mode") if k in settings}
    det = FedGMMDetector(2, **settings, privacy=Privacy(epsilon=1.0, **fields))
    with pytest.raises(ValueError, match=match):
        det.fit(task[0], groups=task[1])
    assert not hasattr(det, "history_")


def test_auto_clipping_is_the_box_radius_without_standardisation(task):
    """In the bounds' units every row inside the box has norm at most sqrt(d): "auto" clips
    nothing of it there; in z-scores it is 1.5 sqrt(d)."""
    boxed = _fit(
        task,
        max_iter=2,
        prior=Prior(standardize=False),
        privacy=Privacy(epsilon=4.0, bounds=BOUNDS),
    )
    assert boxed.privacy_spent_["clip"] == pytest.approx(math.sqrt(D))
    assert boxed.privacy_spent_["releases"] == 1 + 2 + 2  # the prior's moments round stays


def test_distributed_mode_reports_the_epsilon_its_sums_achieved(task):
    """Each client adds z / sqrt(m): with half the clients asked each round a sum carries
    z / sqrt(2), so the fit spends more than its budget, and privacy_spent_ says so (before,
    it reported the planned epsilon whatever the sums held)."""
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # distributed without a secure sum: named warning
        full = _fit(task, privacy=Privacy(epsilon=1.0, bounds=BOUNDS, mode="distributed"))
        half = _fit(
            task,
            sampling=ClientSampling(fraction=0.5),
            privacy=Privacy(epsilon=1.0, bounds=BOUNDS, mode="distributed"),
        )
    clients = full.privacy_spent_["n_clients"]
    assert full.privacy_spent_["min_senders"] == clients
    assert full.privacy_spent_["epsilon"] <= 1.0
    assert half.privacy_spent_["min_senders"] == clients // 2
    # every round's sum held half the noise variance: mu^2 doubles
    mu = math.sqrt(2 * (1 + 2 + 8) * 3) / half.privacy_spent_["noise_multiplier"]
    spent = half.privacy_spent_
    assert spent["epsilon"] > 1.0
    assert _gdp_delta(spent["epsilon"] - spent["threshold_epsilon"], mu) == pytest.approx(
        1e-5, rel=0.05
    )


def test_a_private_model_leaves_no_exact_training_value(task, tmp_path):
    """The threshold is the exponential mechanism's quantile on the public grid (charged:
    threshold_epsilon of the budget), the file keeps no per-row score (before: one exact
    score per training row and the exact quantile), and a loaded private model predicts by
    the private threshold and names why it cannot give predict_proba."""
    from fednovelty.detectors import FedGMMDetector
    from fednovelty.detectors._dp import THRESHOLD_SHARE
    from fednovelty.federated.trust.dp_quantile import score_grid

    det = _fit(task, privacy=Privacy(epsilon=1.0, bounds=BOUNDS))
    spent = det.privacy_spent_
    assert spent["threshold_epsilon"] == pytest.approx(THRESHOLD_SHARE)
    assert spent["epsilon"] <= 1.0 + 1e-9
    grid = score_grid(-det._log_density_bound())
    assert np.isclose(grid, det.threshold_, rtol=0, atol=1e-9 * abs(det.threshold_)).any()
    exact = np.quantile(det.decision_scores_, 1 - det.contamination)
    assert abs(np.mean(det.decision_scores_ <= det.threshold_) - (1 - det.contamination)) < 0.1
    assert det.threshold_ != exact
    det.save(tmp_path / "m")
    loaded = FedGMMDetector.load(tmp_path / "m")
    assert not hasattr(loaded, "decision_scores_") and loaded.threshold_ == det.threshold_
    X = task[0][:50]
    np.testing.assert_array_equal(loaded.predict(X), det.predict(X))
    with pytest.raises(ValueError, match="keeps no training scores"):
        loaded.predict_proba(X)


def test_delta_above_one_over_the_rows_is_named(task):
    from fednovelty.detectors._dp import DeltaAboveRowsWarning

    with pytest.warns(DeltaAboveRowsWarning, match=r"privacy\.delta=0.01 is above 1/n"):
        _fit(task, privacy=Privacy(epsilon=1.0, bounds=BOUNDS, delta=1e-2))
