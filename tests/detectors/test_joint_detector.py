"""``JointFedGMMDetector``: fit(X, y, groups) trains FedGMM's joint model of (x, y)."""

import re
import warnings
from pathlib import Path

import numpy as np
import pytest
import torch
from _tolerance import assert_close_scaled
from sklearn.base import clone

from fednovelty import FedGMMDetector, JointFedGMMDetector, load
from fednovelty.datasets import make_fedgmm_synthetic
from fednovelty.detectors._fit_state import seed_from
from fednovelty.detectors.options import ClientSampling, Prior, Training
from fednovelty.federated.joint_models.joint import JointFedGMM, linear_learner
from fednovelty.federated.mixtures.pca import FederatedPCA
from fednovelty.federated.trust.privacy import DEFAULT_MAX_CLUSTERS, PrivacyPolicy
from fednovelty.runtime import run_simulation


@pytest.fixture(scope="module")
def split():
    return make_fedgmm_synthetic(6, random_state=1)


@pytest.fixture(scope="module")
def fitted(split):
    labels = np.array(["neg", "pos"])[split.y_train]  # string labels are mapped and kept
    detector = JointFedGMMDetector(3, n_learners=3, max_iter=8, tol=0.0, random_state=0)
    return detector.fit(split.X_train, labels, groups=split.groups_train)


def test_labels_and_weights(fitted, split):
    assert fitted.classes_.tolist() == ["neg", "pos"]
    assert fitted.client_joint_weights_.shape == (6, 3, 3)
    np.testing.assert_allclose(fitted.client_joint_weights_.sum((1, 2)), 1.0)
    np.testing.assert_allclose(fitted.client_weights_, fitted.client_joint_weights_.sum(2))
    assert set(fitted.predict_y(split.X_test)) <= {"neg", "pos"}


def test_scores_fit_together(fitted, split):
    X, y = split.X_test, np.array(["neg", "pos"])[split.y_test]
    log_px, log_py = fitted.log_px(X), fitted.log_py_given_x(X, y)
    np.testing.assert_allclose(fitted.log_pxy(X, y), log_px + log_py, atol=1e-10)
    np.testing.assert_allclose(fitted.predict_proba_y(X).sum(1), 1.0)
    np.testing.assert_allclose(fitted.score_samples(X), log_px, atol=1e-8)
    np.testing.assert_allclose(fitted.decision_function(X), -fitted.score_samples(X))
    assert not np.allclose(fitted.log_px(X, client=0), log_px)  # personal weights differ
    # permuting labels makes them less likely under the learned p(y|x)
    flipped = np.where(y == "neg", "pos", "neg")
    assert fitted.log_py_given_x(X, flipped).mean() < log_py.mean()


def test_bad_input_is_named(fitted, split):
    X = split.X_test[:4]
    with pytest.raises(ValueError, match=r"label\(s\) \['other'\] not seen in fit"):
        fitted.log_py_given_x(X, ["neg", "pos", "other", "neg"])
    with pytest.raises(ValueError, match="client 42 was not seen in fit"):
        fitted.log_px(X, client=42)
    with pytest.raises(ValueError, match="y has 3 labels but X has 4 rows"):
        fitted.log_pxy(X, ["neg", "pos", "neg"])
    with pytest.raises(ValueError, match="single class"):
        JointFedGMMDetector(2).fit(
            split.X_train, np.zeros(len(split.X_train)), groups=split.groups_train
        )
    with pytest.raises(ValueError, match="one label per row"):
        JointFedGMMDetector(2).fit(split.X_train, split.y_train[:-1], groups=split.groups_train)
    with pytest.raises(ValueError, match="1-D"):
        JointFedGMMDetector(2).fit(split.X_train, split.y_train[:, None], split.groups_train)
    with pytest.raises(ValueError, match="NaN or inf"):
        JointFedGMMDetector(2).fit(split.X_train, np.full(len(split.X_train), np.nan))


