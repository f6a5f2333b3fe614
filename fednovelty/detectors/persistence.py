"""Saving and loading detectors without pickle.

A saved detector is one ``.safetensors`` file: its tensors (parameters, decision scores,
client weights) in safetensors, and a JSON document in the file's metadata with the
format tag, the detector class, its constructor arguments and its scalar fitted
attributes, plus a SHA-256 checksum of the document and the tensors. Loading parses JSON and
reads raw tensors: it never runs code from the file, and it rejects files without the
fednovelty tag or naming an unknown class.

Loading validates what it reads, and any damage raises ``ModelFormatError`` naming it, never
a ``KeyError``/``TypeError``/``IndexError`` nor a model that scores NaN:

- the container and the document: a safetensors file, a JSON object with the tag, a known
  format version and class, ``params`` and ``attrs`` objects;
- the settings: only the class's constructor arguments, each valid for it (a file from an
  older version may lack newer settings: they take the value the class lists in
  ``_legacy_params``, the behaviour before the setting existed, else their defaults);
- a class whose layout changed reads its older files through its ``_upgrade_document``
  classmethod, ``(document, tensors) -> (class, document, tensors)``: e.g. a
  ``FedGMMDetector`` file of a joint model (fitted with ``y``) is read as the
  ``JointFedGMMDetector`` it is, without the settings that do not apply to it. The checksum
  is checked on the file as written;
- the fitted state, in each class's ``_set_state`` with the helpers below: every expected
  attribute present with its JSON type, every tensor present, floating, finite and of the shape
  the model implies (``n_features``, ``n_components``, clients), mixture weights a probability
  vector, precision Cholesky factors triangular with a positive diagonal (so every covariance
  is positive definite), a finite threshold;
- the meaning of the state, with the small checks below shared by every kind: values that
  are divided by are positive (``check_positive``), weights are probability vectors, means
  lie in the box the stored rows imply (``check_in_box``), stored second moments are
  consistent with their counts and sums (``check_second_moments``), the threshold lies
  within the training scores' range (``check_threshold``), and no training score is more
  likely than the model can make any row (``check_reachable_scores``, with each kind's
  ``_log_density_bound``): e.g. covariances scaled by 1e200 leave the stored scores
  unreachable; more in :mod:`.persistence_checks` (fit floors, scorable means, networks);
- nothing extra: the loaded detector, saved again, must hold the same tensors and attributes;
- last, the checksum (format 2): a value changed in a way that still looks valid (a mean, the
  threshold) is reported as a modified file. It authenticates nothing (anyone can recompute
  it): a forged file meets the checks above alone. Format-1 files (no checksum) are read.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
from collections.abc import Iterable
from typing import Any

import numpy as np
import torch
from safetensors import safe_open
from safetensors.torch import save_file

from fednovelty.detectors._saved_params import constructor_params, current_params, jsonable, restore
from fednovelty.detectors.persistence_checks import check_scorable
from fednovelty.exceptions import ModelFormatError
from fednovelty.mixture import MixtureParams, score_samples

FORMAT_TAG = "fednovelty-detector"
#: 2: the metadata holds a SHA-256 checksum of the document and the tensors.
FORMAT_VERSION = 2
_METADATA_KEY = "fednovelty"
_CHECKSUM_KEY = "fednovelty.sha256"
#: Every class ``load`` builds, by name: the one list of loadable classes. Every estimator
#: class registers itself when it is defined (``SimulatedFitMixin.__init_subclass__`` calls
#: :func:`register`), so a subclass defined anywhere is loadable without being listed.
REGISTRY: dict[str, type] = {}


def register(cls: type) -> type:
    """Make a detector class loadable by name: ``SimulatedFitMixin.__init_subclass__`` calls
    it for every estimator class as the class is defined (the one place that registers)."""
    REGISTRY[cls.__name__] = cls
    return cls


def build_document(
    detector, tensors: dict[str, torch.Tensor], attrs: dict
) -> tuple[dict, dict[str, torch.Tensor]]:
    """The JSON document and every tensor (``tensors`` plus array-valued settings) that
    ``save_detector`` writes for ``detector``."""
    tensors = {k: v.detach().cpu().contiguous() for k, v in tensors.items()}
    params = {
        name: jsonable(value, name, tensors)
        for name, value in detector.get_params(deep=False).items()
    }
    document = {
        "format": FORMAT_TAG,
        "format_version": FORMAT_VERSION,
        "class": type(detector).__name__,
        "params": params,
        "attrs": jsonable(attrs, "attrs", tensors),
    }
    return document, tensors


def checksum(text: str, tensors: dict[str, torch.Tensor]) -> str:
    """SHA-256 (hex) of the metadata ``text`` and every tensor's name, dtype, shape and bytes."""
    digest = hashlib.sha256(text.encode("utf-8"))
    for name in sorted(tensors):
        tensor = tensors[name].detach().cpu().contiguous()
        digest.update(json.dumps([name, str(tensor.dtype), list(tensor.shape)]).encode())
        digest.update(tensor.reshape(-1).view(torch.uint8).numpy().tobytes())
    return digest.hexdigest()


