"""n_members (fednovelty.detectors._members) on FedMFADetector: every member is the fit a
single detector makes with the member's seed, the score is the mean of their
log-densities, the rounds and bytes are theirs in one sequence, and what the ensemble is
not (one mixture's density) is refused by name."""

from __future__ import annotations

import types

import numpy as np
import pytest

from fednovelty import FedMFADetector, load
from fednovelty.detectors import base
from fednovelty.detectors._members import fit_members, member_seed
from fednovelty.exceptions import ModelFormatError


def _rows(seed: int = 0):
    rng = np.random.default_rng(seed)
    W = rng.normal(size=(3, 10))
    X = np.vstack([rng.normal(size=(150, 3)) @ W, rng.normal(size=(150, 3)) @ W[::-1] + 3.0])
    X = X + 0.2 * rng.normal(size=X.shape)
    return X, np.repeat(np.arange(4), 75)


def _single(seed: int, X, groups):
    return FedMFADetector(n_components=3, n_factors=2, random_state=seed).fit(X, groups=groups)


def test_members_are_single_fits_and_the_score_is_their_mean_log_density(monkeypatch):
    """With the fit's seed taken as given (``seed_from`` the identity), member ``m`` is the
    single fit of ``random_state=member_seed(7, m)``."""
    monkeypatch.setattr(base, "seed_from", int)
    X, groups = _rows()
    det = FedMFADetector(n_components=3, n_factors=2, n_members=3, random_state=7)
    det.fit(X, groups=groups)
    singles = [_single(member_seed(7, m), X, groups) for m in range(3)]
    expected = np.mean([s.score_samples(X) for s in singles], axis=0)
    scale = np.abs(expected).max()
    np.testing.assert_allclose(det.score_samples(X), expected, rtol=1e-9, atol=1e-9 * scale)
    np.testing.assert_allclose(det.decision_function(X), -expected, rtol=1e-9, atol=1e-9 * scale)
    assert det.member_components_ == [3, 3, 3] and det.n_components_ == 9
    np.testing.assert_allclose(det.weights_, np.concatenate([s.weights_ for s in singles]) / 3)
    assert det.n_rounds_ == sum(s.n_rounds_ for s in singles)
    assert det.bytes_up_ == sum(s.bytes_up_ for s in singles)
    assert det.bytes_down_ == sum(s.bytes_down_ for s in singles)
    assert det.n_iter_ == sum(s.n_iter_ for s in singles)
    assert det.lower_bounds_ == [b for s in singles for b in s.lower_bounds_]


def test_one_member_is_the_family_fit_exactly():
    X, groups = _rows(1)
    plain = _single(3, X, groups)
    one = FedMFADetector(n_components=3, n_factors=2, n_members=1, random_state=3)
    one.fit(X, groups=groups)
    expected = plain.score_samples(X)
    np.testing.assert_allclose(
        one.score_samples(X), expected, rtol=1e-12, atol=1e-12 * np.abs(expected).max()
    )
    assert one.member_components_ == [3] and "member" not in one.history_[0]


def test_rounds_are_numbered_on_across_members_in_history_and_callbacks():
    X, groups = _rows(2)
    seen = []
    det = FedMFADetector(n_components=2, n_factors=2, n_members=2, random_state=0)
    det.fit(X, groups=groups, callbacks=[lambda record: seen.append(record.round)])
    rounds = [r["round"] for r in det.history_]
    assert rounds == list(range(1, det.n_rounds_ + 1)) == seen
    members = [r["member"] for r in det.history_]
    assert members == sorted(members) and set(members) == {0, 1}


def test_saved_and_loaded_ensemble_scores_the_same(tmp_path):
    X, groups = _rows(3)
    det = FedMFADetector(n_components=2, n_factors=2, n_members=2, random_state=0)
    det.fit(X, groups=groups)
    path = tmp_path / "members.safetensors"
    det.save(path)
    back = load(path)
    assert back.member_components_ == [2, 2] and back.n_members == 2
    np.testing.assert_array_equal(back.score_samples(X), det.score_samples(X))


def test_a_file_whose_member_counts_do_not_cover_the_model_is_refused(tmp_path, monkeypatch):
    X, groups = _rows(4)
    det = FedMFADetector(n_components=2, n_factors=2, n_members=2, random_state=0)
    det.fit(X, groups=groups)
    det.member_components_ = [2, 1]  # what a forged file would claim
    path = tmp_path / "forged.safetensors"
    det.save(path)
    with pytest.raises(ModelFormatError, match="member_components_ \\[2, 1\\] must be positive"):
        load(path)


def test_bic_and_sample_are_refused_naming_n_members():
    X, groups = _rows(5)
    det = FedMFADetector(n_components=2, n_factors=2, n_members=2, random_state=0)
    det.fit(X, groups=groups)
    for call in (lambda: det.bic(X), lambda: det.sample(3)):
        with pytest.raises(NotImplementedError, match="mean of its 2 members' log-densities"):
            call()


def test_n_members_below_one_is_refused_by_name():
    X, groups = _rows(6)
    with pytest.raises(ValueError, match="n_members"):
        FedMFADetector(n_members=0).fit(X, groups=groups)


def test_differential_privacy_with_members_is_refused(monkeypatch):
    """A family with a private fit would spend the budget once per member: refused."""
    det = FedMFADetector(n_components=2, n_factors=2, n_members=2, random_state=0)
    original = det._option

    def with_epsilon(name):
        values = original(name)
        return (
            types.SimpleNamespace(**{**vars(values), "epsilon": 1.0})
            if name == "privacy"
            else values
        )

    monkeypatch.setattr(det, "_option", with_epsilon)
    with pytest.raises(ValueError, match=r"n_members=2 with privacy\.epsilon"):
        fit_members(det, [], [], 0)  # refused before any round


def test_a_member_that_fails_leaves_the_fitted_detector_as_it_was(monkeypatch):
    X, groups = _rows(8)
    det = FedMFADetector(n_components=2, n_factors=2, n_members=1, random_state=0)
    det.fit(X, groups=groups)
    before = det.score_samples(X)
    calls = []
    original = FedMFADetector._fit_clients

    def fail_second(self, *args, **kwargs):
        calls.append(1)
        if len(calls) == 2:
            raise RuntimeError("member 1 failed")
        return original(self, *args, **kwargs)

    monkeypatch.setattr(FedMFADetector, "_fit_clients", fail_second)
    det.set_params(n_members=3)
    with pytest.raises(RuntimeError, match="member 1 failed"):
        det.fit(X, groups=groups)
    assert det.n_members == 3 and det.member_components_ == [2]
    assert "_member_rounds" not in det.__dict__
    np.testing.assert_array_equal(det.score_samples(X), before)


def test_the_per_component_api_shows_every_members_components():
    X, groups = _rows(9)
    det = FedMFADetector(n_components=2, n_factors=2, n_members=3, random_state=0)
    det.fit(X, groups=groups)
    weights = np.asarray(det.component_weights())
    assert weights.shape == (6,) and weights.sum() == pytest.approx(1.0)
    np.testing.assert_allclose(weights.reshape(3, 2).sum(1), 1 / 3)
    resp = np.asarray(det.responsibilities(X[:7]))
    assert resp.shape == (7, 6)
    np.testing.assert_allclose(resp.sum(1), 1.0)
    assert set(np.asarray(det.predict_components(X)).tolist()) <= set(range(6))
