"""Federated MNIST: sizes, client grouping, label skew, no reuse, exclusions, errors."""

from __future__ import annotations

import numpy as np
import pytest

import fednovelty.datasets.mnist as mnist_module
from fednovelty.datasets.loaders import load_mnist
from fednovelty.datasets.mnist import FederatedImages, _take_counts, make_mnist_federated


@pytest.fixture(scope="module", autouse=True)
def mnist():
    """Read mnist.npz once per data folder for the whole module (each read takes ~0.2 s)."""
    cache: dict = {}

    def cached_load(data_dir=None):
        if data_dir not in cache:
            cache[data_dir] = load_mnist(data_dir)
        return cache[data_dir]

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(mnist_module, "load_mnist", cached_load)
        yield cached_load()


@pytest.fixture(scope="module")
def paper():
    """The paper's setting: 50 clients x 500 images, Dir(0.4)."""
    return make_mnist_federated(random_state=0)


def _max_class_share(y, groups):
    return float(
        np.mean(
            [np.bincount(y[groups == c]).max() / np.sum(groups == c) for c in np.unique(groups)]
        )
    )


def test_paper_setting_shapes_dtypes_and_groups(paper):
    assert isinstance(paper, FederatedImages)
    assert paper.X_train.shape == (25_000, 784) and paper.X_train.dtype == np.float64
    assert paper.images_train.shape == (25_000, 28, 28) and paper.images_train.dtype == np.uint8
    assert paper.X_test.shape == (5_000, 784)  # default test_per_client = 500 // 5
    assert paper.images_test.shape == (5_000, 28, 28)
    for arr in (paper.y_train, paper.groups_train, paper.indices_train, paper.y_test):
        assert arr.dtype == np.int64
    for groups, per in ((paper.groups_train, 500), (paper.groups_test, 100)):
        assert np.all(np.diff(groups) >= 0)
        np.testing.assert_array_equal(np.bincount(groups), np.full(50, per))
    assert paper.X_train.min() >= 0.0 and paper.X_train.max() <= 1.0
    np.testing.assert_array_equal(paper.classes, np.arange(10))
    assert paper.proportions.shape == (50, 10)
    np.testing.assert_allclose(paper.proportions.sum(axis=1), 1.0)
    assert paper.excluded["images"].shape == (0, 28, 28)
    assert paper.excluded["images"].dtype == np.uint8
    assert paper.excluded["y"].shape == (0,) and paper.excluded["y"].dtype == np.int64


def test_rows_are_the_mnist_images_they_claim(paper, mnist):
    # np.array_equal, not np.testing: the latter takes ~1 s on 20 million floats
    for split in ("train", "test"):
        idx = getattr(paper, f"indices_{split}")
        images = getattr(paper, f"images_{split}")
        assert np.array_equal(images, mnist[f"x_{split}"][idx])
        assert np.array_equal(getattr(paper, f"y_{split}"), mnist[f"y_{split}"][idx])
        X = getattr(paper, f"X_{split}")
        assert np.array_equal(X, images.reshape(-1, 784).astype(np.float64) / 255.0)


def test_no_image_used_twice(paper):
    assert np.unique(paper.indices_train).size == paper.indices_train.size
    assert np.unique(paper.indices_test).size == paper.indices_test.size


def test_label_skew_follows_alpha(paper):
    skewed = _max_class_share(paper.y_train, paper.groups_train)
    near_iid = make_mnist_federated(20, 500, alpha=1000.0, test_per_client=0, random_state=0)
    flat = _max_class_share(near_iid.y_train, near_iid.groups_train)
    assert skewed > 0.3  # measured 0.41 at seed 0
    assert 0.1 <= flat < 0.16  # measured 0.12; a perfectly even client gives 0.1
    # each client's test rows follow its train mixture: the top class agrees for most clients
    agree = [
        np.bincount(paper.y_train[paper.groups_train == c], minlength=10).argmax()
        == np.bincount(paper.y_test[paper.groups_test == c], minlength=10).argmax()
        for c in range(50)
    ]
    assert np.mean(agree) > 0.8