def save_detector(
    detector, path: str | os.PathLike, tensors: dict[str, torch.Tensor], attrs: dict
) -> None:
    """Write ``tensors`` and JSON metadata for ``detector`` to ``path``."""
    document, tensors = build_document(detector, tensors, attrs)
    text = json.dumps(document)
    metadata = {_METADATA_KEY: text, _CHECKSUM_KEY: checksum(text, tensors)}
    save_file(tensors, os.fspath(path), metadata=metadata)


def _read(path: str) -> tuple[dict, dict[str, torch.Tensor], str, str | None]:
    """``(document, tensors, document_text, stored_checksum)`` of a file with the tag."""
    if not os.path.exists(path):
        raise FileNotFoundError(f"No saved model at {path!r}.")
    try:
        with safe_open(path, framework="pt") as handle:
            metadata = handle.metadata() or {}
            tensors = {key: handle.get_tensor(key) for key in handle.keys()}
    except Exception as error:  # the container's parser: any failure is a damaged file
        raise ModelFormatError(
            f"{path!r} is not a fednovelty model file (not a safetensors file: {error})."
        ) from None
    text = metadata.get(_METADATA_KEY)
    try:
        document = json.loads(text) if isinstance(text, str) else None
    except (ValueError, RecursionError):
        document = None
    if not isinstance(document, dict) or document.get("format") != FORMAT_TAG:
        raise ModelFormatError(
            f"{path!r} is not a fednovelty model file (no '{FORMAT_TAG}' tag); save models "
            "with detector.save(path)."
        )
    version = document.get("format_version")
    if not isinstance(version, int) or isinstance(version, bool) or version < 1:
        raise ModelFormatError(
            f"{path!r} is damaged: format_version must be an integer >= 1, got {version!r}."
        )
    if version > FORMAT_VERSION:
        raise ModelFormatError(
            f"{path!r} was written by a newer fednovelty (format {version}); upgrade "
            "fednovelty to load it."
        )
    stored = metadata.get(_CHECKSUM_KEY)
    if stored is None and version >= 2:
        raise ModelFormatError(f"{path!r} is damaged: its checksum ({_CHECKSUM_KEY}) is missing.")
    return document, tensors, text, stored


def _verify(path: str, text: str, tensors: dict[str, torch.Tensor], stored: str | None) -> None:
    if stored is not None and stored != checksum(text, tensors):
        raise ModelFormatError(
            f"{path!r} was modified or damaged after it was saved: its SHA-256 checksum does not "
            "match its content. Save the model again with detector.save(path)."
        )


def read_detector_file(path: str | os.PathLike) -> tuple[dict, dict[str, torch.Tensor]]:
    """Read and check a saved detector: ``(document, tensors)``.

    Raises:
        ModelFormatError: the file is missing the fednovelty tag, is not safetensors, was
            written by a newer format version, or its checksum does not match.
        FileNotFoundError: no such file.
    """
    path = os.fspath(path)
    document, tensors, text, stored = _read(path)
    _verify(path, text, tensors, stored)
    return document, tensors


