"""Out-of-distribution shifts: image transforms, feature noise and label permutations.

These make the "novel" side of a novelty-detection benchmark from in-distribution data:
covariate shift in images or features, and concept shift in labels.

- geometry on image stacks of shape (n_images, height, width): :func:`rotate90`,
  :func:`hflip`, :func:`scale_images`; intensity: :func:`invert`; a named sequence of them:
  :func:`transform_images`;
- feature noise on (n_samples, n_features): :func:`add_gaussian_noise`;
- concept shift on labels: :func:`permute_labels` (a derangement of the classes, so every label
  changes while p(x) stays the same);
- both at once, as the FedGMM paper builds its MNIST training and in-domain test data
  (Appendix C.3): :func:`joint_shift_quarters` (half the rows unchanged, a quarter's images
  transformed, a quarter's labels permuted).

Every function is pure numpy and returns new arrays; none modifies its input. Image functions
keep the input's dtype: ``uint8`` in, ``uint8`` out (interpolated values rounded and clipped to
[0, 255]); float in, the same float dtype out (floats are taken to be intensities in [0, 1]).
Pixel value 0 is the background everywhere (MNIST's convention), so :func:`scale_images` pads
with 0.

:func:`scale_images` is separable bilinear interpolation written in numpy as two small matrix
products per stack (no per-image loop, no scipy): exact at ``factor=1``, and when shrinking the
kernel widens with ``1 / factor`` so every input pixel contributes. Point-sampled bilinear
interpolation (``scipy.ndimage.zoom(order=1)``) reads only the 2 x 2 neighbours of each sample
point, so below ``factor=0.5`` it skips pixels and thin strokes can break up.

Randomness: the two random functions take ``random_state`` (None, an int or a
``numpy.random.Generator``; never the global state); the same int gives the same numbers.
"""

from __future__ import annotations

import numbers
from collections.abc import Sequence

import numpy as np
from numpy.typing import ArrayLike

from fednovelty.datasets.partition import _check_int, _rng

__all__ = [
    "PAPER_TRANSFORM",
    "SHIFT_KINDS",
    "TRANSFORMS",
    "add_gaussian_noise",
    "hflip",
    "invert",
    "joint_shift_quarters",
    "permute_labels",
    "rotate90",
    "scale_images",
    "transform_images",
]

TRANSFORMS = ("scale", "rotate", "hflip", "invert")
#: what :func:`joint_shift_quarters` did to each row: 0 nothing, 1 its image transformed,
#: 2 its label permuted.
SHIFT_KINDS = ("unchanged", "transformed", "permuted")
#: the FedGMM paper's transform ``T`` of the shifted images (Sec. 4.1, Appendix C.3).
PAPER_TRANSFORM = ("rotate", "hflip", "invert")
_MAX_TRIES = 10_000  # derangement rejection sampling accepts with probability ~1/e per try


def _check_images(images: ArrayLike, name: str = "images") -> np.ndarray:
    arr = np.asarray(images)
    if arr.ndim != 3:
        raise ValueError(
            f"{name} must be a 3-D stack of shape (n_images, height, width); got shape "
            f"{arr.shape}. Reshape flat rows first, e.g. X.reshape(-1, 28, 28)."
        )
    if not (np.issubdtype(arr.dtype, np.integer) or np.issubdtype(arr.dtype, np.floating)):
        raise ValueError(f"{name} must have an integer or float dtype; got {arr.dtype}.")
    return arr


def _check_real(value, name: str, *, positive: bool) -> float:
    if (
        not isinstance(value, numbers.Real)
        or isinstance(value, bool)
        or not np.isfinite(value)
        or (value <= 0 if positive else value < 0)
    ):
        bound = "> 0" if positive else ">= 0"
        raise ValueError(f"{name} must be a finite number {bound}; got {value!r}.")
    return float(value)


def _cast_like(values: np.ndarray, dtype: np.dtype) -> np.ndarray:
    """Float results back to ``dtype``: integers are rounded and clipped to the dtype's range."""
    if np.issubdtype(dtype, np.integer):
        info = np.iinfo(dtype)
        return np.clip(np.rint(values), info.min, info.max).astype(dtype)
    return values.astype(dtype, copy=False)


