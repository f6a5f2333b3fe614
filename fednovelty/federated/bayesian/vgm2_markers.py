"""VGM2's mixture relation markers on embedded pairs (Sec. 3.3-3.5): the pairs' distances,
the prediction scores from ``pi_1`` (Eq. 3), the server's prior from the clients' markers
(Prop. 1 or Sec. 3.5) and DP-SGD's template of a pair's same-class logit.

The Dir-NIG math itself is :mod:`fednovelty.mixture.dirnig`'s.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from fednovelty.mixture.dirnig import (
    marker_to_posterior,
    markers_from_free,
    posterior_to_marker,
    same_class_logit,
)
from fednovelty.mixture.vb_aggregate import aggregate_posteriors

__all__ = ["PairModel", "aggregate_priors", "marker_scores", "pair_distances"]


def pair_distances(Z: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """Distances ``||z_i - z_j||`` of every pair ``i < j`` of embeddings (n, d): the
    distances (n(n-1)/2,) and the pairs' ``i``, ``j`` (int64)."""
    i, j = torch.triu_indices(Z.shape[0], Z.shape[0], offset=1, device=Z.device)
    s = ((Z[i] - Z[j]).square().sum(1) + 1e-12).sqrt()
    return s, i, j


def marker_scores(
    Z: Tensor,
    reference: Tensor,
    reference_y: Tensor,
    markers: Tensor,
    n_classes: int,
    top_m: int,
    rule: str = "nearest",
) -> Tensor:
    """VGM2's prediction scores (n, n_classes) of embeddings ``Z`` (n, d) against the
    ``reference`` embeddings (n_ref, d) with labels ``reference_y`` (n_ref,), from
    ``pi_1(||z - r_j||)`` (Eq. 3, markers (2, 5, K)).

    ``rule="nearest"``: among the ``top_m`` nearest reference rows, class ``c`` scores the
    sum of ``pi_1`` of its rows (a kNN vote weighted by the same-class probability; ties in
    distance go to the lower index). ``rule="top_pi"``: class ``c`` scores the mean of the
    ``top_m`` largest ``pi_1`` over its rows. A class without reference rows scores 0."""
    with torch.no_grad():
        s = torch.cdist(Z, reference)  # (n, n_ref)
        pi = torch.sigmoid(same_class_logit(s.reshape(-1), markers)).reshape(s.shape)
        scores = Z.new_zeros(Z.shape[0], n_classes)
        if rule == "nearest":
            m = min(top_m, reference.shape[0])
            near = s.topk(m, dim=1, largest=False).indices  # (n, m)
            return scores.scatter_add_(1, reference_y[near], pi.gather(1, near))
        if rule != "top_pi":
            raise ValueError(f"rule must be 'nearest' or 'top_pi'; got {rule!r}.")
        for c in torch.unique(reference_y).tolist():
            column = pi[:, reference_y == c]
            m = min(top_m, column.shape[1])
            scores[:, c] = column.topk(m, dim=1).values.mean(1)
        return scores


def aggregate_priors(markers: list[Tensor], weights: Tensor, how: str) -> Tensor:
    """The server's prior (2, 5, K) from client markers (each (2, 5, K)) weighted by
    ``weights`` (n,): each relation's Dir-NIG as a 1-D posterior combined by
    :func:`~fednovelty.mixture.vb_aggregate.aggregate_posteriors` (``how``: ``"moment"``,
    Prop. 1, or ``"natural"``, Sec. 3.5), components aligned by index."""
    return torch.stack(
        [
            posterior_to_marker(
                aggregate_posteriors([marker_to_posterior(m[r]) for m in markers], weights, how)
            )
            for r in range(2)
        ]
    )


class PairModel(nn.Module):
    """DP-SGD's template of VGM2's private training: the encoder and the markers'
    unconstrained parameters ``free`` (2, 5, K) in units of ``scale`` (markers
    ``markers_from_free(scale * free)``: one optimiser's step size moves them ``scale``
    times as far as the encoder's). ``forward(pair)``: a pair of rows (2, n_features) -> its
    same-class logit ``logit pi_1(||f(x_1) - f(x_2)||)`` (1,)."""

    def __init__(self, encoder: nn.Module, n_markers: int, scale: float):
        super().__init__()
        self.encoder = encoder
        self.free = nn.Parameter(torch.zeros(2, 5, n_markers))
        self.scale = float(scale)

    def markers(self, free: Tensor) -> Tensor:
        """The markers (2, 5, K) of parameters ``free``."""
        return markers_from_free(self.scale * free)

    def forward(self, pair: Tensor) -> Tensor:
        z = self.encoder(pair)
        s = ((z[0] - z[1]).square().sum() + 1e-12).sqrt()
        return same_class_logit(s.reshape(1), self.markers(self.free))
