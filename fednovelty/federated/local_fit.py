"""Local fits: a round in which every client fits its own mixture and sends its parameters.

FedGenGMM's one round (:mod:`fednovelty.federated.mixtures.fedgengmm`) and the one-shot start
of federated EM (:class:`OneShotStart`, ``init_params="oneshot"``) share it: each client fits
a mixture to its rows and replies with its weights, means, precision factors and row count;
the server takes the union of the client mixtures, weighting client ``c``'s components by
``|D_c| / |D|``, draws ``samples_per_component`` synthetic rows per union component and fits
one mixture of the wanted K on them (:func:`reduce_union`). Nothing but parameters and row
counts crosses the wire. A component is backed by its share of the client's rows
(:func:`local_fit_backing`); the client gate drops the ones under the privacy floor.

A lying client's local fit is screened on the server, by name, under every aggregation: a
reply whose mixture as a whole no honest federation produces (the round loop's gross screen,
:func:`~fednovelty.federated.trust.plausible.gross_screen`) or, after a moments round, whose
component means leave the box of the moments the client declared (``box="means"``) is
dropped from the round's record; a component that alone is implausible against all the
clients' components is left out of the union with an
:class:`~fednovelty.federated.trust.plausible.ImplausibleComponentWarning`
(:func:`~fednovelty.federated.trust.plausible.screen_local_fits`).

As a start for federated EM, the reduced union lands near a maximum of the pooled likelihood
in one round, where federated k-means needs up to ``kmeans_rounds`` + 1 rounds and EM then
tens of rounds (``docs/speed.md``, few rounds); the exact EM rounds that follow are those of
federated EM, so the end point is a fixed point of the pooled data's EM.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from fednovelty.federated.core.aggregate import union_mixture
from fednovelty.federated.core.base import (
    ClientContext,
    Message,
    client_generator,
    derived_seed,
    skipped_reply,
)
from fednovelty.federated.core.declarations import (
    Components,
    InvalidReplyError,
    Limit,
    ReplySpec,
    components_setting,
    declare,
)
from fednovelty.federated.core.steps import Step
from fednovelty.federated.trust.backing import client_backing
from fednovelty.federated.trust.plausible import screen_local_fits
from fednovelty.federated.trust.privacy import unfloored
from fednovelty.federated.trust.reply_form import Shape, covariance_shape, expectation
from fednovelty.federated.trust.value_checks import relative_tolerance
from fednovelty.mixture import MixtureParams, fit_gmm_scaled, sample

__all__ = [
    "LOCAL_FIT_BACKING",
    "ONE_SHOT_REPLY",
    "ONE_SHOT_SAMPLES",
    "OneShotStart",
    "check_local_fit",
    "fit_local",
    "fit_settings",
    "local_fit_backing",
    "local_fit_reply",
    "local_fit_shapes",
    "reduce_union",
]

#: synthetic rows the server draws per union component (FedGenGMM's ``H``) for the start.
ONE_SHOT_SAMPLES = 100
#: the start's local and server fits run to this tolerance or iteration count (FedGenGMM's
#: defaults), whatever budget the EM rounds that follow have.
LOCAL_TOL, LOCAL_MAX_ITER = 1e-3, 100


def local_fit_shapes(broadcast: Message, d: int) -> dict[str, Shape]:
    """A local fit's reply: a mixture of some K components and the client's row count."""
    ct = str(expectation(broadcast, "covariance_type"))
    return {
        "weights": ("k",),
        "means": ("k", d),
        "precisions_cholesky": covariance_shape(ct, "k", d),
        "n_samples": (),
    }


def check_local_fit(reply: Message, broadcast: Message) -> None:
    """At most the round's ``max_components`` components (when stated), weights adding up
    to one, precision factors upper triangular with a positive diagonal."""
    weights = reply.tensors["weights"]
    k, most = int(weights.shape[0]), broadcast.expect.get("max_components")
    if most is not None and k > int(most):
        raise InvalidReplyError(f"local mixture has {k} components; the round allows {most}.")
    if k == 0 or abs(float(weights.sum()) - 1.0) > relative_tolerance(weights.dtype):
        raise InvalidReplyError(f"local mixture weights add up to {float(weights.sum()):g}, not 1.")
    prec = reply.tensors["precisions_cholesky"]
    tied = expectation(broadcast, "covariance_type") == "tied"
    diagonal = prec if prec.ndim <= 2 and not tied else None
    if diagonal is None:
        diagonal = torch.diagonal(prec, dim1=-2, dim2=-1)
        if not bool(torch.equal(prec, prec.triu())):
            raise InvalidReplyError("precision factors are not upper triangular.")
    if not bool((diagonal > 0).all()):
        raise InvalidReplyError("precision factors have a non-positive diagonal.")


def local_fit_backing(params: MixtureParams, n_rows: int, terms: Any) -> dict[str, Tensor]:
    """What backs a local mixture fitted on ``n_rows`` rows: each component by
    ``weight_k * n_rows`` rows, its share of the responsibilities that gave its mean and
    covariance (at most its effective rows, so the stricter rule); the client gate removes
    the components below the floor and renormalises the kept weights. A tied covariance,
    one for all components, and the row count are backed by all the rows."""
    rows = unfloored(params.weights * n_rows, n_rows, terms)
    backing = {"weights": rows, "means": rows, "precisions_cholesky": rows}
    if params.covariance_type == "tied":
        backing.update(client_backing(["precisions_cholesky"], n_rows))
    backing.update(client_backing(["n_samples"], n_rows))
    return backing


def fit_settings(
    config: Any,
    generator: torch.Generator,
    *,
    prior_strength: float | None,
    tol: float | None = None,
    max_iter: int | None = None,
) -> dict[str, Any]:
    """Keyword arguments of :func:`~fednovelty.mixture.fit_gmm_scaled` for one fit (all but
    the rows and the candidate K) under ``config`` (its ``covariance_type``, ``reg_covar``,
    ``standardize`` and ``prior_scale``; its ``tol`` and ``max_iter`` unless given), with
    ``prior_strength`` pseudo-rows of the covariance prior (``None``: maximum likelihood)."""
    return {
        "covariance_type": config.covariance_type,
        "reg_covar": config.reg_covar,
        "tol": config.tol if tol is None else tol,
        "max_iter": config.max_iter if max_iter is None else max_iter,
        "generator": generator,
        "standardize": config.standardize,
        "prior_strength": prior_strength,
        "prior_scale": config.prior_scale,
    }


def fit_local(
    X: Tensor,
    candidates: list[int],
    config: Any,
    generator: torch.Generator,
    *,
    prior_strength: float | None,
    tol: float | None = None,
    max_iter: int | None = None,
) -> Any:
    """A client's local fit: one mixture on its rows ``X`` (n_rows, n_features) with K among
    ``candidates`` (several: BIC picks one), under ``config`` and ``prior_strength`` as
    :func:`fit_settings`. The caller has bounded the candidates by the client's policy (at
    most ``n_rows // min_rows`` components). Returns the ``EMResult`` in ``X``'s units."""
    settings = fit_settings(
        config, generator, prior_strength=prior_strength, tol=tol, max_iter=max_iter
    )
    result, _ = fit_gmm_scaled(X, candidates, **settings)
    return result


