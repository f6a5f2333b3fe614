"""OOD shifts: geometry on hand-made images, dtypes, purity, noise variance, derangements."""

from __future__ import annotations

import numpy as np
import pytest

from fednovelty.datasets.shifts import (
    TRANSFORMS,
    add_gaussian_noise,
    hflip,
    invert,
    permute_labels,
    rotate90,
    scale_images,
    transform_images,
)


def _dot(h, w, row, col, dtype=np.uint8, value=255):
    img = np.zeros((1, h, w), dtype=dtype)
    img[0, row, col] = value
    return img


def _blob(size=28, half=4, dtype=np.float64, value=1.0):
    """A centred square of side 2 * half on an even-sized canvas (centre at (size - 1) / 2)."""
    img = np.zeros((1, size, size), dtype=dtype)
    lo, hi = size // 2 - half, size // 2 + half
    img[0, lo:hi, lo:hi] = value
    return img


def _centre_of_mass(img):
    rows, cols = np.indices(img.shape)
    mass = img.sum()
    return (rows * img).sum() / mass, (cols * img).sum() / mass


# --- rotate90 / hflip -------------------------------------------------------------------------


def test_rotate90_moves_a_single_pixel_counter_clockwise():
    img = _dot(3, 4, 0, 2)  # h=3, w=4, pixel at (row 0, col 2)
    out = rotate90(img)
    assert out.shape == (1, 4, 3)
    assert out.dtype == np.uint8
    # counter-clockwise: (row, col) -> (w - 1 - col, row)
    assert list(zip(*np.nonzero(out[0]), strict=True)) == [(1, 0)]
    np.testing.assert_array_equal(out, np.rot90(img, 1, axes=(1, 2)))


def test_rotate90_turn_counts():
    img = np.arange(2 * 3 * 5).reshape(2, 3, 5)
    np.testing.assert_array_equal(rotate90(img, 4), img)
    np.testing.assert_array_equal(rotate90(img, -1), rotate90(img, 3))
    np.testing.assert_array_equal(rotate90(rotate90(img), 1), rotate90(img, 2))
    np.testing.assert_array_equal(rotate90(img, 2), img[:, ::-1, ::-1])


def test_hflip_mirrors_columns():
    img = _dot(3, 4, 1, 0)
    out = hflip(img)
    assert out.shape == img.shape and out.dtype == img.dtype
    assert list(zip(*np.nonzero(out[0]), strict=True)) == [(1, 3)]
    np.testing.assert_array_equal(hflip(out), img)


# --- scale_images -----------------------------------------------------------------------------


def test_scale_half_shrinks_a_centred_blob_about_the_centre():
    img = _blob(28, half=4)  # 8 x 8 square, rows/cols 10..17
    out = scale_images(img, 0.5)
    assert out.shape == img.shape and out.dtype == np.float64
    # ink scales by factor**2 and stays centred at (13.5, 13.5)
    np.testing.assert_allclose(out.sum(), 0.25 * img.sum(), rtol=1e-12)
    np.testing.assert_allclose(_centre_of_mass(out[0]), (13.5, 13.5), atol=1e-9)
    # support shrinks to about half the side: all ink within rows/cols 11..16
    rows, cols = np.nonzero(out[0])
    assert rows.min() >= 11 and rows.max() <= 16 and cols.min() >= 11 and cols.max() <= 16

    # and the spread halves
    def spread(a):
        r = np.arange(a.shape[0]) - 13.5
        return np.sqrt((a.sum(axis=1) * r**2).sum() / a.sum())

    assert spread(out[0]) == pytest.approx(0.5 * spread(img[0]), rel=0.15)


def test_scale_off_centre_pixel_moves_towards_the_centre():
    img = _dot(29, 29, 4, 24, dtype=np.float64, value=1.0)  # centre (14, 14), offset (-10, +10)
    out = scale_images(img, 0.5)
    r, c = _centre_of_mass(out[0])
    assert r == pytest.approx(9.0) and c == pytest.approx(19.0)  # offset halves to (-5, +5)


def test_scale_one_is_identity_and_two_enlarges():
    rng = np.random.default_rng(0)
    img = rng.integers(0, 256, size=(3, 10, 12), dtype=np.uint8)
    np.testing.assert_array_equal(scale_images(img, 1.0), img)
    blob = _blob(28, half=3)
    big = scale_images(blob, 2.0)
    np.testing.assert_allclose(_centre_of_mass(big[0]), (13.5, 13.5), atol=1e-9)
    assert big.sum() == pytest.approx(4 * blob.sum(), rel=0.1)


def test_scale_large_factor_crops_to_the_centre():
    img = np.zeros((1, 28, 28))
    img[0, 0, :] = 1.0  # ink only on the top edge
    assert np.all(scale_images(img, 3.0) == 0)