def rotate90(images: ArrayLike, k: int = 1) -> np.ndarray:
    """Rotate every image by ``k * 90`` degrees counter-clockwise.

    Args:
        images: shape (n_images, height, width), any integer or float dtype.
        k: number of quarter turns; negative turns clockwise. Any int.

    Returns:
        New array of shape (n_images, width, height) (the same as the input when ``k`` is even)
        and the input's dtype. A pixel at (row, col) of an ``h x w`` image moves to
        (w - 1 - col, row) for ``k=1``.

    Example:
        >>> rotate90(np.array([[[1, 2], [3, 4]]]))[0].tolist()
        [[2, 4], [1, 3]]
    """
    arr = _check_images(images)
    if not isinstance(k, numbers.Integral) or isinstance(k, bool):
        raise ValueError(f"k must be an int (number of quarter turns); got {k!r}.")
    return np.ascontiguousarray(np.rot90(arr, k=int(k), axes=(1, 2)))


def hflip(images: ArrayLike) -> np.ndarray:
    """Mirror every image left-right.

    Args:
        images: shape (n_images, height, width), any integer or float dtype.

    Returns:
        New array of the same shape and dtype; column ``j`` becomes column ``width - 1 - j``.

    Example:
        >>> hflip(np.array([[[1, 2], [3, 4]]]))[0].tolist()
        [[2, 1], [4, 3]]
    """
    arr = _check_images(images)
    return np.ascontiguousarray(arr[:, :, ::-1])


def _zoom_matrix(size: int, factor: float) -> np.ndarray:
    """Weights of shape (size, size) that zoom one axis by ``factor`` about its centre.

    Output pixel ``i`` is centred on input position ``src = c + (i - c) / factor`` with
    ``c = (size - 1) / 2`` and averages the inputs ``j`` with the triangle weight
    ``max(0, 1 - |j - src| / s)``, ``s = max(1, 1 / factor)``, normalised over all integer
    ``j``. Taps outside the image are background (0) and are simply dropped, so a row of the
    matrix sums to less than 1 near the border. ``s = 1`` is plain linear interpolation.
    """
    centre = (size - 1) / 2.0
    src = centre + (np.arange(size, dtype=np.float64) - centre) / factor
    support = max(1.0, 1.0 / factor)
    low = min(np.floor(src[0] - support), 0.0)
    high = max(np.ceil(src[-1] + support), size - 1.0)
    taps = np.arange(low, high + 1.0)  # every tap with weight > 0, and the whole image
    weights = np.maximum(0.0, 1.0 - np.abs(taps[None, :] - src[:, None]) / support)
    weights /= weights.sum(axis=1, keepdims=True)
    inside = (taps >= 0) & (taps < size)
    return weights[:, inside]


def scale_images(images: ArrayLike, factor: float) -> np.ndarray:
    """Zoom every image about its centre by ``factor``, keeping the image size.

    ``factor=0.5`` shrinks the content to half its width and height and fills the border with
    0 (background); ``factor=2`` enlarges it and crops what falls outside; ``factor=1`` returns
    an exact copy. The centre of an ``h x w`` image is the point ((h - 1) / 2, (w - 1) / 2),
    which stays fixed. Bilinear interpolation; when shrinking, the bilinear (triangle) kernel is
    widened by ``1 / factor`` so each output pixel averages the input pixels it covers instead of
    sampling one of them (PIL's ``BILINEAR`` resize and torchvision's ``antialias=True`` do the
    same). Ink is then conserved up to the border: the pixel sum scales by ``factor ** 2``.

    Args:
        images: shape (n_images, height, width), integer (e.g. uint8) or float.
        factor: zoom factor, a finite number > 0.

    Returns:
        New array of the same shape and dtype. Integer inputs are rounded and clipped to their
        dtype's range.

    Example:
        >>> img = np.zeros((1, 5, 5), dtype=np.uint8); img[0, 1:4, 1:4] = 200
        >>> scale_images(img, 0.5)[0, 2].tolist()
        [0, 50, 200, 50, 0]
    """
    arr = _check_images(images)
    factor = _check_real(factor, "factor", positive=True)
    _, height, width = arr.shape
    work = np.float32 if arr.dtype == np.float32 else np.float64
    rows = _zoom_matrix(height, factor).astype(work)
    cols = _zoom_matrix(width, factor).astype(work)
    out = rows @ arr.astype(work) @ cols.T  # (h, h) @ (n, h, w) @ (w, w)
    return _cast_like(out, arr.dtype)


