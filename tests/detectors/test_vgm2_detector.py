"""VGM2Classifier (fednovelty.detectors.vgm2): fit / predict per client for every method,
errors naming the argument, the recorded communication, save and load."""

from __future__ import annotations

import numpy as np
import pytest
from _saved_files import rewrite, with_flat_options, with_keys_renamed
from _tolerance import assert_close_scaled

from fednovelty.detectors.options import Robustness, Training
from fednovelty.detectors.vgm2 import VGM2Classifier
from fednovelty.exceptions import ModelFormatError

FAST = {
    "rounds": 4,
    "training": Training(local_epochs=2, batch_size=32),
    "hidden": 16,
    "embedding_dim": 4,
}


def make_data(seed: int = 0):
    """Four clients, two of four classes each (Gaussians at 3 e_k in 6 features)."""
    rng = np.random.default_rng(seed)
    groups = np.repeat(np.arange(4), 60)
    y = np.where(np.arange(240) % 60 < 30, groups, (groups + 1) % 4)
    X = rng.normal(0, 0.4, (240, 6)) + 3 * np.eye(6)[y]
    return X, np.array(["a", "b", "c", "d"])[y], groups


@pytest.fixture(scope="module")
def data():
    return make_data()


@pytest.fixture(scope="module")
def fitted(data):
    X, y, groups = data
    return VGM2Classifier(**FAST, clients_per_round=4, random_state=0).fit(X, y, groups)


def test_vgm2_predicts_each_client_and_records_markers(fitted, data) -> None:
    X, y, groups = data
    for client in range(4):
        rows = groups == client
        proba = fitted.predict_proba_y(X[rows], client=client)
        np.testing.assert_allclose(proba.sum(1), 1.0, rtol=1e-6)
        assert np.mean(fitted.predict_y(X[rows], client=client) == y[rows]) > 0.9
    assert fitted.markers_.shape == (4, 2, 5, 3)
    assert fitted.bytes_per_client_round_ == 2 * 5 * 3 * 4 + 2 * 4
    assert len(fitted.history_) == 4 and all("loss" in r for r in fitted.history_)
    assert fitted.sampled_counts_.tolist() == [4, 4, 4, 4]
    assert list(fitted.classes_) == ["a", "b", "c", "d"]


@pytest.mark.parametrize("method", ["local", "fedavg", "prototype"])
def test_baselines_fit_and_predict(data, method) -> None:
    X, y, groups = data
    training = Training(local_epochs=4, batch_size=32, learning_rate=0.02)
    settings = {**FAST, "training": training, "clients_per_round": 4}
    clf = VGM2Classifier(method, **settings, random_state=0).fit(X, y, groups)
    rows = groups == 1
    pred = clf.predict_y(X[rows], client=1)
    assert pred.shape == (60,)
    if method != "fedavg":
        assert np.mean(pred == y[rows]) > 0.8
    else:
        assert clf.predict_proba_y(X[:5]).shape == (5, 4)  # the global model, no client
    assert not hasattr(clf, "markers_")


def test_two_clients_per_round_and_determinism(data) -> None:
    X, y, groups = data
    a = VGM2Classifier(**FAST, random_state=3).fit(X, y, groups)
    b = VGM2Classifier(**FAST, random_state=3).fit(X, y, groups)
    assert all(r["n_sampled"] == 2 for r in a.history_)
    assert a.sampled_counts_.sum() == 8
    assert_close_scaled(a.markers_, b.markers_, rtol=1e-10)
    assert_close_scaled(a.predict_proba_y(X[:20], 0), b.predict_proba_y(X[:20], 0), rtol=1e-10)


def test_errors_name_the_argument(fitted, data) -> None:
    X, y, groups = data
    with pytest.raises(ValueError, match="requires y to be passed"):
        VGM2Classifier(**FAST).fit(X, None, groups)
    with pytest.raises(ValueError, match="client="):
        fitted.predict_y(X[:3])
    with pytest.raises(ValueError, match="unknown client 9"):
        fitted.predict_y(X[:3], client=9)
    with pytest.raises(ValueError, match="method"):
        VGM2Classifier("fedprox").fit(X, y, groups)
    with pytest.raises(ValueError, match="fitted with 6 features"):
        fitted.predict_y(X[:3, :4], client=0)


def test_prediction_rule_is_read_at_prediction_time(fitted, data) -> None:
    X, _, groups = data
    rows = X[groups == 2]
    nearest = fitted.predict_proba_y(rows, client=2)
    fitted.set_params(prediction="top_pi")
    try:
        top = fitted.predict_proba_y(rows, client=2)
    finally:
        fitted.set_params(prediction="nearest")
    assert not np.allclose(nearest, top)