@pytest.mark.parametrize("dtype", [np.uint8, np.float32, np.float64])
def test_scale_keeps_dtype_and_range(dtype):
    rng = np.random.default_rng(1)
    img = rng.integers(0, 256, size=(4, 28, 28)).astype(dtype)
    if np.issubdtype(dtype, np.floating):
        img /= 255
    for factor in (0.3, 0.5, 1.7):
        out = scale_images(img, factor)
        assert out.dtype == dtype and out.shape == img.shape
        assert out.min() >= 0 and out.max() <= img.max() * (1 + 1e-6)


def test_scale_uint8_rounds():
    img = np.zeros((1, 5, 5), dtype=np.uint8)
    img[0, 1:4, 1:4] = 200
    assert scale_images(img, 0.5)[0, 2].tolist() == [0, 50, 200, 50, 0]
    row = scale_images(img, 0.5)[0, 1].tolist()  # 200 * 1/16 = 12.5, rounded either way
    assert row[2] == 50 and row[0] == row[4] == 0 and row[1] in (12, 13)


def test_scale_empty_stack():
    assert scale_images(np.zeros((0, 28, 28), dtype=np.uint8), 0.5).shape == (0, 28, 28)


# --- invert -----------------------------------------------------------------------------------


def test_invert_uint8_and_float():
    img = np.array([[[0, 10, 255]]], dtype=np.uint8)
    out = invert(img)
    assert out.dtype == np.uint8 and out.tolist() == [[[255, 245, 0]]]
    f = img.astype(np.float32) / 255
    out_f = invert(f)
    assert out_f.dtype == np.float32
    np.testing.assert_allclose(out_f, 1.0 - f)
    np.testing.assert_array_equal(invert(invert(img)), img)


def test_invert_rejects_signed_integers():
    with pytest.raises(ValueError, match="unsigned"):
        invert(np.zeros((1, 2, 2), dtype=np.int64))


# --- transform_images -------------------------------------------------------------------------


def test_transform_images_applies_names_in_order():
    rng = np.random.default_rng(2)
    img = rng.integers(0, 256, size=(3, 28, 28), dtype=np.uint8)
    out = transform_images(img, ["scale", "rotate", "hflip", "invert"], factor=0.6)
    expected = invert(hflip(rotate90(scale_images(img, 0.6))))
    np.testing.assert_array_equal(out, expected)
    np.testing.assert_array_equal(transform_images(img, "hflip"), hflip(img))
    np.testing.assert_array_equal(transform_images(img, ["rotate"], k=3), rotate90(img, 3))
    same = transform_images(img, [])
    np.testing.assert_array_equal(same, img)
    assert not np.shares_memory(same, img)
    assert set(TRANSFORMS) == {"scale", "rotate", "hflip", "invert"}


def test_transform_images_order_matters_for_non_commuting_pair():
    img = _dot(4, 4, 0, 1)
    a = transform_images(img, ["rotate", "hflip"])
    b = transform_images(img, ["hflip", "rotate"])
    assert not np.array_equal(a, b)


def test_transform_images_unknown_name():
    with pytest.raises(ValueError, match="names must come from"):
        transform_images(np.zeros((1, 2, 2)), ["rotate", "blur"])


# --- purity and shape errors ------------------------------------------------------------------


@pytest.mark.parametrize(
    "func",
    [
        rotate90,
        hflip,
        invert,
        lambda a: scale_images(a, 0.5),
        lambda a: scale_images(a, 1.0),
        lambda a: transform_images(a, list(TRANSFORMS)),
    ],
)
def test_image_functions_do_not_touch_their_input(func):
    img = np.random.default_rng(3).integers(0, 256, size=(2, 6, 6), dtype=np.uint8)
    before = img.copy()
    out = func(img)
    np.testing.assert_array_equal(img, before)
    assert not np.shares_memory(out, img)


@pytest.mark.parametrize("func", [rotate90, hflip, invert, lambda a: scale_images(a, 0.5)])
def test_image_functions_need_a_3d_stack(func):
    with pytest.raises(ValueError, match=r"images must be a 3-D stack"):
        func(np.zeros((28, 28)))
    with pytest.raises(ValueError, match="integer or float dtype"):
        func(np.zeros((1, 2, 2), dtype=bool))


@pytest.mark.parametrize("factor", [0, -0.5, np.nan, np.inf, True, "0.5"])
def test_scale_bad_factor(factor):
    with pytest.raises(ValueError, match="factor must be a finite number > 0"):
        scale_images(np.zeros((1, 4, 4)), factor)
    with pytest.raises(ValueError, match="factor"):
        transform_images(np.zeros((1, 4, 4)), ["scale"], factor=factor)


@pytest.mark.parametrize("k", [1.5, True, "1"])
def test_rotate_bad_k(k):
    with pytest.raises(ValueError, match="k must be an int"):
        rotate90(np.zeros((1, 4, 4)), k)


