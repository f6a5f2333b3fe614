"""``FederatedClassifier``: what the federated classifiers share (``ClusteredFLClassifier``,
``VGM2Classifier``).

A classifier models ``p(y | x)`` per client and has no density of ``x``: ``fit(X, y, groups)``
runs the fit template of :class:`~fednovelty.detectors.base.SimulatedFitMixin` with labels
required (``classes_``), and a subclass trains in ``_fit_clients``. ``save``/``load`` write
and read the attributes every classifier has (:meth:`FederatedClassifier._common_attrs`,
:meth:`FederatedClassifier._restore_common`); a subclass adds its own in ``_saved_state`` and
``_set_state``.
"""

from __future__ import annotations

import os

from sklearn.base import BaseEstimator, ClassifierMixin

from fednovelty.detectors._saved_state import (
    privacy_attrs,
    restore_classifier_attrs,
    restore_privacy_spent,
)
from fednovelty.detectors.base import SimulatedFitMixin
from fednovelty.detectors.persistence import check_items, get_attr, load, save_detector


class FederatedClassifier(SimulatedFitMixin, ClassifierMixin, BaseEstimator):
    """Base class of the federated classifiers (not used directly)."""

    _fit_call = "fit(X, y, groups=...)"
    _labelled = True

    def fit(self, X, y=None, groups=None, *, callbacks=()):
        """Train on rows ``X`` with labels ``y``, split into clients by ``groups``.

        Args:
            X: rows (n_samples, n_features), numpy array or pandas DataFrame.
            y: one label per row (n_samples,), any sortable values (``classes_``).
            groups: client id of each row; ``None`` means one client.
            callbacks: callables, each called with every ``RoundRecord`` as it completes.

        Returns:
            self

        Raises:
            ValueError: ``y`` missing or not one label per row, a single class, or settings
                out of range (named).
            TypeError: ``callbacks`` is not a sequence of callables.
        """
        return self._fit(X, y, groups, callbacks)

    # -------------------------------------------------------------- persistence
    def save(self, path: str | os.PathLike) -> None:
        """Save the fitted classifier (safetensors + JSON metadata; no pickle)."""
        self._check_fitted()
        save_detector(self, path, *self._saved_state())

    @classmethod
    def load(cls, path: str | os.PathLike):
        """Load a classifier of this class saved with ``save``; the file runs no code.

        Raises:
            ModelFormatError: not a model of this class, or damaged.
        """
        return load(path, expected=cls)

    def _common_attrs(self) -> dict:
        """The JSON attributes every fitted classifier saves: its input, clients, classes,
        communication record and, after a private fit, ``privacy_spent_``."""
        return {
            "n_features_in_": self.n_features_in_,
            "feature_names_in_": (
                self.feature_names_in_.tolist() if hasattr(self, "feature_names_in_") else None
            ),
            "client_ids_": self.client_ids_.tolist(),
            "classes_": self.classes_.tolist(),
            "history_": self.history_,
            "n_rounds_": self.n_rounds_,
            "bytes_up_": self.bytes_up_,
            "bytes_down_": self.bytes_down_,
            **privacy_attrs(self),
        }

    def _restore_common(self, attrs: dict) -> None:
        """Set :meth:`_common_attrs`' attributes from a saved file's ``attrs``, validated
        (``ModelFormatError`` naming a missing, mistyped or inconsistent one)."""
        restore_classifier_attrs(self, attrs)
        self.history_ = check_items(get_attr(attrs, "history_", list), "history_", dict)
        self.n_rounds_ = get_attr(attrs, "n_rounds_", int, minimum=0)
        self.bytes_up_ = get_attr(attrs, "bytes_up_", float, minimum=0)
        self.bytes_down_ = get_attr(attrs, "bytes_down_", float, minimum=0)
        restore_privacy_spent(self, attrs)
