"""What a mixture detector saves and how it restores it (``save``/``load``).

:class:`SavedStateMixin` writes the common fitted attributes (the inputs, the threshold (or,
with ``calibration="conformal"``, the calibration it is recomputed from:
``fednovelty.detectors._conformal_state``), the record of the rounds, a private fit's
``privacy_spent_``, the PCA front end's projection, the training scores unless the fit was
private) and the subclass's ``_get_state``, and restores them validated (``_set_state``,
:func:`restore_inputs`; the front end's projection as ``pca.*`` tensors, :func:`pca_tensors`,
:func:`pca_from`); ``fednovelty.detectors.persistence`` reads and writes the file.
"""

from __future__ import annotations

import os

import numpy as np
import torch

from fednovelty.detectors._probability import finite_moments
from fednovelty.detectors.persistence import (
    check_items,
    check_mixture,
    get_attr,
    get_tensor,
    load,
    save_detector,
)
from fednovelty.exceptions import ModelFormatError
from fednovelty.federated.mixtures.pca import PCAProjection
from fednovelty.mixture import MixtureParams

__all__ = [
    "SavedStateMixin",
    "pca_from",
    "pca_tensors",
    "restore_classifier_attrs",
    "restore_inputs",
]


class SavedStateMixin:
    """``save`` and ``load`` of a mixture detector (the module doc)."""

    def save(self, path: str | os.PathLike) -> None:
        """Save the fitted detector to ``path`` (safetensors + JSON metadata; no pickle)."""
        self._check_fitted()
        save_detector(self, path, *self._saved_state())

    def _saved_state(self) -> tuple[dict[str, torch.Tensor], dict]:
        """Every tensor and JSON attribute ``save`` writes (the common ones, then the
        subclass's ``_get_state``)."""
        # a private model's file keeps no exact value of a training row: no per-row score
        private = hasattr(self, "privacy_spent_")
        tensors = {} if private else {"decision_scores": torch.as_tensor(self.decision_scores_)}
        attrs = {
            "n_features_in_": self.n_features_in_,
            "feature_names_in_": (
                self.feature_names_in_.tolist() if hasattr(self, "feature_names_in_") else None
            ),
            "client_ids_": self.client_ids_.tolist(),
            "threshold_": float(self.threshold_),
            "history_": getattr(self, "history_", []),
            "n_rounds_": getattr(self, "n_rounds_", 0),
            "bytes_up_": getattr(self, "bytes_up_", 0),
            "bytes_down_": getattr(self, "bytes_down_", 0),
        }
        if hasattr(self, "effective_n_components_"):  # files saved before it lack it
            attrs["effective_n_components_"] = int(self.effective_n_components_)
        attrs.update(privacy_attrs(self))
        calibration, calibration_attrs = self._calibration_state()
        if calibration:  # threshold_ is recomputed from the saved histogram
            del attrs["threshold_"]
            tensors.update(calibration)
            attrs.update(calibration_attrs)
        if self._pca_front_end and hasattr(self, "pca_"):
            tensors.update(pca_tensors(self.pca_))
        extra_tensors, extra_attrs = self._get_state()
        return {**tensors, **extra_tensors}, {**attrs, **extra_attrs}

    @classmethod
    def load(cls, path: str | os.PathLike):
        """Load a detector of this class saved with ``save``; the file runs no code.

        Raises:
            ModelFormatError: not a model of this class, or damaged (see
                ``fednovelty.detectors.persistence``: the message names what is wrong).
        """
        return load(path, expected=cls)

    def _get_state(self) -> tuple[dict[str, torch.Tensor], dict]:
        """Subclass tensors and JSON attributes to save."""
        return {}, {}

    def _set_state(self, tensors: dict[str, torch.Tensor], attrs: dict) -> None:
        """Restore fitted attributes from ``save``'s output, validated (``ModelFormatError``
        naming what is wrong); subclasses restore and validate their own after this."""
        restore_inputs(self, attrs)
        if self._pca_front_end and any(key.startswith("pca.") for key in tensors):
            self.pca_ = pca_from(tensors, self.n_features_in_, self._torch_options())
            if not self._labelled:  # a family restores its model at the model's width
                width = self.pca_.n_components  # (_restored puts the input width back)
                self._input_width, self.n_features_in_ = self.n_features_in_, width
        else:
            self.__dict__.pop("pca_", None)
        self.history_ = check_items(get_attr(attrs, "history_", list), "history_", dict)
        self.n_rounds_ = get_attr(attrs, "n_rounds_", int, minimum=0)
        self.bytes_up_ = get_attr(attrs, "bytes_up_", float, minimum=0)
        self.bytes_down_ = get_attr(attrs, "bytes_down_", float, minimum=0)
        if "effective_n_components_" in attrs:
            self.effective_n_components_ = get_attr(
                attrs, "effective_n_components_", int, minimum=0
            )
        restore_privacy_spent(self, attrs)
        self._restore_calibration(tensors, attrs)  # conformal: sets threshold_
        if not hasattr(self, "client_thresholds_"):
            self.threshold_ = float(get_attr(attrs, "threshold_", float))
        if hasattr(self, "privacy_spent_") and "decision_scores" not in tensors:
            for name in ("decision_scores_", "labels_", "_mu", "_sigma"):
                self.__dict__.pop(name, None)  # a private file holds no training scores
            self._classes = 2
            return
        scores = get_tensor(tensors, "decision_scores", allow_inf=True)
        if scores.ndim != 1 or scores.shape[0] == 0:
            raise ModelFormatError(
                f"the tensor 'decision_scores' must hold one score per training row, got shape "
                f"{tuple(scores.shape)}."
            )
        self.decision_scores_ = scores.numpy()
        self.labels_ = (self.decision_scores_ > self.threshold_).astype(int)
        self._classes = 2
        self._mu, self._sigma = finite_moments(self.decision_scores_)

    def _restored(self) -> None:
        """What ``load`` runs after ``_set_state``: with the PCA front end the family's
        state was restored at the projection's width (``n_features_in_`` was ``q``, so each
        family checks its model against the width it was fitted on); the input width
        comes back here."""
        width = self.__dict__.pop("_input_width", None)
        if width is not None:
            self.n_features_in_ = width

    @staticmethod
    def _mixture_tensors(params: MixtureParams, prefix: str) -> dict[str, torch.Tensor]:
        return {f"{prefix}.{k}": v for k, v in params.tensors().items()}

    def _mixture_from(
        self,
        tensors: dict[str, torch.Tensor],
        prefix: str,
        covariance_type: str,
        n_features: int | None = None,
    ) -> MixtureParams:
        """The mixture saved under ``prefix``, validated (``check_mixture``: finite, PSD,
        weights a probability vector, ``n_features`` wide; default ``n_features_in_``) and
        moved to the detector's device and dtype (while ``load`` restores a PCA front end's
        model, ``n_features_in_`` is the projection's width)."""
        width = self.n_features_in_ if n_features is None else n_features
        return check_mixture(tensors, prefix, covariance_type, width).to(**self._torch_options())


