"""Nothing a fit cannot use is lost silently: every estimator (``_every_estimator``) says, with
one ``DataLossWarning`` per fit, which clients released nothing (their ids, rows and reasons),
when a federation was reduced to one client, and when the fitted mixture emptied components;
every per-client scoring method refuses a client id not seen in fit, naming the known ones."""

from __future__ import annotations

import inspect
import warnings

import numpy as np
import pytest
from _every_estimator import NAMES, build, data, fit
from sklearn.datasets import load_wine

from fednovelty import FedGenGMMDetector, FedGMMDetector, FedVBDetector, Prior, Privacy
from fednovelty.detectors._data_loss import empty_components_message, fewer_components_message
from fednovelty.exceptions import DataLossWarning

pytestmark = [
    pytest.mark.filterwarnings("ignore::sklearn.exceptions.ConvergenceWarning"),
    pytest.mark.filterwarnings("ignore:init_params='subset' sends raw rows:UserWarning"),
]
#: the estimators whose fit sees the clients' rows pooled (no privacy floor).
POOLED = {"CentralGMM"}


def data_losses(run) -> list[str]:
    """The messages of the ``DataLossWarning`` s that ``run()`` raised."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        run()
    return [str(w.message) for w in caught if issubclass(w.category, DataLossWarning)]


def one_row_client():
    """``data()`` with its last client (id 3) cut to one row: below ``Privacy``'s default
    floor of 5 rows."""
    X, y, groups = data()
    return X.iloc[:121], y[:121], groups[:121]


def test_the_category_is_one_filterable_user_warning():
    assert issubclass(DataLossWarning, UserWarning)
    assert "floor" in DataLossWarning.__doc__ and "emptied" in DataLossWarning.__doc__
    X, _, groups = one_row_client()
    with warnings.catch_warnings():
        warnings.simplefilter("error", DataLossWarning)
        with pytest.raises(DataLossWarning, match="client 3"):
            FedGMMDetector(2, random_state=0).fit(X, groups=groups)


@pytest.mark.parametrize("name", [n for n in NAMES if n not in POOLED])
def test_a_client_below_its_floor_is_named_once(name):
    X, y, groups = one_row_client()
    detector = build(name)
    losses = [m for m in data_losses(lambda: fit(detector, name, X, y, groups)) if "client" in m]
    skipped = [m for m in losses if "released nothing" in m]
    assert len(skipped) == 1, losses
    assert "1 of 4 clients" in skipped[0] and "client 3 (1 row;" in skipped[0]
    assert "1 in every round" in skipped[0]
    if name != "KNN-markers":  # its own reason: too few rows for a k-th neighbour
        assert "privacy floor (min_rows=5)" in skipped[0]
    assert 3 in detector.client_ids_.tolist()  # still a client of the fit, as before


@pytest.mark.parametrize("name", NAMES)
def test_a_fit_that_uses_every_client_names_none(name):
    X, y, groups = data()
    detector = build(name)
    losses = data_losses(lambda: fit(detector, name, X, y, groups))
    assert not [m for m in losses if "released nothing" in m or "reduced to one" in m]


def test_no_floor_no_warning():
    X, _, groups = one_row_client()
    detector = FedGMMDetector(2, random_state=0, privacy=Privacy(min_rows=1))
    assert not data_losses(lambda: detector.fit(X, groups=groups))


@pytest.mark.parametrize("cls", [FedGMMDetector, FedGenGMMDetector])
def test_a_federation_reduced_to_one_client_says_so(cls):
    rng = np.random.default_rng(0)
    X = rng.normal(size=(41, 3))
    groups = np.array(["big"] * 40 + ["tiny"])
    losses = data_losses(lambda: cls(2, random_state=0).fit(X, groups=groups))
    reduced = [m for m in losses if "reduced to one" in m]
    assert len(reduced) == 1 and "only client 'big'" in reduced[0]
    assert any("client 'tiny' (1 row;" in m for m in losses)
    healthy = np.array(["a"] * 20 + ["b"] * 21)
    losses = data_losses(lambda: cls(2, random_state=0).fit(X, groups=healthy))
    assert not [m for m in losses if "client" in m]


def wine():
    """100 rows of scikit-learn's wine data set over 3 string-named clients."""
    X, _ = load_wine(return_X_y=True)
    rows = np.random.default_rng(0).permutation(len(X))[:100]
    return X[rows], np.array(["a", "b", "c"])[np.arange(100) % 3]


def test_components_emptied_by_the_default_prior_are_named():
    X, groups = wine()
    detector = FedGMMDetector(n_components=3, random_state=0)
    losses = data_losses(lambda: detector.fit(X, groups=groups))
    assert detector.n_components_ == 3  # the fitted model's size; what survived is below
    assert (detector.weights_ * 100 < 1).sum() == 2
    assert detector.effective_n_components_ == 1
    emptied = [m for m in losses if "emptied" in m]
    assert len(emptied) == 1
    assert "1 of 3 components kept weight" in emptied[0]
    assert "effective_n_components_ = 1" in emptied[0]
    assert "n_components=1" in emptied[0] and "Prior(strength=None)" in emptied[0]
    plain = FedGMMDetector(n_components=3, random_state=0, prior=Prior(strength=None))
    assert not data_losses(lambda: plain.fit(X, groups=groups))


