"""The README's default (registry ``DEM-kmeans``: ``FedGMMDetector(mixture_weights="global")``,
k-FED start) on a set whose clients cannot back K under their privacy floors: it fits fewer
components, says so with a ``FewerComponentsWarning`` naming the numbers, records the fitted K
in ``n_components_``, and scores every row; a set large enough keeps K with no warning; the
warning as an error refuses the fit (exactly K or nothing)."""

from __future__ import annotations

import warnings

import numpy as np
import pytest
from sklearn.exceptions import NotFittedError

from fednovelty import FedMFADetector
from fednovelty.exceptions import DataLossWarning, FewerComponentsWarning
from fednovelty.methods import get_method

pytestmark = pytest.mark.filterwarnings("ignore::sklearn.exceptions.ConvergenceWarning")


def default_detector(k: int = 10):
    return get_method("DEM-kmeans").build(n_components=k, random_state=0)


def hepatitis_size() -> tuple[np.ndarray, np.ndarray]:
    """ADBench Hepatitis' size (80 rows, 19 features) over 10 clients: nine of 4 rows (under
    the floor of 5: no centroid) and one of 44 rows in eight well-separated groups of 5 or 6
    (44 // 5 = 8 clusters, each above the floor: 8 centroids)."""
    rng = np.random.default_rng(0)
    centres = 20.0 * rng.choice([-1.0, 1.0], (8, 19))  # apart in every feature
    small = np.vstack([centres[i % 8] + rng.normal(size=(4, 19)) for i in range(9)])
    large = np.vstack([c + rng.normal(size=(5 + i % 2, 19)) for i, c in enumerate(centres)])
    groups = np.r_[np.repeat(np.arange(9), 4), np.full(44, 9)]
    return np.vstack([small, large]), groups


def fit_caught(detector, X, groups) -> list[warnings.WarningMessage]:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        detector.fit(X, groups=groups)
    return list(caught)


def fewer(caught) -> list[str]:
    return [str(w.message) for w in caught if w.category is FewerComponentsWarning]


def test_a_hepatitis_size_set_fits_fewer_components_and_says_how_many_and_why():
    """8 centroids for K = 10: half as many centres, (8 + 1) // 2 = 4 components."""
    X, groups = hepatitis_size()
    detector = default_detector()
    messages = fewer(fit_caught(detector, X, groups))
    assert len(messages) == 1, messages
    assert detector.n_components_ == 4 == detector.weights_.shape[0] == detector.means_.shape[0]
    message = messages[0]
    for part in (
        "FedGMMDetector.fit: fitted 4 components where n_components=10 asked",
        "n_components_ = 4",
        "the 10 clients' 80 rows could not back 10",
        "min_rows=5",
        "they sent 8 centroids in all, fewer than the 10 centres asked",
        "Pass n_components=4",
        'simplefilter("error", FewerComponentsWarning)',
    ):
        assert part in message, (part, message)
    assert np.isfinite(detector.decision_function(X)).all()
    assert np.isfinite(detector.score_samples(X)).all()
    assert abs(detector.weights_.sum() - 1.0) < 1e-12


def test_a_lloyd_round_no_client_backs_is_named_with_the_merge():
    """Ten clients of 8 rows send one centroid each: 10 centres are seeded, a Lloyd round
    backs none of them for every client, and the server merges them into 5."""
    rng = np.random.default_rng(0)
    X, groups = rng.normal(size=(80, 4)), np.arange(80) % 10
    detector = default_detector()
    messages = fewer(fit_caught(detector, X, groups))
    assert detector.n_components_ == 5
    assert len(messages) == 1
    assert "they sent 10 centroids in all" in messages[0]
    assert "fewer than the" not in messages[0]  # 10 centroids were enough to seed K
    assert "the 10 centres merged them into 5" in messages[0]
    assert np.isfinite(detector.decision_function(X)).all()


def test_a_set_large_enough_keeps_k_exactly_with_no_warning():
    rng = np.random.default_rng(0)
    centres = rng.normal(0, 10, (10, 5))
    X = np.vstack([c + rng.normal(size=(60, 5)) for c in centres])
    groups = np.arange(600) % 10
    detector = default_detector()
    caught = fit_caught(detector, X, groups)
    assert detector.n_components_ == 10 == detector.weights_.shape[0]
    assert not fewer(caught)
    assert not [w for w in caught if issubclass(w.category, DataLossWarning)]


def test_exactly_k_or_an_error_with_the_warning_as_an_error():
    """The opt-out: the warning as an error refuses the fit, and the detector stays unfitted
    (no smaller model is left behind)."""
    X, groups = hepatitis_size()
    detector = default_detector()
    with warnings.catch_warnings():
        warnings.simplefilter("error", FewerComponentsWarning)
        with pytest.raises(FewerComponentsWarning, match="fitted 4 components where n_comp"):
            detector.fit(X, groups=groups)
    assert not hasattr(detector, "n_components_")
    with pytest.raises(NotFittedError):
        detector.decision_function(X)


def test_the_category_is_a_data_loss_warning():
    """One filter on DataLossWarning still covers it; its own filter covers it alone."""
    assert issubclass(FewerComponentsWarning, DataLossWarning)
    X, groups = hepatitis_size()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        warnings.simplefilter("ignore", DataLossWarning)
        default_detector().fit(X, groups=groups)
    assert not [w for w in caught if issubclass(w.category, DataLossWarning)]


@pytest.mark.parametrize("n_members", [1, 2])
def test_mixtures_of_factor_analysers_fit_fewer_components_too(n_members):
    """FedMFA's k-FED start takes K as an upper bound as federated EM's does; with random
    starts the warning names each member's count."""
    X, groups = hepatitis_size()
    detector = FedMFADetector(n_components=10, n_members=n_members, random_state=0)
    messages = fewer(fit_caught(detector, X, groups))
    assert len(messages) == 1, messages
    assert "FedMFADetector.fit: fitted" in messages[0] and "n_components=10 asked" in messages[0]
    assert len(detector.member_components_) == n_members
    assert max(detector.member_components_) < 10
    assert sum(detector.member_components_) == detector.n_components_
    if n_members > 1:
        assert f"member_components_ = {detector.member_components_}" in messages[0]
    assert np.isfinite(detector.decision_function(X)).all()
