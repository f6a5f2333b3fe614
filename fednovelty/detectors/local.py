"""``LocalGMMDetector``: the local-only baseline, every client its own mixture."""

from __future__ import annotations

import warnings
from typing import ClassVar

import numpy as np
import torch
from sklearn.utils._param_validation import StrOptions

from fednovelty.detectors._option_fields import REMEDIES
from fednovelty.detectors._params import Param, declare, option, store
from fednovelty.detectors.fedgengmm import (
    LOCAL_DP,
    LOCAL_FIT_DOCS,
    LOCAL_PRIOR_DOCS,
    LOCAL_PRIVACY_DOCS,
    LOCAL_SAMPLING,
    _LocalFitDetector,
)
from fednovelty.detectors.options import Prior, Privacy
from fednovelty.detectors.persistence import (
    check_probabilities,
    get_attr,
    get_tensor,
    mixture_log_density_bound,
)
from fednovelty.exceptions import ModelFormatError
from fednovelty.federated import LocalGMMs
from fednovelty.mixture import score_samples


def _warn_single_row_clients(parts: list[np.ndarray], client_ids: np.ndarray) -> None:
    """Warn, naming them, about clients (rows ``parts[c]``, n_c x n_features) with more than
    one row, all copies of one row: each such client's model is a narrow spike there."""
    single = [
        cid
        for cid, part in zip(client_ids.tolist(), parts, strict=True)
        if part.shape[0] > 1 and not np.ptp(part, axis=0).any()
    ]
    if single:
        warnings.warn(
            f"client(s) {single} hold copies of a single row: each one's model is a narrow "
            "spike at that row (rows near it score as very normal; with combine='mean' the "
            "spike would dominate every score). Check those clients' data.",
            UserWarning,
            stacklevel=4,
        )