def invert(images: ArrayLike) -> np.ndarray:
    """Swap foreground and background: ``max - x`` pixel-wise.

    ``max`` is the dtype's largest value for unsigned integers (255 for ``uint8``) and 1.0 for
    floats, which are taken to be intensities in [0, 1] (MNIST scaled by 1/255); a float pixel
    of 0.2 becomes 0.8. Rescale other float ranges to [0, 1] first.

    Args:
        images: shape (n_images, height, width), unsigned integer or float.

    Returns:
        New array of the same shape and dtype.

    Raises:
        ValueError: signed integer input, whose maximum intensity is ambiguous.

    Example:
        >>> invert(np.array([[[0, 255]]], dtype=np.uint8)).tolist()
        [[[255, 0]]]
    """
    arr = _check_images(images)
    if np.issubdtype(arr.dtype, np.signedinteger):
        raise ValueError(
            f"images must be unsigned integers (e.g. uint8, max 255) or floats in [0, 1]; got "
            f"{arr.dtype}. Cast with images.astype(np.uint8) or divide by the maximum first."
        )
    top = np.iinfo(arr.dtype).max if np.issubdtype(arr.dtype, np.integer) else 1.0
    return (arr.dtype.type(top) - arr).astype(arr.dtype, copy=False)


def transform_images(
    images: ArrayLike, names: str | Sequence[str], *, factor: float = 0.5, k: int = 1
) -> np.ndarray:
    """Apply named transforms in order, e.g. ``["scale", "rotate"]``.

    Args:
        images: shape (n_images, height, width); see each transform for allowed dtypes.
        names: one name or a sequence of names from ``TRANSFORMS``: ``"scale"``
            (:func:`scale_images` by ``factor``), ``"rotate"`` (:func:`rotate90` by ``k``),
            ``"hflip"`` (:func:`hflip`) and ``"invert"`` (:func:`invert`). Repeats are allowed;
            an empty sequence returns a copy.
        factor: zoom factor for ``"scale"``, > 0.
        k: quarter turns counter-clockwise for ``"rotate"``.

    Returns:
        New array of the input's dtype; shape (n_images, height, width), or (n_images, width,
        height) after an odd number of quarter turns.

    Example:
        >>> img = np.zeros((1, 3, 3), dtype=np.uint8); img[0, 0, 0] = 255
        >>> transform_images(img, ["rotate", "invert"])[0, :, 0].tolist()
        [255, 255, 0]
    """
    arr = _check_images(images)
    seq = [names] if isinstance(names, str) else list(names)
    unknown = [n for n in seq if n not in TRANSFORMS]
    if unknown:
        raise ValueError(f"names must come from {TRANSFORMS}; unknown: {unknown!r}.")
    if "scale" in seq:
        factor = _check_real(factor, "factor", positive=True)
    out = arr.copy()
    for name in seq:
        if name == "scale":
            out = scale_images(out, factor)
        elif name == "rotate":
            out = rotate90(out, k)
        elif name == "hflip":
            out = hflip(out)
        else:
            out = invert(out)
    return out


