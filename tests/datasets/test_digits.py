"""Tests of fednovelty.datasets.digits: scikit-learn's bundled digits, no data folder."""

import numpy as np

from fednovelty.datasets import load_bundled_digits
from fednovelty.datasets.digits import DIGITS_NOVEL, DIGITS_PCA_COMPONENTS


def test_bundled_digits_are_the_8x8_images_with_their_digits(monkeypatch, tmp_path):
    """Read with the data folder pointed at an empty folder: scikit-learn's files only."""
    monkeypatch.setenv("FEDNOVELTY_DATA", str(tmp_path))
    X, digits = load_bundled_digits()
    assert X.shape == (1797, 64) and X.dtype == np.float64
    assert digits.shape == (1797,) and digits.dtype == np.int64
    assert X.min() == 0.0 and X.max() == 16.0
    counts = np.bincount(digits, minlength=10)
    assert counts.size == 10 and counts.min() >= 170  # every digit, about 180 images each
    assert 0 <= DIGITS_NOVEL <= 9 and 1 <= DIGITS_PCA_COMPONENTS <= 64
    X_again, digits_again = load_bundled_digits()
    np.testing.assert_array_equal(X_again, X)
    np.testing.assert_array_equal(digits_again, digits)