def test_y_is_required(split):
    for call in (
        lambda det: det.fit(split.X_train),
        lambda det: det.fit(split.X_train, groups=split.groups_train),
        lambda det: det.fit(split.X_train, None, split.groups_train),
    ):
        detector = JointFedGMMDetector(2)
        with pytest.raises(ValueError, match=r"requires y to be passed.*FedGMMDetector"):
            call(detector)
        assert not hasattr(detector, "history_")


def test_invalid_settings_are_named_at_fit(split):
    for name, value in (
        ("n_learners", 0),
        ("learner", "tree"),
        ("training", Training(optimizer="lbfgs")),
    ):
        detector = JointFedGMMDetector(2, **{name: value})  # __init__ stores only
        with pytest.raises(ValueError, match=name):
            detector.fit(split.X_train, split.y_train, split.groups_train)


def test_score_choices(fitted, split):
    X, y = split.X_test, np.array(["neg", "pos"])[split.y_test]
    np.testing.assert_allclose(
        fitted.decision_function(X, score="py|x", y=y), -fitted.log_py_given_x(X, y)
    )
    np.testing.assert_allclose(fitted.decision_function(X, y, score="pxy"), -fitted.log_pxy(X, y))
    np.testing.assert_allclose(
        fitted.decision_function(X, score="px", client=2), -fitted.log_px(X, client=2)
    )
    msp = fitted.decision_function(X, score="msp")
    np.testing.assert_allclose(msp, -fitted.predict_proba_y(X).max(1))
    assert np.all((msp >= -1.0) & (msp <= -0.5))  # two classes: max prob in [0.5, 1]
    with pytest.raises(ValueError, match="needs the labels"):
        fitted.decision_function(X, score="py|x")
    with pytest.raises(ValueError, match="score must be one of"):
        fitted.decision_function(X, score="p(x)")


def test_adapt_freezes_the_model_and_returns_a_client_handle(fitted, split):
    shared = {
        "means": fitted.means_.copy(),
        "counts": fitted.joint_state_.joint_counts.clone(),
        "learner": {k: v.clone() for k, v in fitted.joint_state_.learners[1].items()},
        "client_weights": fitted.client_joint_weights_.copy(),
    }
    rows = split.groups_test == 3
    X, y = split.X_test[rows], np.array(["neg", "pos"])[split.y_test[rows]]
    handle = fitted.adapt(X, y, max_iter=50)
    x_only = fitted.adapt(X)
    np.testing.assert_array_equal(fitted.means_, shared["means"])
    assert torch.equal(fitted.joint_state_.joint_counts, shared["counts"])
    for k, v in shared["learner"].items():
        assert torch.equal(fitted.joint_state_.learners[1][k], v)
    np.testing.assert_array_equal(fitted.client_joint_weights_, shared["client_weights"])
    assert handle.weights.shape == (3, 3) and handle.labelled and not x_only.labelled
    assert handle.trace.shape == (handle.n_iter + 1, 3, 3)
    np.testing.assert_allclose(
        handle.trace[0],
        fitted.joint_state_.joint_counts.numpy() / fitted.joint_state_.joint_counts.sum().item(),
    )
    # the handle works wherever client= does, and fits this client better than global weights
    assert fitted.log_pxy(X, y, client=handle).mean() > fitted.log_pxy(X, y).mean()
    assert fitted.log_px(X, client=x_only).mean() > fitted.log_px(X).mean()
    assert fitted.predict_y(X, client=handle).shape == (len(X),)


