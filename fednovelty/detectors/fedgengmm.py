"""``FedGenGMMDetector`` (one-shot FedGenGMM) and the base it shares with ``LocalGMMDetector``:
every client fits its own mixture in one round (``_LocalFitDetector``).

With ``Privacy.epsilon`` each client fits its mixture by DP-EM in the public box of ``bounds``
(``docs/differential_privacy.md``; :mod:`fednovelty.federated.mixtures.fedgengmm`): K is fixed
(``client_components``, else the largest of ``k_range``), the fit makes ``local_iterations``
noisy releases whose noise multiplier spends at most ``epsilon`` at ``delta``
(:func:`~fednovelty.detectors._dp.dp_plan`), and ``privacy_spent_`` reports the releases
the one round made (:func:`local_fit_privacy`). The local fit carries all of its noise
whatever ``mode`` says (there is no sum to share it over), so ``mode`` changes nothing
here."""

from __future__ import annotations

from numbers import Integral
from typing import ClassVar

import torch
from sklearn.utils._param_validation import Interval

from fednovelty.detectors._dp import (
    DPPlan,
    RoundCost,
    bounds_costs,
    bounds_engine,
    bounds_record,
    bounds_rounds,
    dp_plan,
    join_private_bounds,
    privacy_record,
    run_private_bounds,
)
from fednovelty.detectors._engine_check import refuse_flower_sim
from fednovelty.detectors._option_fields import DP, REMEDIES
from fednovelty.detectors._params import Param, declare, option, store
from fednovelty.detectors.base import MixtureDetector
from fednovelty.detectors.options import ClientSampling, Prior, Privacy
from fednovelty.detectors.persistence import check_items, get_attr, mixture_log_density_bound
from fednovelty.exceptions import ModelFormatError
from fednovelty.federated import FedGenGMM
from fednovelty.mixture import score_samples
from fednovelty.mixture.copula import copula_score_samples

_POSITIVE_INT = [Interval(Integral, 1, None, closed="left")]
#: What the shared settings mean where every client fits its own mixture.
LOCAL_FIT_DOCS = {
    "max_iter": "Of each local EM fit (without ``privacy.epsilon``; with it, "
    "``privacy.local_iterations``).",
    "client_components": "Under ``privacy.epsilon`` K is fixed (BIC reads the rows and has "
    "no private form): ``client_components``, else the largest of ``k_range``.",
}
#: ... and what the prior's and the privacy's fields mean there.
LOCAL_PRIOR_DOCS = {
    "standardize": "Every fit (each client's, the server's) is on z-scores of its own rows; "
    "under ``privacy.epsilon`` a client fits in the public box of ``privacy.bounds`` instead "
    "(z-scores of its rows would depend on them) and its fit has no covariance prior.",
    "strength": "The prior makes the BIC choices favour fewer components; for cluster "
    "structure pass ``Prior(strength=None)`` (``docs/robust.md``, Limits).",
}
LOCAL_PRIVACY_DOCS = {
    "min_rows": "A client with fewer rows is skipped, fits at most ``n_rows // min_rows`` "
    "components and drops those backed by fewer rows.",
}
#: The privacy fields of the local fits: the floor, differential privacy, the DP-EM
#: iterations.
LOCAL_DP = (*DP, "local_iterations")
#: The engine of the one round (every client is asked: no sampling, no dropout).
LOCAL_SAMPLING = option(
    ClientSampling,
    fields=("engine",),
    docs={
        "engine": 'The one round asks every client. ``"flower-sim"`` refuses, at ``fit``, '
        "``privacy.epsilon`` and the PCA front end (``pca_components`` engaged)."
    },
)

#: What the shared settings mean in FedGenGMM, where the server refits the clients' union.
FEDGEN_DOCS = {
    **LOCAL_FIT_DOCS,
    "client_components": "``None``: with the covariance prior (the default) the global "
    "``n_components`` (at most ``n_rows // privacy.min_rows``); without it, or when "
    "``n_components`` is ``None`` too, BIC in ``k_range``. Under "
    "``privacy.epsilon`` K is fixed (BIC reads the rows and has no private form): "
    "``client_components``, else the largest of ``k_range``.",
}
FEDGEN_PRIOR_DOCS = {
    **LOCAL_PRIOR_DOCS,
    "strength": "Counted once, in the server's fit on its synthetic rows. A client that "
    "fits a fixed K (``client_components``, else ``n_components``) fits by maximum likelihood "
    "unless it has fewer rows than the prior's pseudo-rows; a client's BIC search (both "
    "``None``) keeps the prior, which makes it favour fewer components (``docs/robust.md``).",
}