def add_gaussian_noise(
    X: ArrayLike,
    variance: float,
    *,
    random_state: int | np.random.Generator | None = None,
) -> np.ndarray:
    """Add independent ``N(0, variance)`` noise to every entry.

    Args:
        X: shape (n_samples, n_features), finite. Float inputs keep their dtype; anything else
            becomes float64.
        variance: noise variance (standard deviation squared), a finite number >= 0; 0 returns
            a copy.
        random_state: None, int or ``numpy.random.Generator``.

    Returns:
        New array of shape (n_samples, n_features).

    Example:
        >>> add_gaussian_noise(np.zeros((2, 3)), 0.0).tolist()
        [[0.0, 0.0, 0.0], [0.0, 0.0, 0.0]]
    """
    arr = np.asarray(X)
    if arr.ndim != 2:
        raise ValueError(f"X must be 2-D (n_samples, n_features); got shape {arr.shape}.")
    if not np.issubdtype(arr.dtype, np.number) or np.issubdtype(arr.dtype, np.complexfloating):
        raise ValueError(f"X must be real numbers; got dtype {arr.dtype}.")
    dtype = arr.dtype if np.issubdtype(arr.dtype, np.floating) else np.dtype(np.float64)
    arr = arr.astype(dtype)  # always a copy
    if not np.isfinite(arr).all():
        raise ValueError("X contains NaN or infinite values; drop or impute them first.")
    variance = _check_real(variance, "variance", positive=False)
    rng = _rng(random_state)
    arr += (np.sqrt(variance) * rng.standard_normal(arr.shape)).astype(dtype, copy=False)
    return arr


def permute_labels(
    y: ArrayLike,
    *,
    n_classes: int | None = None,
    random_state: int | np.random.Generator | None = None,
) -> tuple[np.ndarray, np.ndarray]:
    """Relabel classes by one random derangement, so that every label changes.

    The permutation ``perm`` is drawn uniformly among the permutations of
    ``range(n_classes)`` with no fixed point (``perm[c] != c`` for every class ``c``), by
    rejection sampling from uniform permutations. Rows keep their features; only the class
    names move, which is a pure concept shift (p(x) unchanged, p(y | x) changed everywhere).

    Args:
        y: shape (n_samples,), integer labels in ``range(n_classes)``.
        n_classes: number of classes, >= 2; default ``y.max() + 1``. Pass it when some classes
            may be absent from ``y``.
        random_state: None, int or ``numpy.random.Generator``.

    Returns:
        ``(new_y, perm)``: ``new_y`` int64 of shape (n_samples,) with ``new_y[i] ==
        perm[y[i]]``, and ``perm`` int64 of shape (n_classes,).

    Example:
        >>> new_y, perm = permute_labels([0, 1, 1, 2], random_state=0)
        >>> bool(np.all(new_y != np.array([0, 1, 1, 2]))), sorted(perm.tolist())
        (True, [0, 1, 2])
    """
    labels = np.asarray(y)
    if labels.ndim != 1:
        raise ValueError(f"y must be 1-D (n_samples,); got shape {labels.shape}.")
    if labels.size and not np.issubdtype(labels.dtype, np.integer):
        raise ValueError(f"y must hold integer class ids; got dtype {labels.dtype}.")
    if labels.size and labels.min() < 0:
        raise ValueError(f"y must hold class ids >= 0; found {int(labels.min())}.")
    if n_classes is None:
        if labels.size == 0:
            raise ValueError("y is empty; pass n_classes to say how many classes to permute.")
        n_classes = int(labels.max()) + 1
    n_classes = _check_int(n_classes, "n_classes", 2)
    if labels.size and labels.max() >= n_classes:
        raise ValueError(
            f"y holds class id {int(labels.max())}, outside range(n_classes={n_classes}); "
            f"raise n_classes or relabel y to 0..n_classes-1."
        )
    rng = _rng(random_state)
    identity = np.arange(n_classes)
    for _ in range(_MAX_TRIES):
        perm = rng.permutation(n_classes)
        if not np.any(perm == identity):
            break
    else:  # pragma: no cover - probability ~ (1 - 1/e) ** 10000
        raise RuntimeError("failed to draw a derangement; this should not happen.")
    perm = perm.astype(np.int64)
    return perm[labels.astype(np.int64)], perm