def test_adapt_and_client_bad_input(fitted, split):
    X = split.X_test[:5]
    with pytest.raises(ValueError, match="at least 2 rows"):
        fitted.adapt(X[:1])
    with pytest.raises(ValueError, match="max_iter must be"):
        fitted.adapt(X, max_iter=0)
    with pytest.raises(ValueError, match="not seen in fit"):
        fitted.adapt(X, ["neg", "pos", "neg", "maybe", "pos"])
    with pytest.raises(ValueError, match="client 6 was not seen in fit"):
        fitted.predict_proba_y(X, client=6)  # clients are 0..5
    with pytest.raises(TypeError, match="client must be a client id"):
        fitted.log_px(X, client=[0])
    plain = FedGMMDetector(3, max_iter=3, random_state=0).fit(
        split.X_train, groups=split.groups_train
    )
    with pytest.raises(ValueError, match="another model"):
        fitted.log_px(X, client=plain.adapt(X))
    with pytest.raises(ValueError, match="another model"):
        plain.score_samples_client(X, fitted.adapt(X))


def test_baselines_by_name(split):
    for name, sizes in {
        "FedEM": (1, 3),
        "FedAvg": (1, 1),
        "FedProx": (1, 1),
        "Local": (1, 1),
    }.items():
        detector = JointFedGMMDetector.pfl_baseline(name, n_learners=3, max_iter=3, random_state=0)
        assert isinstance(detector, JointFedGMMDetector)
        assert (detector.n_components, detector.n_learners) == sizes
    prox = JointFedGMMDetector.pfl_baseline("FedProx", training=Training(mu_prox=0.5))
    assert prox.training.mu_prox == 0.5
    assert JointFedGMMDetector.pfl_baseline("FedProx").training.mu_prox == 0.01
    with pytest.raises(ValueError, match="unknown method"):
        JointFedGMMDetector.pfl_baseline("FedSGD")
    local = JointFedGMMDetector.pfl_baseline("Local", max_iter=3, random_state=0).fit(
        split.X_train, split.y_train, groups=split.groups_train
    )
    assert len(local.client_learners_) == 6
    p0, p1 = (
        local.predict_proba_y(split.X_test, client=0),
        local.predict_proba_y(split.X_test, client=1),
    )
    assert not np.allclose(p0, p1)  # each client its own classifier
    with pytest.raises(ValueError, match="has no shared learner"):
        local.predict_proba_y(split.X_test)
    local.log_px(split.X_test)  # p(x) needs no learner
    with pytest.raises(ValueError, match="no shared learner to adapt with labels"):
        local.adapt(split.X_test[:10], split.y_test[:10])


@pytest.mark.parametrize(
    "options", [{}, {"aggregate_learners": False}, {"pca_components": 4}, {"learner": "mlp"}]
)
def test_joint_models_save_and_load_exactly(split, tmp_path, options):
    detector = JointFedGMMDetector(3, n_learners=2, max_iter=3, random_state=0, **options).fit(
        split.X_train, np.array(["neg", "pos"])[split.y_train], groups=split.groups_train
    )
    detector.save(tmp_path / "joint.safetensors")
    loaded = load(tmp_path / "joint.safetensors")
    assert type(loaded) is JointFedGMMDetector
    assert JointFedGMMDetector.load(tmp_path / "joint.safetensors").get_params() == (
        detector.get_params()
    )
    X, y = split.X_test, np.array(["neg", "pos"])[split.y_test]
    assert loaded.classes_.tolist() == ["neg", "pos"]
    for name in ("weights_", "means_", "precisions_cholesky_", "client_joint_weights_"):
        # saved and read back: bit for bit
        np.testing.assert_array_equal(getattr(loaded, name), getattr(detector, name), name)
    # covariances_ are computed on load by inverting the precision factors: round-off apart
    assert_close_scaled(loaded.covariances_, detector.covariances_, rtol=1e-10)
    # Scores are computed again from the loaded tensors, whose memory layout may take another
    # BLAS path (measured 9e-15 apart with PCA): equal up to round-off relative to the scale.
    for client in (0, 4):
        assert_close_scaled(
            loaded.log_pxy(X, y, client=client), detector.log_pxy(X, y, client=client)
        )
    assert_close_scaled(loaded.decision_function(X), detector.decision_function(X))
    handle = detector.adapt(X[:40])
    # EM on those scores: round-off may grow over its iterations
    assert_close_scaled(loaded.adapt(X[:40]).weights, handle.weights, rtol=1e-10)