def test_excluded_digits_are_held_out(mnist):
    data = make_mnist_federated(10, 200, exclude_digits=(3, 7), random_state=1)
    np.testing.assert_array_equal(data.classes, [0, 1, 2, 4, 5, 6, 8, 9])
    assert data.proportions.shape == (10, 8)
    for y in (data.y_train, data.y_test):
        assert not np.isin(y, [3, 7]).any()
    ex = data.excluded
    assert set(np.unique(ex["y"]).tolist()) == {3, 7}
    assert ex["y"].size == np.isin(mnist["y_test"], [3, 7]).sum()  # all of the test split's
    assert ex["images"].shape == (ex["y"].size, 28, 28) and ex["images"].dtype == np.uint8
    np.testing.assert_array_equal(ex["images"], mnist["x_test"][ex["indices"]])
    np.testing.assert_array_equal(ex["y"], mnist["y_test"][ex["indices"]])
    assert not np.intersect1d(ex["indices"], data.indices_test).size
    single = make_mnist_federated(2, 10, exclude_digits=5, random_state=1)
    assert set(single.excluded["y"].tolist()) == {5}


def test_deterministic_per_seed():
    a = make_mnist_federated(5, 60, alpha=0.4, random_state=11)
    b = make_mnist_federated(5, 60, alpha=0.4, random_state=11)
    c = make_mnist_federated(5, 60, alpha=0.4, random_state=12)
    for name in ("indices_train", "indices_test", "y_train", "proportions"):
        np.testing.assert_array_equal(getattr(a, name), getattr(b, name))
    assert not np.array_equal(a.indices_train, c.indices_train)
    g1 = make_mnist_federated(5, 60, random_state=np.random.default_rng(3))
    g2 = make_mnist_federated(5, 60, random_state=np.random.default_rng(3))
    np.testing.assert_array_equal(g1.indices_train, g2.indices_train)


def test_pool_exhaustion_still_fills_every_client():
    # digits 0 and 1 only: 12 665 training and 2 115 test images; ask for 12 500 and 2 000
    data = make_mnist_federated(
        25, 500, alpha=0.1, exclude_digits=range(2, 10), test_per_client=80, random_state=2
    )
    np.testing.assert_array_equal(np.bincount(data.groups_train), np.full(25, 500))
    np.testing.assert_array_equal(np.bincount(data.groups_test), np.full(25, 80))
    assert np.unique(data.indices_train).size == 12_500
    assert np.unique(data.indices_test).size == 2_000
    assert set(np.unique(data.y_train).tolist()) == {0, 1}


def test_take_counts_redistributes_the_shortfall():
    rng = np.random.default_rng(0)
    want = np.array([5, 0, 0])
    left = np.array([2, 3, 10])
    take = _take_counts(want, left, np.array([0.98, 0.01, 0.01]), rng)
    assert take.sum() == 5 and np.all(take <= left) and take[0] == 2
    # the client's own classes are all used up: follow what is left
    take = _take_counts(np.array([4, 0]), np.array([0, 9]), np.array([1.0, 0.0]), rng)
    assert take.tolist() == [0, 4]


def test_zero_test_rows():
    data = make_mnist_federated(3, 10, test_per_client=0, random_state=0)
    assert data.X_test.shape == (0, 784) and data.images_test.shape == (0, 28, 28)
    assert data.groups_test.shape == (0,)


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"n_clients": 0}, "n_clients must be an int >= 1"),
        ({"n_clients": 2.5}, "n_clients"),
        ({"samples_per_client": 0}, "samples_per_client must be an int >= 1"),
        ({"alpha": 0.0}, "alpha must be a finite number > 0"),
        ({"alpha": np.inf}, "alpha"),
        ({"alpha": "0.4"}, "alpha"),
        ({"exclude_digits": (10,)}, "exclude_digits must hold digits"),
        ({"exclude_digits": (-1,)}, "exclude_digits must hold digits"),
        ({"exclude_digits": (1.0,)}, "exclude_digits must hold digits"),
        ({"exclude_digits": "3"}, "exclude_digits must be a sequence"),
        ({"exclude_digits": range(10)}, "all ten digits"),
        ({"test_per_client": -1}, "test_per_client must be an int >= 0"),
        ({"random_state": -3}, "random_state"),
        ({"n_clients": 200, "samples_per_client": 500}, r"samples_per_client=500 .* 60000"),
        ({"exclude_digits": range(1, 10), "samples_per_client": 200}, "only 5923"),
        ({"test_per_client": 300}, r"test_per_client=300 .* test split has only 10000"),
    ],
)
def test_bad_arguments(kwargs, match):
    with pytest.raises(ValueError, match=match):
        make_mnist_federated(**kwargs)


def test_missing_data_folder(tmp_path):
    with pytest.raises(FileNotFoundError, match=r"mnist\.npz"):
        make_mnist_federated(2, 10, data_dir=tmp_path)
