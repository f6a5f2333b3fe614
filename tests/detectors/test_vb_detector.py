"""``FedVBDetector``: scikit-learn's ``BayesianGaussianMixture`` on pooled rows, partition
invariance, pruning to the effective number of components, scoring, save/load, bad files and
invalid priors."""

from __future__ import annotations

import json
import os
import warnings

import numpy as np
import pytest
import torch
from _tolerance import assert_close_scaled
from safetensors import safe_open
from sklearn.exceptions import ConvergenceWarning
from sklearn.mixture import BayesianGaussianMixture

import fednovelty
from fednovelty import FedVBDetector
from fednovelty.detectors.options import Initialisation, Prior, Privacy
from fednovelty.detectors.persistence import _CHECKSUM_KEY, _METADATA_KEY, checksum
from fednovelty.exceptions import ModelFormatError
from fednovelty.federated import PrivacyPolicy
from fednovelty.federated.bayesian.variational import FederatedVB
from fednovelty.mixture import MixtureParams, predict_proba
from fednovelty.mixture.covariance import precisions_cholesky_from_covariances
from fednovelty.mixture.vb_prior import InvalidPriorError
from fednovelty.runtime import run_simulation

RTOL = 1e-8
CHOICES = ("predictive", "plugin")
CASES = [  # (covariance_type, weight prior type): every covariance type, both weight priors
    ("full", "dirichlet_process"),
    ("tied", "dirichlet_distribution"),
    ("diag", "dirichlet_process"),
    ("spherical", "dirichlet_distribution"),
]


def blobs(n_per: int = 150, seed: int = 0) -> np.ndarray:
    """Three well-separated 3-d blobs."""
    rng = np.random.default_rng(seed)
    centers = np.array([[0.0, 0.0, 0.0], [10.0, 0.0, 0.0], [0.0, 10.0, 5.0]])
    return np.concatenate([c + rng.normal(size=(n_per, 3)) * [1.0, 0.7, 0.9] for c in centers])


X = blobs()
GROUPS = np.random.default_rng(3).integers(0, 4, size=len(X))


def rough_start(covariance_type: str, k: int = 5) -> MixtureParams:
    """A deliberately rough initial mixture: rows as means, the data covariance everywhere."""
    rng = np.random.default_rng(1)
    means = torch.as_tensor(X[rng.choice(len(X), k, replace=False)])
    cov = torch.as_tensor(np.cov(X.T))
    covariances = {
        "full": cov.expand(k, 3, 3).clone(),
        "tied": cov,
        "diag": torch.diagonal(cov).expand(k, 3).clone(),
        "spherical": torch.diagonal(cov).mean().expand(k).clone(),
    }[covariance_type]
    factors = precisions_cholesky_from_covariances(covariances, covariance_type)
    return MixtureParams(
        torch.full((k,), 1.0 / k, dtype=torch.float64), means, factors, covariance_type
    )


def given(params: MixtureParams) -> Initialisation:
    """The detector's start ``weights_init``/``means_init``/``precisions_init`` for
    ``params``."""
    U = params.precisions_cholesky
    full = params.covariance_type in ("full", "tied")
    return Initialisation(
        weights_init=params.weights.numpy(),
        means_init=params.means.numpy(),
        precisions_init=(U @ U.transpose(-1, -2) if full else U.square()).numpy(),
    )


def sklearn_reference(params: MixtureParams, weight_type: str, **kwargs):
    """``BayesianGaussianMixture`` on the pooled rows from the posterior of ``params``'
    responsibilities (what the detector's ``vb_init`` round computes), then its own loop."""
    bgm = BayesianGaussianMixture(
        n_components=params.n_components,
        covariance_type=params.covariance_type,
        weight_concentration_prior_type=weight_type,
        warm_start=True,
        **kwargs,
    )
    bgm._check_parameters(X)
    bgm._initialize(X, predict_proba(params, torch.as_tensor(X)).numpy())
    bgm.converged_, bgm.lower_bound_ = False, -np.inf
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)
        return bgm.fit(X)


def exact_detector(covariance_type, weight_type, **kwargs) -> FedVBDetector:
    """The detector switched to scikit-learn's priors on the raw features (the robust
    defaults off), from the rough start."""
    return FedVBDetector(
        5,
        covariance_type=covariance_type,
        tol=1e-6,
        max_iter=200,
        random_state=0,
        initialisation=given(rough_start(covariance_type)),
        **kwargs,
        prior=Prior(standardize=False, strength=None, weight_concentration_type=weight_type),
        privacy=Privacy(min_rows=1),
    )