def test_custom_learner_factory_cannot_be_saved(split, tmp_path):
    detector = JointFedGMMDetector(
        2, n_learners=1, learner=lambda d, k: torch.nn.Linear(d, k), max_iter=2, random_state=0
    ).fit(split.X_train, split.y_train, groups=split.groups_train)
    assert detector.predict_y(split.X_test[:3]).shape == (3,)
    with pytest.raises(ValueError, match="custom learner factory cannot be saved"):
        detector.save(tmp_path / "custom.safetensors")


def test_pca_features_for_the_gaussians(split):
    detector = JointFedGMMDetector(3, n_learners=2, pca_components=5, max_iter=3, random_state=0)
    detector.fit(split.X_train, split.y_train, groups=split.groups_train)
    assert detector.means_.shape == (3, 5) and detector.pca_.components.shape == (5, 32)
    assert [r["kind"] for r in detector.history_[:2]] == ["moments_mean", "moments_scatter"]
    np.testing.assert_allclose(detector.score_samples(split.X_test), detector.log_px(split.X_test))
    with pytest.raises(ValueError, match="pca_components=40 must be <= n_features=32"):
        JointFedGMMDetector(2, pca_components=40).fit(
            split.X_train, split.y_train, groups=split.groups_train
        )


# ------------------------------------------------------------------ the algorithm layer
def _algorithm_runs(split, seed, *, pca_components=None, fraction=1.0):
    """The federation ``JointFedGMMDetector(3, n_learners=2, max_iter=4, tol=0,
    random_state=0, pca_components=..., fraction=...)`` runs, from the algorithm layer: one
    ``JointFedGMM`` run (PCA as its first step), or with ``fraction < 1`` and PCA a
    ``FederatedPCA`` run on every client, then ``JointFedGMM`` on the projected rows. Returns
    ``(runs, JointFedGMM's result, projection)``."""
    ids = np.unique(split.groups_train)
    rows = [torch.as_tensor(split.X_train[split.groups_train == c]) for c in ids]
    labels = [torch.as_tensor(split.y_train[split.groups_train == c]) for c in ids]
    options = {"device": torch.device("cpu"), "dtype": torch.float64}
    runs, data, step = [], list(zip(rows, labels, strict=True)), pca_components
    if pca_components is not None and fraction < 1:
        pca = run_simulation(
            FederatedPCA(pca_components, **options),
            rows,
            random_state=seed,
            privacy=PrivacyPolicy(),
        )
        views = [pca.state.projection.transform(r) for r in rows]
        runs, data, step = [pca], list(zip(views, labels, rows, strict=True)), None
    algorithm = JointFedGMM(
        3,
        2,
        2,
        learner_factory=linear_learner,
        n_learner_features=rows[0].shape[1],
        local_epochs=5,
        learning_rate=0.5,
        batch_size=32,
        optimizer="sgd",
        pca_components=step,
        covariance_type="full",
        init_params="kmeans",
        reg_covar=1e-6,
        tol=0.0,
        max_iter=4,
        kmeans_rounds=10,
        subset_size=100,
        random_state=seed,
        **options,
    )
    policy = PrivacyPolicy(min_rows=5, allow_raw_rows=False, max_clusters=DEFAULT_MAX_CLUSTERS)
    joint = run_simulation(algorithm, data, random_state=seed, privacy=policy, fraction=fraction)
    runs.append(joint)
    projection = runs[0].state.projection if pca_components is not None else None
    return runs, joint, projection