def local_fit_privacy(plan: DPPlan, history: list[dict], n_iter: int) -> dict:
    """``privacy_spent_`` of a one-shot fit under ``plan``: each ``local_fit`` round that ran
    made ``n_iter`` noisy releases per client (its DP-EM iterations), read from the
    accountant as ``epsilon_spent(z, releases, delta)``. The client adds all of the noise
    itself, so the epsilon holds against the server that sees its reply too, and the
    ``mode`` is ``"local"`` whatever ``Privacy.mode`` was."""
    costs = {"local_fit": RoundCost(releases=int(n_iter)), **bounds_costs(plan)}
    record = {**privacy_record(plan, history, costs), **bounds_record(plan)}
    return {**record, "epsilon_against_server": record["epsilon"], "mode": "local"}


class _LocalFitDetector(MixtureDetector):
    """Shared fitting of the algorithms whose clients fit local mixtures in one round."""

    _algorithm: type = FedGenGMM

    def max_fit_rounds(self, n_features: int | None = None) -> int:
        """One round (each client fits its mixture and sends it once), after federated PCA's
        two when the front end engages on rows ``n_features`` wide (``_front_end_rounds``)."""
        return self._algorithm.max_rounds + self._front_end_rounds(n_features)

    def _front_end(self, parts, clients, seed):
        """The PCA front end (``FrontEndMixin._front_end``), after refusing what the engine
        cannot run (:func:`~fednovelty.detectors._engine_check.refuse_flower_sim`), before
        any round."""
        refuse_flower_sim(self, clients[0].shape[1])
        return super()._front_end(parts, clients, seed)

    def _run(self, clients, seed):
        if len(self.k_range) != 2:
            raise ValueError(f"k_range must be (k_min, k_max), got {self.k_range!r}.")
        plan = dp_plan(self, clients[0].shape[1], len(clients), self._dp_releases)
        # the clients add all of the noise here, the bounds round's included
        plan, box = run_private_bounds(self, plan, clients, seed, mode="local")
        algorithm = self._algorithm(
            **self._settings(clients[0].shape[1]),
            random_state=seed,
            **({} if plan is None else {"bounds": plan.settings["bounds"]}),
            **self._torch_options(),
        )
        if plan is None:
            self._check_some_client_fits(algorithm, clients)
        privacy = self._privacy_policy(dp=None if plan is None else plan.policy)
        state = self._simulate(
            algorithm,
            clients,
            seed,
            round_offset=bounds_rounds(box),
            privacy=privacy,
            **bounds_engine(box),
        )
        join_private_bounds(self, box)
        if plan is None:
            if hasattr(self, "privacy_spent_"):
                del self.privacy_spent_
        else:
            iterations = self._option("privacy").local_iterations
            self.privacy_spent_ = local_fit_privacy(plan, self.history_, iterations)
        # fit's DataLossWarning names them, with the reason each gave
        self.skipped_clients_ = self.client_ids_[state.skipped].tolist() if state.skipped else []
        ids = self.client_ids_.tolist()  # plain Python ids, whatever the array's dtype
        self.client_n_components_ = {ids[c]: m.n_components for c, m in state.client_models.items()}
        return state

    def _dp_releases(self, settings: dict) -> int:
        """The noisy releases of a private fit: each client's ``Privacy.local_iterations``
        (one round)."""
        return int(self._option("privacy").local_iterations)

    def _check_some_client_fits(self, algorithm, clients) -> None:
        """Raise ``ValueError`` (naming the setting to lower) when no client has the rows a
        local fit needs: every client would skip, a setting error rather than a federation
        that went away."""
        min_rows = self._privacy_policy().min_rows
        if any(algorithm.config.client_candidates(int(X.shape[0]), min_rows) for X in clients):
            return
        source = (
            f"client_components={self.client_components}"
            if self.client_components is not None
            else f"k_range={tuple(self.k_range)}"
        )
        raise ValueError(
            "No client could fit a local mixture: every client has fewer rows than "
            f"{max(algorithm.rows_needed(), min_rows)} (min_client_samples="
            f"{self.min_client_samples}, privacy_min_rows={min_rows}; smallest K from "
            f"{source}), or too few for one component per min_rows rows. Lower "
            "client_components or k_range, or merge clients."
        )

    def _set_result(self, result) -> None:
        """``from_model``: what every local-fit run records (client ids are the run's own)."""
        state = result.state
        widths = {m.n_features for m in state.client_models.values()}
        if widths != {self.n_features_in_}:
            raise ValueError(
                f"X has {self.n_features_in_} features but the model was trained on {widths}."
            )
        self.skipped_clients_ = list(state.skipped)
        self.client_n_components_ = {c: m.n_components for c, m in state.client_models.items()}

    def _set_client_record(self, attrs: dict) -> None:
        """``skipped_clients_`` and ``client_n_components_`` from a saved file, checked:
        known client ids, each once, K >= 1, a client either skipped or fitted."""
        ids = self.client_ids_.tolist()
        skipped = get_attr(attrs, "skipped_clients_", list)
        record: dict = {}
        for index, pair in enumerate(get_attr(attrs, "client_n_components_", list)):
            where = f"client_n_components_[{index}]"
            if not (isinstance(pair, list) and len(pair) == 2):
                raise ModelFormatError(f"{where} must be a [client id, K] pair, got {pair!r}.")
            client, k = check_items(pair, where, (str, int, float))
            check_items([k], f"{where}[1]", int)
            if k < 1 or client not in ids or client in record:
                raise ModelFormatError(
                    f"{where} = {pair!r}: needs a client id of client_ids_, listed once, and "
                    "K >= 1."
                )
            record[client] = k
        for client in check_items(skipped, "skipped_clients_", (str, int, float)):
            if client not in ids or client in record or skipped.count(client) > 1:
                raise ModelFormatError(
                    f"skipped_clients_ lists {client!r}: not a client of client_ids_, listed "
                    "twice, or also a fitted client."
                )
        self.skipped_clients_ = skipped
        self.client_n_components_ = record