def load(path: str | os.PathLike, expected: type | None = None):
    """Load any fednovelty detector saved with ``save`` (no code runs from the file).

    Args:
        path: file written by ``detector.save``.
        expected: if given, the file must hold this class (or a subclass).

    Raises:
        ModelFormatError: the file is not a fednovelty model, holds another class than
            ``expected``, or is damaged (the message names what is wrong).
        FileNotFoundError: no such file.
    """
    path = os.fspath(path)
    document, tensors, text, stored = _read(path)
    name = document.get("class")
    cls = REGISTRY.get(name) if isinstance(name, str) else None
    if cls is None:
        raise ModelFormatError(f"{path!r} holds an unknown detector class {name!r}.")
    fields = tensors
    params = document.get("params")
    if isinstance(params, dict):  # settings under today's names (older layouts)
        params, fields = current_params(cls, dict(params), fields)
        document = {**document, "params": params}
    upgrade = getattr(cls, "_upgrade_document", None)
    if upgrade is not None:  # a file of an older layout of this class
        cls, document, fields = upgrade(document, fields)
        name = cls.__name__
    if expected is not None and not issubclass(cls, expected):
        raise ModelFormatError(
            f"{path!r} holds a {name}, not a {expected.__name__}; use "
            "fednovelty.load(path) to load any detector."
        )
    try:
        detector = _build(cls, document, fields)
    except ModelFormatError as error:
        raise ModelFormatError(f"{path!r} is damaged: {error}") from None
    except Exception as error:  # whatever else damaged content raises while it is read
        raise ModelFormatError(f"{path!r} is damaged: {type(error).__name__}: {error}") from error
    _verify(path, text, tensors, stored)
    return detector


def _build(cls: type, document: dict, tensors: dict[str, torch.Tensor]):
    """The detector a checked document describes, its state validated (see the module doc)."""
    params = document.get("params")
    attrs = document.get("attrs")
    for key, value in (("params", params), ("attrs", attrs)):
        if not isinstance(value, dict):
            raise ModelFormatError(f"'{key}' must be a JSON object, got {type(value).__name__}.")
    known = cls().get_params(deep=False)
    unknown = sorted(set(params) - set(known))
    if unknown:
        raise ModelFormatError(f"unknown setting(s) {unknown} for {cls.__name__}.")
    params = constructor_params(cls, params, tensors)
    legacy = getattr(cls, "_legacy_params", {})  # a newer setting's value in older files
    detector = cls(**{**{k: v for k, v in legacy.items() if k not in params}, **params})
    try:
        detector._validate_params()
    except ValueError as error:
        raise ModelFormatError(f"invalid setting: {error}") from None
    attrs = {k: restore(v, tensors, f"attrs[{k!r}]") for k, v in attrs.items()}
    try:
        detector._set_state(tensors, attrs)
    finally:
        restored = getattr(detector, "_restored", None)
        if restored is not None:
            restored()
    check_scores(detector)
    again, again_tensors = build_document(detector, *detector._saved_state())
    _check_same_keys("tensor", set(tensors), set(again_tensors))
    _check_same_keys("attribute", set(attrs), set(again["attrs"]))
    return detector


def _check_same_keys(kind: str, found: set[str], expected: set[str]) -> None:
    if found - expected:
        raise ModelFormatError(f"unexpected {kind}(s) {sorted(found - expected)}.")
    if expected - found:
        raise ModelFormatError(f"missing {kind}(s) {sorted(expected - found)}.")


# ----------------------------------------------------------------------------- validation
def _type_names(kind) -> str:
    kinds = kind if isinstance(kind, tuple) else (kind,)
    names = {bool: "a boolean", int: "an integer", float: "a number", str: "a string"}
    names |= {list: "a list", dict: "an object", type(None): "null"}
    return " or ".join(names.get(k, k.__name__) for k in kinds)


def _is(value, kind) -> bool:
    """``isinstance`` where a bool is not a number and an int is a number."""
    kinds = kind if isinstance(kind, tuple) else (kind,)
    if isinstance(value, bool):
        return bool in kinds
    if float in kinds and isinstance(value, int):
        return True
    return isinstance(value, kinds)


def get_attr(attrs: dict, name: str, kind, *, minimum: float | None = None) -> Any:
    """``attrs[name]``, checked to be of JSON type ``kind`` (``int``, ``float`` for any
    number, ``bool``, ``str``, ``list``, ``dict``, ``type(None)`` or a tuple of them), finite
    if a number, and ``>= minimum`` if given.

    Raises:
        ModelFormatError: missing, of another type, not finite or below ``minimum``.
    """
    if name not in attrs:
        raise ModelFormatError(f"the attribute {name!r} is missing.")
    value = attrs[name]
    if not _is(value, kind):
        raise ModelFormatError(
            f"the attribute {name!r} must be {_type_names(kind)}, got "
            f"{type(value).__name__} {_short(value)}."
        )
    if _is(value, float) and not math.isfinite(value):
        raise ModelFormatError(f"the attribute {name!r} is not finite ({value}).")
    if minimum is not None and _is(value, float) and value < minimum:
        raise ModelFormatError(f"the attribute {name!r} must be >= {minimum}, got {value}.")
    return value


