"""FedGenGMM: one-shot federated Gaussian mixtures (Algorithm 4.1 of the FedGenGMM paper).

One round. Each client fits a local mixture, choosing its number of components ``K_c`` by
BIC in ``k_range`` (or a fixed ``client_components``), and sends the parameters with its row
count ``|D_c|``. The server re-weights client component weights by ``|D_c| / |D|``, forms
the union of all components, draws ``H * sum_c K_c`` synthetic rows from it and fits one
global mixture on them (fixed ``n_components``, or BIC in ``k_range``).

With ``standardize`` and ``prior_strength`` (the remedies of ``docs/robust.md``) every fit,
on a client and on the server, runs on z-scores of its own rows with MAP covariances
(:func:`fednovelty.mixture.fit_gmm_scaled`) and is mapped back to the original units before
it is sent or kept: a client's scale is a local statistic and the server's comes from the
synthetic rows, so the protocol stays one round and the messages are unchanged.

With ``copula`` the server also fits, on the same synthetic rows, a Gaussian copula
(:mod:`fednovelty.mixture.copula`): a 1-D mixture of ``MARGINAL_COMPONENTS`` components per
feature, and a joint mixture of the features' normal scores. It costs no communication; the
detector scores with it (``docs/robust.md`` measures it).

A client enforces its privacy policy (``ClientContext.policy``, ``docs/privacy.md``): with
fewer than ``min_rows`` rows it skips the round (sending nothing, not even its row count), it
fits at most ``n_rows // min_rows`` components, and it drops the components whose share of
its rows (``weight_k * n_rows``) is below ``min_rows`` and renormalises the rest before it
sends its mixture.

``LocalGMMs`` is the paper's "local" baseline: the same client step, no aggregation; the
server only keeps every client's model.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import torch
from torch import Tensor

from fednovelty.federated.aggregate import union_mixture
from fednovelty.federated.base import (
    ClientContext,
    FederatedAlgorithm,
    Message,
    Scalar,
    check_prior_arguments,
    client_generator,
    skipped_reply,
)
from fednovelty.federated.privacy import backed_mixture
from fednovelty.federated.robust import check_robust_arguments, outlying_models, weight_factors
from fednovelty.mixture import MixtureParams, fit_gmm_scaled, sample
from fednovelty.mixture.copula import fit_marginals, normal_scores
from fednovelty.mixture.covariance import check_covariance_type


@dataclass
class FedGenState:
    """Server state of FedGenGMM / LocalGMMs.

    Attributes:
        phase: ``local_fit`` or ``done``.
        params: the global mixture (FedGenGMM) once fitted.
        client_models: each participating client's local mixture by client id.
        client_sizes: each participating client's row count by client id.
        skipped: ids of clients with fewer rows than ``rows_needed()`` (no model sent).
        n_synthetic: rows drawn on the server; ``bics``: BIC per candidate K of the global fit.
        rounds: communication rounds (1 when done).
        left_out: ids of clients whose local mixtures a robust ``aggregation`` left out of
            the union.
        marginals, copula: with ``copula``, the 1-D mixture of every feature and the joint
            mixture of their normal scores (else empty and ``None``).
    """

    phase: str = "local_fit"
    params: MixtureParams | None = None
    client_models: dict[int, MixtureParams] = field(default_factory=dict)
    client_sizes: dict[int, float] = field(default_factory=dict)
    skipped: list[int] = field(default_factory=list)
    n_synthetic: int = 0
    bics: dict[int, float] = field(default_factory=dict)
    rounds: int = 0
    marginals: list[MixtureParams] = field(default_factory=list)
    copula: MixtureParams | None = None
    left_out: list[int] = field(default_factory=list)


#: Components of each feature's 1-D mixture in the copula.
MARGINAL_COMPONENTS = 5


def _candidates(fixed: int | None, k_range: tuple[int, int]) -> list[int]:
    return [int(fixed)] if fixed is not None else list(range(k_range[0], k_range[1] + 1))


def local_candidates(scalars: dict[str, Scalar], n_samples: int, min_rows: int = 1) -> list[int]:
    """The K a client of ``n_samples`` rows may fit under a ``local_fit`` message; empty
    when it has too few rows and must be skipped.

    ``min_rows`` is the client's privacy floor: the client needs ``max(min_samples,
    min_rows)`` rows and fits at most ``n_samples // min_rows`` components (``1``: the
    message's rule alone)."""
    if n_samples < max(int(scalars["min_samples"]), int(min_rows), 1):
        return []
    most = n_samples // max(1, int(min_rows))
    return [int(k) for k in str(scalars["candidates"]).split(",") if int(k) <= most]