def test_save_and_load_give_the_same_predictions(fitted, data, tmp_path) -> None:
    X, _, groups = data
    path = tmp_path / "vgm2.safetensors"
    fitted.save(path)
    loaded = VGM2Classifier.load(path)
    for client in range(4):
        rows = X[groups == client]
        # recomputed from the loaded (copied) encoders and markers
        assert_close_scaled(
            loaded.predict_proba_y(rows, client=client),
            fitted.predict_proba_y(rows, client=client),
            rtol=1e-12,
        )
    np.testing.assert_array_equal(loaded.markers_, fitted.markers_)  # copied
    assert loaded.bytes_per_client_round_ == fitted.bytes_per_client_round_
    with pytest.raises(ModelFormatError):
        from fednovelty.detectors.cam import ClusteredFLClassifier

        ClusteredFLClassifier.load(path)


def test_files_saved_under_the_old_names_load(data, tmp_path) -> None:
    X, y, groups = data
    clf = VGM2Classifier(
        "fedavg",
        **FAST,
        posterior_merge="natural",
        random_state=0,
        robustness=Robustness(aggregation="trimmed"),
    ).fit(X, y, groups)
    new, old = tmp_path / "new.safetensors", tmp_path / "old.safetensors"
    clf.save(new)
    clf.save(old)
    # as files were written when aggregation named the markers' rule
    old_names = {"posterior_merge": "aggregation", "aggregation": "robust_aggregation"}
    rewrite(old, lambda text: with_keys_renamed(with_flat_options(text), old_names))
    for path in (new, old):  # a file with the current names is not renamed
        loaded = VGM2Classifier.load(path)
        assert (loaded.posterior_merge, loaded.robustness.aggregation) == ("natural", "trimmed")
        assert_close_scaled(loaded.predict_proba_y(X[:10]), clf.predict_proba_y(X[:10]), rtol=1e-12)


def test_save_and_load_fedavg(data, tmp_path) -> None:
    X, y, groups = data
    clf = VGM2Classifier("fedavg", **FAST, random_state=0).fit(X, y, groups)
    clf.save(tmp_path / "f.safetensors")
    loaded = VGM2Classifier.load(tmp_path / "f.safetensors")
    assert_close_scaled(loaded.predict_proba_y(X[:10]), clf.predict_proba_y(X[:10]), rtol=1e-12)


def make_images(n_per_client: int, seed: int):
    """Four clients, two of four classes each, as 16 x 16 one-channel images flattened to
    256 features: noise plus a class's bright stroke (a vertical or horizontal bar, a
    top-left or bottom-right square)."""
    rng = np.random.default_rng(seed)
    groups = np.repeat(np.arange(4), n_per_client)
    first_half = np.arange(4 * n_per_client) % n_per_client < n_per_client // 2
    y = np.where(first_half, groups, (groups + 1) % 4)
    images = rng.normal(0, 0.3, (y.size, 16, 16))
    strokes = (np.s_[3:13, 7:9], np.s_[7:9, 3:13], np.s_[2:6, 2:6], np.s_[10:14, 10:14])
    for i, label in enumerate(y):
        images[i][strokes[label]] += 1.5
    return images.reshape(y.size, 256), y, groups


@pytest.mark.parametrize("method", ["vgm2", "local", "fedavg"])
def test_convnet_encoder_fits_images_predicts_and_round_trips(method, tmp_path) -> None:
    """encoder='convnet' trains a ConvNet (4-D convolution weights) on 16 x 16 images; the
    personalised methods classify each client's held-out images far above chance (1/2: two
    classes per client); save and load give the same predictions (FedAvg: the global
    network's, checked against the ConvNet's shapes)."""
    X, y, groups = make_images(40, seed=0)
    X_test, y_test, groups_test = make_images(20, seed=1)
    training = Training(local_epochs=3, batch_size=16, learning_rate=0.01)
    settings = {**FAST, "training": training, "hidden": 16}
    clf = VGM2Classifier(
        method, **settings, encoder="convnet", clients_per_round=4, random_state=0
    ).fit(X, y, groups)
    shapes = [tuple(p.shape) for p in clf.algorithm_.encoder.parameters()]
    assert shapes[0] == (16, 1, 5, 5) and shapes[2] == (32, 16, 5, 5)
    client = None if method == "fedavg" else 0
    if method != "fedavg":
        for c in range(4):
            rows = groups_test == c
            assert np.mean(clf.predict_y(X_test[rows], client=c) == y_test[rows]) > 0.85
    path = tmp_path / "convnet.safetensors"
    clf.save(path)
    loaded = VGM2Classifier.load(path)
    assert loaded.encoder == "convnet"
    assert_close_scaled(
        loaded.predict_proba_y(X_test[:20], client=client),
        clf.predict_proba_y(X_test[:20], client=client),
        rtol=1e-12,
    )


def test_convnet_refuses_rows_that_are_no_square_image() -> None:
    X, y, groups = make_images(10, seed=0)
    for width, shown in ((63, "no square"), (64, "8 x 8")):
        with pytest.raises(ValueError, match=rf"encoder='convnet'.*n_features={width} \({shown}\)"):
            VGM2Classifier(encoder="convnet", rounds=1).fit(X[:, :width], y, groups)
    with pytest.raises(ValueError, match="encoder"):
        VGM2Classifier(encoder="resnet").fit(X, y, groups)
