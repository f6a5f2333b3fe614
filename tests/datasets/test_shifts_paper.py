"""The FedGMM paper's joint shift (Appendix C.3): each row checked by hand against numpy's
rotation, flip and inversion, the permutation applied to labels, the exact split."""

from __future__ import annotations

import numpy as np
import pytest

from fednovelty.datasets.shifts import PAPER_TRANSFORM, SHIFT_KINDS, joint_shift_quarters


def _images(n: int = 41, size: int = 5, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    return rng.integers(0, 256, (n, size, size), dtype=np.uint8), rng.integers(0, 4, n)


def test_each_row_is_unchanged_transformed_or_relabelled_as_its_kind_says():
    images, y = _images()
    out, labels, kind, perm = joint_shift_quarters(images, y, n_classes=4, random_state=1)
    assert SHIFT_KINDS == ("unchanged", "transformed", "permuted")
    assert PAPER_TRANSFORM == ("rotate", "hflip", "invert")
    assert np.bincount(kind, minlength=3).tolist() == [20, 10, 11]  # n // 2, then halves
    assert sorted(perm.tolist()) == [0, 1, 2, 3] and not np.any(perm == np.arange(4))
    for i in range(len(y)):
        if kind[i] == 1:  # rotate 90° counter-clockwise, mirror left-right, 255 - x
            expected = 255 - np.rot90(images[i])[:, ::-1]
            np.testing.assert_array_equal(out[i], expected)
            assert labels[i] == y[i]
        else:
            np.testing.assert_array_equal(out[i], images[i])
            assert labels[i] == (perm[y[i]] if kind[i] == 2 else y[i])
    assert out.dtype == np.uint8 and labels.dtype == np.int64
    assert not np.shares_memory(out, images)


def test_a_given_permutation_is_used_and_the_split_follows_the_seed():
    images, y = _images(n=12)
    perm = np.array([2, 0, 3, 1])
    _, labels, kind, used = joint_shift_quarters(images, y, permutation=perm, random_state=3)
    np.testing.assert_array_equal(used, perm)
    np.testing.assert_array_equal(labels[kind == 2], perm[y[kind == 2]])
    again = joint_shift_quarters(images, y, permutation=perm, random_state=3)[2]
    np.testing.assert_array_equal(again, kind)
    other = joint_shift_quarters(images, y, permutation=perm, random_state=4)[2]
    assert not np.array_equal(other, kind)


def test_other_transforms_and_float_images():
    images = np.random.default_rng(0).random((8, 4, 4))
    y = np.arange(8) % 2
    out, _, kind, _ = joint_shift_quarters(images, y, transforms="hflip", random_state=0)
    np.testing.assert_array_equal(out[kind == 1], images[kind == 1][:, :, ::-1])
    assert out.dtype == images.dtype


@pytest.mark.parametrize(
    ("images", "y", "kwargs", "match"),
    [
        (np.zeros((3, 4, 4)), np.zeros(2, dtype=int), {}, "one label per image"),
        (np.zeros((3, 4, 5)), np.zeros(3, dtype=int), {}, "square"),
        (np.zeros((3, 4, 4)), np.zeros(3, dtype=int), {"permutation": [0, 0]}, "permutation"),
        (np.zeros((3, 4, 4)), np.array([0, 1, 2]), {"permutation": [1, 0]}, "range\\(2\\)"),
        (np.zeros((3, 4, 4)), np.zeros(3, dtype=int), {"transforms": ["spin"]}, "unknown"),
    ],
)
def test_bad_arguments_are_refused(images, y, kwargs, match):
    with pytest.raises(ValueError, match=match):
        joint_shift_quarters(images, y, random_state=0, **kwargs)
