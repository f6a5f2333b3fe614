"""``fit(..., callbacks=[...])``: one ``RoundRecord`` per communication round, as it completes.

Every path that runs rounds is covered (plain EM with each initialisation, the joint model
``JointFedGMMDetector`` and its Local baseline, federated PCA, FedGenGMM, LocalGMM); the
records must be ``history_`` itself (rounds ``1..n_rounds_``, same bytes), and the callables
must not outlive ``fit``.
"""

from __future__ import annotations

import warnings

import numpy as np
import pytest
from sklearn.base import clone

import fednovelty
from fednovelty import FedGenGMMDetector, FedGMMDetector, JointFedGMMDetector, LocalGMMDetector
from fednovelty.detectors.options import Initialisation, Training
from fednovelty.runtime import RoundRecord

CENTERS = np.array([[-5.0, 0.0, 0.0], [5.0, 0.0, 1.0], [0.0, 6.0, -1.0]])


def make_data(seed: int = 0):
    """150 rows of three blobs in 3-D, three clients, labels = blob."""
    rng = np.random.default_rng(seed)
    X = np.concatenate([c + rng.normal(size=(50, 3)) for c in CENTERS])
    y = np.repeat([0, 1, 2], 50)
    groups = np.tile(np.arange(3), 50)
    return X, y, groups


X, Y, GROUPS = make_data()
SMALL = {"max_iter": 5, "initialisation": Initialisation(kmeans_rounds=3), "random_state": 0}
ONE_EPOCH = Training(local_epochs=1)
CASES = {
    "fedgmm": (FedGMMDetector, {"n_components": 3, **SMALL}, False),
    "dem-separated": (
        FedGMMDetector,
        {"n_components": 3, "mixture_weights": "global", "init_params": "separated", **SMALL},
        False,
    ),
    "dem-subset": (
        FedGMMDetector,
        {"n_components": 3, "mixture_weights": "global", "init_params": "subset", **SMALL},
        False,
    ),
    "pca": (FedGMMDetector, {"n_components": 2, "pca_components": 2, **SMALL}, False),
    "joint": (JointFedGMMDetector, {"n_components": 2, "training": ONE_EPOCH, **SMALL}, True),
    "joint-pca": (
        JointFedGMMDetector,
        {"n_components": 2, "training": ONE_EPOCH, "pca_components": 2, **SMALL},
        True,
    ),
    "local-learners": (
        JointFedGMMDetector,
        {
            "n_components": 1,
            "n_learners": 1,
            "aggregate_learners": False,
            "training": ONE_EPOCH,
            **SMALL,
        },
        True,
    ),
    "fedgengmm": (
        FedGenGMMDetector,
        {"n_components": 3, "client_components": 2, "samples_per_component": 20, "random_state": 0},
        False,
    ),
    "localgmm": (LocalGMMDetector, {"client_components": 2, "random_state": 0}, False),
}


def fit(case: str, **fit_kwargs):
    cls, params, labelled = CASES[case]
    detector = cls(**params)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # ConvergenceWarning of the short runs
        if labelled:
            return detector.fit(X, Y, groups=GROUPS, **fit_kwargs)
        return detector.fit(X, groups=GROUPS, **fit_kwargs)


@pytest.mark.parametrize("case", list(CASES))
def test_one_record_per_round_in_order_as_history(case):
    records: list[RoundRecord] = []
    seen_at_call: list[int] = []
    detector = fit(case, callbacks=[records.append, lambda r: seen_at_call.append(len(records))])
    assert all(isinstance(r, RoundRecord) for r in records)
    assert [r.round for r in records] == list(range(1, detector.n_rounds_ + 1))
    assert seen_at_call == list(range(1, detector.n_rounds_ + 1))  # called in list order
    assert [r.as_dict() for r in records] == detector.history_
    assert sum(r.bytes_up for r in records) == detector.bytes_up_
    assert sum(r.bytes_down for r in records) == detector.bytes_down_
    if "pca" in case:
        assert [r.kind for r in records[:2]] == ["moments_mean", "moments_scatter"]
    # the hooks do not change the fit
    np.testing.assert_array_equal(detector.decision_scores_, fit(case).decision_scores_)


@pytest.mark.parametrize("case", ["fedgmm", "joint", "fedgengmm", "localgmm"])
def test_callbacks_are_not_kept_and_clone_save_load_work(case, tmp_path):
    def hook(record):
        pass

    detector = fit(case, callbacks=(hook,))
    assert "_fit_callbacks" not in vars(detector)
    assert all(value is not hook for value in vars(detector).values())
    assert "callbacks" not in detector.get_params()
    assert clone(detector).get_params() == type(detector)(**CASES[case][1]).get_params()
    detector.save(tmp_path / "model.safetensors")
    loaded = fednovelty.load(tmp_path / "model.safetensors")
    assert loaded.history_ == detector.history_
    np.testing.assert_allclose(loaded.decision_function(X), detector.decision_function(X))


@pytest.mark.parametrize("case", ["fedgmm", "joint", "fedgengmm"])
@pytest.mark.parametrize("bad", [[print, 3], ["round"], print, "abc", 7])
def test_non_callable_callbacks_raise_type_error(case, bad):
    with pytest.raises(TypeError, match="callbacks"):
        fit(case, callbacks=bad)


def test_a_generator_of_callbacks_is_accepted_with_labels():
    records = []
    detector = fit("joint", callbacks=(hook for hook in [records.append]))
    assert len(records) == detector.n_rounds_


def test_a_failing_callback_stops_the_fit_and_is_dropped():
    class Stop(Exception):
        pass

    def stop_at_round_two(record):
        if record.round == 2:
            raise Stop

    detector = FedGMMDetector(3, **SMALL)
    with pytest.raises(Stop):
        detector.fit(X, groups=GROUPS, callbacks=[stop_at_round_two])
    assert "_fit_callbacks" not in vars(detector)
