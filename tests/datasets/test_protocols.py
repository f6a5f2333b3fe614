"""Benchmark tasks: test rows stay out of training; scaling uses the training clients only."""

from __future__ import annotations

import numpy as np
import pytest

import fednovelty.datasets as datasets
from fednovelty.datasets import load_adbench
from fednovelty.datasets.protocols import NOISE_VARIANCE, make_task, parse_dataset, polar_rows

NAME = "4_breastw"  # 683 rows, 9 features, 239 anomalies


@pytest.fixture(scope="module")
def breastw():
    return load_adbench(NAME)


def test_novelty_trains_on_inliers_only_and_tests_on_held_out_inliers_and_all_anomalies(breastw):
    X, y = breastw
    task = make_task(NAME, "novelty", n_clients=5, alpha=0.5, seed=0)
    assert task.name == NAME and task.protocol == "novelty" and task.ood == "anomalies"
    assert (y[task.train_index] == 0).all()
    assert not np.intersect1d(task.train_index, task.test_index).size
    np.testing.assert_array_equal(task.y_test, y[task.test_index])
    assert set(np.flatnonzero(y == 1)) <= set(task.test_index.tolist())
    n_inliers = int((y == 0).sum())
    assert (task.y_test == 0).sum() == round(0.3 * n_inliers)
    assert task.X_train.shape == (n_inliers - round(0.3 * n_inliers), X.shape[1])
    assert task.X_test.shape == (task.y_test.size, X.shape[1])


def test_outlier_protocol_is_a_stratified_70_30_split_of_all_rows(breastw):
    _, y = breastw
    task = make_task(NAME, "outlier", n_clients=5, alpha=0.5, seed=0)
    assert not np.intersect1d(task.train_index, task.test_index).size
    np.testing.assert_array_equal(
        np.sort(np.concatenate([task.train_index, task.test_index])), np.arange(y.size)
    )
    assert task.test_index.size == pytest.approx(0.3 * y.size, abs=2)
    assert y[task.train_index].mean() == pytest.approx(y.mean(), abs=0.01)  # contaminated
    assert task.y_test.mean() == pytest.approx(y.mean(), abs=0.01)


def test_scaling_is_merged_from_the_training_clients_only(breastw):
    X, _ = breastw
    task = make_task(NAME, "novelty", n_clients=4, alpha=0.3, seed=1)
    raw = X[task.train_index]
    np.testing.assert_array_equal(task.scaling.data_min, raw.min(axis=0))
    np.testing.assert_array_equal(task.scaling.data_max, raw.max(axis=0))
    clients = [raw[task.groups_train == c] for c in range(4)]
    merged = datasets.MinMaxScaling.from_clients(clients)
    np.testing.assert_array_equal(merged.data_min, task.scaling.data_min)
    np.testing.assert_allclose(task.X_test, task.scaling.transform(X[task.test_index]))
    varying = raw.max(axis=0) > raw.min(axis=0)
    np.testing.assert_allclose(task.X_train.min(axis=0)[varying], 0.0)
    np.testing.assert_allclose(task.X_train.max(axis=0)[varying], 1.0)


def test_clients_same_seed_same_task_and_min_size():
    a = make_task(NAME, "novelty", n_clients=6, alpha=0.1, seed=3)
    b = make_task(NAME, "novelty", n_clients=6, alpha=0.1, seed=3)
    np.testing.assert_array_equal(a.groups_train, b.groups_train)
    np.testing.assert_array_equal(a.X_test, b.X_test)
    counts = np.bincount(a.groups_train, minlength=6)
    assert counts.size == 6 and counts.min() >= 10  # default min_size on enough rows
    c = make_task(NAME, "novelty", n_clients=6, alpha=0.1, seed=4)
    assert not np.array_equal(a.groups_train, c.groups_train)


def test_iid_partition_and_caps():
    task = make_task(NAME, "novelty", n_clients=7, alpha=None, partition="iid", seed=0,
                     max_train=100, max_test=50)  # fmt: skip
    counts = np.bincount(task.groups_train)
    assert task.X_train.shape[0] == 100 and counts.max() - counts.min() <= 1
    assert task.X_test.shape[0] == 50
    assert 0 < task.y_test.mean() < 1


@pytest.mark.skipif(not hasattr(datasets, "quantity_partition"), reason="no quantity scheme")
def test_quantity_partition_reads_alpha_as_groups_per_client():
    task = make_task(NAME, "novelty", n_clients=10, alpha=2, partition="quantity", seed=0)
    assert np.unique(task.groups_train).size <= 10
    with pytest.raises(ValueError, match="groups per client"):
        make_task(NAME, "novelty", n_clients=10, alpha=0.5, partition="quantity", seed=0)


def test_noise_ood_halves_the_held_out_inliers_and_adds_noise_after_scaling(breastw):
    X, y = breastw
    task = make_task(f"{NAME}:noise", "novelty", n_clients=3, alpha=0.5, seed=0)
    assert task.name == f"{NAME}:noise" and task.ood == "noise"
    assert (y[task.test_index] == 0).all()  # the dataset's own anomalies are not used
    assert abs(int(task.y_test.sum()) - int((task.y_test == 0).sum())) <= 1
    clean = task.scaling.transform(X[task.test_index])
    novel = task.y_test == 1
    np.testing.assert_allclose(task.X_test[~novel], clean[~novel])
    noise = task.X_test[novel] - clean[novel]
    assert noise.var() == pytest.approx(NOISE_VARIANCE, rel=0.15)


