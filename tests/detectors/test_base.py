"""The detector contract of ``detectors.base`` (``SimulatedFitMixin``, ``MixtureDetector``,
``labelled_tensors``), on the smallest real detector: ``FedGMMDetector`` with two components
and a few EM iterations on 120 rows of two blobs held by three clients.

The references are computed here: the log-density from SciPy's normal densities of the fitted
``weights_``, ``means_`` and ``covariances_``; the threshold as NumPy's quantile of the
training scores; the outlier probabilities by PyOD's formulas written out.
"""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
import torch
from scipy.special import erf, logsumexp
from scipy.stats import multivariate_normal

from fednovelty import FedGMMDetector, JointFedGMMDetector
from fednovelty.detectors.base import MixtureDetector, SimulatedFitMixin, labelled_tensors
from fednovelty.detectors.options import Privacy
from fednovelty.exceptions import NotFittedError
from fednovelty.federated import FederatedEM

RNG = np.random.default_rng(0)
X = np.vstack([RNG.normal(0.0, 1.0, (60, 2)), RNG.normal(4.0, 1.0, (60, 2))])
GROUPS = np.tile(np.array(["c", "a", "b"]), 40)  # three clients, named out of order
X_NEW = np.vstack([RNG.normal(2.0, 3.0, (25, 2)), [[30.0, -30.0]]])


def small(**params) -> FedGMMDetector:
    return FedGMMDetector(2, max_iter=5, random_state=0, **params)


@pytest.fixture(scope="module")
def fitted() -> FedGMMDetector:
    """Fitted on ``X`` / ``GROUPS`` (shared; do not modify)."""
    return small().fit(X, groups=GROUPS)


def reference_log_density(detector, rows: np.ndarray) -> np.ndarray:
    """``log sum_k w_k N(x; mu_k, Sigma_k)`` by SciPy, from the fitted attributes."""
    parts = [
        np.log(w) + multivariate_normal(mean, cov).logpdf(rows)
        for w, mean, cov in zip(
            detector.weights_, detector.means_, detector.covariances_, strict=True
        )
    ]
    return logsumexp(parts, axis=0)


# ----------------------------------------------------------------------------- fit
def test_fit_returns_self_and_adds_only_fitted_attributes() -> None:
    detector = small()
    before = dict(vars(detector))
    params = detector.get_params()
    assert not [name for name in before if name.endswith("_")]  # __init__ stores arguments
    assert detector.fit(X, groups=GROUPS) is detector
    added = set(vars(detector)) - set(before)
    public = {name for name in added if not name.startswith("_")}
    assert public and all(name.endswith("_") for name in public), sorted(public)
    assert {"history_", "n_rounds_", "threshold_", "labels_", "decision_scores_"} <= public
    assert detector.get_params() == params  # fit changes no argument
    assert "_fit_callbacks" not in vars(detector)  # kept only while fit runs


def test_fit_splits_the_rows_by_groups_into_clients(fitted) -> None:
    np.testing.assert_array_equal(fitted.client_ids_, ["a", "b", "c"])
    assert fitted.n_clients_ == 3 and fitted.n_features_in_ == 2
    assert [record["round"] for record in fitted.history_] == list(range(1, fitted.n_rounds_ + 1))
    first = fitted.history_[0]
    assert first["n_sampled"] == first["n_replied"] == 3 and first["n_samples"] == len(X)
    assert fitted.bytes_up_ == sum(r["bytes_up"] for r in fitted.history_)
    assert fitted.bytes_down_ == sum(r["bytes_down"] for r in fitted.history_)
    alone = small().fit(X)  # no groups: one client
    assert alone.n_clients_ == 1 and alone.history_[0]["n_replied"] == 1


def test_the_fitted_mixture_attributes_describe_one_model(fitted) -> None:
    assert fitted.n_components_ == 2 == len(fitted.weights_)
    np.testing.assert_array_equal(fitted.weights_, fitted.model_.weights.numpy())
    np.testing.assert_array_equal(fitted.means_, fitted.model_.means.numpy())
    assert fitted.weights_.sum() == pytest.approx(1.0, abs=1e-12)
    for prec, cov in zip(fitted.precisions_cholesky_, fitted.covariances_, strict=True):
        np.testing.assert_allclose(np.linalg.inv(prec @ prec.T), cov, rtol=1e-10)


# ----------------------------------------------------------------------------- scores
def test_score_samples_is_the_mixtures_log_density_and_decision_function_its_negative(
    fitted,
) -> None:
    scores = fitted.score_samples(X_NEW)
    assert scores.dtype == np.float64 and scores.shape == (len(X_NEW),)
    np.testing.assert_allclose(scores, reference_log_density(fitted, X_NEW), rtol=1e-10)
    np.testing.assert_array_equal(fitted.decision_function(X_NEW), -scores)


@pytest.mark.parametrize("contamination", [0.05, 0.25])
def test_the_threshold_is_the_training_scores_quantile(contamination) -> None:
    detector = small(contamination=contamination).fit(X, groups=GROUPS)
    train = -reference_log_density(detector, X)
    np.testing.assert_allclose(detector.decision_scores_, train, rtol=1e-10)
    quantile = np.quantile(detector.decision_scores_, 1.0 - contamination)
    assert detector.threshold_ == pytest.approx(quantile, rel=1e-12)
    np.testing.assert_array_equal(
        detector.labels_, (detector.decision_scores_ > detector.threshold_).astype(int)
    )
    assert detector.labels_.sum() == round(contamination * len(X))