@pytest.mark.parametrize(("covariance_type", "weight_type"), CASES)
def test_one_client_equals_sklearn_and_four_clients_equal_one(covariance_type, weight_type):
    reference = sklearn_reference(rough_start(covariance_type), weight_type, tol=1e-6, max_iter=200)
    one = exact_detector(covariance_type, weight_type).fit(X)
    four = exact_detector(covariance_type, weight_type).fit(X, groups=GROUPS)
    assert four.n_clients_ == 4
    assert one.n_iter_ == four.n_iter_ == reference.n_iter_
    assert one.converged_ == reference.converged_
    for name in ("weights_", "means_", "covariances_", "precisions_cholesky_"):
        assert_close_scaled(getattr(one, name), getattr(reference, name), RTOL, name)
    wc = reference.weight_concentration_
    expected = {
        "weight_concentration": np.stack(wc) if isinstance(wc, tuple) else wc,
        "mean_precision": reference.mean_precision_,
        "degrees_of_freedom": reference.degrees_of_freedom_,
    }
    for name, value in expected.items():
        assert_close_scaled(getattr(one.posterior_, name), value, RTOL, name)
    bounds = [float(np.ravel(b)[0]) for b in reference.lower_bounds_]
    assert_close_scaled(one.lower_bounds_, bounds, RTOL, "lower_bounds_")
    # Any split of the rows: the same posterior (summed statistics), to round-off.
    for name, value in one.posterior_.tensors().items():
        assert_close_scaled(getattr(four.posterior_, name), value, RTOL, name)
    assert_close_scaled(four.lower_bounds_, one.lower_bounds_, RTOL, "lower_bounds_")
    assert_close_scaled(four.score_samples(X), one.score_samples(X), RTOL, "score_samples")


@pytest.fixture(scope="module")
def pruned():
    """K = 10 upper bound, federated k-means init, 4 clients, three blobs."""
    return FedVBDetector(10, random_state=0).fit(X, groups=GROUPS)


def test_upper_bound_prunes_to_the_three_blobs(pruned):
    assert pruned.effective_n_components_ == 3
    mask = pruned.active_components_
    assert mask.dtype == bool and mask.shape == (10,) and mask.sum() == 3
    assert np.all(pruned.weights_[~mask] < pruned.weight_threshold)
    # The kept components sit on the blobs, each with a third of the rows.
    assert_close_scaled(np.sort(pruned.weights_[mask]), [1 / 3] * 3, 0.02)
    centers = np.array([[0.0, 0.0, 0.0], [10.0, 0.0, 0.0], [0.0, 10.0, 5.0]])
    gaps = np.linalg.norm(pruned.means_[mask][:, None] - centers[None], axis=-1).min(0)
    assert np.all(gaps < 0.3)
    # Pruned components are reported, never NaN.
    for name in ("weights_", "means_", "covariances_", "precisions_cholesky_"):
        assert np.isfinite(getattr(pruned, name)).all(), name
    for name, tensor in pruned.posterior_.tensors().items():
        assert bool(torch.isfinite(tensor).all()), name
    assert np.isfinite(pruned.lower_bounds_).all() and pruned.converged_
    assert len(pruned.lower_bounds_) == pruned.n_iter_
    assert pruned.history_[0]["kind"] == "moments" and pruned.bytes_up_ > 0
    assert np.diff(pruned.lower_bounds_).min() > -1e-6 * abs(pruned.lower_bounds_[-1])


def test_sklearn_agrees_on_the_effective_number_of_components():
    """scikit-learn cannot start from the federated k-means mixture, so its own k-means
    start gives another path: compare what both should find, the three blobs."""
    bgm = BayesianGaussianMixture(n_components=10, random_state=0, max_iter=500).fit(X)
    assert int((bgm.weights_ > 1e-2).sum()) == 3


def test_predictive_and_plugin_scores_are_finite_and_close(pruned):
    plugin = FedVBDetector(10, density="plugin", random_state=0).fit(X, groups=GROUPS)
    assert_close_scaled(plugin.weights_, pruned.weights_, 0)  # same fit, another score
    rows = blobs(n_per=50, seed=9)
    predictive, plug = pruned.score_samples(rows), plugin.score_samples(rows)
    assert np.isfinite(predictive).all() and np.isfinite(plug).all()
    # 150 rows per component: the Student-t components are nearly Gaussian in the bulk...
    gap = np.median(np.abs(predictive - plug))
    assert gap < 0.05
    # ... and the gap shrinks about as 1 / n: ten times the rows, a fifth of the gap at most.
    many = blobs(n_per=1500, seed=4)
    groups = np.arange(len(many)) % 4
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)
        fits = [
            FedVBDetector(10, density=s, random_state=0).fit(many, groups=groups) for s in CHOICES
        ]
    assert np.median(np.abs(fits[0].score_samples(rows) - fits[1].score_samples(rows))) < gap / 5
    # Far out the Student-t tails are heavier than the Gaussian ones.
    far = np.array([[40.0, -30.0, 20.0]])
    assert pruned.score_samples(far)[0] > plugin.score_samples(far)[0]
    assert_close_scaled(pruned.decision_function(rows), -predictive, rtol=1e-12)


