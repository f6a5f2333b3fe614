"""FedEnsembleDetector: one member is FedGenGMMDetector, the score is the mean of the
members' standardised scores, the floor is named, bad arguments are refused by name, and a
saved detector scores as the fitted one."""

import warnings

import numpy as np
import pytest
from sklearn.base import clone

from fednovelty.detectors import FedGenGMMDetector, Privacy, load
from fednovelty.detectors.ensemble import FedEnsembleDetector
from fednovelty.exceptions import DataLossWarning

FAST = {"n_components": 2, "max_iter": 20, "samples_per_component": 30, "random_state": 3}


def rows(n_per_client=(60, 50, 40), seed=0):
    rng = np.random.default_rng(seed)
    X = np.concatenate(
        [rng.normal(size=(n, 4)) * [1.0, 2.0, 0.5, 3.0] + c for c, n in enumerate(n_per_client)]
    )
    groups = np.repeat(np.arange(len(n_per_client)), n_per_client)
    return X, groups


def test_one_member_is_fedgengmm():
    X, groups = rows()
    one = FedEnsembleDetector(**FAST, n_members=1, combine="mean").fit(X, groups=groups)
    reference = FedGenGMMDetector(**FAST).fit(X, groups=groups)
    np.testing.assert_allclose(one.decision_function(X), reference.decision_function(X), rtol=1e-12)
    assert one.n_rounds_ == 1 and one.subsets_ == [[0, 1, 2, 3]]


def test_the_score_is_the_mean_of_standardised_member_scores():
    X, groups = rows(seed=1)
    det = FedEnsembleDetector(**FAST, n_members=3).fit(X, groups=groups)
    members = det.member_scores(X)  # (3, n): -log p_m on each member's columns
    assert members.shape == (3, X.shape[0]) and det.n_rounds_ == 4
    np.testing.assert_allclose(det.score_mean_, members.mean(1), rtol=1e-10)
    np.testing.assert_allclose(det.score_std_, members.std(1), rtol=1e-8)
    expected = ((members - members.mean(1, keepdims=True)) / members.std(1, keepdims=True)).mean(0)
    np.testing.assert_allclose(det.decision_scores_, expected, rtol=1e-8, atol=1e-10)
    np.testing.assert_allclose(det.score_samples(X), -det.decision_function(X), rtol=0)
    assert det.labels_.sum() == int(np.ceil(0.1 * X.shape[0])) or det.labels_.mean() <= 0.11


def test_a_client_below_the_floor_is_named():
    X, groups = rows(n_per_client=(60, 50, 3), seed=2)
    with pytest.warns(DataLossWarning, match="client 2"):
        det = FedEnsembleDetector(**FAST, n_members=2, privacy=Privacy(min_rows=5)).fit(
            X, groups=groups
        )
    assert det.skipped_clients_ == [2]


@pytest.mark.parametrize(
    ("params", "named"),
    [
        ({"n_members": 0}, "n_members"),
        ({"feature_fraction": (0.0, 1.0)}, "feature_fraction"),
        ({"feature_fraction": (0.5, 1.5)}, "feature_fraction"),
        ({"combine": "max"}, "combine"),
        ({"privacy": Privacy(epsilon=1.0)}, "does not read privacy.epsilon"),
    ],
)
def test_bad_arguments_are_refused_by_name(params, named):
    X, groups = rows()
    with pytest.raises(ValueError, match=named):
        FedEnsembleDetector(**{**FAST, **params}).fit(X, groups=groups)


def test_get_params_clone_and_what_is_refused():
    det = FedEnsembleDetector(n_members=5, feature_fraction=(0.25, 0.75), combine="mean")
    params = det.get_params()
    assert (params["n_members"], params["feature_fraction"], params["combine"]) == (
        5,
        (0.25, 0.75),
        "mean",
    )
    twin = clone(det)
    assert twin.get_params() == params and not hasattr(twin, "members_")
    X, groups = rows()
    fitted = FedEnsembleDetector(**FAST, n_members=2).fit(X, groups=groups)
    with pytest.raises(TypeError, match="no one set of components"):
        fitted.responsibilities(X)
    with pytest.raises(NotImplementedError, match="ensemble"):
        fitted.sample(3)


def test_a_saved_ensemble_scores_as_the_fitted_one(tmp_path):
    X, groups = rows(seed=4)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        det = FedEnsembleDetector(**FAST, n_members=3).fit(X, groups=groups)
    det.save(tmp_path / "ensemble")
    back = load(tmp_path / "ensemble")
    assert isinstance(back, FedEnsembleDetector) and back.subsets_ == det.subsets_
    np.testing.assert_allclose(back.decision_function(X), det.decision_function(X), rtol=1e-12)
    assert back.threshold_ == det.threshold_