def reduce_union(
    models: list[MixtureParams],
    sizes: list[float],
    candidates: list[int],
    samples_per_component: int,
    settings: dict[str, Any],
) -> tuple[Any, dict[int, float], Tensor]:
    """The server's half of a local-fit round: one mixture fitted on rows drawn from the
    union of the client mixtures.

    Args:
        models: the client mixtures (same covariance type and n_features).
        sizes: rows behind each model (the union weighs client ``c`` by ``sizes[c] / sum``).
        candidates: the K of the fit (several: BIC picks one).
        samples_per_component: rows drawn per union component.
        settings: keyword arguments of :func:`~fednovelty.mixture.fit_gmm_scaled` (its
            ``generator`` draws the rows first, then initialises the fit).

    Returns:
        ``(EMResult of the fit, BIC per candidate, the rows drawn)``, the rows
        (samples_per_component * union components, n_features).
    """
    union = union_mixture(models, sizes)
    n_synthetic = samples_per_component * union.n_components
    synthetic, _ = sample(union, n_synthetic, generator=settings["generator"])
    result, bics = fit_gmm_scaled(synthetic, candidates, **settings)
    return result, bics, synthetic


def one_shot_limit(config: Any, broadcast: Message) -> int:
    """A client fits at most the algorithm's ``n_components`` components."""
    return int(config.n_components)


#: what backs a local fit's reply: its components as a model's, its row count the client's.
LOCAL_FIT_BACKING = {
    "weights": "model",
    "means": "model",
    "precisions_cholesky": "model",
    "n_samples": "client",
}


def local_fit_reply(kind: str, limit: Limit, components: Components, **options: Any) -> ReplySpec:
    """The declaration of a reply of a client's local mixture (:func:`local_fit_shapes`,
    :func:`check_local_fit`, backed as :data:`LOCAL_FIT_BACKING`), the client half's work
    growing with the covariance type; ``limit`` bounds its components and ``components``
    estimates the K of its work (:class:`ReplySpec`), ``options`` are its other fields."""
    return ReplySpec(
        kind,
        shapes=local_fit_shapes,
        checks=(check_local_fit,),
        backing=LOCAL_FIT_BACKING,
        limit=limit,
        components=components,
        covariance=True,
        **options,
    )