def test_predict_compares_the_score_with_the_threshold(fitted) -> None:
    scores = fitted.decision_function(X_NEW)
    np.testing.assert_array_equal(fitted.predict(X_NEW), (scores > fitted.threshold_).astype(int))
    assert fitted.predict(X_NEW)[-1] == 1  # the far row
    labels, confidence = fitted.predict(X_NEW, return_confidence=True)
    assert labels.shape == confidence.shape == (len(X_NEW),)


def test_predict_proba_scales_by_the_training_scores(fitted) -> None:
    scores, train = fitted.decision_function(X_NEW), fitted.decision_scores_
    linear = np.clip((scores - train.min()) / (train.max() - train.min()), 0.0, 1.0)
    np.testing.assert_allclose(fitted.predict_proba(X_NEW), np.c_[1 - linear, linear], rtol=1e-12)
    unify = np.clip(erf((scores - train.mean()) / (train.std() * np.sqrt(2.0))), 0.0, 1.0)
    np.testing.assert_allclose(fitted.predict_proba(X_NEW, method="unify")[:, 1], unify, rtol=1e-9)
    with pytest.raises(ValueError, match="method must be 'linear' or 'unify', got 'rank'"):
        fitted.predict_proba(X_NEW, method="rank")


# ----------------------------------------------------------------------------- checks
def test_scoring_before_fit_names_the_fit_to_call() -> None:
    message = r"This FedGMMDetector instance is not fitted yet; call fit\(X, groups=\.\.\.\)"
    for method in ("score_samples", "decision_function", "predict", "predict_proba"):
        with pytest.raises(NotFittedError, match=message):
            getattr(small(), method)(X_NEW)


def test_feature_names_are_kept_checked_and_dropped() -> None:
    frame = pd.DataFrame(X, columns=["u", "v"])
    detector = small().fit(frame, groups=GROUPS)
    np.testing.assert_array_equal(detector.feature_names_in_, ["u", "v"])
    np.testing.assert_allclose(
        detector.score_samples(frame), reference_log_density(detector, X), rtol=1e-10
    )
    with pytest.raises(ValueError, match=r"differ from those seen in fit: \['v', 'u'\] vs"):
        detector.score_samples(frame[["v", "u"]])
    detector.fit(X, groups=GROUPS)  # a refit on an array forgets the names
    assert not hasattr(detector, "feature_names_in_")


@pytest.mark.skipif(torch.cuda.is_available(), reason="refused only where torch sees no CUDA")
def test_a_cuda_device_without_cuda_is_refused_by_name() -> None:
    with pytest.raises(ValueError, match="device='cuda' was requested but torch sees no CUDA"):
        small(device="cuda").fit(X, groups=GROUPS)


def test_a_labelled_fit_without_labels_is_refused_by_name() -> None:
    with pytest.raises(ValueError, match=r"JointFedGMMDetector.fit requires y to be passed"):
        JointFedGMMDetector(2, max_iter=2).fit(X, groups=GROUPS)


def test_the_detector_classes_are_the_contracts_kinds() -> None:
    assert issubclass(FedGMMDetector, MixtureDetector)
    assert issubclass(MixtureDetector, SimulatedFitMixin)
    with pytest.raises(TypeError, match="abstract"):
        MixtureDetector()


# ----------------------------------------------------------------------------- the simulation
def test_simulate_numbers_rounds_after_the_offset_under_the_privacy_floor(fitted) -> None:
    """``_simulate`` runs an algorithm on the in-process engine: rounds numbered from
    ``round_offset + 1`` in ``history_`` and in the callbacks' records; every client holds to
    ``Privacy.min_rows`` (a client of 3 rows skips, by name)."""
    detector = small(privacy=Privacy(min_rows=5))
    seen = []
    detector._fit_callbacks = (seen.append,)
    rng = np.random.default_rng(1)
    clients = [torch.as_tensor(rng.normal(size=(n, 2))) for n in (20, 3, 30)]
    result = detector._simulate(
        FederatedEM(1, max_iter=2, random_state=0), clients, 0, full=True, round_offset=4
    )
    assert [r.round for r in seen] == [r["round"] for r in detector.history_]
    assert [r["round"] for r in detector.history_] == list(range(5, 5 + len(result.history)))
    assert detector.n_rounds_ == len(result.history)
    floor = "fewer rows than the client's privacy floor (min_rows=5)"
    assert all(record.skipped == ((1, floor),) for record in result.history)
    pooled = np.concatenate([clients[0].numpy(), clients[2].numpy()])
    np.testing.assert_allclose(result.state.params.means[0].numpy(), pooled.mean(0), rtol=1e-9)


# ----------------------------------------------------------------------------- labelled_tensors
def test_labelled_tensors_pairs_each_clients_rows_with_its_label_codes() -> None:
    rows = [torch.ones(3, 2, dtype=torch.float64), torch.zeros(2, 2, dtype=torch.float32)]
    codes = [np.array([0, 2, 1]), np.array([1, 1], dtype=np.int32)]
    pairs = labelled_tensors(rows, codes)
    assert len(pairs) == 2
    for (got_rows, got_codes), want_rows, want_codes in zip(pairs, rows, codes, strict=True):
        assert got_rows is want_rows
        assert isinstance(got_codes, torch.Tensor) and got_codes.device == want_rows.device
        np.testing.assert_array_equal(got_codes.numpy(), want_codes)
        assert got_codes.numpy().dtype == want_codes.dtype
    assert labelled_tensors([], []) == []
    with pytest.raises(ValueError, match="shorter"):
        labelled_tensors(rows, codes[:1])
