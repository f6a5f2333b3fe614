"""Input errors say where and what to do, for every estimator (``_every_estimator``): NaN or
inf by the first bad cell's row and column (by name for a DataFrame) and how many; a text
column by name with one bad value and its row; repeated column names refused; other columns
at scoring than in fit named (missing, unexpected) or counted; scikit-learn's feature-name
warnings when only one of fit and scoring has column names."""

from __future__ import annotations

import warnings

import numpy as np
import pandas as pd
import pytest
from _every_estimator import COLUMNS, NAMES, build, data, fit, labelled, scores

from fednovelty.detectors._validation import check_X

pytestmark = [
    pytest.mark.filterwarnings("ignore::sklearn.exceptions.ConvergenceWarning"),
    pytest.mark.filterwarnings("ignore:init_params='subset' sends raw rows:UserWarning"),
]
_FITTED: dict = {}
NO_NAMES = "X does not have valid feature names, but .* was fitted with feature names"


def fitted(name: str, frame: bool = True):
    """``name``'s estimator fitted on ``data()``, a DataFrame or (``frame=False``) its
    array (once per test session)."""
    if (name, frame) not in _FITTED:
        X, y, groups = data()
        _FITTED[name, frame] = fit(build(name), name, X if frame else X.to_numpy(), y, groups)
    return _FITTED[name, frame]


def with_nans(X: pd.DataFrame) -> pd.DataFrame:
    """``X`` with NaN at row 5 of column ``c`` and row 17 of column ``a``, inf at row 20 of
    ``c``: the first bad cell in row order is (5, 'c')."""
    out = X.copy()
    out.loc[5, "c"] = np.nan
    out.loc[17, "a"] = np.nan
    out.loc[20, "c"] = np.inf
    return out


def with_text(X: pd.DataFrame) -> pd.DataFrame:
    """``X`` with the text ``'bad'`` at row 9 of column ``b`` (and ``'n/a'`` at row 30)."""
    out = X.astype({"b": object})
    out.loc[9, "b"] = "bad"
    out.loc[30, "b"] = "n/a"
    return out


NAN_IN_FRAME = (
    r"X contains NaN or inf in column 'c' at row 5 \(value nan; 3 such cells in all, in 2 "
    r"column\(s\) \['a', 'c'\]\)\. Remove or impute"
)
TEXT_IN_FRAME = (
    r"X must be numeric .*column 'b' holds text: 'bad' at row 9 \(values that are not "
    r"numbers: 2 of 160\)\. Encode"
)


# ------------------------------------------------------------------- NaN or inf, text
@pytest.mark.parametrize("name", NAMES)
def test_fit_names_the_first_bad_cell_by_row_and_column_name(name):
    X, y, groups = data()
    with pytest.raises(ValueError, match=NAN_IN_FRAME):
        fit(build(name), name, with_nans(X), y, groups)
    with pytest.raises(ValueError, match=r"NaN or inf in column 2 at row 5 \(value nan; 3 "):
        fit(build(name), name, with_nans(X).to_numpy(), y, groups)


@pytest.mark.parametrize("name", NAMES)
def test_scoring_names_the_first_bad_cell(name):
    X = with_nans(data()[0]).iloc[:24]
    with pytest.raises(ValueError, match=NAN_IN_FRAME):
        scores(fitted(name), name, X)
    shuffled = X.iloc[::-1]  # row 3 by position, index label 20: the inf
    with pytest.raises(ValueError, match=r"column 'c' at row 3 \(index 20\) \(value inf"):
        scores(fitted(name), name, shuffled)


@pytest.mark.parametrize("name", NAMES)
def test_a_text_column_is_named_with_a_bad_value_and_its_row(name):
    X, y, groups = data()
    with pytest.raises(ValueError, match=TEXT_IN_FRAME):
        fit(build(name), name, with_text(X), y, groups)
    with pytest.raises(ValueError, match=TEXT_IN_FRAME):
        scores(fitted(name), name, with_text(X))
    with pytest.raises(ValueError, match=r"X must be numeric .*could not convert it to float"):
        fit(build(name), name, [[0.0, 1.0, 2.0], [0.0, 1.0]], y, groups)  # rows of two lengths
    with pytest.raises(ValueError, match=r"column 1 holds text: 'bad' at row 9"):
        fit(build(name), name, with_text(X).to_numpy(), y, groups)
    with pytest.raises(ValueError, match=r"column 1 holds text: 'bad' at row 9 \(values"):
        fit(build(name), name, with_text(X).to_numpy().tolist(), y, groups)  # a list of rows


