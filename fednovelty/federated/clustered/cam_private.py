"""The private forms of the Fed-CAM methods' client work: DP-SGD training of the models a
round sends, and the noisy min-loss cluster choice.

:func:`private_models` trains the models of one round on the same rows in one DP-SGD loop
(FedAvg+'s members; CAM's two halves as one :class:`AdditivePair`); :func:`clipped_loss_sums`
and :func:`noisy_cluster_losses` are IFCA's min-loss choice as a report-noisy-min. Every
draw is the client's own (its generator); the steps call these under the client's
differential-privacy policy.
"""

from __future__ import annotations

import copy
import math
from collections.abc import Sequence

import torch
from torch import Tensor, nn

from fednovelty.federated.core.learners import logits
from fednovelty.federated.trust.dp_sgd import DPSGDSettings, private_sgd
from fednovelty.federated.trust.noise import NoiseSource, add_gaussian

__all__ = ["AdditivePair", "clipped_loss_sums", "noisy_cluster_losses", "private_models"]


class AdditivePair(nn.Module):
    """One client's additive model (Eq. 1): ``forward(x) = cluster(x) + global(x)``, two
    copies of ``template`` named ``cluster`` and ``global`` (parameters ``cluster.*`` and
    ``global.*``, as a reply names them) holding ``cluster`` and ``glob`` (frozen).

    DP-SGD evaluates it with the parameters of one half given (``functional_call`` with
    ``cluster.*`` alone, or ``global.*`` alone): that half is trained and the other is its
    frozen copy, so one loop trains each half on the residual of the other's broadcast
    model, the paper's parallel (FedSim) update (Eq. 5 and 8).
    """

    def __init__(
        self, template: nn.Module, cluster: dict[str, Tensor], glob: dict[str, Tensor]
    ) -> None:
        super().__init__()
        for prefix, params in (("cluster", cluster), ("global", glob)):
            half = copy.deepcopy(template)
            with torch.no_grad():
                for name, value in half.named_parameters():
                    value.copy_(params[name]).requires_grad_(False)
            self.add_module(prefix, half)

    def forward(self, x: Tensor) -> Tensor:
        return self._modules["cluster"](x) + self._modules["global"](x)


def private_models(
    template: nn.Module,
    starts: Sequence[dict[str, Tensor]],
    X: Tensor,
    y: Tensor,
    settings: DPSGDSettings,
    generator: torch.Generator,
    *,
    learning_rate: float,
    optimizer: str = "sgd",
    momentum: float = 0.0,
    mu_prox: float = 0.0,
) -> list[dict[str, Tensor]]:
    """The ``M`` models ``starts`` trained on the same rows in one DP-SGD loop
    (:func:`~fednovelty.federated.trust.dp_sgd.private_sgd`: each step's per-row gradients of all
    of them clipped together to ``settings.clip_norm``, one Gaussian mechanism a step) on the
    mean of their cross-entropies, each row weighted ``1 / M`` per model (DP-SGD's weights
    sum to at most 1). With ``"sgd"`` the learning rate is multiplied by ``M``, so that each
    model takes the step of its own loss (the clip then bounds a row's gradients of the
    ``M`` losses together at ``M * clip_norm``); Adam does not see the loss's scale.

    Args:
        template: the module the models are evaluated with (an :class:`AdditivePair` for
            CAM's two halves).
        starts: ``M`` parameter dicts (not modified); X: rows (n, d); y: labels (n,).
        settings, generator: the client's own DP-SGD and private generator.

    Returns:
        ``M`` dicts of trained parameters, named as ``starts``.
    """
    m = len(starts)
    weight = X.new_full((X.shape[0], m), 1.0 / m)
    rate = learning_rate * m if optimizer == "sgd" else learning_rate
    return private_sgd(
        template,
        starts,
        X,
        y,
        weight,
        settings,
        generator,
        learning_rate=rate,
        optimizer=optimizer,
        momentum=momentum,
        mu_prox=mu_prox,
    )


def clipped_loss_sums(
    template: nn.Module,
    models: Sequence[dict[str, Tensor]],
    X: Tensor,
    y: Tensor,
    offset: Tensor | None,
    bound: float,
) -> Tensor:
    """Each model's sum over the rows of ``min(CE_i, bound)`` (logits plus ``offset``),
    (len(models),) float64. One row added or removed moves each sum by at most ``bound``,
    so the vector by at most ``sqrt(len(models)) * bound`` in L2."""
    with torch.no_grad():
        sums = []
        for params in models:
            z = logits(template, params, X)
            z = z if offset is None else z + offset
            per_row = nn.functional.cross_entropy(z, y, reduction="none")
            sums.append(per_row.clamp(max=bound).sum().double().cpu())
        return torch.stack(sums)


def noisy_cluster_losses(
    sums: Tensor, bound: float, multiplier: float, generator: NoiseSource
) -> Tensor:
    """The Gaussian mechanism on :func:`clipped_loss_sums` ``sums`` (K,): each entry plus
    noise of standard deviation ``multiplier * sqrt(K) * bound`` (``multiplier`` times the
    vector's L2 sensitivity) from the client's ``generator``; its argmin is the private
    min-loss cluster (report-noisy-min, post-processing of the noisy vector)."""
    k = sums.shape[0]
    spread = float(multiplier) * math.sqrt(k) * float(bound)
    return add_gaussian(sums.to(torch.float64), spread, generator)
