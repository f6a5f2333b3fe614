"""``predict_proba`` survives infinite scores: a row so far out that its density underflows to 0
has ``decision_function`` = +inf; its anomaly probability is 1, never NaN (PyOD's min-max
scaler refuses the row, its ``unify`` gives NaN once a training score is infinite)."""

from __future__ import annotations

import numpy as np
import pytest
from pyod.models.base import BaseDetector

from fednovelty import FedGenGMMDetector, FedGMMDetector, LocalGMMDetector, load
from fednovelty.detectors._validation import largest_value

RNG = np.random.default_rng(0)
X = RNG.normal(0, 1, (200, 2))
GROUPS = np.repeat([0, 1], 100)


def far(dtype: str = "float64") -> np.ndarray:
    """Two rows just inside the largest values ``dtype`` accepts (their squared distances
    overflow), the centre and a row at (3, 3)."""
    top = 0.99 * largest_value(dtype)
    return np.array([[top, top], [top, -top], [0.0, 0.0], [3.0, 3.0]])


DETECTORS = {
    "FedGMM": lambda: FedGMMDetector(2, random_state=0),
    "FedGMM-float32": lambda: FedGMMDetector(2, dtype="float32", random_state=0),
    "FedGenGMM": lambda: FedGenGMMDetector(k_range=(1, 2), random_state=0),
    "Local": lambda: LocalGMMDetector(k_range=(1, 2), random_state=0),
}


@pytest.fixture(scope="module", params=list(DETECTORS))
def fitted(request):
    return DETECTORS[request.param]().fit(X, groups=GROUPS)


@pytest.mark.parametrize("method", ["linear", "unify"])
def test_an_infinite_score_has_probability_one(fitted, method):
    rows = far(fitted.dtype)
    scores = fitted.decision_function(rows)
    assert np.isposinf(scores[0])  # the row's density underflows to 0
    probs = fitted.predict_proba(rows, method=method)
    assert probs.shape == (4, 2) and not np.isnan(probs).any()
    np.testing.assert_array_equal(probs[:2, 1], [1.0, 1.0])  # copied constants
    assert probs[2, 1] < 0.5 < probs[3, 1]  # the centre is normal, (3, 3) is not
    np.testing.assert_allclose(probs.sum(1), 1.0, rtol=1e-12)
    probs, confidence = fitted.predict_proba(rows, method=method, return_confidence=True)
    assert not np.isnan(confidence).any() and ((confidence >= 0) & (confidence <= 1)).all()


@pytest.mark.parametrize("method", ["linear", "unify"])
def test_finite_scores_keep_pyods_probabilities(fitted, method):
    rows = RNG.normal(0, 2, (30, 2))
    ours = fitted.predict_proba(rows, method=method)
    pyods = BaseDetector.predict_proba(fitted, rows, method=method)
    np.testing.assert_allclose(ours, pyods, rtol=1e-12, atol=1e-15)


@pytest.mark.parametrize("method", ["linear", "unify"])
def test_infinite_training_scores_give_no_nan(tmp_path, method):
    """A model whose training scores include +inf (a training row far out in float32), saved
    and loaded: its range and moments are those of the finite training scores."""
    detector = FedGMMDetector(2, random_state=0).fit(X, groups=GROUPS)
    rows = RNG.normal(0, 2, (30, 2))
    expected = detector.predict_proba(rows, method=method)
    detector.decision_scores_ = np.append(detector.decision_scores_, np.inf)
    detector.save(tmp_path / "model.safetensors")
    loaded = load(tmp_path / "model.safetensors")
    assert np.isposinf(loaded.decision_scores_[-1])
    probs = loaded.predict_proba(far(), method=method)
    assert not np.isnan(probs).any()
    np.testing.assert_array_equal(probs[:2, 1], [1.0, 1.0])
    np.testing.assert_allclose(loaded.predict_proba(rows, method=method), expected, rtol=1e-12)


def test_an_unknown_method_is_named(fitted):
    with pytest.raises(ValueError, match="method must be 'linear' or 'unify'"):
        fitted.predict_proba(far(fitted.dtype), method="sigmoid")