def test_far_points_are_more_anomalous(pruned):
    far = np.array([[30.0, 30.0, 30.0], [-20.0, 5.0, 0.0]])
    scores = pruned.decision_function(far)
    assert np.all(scores > pruned.decision_scores_.max())
    assert pruned.predict(far).tolist() == [1, 1]
    assert pruned.decision_function(X[:5]).max() < scores.min()


def test_y_is_ignored():
    det = FedVBDetector(4, random_state=0, max_iter=20)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)
        a = det.fit(X, groups=GROUPS).decision_scores_.copy()
        b = det.fit(X, np.arange(len(X)) % 2, groups=GROUPS).decision_scores_
    assert_close_scaled(a, b, rtol=1e-12)


def test_not_converging_warns():
    with pytest.warns(ConvergenceWarning, match="max_iter=2"):
        det = FedVBDetector(4, max_iter=2, tol=0.0, random_state=0).fit(X)
    assert det.n_iter_ == 2 and not det.converged_


# ------------------------------------------------------------------ persistence


@pytest.mark.parametrize(("covariance_type", "weight_type"), CASES)
@pytest.mark.parametrize("density", ["predictive", "plugin"])
def test_save_load_keeps_the_posterior_and_scores(tmp_path, covariance_type, weight_type, density):
    det = exact_detector(covariance_type, weight_type, density=density).fit(X, groups=GROUPS)
    path = tmp_path / "vb.safetensors"
    det.save(path)
    back = fednovelty.load(path)
    assert type(back) is FedVBDetector and back.density == density
    for name, value in det.posterior_.tensors().items():
        assert torch.equal(getattr(back.posterior_, name), value), name
    assert np.array_equal(back.active_components_, det.active_components_)
    for name in ("weights_", "means_", "covariances_", "decision_scores_"):
        assert_close_scaled(getattr(back, name), getattr(det, name), rtol=1e-12, err_msg=name)
    assert back.effective_n_components_ == det.effective_n_components_
    assert back.lower_bounds_ == det.lower_bounds_ and back.n_iter_ == det.n_iter_
    assert back.threshold_ == det.threshold_
    rows = np.vstack([X[::7], [[30.0, 30.0, 30.0]]])
    assert_close_scaled(back.score_samples(rows), det.score_samples(rows), rtol=1e-12)
    assert np.array_equal(back.predict(rows), det.predict(rows))


@pytest.fixture(scope="module")
def saved_file(tmp_path_factory):
    det = FedVBDetector(4, random_state=0, max_iter=200).fit(X, groups=GROUPS)
    path = tmp_path_factory.mktemp("vb") / "vb.safetensors"
    det.save(path)
    with safe_open(os.fspath(path), framework="pt") as handle:
        tensors = {k: handle.get_tensor(k) for k in handle.keys()}
        document = json.loads(handle.metadata()[_METADATA_KEY])
    return tensors, document


def _tampered(path, tensors, document):
    """A file whose checksum matches its (tampered) content: only validation can catch it."""
    text = json.dumps(document)
    from safetensors.torch import save_file

    digest = checksum(text, tensors)
    save_file(tensors, os.fspath(path), metadata={_METADATA_KEY: text, _CHECKSUM_KEY: digest})


def _set(name, index, value):
    def change(tensors):
        tensors[name] = tensors[name].clone()
        tensors[name][index] = value

    return change


def _reshape(name):
    def change(tensors):
        tensors[name] = tensors[name][..., :-1].contiguous()

    return change


def _asymmetric(tensors):
    cov = tensors["posterior.covariances"].clone()
    cov[0, 0, 1] += 1.0
    tensors["posterior.covariances"] = cov


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (_set("posterior.weight_concentration", (0, 1), 0.0), "weight_concentration.*<= 0"),
        (_set("posterior.weight_concentration", (1, 0), -1.0), "weight_concentration.*<= 0"),
        (_set("posterior.mean_precision", 2, -3.0), "mean_precision.*<= 0"),
        (_set("posterior.degrees_of_freedom", 0, 2.0), "degrees_of_freedom.*n_features - 1"),
        (_set("posterior.degrees_of_freedom", 1, float("nan")), "degrees_of_freedom.*NaN"),
        (_set("posterior.means", (0, 1), float("nan")), "means.*NaN"),
        (_set("posterior.means", (0, 1), 1e300), "too large"),
        (_set("posterior.covariances", (1, 2, 2), -5.0), "covariances"),
        (_asymmetric, "not symmetric"),
        (_reshape("posterior.means"), "means.*shape"),
        (_reshape("posterior.weight_concentration"), "weight_concentration.*shape"),
        (_reshape("posterior.degrees_of_freedom"), "degrees_of_freedom.*shape"),
        (lambda t: t.pop("posterior.mean_precision"), "mean_precision.*missing"),
    ],
)
def test_tampered_files_are_rejected(tmp_path, saved_file, change, message):
    tensors, document = saved_file
    tensors = dict(tensors)
    change(tensors)
    path = tmp_path / "bad.safetensors"
    _tampered(path, tensors, document)
    with pytest.raises(ModelFormatError, match=message):
        FedVBDetector.load(path)


