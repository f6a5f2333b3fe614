"""The ``vb_prior`` round of federated variational Bayes: the shared prior from the clients'
pooled moments.

Each client sends its row count, mean and scatter about its own mean (full matrix); the
server merges them exactly (Chan's parallel formula) into scikit-learn's default
``mean_prior`` (the data mean) and ``covariance_prior`` (the data covariance), or with
``prior_strength`` a Wishart of that many pseudo-rows (:class:`VBPriorStep`). The round is
skipped when both priors are given, or when a standardising ``moments`` round already gave
what the pseudo-rows need. Under differential privacy the merged moments are the noisy
release's, post-processed (:func:`private_prior_moments`); with a public box or z-scores the
given priors are mapped to the units the rounds work in (:func:`working_priors`).
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from fednovelty.federated.core.base import ClientContext, Message, skipped_reply
from fednovelty.federated.core.declarations import ReplySpec, declare
from fednovelty.federated.core.steps import Step
from fednovelty.federated.init.combine import private_stats
from fednovelty.federated.trust.backing import client_backing
from fednovelty.federated.trust.value_checks import check_scatter
from fednovelty.mixture.stats import CovariancePrior, SufficientStats
from fednovelty.mixture.vb_prior import VBPrior, prior_from_moments, wishart_pseudo_rows

__all__ = [
    "VB_PRIOR_REPLY",
    "VBPriorStep",
    "prior_moments",
    "private_prior_moments",
    "working_priors",
]


def prior_moments(reply: Message) -> tuple[Tensor, Tensor, Tensor]:
    """The moments a ``vb_prior`` reply declares: row count, per-feature mean and sum of
    squared deviations (the scatter's diagonal), (n_features,)."""
    t = reply.tensors
    return t["n_samples"], t["mean"], torch.diagonal(t["scatter"])


#: a ``vb_prior`` reply: the client's row count, mean (d,) and scatter about it (d, d),
#: symmetric positive semi-definite; it declares the client's moments (the box of its
#: later replies) and lies in the box of moments declared before it. Under differential
#: privacy it is released as a noisy scatter (count, sum of rows, sum of outer products).
VB_PRIOR_REPLY = ReplySpec(
    "vb_prior",
    shapes=lambda b, d: {"n_samples": (), "mean": (d,), "scatter": (d, d)},
    checks=(check_scatter,),
    backing={"n_samples": "client", "mean": "client", "scatter": "client"},
    box="moments",
    moments=prior_moments,
    private="scatter",
)


class VBPriorStep(Step):
    """Pooled mean and covariance for scikit-learn's default prior (module docstring), in
    the units the rounds work in (the public box's with ``bounds``); under differential
    privacy from the noisy sums, post-processed (:func:`private_prior_moments`). Each
    client's declared row count is kept in ``state.client_rows`` (what a later ``vb_local``
    reply is checked against)."""

    kinds = ("vb_prior",)
    replies = declare(VB_PRIOR_REPLY)

    def __init__(self, config: Any) -> None:
        """The round of ``config`` (a :class:`~fednovelty.federated.bayesian.variational.
        VBConfig` or :class:`~fednovelty.federated.bayesian.vb_oneshot.VBOneShotConfig`)."""
        self.config = config

    def begin(self, state: Any) -> str | None:
        # The moments round sets federated EM's covariance prior from ``prior_strength``;
        # VB's prior is the Wishart alone, and its start (the initial mixture) stays plain.
        pooled, state.prior = state.prior, None
        if self._from_moments(pooled):
            state.vb_prior = self._pseudo_row_prior(pooled)
            return None
        if self.config.needs_prior_moments:
            return "vb_prior"
        state.vb_prior = self._prior(state, None, None, None)
        return None

    def _from_moments(self, pooled: Any) -> bool:
        """Whether the standardising ``moments`` round already gave everything the prior
        needs (z-scores: the pooled mean is 0 and the pseudo-rows need only the pooled
        variances), so no ``vb_prior`` round runs: the exact chain's k-means start, no given
        mean or covariance prior, no differential privacy."""
        config = self.config
        return (
            pooled is not None
            and getattr(config, "standardize", False)
            and getattr(config, "prior_strength", None) is not None
            and config.mean_prior is None
            and config.covariance_prior is None
            and getattr(config, "init_params", None) not in (None, "oneshot")
            and not getattr(config, "private", False)
        )

    def _pseudo_row_prior(self, pooled: CovariancePrior) -> VBPrior:
        """The Wishart of ``prior_strength`` pseudo-rows from the moments round's target
        (``prior_scale`` x the pooled variances in z-scores, population ``ddof=0``), the
        mean prior at the pooled mean (0 in z-scores), the other priors as given or
        scikit-learn's defaults."""
        config = self.config
        variance = pooled.scale / config.prior_scale
        dof, covariance = wishart_pseudo_rows(
            variance, config.prior_strength, config.prior_scale, config.covariance_type
        )
        k = config.n_components
        weight = config.weight_concentration_prior
        beta = config.mean_precision_prior
        dof = dof if config.degrees_of_freedom_prior is None else config.degrees_of_freedom_prior
        return VBPrior(
            weight_concentration_prior_type=config.weight_concentration_prior_type,
            weight_concentration=1.0 / k if weight is None else float(weight),
            mean_precision=1.0 if beta is None else float(beta),
            mean=torch.zeros_like(variance),
            degrees_of_freedom=float(dof),
            covariance=covariance,
            covariance_type=config.covariance_type,
        )

    def configure(self, state: Any) -> Message:
        if getattr(state, "scale", None) is None:  # the one-shot chain has no public box
            return Message("vb_prior")
        # the units of the moments the reply declares (the server gate's box is in x units)
        return Message("vb_prior", {"box_offset": state.offset, "box_scale": state.scale})

    def client_step(self, X: Tensor, message: Message, context: ClientContext) -> Message:
        if not context.terms.releases(X.shape[0]):
            return skipped_reply("vb_prior", context.terms.below_floor)
        n = X.shape[0]
        mean = X.mean(0) if n else X.new_zeros(X.shape[1])
        centered = X - mean
        tensors = {
            "n_samples": torch.tensor(float(n), dtype=X.dtype, device=X.device),
            "mean": mean,
            "scatter": centered.T @ centered,
        }
        return Message("vb_prior", tensors, backing=client_backing(tensors, n))

    def server_step(self, state: Any, replies: dict[int, Message]) -> tuple[None, dict]:
        config = self.config
        if not getattr(config, "private", False):
            for cid, reply in replies.items():
                state.client_rows[cid] = float(reply.tensors["n_samples"])
        parts = [
            {k: v.to(config.device, config.dtype) for k, v in reply.tensors.items()}
            for reply in replies.values()
        ]
        n = sum(p["n_samples"] for p in parts)
        if float(n) < 2:
            raise ValueError("the default variational prior needs >= 2 rows in all.")
        mean = sum(p["n_samples"] * p["mean"] for p in parts) / n
        scatter = sum(
            p["scatter"] + p["n_samples"] * torch.outer(p["mean"] - mean, p["mean"] - mean)
            for p in parts
        )
        if getattr(config, "dp_mode", None) is not None:
            n, mean, scatter = private_prior_moments(n, mean, scatter, config, len(parts), state)
        state.vb_prior = self._prior(state, n, mean, scatter)
        state.reference = state.vb_prior
        if getattr(config, "prior_strength", None) is not None:
            # the matching's reference: the data's own Gaussian, not the pseudo-rows' prior
            state.reference = self._prior(state, n, mean, scatter, pseudo_rows=False)
        return None, {"phase": "vb_prior", "n_samples": float(n)}

    def _prior(
        self,
        state: Any,
        n: Tensor | None,
        mean: Tensor | None,
        scatter: Tensor | None,
        pseudo_rows: bool = True,
    ) -> VBPrior:
        """The shared prior from the pooled moments (``pseudo_rows=False``: scikit-learn's
        defaults whatever ``prior_strength`` says, the pooled data's Gaussian that the
        one-shot matching measures divergences against)."""
        config = self.config
        offset, scale = getattr(state, "offset", None), getattr(state, "scale", None)
        mean_prior, covariance_prior = working_priors(config, offset, scale)
        if n is None:  # every prior given: only the width is needed
            mean = mean_prior
            n, scatter = mean.new_tensor(2.0), torch.eye(mean.shape[0]).to(mean)
        moments = SufficientStats(
            counts=n.reshape(1),
            sums=torch.zeros_like(mean).unsqueeze(0),
            second=scatter.unsqueeze(0),
            shift=mean,
            log_likelihood=mean.new_zeros(()),
            n_samples=n,
            covariance_type="full",
        )
        return prior_from_moments(
            moments,
            config.n_components,
            config.covariance_type,
            weight_concentration_prior_type=config.weight_concentration_prior_type,
            weight_concentration_prior=config.weight_concentration_prior,
            mean_precision_prior=config.mean_precision_prior,
            mean_prior=mean_prior,
            degrees_of_freedom_prior=config.degrees_of_freedom_prior,
            covariance_prior=covariance_prior,
            prior_strength=getattr(config, "prior_strength", None) if pseudo_rows else None,
            prior_scale=getattr(config, "prior_scale", 1.0),
        )


def private_prior_moments(
    n: Tensor, mean: Tensor, scatter: Tensor, config: Any, n_replies: int, state: Any
) -> tuple[Tensor, Tensor, Tensor]:
    """The pooled noisy prior moments (row count (), mean (d,), scatter about the mean
    (d, d)) made usable, as federated EM's noisy statistics are
    (:func:`~fednovelty.federated.init.combine.private_stats`): they are one component's ``full``
    statistics about the clipping centre (the origin), so the trusted server's noise in
    ``"central"`` mode is the ``"scatter"`` release's (count 1, sum of rows ``B``, sum of
    outer products ``B**2``, same shares), and the post-processing keeps the count at least
    twice its noise, the mean in the clipping ball and the covariance's eigenvalues between
    the noise's floor and ``B**2``. Post-processing: no privacy cost."""
    stats = SufficientStats(
        counts=n.reshape(1),
        sums=(n * mean).unsqueeze(0),
        second=(scatter + n * torch.outer(mean, mean)).unsqueeze(0),
        shift=torch.zeros_like(mean),
        log_likelihood=mean.new_zeros(()),
        n_samples=n.reshape(()),
        covariance_type="full",
    )
    stats = private_stats(stats, config, n_replies, state)
    n = stats.counts[0]
    mean = stats.sums[0] / n
    return n, mean, stats.second[0] - n * torch.outer(mean, mean)


def working_priors(
    config: Any, offset: Tensor | None, scale: Tensor | None
) -> tuple[Tensor | None, Tensor | float | None]:
    """The given ``mean_prior`` and ``covariance_prior`` (user units) in the units the
    rounds work in, ``z = (x - offset) / scale`` (each (n_features,); ``None``: the user's
    units): the mean shifted and scaled, the covariance ``D^-1 C D^-1`` (full, tied), divided
    by ``scale**2`` (diag) or by the one common ``scale**2`` (spherical)."""
    mean, cov = config.mean_prior, config.covariance_prior
    if scale is None:
        return mean, cov
    if mean is not None:
        mean = (mean - offset) / scale
    if cov is not None:
        if config.covariance_type in ("full", "tied"):
            cov = cov / torch.outer(scale, scale)
        elif config.covariance_type == "diag":
            cov = cov / scale.square()
        else:
            cov = cov / float(scale[0]) ** 2
    return mean, cov