#: a ``oneshot`` reply: a client's local mixture as the start of federated EM; its
#: component means are weighted means of the client's rows, so they lie in the box of the
#: moments the client declared in the moments round, where one ran first.
ONE_SHOT_REPLY = local_fit_reply(
    "oneshot", one_shot_limit, components_setting, box="means", points=("means",)
)


class OneShotStart(Step):
    """The initial mixture of federated EM from one local-fit round (``init_params=
    "oneshot"``; module docstring).

    Every client fits ``min(n_components, n_rows // min_rows)`` components to its rows in the
    rounds' units (z-scores after a standardising moments round; with ``standardize`` each
    fit also standardises its own rows), by maximum likelihood with ``reg_covar`` and no
    covariance prior, to ``LOCAL_TOL`` or ``LOCAL_MAX_ITER`` iterations; the server leaves
    out the components no honest rows produce (module docstring; their count is the
    round's ``n_components_left_out``), reduces the union of the rest to ``n_components``
    components (:func:`reduce_union`, the same fit) and sets ``state.params``. The EM rounds
    that follow apply the configured prior.
    """

    kinds = ("oneshot",)
    replies = declare(ONE_SHOT_REPLY)

    def _settings(self, generator: torch.Generator) -> dict[str, Any]:
        # maximum likelihood: a prior of fixed pseudo-rows weighs far more on a client's
        # rows, or the server's synthetic rows, than on the pooled rows the EM rounds sum
        # (measured: a start 3 nats per row broader on Covertype); the EM rounds apply the
        # configured prior
        return fit_settings(
            self.config, generator, prior_strength=None, tol=LOCAL_TOL, max_iter=LOCAL_MAX_ITER
        )

    def _seed(self, state: Any) -> int:
        return derived_seed(self.config.random_state, state.rounds)

    def configure(self, state: Any) -> Message:
        config = self.config
        return Message(
            "oneshot",
            scalars={"seed": self._seed(state)},
            expect={
                "covariance_type": config.covariance_type,
                "max_components": config.n_components,
            },
        )

    def client_step(self, X: Tensor, message: Message, context: ClientContext) -> Message:
        terms = context.terms
        n = X.shape[0]
        k = terms.cluster_bound(self.config.n_components, n)
        if k == 0 or not terms.releases(n):
            return skipped_reply("oneshot", terms.below_floor)
        generator = client_generator(int(message.scalars["seed"]), context.client_id)
        result = fit_local(
            X,
            [k],
            self.config,
            generator,
            prior_strength=None,
            tol=LOCAL_TOL,
            max_iter=LOCAL_MAX_ITER,
        )
        tensors = {**result.params.tensors(), "n_samples": torch.tensor(float(n), dtype=X.dtype)}
        return Message(
            "oneshot",
            tensors,
            {"skipped": False, "n_iter": result.n_iter},
            backing=local_fit_backing(result.params, n, terms),
        )

    def server_step(self, state: Any, replies: dict[int, Message]) -> tuple[None, dict]:
        config = self.config
        models, sizes = {}, {}
        for cid, reply in sorted(replies.items()):
            if reply.scalars.get("skipped", False):
                continue
            t = {k: v.to(config.device, config.dtype) for k, v in reply.tensors.items()}
            models[cid] = MixtureParams(
                t["weights"], t["means"], t["precisions_cholesky"], config.covariance_type
            )
            sizes[cid] = float(t["n_samples"])
        models, sizes, left_out = screen_local_fits(models, sizes, "oneshot")
        n_union = sum(m.n_components for m in models.values())
        if n_union < config.n_components:
            raise ValueError(
                f"the clients sent {n_union} local component(s) in all but n_components="
                f"{config.n_components}; lower n_components, or start from "
                'init_params="kmeans".'
            )
        generator = torch.Generator().manual_seed(self._seed(state) ^ 0x5EED)
        ids = sorted(models)
        result, _, synthetic = reduce_union(
            [models[c] for c in ids],
            [sizes[c] for c in ids],
            [config.n_components],
            ONE_SHOT_SAMPLES,
            self._settings(generator),
        )
        state.params = result.params
        return None, {
            "phase": "oneshot",
            "n_synthetic": int(synthetic.shape[0]),
            "n_union": n_union,
            "n_components_left_out": sum(len(v) for v in left_out.values()),
        }