def test_a_value_changed_within_range_is_caught_by_the_checksum(tmp_path, saved_file):
    tensors, document = saved_file
    tensors = {**tensors, "posterior.means": tensors["posterior.means"] + 0.5}
    path = tmp_path / "edited.safetensors"
    from safetensors.torch import save_file

    save_file(tensors, os.fspath(path), metadata={_METADATA_KEY: json.dumps(document)})
    with pytest.raises(ModelFormatError):
        FedVBDetector.load(path)


# ------------------------------------------------------------------ invalid priors


@pytest.mark.parametrize(
    ("kwargs", "name"),
    [
        ({"degrees_of_freedom": 2.0}, "degrees_of_freedom"),  # d - 1 = 2
        ({"mean": [0.0, 1.0]}, "mean"),
        ({"mean": [0.0, np.nan, 1.0]}, "mean"),
        ({"covariance": np.eye(2)}, "covariance"),
        ({"covariance": -np.eye(3)}, "covariance"),
        ({"covariance_type": "diag", "covariance": [1.0, 0.0, 1.0]}, "covariance"),
        ({"covariance_type": "spherical", "covariance": -2.0}, "covariance"),
    ],
)
def test_invalid_priors_are_named_at_fit(kwargs, name):
    covariance_type = kwargs.pop("covariance_type", "full")
    det = FedVBDetector(3, covariance_type=covariance_type, prior=Prior(**kwargs))
    name = rf"prior\.{name}\b"
    with pytest.raises(InvalidPriorError, match=name):
        det.fit(X)
    assert not hasattr(det, "history_")  # refused before any round ran


@pytest.mark.parametrize(
    ("kwargs", "name"),
    [
        ({"prior": Prior(weight_concentration_type="dirichlet")}, "weight_concentration_type"),
        ({"density": "bayes"}, "density"),
        ({"prior": Prior(weight_concentration="big")}, "weight_concentration"),
        ({"prior": Prior(weight_concentration=0.0)}, "weight_concentration"),
        ({"prior": Prior(weight_concentration=-1.0)}, "weight_concentration"),
        ({"prior": Prior(weight_concentration=float("inf"))}, "weight_concentration"),
        ({"prior": Prior(mean_precision=0.0)}, "mean_precision"),
        ({"prior": Prior(degrees_of_freedom=-1.0)}, "degrees_of_freedom"),
        ({"n_components": 0}, "n_components"),
    ],
)
def test_invalid_settings_are_named_at_fit(kwargs, name):
    det = FedVBDetector(**kwargs)  # __init__ stores only
    with pytest.raises(ValueError, match=name):
        det.fit(X)


def test_valid_given_priors_skip_the_prior_round():
    det = FedVBDetector(
        4,
        random_state=0,
        prior=Prior(mean=X.mean(0), covariance=np.cov(X.T), degrees_of_freedom=3.5),
    ).fit(X, groups=GROUPS)
    assert det.history_[0]["kind"] != "vb_prior"
    assert det.effective_n_components_ == 3


def test_from_model_wraps_a_federated_vb_run():
    clients = [torch.as_tensor(X[GROUPS == c]) for c in range(4)]
    result = run_simulation(
        FederatedVB(4, tol=1e-6, max_iter=200, random_state=0),
        clients,
        privacy=PrivacyPolicy(min_rows=1),
    )
    det = FedVBDetector.from_model(result, X, n_components=4)
    assert det.effective_n_components_ == result.state.effective_n_components
    assert det.lower_bounds_ == result.state.lower_bounds
    assert np.isfinite(det.score_samples(X)).all()


def test_init_stores_arguments_and_clone_keeps_them():
    from sklearn.base import clone

    det = FedVBDetector(
        7, density="plugin", prior=Prior(mean=[1.0, 2.0, 3.0], weight_concentration=-1)
    )
    params = clone(det).get_params()
    assert params["n_components"] == 7 and params["density"] == "plugin"
    assert params["prior__weight_concentration"] == -1  # checked in fit, not here
    assert np.array_equal(params["prior__mean"], [1.0, 2.0, 3.0])
