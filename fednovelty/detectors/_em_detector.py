"""What ``FedGMMDetector`` and ``JointFedGMMDetector`` share: the base class ``EMDetector``.

Both fit Gaussians by iterative federated EM (one EM iteration = one communication round)
after an initialisation protocol (``init_params``), optionally on the rows' projection on
``pca_components`` principal axes found by federated PCA; both keep personal mixture
weights per client, adapt the weights of a client unseen in fit (:class:`AdaptedClient`)
and save the same mixture state. A subclass builds its federated algorithm and reads its
final state (``_fit_em``), and adds its own scores and saved tensors.

An unlabelled fit (``FedGMMDetector``, ``ClusteredFedGMMDetector``) gets its projection
from the PCA front end every mixture family shares (``fednovelty.detectors.base``: federated
PCA, then EM on the projected rows, the residual term in ``log p(x)``). A joint model's
fit, whose learners see the full rows, runs federated PCA as the first step of its own
algorithm (``state.projection``), or, when rounds sample clients (``fraction < 1`` or
``dropout > 0``) or the axes are chosen by the server (``"auto"``), in a simulation of its
own first (:meth:`EMDetector._fit_after_pca`). Rounds are numbered ``1..n_rounds_``.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass
from numbers import Integral

import numpy as np
import torch
from sklearn.exceptions import ConvergenceWarning

from fednovelty.detectors._dp import DPPlan
from fednovelty.detectors._params import front_end_axes
from fednovelty.detectors.base import MixtureDetector
from fednovelty.detectors.persistence import (
    check_probabilities,
    get_tensor,
    iteration_record,
    mixture_log_density_bound,
    restore_iteration_record,
)
from fednovelty.federated.mixtures.pca import FederatedPCA, PCAProjection
from fednovelty.federated.trust.privacy import DEFAULT_MAX_CLUSTERS
from fednovelty.mixture import WeightsFit, score_samples


@dataclass(frozen=True)
class AdaptedClient:
    """Mixture weights of a client unseen in training (from ``adapt``); pass it as
    ``client=`` to any scoring method of the detector that made it.

    Attributes:
        weights: (M1, M2) joint weights ``pi`` (joint models) or (M1,) mixture weights.
        trace: weights after each EM iteration, (n_iter + 1, *weights.shape); row 0 = global.
        mean_log_likelihoods: (n_iter,) mean log-likelihood of the rows before each update.
        n_samples: rows used; n_iter, converged: the EM run; labelled: whether y was used;
        joint: whether it belongs to a joint model.
    """

    weights: np.ndarray
    trace: np.ndarray
    mean_log_likelihoods: np.ndarray
    n_samples: int
    n_iter: int
    converged: bool
    labelled: bool
    joint: bool


class EMDetector(MixtureDetector):
    """Base class of ``FedGMMDetector`` and ``JointFedGMMDetector`` (not used directly).

    Subclasses set ``_joint`` (whether ``adapt`` handles hold (M1, M2) joint weights) and
    implement ``_fit_em`` and ``_personal_weights``.
    """

    _joint = False
    _pca_front_end = True

    def max_fit_rounds(self, n_features: int | None = None) -> int:
        """Most rounds ``fit`` can run on rows ``n_features`` wide: federated PCA's where
        ``pca_components`` engages it (``_front_end_rounds``), the initialisation's
        (``init_params``, ``Initialisation.kmeans_rounds``) and ``max_iter`` EM rounds."""
        from fednovelty.federated import FederatedEM

        init = FederatedEM(
            1,
            init_params=self.init_params,
            max_iter=self.max_iter,
            kmeans_rounds=self._option("initialisation").kmeans_rounds,
        )
        return init.max_rounds + self._front_end_rounds(n_features)

    # -------------------------------------------------------------- fitting
    def _fit_clients(self, parts, clients, seed, labels=None) -> None:
        self._fit_rounds(clients, seed, labels)

    def _fit_rounds(self, clients: list[torch.Tensor], seed: int, labels=None) -> None:
        """Run the fit's federation and set the fitted attributes.

        Args:
            clients: each client's rows (n_c, n_features), in ``client_ids_`` order.
            seed: the fit's seed.
            labels: each client's integer label codes (n_c,) (joint model), or None.
        """
        n_total = sum(c.shape[0] for c in clients)
        if self.n_components > n_total:
            raise ValueError(
                f"n_components={self.n_components} must be <= n_samples={n_total}; lower "
                "n_components or provide more rows."
            )
        if labels is None:  # the PCA front end (base) has projected the rows where asked
            self._fit_em(clients, seed, pca_components=None)
            return
        q = front_end_axes(self.pca_components, clients[0].shape[1])
        if q is not None and self._option("privacy").epsilon is not None:
            raise ValueError(
                "the federated PCA rounds have no private form; use pca_components=None "
                "with privacy.epsilon (or a public projection of the rows before fit)."
            )
        codes = [torch.as_tensor(p, device=clients[0].device) for p in labels]
        sampling = self._option("sampling")
        if q is not None and (q == "auto" or sampling.fraction < 1 or sampling.dropout > 0):
            self._fit_after_pca(clients, seed, codes, q)
            return
        data = list(zip(clients, codes, strict=True))
        result = self._fit_em(data, seed, pca_components=q)
        self._set_projection(result.state.projection)

    def _fit_after_pca(self, clients: list[torch.Tensor], seed: int, codes, q) -> None:
        """A joint model's fit with ``q`` principal axes (an int or ``"auto"``) when rounds
        sample clients (``fraction < 1`` or ``dropout > 0``) or the server picks the axes:
        federated PCA's two rounds run on every client in a simulation of their own, then
        the EM algorithm runs on the projected rows with the client sampling. ``history_``
        and the byte totals are built from both runs, rounds numbered on across them."""
        pca = self._simulate(FederatedPCA(q, **self._torch_options()), clients, seed, full=True)
        self._set_projection(pca.state.projection)
        views = [self.pca_.transform(c) for c in clients]
        data = views if codes is None else list(zip(views, codes, clients, strict=True))
        em = self._fit_em(data, seed, pca_components=None, round_offset=len(pca.history))
        offset = len(pca.history)
        self.history_ = [r.as_dict() for r in pca.history] + [
            {**r.as_dict(), "round": r.round + offset} for r in em.history
        ]
        self.n_rounds_ = offset + len(em.history)
        self.bytes_up_ = pca.bytes_up + em.bytes_up
        self.bytes_down_ = pca.bytes_down + em.bytes_down

    def _fit_em(self, data: list, seed: int, *, pca_components, round_offset: int = 0):
        """Run the subclass's EM algorithm (with the ``pca_components`` step when given) on
        ``data``, one entry per client: its rows, or ``(rows, label codes)`` /
        ``(Gaussian view, label codes, rows)`` for the joint model. Sets the fitted
        attributes and returns the ``SimulationResult``."""
        raise NotImplementedError

    def _set_projection(self, projection: PCAProjection | None) -> None:
        if projection is not None:
            self.pca_ = projection
        elif hasattr(self, "pca_"):
            del self.pca_

    def _em_options(
        self, seed: int, pca_components: int | None, width: int, config: type | None = None
    ) -> dict:
        """Arguments of the federated EM algorithms: the declared settings (for Gaussians
        over ``width`` features; with ``config``, those it has), the fit's
        ``pca_components`` step, seed and torch options."""
        return {
            **self._settings(width, config),
            "pca_components": pca_components,
            "random_state": seed,
            **self._torch_options(),
        }

    def _em_engine(self, plan: DPPlan | None = None) -> dict:
        """The EM simulation's engine options: client sampling, dropout and the simulated
        clients' privacy policy (the user owns them, so they answer the ``subset`` round when
        ``init_params="subset"`` asks for it, and form as many local clusters as
        ``n_components``; with a differential-privacy ``plan``, its clients' policy)."""
        privacy = self._privacy_policy(
            allow_raw_rows=self.init_params == "subset",
            max_clusters=max(DEFAULT_MAX_CLUSTERS, int(self.n_components)),
            dp=None if plan is None else plan.policy,
            dp_sgd=None if plan is None else plan.sgd,
        )
        return {**self._engine_settings(), "privacy": privacy}

    def _set_em_state(self, state) -> None:
        """The mixture and EM record of a finished ``EMState``."""
        self._set_mixture(state.params)
        self.n_iter_ = state.n_iter
        self.converged_ = state.converged
        self.lower_bounds_ = list(state.lower_bounds)

    def _warn_if_not_converged(self) -> None:
        if not self.converged_ and self._option("privacy").epsilon is None:
            warnings.warn(
                f"Federated EM did not converge in max_iter={self.max_iter} rounds (last change "
                "in mean log-likelihood above tol). Increase max_iter or tol.",
                ConvergenceWarning,
                stacklevel=6,  # the caller's fit(...)
            )

    def _client_weight_matrix(self, weights: dict[int, torch.Tensor]) -> np.ndarray:
        """(n_clients, n_components); a client that never replied gets the global weights."""
        rows = [weights.get(c, self.model_.weights) for c in range(self.n_clients_)]
        return torch.stack(rows).cpu().numpy()

    # -------------------------------------------------------------- scoring
    def _gmm_input(self, X: torch.Tensor) -> torch.Tensor:
        """The Gaussians' view of rows (n, n_features): their federated-PCA projection
        (n, pca_components) when ``pca_components`` is set, else the rows themselves."""
        pca = getattr(self, "pca_", None)
        return X if pca is None else pca.transform(X)

    def _log_density(self, X: torch.Tensor) -> torch.Tensor:
        """log p of rows the Gaussians see (n, width): projected by the caller
        (``_x_log_density``) under a PCA projection."""
        return score_samples(self.model_, X)

    def _log_density_bound(self) -> float:
        """The highest ``log p(x)`` the mixture gives any row (``log_density_bound``; in the
        projected space with ``pca_components``, where the density is taken)."""
        return mixture_log_density_bound(self.model_)

    def _personal_weights(self) -> np.ndarray:
        """Each fitted client's personal weights, rows in ``client_ids_`` order."""
        raise NotImplementedError

    def _log_pi(self, client, like: torch.Tensor) -> torch.Tensor | None:
        """``log pi`` of ``client`` (an id seen in fit or an ``adapt`` handle) on ``like``'s
        device and dtype, shaped as ``_personal_weights`` rows; None for ``client=None``."""
        if client is None:
            return None
        if isinstance(client, AdaptedClient):
            if client.weights.shape[0] != self.n_components_ or client.joint != self._joint:
                raise ValueError(
                    "this AdaptedClient was made by another model; call adapt on this detector."
                )
            return torch.as_tensor(client.weights).to(like).log()
        index = self._client_index(client)
        return torch.as_tensor(self._personal_weights()[index]).to(like).log()

    def _adapt_rows(self, X, max_iter) -> torch.Tensor:
        """``adapt``'s rows as validated torch rows (at least 2), ``max_iter`` checked."""
        Xt = self._check_score_input(X)
        if Xt.shape[0] < 2:
            raise ValueError(
                f"adapt needs at least 2 rows of the new client to re-estimate its mixture "
                f"weights; got {Xt.shape[0]}."
            )
        if not isinstance(max_iter, Integral) or max_iter < 1:
            raise ValueError(f"max_iter must be an integer >= 1, got {max_iter!r}.")
        return Xt

    def _adapted(self, result: WeightsFit, n_samples: int, labelled: bool) -> AdaptedClient:
        return AdaptedClient(
            weights=result.log_weights.exp().cpu().numpy(),
            trace=result.trace.cpu().numpy(),
            mean_log_likelihoods=result.mean_log_likelihoods.cpu().numpy(),
            n_samples=int(n_samples),
            n_iter=result.n_iter,
            converged=result.converged,
            labelled=labelled,
            joint=self._joint,
        )

    # -------------------------------------------------------------- persistence
    def _get_state(self):
        tensors = self._mixture_tensors(self.model_, "model")
        if hasattr(self, "client_weights_"):
            tensors["client_weights"] = torch.as_tensor(self.client_weights_)
        return tensors, iteration_record(self)

    def _set_state(self, tensors, attrs) -> None:
        super()._set_state(tensors, attrs)
        pca = getattr(self, "pca_", None)  # a joint model's Gaussians see the projection
        width = None if pca is None else pca.n_components
        self._set_mixture(self._mixture_from(tensors, "model", self.covariance_type, width))
        restore_iteration_record(self, attrs, finite=False)
        if "client_weights" in tensors:
            shape = (self.n_clients_, self.n_components_)
            weights = get_tensor(tensors, "client_weights", shape)
            check_probabilities(weights, "the rows of 'client_weights'")
            self.client_weights_ = weights.numpy()


__all__ = ["AdaptedClient", "EMDetector"]
