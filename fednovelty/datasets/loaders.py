"""Readers for the real benchmark data in ``../shared/data`` (never downloads anything).

Layout of the data folder (see its ``README.md`` and ``MANIFEST.tsv``)::

    adbench/<name>.npz       X (n_samples, n_features), y (n_samples,) 1 = anomaly; e.g. 4_breastw
    adbench_cv/<name>.npz    ResNet-18 embeddings, X (n_samples, 512); e.g. CIFAR10_0,
                             MVTec-AD_bottle
    mnist/mnist.npz          x_train (60000, 28, 28) uint8, y_train, x_test, y_test
    femnist/femnist.npz      X (n, 28, 28) uint8 (white background), y (n,) 0-61, writer (n,),
                             writer_ids (n_writers,): LEAF's FEMNIST, each writer a client

Choices, and why:

- The folder is found from an explicit argument, else ``$FEDNOVELTY_DATA``, else the
  ``shared/data`` folder next to the repository checkout, so tests and benchmarks work from a
  plain checkout with no configuration, and installed copies can be pointed elsewhere.
- Files are opened with ``allow_pickle=False`` (loading runs no code) and only read. Arrays
  come back as fresh, writable copies in one dtype per role (features float64, labels int64,
  images uint8) whatever the file stored (ADBench mixes uint8, int16, int64, float32, ...),
  so callers can modify them freely.
- Nothing is cached: a call is a pure function of the files, and the largest file (MNIST)
  loads in well under a second.
"""

from __future__ import annotations

import difflib
import os
import re
from pathlib import Path

import numpy as np

__all__ = ["data_dir", "list_adbench", "load_adbench", "load_femnist", "load_mnist"]

ENV_VAR = "FEDNOVELTY_DATA"
_ADBENCH_FOLDERS = ("adbench", "adbench_cv")


def _default_data_dir() -> Path:
    # .../<checkout>/fednovelty/datasets/loaders.py -> .../shared/data beside <checkout>
    return Path(__file__).resolve().parents[2].parent / "shared" / "data"


def data_dir(path: str | os.PathLike[str] | None = None) -> Path:
    """Folder holding ``adbench/``, ``adbench_cv/``, ``mnist/`` and ``femnist/``.

    Args:
        path: explicit folder. If None, the environment variable ``FEDNOVELTY_DATA`` is used;
            if that is unset or empty, ``../shared/data`` relative to the repository checkout.

    Returns:
        The folder as a ``pathlib.Path`` (``~`` expanded).

    Raises:
        FileNotFoundError: the chosen folder does not exist; the message names the path tried
            and how to point fednovelty at the data.
    """
    if path is not None:
        where, source = Path(path).expanduser(), "the data_dir argument"
    elif os.environ.get(ENV_VAR):
        where, source = Path(os.environ[ENV_VAR]).expanduser(), f"${ENV_VAR}"
    else:
        where, source = _default_data_dir(), "the default beside the repository checkout"
    if not where.is_dir():
        raise FileNotFoundError(
            f"fednovelty data folder not found: {where} (from {source}). Pass data_dir=... or "
            f"set the environment variable {ENV_VAR} to the folder that holds adbench/, "
            f"adbench_cv/ and mnist/."
        )
    return where


_resolve = data_dir  # the loaders' ``data_dir`` parameter shadows the function's name


def _sort_key(name: str) -> tuple[int, str]:
    match = re.match(r"(\d+)_", name)
    return (int(match.group(1)) if match else 10**9, name.lower())


def _names(root: Path, folders: tuple[str, ...]) -> list[str]:
    return sorted(
        {p.stem for folder in folders for p in (root / folder).glob("*.npz")}, key=_sort_key
    )


def list_adbench(
    data_dir: str | os.PathLike[str] | None = None, *, include_cv: bool = False
) -> list[str]:
    """Names of the ADBench datasets on disk, in ADBench's numeric order.

    Args:
        data_dir: data folder; see :func:`data_dir` for the default.
        include_cv: also list the image-embedding sets in ``adbench_cv/`` (``CIFAR10_0``,
            ``SVHN_0``, ``MVTec-AD_*``), after the tabular ones.

    Returns:
        ``list[str]`` such as ``["1_ALOI", "4_breastw", ..., "45_wine"]``, without ``.npz``.
    """
    root = _resolve(data_dir)
    names = _names(root, ("adbench",))
    if include_cv:
        names += _names(root, ("adbench_cv",))
    return names


