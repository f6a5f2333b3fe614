"""The engine is one parameter away on every detector that runs a federation:
``sampling=ClientSampling(engine=...)`` on ``FedGenGMMDetector``, ``LocalGMMDetector``,
``FedVBDetector``, ``FedMFADetector``, ``FedKNNMarkerDetector``,
``StreamingFedGMMDetector`` and ``VGM2Classifier``, which read its ``engine`` field only.

- scikit-learn's parameter contract keeps it: ``get_params``/``set_params`` (nested too),
  ``clone``, a saved file; a field these detectors do not read is refused by name;
- every round of a fit goes to Flower's Simulation Engine when it is asked for (a spy in
  place of ``run_flower_simulation`` that runs the in-process engine, the in-process entry
  point of ``_simulate`` made to fail): no round falls back to the in-process engine;
- what flower-sim cannot run (differential privacy, the PCA front end's wrapped algorithm) is
  refused at ``fit`` naming ``sampling`` and the parameter in the way, before any round;
- on a real Ray (started once for the module, its two ClientApp actors kept across the
  tests, as ``tests/runtime/test_flower_sim_engine.py`` does) FedGenGMM's, FedVB's and a
  streaming model's scores (its first fit and a later window) equal the in-process
  engine's to 1e-9 relative (few rounds each: most of the time is Ray's and the actors'
  start).
"""

from __future__ import annotations

import warnings

import numpy as np
import pytest
from sklearn.base import clone

from fednovelty import (
    FedGenGMMDetector,
    FedKNNMarkerDetector,
    FedMFADetector,
    FedVBDetector,
    LocalGMMDetector,
    StreamingFedGMMDetector,
    VGM2Classifier,
)
from fednovelty.detectors import ClientSampling, Initialisation, Objective, Privacy, Training

pytestmark = pytest.mark.filterwarnings("ignore::sklearn.exceptions.ConvergenceWarning")

RTOL = 1e-9
#: each detector with settings that keep a fit short.
FAST = {
    FedGenGMMDetector: {"n_components": 2, "client_components": 2},
    LocalGMMDetector: {"client_components": 2},
    FedVBDetector: {
        "n_components": 3,
        "max_iter": 4,
        "initialisation": Initialisation(kmeans_rounds=2),
    },
    FedMFADetector: {
        "n_components": 2,
        "max_iter": 3,
        "initialisation": Initialisation(kmeans_rounds=2),
    },
    FedKNNMarkerDetector: {
        "n_components": 2,
        "max_iter": 3,
        "initialisation": Initialisation(kmeans_rounds=2),
    },
    StreamingFedGMMDetector: {
        "n_components": 2,
        "max_iter": 3,
        "initialisation": Initialisation(kmeans_rounds=2),
    },
    VGM2Classifier: {
        "rounds": 2,
        "hidden": 8,
        "embedding_dim": 2,
        "training": Training(local_epochs=1),
        "objective": Objective(umap_weight=0.0),
    },
}
CLASSES = list(FAST)
FLOWER = ClientSampling(engine="flower-sim")


def build(cls, **params):
    return cls(**FAST[cls], random_state=0, **params)


def data(seed: int = 2, shift: float = 0.0):
    """Four clients of 60 rows, 3 features, two populations; labels for the classifier."""
    rng = np.random.default_rng(seed)
    X = np.vstack([rng.normal(size=(120, 3)), rng.normal(size=(120, 3)) + 4.0]) + shift
    groups = np.repeat(np.arange(4), 60)
    y = (np.arange(240) % 60 < 30).astype(int)
    return X, y, groups


def fit(detector, X, y, groups):
    if isinstance(detector, VGM2Classifier):
        return detector.fit(X, y, groups)
    return detector.fit(X, groups=groups)


# ------------------------------------------------------------- the parameter contract


