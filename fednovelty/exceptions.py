"""Named errors. Every error about the caller's data or arguments is a ``ValueError``.

Subclasses let callers catch one kind of failure without parsing messages; the message
always says which argument was wrong, what was expected and what to do.
"""

from __future__ import annotations

from sklearn.exceptions import NotFittedError as _SklearnNotFittedError


class SingularCovarianceError(ValueError):
    """A component covariance is not positive definite, even after ``reg_covar``."""


class ClientDataError(ValueError):
    """A client's data cannot be used (empty, too few rows, wrong width, NaN/inf)."""


class ModelFormatError(ValueError):
    """A file is not a model saved by fednovelty, or it is damaged."""


class NotFittedError(_SklearnNotFittedError):
    """A scoring method was called before ``fit`` (a scikit-learn ``NotFittedError``)."""


class FederationError(RuntimeError):
    """The federation cannot go on: too few clients replied validly for
    ``max_failed_rounds`` rounds in a row, or too few nodes connected."""