@pytest.mark.parametrize(("pca_components", "fraction"), [(None, 1.0), (4, 1.0), (4, 0.5)])
def test_the_detector_runs_the_algorithm_layers_federation(split, pca_components, fraction):
    """Same numbers as the algorithm layer run directly: the detector adds no computation of
    its own to the fit. With PCA, one run; when rounds sample clients, PCA first on every
    client (its two rounds need the same clients), as the detector's fit has always done."""
    detector = JointFedGMMDetector(
        3,
        n_learners=2,
        max_iter=4,
        tol=0.0,
        random_state=0,
        pca_components=pca_components,
        sampling=ClientSampling(fraction=fraction),
    ).fit(split.X_train, split.y_train, groups=split.groups_train)
    runs, joint, projection = _algorithm_runs(
        split, seed_from(0), pca_components=pca_components, fraction=fraction
    )
    state = joint.state
    # the same computation in the same order: equal to the bit
    np.testing.assert_array_equal(detector.means_, state.params.means.numpy())
    np.testing.assert_array_equal(
        detector.precisions_cholesky_, state.params.precisions_cholesky.numpy()
    )
    for mine, theirs in zip(detector.joint_state_.learners, state.learners, strict=True):
        for name, value in theirs.items():
            assert torch.equal(mine[name], value), name
    global_pi = state.joint_counts / state.joint_counts.sum()
    np.testing.assert_array_equal(
        detector.client_joint_weights_,
        torch.stack([state.client_joint_weights.get(c, global_pi) for c in range(6)]).numpy(),
    )
    assert detector.lower_bounds_ == list(state.lower_bounds)
    records = [record for run in runs for record in run.history]
    assert detector.n_rounds_ == len(records)
    assert [r["round"] for r in detector.history_] == list(range(1, len(records) + 1))
    assert [r["kind"] for r in detector.history_] == [r.kind for r in records]
    assert [r["n_replied"] for r in detector.history_] == [len(r.replied) for r in records]
    assert detector.bytes_up_ == sum(r.bytes_up for r in records)
    assert detector.bytes_down_ == sum(r.bytes_down for r in records)
    if projection is None:
        assert not hasattr(detector, "pca_")
    else:
        assert torch.equal(detector.pca_.components, projection.components)
        assert [r["kind"] for r in detector.history_[:2]] == ["moments_mean", "moments_scatter"]


# ------------------------------------------------------------------ estimator contract
def test_clone_and_params(fitted):
    params = fitted.get_params()
    assert params["n_learners"] == 3 and "mixture_weights" not in params
    fresh = clone(fitted)
    assert fresh.get_params() == params and not hasattr(fresh, "history_")
    assert fresh.set_params(n_learners=2).n_learners == 2
    with pytest.raises(ValueError, match="Invalid parameter"):
        fresh.set_params(prior=Prior())  # the x-only model's setting


def test_pyod_outputs_follow_log_px(fitted, split):
    """threshold_, labels_, predict and predict_proba score -log p(x), as FedGMMDetector."""
    assert_close_scaled(fitted.decision_scores_, -fitted.log_px(split.X_train), rtol=1e-10)
    labels = fitted.predict(split.X_test)
    np.testing.assert_array_equal(
        labels, (fitted.decision_function(split.X_test) > fitted.threshold_).astype(int)
    )
    assert fitted.predict_proba(split.X_test).shape == (len(split.X_test), 2)
    assert fitted.responsibilities(split.X_test, client=0).shape == (len(split.X_test), 3)
    np.testing.assert_allclose(fitted.component_weights(client=0), fitted.client_weights_[0])


