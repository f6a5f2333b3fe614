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


class DataLossWarning(UserWarning):
    """Rows or clients a fit could not use, said aloud instead of lost silently.

    One category for every such loss, so that it can be filtered as one
    (``warnings.simplefilter("error", DataLossWarning)`` makes each an error;
    ``"ignore"`` silences them):

    - a client that released nothing in some or all of a fit's rounds: below its privacy
      floor (``Privacy.min_rows``), or too few rows for what a round asks (a local fit's
      components, a k-NN distance); its rows do not inform those rounds;
    - a federation of several clients reduced to one: every other client released nothing,
      so the model is that client's alone;
    - mixture components emptied in fit: a fitted ``weights_`` entry backed by less than
      one training row (``n_components_`` still counts it);
    - a mixture fitted with fewer components than ``n_components`` asked: its own subclass,
      :class:`FewerComponentsWarning`.
    """


class FewerComponentsWarning(DataLossWarning):
    """A mixture fitted with fewer components (``n_components_``) than ``n_components``
    asked, because the clients' privacy floors could not back K.

    A client forms at most ``n_rows // min_rows`` k-means clusters (``Privacy.min_rows``);
    where the centroids the clients sent, or the rows backing each centre in a Lloyd round,
    are too few for K centres, federated EM (``init_params="kmeans"``) fits fewer. The
    message says how many components were fitted, how many centroids the clients sent (and
    any merge of the centres), and what to do. A :class:`DataLossWarning`, so that filter
    covers it too; ``warnings.simplefilter("error", FewerComponentsWarning)`` refuses such a
    fit instead (exactly K or an error).
    """


class ConformalCalibrationWarning(UserWarning):
    """A split-conformal calibration (``calibration="conformal"``) that cannot give some
    clients the guarantee it promises, said aloud:

    - a client with fewer calibration rows than ``alpha`` needs for a threshold of its own
      (``ceil(1 / alpha) - 1``; none at all: not in a ``partial_fit`` window) takes the
      federation's threshold, which holds for the federation's rows, not for that client's;
    - a client with fewer held-out rows than its privacy floor (``Privacy.min_rows``)
      releases no calibration histogram: its scores are not in the federation's threshold;
    - a federation whose released calibration scores are too few for ``alpha``: its
      threshold (``threshold_``) is ``+inf`` and raises no alarm.

    The warning names the clients, the rows they had and the rows they would need.
    """


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