def test_mnist_task_pca_features_and_transformed_ood():
    task = make_task("mnist", "novelty", n_clients=5, alpha=0.5, seed=0, max_train=1500,
                     max_test=300)  # fmt: skip
    assert task.name == "mnist" and task.ood == "transforms"
    assert task.X_train.shape == (1500, 24) and task.X_test.shape == (300, 24)
    assert task.y_test.sum() == 150
    rotated = make_task("mnist:rotate", "novelty", n_clients=5, alpha=0.5, seed=0,
                        max_train=1500, max_test=300)  # fmt: skip
    assert rotated.ood == "rotate"
    np.testing.assert_allclose(rotated.X_train, task.X_train)  # same training clients
    assert not np.allclose(rotated.X_test[rotated.y_test == 1], task.X_test[task.y_test == 1])


@pytest.mark.parametrize(
    ("args", "kwargs", "match"),
    [
        ((NAME, "transductive"), {}, "protocol must be one of"),
        ((NAME, "novelty"), {"partition": "skewed"}, "partition must be one of"),
        ((f"{NAME}:noise", "outlier"), {}, "novelty protocol only"),
        ((f"{NAME}:rotate", "novelty"), {}, "transforms images"),
        (("mnist", "outlier"), {}, "novelty protocol only"),
        ((f"{NAME}:noise", "novelty"), {"ood": "anomalies"}, "names ood='noise'"),
        (("4_breast", "novelty"), {}, "Did you mean 4_breastw"),
        ((NAME, "novelty"), {"alpha": None}, "needs alpha"),
    ],
)
def test_bad_arguments_say_what_is_wrong(args, kwargs, match):
    options = {"n_clients": 3, "alpha": 0.5, "seed": 0} | kwargs
    with pytest.raises(ValueError, match=match):
        make_task(*args, **options)


def test_parse_dataset():
    assert parse_dataset("10_cover:noise") == ("10_cover", "noise")
    assert parse_dataset("4_breastw") == ("4_breastw", None)


def test_bundled_digits_need_no_data_folder(tmp_path):
    """``make_task("digits")``: scikit-learn's digits, digit 0 novel, clients skewed over the
    other digits, 16 federated principal axes; it reads no data folder."""
    from sklearn.datasets import load_digits

    from fednovelty.datasets.protocols import DIGITS_NOVEL

    digits = load_digits().target
    task = make_task("digits", "novelty", n_clients=5, alpha=0.5, seed=0, data_dir=tmp_path)
    assert task.X_train.shape[1] == task.X_test.shape[1] == 16
    assert (digits[task.train_index] != DIGITS_NOVEL).all()
    novel = task.test_index[task.y_test == 1]
    assert set(digits[novel].tolist()) == {DIGITS_NOVEL}
    assert (digits == DIGITS_NOVEL).sum() == novel.size  # every image of the novel digit
    assert len(set(task.groups_train.tolist())) == 5
    outlier = make_task("digits", "outlier", n_clients=3, alpha=0.5, seed=0)
    assert (digits[outlier.train_index] == DIGITS_NOVEL).any()  # trains on contaminated rows
    with pytest.raises(ValueError, match="the bundled digits take"):
        make_task("digits:rotate", "novelty", n_clients=3, alpha=0.5)


def test_femnist_writers_are_the_clients():
    task = make_task("femnist", "novelty", n_clients=4, alpha=0.5, seed=0, max_test=200)
    assert (task.partition, task.alpha) == ("writers", None)
    assert set(task.groups_train.tolist()) == set(range(4))
    np.testing.assert_array_equal(task.partition_labels, task.groups_train)
    n_test = task.y_test.size
    assert task.X_train.shape[1] == 25 and task.y_test.sum() == n_test - n_test // 2  # half novel
    assert task.groups_test.shape == task.y_test.shape
    assert set(task.groups_test.tolist()) <= set(range(4))
    again = make_task("femnist:rotate", "novelty", n_clients=4, alpha=None, seed=0, max_test=200)
    assert again.name == "femnist:rotate"
    with pytest.raises(ValueError, match="femnist has no anomaly labels"):
        make_task("femnist:anomalies", "novelty", n_clients=2, alpha=None)


def test_polar_rows_are_unit_directions_and_log_norms():
    X = np.array([[3.0, 4.0], [0.0, 0.0], [0.0, 2.0]])
    unit, log_norm = polar_rows(X)
    np.testing.assert_allclose(unit, [[0.6, 0.8], [0.0, 0.0], [0.0, 1.0]])
    np.testing.assert_allclose(log_norm, np.log([5.0, 1.0 / 255.0, 2.0]))


def test_femnist_polar_features_see_the_ink_a_shrunk_image_lost():
    polar = make_task("femnist:scale", "novelty", n_clients=4, alpha=None, seed=0, max_test=200)
    ink = polar.X_test[:, -1]  # the log norm, min-max scaled
    novel = polar.y_test == 1
    assert ink[novel].mean() < ink[~novel].mean() - 0.1  # half the size: about half the norm
    pixels = make_task(
        "femnist:scale", n_clients=4, alpha=None, seed=0, max_test=200, image_features="pixels"
    )
    assert pixels.X_train.shape[1] == 24
    np.testing.assert_array_equal(pixels.y_test, polar.y_test)  # same draw, other features


def test_femnist_paper_transform_is_an_ood_set():
    task = make_task("femnist:inv-flip-rot", n_clients=3, alpha=None, seed=0, max_test=100)
    assert task.ood == "inv-flip-rot" and task.y_test.sum() > 0


@pytest.mark.parametrize(
    ("dataset", "value", "match"),
    [(NAME, "polar", "applies to the image sets"), ("femnist", "hog", "must be one of")],
)
def test_image_features_errors_are_named(dataset, value, match):
    with pytest.raises(ValueError, match=match):
        make_task(dataset, n_clients=3, alpha=0.5, image_features=value)