def joint_shift_quarters(
    images: ArrayLike,
    y: ArrayLike,
    *,
    transforms: str | Sequence[str] = PAPER_TRANSFORM,
    permutation: ArrayLike | None = None,
    n_classes: int | None = None,
    random_state: int | np.random.Generator | None = None,
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """The FedGMM paper's MNIST data (Appendix C.3): rows split at random into a half left
    unchanged, a quarter whose images are transformed (``p(x)`` shifts, labels kept) and a
    quarter whose labels are moved by one permutation ``P_A`` (``p(y | x)`` shifts, images
    kept).

    The split is exact: ``n // 2`` rows unchanged, ``(n - n // 2) // 2`` transformed, the
    rest permuted, chosen by one random permutation of the rows. Apply it to the pooled rows
    before they go to clients (the paper's order), and to a test set with the training
    set's ``permutation`` to draw it from the same distribution.

    Args:
        images: shape (n_images, height, width), square images (``"rotate"`` keeps the
            shape), a dtype :func:`transform_images` accepts.
        y: shape (n_images,), integer labels in ``range(n_classes)``.
        transforms: ``T``, names from ``TRANSFORMS`` applied in order; default the paper's
            90-degree rotation, horizontal flip and inversion (:data:`PAPER_TRANSFORM`).
        permutation: ``P_A`` as an int array of shape (n_classes,) (a permutation of
            ``range(n_classes)``); default a random derangement (:func:`permute_labels`).
        n_classes: number of classes, >= 2; default ``permutation``'s length, else
            ``y.max() + 1``.
        random_state: None, int or ``numpy.random.Generator``; draws the split, then
            ``P_A`` when it is not given.

    Returns:
        ``(images, labels, kind, permutation)``: new images of the input's shape and dtype,
        int64 labels (n_images,), int8 ``kind`` (n_images,) with 0, 1, 2 for
        :data:`SHIFT_KINDS` ``"unchanged"``, ``"transformed"``, ``"permuted"``, and ``P_A``
        int64 (n_classes,).

    Example:
        >>> imgs = np.zeros((8, 2, 2), dtype=np.uint8)
        >>> out, labels, kind, perm = joint_shift_quarters(imgs, np.arange(8) % 2, random_state=0)
        >>> np.bincount(kind).tolist(), int(out[kind == 1].min()), perm.tolist()
        ([4, 2, 2], 255, [1, 0])
    """
    arr = _check_images(images)
    labels = np.asarray(y)
    if labels.shape != (arr.shape[0],):
        raise ValueError(
            f"y must hold one label per image, shape ({arr.shape[0]},); got {labels.shape}."
        )
    if arr.shape[1] != arr.shape[2]:
        raise ValueError(
            f"images must be square (a quarter turn keeps the shape); got {arr.shape[1:]}."
        )
    names = [transforms] if isinstance(transforms, str) else list(transforms)
    unknown = [name for name in names if name not in TRANSFORMS]
    if unknown:
        raise ValueError(f"transforms must come from {TRANSFORMS}; unknown: {unknown!r}.")
    rng = _rng(random_state)
    if permutation is None:
        _, perm = permute_labels(labels, n_classes=n_classes, random_state=rng)
    else:
        perm = np.asarray(permutation)
        size = perm.shape[0] if perm.ndim == 1 else -1
        if perm.ndim != 1 or not np.array_equal(np.sort(perm), np.arange(size)):
            raise ValueError(
                f"permutation must be a permutation of range(n_classes); got {perm.tolist()}."
            )
        if n_classes is not None and size != n_classes:
            raise ValueError(f"permutation has {size} entries; n_classes is {n_classes}.")
        perm = perm.astype(np.int64)
        if labels.size and (labels.min() < 0 or labels.max() >= size):
            raise ValueError(f"y must hold class ids in range({size}), the permutation's.")
    n = arr.shape[0]
    order = rng.permutation(n)
    half = n // 2
    quarter = (n - half) // 2
    kind = np.zeros(n, dtype=np.int8)
    kind[order[half : half + quarter]] = 1
    kind[order[half + quarter :]] = 2
    out = arr.copy()
    moved = kind == 1
    if moved.any():
        out[moved] = transform_images(arr[moved], names)
    new_labels = labels.astype(np.int64)
    new_labels[kind == 2] = perm[new_labels[kind == 2]]
    return out, new_labels, kind, perm