@pytest.mark.parametrize("cls", CLASSES, ids=lambda c: c.__name__)
def test_sampling_round_trips_through_get_set_params_and_clone(cls):
    detector = build(cls, sampling=ClientSampling(engine="flower-sim"))
    params = detector.get_params()
    assert params["sampling"].engine == params["sampling__engine"] == "flower-sim"
    copy = clone(detector)
    assert copy.sampling is not detector.sampling and copy.sampling.engine == "flower-sim"
    again = cls().set_params(**detector.get_params(deep=False))
    assert again.get_params()["sampling__engine"] == "flower-sim"
    fresh = cls()
    assert fresh.sampling is None and fresh._option("sampling").engine == "in-process"
    fresh.set_params(sampling__engine="flower-sim")  # a new object of the defaults
    assert fresh.sampling.engine == "flower-sim" and fresh.sampling is not FLOWER
    assert fresh.sampling.fraction == 1.0
    assert [f.name for f in cls._params["sampling"].fields] == ["engine"]


@pytest.mark.parametrize("cls", CLASSES, ids=lambda c: c.__name__)
def test_a_sampling_field_these_detectors_do_not_read_is_named(cls):
    X, y, groups = data()
    detector = build(cls, sampling=ClientSampling(fraction=0.5))
    with pytest.raises(ValueError, match=r"does not read sampling\.fraction.*reads engine"):
        fit(detector, X, y, groups)


def test_a_saved_detector_keeps_its_engine(tmp_path):
    from fednovelty.detectors.persistence import load

    X, _, groups = data()
    detector = build(FedGenGMMDetector).fit(X, groups=groups)
    detector.set_params(sampling=ClientSampling(engine="flower-sim"))
    detector.save(tmp_path / "model")
    loaded = load(tmp_path / "model")
    assert loaded.sampling.engine == "flower-sim"
    np.testing.assert_array_equal(loaded.score_samples(X), detector.score_samples(X))


# ------------------------------------------------------------- every round on flower-sim


@pytest.fixture
def spy(monkeypatch):
    """``run_flower_simulation`` replaced by the in-process engine, recording each call's
    algorithm; the in-process entry point of ``_simulate`` fails."""
    pytest.importorskip("flwr")
    from fednovelty.runtime import run_simulation
    from fednovelty.runtime.flower import sim_engine

    calls: list[str] = []

    def flower(algorithm, clients, **options):
        calls.append(type(algorithm).__name__)
        return run_simulation(algorithm, clients, **options)

    def in_process(*args, **options):
        raise AssertionError("a round ran on the in-process engine")

    monkeypatch.setattr(sim_engine, "run_flower_simulation", flower)
    monkeypatch.setattr("fednovelty.detectors.base.run_simulation", in_process)
    return calls


@pytest.mark.parametrize("cls", CLASSES, ids=lambda c: c.__name__)
def test_every_round_of_a_fit_goes_to_flower_sim(cls, spy):
    X, y, groups = data()
    detector = fit(build(cls, sampling=FLOWER), X, y, groups)
    assert spy and detector.n_rounds_ >= 1
    if cls is StreamingFedGMMDetector:  # fit: federated EM, then the first window's round
        assert spy == ["FederatedEM", "StreamingEM"]
        detector.partial_fit(X + 0.5, groups=groups)
        assert spy[-1] == "StreamingEM" and len(spy) == 3


def test_conformal_calibration_rounds_go_to_flower_sim_too(spy):
    X, _, groups = data()
    detector = build(FedMFADetector, sampling=FLOWER, calibration="conformal", alpha=0.1)
    detector.fit(X, groups=groups)
    assert spy == ["FederatedFactorEM", "FederatedCalibration"]


# ------------------------------------------------------------- refused at fit, by name


@pytest.mark.parametrize(
    ("cls", "params"),
    [
        (FedGenGMMDetector, {}),
        (LocalGMMDetector, {}),
        (FedVBDetector, {}),
        (VGM2Classifier, {}),
        (FedGenGMMDetector, {"privacy": Privacy(epsilon=1.0, bounds=([-3.0] * 3, [7.0] * 3))}),
    ],
    ids=["FedGenGMM", "LocalGMM", "FedVB", "VGM2", "FedGenGMM-public-bounds"],
)
def test_differential_privacy_on_flower_sim_is_refused_before_any_round(cls, params, spy):
    X, y, groups = data()
    params = {"privacy": Privacy(epsilon=1.0), **params}
    detector = build(cls, sampling=FLOWER, **params)
    with pytest.raises(ValueError) as error:
        fit(detector, X, y, groups)
    message = str(error.value)
    assert "sampling=ClientSampling(engine='flower-sim')" in message
    assert "privacy.epsilon=1.0" in message and "engine='in-process'" in message
    assert spy == []  # not even the private bounds round ran
    assert not hasattr(detector, "n_rounds_")