@pytest.mark.parametrize("k", [3, 5, 8])
def test_on_wine_no_component_is_emptied_silently(k, tmp_path):
    """Wine's 100 rows over 3 clients, K = 3, 5, 8, default prior: every fit says how many
    components kept weight, with exactly the count of ``weights_`` entries backed by at
    least one row, and the count survives save and load."""
    X, groups = wine()
    detector = FedGMMDetector(n_components=k, random_state=0)
    losses = data_losses(lambda: detector.fit(X, groups=groups))
    kept = int((detector.weights_ * 100 >= 1).sum())
    assert detector.effective_n_components_ == kept
    emptied = [m for m in losses if "emptied" in m]
    assert kept == k or (
        len(emptied) == 1 and f"{kept} of {detector.n_components_} components kept" in emptied[0]
    )
    detector.save(tmp_path / "wine.safetensors")
    assert FedGMMDetector.load(tmp_path / "wine.safetensors").effective_n_components_ == kept


def small_federation():
    """75 rows of wine over 10 clients (ADBench Hepatitis' size: 80 rows, 10 clients): under
    the default floor of 5 rows a client forms at most one or two k-means clusters."""
    X, _ = load_wine(return_X_y=True)
    rows = np.random.default_rng(0).permutation(len(X))[:75]
    return X[rows], np.arange(75) % 10


@pytest.mark.parametrize("mixture_weights", ["global", "personal"])
def test_a_k_small_clients_cannot_seed_is_fitted_smaller_with_a_warning(mixture_weights):
    """Federated EM with K = 10 on 75 rows over 10 clients fits the components the clients'
    centroids can seed and says so, where it refused the data before."""
    X, groups = small_federation()
    detector = FedGMMDetector(10, mixture_weights=mixture_weights, random_state=0)
    losses = data_losses(lambda: detector.fit(X, groups=groups))
    assert 1 <= detector.n_components_ < 10
    assert detector.weights_.shape[-1] == detector.n_components_
    fewer = [m for m in losses if "where n_components=10 asked" in m]
    assert len(fewer) == 1
    assert f"fitted {detector.n_components_} component" in fewer[0]
    assert f"n_components={detector.n_components_}" in fewer[0]
    assert np.isfinite(detector.decision_function(X)).all()
    again = FedGMMDetector(detector.n_components_, mixture_weights=mixture_weights, random_state=0)
    assert not [m for m in data_losses(lambda: again.fit(X, groups=groups)) if "asked" in m]


def test_the_registry_default_fits_a_small_set():
    """The README's default (DEM-kmeans, the scoreboard's K = 10) on 75 rows."""
    from fednovelty.methods import get_method

    X, groups = small_federation()
    detector = get_method("DEM-kmeans").build(n_components=10, random_state=0)
    losses = data_losses(lambda: detector.fit(X, groups=groups))
    assert detector.n_components_ < 10 and any("asked" in m for m in losses)


def test_variational_pruning_is_not_a_loss():
    X, groups = wine()
    detector = FedVBDetector(n_components=8, random_state=0, max_iter=5)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        detector.fit(X, groups=groups)
    assert empty_components_message(detector, 100, "FedVBDetector.fit") is None
    assert fewer_components_message(detector, "FedVBDetector.fit") is None


#: per-client methods and the arguments besides ``X`` and ``client``.
CLIENT_METHODS = (
    "score_samples_client",
    "decision_function",
    "predict_proba_y",
    "predict_y",
    "predict",
    "predict_proba",
    "log_px",
    "responsibilities",
    "component_weights",
)


@pytest.mark.parametrize("name", NAMES)
def test_an_unseen_client_is_refused_by_name(name):
    X, y, groups = data()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        detector = fit(build(name), name, X, y, groups)
    methods = [
        m
        for m in CLIENT_METHODS
        if hasattr(detector, m) and "client" in inspect.signature(getattr(detector, m)).parameters
    ]
    assert methods or name == "KNN-markers"
    for method in methods:
        call = getattr(detector, method)
        args = () if method == "component_weights" else (X.iloc[:5],)
        unseen = r"client 99\b.*known clients: \[0, 1, 2, 3\]"
        global_weights = r"needs mixture_weights='personal'"  # refused before the id
        with pytest.raises(ValueError, match=f"{unseen}|{global_weights}"):
            call(*args, client=99)


def test_a_streaming_window_names_its_losses():
    """StreamingFedGMMDetector.partial_fit: a later window's clients below the floor are
    named as in fit, counted among the window's clients, at the caller's line."""
    from fednovelty import StreamingFedGMMDetector

    rng = np.random.default_rng(0)
    detector = StreamingFedGMMDetector(2, random_state=0)
    detector.fit(rng.normal(size=(120, 3)), groups=np.arange(120) % 3)
    window = rng.normal(size=(43, 3))
    groups = np.r_[np.arange(40) % 2, [2, 2, 2]]
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        detector.partial_fit(window, groups=groups)
    losses = [w for w in caught if issubclass(w.category, DataLossWarning)]
    skipped = [str(w.message) for w in losses if "released nothing" in str(w.message)]
    assert len(skipped) == 1
    assert skipped[0].startswith("StreamingFedGMMDetector.partial_fit: ")
    assert "of 3 clients" in skipped[0] and "client 2 (3 rows;" in skipped[0]
    assert all(w.filename == __file__ for w in losses)


def test_a_joint_window_names_its_losses():
    """JointFedGMMDetector.partial_fit on a window where one client holds 2 rows."""
    from fednovelty import JointFedGMMDetector

    rng = np.random.default_rng(0)
    X = rng.normal(size=(90, 3))
    y = (X[:, 0] > 0).astype(int)
    detector = JointFedGMMDetector(2, random_state=0, max_iter=3)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        detector.fit(X, y, groups=np.arange(90) % 3)
    groups = np.r_[np.zeros(20, int), np.ones(20, int), [2, 2]]
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        detector.partial_fit(X[:42], y[:42], groups=groups)
    messages = [str(w.message) for w in caught if issubclass(w.category, DataLossWarning)]
    assert any(
        m.startswith("JointFedGMMDetector.partial_fit: ") and "client 2 (2 rows;" in m
        for m in messages
    ), messages