def _bic_record(saved: dict) -> dict[int, float]:
    """``bic_`` from a saved file: integer K (as JSON keys) -> a number (inf allowed)."""
    record = {}
    for key, value in saved.items():
        if not key.isdigit() or isinstance(value, bool) or not isinstance(value, int | float):
            raise ModelFormatError(
                f"bic_ must map K (an integer) to a BIC value, got {key!r}: {value!r}."
            )
        record[int(key)] = value
    return record


class FedGenGMMDetector(_LocalFitDetector):
    """One-shot FedGenGMM: local mixtures -> synthetic data on the server -> one global mixture.

    Each client fits a mixture with ``client_components`` components (``None``: the global
    ``n_components`` under the covariance prior, else chosen by BIC in ``k_range``) and sends
    it with its row count; the server draws ``samples_per_component * sum_c K_c`` rows from
    the size-weighted union and fits the global mixture with ``n_components`` (``None``: BIC
    in ``k_range``) and the covariance prior. One round.

    Attributes:
        weights_, means_, covariances_, precisions_cholesky_: the global mixture.
        copula_marginals_, copula_joint_: with ``copula``, each feature's 1-D mixture
            (``MixtureParams``) and the joint mixture of the normal scores; else ``None``.
        client_n_components_: K chosen by each client; skipped_clients_: clients left out.
        n_synthetic_: rows drawn on the server; bic_: BIC per K of the global fit (BIC mode).
        privacy_spent_: with ``privacy.epsilon``, what the fit spent: ``epsilon`` (at
            ``delta``), the noisy ``releases`` (each client's ``local_iterations``),
            ``noise_multiplier``,
            ``clip``.
        history_, n_rounds_, bytes_up_, bytes_down_: the one round and its bytes.
        decision_scores_, threshold_, labels_: PyOD's training-set outputs.

    ``fit(X, groups=g, callbacks=[hook])`` calls ``hook`` with the one round's
    ``RoundRecord`` when it completes (see ``MixtureDetector.fit``).
    """

    _renamed_params: ClassVar[dict] = {"covariance_prior": "prior_strength"}
    _pca_front_end = True
    _params = declare(
        Param(
            "n_components",
            None,
            [Interval(Integral, 1, None, closed="left"), None],
            "number of components of the global mixture; ``None`` chooses it by BIC over "
            "``k_range``.",
        ),
        Param(
            "samples_per_component",
            100,
            _POSITIVE_INT,
            "synthetic rows the server draws per client component (the paper's ``H``).",
        ),
        Param(
            "copula",
            False,
            ["boolean"],
            "the server also fits a Gaussian copula on its synthetic rows (a 1-D mixture per "
            "feature, a joint mixture of the features' normal scores) and ``score_samples`` "
            "is its log-density; same single round, same messages.",
        ),
        option(Prior, fields=REMEDIES, docs=FEDGEN_PRIOR_DOCS),
        LOCAL_SAMPLING,
        option(Privacy, fields=LOCAL_DP, docs=LOCAL_PRIVACY_DOCS),
        docs=FEDGEN_DOCS,
    )

    def __init__(
        self,
        n_components=None,
        client_components=None,
        k_range=(1, 10),
        *,
        min_client_samples=2,
        covariance_type="full",
        reg_covar=1e-06,
        tol=0.001,
        max_iter=100,
        samples_per_component=100,
        copula=False,
        prior=None,
        pca_components="auto",
        sampling=None,
        robustness=None,
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

    def _set_copula(self, marginals, joint) -> None:
        """Store the copula (``joint`` ``None``: the detector scores with the mixture)."""
        options = self._torch_options()
        if joint is None:
            self.copula_marginals_, self.copula_joint_ = None, None
        else:
            self.copula_marginals_ = [m.to(**options) for m in marginals]
            self.copula_joint_ = joint.to(**options)

    def _fit_clients(self, parts, clients, seed, labels=None) -> None:
        n_total = sum(p.shape[0] for p in parts)
        if self.n_components is not None and self.n_components > n_total:
            raise ValueError(
                f"n_components={self.n_components} must be <= n_samples={n_total}; lower "
                "n_components or provide more rows."
            )
        state = self._run(clients, seed)
        self._set_mixture(state.params)
        self._set_copula(state.marginals, state.copula)
        self.n_synthetic_ = state.n_synthetic
        self.bic_ = dict(state.bics)

    def _set_result(self, result) -> None:
        super()._set_result(result)
        if self.copula and result.state.copula is None:
            raise ValueError(
                "copula=True but the model was trained without a copula; train it with "
                "copula=True (FedGenGMM(copula=True) on the Flower server) or use copula=False."
            )
        self._set_mixture(result.state.params.to(**self._torch_options()))
        state = result.state
        self._set_copula(state.marginals, state.copula if self.copula else None)
        self.n_synthetic_, self.bic_ = result.state.n_synthetic, dict(result.state.bics)

    def _log_density(self, X: torch.Tensor) -> torch.Tensor:
        if self.copula_joint_ is not None:
            return copula_score_samples(self.copula_marginals_, self.copula_joint_, X)
        return score_samples(self.model_, X)

    def _log_density_bound(self) -> float | None:
        """The highest ``log p(x)`` the mixture gives any row (``mixture_log_density_bound``);
        ``None`` with the copula (its density is not a mixture of unimodal parts in ``x``)."""
        if self.copula_joint_ is not None:
            return None
        return mixture_log_density_bound(self.model_)

    def _get_state(self):
        attrs = {
            "n_synthetic_": self.n_synthetic_,
            "bic_": {str(k): v for k, v in self.bic_.items()},
            "skipped_clients_": self.skipped_clients_,
            "client_n_components_": [[k, v] for k, v in self.client_n_components_.items()],
            "copula_": self.copula_joint_ is not None,
        }
        tensors = self._mixture_tensors(self.model_, "model")
        if self.copula_joint_ is not None:
            tensors.update(self._mixture_tensors(self.copula_joint_, "copula.joint"))
            for j, marginal in enumerate(self.copula_marginals_):
                tensors.update(self._mixture_tensors(marginal, f"copula.marginal.{j}"))
        return tensors, attrs

    def _set_state(self, tensors, attrs) -> None:
        super()._set_state(tensors, attrs)
        self._set_mixture(self._mixture_from(tensors, "model", self.covariance_type))
        self._set_copula(None, None)
        if get_attr(attrs, "copula_", bool):
            self._set_copula(
                [
                    self._mixture_from(tensors, f"copula.marginal.{j}", "full", n_features=1)
                    for j in range(self.n_features_in_)
                ],
                self._mixture_from(tensors, "copula.joint", self.covariance_type),
            )
        self.n_synthetic_ = get_attr(attrs, "n_synthetic_", int, minimum=0)
        self.bic_ = _bic_record(get_attr(attrs, "bic_", dict))
        self._set_client_record(attrs)