def test_string_client_ids_and_dataframes(split, tmp_path):
    pd = pytest.importorskip("pandas")
    sites = np.array(["paris", "lyon", "nice", "rome", "oslo", "kiel"])
    frame = pd.DataFrame(split.X_train, columns=[f"f{j}" for j in range(32)])
    detector = JointFedGMMDetector(2, n_learners=1, max_iter=3, random_state=0).fit(
        frame, split.y_train, groups=sites[split.groups_train]
    )
    assert detector.client_ids_.tolist() == sorted(sites.tolist())
    rows = frame.iloc[:20]
    own = detector.log_pxy(rows, split.y_train[:20], client="lyon")
    detector.save(tmp_path / "sites.safetensors")
    loaded = load(tmp_path / "sites.safetensors")
    assert_close_scaled(loaded.log_pxy(rows, split.y_train[:20], client="lyon"), own)
    with pytest.raises(ValueError, match="client 'bonn' was not seen in fit"):
        detector.log_px(rows, client="bonn")
    with pytest.raises(ValueError, match="feature names"):
        detector.log_px(frame.iloc[:5, ::-1])


def test_from_model_is_refused(fitted, split):
    from fednovelty.runtime.simulation import SimulationResult

    result = SimulationResult(fitted.joint_state_, [], {})
    with pytest.raises(ValueError, match="does not rebuild joint models"):
        JointFedGMMDetector.from_model(result, split.X_train)


def test_the_docs_example_runs(capsys):
    text = (Path(__file__).resolve().parents[2] / "docs" / "joint.md").read_text()
    (block,) = re.findall(r"```python\n(.*?)```", text, flags=re.S)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the short fit's ConvergenceWarning
        exec(compile(block, "docs/joint.md", "exec"), {})
    predicted, scores = capsys.readouterr().out.strip().split("\n", 1)
    assert set(predicted.strip("[]").split()) <= {"0", "1"}
    assert len(scores.strip("[]").split()) == 5


def test_a_cnn_learner_fits_saves_and_loads(tmp_path):
    """learner='cnn' on 8 x 8 images flattened to 64 features: fits, classifies, and saves
    by name (no code in the file)."""
    rng = np.random.default_rng(0)
    X = rng.random((120, 64))
    y = (X[:, :32].sum(1) > X[:, 32:].sum(1)).astype(int)
    detector = JointFedGMMDetector(
        2,
        n_learners=1,
        learner="cnn",
        max_iter=2,
        random_state=0,
        training=Training(local_epochs=1),
    ).fit(X, y, groups=np.arange(120) % 3)
    assert detector.predict_y(X).shape == (120,)
    detector.save(tmp_path / "cnn.safetensors")
    loaded = load(tmp_path / "cnn.safetensors")
    assert loaded.learner == "cnn"
    assert_close_scaled(loaded.log_py_given_x(X, y), detector.log_py_given_x(X, y))
    with pytest.raises(ValueError, match="learner='cnn' needs square images"):
        JointFedGMMDetector(2, n_learners=1, learner="cnn", max_iter=1).fit(
            X[:, :50], y, groups=np.arange(120) % 3
        )


@pytest.mark.parametrize("covariance_type", ["full", "diag"])
def test_partial_fit_starts_from_the_fitted_precisions(split, covariance_type, monkeypatch):
    """partial_fit hands its algorithm the fitted precisions (inverse covariances), not their
    Cholesky factors: a full-covariance model continues, and the continuation's E-step starts
    from the fitted Gaussians."""
    det = JointFedGMMDetector(2, covariance_type=covariance_type, max_iter=2, random_state=0)
    det.fit(split.X_train, split.y_train, groups=split.groups_train)
    covariances = det.covariances_.copy()
    given = {}
    build = det._algorithm

    def recording(*args, **kwargs):
        given.update(kwargs)
        return build(*args, **kwargs)

    monkeypatch.setattr(det, "_algorithm", recording)
    det.partial_fit(split.X_train, split.y_train, groups=split.groups_train, rounds=1)
    precisions = given["precisions_init"].cpu().numpy()
    expected = np.linalg.inv(covariances) if covariance_type == "full" else 1.0 / covariances
    assert_close_scaled(precisions, expected, rtol=1e-8)
    assert np.isfinite(det.score_samples(split.X_test)).all()
