"""scikit-learn's bundled handwritten digits: real image data that needs no data folder.

``sklearn.datasets.load_digits`` reads 1,797 8x8 grey-level images (pixel values 0..16) of the
digits 0-9 from files shipped inside the scikit-learn package, so a user who installed
fednovelty without ``../shared/data`` still has real data to train on. The benchmark task
``make_task("digits")`` (:mod:`fednovelty.datasets.protocols`) builds on
:func:`load_bundled_digits`: the images of ``DIGITS_NOVEL`` are the novel class, the other
digits are split among the clients by a seeded Dirichlet draw over the digit labels, and the
pixels are projected on
``DIGITS_PCA_COMPONENTS`` federated principal axes (many of the 64 pixels are constant in
training, which a density cannot score). ``fednovelty demo`` and the dashboard fall back to it
when the data folder is absent.
"""

from __future__ import annotations

import numpy as np

__all__ = [
    "BUNDLED_DIGITS",
    "DIGITS_NOVEL",
    "DIGITS_PCA_COMPONENTS",
    "load_bundled_digits",
]

#: The dataset name of scikit-learn's bundled digits in ``make_task`` and ``fednovelty bench``.
BUNDLED_DIGITS = "digits"
#: The digit whose images are the novel class (the anomalies of the outlier protocol).
DIGITS_NOVEL = 0
#: Principal axes the 64 pixels are projected on.
DIGITS_PCA_COMPONENTS = 16


def load_bundled_digits() -> tuple[np.ndarray, np.ndarray]:
    """scikit-learn's bundled handwritten digits, read from scikit-learn's own files.

    Returns:
        ``(X, digits)``: pixels (1797, 64) float64 in [0, 16] (row = the 8x8 image, row-major)
        and the digit of each image (1797,) int64 in 0..9.
    """
    from sklearn.datasets import load_digits

    bunch = load_digits()
    return np.asarray(bunch.data, dtype=np.float64), np.asarray(bunch.target, dtype=np.int64)
