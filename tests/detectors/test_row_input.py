"""Detectors on rows read in chunks (fednovelty.detectors._row_input): FedGMMDetector fitted
from a memory map, a Parquet file and an iterable of chunks gives the model, training scores
and threshold of the in-memory fit; every mixture detector scores such rows as it scores
arrays; what cannot stream says so."""

from __future__ import annotations

import sys
import warnings
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from _tolerance import assert_close_scaled

from fednovelty import FedGMMDetector
from fednovelty.detectors import LocalGMMDetector
from fednovelty.detectors.base import MixtureDetector
from fednovelty.runtime.rows import ArrayRows, ChunkedRows, EmptyChunkWarning, ParquetRows

sys.path.insert(0, str(Path(__file__).parent))
from _every_estimator import build, data, fit

COLUMNS = ["a", "b", "c"]


def rows(n: int = 503, seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    centres = np.array([[0.0, 0.0, 0.0], [8.0, 0.0, 0.0], [0.0, 8.0, 4.0]])
    return centres[np.arange(n) % 3] + rng.normal(0, 1, (n, 3))


def detector(**params) -> FedGMMDetector:
    # DEM-kmeans: one global weight vector, k-FED and Lloyd start, standardised
    settings = {"n_components": 3, "mixture_weights": "global", "random_state": 0}
    return FedGMMDetector(**{**settings, **params})


def assert_same_fit(got: FedGMMDetector, expected: FedGMMDetector, rtol: float = 1e-10) -> None:
    assert got.n_iter_ == expected.n_iter_ and got.n_rounds_ == expected.n_rounds_
    for name in ("weights_", "means_", "covariances_", "decision_scores_"):
        assert_close_scaled(getattr(got, name), getattr(expected, name), rtol, err_msg=name)
    assert_close_scaled(got.threshold_, expected.threshold_, rtol)
    np.testing.assert_array_equal(got.labels_, expected.labels_)


def sources(tmp_path: Path, X: np.ndarray) -> dict:
    """The same rows as a memory map, a Parquet file and chunks, none of whose chunk sizes
    divides 503 rows."""
    np.save(tmp_path / "x.npy", X)
    pd.DataFrame(X, columns=COLUMNS).to_parquet(tmp_path / "x.parquet", row_group_size=150)
    parts = [X[:1], X[1:1], X[1:300], X[300:]]
    with pytest.warns(EmptyChunkWarning):
        chunked = ChunkedRows(lambda: parts, chunk_rows=89)
    return {
        "memmap": ArrayRows(np.load(tmp_path / "x.npy", mmap_mode="r"), chunk_rows=47),
        "parquet": ParquetRows(tmp_path / "x.parquet", chunk_rows=61),
        "chunks": chunked,
    }


@pytest.mark.parametrize("kind", ["memmap", "parquet", "chunks"])
def test_fit_from_a_row_source_is_the_in_memory_fit(tmp_path, kind):
    X = rows()
    groups = np.repeat([0, 1, 2], [150, 200, 153])
    source = sources(tmp_path, X)[kind]
    frame = pd.DataFrame(X, columns=COLUMNS)
    expected = detector().fit(frame if kind == "parquet" else X, groups=groups)
    got = detector().fit(source, groups=groups)
    assert_same_fit(got, expected)
    if kind == "parquet":
        assert list(got.feature_names_in_) == COLUMNS
    new = rows(211, seed=1)
    if kind == "parquet":
        new = pd.DataFrame(new, columns=COLUMNS)
    assert_close_scaled(got.score_samples(new), expected.score_samples(new), 1e-10)


def test_fit_and_scores_from_a_path_and_a_memmap(tmp_path):
    X = rows()
    np.save(tmp_path / "x.npy", X)
    expected = detector().fit(X)
    got = detector().fit(str(tmp_path / "x.npy"))  # one client, default chunks
    assert_same_fit(got, expected)
    memmap = np.load(tmp_path / "x.npy", mmap_mode="r")
    assert_same_fit(detector().fit(memmap), expected)
    chunked = ArrayRows(memmap, chunk_rows=13)
    for method in ("score_samples", "decision_function", "predict"):
        want = getattr(expected, method)(X)
        for given in (memmap, tmp_path / "x.npy", chunked):
            np.testing.assert_allclose(getattr(expected, method)(given), want, rtol=1e-12)
    np.testing.assert_allclose(
        expected.predict_proba(chunked), expected.predict_proba(X), rtol=1e-12
    )


@pytest.mark.filterwarnings("ignore::sklearn.exceptions.ConvergenceWarning")  # max_iter=4
def test_chunks_of_one_row_and_personal_weights(tmp_path):
    X = rows(90)
    groups = np.repeat([0, 1], 45)
    settings = {"mixture_weights": "personal", "max_iter": 4}
    expected = detector(**settings).fit(X, groups=groups)
    got = detector(**settings).fit(ArrayRows(X, chunk_rows=1), groups=groups)
    assert_same_fit(got, expected)
    assert_close_scaled(got.client_weights_, expected.client_weights_, 1e-10)


def test_every_mixture_detector_scores_chunks_as_arrays():
    X, y, groups = data()
    array = X.to_numpy()
    seen = set()
    for name in [
        "FedGenGMM",
        "DEM-kmeans",
        "ClusteredGMM-IFCA",
        "Local",
        "FedMFA",
        "FedVB",
        "streaming",
        "PFL-Local",
        "PFL-pFedEM",
    ]:  # one of each class
        estimator = build(name)
        seen.add(type(estimator))
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            fit(estimator, name, array, y, groups)
        chunked = ArrayRows(array, chunk_rows=7)
        np.testing.assert_allclose(
            estimator.decision_function(chunked), estimator.decision_function(array), rtol=1e-12
        )
        np.testing.assert_array_equal(estimator.predict(chunked), estimator.predict(array))
    classes = {  # the package's classes (other tests define probe subclasses)
        c
        for c in _subclasses(MixtureDetector)
        if not c.__name__.startswith("_") and c.__module__.startswith("fednovelty.")
    }
    assert classes <= seen | {c for c in classes if c.__subclasses__()}, classes - seen


def _subclasses(cls) -> set:
    out = set()
    for sub in cls.__subclasses__():
        out |= {sub} | _subclasses(sub)
    return out


def test_what_cannot_stream_says_so(tmp_path):
    X = rows(200)
    np.save(tmp_path / "x.npy", X)
    path = tmp_path / "x.npy"
    with pytest.raises(
        TypeError,
        match=r"LocalGMMDetector.fit reads its rows in memory.*"
        r"\['FedGMMDetector'[^\]]*\]",  # other tests' registered probes may follow
    ):
        LocalGMMDetector(client_components=2).fit(path)
    # an np.memmap is read into memory by a family that does not stream, as before
    memmap = np.load(path, mmap_mode="r")
    LocalGMMDetector(client_components=2, random_state=0).fit(memmap)
    for params, named in [
        ({"calibration": "conformal"}, "calibration='conformal'"),
        ({"init_params": "separated"}, "init_params='separated'"),
        ({"pca_components": 2}, "pca_components=2"),
    ]:
        with pytest.raises(TypeError, match=named):
            detector(**params).fit(path)
    fitted = detector().fit(path)
    with pytest.raises(TypeError, match=r"needs its rows in memory.*score_samples"):
        fitted.responsibilities(ArrayRows(X))
    with pytest.raises(ValueError, match="X has 2 features, but FedGMMDetector was fitted with 3"):
        fitted.score_samples(ArrayRows(X[:, :2]))


def test_bad_values_are_named_by_row_and_column(tmp_path):
    X = rows(300)
    X[201, 1] = np.nan
    with pytest.raises(ValueError, match=r"X has nan at row 201, column 1"):
        detector().fit(ArrayRows(X, chunk_rows=50))
    fitted = detector().fit(rows(300))
    X[201, 1] = 1e200
    with pytest.raises(ValueError, match=r"X has 1e\+200 at row 201, column 1: beyond"):
        fitted.score_samples(ArrayRows(X, chunk_rows=50))