# --- add_gaussian_noise -----------------------------------------------------------------------


def test_noise_has_the_requested_variance():
    X = np.full((40_000, 5), 3.0)
    out = add_gaussian_noise(X, 0.25, random_state=0)
    noise = out - X
    np.testing.assert_allclose(noise.mean(axis=0), 0.0, atol=0.02)  # se 0.0025
    np.testing.assert_allclose(noise.var(axis=0), 0.25, rtol=0.03)  # se ~0.7%
    assert np.all(X == 3.0)  # input untouched


def test_noise_seeding_dtypes_and_zero_variance():
    X = np.random.default_rng(4).normal(size=(50, 3))
    a = add_gaussian_noise(X, 1.0, random_state=7)
    np.testing.assert_array_equal(a, add_gaussian_noise(X, 1.0, random_state=7))
    assert not np.array_equal(a, add_gaussian_noise(X, 1.0, random_state=8))
    zero = add_gaussian_noise(X, 0.0, random_state=0)
    np.testing.assert_array_equal(zero, X)
    assert not np.shares_memory(zero, X)
    assert add_gaussian_noise(X.astype(np.float32), 0.1, random_state=0).dtype == np.float32
    assert add_gaussian_noise(np.ones((2, 2), dtype=np.int64), 0.1).dtype == np.float64


@pytest.mark.parametrize("variance", [-1.0, np.nan, np.inf, None, True])
def test_noise_bad_variance(variance):
    with pytest.raises(ValueError, match="variance must be a finite number >= 0"):
        add_gaussian_noise(np.zeros((2, 2)), variance)


def test_noise_bad_X_and_random_state():
    with pytest.raises(ValueError, match="X must be 2-D"):
        add_gaussian_noise(np.zeros(3), 1.0)
    with pytest.raises(ValueError, match="NaN"):
        add_gaussian_noise(np.array([[np.nan]]), 1.0)
    with pytest.raises(ValueError, match="real numbers"):
        add_gaussian_noise(np.array([["a"]]), 1.0)
    with pytest.raises(ValueError, match="random_state"):
        add_gaussian_noise(np.zeros((2, 2)), 1.0, random_state=-1)


# --- permute_labels ---------------------------------------------------------------------------


@pytest.mark.parametrize("n_classes", [2, 3, 5, 10])
def test_permute_labels_is_a_derangement_for_every_seed(n_classes):
    y = np.arange(n_classes).repeat(3)
    for seed in range(200):
        new_y, perm = permute_labels(y, random_state=seed)
        assert perm.dtype == np.int64 and new_y.dtype == np.int64
        assert sorted(perm.tolist()) == list(range(n_classes))
        assert np.all(perm != np.arange(n_classes))
        np.testing.assert_array_equal(new_y, perm[y])
        assert np.all(new_y != y)


def test_permute_labels_two_classes_swap_and_three_classes_reach_both_derangements():
    _, perm = permute_labels([0, 1, 1], random_state=0)
    assert perm.tolist() == [1, 0]
    seen = {tuple(permute_labels([0, 1, 2], random_state=s)[1].tolist()) for s in range(50)}
    assert seen == {(1, 2, 0), (2, 0, 1)}


def test_permute_labels_seeding_purity_and_absent_classes():
    y = np.array([0, 0, 2, 2])  # class 1 and 3 absent
    before = y.copy()
    a = permute_labels(y, n_classes=4, random_state=5)
    b = permute_labels(y, n_classes=4, random_state=5)
    np.testing.assert_array_equal(a[0], b[0])
    np.testing.assert_array_equal(a[1], b[1])
    assert a[1].shape == (4,)
    np.testing.assert_array_equal(y, before)
    new_empty, perm = permute_labels(np.array([], dtype=np.int64), n_classes=3, random_state=0)
    assert new_empty.shape == (0,) and perm.shape == (3,)


@pytest.mark.parametrize(
    ("y", "kwargs", "match"),
    [
        (np.array([0.0, 1.0]), {}, "integer class ids"),
        (np.array([-1, 1]), {}, ">= 0"),
        (np.array([0, 3]), {"n_classes": 3}, "outside range"),
        (np.array([0, 0]), {}, "n_classes must be an int >= 2"),
        (np.array([0, 1]), {"n_classes": 1}, "n_classes must be an int >= 2"),
        (np.zeros((2, 2), dtype=int), {}, "y must be 1-D"),
        (np.array([], dtype=int), {}, "pass n_classes"),
        (np.array([0, 1]), {"random_state": "x"}, "random_state"),
    ],
)
def test_permute_labels_bad_arguments(y, kwargs, match):
    with pytest.raises(ValueError, match=match):
        permute_labels(y, **kwargs)