def check_items(values: Iterable, name: str, kind, *, finite: bool = True) -> list:
    """``values`` as a list whose every item is of JSON type ``kind`` (numbers finite unless
    ``finite=False``)."""
    values = list(values)
    for index, value in enumerate(values):
        infinite = finite and _is(value, float) and not math.isfinite(value)
        if not _is(value, kind) or infinite:
            raise ModelFormatError(
                f"{name}[{index}] must be {_type_names(kind)}, got {type(value).__name__} "
                f"{_short(value)}."
            )
    return values


#: the attributes of an iterative fit's record, saved as JSON.
ITERATION_RECORD = ("n_iter_", "converged_", "lower_bounds_")


def iteration_record(estimator) -> dict:
    """An iterative fit's record (``n_iter_``, ``converged_``, ``lower_bounds_``) as the JSON
    attributes ``save`` writes."""
    return {name: getattr(estimator, name) for name in ITERATION_RECORD}


def restore_iteration_record(estimator, attrs: dict, *, finite: bool = True) -> None:
    """Set ``n_iter_`` (an integer >= 0), ``converged_`` (a bool) and ``lower_bounds_`` (a
    list of numbers; ``finite=False`` lets a bound be infinite) from saved ``attrs``.

    Raises:
        ModelFormatError: naming the attribute that is missing or of the wrong kind.
    """
    estimator.n_iter_ = get_attr(attrs, "n_iter_", int, minimum=0)
    estimator.converged_ = get_attr(attrs, "converged_", bool)
    bounds = get_attr(attrs, "lower_bounds_", list)
    estimator.lower_bounds_ = check_items(bounds, "lower_bounds_", float, finite=finite)


def get_tensor(
    tensors: dict[str, torch.Tensor],
    name: str,
    shape: tuple[int, ...] | None = None,
    *,
    allow_inf: bool = False,
) -> torch.Tensor:
    """``tensors[name]``: present, floating, finite (``allow_inf``: no NaN) and of ``shape``
    (``None``: any).

    Raises:
        ModelFormatError: naming the tensor and what is wrong.
    """
    if name not in tensors:
        raise ModelFormatError(f"the tensor {name!r} is missing.")
    tensor = tensors[name]
    if not tensor.is_floating_point():
        raise ModelFormatError(f"the tensor {name!r} must be floating point, got {tensor.dtype}.")
    if shape is not None and tuple(tensor.shape) != tuple(shape):
        raise ModelFormatError(
            f"the tensor {name!r} has shape {tuple(tensor.shape)}; the model implies "
            f"{tuple(shape)}."
        )
    bad = torch.isnan(tensor) if allow_inf else ~torch.isfinite(tensor)
    if bool(bad.any()):
        what = "NaN" if allow_inf else "NaN or inf"
        raise ModelFormatError(f"the tensor {name!r} holds {what} ({int(bad.sum())} value(s)).")
    return tensor


def check_probabilities(tensor: torch.Tensor, name: str, dims: int = 1) -> None:
    """Each block of the last ``dims`` axes of ``tensor`` is a probability vector: entries
    >= 0 summing to 1 (to the dtype's round-off times the number of entries)."""
    if bool((tensor < 0).any()):
        raise ModelFormatError(f"{name} holds negative weights; weights are probabilities.")
    flat = tensor.reshape(*tensor.shape[: tensor.ndim - dims], -1)
    if flat.shape[-1] == 0:
        raise ModelFormatError(f"{name} is empty; a mixture needs at least one component.")
    tolerance = 16 * torch.finfo(tensor.dtype).eps * flat.shape[-1] ** 0.5 * 1e3
    error = (flat.double().sum(-1) - 1).abs().max().item()
    if error > tolerance:
        raise ModelFormatError(
            f"{name} do not sum to 1 (off by {error:.3g}); weights are probabilities."
        )