# ------------------------------------------------------------------- column names
@pytest.mark.parametrize("name", NAMES)
def test_repeated_column_names_are_refused(name):
    X, y, groups = data()
    X.columns = ["a", "a", "c"]
    with pytest.raises(ValueError, match=r"X has duplicate column names: 'a' \(2 times\).*Rename"):
        fit(build(name), name, X, y, groups)
    with pytest.raises(ValueError, match="duplicate column names: 'a'"):
        scores(fitted(name), name, X)


@pytest.mark.parametrize("name", NAMES)
def test_an_array_of_another_width_is_counted(name):
    rows = data()[0].to_numpy()[:4, :2]
    with pytest.raises(ValueError, match=r"X has 2 features, but .* fitted with 3 .*Pass rows"):
        scores(fitted(name, frame=False), name, rows)


@pytest.mark.parametrize("name", NAMES)
def test_other_columns_at_scoring_are_named(name):
    X = data()[0].iloc[:4]
    other = X.drop(columns="b").assign(z=1.0, y=2.0)
    expected = r"missing \['b'\] \(seen in fit\); unexpected \['z', 'y'\] \(not seen in fit\)"
    with pytest.raises(ValueError, match=expected):
        scores(fitted(name), name, other)
    with pytest.raises(ValueError, match=r"unexpected \['z'\]"):
        scores(fitted(name), name, X.assign(z=1.0))
    with pytest.raises(ValueError, match="the same names in another order"):
        scores(fitted(name), name, X[COLUMNS[::-1]])


@pytest.mark.parametrize("name", NAMES)
def test_names_on_one_side_only_warn_as_scikit_learn_does(name):
    X = data()[0].iloc[:4]
    with pytest.warns(UserWarning, match=NO_NAMES):
        scores(fitted(name), name, X.to_numpy())
    with pytest.warns(UserWarning, match="X has feature names, but .* fitted without feature"):
        scores(fitted(name, frame=False), name, X)


@pytest.mark.parametrize("name", NAMES)
def test_frames_throughout_give_no_feature_name_warning(name):
    X, y, groups = data()
    with warnings.catch_warnings():
        warnings.filterwarnings("error", message=".*feature names")
        detector = fit(build(name), name, X, y, groups)
        scores(detector, name, X.iloc[:4])
        if not labelled(name):
            detector.predict(X.iloc[:4])
            detector.predict_proba(X.iloc[:4])


@pytest.mark.parametrize("name", ["FedGMM", "KNN-markers", "PFL-FedAvg"])
def test_an_array_after_a_frame_warns_once_per_call(name):
    detector = fitted(name)
    rows = data()[0].to_numpy()[:4]
    calls = [lambda: scores(detector, name, rows)]
    if not labelled(name):
        calls += [lambda: detector.predict(rows), lambda: detector.predict_proba(rows)]
    for call in calls:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            call()
        assert len([w for w in caught if "feature names" in str(w.message)]) <= 1


# ------------------------------------------------------------------- check_X itself
def test_check_X_names_missing_and_unexpected_columns():
    X = data()[0]
    fitted_names = np.asarray(COLUMNS, dtype=object)
    with pytest.raises(ValueError, match=r"FedGMMDetector saw in fit: missing \['a'\]"):
        check_X(X.drop(columns="a"), n_features=3, fitted_by="FedGMMDetector",
                feature_names_in=fitted_names)  # fmt: skip
    with pytest.warns(UserWarning, match=NO_NAMES):
        check_X(X.to_numpy(), n_features=3, fitted_by="D", feature_names_in=fitted_names)
    with pytest.warns(UserWarning, match="X has feature names, but D was fitted without"):
        check_X(X, n_features=3, fitted_by="D", feature_names_in=None)


def test_rows_check_X_returned_are_not_warned_about_again():
    X = data()[0]
    fitted_names = np.asarray(COLUMNS, dtype=object)
    rows = check_X(X)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        again = check_X(rows, n_features=3, fitted_by="D", feature_names_in=fitted_names)
    np.testing.assert_array_equal(again, X.to_numpy())
    assert np.shares_memory(rows, again)