@pytest.mark.parametrize("cls", [FedGenGMMDetector, LocalGMMDetector, FedVBDetector])
def test_the_pca_front_end_on_flower_sim_is_refused_before_any_round(cls, spy):
    X, y, groups = data()
    detector = build(cls, sampling=FLOWER, pca_components=2)
    with pytest.raises(ValueError, match=r"engine='flower-sim'.*pca_components=2") as error:
        fit(detector, X, y, groups)
    assert "pca_components=None" in str(error.value)
    assert spy == []  # federated PCA's rounds did not run either
    wide = np.random.default_rng(0).normal(size=(240, 201))  # "auto" engages above 200
    with pytest.raises(ValueError, match=r"pca_components='auto'.*201-feature"):
        fit(build(cls, sampling=FLOWER), wide, y, groups)
    assert spy == []


# ------------------------------------------------------------- the same scores on Ray


@pytest.fixture(scope="module")
def ray_up():
    """Ray for the whole module, as tests/runtime/test_flower_sim_engine.py keeps it (the
    engine leaves a Ray it did not start running, and keeps its two ClientApp actors)."""
    pytest.importorskip("flwr")
    ray = pytest.importorskip("ray", reason="Flower's simulation needs flwr[simulation] (Ray)")
    from fednovelty.runtime.flower.sim_engine import release_actors

    started = not ray.is_initialized()
    if started:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", FutureWarning)  # Ray's accelerator tip
            ray.init(num_cpus=2, include_dashboard=False, logging_level="WARNING")
    yield
    assert release_actors() == 2  # the fits shared one pool of two actors
    if started:
        ray.shutdown()


def assert_same_fit(ours, flower, X) -> None:
    assert flower.n_rounds_ == ours.n_rounds_
    assert [r["kind"] for r in flower.history_] == [r["kind"] for r in ours.history_]
    a, b = ours.score_samples(X), flower.score_samples(X)
    np.testing.assert_allclose(b, a, rtol=0, atol=RTOL * np.abs(a).max())
    assert flower.threshold_ == pytest.approx(ours.threshold_, rel=RTOL)


@pytest.mark.parametrize("cls", [FedGenGMMDetector, FedVBDetector])
def test_flower_sim_scores_as_in_process(cls, ray_up):
    X, _, groups = data()
    ours = build(cls).fit(X, groups=groups)
    flower = build(cls, sampling=FLOWER).fit(X, groups=groups)
    assert_same_fit(ours, flower, X)


def test_a_stream_on_flower_sim_scores_as_in_process(ray_up):
    """The first fit (federated EM, the first window's round) and a later window, whose
    clients start from the weights they kept (Flower's ``context.state``)."""
    X, _, groups = data()
    ours = build(StreamingFedGMMDetector).fit(X, groups=groups)
    flower = build(StreamingFedGMMDetector, sampling=FLOWER).fit(X, groups=groups)
    assert_same_fit(ours, flower, X)
    later = data(seed=3, shift=0.5)[0]
    ours.partial_fit(later, groups=groups)
    flower.partial_fit(later, groups=groups)
    assert_same_fit(ours, flower, later)
    np.testing.assert_allclose(flower.client_weights_, ours.client_weights_, rtol=RTOL, atol=0)
    assert [r["client"] for r in flower.drift_history_] == [
        r["client"] for r in ours.drift_history_
    ]
    moved = [r["total_variation"] for r in ours.drift_history_]
    assert [r["total_variation"] for r in flower.drift_history_] == pytest.approx(moved, rel=RTOL)