def check_mixture(
    tensors: dict[str, torch.Tensor], prefix: str, covariance_type: str, n_features: int
) -> MixtureParams:
    """The mixture saved under ``prefix`` (``prefix.weights``, ``.means``,
    ``.precisions_cholesky``), checked: finite, ``n_features`` wide, weights a probability
    vector, precision Cholesky factors upper-triangular with a positive diagonal (each
    covariance positive definite), and small enough that squaring a factor times a mean does
    not overflow the dtype (else the log-density at the means would be inf - inf = NaN).

    Raises:
        ModelFormatError: naming the tensor and what is wrong.
    """
    weights = get_tensor(tensors, f"{prefix}.weights")
    means = get_tensor(tensors, f"{prefix}.means")
    factors = get_tensor(tensors, f"{prefix}.precisions_cholesky")
    if means.ndim != 2 or means.shape[1] != n_features:
        raise ModelFormatError(
            f"the tensor '{prefix}.means' has shape {tuple(means.shape)}; the model implies "
            f"(n_components, {n_features})."
        )
    try:
        params = MixtureParams(weights, means, factors, covariance_type)
    except ValueError as error:
        raise ModelFormatError(f"the mixture '{prefix}': {error}") from None
    check_probabilities(weights, f"the weights '{prefix}.weights'")
    if covariance_type in ("full", "tied"):
        diagonal = factors.diagonal(dim1=-2, dim2=-1)
        if bool(factors.tril(-1).ne(0).any()):
            raise ModelFormatError(
                f"the tensor '{prefix}.precisions_cholesky' is not upper-triangular."
            )
    else:
        diagonal = factors
    if not bool((diagonal > 0).all()):
        raise ModelFormatError(
            f"the tensor '{prefix}.precisions_cholesky' has a non-positive diagonal entry: a "
            "covariance is not positive definite."
        )
    # The log-density squares (x - mean) times the factor: it must not overflow at the means.
    names = f"the tensors '{prefix}.means' and '{prefix}.precisions_cholesky'"
    check_scorable(means, factors.abs().max().item(), names)
    return params


def check_positive(
    tensor: torch.Tensor, name: str, why: str, *, allow_zero: bool = False
) -> torch.Tensor:
    """``tensor`` unchanged if every entry is > 0 (``allow_zero``: >= 0); ``why`` says what
    the value is for (e.g. "the class probabilities divide by their sum").

    Raises:
        ModelFormatError: naming ``name`` and ``why``.
    """
    bad = tensor < 0 if allow_zero else tensor <= 0
    if bool(bad.any()):
        bound = "< 0" if allow_zero else "<= 0"
        raise ModelFormatError(f"{name} holds {int(bad.sum())} value(s) {bound}; {why}.")
    return tensor


def check_in_box(tensor: torch.Tensor, name: str, low: float, high: float, why: str) -> None:
    """Every entry of ``tensor`` in ``[low, high]`` widened by ``1e-6`` of the box's width
    (round-off); ``why`` says where the box comes from.

    Raises:
        ModelFormatError: naming ``name``, the box and the value furthest out.
    """
    slack = 1e-6 * max(1.0, high - low)
    outside = (tensor < low - slack) | (tensor > high + slack)
    if bool(outside.any()):
        worst = tensor[outside].double().abs().max().item()
        raise ModelFormatError(
            f"{name} holds {int(outside.sum())} value(s) outside [{low:.6g}, {high:.6g}] (up "
            f"to {worst:.3g} in magnitude); {why}."
        )


def check_second_moments(
    counts: torch.Tensor, sums: torch.Tensor, second: torch.Tensor, covariance_type: str, name: str
) -> None:
    """Summed statistics (``SufficientStats``: ``counts`` (K,), ``sums`` (K, d), ``second``
    (K, d, d) full, (d, d) tied, (K, d) diag, (K,) spherical) are moments of some weighted
    rows: counts >= 0 and every variance they imply >= 0 (Cauchy-Schwarz:
    ``counts_k * second_k[j, j] >= sums_k[j]^2``, to a relative 1e-9).

    Raises:
        ModelFormatError: naming the tensors ``name.counts`` / ``name.second``.
    """
    check_positive(
        counts, f"the tensor '{name}.counts'", "counts are sums of weights", allow_zero=True
    )
    k, d = sums.shape
    shapes = {"full": (k, d, d), "tied": (d, d), "diag": (k, d), "spherical": (k,)}
    if tuple(second.shape) != shapes[covariance_type]:
        raise ModelFormatError(
            f"the tensor '{name}.second' has shape {tuple(second.shape)}; the model implies "
            f"{shapes[covariance_type]}."
        )
    if covariance_type in ("full", "tied"):
        second = second.diagonal(dim1=-2, dim2=-1)
    squares = sums.square()
    safe = torch.where(counts > 0, counts, torch.ones_like(counts))[:, None]
    floor = torch.where(counts[:, None] > 0, squares / safe, squares)  # (K, d)
    if covariance_type == "tied":
        floor = floor.sum(0)
    elif covariance_type == "spherical":
        floor = floor.sum(1)
    scale = float(second.abs().max()) if second.numel() else 0.0
    if bool((second < floor - 1e-9 * max(scale, float(floor.abs().max()))).any()):
        raise ModelFormatError(
            f"the tensor '{name}.second' is smaller than its sums and counts allow (a negative "
            "variance): the statistics are not moments of any rows."
        )


