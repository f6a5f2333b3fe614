"""Finite inputs and scores: values whose square overflows the estimator's dtype are refused by
name at fit and at score, for every estimator (``_every_estimator``), the column by name for a
DataFrame and by number for an array; rows close to that limit
are scored without NaN, and a detector calls them outliers."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
from _every_estimator import COLUMNS, NAMES, build, data, fit, labelled, scores

from fednovelty import FedGMMDetector
from fednovelty.detectors._probability import outlier_labels
from fednovelty.detectors._validation import largest_value

pytestmark = [
    pytest.mark.filterwarnings("ignore::sklearn.exceptions.ConvergenceWarning"),
    pytest.mark.filterwarnings("ignore:init_params='subset' sends raw rows:UserWarning"),
]
_FITTED: dict = {}


def fitted(name: str):
    """``name``'s estimator fitted on ``data()`` (once per test session)."""
    if name not in _FITTED:
        X, y, groups = data()
        _FITTED[name] = fit(build(name), name, X, y, groups)
    return _FITTED[name]


def with_value(X: pd.DataFrame, row: int, column: int, value: float) -> pd.DataFrame:
    out = X.copy()
    out.iloc[row, column] = value
    return out


@pytest.mark.parametrize("name", NAMES)
def test_fit_refuses_a_value_whose_square_overflows(name):
    X, y, groups = data()
    detector = build(name)
    with pytest.raises(ValueError, match=r"X has 1e\+300 at row 7, column 'b': .*Rescale"):
        fit(detector, name, with_value(X, 7, 1, 1e300), y, groups)
    with pytest.raises(ValueError, match=r"X has -1e\+300 at row 0, column 'c'"):
        fit(detector, name, with_value(X, 0, 2, -1e300), y, groups)
    with pytest.raises(ValueError, match=r"X has -1e\+300 at row 0, column 2: "):
        fit(detector, name, with_value(X, 0, 2, -1e300).to_numpy(), y, groups)


@pytest.mark.parametrize("name", NAMES)
def test_scoring_refuses_a_value_whose_square_overflows(name):
    detector = fitted(name)
    X = data()[0].iloc[:4]
    with pytest.raises(ValueError, match=r"X has 1e\+300 at row 2, column 'a': .*Rescale"):
        scores(detector, name, with_value(X, 2, 0, 1e300))
    shuffled = with_value(X, 2, 0, 1e300).iloc[::-1]  # the row's index label stays 2
    with pytest.raises(ValueError, match=r"X has 1e\+300 at row 1 \(index 2\), column 'a'"):
        scores(detector, name, shuffled)
    if not labelled(name):
        with pytest.raises(ValueError, match=r"X has 1e\+300 at row 2, column 'a'"):
            detector.predict(with_value(X, 2, 0, 1e300))


def _extreme_rows(limit: float) -> pd.DataFrame:
    """Rows at 1e150 and just inside ``limit`` (one feature, all, mixed signs)."""
    inside = 0.99 * limit
    rows = [
        [0.0, 1e150, 0.0],
        [1e150, 1e150, -1e150],
        [0.0, inside, 0.0],
        [inside, inside, inside],
        [inside, -inside, inside],
    ]
    return pd.DataFrame(rows, columns=COLUMNS)


@pytest.mark.parametrize("name", NAMES)
def test_rows_near_the_limit_are_refused_by_name_or_scored_without_nan(name):
    detector = fitted(name)
    limit = largest_value(detector.dtype)
    for i in range(5):
        row = _extreme_rows(largest_value("float64")).iloc[[i]]
        if np.abs(row.to_numpy()).max() > limit:  # 1e150 in float32
            with pytest.raises(ValueError, match="where squares overflow float32"):
                scores(detector, name, row)
            continue
        row = _extreme_rows(limit).iloc[[i]] if i >= 2 else row
        out = scores(detector, name, row)
        assert not np.isnan(out).any(), (name, i, out)
        if labelled(name):
            np.testing.assert_allclose(out.sum(1), 1.0, rtol=1e-6)
        else:
            assert out[0] > detector.threshold_  # far out: more anomalous than the threshold
            assert detector.predict(row).tolist() == [1]
            assert not np.isnan(detector.predict_proba(row)).any()


def test_the_limit_is_the_detectors_dtype():
    X, _, groups = data()
    assert largest_value("float64") == pytest.approx(1.34e154, rel=1e-3)
    assert largest_value("float32") == pytest.approx(1.845e19, rel=1e-3)
    with pytest.raises(ValueError, match=r"X has 1e\+20 at row 3, column 'a'.*float32"):
        FedGMMDetector(2, dtype="float32", random_state=0).fit(
            with_value(X, 3, 0, 1e20), groups=groups
        )
    FedGMMDetector(2, max_iter=5, random_state=0).fit(with_value(X, 3, 0, 1e20), groups=groups)


def test_a_nan_score_is_an_outlier_not_an_inlier():
    assert outlier_labels(np.array([np.nan, 1.0, 3.0, np.inf, -np.inf]), 2.0).tolist() == [
        1,
        0,
        1,
        1,
        0,
    ]
