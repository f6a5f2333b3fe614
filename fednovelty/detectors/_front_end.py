"""The federated PCA front end every mixture family that has it shares (``pca_components``;
``docs/high_dimension.md``).

``_fit`` runs federated PCA on the clients' rows first (:meth:`FrontEndMixin._front_end`),
then the family's own fit on the projected rows (:class:`ClientViews`), its algorithm
wrapped so that the server sends the projection and each client projects its own rows
(``fednovelty.federated.mixtures.projected.Projected``, in ``_simulate``); the PCA rounds come
first in ``history_`` (:meth:`FrontEndMixin._join_front_end_record`) and ``score_samples``
adds the probabilistic-PCA residual term of the discarded directions
(:meth:`FrontEndMixin._residual`). A class takes the front end with ``_pca_front_end = True``
and the ``_params.PCA`` group (:func:`check_front_end_params`).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable

import numpy as np
import torch

from fednovelty.detectors import _params
from fednovelty.federated.mixtures.pca import FederatedPCA, PCAProjection
from fednovelty.mixture.ppca import residual_log_density

__all__ = ["ClientViews", "FrontEndMixin", "FrontEndRun", "check_front_end_params"]


@dataclasses.dataclass(frozen=True)
class FrontEndRun:
    """The PCA front end of a running fit: what ``_simulate`` needs to wrap the family's
    algorithm (:class:`~fednovelty.federated.mixtures.projected.Projected`).

    Attributes:
        projection: the fitted federated PCA.
        resend: rounds sample clients (the projection goes with every broadcast).
        pca: the PCA rounds' ``SimulationResult``.
    """

    projection: PCAProjection
    resend: bool
    pca: object


class ClientViews(list):
    """The PCA front end's clients: the projected rows (n_c, q) of each client, in client
    order, with ``rows``, each client's original rows (n_c, d) at the same index.

    ``_fit`` passes them to ``_fit_clients``; :meth:`SimulatedFitMixin._simulate` given this
    list (not a plain list of tensors) runs the family's algorithm wrapped in ``Projected``
    on ``rows``, the clients projecting their own rows.
    """

    def __init__(self, views: Iterable[torch.Tensor], rows: Iterable[torch.Tensor]) -> None:
        super().__init__(views)
        self.rows = list(rows)
        if len(self.rows) != len(self):
            raise ValueError(f"{len(self)} client views but rows of {len(self.rows)} clients.")


def check_front_end_params(cls: type) -> None:
    """Whether ``cls``, which declares its own ``_params``, takes the PCA front end: only if
    they declare ``pca_components`` (what the front end reads). A class that inherits
    ``_pca_front_end = True`` but declares no ``pca_components`` (e.g. a streaming model whose
    later windows would not be projected) does not; one that sets it itself must declare it.

    Raises:
        TypeError: ``_pca_front_end = True`` set on ``cls`` itself without ``pca_components``
            in its ``_params``.
    """
    if "pca_components" in cls.__dict__["_params"].names:
        return
    if cls.__dict__.get("_pca_front_end", False):
        raise TypeError(
            f"{cls.__name__} sets _pca_front_end = True but its __init__ does not take "
            "pca_components (the shared fednovelty.detectors._params.PCA parameter); write "
            "it, or set _pca_front_end = False."
        )
    cls._pca_front_end = False


class FrontEndMixin:
    """The PCA front end's part of an estimator's fit and scores (the module doc)."""

    def _front_end_rounds(self, n_features: int | None = None) -> int:
        """Federated PCA's rounds that ``fit`` runs before the family's on rows ``n_features``
        wide (default: the fitted ``n_features_in_``): ``FederatedPCA.max_rounds`` (2) when
        ``pca_components`` engages the front end there, else 0. ``"auto"`` engages above
        ``AUTO_PCA_FEATURES`` features, so on an unknown width (``n_features`` not given, the
        estimator not fitted) its rounds are not counted: the total is then the family's."""
        value = getattr(self, "pca_components", None)
        if not self._pca_front_end or value is None:
            return 0
        if value == "auto":
            width = n_features if n_features is not None else getattr(self, "n_features_in_", 0)
            return FederatedPCA.max_rounds if width > _params.AUTO_PCA_FEATURES else 0
        return FederatedPCA.max_rounds

    def _front_end(
        self, parts: list[np.ndarray], clients: list[torch.Tensor], seed: int
    ) -> tuple[list[np.ndarray], list[torch.Tensor]]:
        """Run federated PCA when ``pca_components`` asks for it on these rows (sets
        ``pca_``, else removes it) and return the clients' projected rows, as arrays and
        tensors (n_c, q), the tensors as :class:`ClientViews` (which ``_simulate`` runs
        projected); the rows unchanged without a front end.

        Raises:
            ValueError: ``pca_components`` above the rows' width, or the front end with
                ``Privacy.epsilon`` (the PCA rounds have no private form).
        """
        # an estimator of a front-end family that does not declare the parameter has none
        value = getattr(self, "pca_components", None)
        q = _params.front_end_axes(value, clients[0].shape[1])
        if q is None:
            self.__dict__.pop("pca_", None)
            return parts, clients
        if self._option("privacy").epsilon is not None:
            raise ValueError(
                f"pca_components={value!r} projects these "
                f"{clients[0].shape[1]}-feature rows with federated PCA, whose rounds have no "
                "private form; use pca_components=None with privacy.epsilon (or a public "
                "projection of the rows before fit)."
            )
        pca = self._simulate(FederatedPCA(q, **self._torch_options()), clients, seed, full=True)
        self.pca_ = pca.state.projection
        views = ClientViews([self.pca_.transform(c) for c in clients], clients)
        sampling = self._option("sampling")
        sampled = sampling.fraction < 1 or sampling.dropout > 0
        self._front_end_run = FrontEndRun(self.pca_, sampled, pca)
        return [v.cpu().numpy() for v in views], views

    def _join_front_end_record(self) -> None:
        """Put the PCA rounds first in ``history_`` and the byte totals (the family's rounds,
        numbered after them, are already there)."""
        front = self.__dict__.get("_front_end_run")
        if front is None:
            return
        pca = front.pca
        family = [r for r in getattr(self, "history_", []) if r["round"] > len(pca.history)]
        self.history_ = [r.as_dict() for r in pca.history] + family
        self.n_rounds_ = len(self.history_)
        if family:  # the totals of the family's run are the last ones _simulate set
            self.bytes_up_ += pca.bytes_up
            self.bytes_down_ += pca.bytes_down

    def _residual(self, X: torch.Tensor) -> torch.Tensor:
        """The PCA front end's residual log-density of rows (n, n_features) -> (n,): zeros
        without a projection (or one without a discarded direction's variance)."""
        pca = getattr(self, "pca_", None)
        if pca is None or pca.n_components == pca.n_features or not pca.noise_variance > 0:
            return X.new_zeros(X.shape[0])
        return residual_log_density(X, pca.mean, pca.components, pca.noise_variance)