class LocalGMMDetector(_LocalFitDetector):
    """Local-only baseline: every client fits its own mixture; nothing is aggregated.

    A row's ``score_samples`` combines the client models' densities ``p_c(x)``:

    - ``combine="mixture"`` (default): ``log sum_c w_c p_c(x)`` with ``w_c`` each fitted
      client's share of the rows, the log-density of the pooled rows under the client models
      (the union FedGenGMM samples from). A client whose model is a narrow spike (e.g. it holds
      copies of one row) adds density near its spike only.
    - ``combine="mean"``: ``mean_c log p_c(x)``, the average of the client models' scores
      (the FedGenGMM paper's "local" baseline; not a normalised density). One such spike
      client dominates it: far from its spike its log-density falls much faster than the
      others', so the score becomes the distance to that one row.

    Fitting warns, naming them, about clients whose rows are all copies of one row.

    Attributes:
        client_models_: list of client ``MixtureParams`` (clients with enough rows).
        client_shares_: (n_models,) each fitted client's share of the fitted rows, in
            ``client_models_`` order.
        client_n_components_, skipped_clients_: K chosen by each client; clients left out.
        privacy_spent_: with ``privacy.epsilon`` (each client's DP-EM fit in the public box
            of ``privacy.bounds``, as ``FedGenGMMDetector``'s), what the fit spent:
            ``epsilon``, ``delta``, the noisy ``releases`` (``local_iterations``),
            ``noise_multiplier``.
        history_: the one round; decision_scores_, threshold_, labels_: PyOD's outputs.

    ``score_samples_client(X, client)`` scores with one client's own mixture (``client`` a
    client id given in ``groups``, a number or a name).

    ``fit(X, groups=g, callbacks=[hook])`` calls ``hook`` with the one round's
    ``RoundRecord``, as ``FedGenGMMDetector`` does.
    """

    _algorithm = LocalGMMs
    #: Files saved before ``combine`` existed were scored with the mean of log-densities.
    _legacy_params: ClassVar[dict] = {"combine": "mean"}

    _renamed_params: ClassVar[dict] = {"covariance_prior": "prior_strength"}
    _pca_front_end = True
    _params = declare(
        Param(
            "combine",
            "mixture",
            [StrOptions({"mixture", "mean"})],
            '``"mixture"`` or ``"mean"``: how the client models\' densities make one score '
            "(above).",
            "estimator",
        ),
        option(Prior, fields=REMEDIES, docs=LOCAL_PRIOR_DOCS),
        LOCAL_SAMPLING,
        option(Privacy, fields=LOCAL_DP, docs=LOCAL_PRIVACY_DOCS),
        docs=LOCAL_FIT_DOCS,
    )

    def __init__(
        self,
        client_components=None,
        k_range=(1, 10),
        *,
        min_client_samples=2,
        covariance_type="full",
        reg_covar=1e-06,
        tol=0.001,
        max_iter=100,
        combine="mixture",
        prior=None,
        pca_components="auto",
        sampling=None,
        privacy=None,
        contamination=0.1,
        calibration="contamination",
        alpha=0.01,
        calibration_share=0.2,
        random_state=None,
        device=None,
        dtype="float64",
        progress=False,
    ) -> None:
        store(self, locals())

    def _fit_clients(self, parts, clients, seed, labels=None) -> None:
        _warn_single_row_clients(parts, self.client_ids_)
        state = self._run(clients, seed)
        self._set_client_models(state)

    def _set_result(self, result) -> None:
        super()._set_result(result)
        self._set_client_models(result.state)

    def _set_client_models(self, state) -> None:
        """``client_models_`` and ``client_shares_`` from a finished run, by client id."""
        ids = sorted(state.client_models)
        options = self._torch_options()
        self.client_models_ = [state.client_models[c].to(**options) for c in ids]
        sizes = np.array([float(state.client_sizes[c]) for c in ids])
        self.client_shares_ = sizes / sizes.sum()

    def _log_density(self, X: torch.Tensor) -> torch.Tensor:
        scores = torch.stack([score_samples(m, X) for m in self.client_models_])
        if self.combine == "mean":
            return scores.mean(0)
        if not hasattr(self, "client_shares_"):
            raise ValueError(
                "this LocalGMMDetector was saved without its clients' sizes (an older "
                "fednovelty); score it with combine='mean', or fit it again."
            )
        log_weights = torch.as_tensor(self.client_shares_).to(scores).log()
        return torch.logsumexp(scores + log_weights[:, None], dim=0)

    def score_samples_client(self, X, client) -> np.ndarray:
        """``log p_c(x)`` under one client's own mixture, shape (n_samples,); with the PCA
        front end (``pca_``) its log-density of the projection plus the residual term.

        Args:
            X: rows (n_samples, n_features).
            client: a client id as given in ``groups`` at fit time (a number or a name).

        Raises:
            ValueError: ``client`` was not seen in fit, or was skipped (too few rows: it has
                no model).
        """
        Xt = self._check_score_input(X)
        ids = self.client_ids_.tolist()
        if isinstance(client, np.generic):
            client = client.item()
        if client not in ids:
            raise ValueError(
                f"client {client!r} was not seen in fit; known clients: {ids[:10]}"
                f"{'...' if len(ids) > 10 else ''}."
            )
        fitted = [c for c in ids if c in self.client_n_components_]  # client_models_' order
        if client not in fitted:
            raise ValueError(
                f"client {client!r} was skipped in fit (too few rows) and has no model; "
                "score with score_samples (every client's model)."
            )
        index = fitted.index(client)
        pca = getattr(self, "pca_", None)
        with torch.no_grad():
            if pca is None:
                scores = score_samples(self.client_models_[index], Xt)
            else:
                model = self.client_models_[index]
                scores = score_samples(model, pca.transform(Xt)) + self._residual(Xt)
        return scores.cpu().numpy().astype(np.float64)

    def _log_density_bound(self) -> float:
        """The highest ``log p(x)`` any client model gives a row: the mean of their log
        densities and their share-weighted mixture are both below it."""
        return max(mixture_log_density_bound(m) for m in self.client_models_)

    def _get_state(self):
        tensors = {}
        for i, model in enumerate(self.client_models_):
            tensors.update(self._mixture_tensors(model, f"client.{i}"))
        if hasattr(self, "client_shares_"):
            tensors["client_shares"] = torch.as_tensor(self.client_shares_)
        attrs = {
            "n_models": len(self.client_models_),
            "skipped_clients_": self.skipped_clients_,
            "client_n_components_": [[k, v] for k, v in self.client_n_components_.items()],
        }
        return tensors, attrs

    def _set_state(self, tensors, attrs) -> None:
        super()._set_state(tensors, attrs)
        n_models = get_attr(attrs, "n_models", int, minimum=1)
        if n_models > self.n_clients_:
            raise ModelFormatError(
                f"the attribute 'n_models' ({n_models}) exceeds the {self.n_clients_} clients "
                "of client_ids_; each model is one client's."
            )
        self.client_models_ = [
            self._mixture_from(tensors, f"client.{i}", self.covariance_type)
            for i in range(n_models)
        ]
        self._set_client_record(attrs)
        record = self.client_n_components_
        ks = [record[c] for c in self.client_ids_.tolist() if c in record]  # models' order
        if ks != [m.n_components for m in self.client_models_]:
            raise ModelFormatError(
                f"client_n_components_ {ks} does not match the {n_models} client models' "
                f"components {[m.n_components for m in self.client_models_]}."
            )
        if "client_shares" in tensors or self.combine == "mixture":
            weights = get_tensor(tensors, "client_shares", (n_models,))
            check_probabilities(weights, "the client shares 'client_shares'")
            self.client_shares_ = weights.numpy().astype(np.float64)
