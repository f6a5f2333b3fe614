"""Loaders read the real files in ../shared/data (CI always has it beside the checkout)."""

from __future__ import annotations

import hashlib
from pathlib import Path

import numpy as np
import pytest

from fednovelty.datasets import loaders
from fednovelty.datasets.loaders import data_dir, list_adbench, load_adbench, load_mnist

DATA = loaders._default_data_dir()


@pytest.fixture(autouse=True)
def _no_env(monkeypatch):
    monkeypatch.delenv("FEDNOVELTY_DATA", raising=False)


def test_data_dir_default_is_shared_data_beside_checkout():
    repo = Path(loaders.__file__).resolve().parents[2]
    assert data_dir() == repo.parent / "shared" / "data"
    assert (data_dir() / "adbench").is_dir()


def test_data_dir_argument_then_env(tmp_path, monkeypatch):
    env_dir = tmp_path / "env"
    env_dir.mkdir()
    monkeypatch.setenv("FEDNOVELTY_DATA", str(env_dir))
    assert data_dir() == env_dir
    assert data_dir(tmp_path) == tmp_path  # the argument wins over the environment
    assert data_dir(str(tmp_path)) == tmp_path


def test_data_dir_missing_names_path_and_remedy(tmp_path, monkeypatch):
    missing = tmp_path / "nowhere"
    with pytest.raises(FileNotFoundError, match=r"nowhere \(from the data_dir argument\)"):
        data_dir(missing)
    monkeypatch.setenv("FEDNOVELTY_DATA", str(missing))
    with pytest.raises(FileNotFoundError, match=r"nowhere \(from \$FEDNOVELTY_DATA\).*FEDNOVELTY"):
        data_dir()
    with pytest.raises(FileNotFoundError, match="set the environment variable FEDNOVELTY_DATA"):
        load_adbench("4_breastw", data_dir=missing)


def test_list_adbench():
    names = list_adbench()
    assert names[:2] == ["1_ALOI", "4_breastw"]
    assert {"10_cover", "32_shuttle", "22_magic.gamma", "45_wine"} <= set(names)
    assert not any(n.endswith(".npz") for n in names)
    assert not any(n.startswith("MVTec") for n in names)
    with_cv = list_adbench(include_cv=True)
    assert with_cv[: len(names)] == names
    assert {"CIFAR10_0", "SVHN_0", "MVTec-AD_bottle"} <= set(with_cv)


def test_list_adbench_with_env(monkeypatch):
    monkeypatch.setenv("FEDNOVELTY_DATA", str(DATA))
    assert "4_breastw" in list_adbench()


def test_load_adbench_breastw():
    X, y = load_adbench("4_breastw")
    assert X.shape == (683, 9) and X.dtype == np.float64 and X.flags.c_contiguous
    assert y.shape == (683,) and y.dtype == np.int64
    assert set(np.unique(y)) == {0, 1}
    assert int(y.sum()) == 239  # 34.99 % anomalies, as MANIFEST.tsv says
    X2, y2 = load_adbench("4_breastw.npz", data_dir=DATA)
    np.testing.assert_array_equal(X, X2)
    np.testing.assert_array_equal(y, y2)


def test_load_adbench_cv_embeddings():
    X, y = load_adbench("MVTec-AD_toothbrush")
    assert X.shape == (102, 512) and X.dtype == np.float64
    assert y.dtype == np.int64 and 0 < y.mean() < 1


def test_load_returns_fresh_arrays_and_never_touches_files():
    path = DATA / "adbench" / "45_wine.npz"
    before = hashlib.sha256(path.read_bytes()).hexdigest()
    X, y = load_adbench("45_wine")
    X[:] = 0.0
    y[:] = 7
    X2, y2 = load_adbench("45_wine")
    assert X2.any() and set(np.unique(y2)) == {0, 1}
    assert hashlib.sha256(path.read_bytes()).hexdigest() == before


@pytest.mark.parametrize(
    ("name", "suggestion"),
    [("4_breast", "4_breastw"), ("cover", "10_cover"), ("cifar10", "CIFAR10_0")],
)
def test_unknown_name_suggests_close_matches(name, suggestion):
    with pytest.raises(
        ValueError,
        match=rf"unknown ADBench dataset '{name}'.*Did you mean .*"
        rf"{suggestion}",
    ):
        load_adbench(name)


def test_unknown_name_without_matches_and_bad_names():
    with pytest.raises(ValueError, match=r"'qqqqqq'.*list_adbench\(include_cv=True\) lists all"):
        load_adbench("qqqqqq")
    with pytest.raises(ValueError, match="unknown ADBench dataset"):
        load_adbench("../adbench/4_breastw")  # no escaping the two folders
    with pytest.raises(ValueError, match="name must be a string"):
        load_adbench(4)


def test_load_mnist():
    d = load_mnist()
    assert sorted(d) == ["x_test", "x_train", "y_test", "y_train"]
    assert d["x_train"].shape == (60000, 28, 28) and d["x_train"].dtype == np.uint8
    assert d["x_test"].shape == (10000, 28, 28) and d["x_test"].dtype == np.uint8
    assert d["y_train"].shape == (60000,) and d["y_test"].shape == (10000,)
    assert d["y_train"].dtype == np.int64
    assert np.array_equal(np.unique(d["y_train"]), np.arange(10))
    assert d["x_train"].max() == 255


def test_load_mnist_missing_file(tmp_path):
    with pytest.raises(FileNotFoundError, match=r"mnist\.npz"):
        load_mnist(data_dir=tmp_path)