def _client_ids(ids: list) -> np.ndarray:
    """Saved client ids as an array: one kind (all strings or all numbers), distinct."""
    if not ids:
        raise ModelFormatError("client_ids_ is empty; a fitted model has at least one client.")
    kind = str if isinstance(ids[0], str) else (int, float)
    check_items(ids, "client_ids_", kind)
    if len(set(ids)) != len(ids):
        raise ModelFormatError("client_ids_ holds a client id twice.")
    return np.asarray(ids)


def restore_inputs(estimator, attrs: dict) -> None:
    """Set a saved estimator's ``n_features_in_``, ``feature_names_in_`` (or remove it),
    ``client_ids_`` and ``n_clients_`` from its JSON ``attrs``, validated.

    Raises:
        ModelFormatError: a missing, mistyped or inconsistent attribute, named.
    """
    estimator.n_features_in_ = get_attr(attrs, "n_features_in_", int, minimum=1)
    names = get_attr(attrs, "feature_names_in_", (list, type(None)))
    if names is not None:
        check_items(names, "feature_names_in_", str)
        if len(names) != estimator.n_features_in_:
            raise ModelFormatError(
                f"feature_names_in_ has {len(names)} names for n_features_in_="
                f"{estimator.n_features_in_} features."
            )
        estimator.feature_names_in_ = np.asarray(names, dtype=object)
    elif hasattr(estimator, "feature_names_in_"):
        del estimator.feature_names_in_
    estimator.client_ids_ = _client_ids(get_attr(attrs, "client_ids_", list))
    estimator.n_clients_ = len(estimator.client_ids_)


