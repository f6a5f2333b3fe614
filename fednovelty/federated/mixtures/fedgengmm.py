"""FedGenGMM: one-shot federated Gaussian mixtures (Algorithm 4.1 of the FedGenGMM paper).

One round. Each client fits a local mixture of ``K_c`` components (``client_components``;
with a covariance prior the global ``n_components``; else BIC in ``k_range``) and sends it
with its row count ``|D_c|``. The server re-weights the client components by ``|D_c| / |D|``, draws
``H * sum_c K_c`` synthetic rows from their union and fits one global mixture on them (fixed
``n_components``, or BIC in ``k_range``). With ``standardize`` every fit runs on z-scores of
its own rows (:func:`fednovelty.mixture.fit_gmm_scaled`), mapped back before it is sent or
kept. The covariance prior of ``prior_strength`` pseudo-rows (``docs/robust.md``) is counted
once, in the server's fit; a client of a fixed ``K_c`` applies it only when it has fewer rows
than the prior has pseudo-rows (:meth:`FedGenConfig.client_prior`). With ``copula`` the server
also fits a Gaussian copula (:mod:`fednovelty.mixture.copula`) on the same synthetic rows.

Privacy (``docs/privacy.md``): below ``min_rows`` rows a client skips the round, it fits at
most ``n_rows // min_rows`` components, and the gate drops components backed by fewer rows
(:func:`local_fit_backing`). Under a differential-privacy policy (``context.terms.private``) the
client fits by DP-EM (:func:`~fednovelty.federated.mixtures.private_fit.private_em`) on its
rows mapped to ``[-1, 1]`` by the public ``bounds`` and clipped, with a fixed K
(:meth:`FedGenConfig.private_components`) over ``dp_iterations`` noisy releases of the
policy's full noise (a local fit has no sum to share it over); the reply, of private form
``"fit"``, states them in ``dp_releases`` and carries a noisy row count. The server's step
is post-processing (``docs/differential_privacy.md``).

``LocalGMMs`` is the paper's "local" baseline: the same client step, no aggregation; the
server only keeps every client's model.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch
from torch import Tensor

from fednovelty.exceptions import SingularCovarianceError
from fednovelty.federated.core.base import (
    ClientContext,
    FederatedAlgorithm,
    Message,
    PrivateTerms,
    Scalar,
    client_generator,
    derived_seed,
    skipped_reply,
)
from fednovelty.federated.core.config import (
    CovarianceSettings,
    IterationSettings,
    RobustSettings,
    TorchSettings,
    optional_count,
    settings_dataclass,
)
from fednovelty.federated.core.declarations import declare
from fednovelty.federated.init.settings import MomentsSettings
from fednovelty.federated.init.units import box_units
from fednovelty.federated.local_fit import (
    fit_local,
    fit_settings,
    local_fit_backing,
    local_fit_reply,
    reduce_union,
)
from fednovelty.federated.mixtures.private_fit import private_em
from fednovelty.federated.trust.dp_mechanism import clip_rows
from fednovelty.federated.trust.plausible import screen_local_fits
from fednovelty.federated.trust.robust import outlying_models, weight_factors
from fednovelty.mixture import MixtureParams, affine_params, fit_gmm_scaled
from fednovelty.mixture.copula import fit_marginals, normal_scores


@settings_dataclass
class FedGenConfig(
    RobustSettings, CovarianceSettings, IterationSettings, MomentsSettings, TorchSettings
):
    """Settings of one-shot FedGenGMM and its local-only baseline ``LocalGMMs``: the robust
    options (``aggregation`` ``"sum"``, the union of every client model, or ``"trimmed"`` /
    ``"median"``, leaving out the most outlying client models), the covariance and iteration
    settings, standardisation and the covariance prior
    (:class:`~fednovelty.federated.init.settings.MomentsSettings`; every local and global fit uses
    them), seed and placement, and

    Attributes:
        n_components: global K; ``None`` picks it by BIC in ``k_range``.
        client_components: every client's K; ``None``: with a covariance prior the global
            ``n_components``, else (or when that is ``None`` too) each client's pick by BIC
            in ``k_range``. A client fits at most ``n_rows // min_rows`` components.
        k_range: inclusive ``(k_min, k_max)`` for BIC searches, ``1 <= k_min <= k_max``.
        samples_per_component: ``H``; the server draws ``H * sum_c K_c`` rows.
        min_client_samples: clients with fewer rows (or fewer than the smallest candidate K)
            are skipped (at least 1).
        copula: the server also fits a Gaussian copula with mixture marginals on its
            synthetic rows; no extra communication.
        dp_iterations: under a client's differential-privacy policy, the fixed number of
            DP-EM iterations (noisy releases) of its local fit (>= 1).
    """

    n_components: int | None = None
    client_components: int | None = None
    k_range: tuple[int, int] = (1, 10)
    samples_per_component: int = 100
    min_client_samples: int = 2
    copula: bool = False
    dp_iterations: int = 20

    def __post_init__(self) -> None:
        super().__post_init__()
        k_min, k_max = (int(k) for k in self.k_range)
        if not 1 <= k_min <= k_max:
            raise ValueError(
                f"k_range must satisfy 1 <= k_min <= k_max, got {tuple(self.k_range)}."
            )
        self._set("k_range", (k_min, k_max))
        for name in ("n_components", "client_components"):
            self._set(name, optional_count(name, getattr(self, name)))
        self._set("samples_per_component", int(self.samples_per_component))
        self._set("min_client_samples", max(1, int(self.min_client_samples)))
        self._set("copula", bool(self.copula))
        iterations = self.dp_iterations
        if isinstance(iterations, bool) or not isinstance(iterations, int) or iterations < 1:
            raise ValueError(
                f"dp_iterations must be an int >= 1 (noisy EM iterations of a private local "
                f"fit); got {iterations!r}."
            )

    def shares_global_k(self) -> bool:
        """Whether every client fits the global ``n_components`` (lowered to its rows): with
        a covariance prior, no ``client_components`` and a fixed ``n_components``. A BIC
        search under the prior picks too few components (``docs/robust.md``, FedGenGMM's
        local fits); without the prior clients search K by BIC as the FedGenGMM paper does."""
        return (
            self.client_components is None
            and self.n_components is not None
            and self.prior_strength is not None
        )

    def client_k(self) -> int | None:
        """Every client's fixed K (``client_components``, else the global ``n_components``
        where :meth:`shares_global_k`); ``None``: each client picks K by BIC in ``k_range``."""
        if self.client_components is not None:
            return self.client_components
        return self.n_components if self.shares_global_k() else None

    def candidates(self) -> list[int]:
        """Numbers of components a client may fit."""
        fixed = self.client_k()
        if fixed is not None:
            return [fixed]
        return list(range(self.k_range[0], self.k_range[1] + 1))

    def client_prior(self, n_rows: int) -> float | None:
        """Pseudo-rows of the covariance prior in the local fit of a client of ``n_rows`` rows.

        A fit of a fixed K is by maximum likelihood unless the client has fewer rows than
        ``prior_strength`` (then the prior, ``n_features + 2`` pseudo-rows by default, keeps
        its covariances non-singular): the prior's pseudo-rows at ``prior_scale`` times the
        client's variance outweigh a component backed by a client's few rows and starve it
        (``docs/robust.md``, FedGenGMM's local fits). The server's fit applies the prior once.
        A BIC search keeps the prior: maximum likelihood is unbounded on singular components
        and would set K. Where the maximum-likelihood fit is singular (a feature constant on
        the client with ``reg_covar=0``) the client fits under the prior instead.
        """
        if self.prior_strength is None:
            return None
        if self.client_k() is not None and n_rows >= float(self.prior_strength):
            return None
        return float(self.prior_strength)

    def private_components(self) -> int:
        """K of a client's differentially private fit: ``client_components``, else the
        largest K of ``k_range`` (the most the client's configuration allows). Fixed: BIC
        selection reads the rows and has no private form."""
        return int(self.client_components or self.k_range[1])

    def global_candidates(self) -> list[int]:
        """Numbers of components the server's global fit may have."""
        if self.n_components is not None:
            return [self.n_components]
        return list(range(self.k_range[0], self.k_range[1] + 1))

    def rows_needed(self) -> int:
        """Fewest rows a client needs to take part (else it is skipped): ``min_client_samples``
        and, with ``client_components`` or a BIC search, the smallest candidate K (a global
        ``n_components`` shrinks to the client's rows instead)."""
        if self.shares_global_k():
            return self.min_client_samples
        return max(self.min_client_samples, min(self.candidates()))

    def client_candidates(self, n_samples: int, min_rows: int = 1) -> list[int]:
        """The K a client of ``n_samples`` rows fits among; empty when it must be skipped.

        ``min_rows`` is the client's privacy floor: the client needs ``max(rows_needed(),
        min_rows)`` rows and fits at most ``n_samples // min_rows`` components (the global
        ``n_components`` is lowered to that; ``client_components`` or a BIC candidate above
        it is left out).
        """
        if n_samples < max(self.rows_needed(), int(min_rows), 1):
            return []
        most = n_samples // max(1, int(min_rows))
        if self.shares_global_k():
            return [min(self.n_components, most)]
        return [k for k in self.candidates() if k <= most]


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
        components_left_out: client id -> the components of its local mixture that no
            honest rows produce, left out of the union under every ``aggregation``
            (:func:`~fednovelty.federated.trust.plausible.screen_local_fits`).
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
    components_left_out: dict[int, list[int]] = field(default_factory=dict)


#: Components of each feature's 1-D mixture in the copula.
MARGINAL_COMPONENTS = 5


def local_fit_limit(config: FedGenConfig, broadcast: Message) -> int:
    """The most components the client's own configuration lets it fit."""
    return int(config.client_k() or max(config.k_range))


def local_fit_components(setting: Any) -> int:
    """K of a local fit's work: the fixed client K (``client_components``, else
    ``n_components`` under a covariance prior), else the largest of ``k_range``."""
    shared = setting("n_components") if setting("prior_strength") is not None else None
    fixed = setting("client_components") or shared
    return max(1, int(fixed) if fixed else max(setting("k_range") or (1,)))


#: a ``local_fit`` reply: a local mixture (its components backed as a model's).
LOCAL_FIT_REPLY = local_fit_reply("local_fit", local_fit_limit, local_fit_components, private="fit")


class FedGenGMM(FederatedAlgorithm):
    """One-shot FedGenGMM (see the module docstring).

    ``FedGenGMM(**settings)`` with the settings of
    :class:`FedGenConfig` (``n_components``,
    ``client_components``, ``k_range``, ``covariance_type``, ``samples_per_component``,
    ``min_client_samples``, ``reg_covar``, ``tol``, ``max_iter``, ``standardize``,
    ``prior_strength``, ``prior_scale``, ``copula``, ``aggregation``, ``trim``,
    ``client_weight_cap``, ``random_state``, ``dtype``, ``device``), or
    ``FedGenGMM.from_config(FedGenConfig(...))``. Every setting reads as an attribute.
    Clients with too few rows are listed in ``state.skipped``.
    """

    max_rounds = 1
    config_class = FedGenConfig
    replies = declare(LOCAL_FIT_REPLY)

    def __init__(self, **settings: Any) -> None:
        self._setup(FedGenConfig(**settings))

    def candidates(self) -> list[int]:
        """Numbers of components a client may fit."""
        return self.config.candidates()

    def rows_needed(self) -> int:
        """Fewest rows a client needs to take part (else it is skipped)."""
        return self.config.rows_needed()

    def start(self) -> FedGenState:
        return FedGenState()

    def finished(self, state: FedGenState) -> bool:
        return state.phase == "done"

    def _seed(self, salt: int) -> int:
        return derived_seed(self.config.random_state, salt)

    def configure(self, state: FedGenState) -> Message:
        config = self.config
        return Message(
            "local_fit",
            scalars={"seed": self._seed(0)},
            expect={
                "covariance_type": config.covariance_type,
                "max_components": max(config.candidates()),
            },
        )

    # ------------------------------------------------------------------ client half
    def client_step(self, X: Tensor, message: Message, context: ClientContext) -> Message:
        if message.kind != "local_fit":
            raise ValueError(f"FedGenGMM clients do not answer messages of kind {message.kind!r}.")
        if context.terms.private is not None:
            return self._private_client_step(X, context, context.terms.private)
        config = self.config
        n = X.shape[0]
        min_rows = context.terms.min_rows
        candidates = config.client_candidates(n, min_rows)
        if not candidates:
            reason = (
                context.terms.below_floor
                if n < min_rows
                else f"fewer rows than the round's min_samples={config.rows_needed()} or any "
                f"candidate K allows (at most n_rows // min_rows = {n // min_rows} components)"
            )
            return skipped_reply("local_fit", reason)
        generator = client_generator(int(message.scalars["seed"]), context.client_id)
        prior = config.client_prior(n)
        try:
            result = fit_local(X, candidates, config, generator, prior_strength=prior)
        except SingularCovarianceError:  # maximum likelihood singular (reg_covar=0): the prior
            if prior is not None or config.prior_strength is None:
                raise
            prior = float(config.prior_strength)
            result = fit_local(X, candidates, config, generator, prior_strength=prior)
        tensors = {**result.params.tensors(), "n_samples": torch.tensor(float(n), dtype=X.dtype)}
        return Message(
            "local_fit",
            tensors,
            {"skipped": False, "converged": result.converged, "n_iter": result.n_iter},
            backing=local_fit_backing(result.params, n, context.terms),
        )

    def _private_client_step(self, X: Tensor, context: ClientContext, dp: PrivateTerms) -> Message:
        """The client step under ``dp`` (module docstring): DP-EM in the public box's units,
        the mixture mapped back, the noisy row count, ``dp_releases`` stated."""
        config = self.config
        n = X.shape[0]
        if not context.terms.releases(n):
            return skipped_reply("local_fit", "no rows")
        if config.bounds is None:
            return skipped_reply(
                "local_fit",
                "a differentially private local fit needs public feature bounds (bounds= / "
                "dp_bounds=): its rows are clipped in the box's units; not released",
            )
        offset, scale = box_units(config.bounds, X)
        if config.covariance_type == "spherical" and not bool((scale == scale[0]).all()):
            return skipped_reply(
                "local_fit",
                "a private spherical fit needs bounds of one common width (a spherical "
                "mixture cannot be mapped back by per-feature scales); not released",
            )
        rows = clip_rows((X - offset) / scale, torch.zeros_like(offset), dp.clip_norm)
        params, info = private_em(
            rows,
            config.private_components(),
            noise_multiplier=dp.noise_multiplier,
            clip_norm=dp.clip_norm,
            n_iter=config.dp_iterations,
            covariance_type=config.covariance_type,
            reg_covar=config.reg_covar,
            source=context.terms.private.noise(),
            # the public start reads no row: random_state seeds it, the noise is fresh
            init_generator=client_generator(self._seed(0x1417), context.client_id),
        )
        params = affine_params(params, offset, scale)
        count = torch.tensor(max(info.noisy_rows, 1.0), dtype=X.dtype, device=X.device)
        return Message(
            "local_fit",
            {**params.tensors(), "n_samples": count},
            {
                "skipped": False,
                "converged": False,
                "n_iter": info.n_iter,
                "dp_releases": info.n_iter,
            },
            backing=local_fit_backing(params, n, context.terms),
        )

    # ------------------------------------------------------------------ server half
    def _collect(self, state: FedGenState, replies: dict[int, Message]) -> None:
        config = self.config
        for cid, reply in sorted(replies.items()):
            if reply.scalars.get("skipped"):
                state.skipped.append(cid)
                continue
            t = {k: v.to(config.device, config.dtype) for k, v in reply.tensors.items()}
            state.client_models[cid] = MixtureParams(
                t["weights"], t["means"], t["precisions_cholesky"], config.covariance_type
            )
            state.client_sizes[cid] = float(t["n_samples"])
        if not state.client_models:
            source = (
                f"client_components={config.client_components}"
                if config.client_components is not None
                else f"k_range={config.k_range}"
            )
            raise ValueError(
                f"No client could fit a local mixture: every client has fewer rows than "
                f"{config.rows_needed()} (min_client_samples={config.min_client_samples}; "
                f"smallest K from {source}). Lower client_components or k_range, or merge "
                "clients."
            )

    def server_step(
        self, state: FedGenState, replies: dict[int, Message]
    ) -> tuple[FedGenState, dict[str, Scalar]]:
        config = self.config
        self._collect(state, replies)
        models, sizes, state.components_left_out = screen_local_fits(
            state.client_models, state.client_sizes, "local_fit"
        )
        state.left_out = outlying_models(models, config.aggregation, config.trim)
        ids = [c for c in sorted(models) if c not in state.left_out]
        factors = weight_factors({c: sizes[c] for c in ids}, config.client_weight_cap)
        generator = torch.Generator().manual_seed(self._seed(1))
        settings = fit_settings(config, generator, prior_strength=config.prior_strength)
        candidates = config.global_candidates()
        result, state.bics, synthetic = reduce_union(
            [models[c] for c in ids],
            [sizes[c] * factors[c] for c in ids],
            candidates,
            config.samples_per_component,
            settings,
        )
        state.params, state.n_synthetic = result.params, int(synthetic.shape[0])
        if config.copula:
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
        config = self.config
        marginals = fit_marginals(
            synthetic,
            MARGINAL_COMPONENTS,
            prior_scale=config.prior_scale,
            reg_covar=config.reg_covar,
            tol=config.tol,
            max_iter=config.max_iter,
            generator=settings["generator"],
        )
        scores, _ = normal_scores(marginals, synthetic)
        joint, _ = fit_gmm_scaled(scores, candidates, **settings)
        return marginals, joint.params


class LocalGMMs(FedGenGMM):
    """Local-only baseline: FedGenGMM's round and settings (``client_components``,
    ``k_range``, ...), no aggregation: the server keeps every client's model."""

    def server_step(
        self, state: FedGenState, replies: dict[int, Message]
    ) -> tuple[FedGenState, dict[str, Scalar]]:
        self._collect(state, replies)
        state.phase, state.rounds = "done", 1
        return state, {"phase": "local_fit", "n_models": len(state.client_models)}
