"""Named errors. Every error about the caller's data or arguments is a ``ValueError``.

Subclasses let callers catch one kind of failure without parsing messages; the message
always says which argument was wrong, what was expected and what to do.

:class:`NotFittedError` subclasses scikit-learn's and is made on first use (PEP 562), so that
the algorithm and engine layers, which raise none, do not import scikit-learn.
"""

from __future__ import annotations

from typing import Any


class SingularCovarianceError(ValueError):
    """A component covariance is not positive definite, even after ``reg_covar``."""


class ClientDataError(ValueError):
    """A client's data cannot be used (empty, too few rows, wrong width, NaN/inf)."""


class ModelFormatError(ValueError):
    """A file is not a model saved by fednovelty, or it is damaged."""


class FederationError(RuntimeError):
    """The federation cannot go on: too few clients replied validly for
    ``max_failed_rounds`` rounds in a row, or too few nodes connected."""


def _not_fitted_error() -> type:
    from sklearn.exceptions import NotFittedError as SklearnNotFittedError

    class NotFittedError(SklearnNotFittedError):
        """A scoring method was called before ``fit`` (a scikit-learn ``NotFittedError``)."""

    NotFittedError.__module__ = __name__
    NotFittedError.__qualname__ = "NotFittedError"
    return NotFittedError


def __getattr__(name: str) -> Any:
    if name != "NotFittedError":
        raise AttributeError(f"module 'fednovelty.exceptions' has no attribute {name!r}")
    globals()[name] = value = _not_fitted_error()
    return value