def log_density_bound(log_density_at_modes: torch.Tensor) -> float:
    """An upper bound on ``log p(x)`` over every ``x`` for a mixture of unimodal symmetric
    components (Gaussian, Student-t), from its log-density at the component means
    (n_components,): ``p(x) = sum_k w_k f_k(x) <= sum_k w_k f_k(m_k) <= sum_k p(m_k)``."""
    return float(torch.logsumexp(log_density_at_modes.double().reshape(-1), 0))


def mixture_log_density_bound(params: MixtureParams) -> float:
    """``log_density_bound`` of a Gaussian mixture: the highest ``log p(x)`` it gives any
    row is at most the log-sum-exp of its log-density at its means."""
    with torch.no_grad():
        return log_density_bound(score_samples(params, params.means))


def check_threshold(threshold: float, decision_scores: np.ndarray) -> None:
    """``threshold`` is a quantile of the training ``decision_scores`` (n_samples,): it lies
    within their finite range.

    Raises:
        ModelFormatError: naming ``threshold_`` and the range.
    """
    finite = decision_scores[np.isfinite(decision_scores)]
    if finite.size == 0:
        raise ModelFormatError("the tensor 'decision_scores' holds no finite score.")
    low, high = float(finite.min()), float(finite.max())
    slack = 1e-9 * max(1.0, abs(low), abs(high))
    if not low - slack <= threshold <= high + slack:
        raise ModelFormatError(
            f"the attribute 'threshold_' ({threshold:.6g}) is outside the training scores' "
            f"range [{low:.6g}, {high:.6g}] in 'decision_scores'; a threshold is a quantile "
            "of them."
        )


def check_reachable_scores(decision_scores: np.ndarray, bound: float) -> None:
    """No training score ``-log p(x)`` (n_samples,) is below ``-bound``, ``bound`` the
    highest ``log p`` the loaded model gives any row (to a relative 1e-3: the scores may have
    been computed in float32).

    Raises:
        ModelFormatError: the model cannot have produced the stored scores.
    """
    best = -float(np.min(decision_scores))
    if best > bound + 1e-3 * max(1.0, abs(bound), abs(best)):
        raise ModelFormatError(
            f"the tensor 'decision_scores' holds a training score with log p(x) = {best:.6g}, "
            f"but the stored model gives no row more than {bound:.6g}: its parameters (e.g. "
            "covariances) do not belong to these scores."
        )


def check_scores(detector) -> None:
    """A loaded detector's ``threshold_`` and ``decision_scores_`` agree with each other and
    with its model (``check_threshold``, ``check_reachable_scores`` with the detector's
    ``_log_density_bound()``, when it has one and it is not ``None``); a model without
    training scores (a classifier) is left alone."""
    scores = getattr(detector, "decision_scores_", None)
    if scores is None:
        return
    scores = np.asarray(scores, dtype=np.float64)
    if not hasattr(detector, "client_thresholds_"):  # a conformal one is not a quantile of them
        check_threshold(float(detector.threshold_), scores)
    bound = getattr(detector, "_log_density_bound", None)
    value = None if bound is None else bound()
    if value is not None:
        # an unlabelled detector's log p(x) adds its PCA front end's residual term
        pca = None if getattr(detector, "_labelled", False) else getattr(detector, "pca_", None)
        check_reachable_scores(scores, value + residual_bound(pca))


def residual_bound(projection) -> float:
    """The highest log-density the PCA front end's residual term gives any row (the
    isotropic Gaussian on the discarded directions at a zero residual:
    ``-(d - q) / 2 * log(2 pi sigma^2)``); 0 without a projection or a discarded direction."""
    if projection is None or projection.n_components == projection.n_features:
        return 0.0
    rest = projection.n_features - projection.n_components
    if not projection.noise_variance > 0:  # an older file's chain projection: no residual
        return 0.0
    return -0.5 * rest * math.log(2 * math.pi * projection.noise_variance)


def _short(value: Any, limit: int = 40) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."
