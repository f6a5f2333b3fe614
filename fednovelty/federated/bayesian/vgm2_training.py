"""VGM2's local training (Alg. 1): the loss of Eq. 7 by Adam, and its DP-SGD form on pairs.

:func:`train_markers` minimises ``L_umap + gamma L_sim + eta L_cal + lambda KL(q || p_t)``
over ``local_epochs`` passes, the client's markers ``q`` starting at the broadcast prior and
trained on their unconstrained parameters beside the encoder. :func:`private_markers` trains
the encoder and markers by the client's DP-SGD on pairs of rows, without the calibration and
UMAP terms (they are no sums over such pairs).
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor, nn
from torch.func import functional_call

from fednovelty.federated.bayesian.vgm2_markers import PairModel, pair_distances
from fednovelty.federated.bayesian.vgm2_networks import (
    embed,
    local_batches,
    prefixed,
    private_adam,
    unprefixed,
)
from fednovelty.federated.bayesian.vgm2_umap import umap_loss
from fednovelty.federated.trust.dp_sgd import DPSGDSettings
from fednovelty.mixture.dirnig import (
    free_from_markers,
    kl_markers,
    markers_from_free,
    same_class_logit,
    soft_calibration_error,
)

__all__ = ["private_markers", "train_markers"]


def train_markers(
    template: nn.Module,
    config: Any,
    ab: tuple[float, float],
    encoder: dict[str, Tensor],
    prior: Tensor,
    X: Tensor,
    y: Tensor,
    graph: tuple[Tensor | None, Tensor | None, Tensor | None],
    generator: torch.Generator,
) -> tuple[dict[str, Tensor], Tensor, float]:
    """Eq. 7 by Adam (``config``: a :class:`~fednovelty.federated.bayesian.vgm2.VGM2Config`)
    for ``local_epochs`` passes from ``encoder`` (of the encoder ``template``) and ``q =
    prior`` (2, 5, K) on rows ``X`` (n, m) and labels ``y`` (n,); ``ab``: UMAP's curve,
    ``graph``: the heads, tails and weights of the client's fuzzy kNN graph (``None``: no
    UMAP term). Returns the encoder, the markers (2, 5, K) and the mean loss."""
    a, b = ab
    train_encoder = config.train_encoder
    params = {k: v.detach().clone().requires_grad_(train_encoder) for k, v in encoder.items()}
    free = free_from_markers(prior.detach().clone()).requires_grad_(True)
    groups = [{"params": [free], "lr": config.marker_learning_rate}]
    if train_encoder:
        groups.append({"params": list(params.values()), "lr": config.learning_rate})
    optimizer = torch.optim.Adam(groups)
    heads, tails, weights = graph
    use_umap = train_encoder and config.umap_weight > 0 and heads is not None and heads.numel()
    total, steps = 0.0, 0
    frozen = None
    if not train_encoder:
        with torch.no_grad():
            frozen = embed(template, params, X)
    for batch in local_batches(X.shape[0], config, generator):
        batch = batch.to(X.device)
        Z = frozen[batch] if frozen is not None else embed(template, params, X[batch])
        markers = markers_from_free(free)
        s, i, j = pair_distances(Z)
        same = (y[batch][i] == y[batch][j]).to(Z.dtype)
        logit = same_class_logit(s, markers)
        loss = config.similarity_weight * nn.functional.binary_cross_entropy_with_logits(
            logit, same
        )
        if config.calibration_weight > 0:
            loss = loss + config.calibration_weight * soft_calibration_error(
                torch.sigmoid(logit), same, config.n_bins
            )
        if config.kl_weight > 0:
            loss = loss + config.kl_weight * kl_markers(markers, prior)
        if use_umap:
            edges = torch.multinomial(  # drawn on the CPU generator, on any device
                weights.cpu(), batch.numel(), replacement=True, generator=generator
            ).to(X.device)
            z_head = embed(template, params, X[heads[edges]])
            z_tail = embed(template, params, X[tails[edges]])
            loss = loss + config.umap_weight * umap_loss(
                z_head, z_tail, a, b, config.negative_sample_rate, generator
            )
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        total += float(loss.detach())
        steps += 1
    markers = markers_from_free(free.detach())
    trained = {k: v.detach() for k, v in params.items()}
    return trained, markers, total / max(steps, 1)


def private_markers(
    template: nn.Module,
    config: Any,
    encoder: dict[str, Tensor],
    prior: Tensor,
    X: Tensor,
    y: Tensor,
    settings: DPSGDSettings,
    generator: torch.Generator,
) -> tuple[dict[str, Tensor], Tensor]:
    """VGM2's local training (``config``: a
    :class:`~fednovelty.federated.bayesian.vgm2.VGM2Config`) under DP-SGD (``settings``, the
    client's own): the encoder (of ``template``) and markers together by
    :func:`~fednovelty.federated.bayesian.vgm2_networks.private_adam` on pairs of rows
    (``pairs=True``: a row and its successor in a random cycle of the step's sample), a
    pair's loss ``gamma BCE(same, logit pi_1(s)) + lambda KL(q || p_t)``, Adam at
    ``learning_rate`` (the markers at ``marker_learning_rate`` through
    :class:`~fednovelty.federated.bayesian.vgm2_markers.PairModel`'s scale). Eq. 7's
    calibration error (of a batch's pairs) and parametric UMAP's loss (on the kNN graph of
    all the rows) are not sums over pairs of one row and are left out.
    ``train_encoder=False``: the markers alone, on the frozen encoder's embeddings. Returns
    the encoder and the markers (2, 5, K)."""
    scale = config.marker_learning_rate / config.learning_rate
    inputs = X
    encoder_module: nn.Module = template
    if not config.train_encoder:
        with torch.no_grad():
            inputs = embed(template, encoder, X)
        encoder_module = nn.Identity()
    model = PairModel(encoder_module, config.n_markers, scale).to(X)
    start = {"free": free_from_markers(prior.clone()) / scale}
    if config.train_encoder:
        start.update(prefixed("encoder.", encoder))
    gamma, lam = config.similarity_weight, config.kl_weight

    def pair_loss(ps, pair, labels, w):
        p = ps[0]
        logit = functional_call(model, p, (pair,))
        same = (labels[0] == labels[1]).to(logit.dtype).reshape(1)
        bce = nn.functional.binary_cross_entropy_with_logits(logit, same)
        return w[0] * (gamma * bce + lam * kl_markers(model.markers(p["free"]), prior))

    trained = private_adam(
        model, start, inputs, y, config, settings, generator, row_loss=pair_loss, pairs=True
    )
    markers = model.markers(trained["free"]).detach()
    return (unprefixed("encoder.", trained) if config.train_encoder else encoder), markers
