"""``LocalGMMDetector`` is not taken over by one client of identical rows.

Five clients hold 200 rows each of one 4-D Gaussian; a sixth holds 200 copies of the training
row farthest from the centre (a stuck sensor, a duplicated record). Its model is a narrow
spike there. Averaging the clients' log-densities (``combine="mean"``, the paper's baseline)
lets the spike's steep fall-off decide every score: AUROC drops from 1.0 to 0.83-0.89 (seeds
0-3). The density of the pooled rows under the client models (``combine="mixture"``, the
default) stays at 1.0.
"""

from __future__ import annotations

import json
import os

import numpy as np
import pytest
from safetensors import safe_open
from safetensors.torch import save_file
from scipy.special import logsumexp
from sklearn.metrics import roc_auc_score

from fednovelty import LocalGMMDetector, load
from fednovelty.detectors.persistence import _METADATA_KEY


def _task(seed: int, copies: int):
    rng = np.random.default_rng(seed)
    X = rng.normal(0, 1, (1000, 4))
    groups = np.repeat(["a", "b", "c", "d", "e"], 200)
    inliers = rng.normal(0, 1, (200, 4))
    novel = rng.normal(0, 1, (200, 4)) + 3.0 * rng.choice([-1, 1], (200, 4))
    if copies:
        far = X[np.argmax(np.linalg.norm(X, axis=1))]
        X = np.vstack([X, np.repeat(far[None], copies, 0)])
        groups = np.concatenate([groups, np.full(copies, "stuck")])
    return X, groups, np.vstack([inliers, novel]), np.r_[np.zeros(200), np.ones(200)]


def _auroc(detector, X_test, y_test) -> float:
    return roc_auc_score(y_test, detector.decision_function(X_test))


@pytest.mark.parametrize("seed", [0, 2])
def test_one_client_of_identical_rows_does_not_take_over(seed):
    X, groups, X_test, y_test = _task(seed, copies=0)
    for combine in ("mixture", "mean"):
        clean = LocalGMMDetector(k_range=(1, 3), combine=combine, random_state=0)
        assert _auroc(clean.fit(X, groups=groups), X_test, y_test) > 0.999
    X, groups, X_test, y_test = _task(seed, copies=200)
    with pytest.warns(UserWarning, match=r"client\(s\) \['stuck'\] hold copies of a single row"):
        mixture = LocalGMMDetector(k_range=(1, 3), random_state=0).fit(X, groups=groups)
    mean = LocalGMMDetector(k_range=(1, 3), combine="mean", random_state=0)
    with pytest.warns(UserWarning, match="'stuck'"):
        mean.fit(X, groups=groups)
    assert _auroc(mean, X_test, y_test) < 0.9  # the average of log-densities is taken over
    assert _auroc(mixture, X_test, y_test) > 0.999


def test_the_mixture_is_the_size_weighted_density_of_the_client_models():
    rng = np.random.default_rng(1)
    X = np.vstack([rng.normal(0, 1, (300, 2)), rng.normal(5, 1, (100, 2))])
    groups = np.repeat(["big", "small"], [300, 100])
    detector = LocalGMMDetector(k_range=(1, 2), random_state=0).fit(X, groups=groups)
    np.testing.assert_allclose(detector.client_shares_, [0.75, 0.25], rtol=1e-15)
    rows = rng.normal(2, 3, (50, 2))
    own = np.stack([detector.score_samples_client(rows, c) for c in ("big", "small")])
    expected = logsumexp(own + np.log([[0.75], [0.25]]), axis=0)
    np.testing.assert_allclose(detector.score_samples(rows), expected, rtol=1e-12)
    mean = detector.set_params(combine="mean").score_samples(rows)
    np.testing.assert_allclose(mean, own.mean(0), rtol=1e-12)


def test_combine_and_the_weights_survive_save_and_load(tmp_path):
    X, groups, X_test, _ = _task(0, copies=0)
    for combine in ("mixture", "mean"):
        detector = LocalGMMDetector(k_range=(1, 2), combine=combine, random_state=0)
        detector.fit(X, groups=groups).save(tmp_path / "local.safetensors")
        loaded = load(tmp_path / "local.safetensors")
        assert loaded.combine == combine
        np.testing.assert_array_equal(loaded.client_shares_, detector.client_shares_)
        np.testing.assert_allclose(
            loaded.score_samples(X_test), detector.score_samples(X_test), rtol=1e-12
        )


def test_a_file_saved_before_combine_loads_as_the_mean(tmp_path):
    """Older files (no ``combine`` setting, no client weights) were scored with the mean."""
    X, groups, X_test, _ = _task(0, copies=0)
    detector = LocalGMMDetector(k_range=(1, 2), combine="mean", random_state=0)
    path = tmp_path / "local.safetensors"
    detector.fit(X, groups=groups).save(path)
    with safe_open(os.fspath(path), framework="pt") as handle:
        tensors = {k: handle.get_tensor(k) for k in handle.keys() if k != "client_shares"}
        document = json.loads(handle.metadata()[_METADATA_KEY])
    del document["params"]["combine"]
    document["format_version"] = 1  # no checksum then
    save_file(tensors, os.fspath(path), metadata={_METADATA_KEY: json.dumps(document)})
    loaded = load(path)
    assert loaded.combine == "mean" and not hasattr(loaded, "client_shares_")
    np.testing.assert_allclose(
        loaded.score_samples(X_test), detector.score_samples(X_test), rtol=1e-12
    )
    with pytest.raises(ValueError, match="saved without its clients' sizes"):
        loaded.set_params(combine="mixture").score_samples(X_test)