def local_fit_settings(scalars: dict[str, Scalar], generator: torch.Generator) -> dict:
    """The keyword arguments of :func:`fit_gmm_scaled` that a ``local_fit`` message sets
    (all but the rows and the candidate K)."""
    return {
        "covariance_type": str(scalars["covariance_type"]),
        "reg_covar": float(scalars["reg_covar"]),
        "tol": float(scalars["tol"]),
        "max_iter": int(scalars["max_iter"]),
        "generator": generator,
        "standardize": bool(scalars.get("standardize", False)),
        "prior_strength": float(scalars.get("prior_strength", 0.0)) or None,
        "prior_scale": float(scalars.get("prior_scale", 1.0)),
    }


class FedGenGMM(FederatedAlgorithm):
    """One-shot FedGenGMM.

    Args:
        n_components: global K; ``None`` picks it by BIC in ``k_range``.
        client_components: every client's K; ``None`` lets each pick by BIC in ``k_range``.
        k_range: inclusive ``(k_min, k_max)`` for BIC searches.
        covariance_type: ``full``, ``tied``, ``diag`` or ``spherical`` (clients and server).
        samples_per_component: ``H``; the server draws ``H * sum_c K_c`` rows.
        min_client_samples: clients with fewer rows (or fewer than the smallest candidate K)
            are skipped and listed in ``state.skipped``.
        reg_covar, tol, max_iter: local EM settings (as scikit-learn).
        standardize: every fit on z-scores of its own rows (mapped back to the original units).
        prior_strength: pseudo-rows of the covariance prior of every fit (``None``: none).
        prior_scale: the prior's target variance as a multiple of each feature's variance.
        aggregation: ``"sum"`` (the paper's union of every client model), or ``"trimmed"``
            / ``"median"``: leave out the most outlying client models
            (:func:`~fednovelty.federated.robust.outlying_models`).
        trim: share of client models ``aggregation="trimmed"`` leaves out.
        client_weight_cap: no client's model weighs more than this many times the median
            client's row count in the union (``None``: no cap).
        copula: the server also fits a Gaussian copula with mixture marginals on its
            synthetic rows (``state.marginals``, ``state.copula``); no extra communication.
        random_state: integer seed; dtype, device: where the server computes.
    """

    max_rounds = 1

    def __init__(
        self,
        *,
        n_components: int | None = None,
        client_components: int | None = None,
        k_range: tuple[int, int] = (1, 10),
        covariance_type: str = "full",
        samples_per_component: int = 100,
        min_client_samples: int = 2,
        reg_covar: float = 1e-6,
        tol: float = 1e-3,
        max_iter: int = 100,
        standardize: bool = False,
        prior_strength: float | None = None,
        prior_scale: float = 1.0,
        copula: bool = False,
        aggregation: str = "sum",
        trim: float = 0.1,
        client_weight_cap: float | None = None,
        random_state: int = 0,
        dtype: torch.dtype = torch.float64,
        device: torch.device | str = "cpu",
    ) -> None:
        check_covariance_type(covariance_type)
        self.aggregation, self.trim, self.client_weight_cap = check_robust_arguments(
            aggregation, trim, client_weight_cap
        )
        self.copula = bool(copula)
        prior_strength, prior_scale = check_prior_arguments(prior_strength, prior_scale)
        self.standardize = bool(standardize)
        self.prior_strength = prior_strength
        self.prior_scale = prior_scale
        k_min, k_max = (int(k) for k in k_range)
        if not 1 <= k_min <= k_max:
            raise ValueError(f"k_range must satisfy 1 <= k_min <= k_max, got {tuple(k_range)}.")
        self.n_components = n_components
        self.client_components = client_components
        self.k_range = (k_min, k_max)
        self.covariance_type = covariance_type
        self.samples_per_component = int(samples_per_component)
        self.min_client_samples = max(1, int(min_client_samples))
        self.reg_covar = float(reg_covar)
        self.tol = float(tol)
        self.max_iter = int(max_iter)
        self.random_state = int(random_state)
        self.dtype = dtype
        self.device = torch.device(device)

    def candidates(self) -> list[int]:
        """Numbers of components a client may fit."""
        return _candidates(self.client_components, self.k_range)

    def rows_needed(self) -> int:
        """Fewest rows a client needs to take part (else it is skipped)."""
        return max(self.min_client_samples, min(self.candidates()))

    def start(self) -> FedGenState:
        return FedGenState()

    def finished(self, state: FedGenState) -> bool:
        return state.phase == "done"

    def _seed(self, salt: int) -> int:
        return int(np.random.SeedSequence([self.random_state, salt]).generate_state(1)[0])

    def configure(self, state: FedGenState) -> Message:
        return Message(
            "local_fit",
            scalars={
                "candidates": ",".join(map(str, self.candidates())),
                "covariance_type": self.covariance_type,
                "min_samples": self.rows_needed(),
                "reg_covar": self.reg_covar,
                "tol": self.tol,
                "max_iter": self.max_iter,
                "seed": self._seed(0),
                "standardize": self.standardize,
                "prior_strength": self.prior_strength or 0.0,
                "prior_scale": self.prior_scale,
            },
        )

    # ------------------------------------------------------------------ client half
    def client_step(self, X: Tensor, message: Message, context: ClientContext) -> Message:
        if message.kind != "local_fit":
            raise ValueError(f"FedGenGMM clients do not answer messages of kind {message.kind!r}.")
        s = message.scalars
        n = X.shape[0]
        min_rows = context.policy.min_rows
        candidates = local_candidates(s, n, min_rows)
        if not candidates:
            reason = (
                context.policy.below_floor
                if n < min_rows
                else f"fewer rows than the round's min_samples={s['min_samples']} or any "
                f"candidate K allows (at most n_rows // min_rows = {n // min_rows} components)"
            )
            return skipped_reply("local_fit", reason)
        settings = local_fit_settings(s, client_generator(int(s["seed"]), context.client_id))
        result, _ = fit_gmm_scaled(X, candidates, **settings)
        params = backed_mixture(result.params, n, min_rows)
        return Message(
            "local_fit",
            {**params.tensors(), "n_samples": torch.tensor(float(n), dtype=X.dtype)},
            {"skipped": False, "converged": result.converged, "n_iter": result.n_iter},
        )

    # ------------------------------------------------------------------ server half
    def _collect(self, state: FedGenState, replies: dict[int, Message]) -> None:
        for cid, reply in sorted(replies.items()):
            if reply.scalars.get("skipped"):
                state.skipped.append(cid)
                continue
            t = {k: v.to(self.device, self.dtype) for k, v in reply.tensors.items()}
            state.client_models[cid] = MixtureParams(
                t["weights"], t["means"], t["precisions_cholesky"], self.covariance_type
            )
            state.client_sizes[cid] = float(t["n_samples"])
        if not state.client_models:
            source = (
                f"client_components={self.client_components}"
                if self.client_components is not None
                else f"k_range={self.k_range}"
            )
            raise ValueError(
                f"No client could fit a local mixture: every client has fewer rows than "
                f"{self.rows_needed()} (min_client_samples={self.min_client_samples}; "
                f"smallest K from {source}). Lower client_components or k_range, or merge "
                "clients."
            )

    def server_step(
        self, state: FedGenState, replies: dict[int, Message]
    ) -> tuple[FedGenState, dict[str, Scalar]]:
        self._collect(state, replies)
        state.left_out = outlying_models(state.client_models, self.aggregation, self.trim)
        ids = [c for c in sorted(state.client_models) if c not in state.left_out]
        factors = weight_factors({c: state.client_sizes[c] for c in ids}, self.client_weight_cap)
        union = union_mixture(
            [state.client_models[c] for c in ids], [state.client_sizes[c] * factors[c] for c in ids]
        )
        generator = torch.Generator().manual_seed(self._seed(1))
        state.n_synthetic = self.samples_per_component * union.n_components
        synthetic, _ = sample(union, state.n_synthetic, generator=generator)
        settings = {
            "covariance_type": self.covariance_type,
            "reg_covar": self.reg_covar,
            "tol": self.tol,
            "max_iter": self.max_iter,
            "generator": generator,
            "standardize": self.standardize,
            "prior_strength": self.prior_strength,
            "prior_scale": self.prior_scale,
        }
        candidates = _candidates(self.n_components, self.k_range)
        result, state.bics = fit_gmm_scaled(synthetic, candidates, **settings)
        state.params = result.params
        if self.copula:
            state.marginals, state.copula = self._fit_copula(synthetic, candidates, settings)
        state.phase, state.rounds = "done", 1
        return state, {
            "phase": "local_fit",
            "n_synthetic": state.n_synthetic,
            "n_components": state.params.n_components,
        }

    def _fit_copula(
        self, synthetic: Tensor, candidates: list[int], settings: dict
    ) -> tuple[list[MixtureParams], MixtureParams]:
        """The copula of the synthetic rows: marginals, then the joint mixture of the scores
        (same K, covariance type and remedies as the global mixture)."""
        settings = {**settings, "generator": torch.Generator().manual_seed(self._seed(2))}
        marginals = fit_marginals(
            synthetic,
            MARGINAL_COMPONENTS,
            prior_scale=self.prior_scale,
            reg_covar=self.reg_covar,
            tol=self.tol,
            max_iter=self.max_iter,
            generator=settings["generator"],
        )
        scores, _ = normal_scores(marginals, synthetic)
        joint, _ = fit_gmm_scaled(scores, candidates, **settings)
        return marginals, joint.params


class LocalGMMs(FedGenGMM):
    """Local-only baseline: each client fits its own mixture; nothing is aggregated.

    Takes FedGenGMM's client arguments (``client_components``, ``k_range``, ...).
    """

    def server_step(
        self, state: FedGenState, replies: dict[int, Message]
    ) -> tuple[FedGenState, dict[str, Scalar]]:
        self._collect(state, replies)
        state.phase, state.rounds = "done", 1
        return state, {"phase": "local_fit", "n_models": len(state.client_models)}