def privacy_attrs(estimator) -> dict:
    """``{"privacy_spent_": record}`` of a private fit for ``save`` (``{}`` otherwise)."""
    spent = getattr(estimator, "privacy_spent_", None)
    return {} if spent is None else {"privacy_spent_": spent}


def restore_privacy_spent(estimator, attrs: dict) -> None:
    """Set ``privacy_spent_`` from saved ``attrs``, or remove it where the file has none
    (a fit without differential privacy).

    Raises:
        ModelFormatError: a record that is not a JSON object.
    """
    if attrs.get("privacy_spent_") is not None:
        estimator.privacy_spent_ = get_attr(attrs, "privacy_spent_", dict)
    elif hasattr(estimator, "privacy_spent_"):
        del estimator.privacy_spent_


def restore_classifier_attrs(estimator, attrs: dict) -> None:
    """Set a saved federated classifier's inputs (:func:`restore_inputs`) and ``classes_``
    from its JSON ``attrs``, validated.

    Raises:
        ModelFormatError: a missing, mistyped or inconsistent attribute, named.
    """
    restore_inputs(estimator, attrs)
    classes = check_items(get_attr(attrs, "classes_", list), "classes_", (str, int, float))
    if len(classes) < 2 or len(set(classes)) != len(classes):
        raise ModelFormatError(f"classes_ must hold at least 2 distinct labels: {classes}.")
    estimator.classes_ = np.asarray(classes)


def pca_tensors(projection) -> dict[str, torch.Tensor]:
    """A federated-PCA projection's tensors under ``pca.*`` names, for ``save``."""
    return {f"pca.{k}": v for k, v in projection.tensors().items()}


def pca_from(tensors: dict[str, torch.Tensor], n_features: int, options: dict):
    """The saved federated-PCA projection (``pca.*`` tensors), checked (finite, fitted on
    ``n_features`` features, a positive row count) and moved to ``options``' device and
    dtype.

    Raises:
        ModelFormatError: a missing, damaged or inconsistent tensor, named.
    """
    parts = {
        name: get_tensor(tensors, f"pca.{name}").to(**options)
        for name in ("mean", "components", "explained_variance")
    }
    if "pca.noise_variance" in tensors:
        parts["noise_variance"] = get_tensor(tensors, "pca.noise_variance")
    n_samples = tensors.get("pca.n_samples")
    if n_samples is None or n_samples.dtype != torch.int64 or n_samples.numel() != 1:
        raise ModelFormatError("the tensor 'pca.n_samples' must be one int64 row count.")
    if int(n_samples) < 1 or tuple(parts["mean"].shape) != (n_features,):
        raise ModelFormatError(
            f"the PCA projection must be fitted on >= 1 row of {n_features} features; got "
            f"n_samples={int(n_samples)}, 'pca.mean' of shape {tuple(parts['mean'].shape)}."
        )
    noise = parts.get("noise_variance")
    if noise is not None and (noise.numel() != 1 or float(noise) < 0):
        raise ModelFormatError("the tensor 'pca.noise_variance' must be one number >= 0.")
    try:
        return PCAProjection.from_tensors({**parts, "n_samples": n_samples})
    except ValueError as error:
        raise ModelFormatError(f"the PCA projection: {error}") from None