def load_adbench(
    name: str, data_dir: str | os.PathLike[str] | None = None
) -> tuple[np.ndarray, np.ndarray]:
    """Load one ADBench dataset from ``adbench/`` or ``adbench_cv/``.

    Args:
        name: file name with or without ``.npz``: ``"10_cover"``, ``"10_cover.npz"``,
            ``"CIFAR10_0"``, ``"MVTec-AD_bottle"``.
        data_dir: data folder; see :func:`data_dir` for the default.

    Returns:
        ``(X, y)``: ``X`` float64 of shape (n_samples, n_features) and ``y`` int64 of shape
        (n_samples,) with 1 = anomaly (novel) and 0 = inlier.

    Raises:
        ValueError: no dataset of that name; the message lists close matches.
    """
    root = _resolve(data_dir)
    if not isinstance(name, str):
        raise ValueError(f"name must be a string such as '4_breastw'; got {name!r}.")
    stem = name.removesuffix(".npz")
    candidates = [root / folder / f"{stem}.npz" for folder in _ADBENCH_FOLDERS]
    # A bare file name only: "../x" or "adbench/x" must not reach outside the two folders.
    path = next((p for p in candidates if Path(stem).name == stem and p.is_file()), None)
    if path is None:
        known = _names(root, _ADBENCH_FOLDERS)
        close = difflib.get_close_matches(stem, known, n=5, cutoff=0.6)
        close += [k for k in known if stem.lower() in k.lower() and k not in close]
        hint = f"Did you mean {', '.join(close[:5])}? " if close else ""
        raise ValueError(
            f"unknown ADBench dataset {name!r} in {root}/adbench and {root}/adbench_cv. "
            f"{hint}list_adbench(include_cv=True) lists all {len(known)} names."
        )
    with np.load(path, allow_pickle=False) as npz:
        if not {"X", "y"} <= set(npz.files):
            raise ValueError(f"{path} does not hold arrays 'X' and 'y'; found {npz.files}.")
        X = np.array(npz["X"], dtype=np.float64, order="C")
        y = np.array(npz["y"], dtype=np.int64)
    if X.ndim != 2 or y.shape != (X.shape[0],):
        raise ValueError(f"{path}: expected X (n, d) and y (n,); got {X.shape} and {y.shape}.")
    return X, y


def load_mnist(data_dir: str | os.PathLike[str] | None = None) -> dict[str, np.ndarray]:
    """Load raw MNIST from ``mnist/mnist.npz``.

    Args:
        data_dir: data folder; see :func:`data_dir` for the default.

    Returns:
        ``{"x_train": uint8 (60000, 28, 28), "y_train": int64 (60000,),
        "x_test": uint8 (10000, 28, 28), "y_test": int64 (10000,)}``; labels are digits 0-9
        (stored as uint8 in the file, widened here so label arithmetic cannot wrap).
    """
    path = _resolve(data_dir) / "mnist" / "mnist.npz"
    if not path.is_file():
        raise FileNotFoundError(f"MNIST file not found: {path}.")
    with np.load(path, allow_pickle=False) as npz:
        out = {
            "x_train": np.array(npz["x_train"], dtype=np.uint8),
            "y_train": np.array(npz["y_train"], dtype=np.int64),
            "x_test": np.array(npz["x_test"], dtype=np.uint8),
            "y_test": np.array(npz["y_test"], dtype=np.int64),
        }
    return out


def load_femnist(data_dir: str | os.PathLike[str] | None = None) -> dict[str, np.ndarray]:
    """Load LEAF's FEMNIST from ``femnist/femnist.npz``, as stored: handwritten digits and
    letters grouped by writer.

    Args:
        data_dir: data folder; see :func:`data_dir` for the default.

    Returns:
        ``{"X": uint8 (n, 28, 28), "y": int64 (n,), "writer": int64 (n,),
        "writer_ids": str (n_writers,)}``. ``X`` keeps the file's convention (white background
        255, dark ink: the inverse of MNIST's); ``y`` is the class 0-61 (0-9 digits, 10-35
        upper-case, 36-61 lower-case letters); ``writer`` indexes ``writer_ids``.

    Raises:
        FileNotFoundError: the file is missing (named). ValueError: the arrays disagree in
            length, or a writer index or class is out of range.
    """
    path = _resolve(data_dir) / "femnist" / "femnist.npz"
    if not path.is_file():
        raise FileNotFoundError(
            f"FEMNIST file not found: {path}. The shared data folder should hold "
            "femnist/femnist.npz (arrays X, y, writer, writer_ids)."
        )
    with np.load(path, allow_pickle=False) as npz:
        out = {
            "X": np.array(npz["X"], dtype=np.uint8),
            "y": np.array(npz["y"], dtype=np.int64),
            "writer": np.array(npz["writer"], dtype=np.int64),
            "writer_ids": np.array(npz["writer_ids"]).astype(str),
        }
    n = out["X"].shape[0]
    if out["X"].shape[1:] != (28, 28) or out["y"].shape != (n,) or out["writer"].shape != (n,):
        raise ValueError(f"{path}: X must be (n, 28, 28) with one y and one writer per image.")
    if n and (out["writer"].min() < 0 or out["writer"].max() >= out["writer_ids"].shape[0]):
        raise ValueError(f"{path}: writer indices must index writer_ids.")
    if n and (out["y"].min() < 0 or out["y"].max() >= FEMNIST_CLASSES):
        raise ValueError(f"{path}: classes must be in 0..{FEMNIST_CLASSES - 1}.")
    return out


#: FEMNIST's classes: 10 digits, 26 upper-case and 26 lower-case letters.
FEMNIST_CLASSES = 62
