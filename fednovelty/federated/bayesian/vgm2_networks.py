"""The networks of VGM2 and its baselines and their plain local training.

Every client of the family trains a personal encoder ``f: R^m -> R^d`` (:func:`encoder_template`:
an MLP, or a small ConvNet on square images; the baselines add a linear class head
``R^d -> C``) with Adam for ``local_epochs`` passes over its rows each
time it is sampled (:func:`local_batches`). :func:`train_classifier` is the baselines'
cross-entropy training (with an optional extra term per batch, FedProto's pull);
:class:`Classifier` is DP-SGD's template of ``head(encoder(x))`` and :func:`private_adam` the
family's DP-SGD of one network. Parameters travel and are kept under prefixed names
(:func:`prefixed`, :func:`unprefixed`).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import torch
from torch import Tensor, nn

from fednovelty.federated.bayesian.vgm2_settings import EncoderSettings, image_side
from fednovelty.federated.core.learners import logits
from fednovelty.federated.trust.dp_sgd import DPSGDSettings, private_sgd
from fednovelty.federated.trust.noise import NoiseSource

__all__ = [
    "Classifier",
    "convnet_encoder",
    "embed",
    "encoder_template",
    "head_template",
    "local_batches",
    "prefixed",
    "private_adam",
    "train_classifier",
    "unprefixed",
]


def encoder_template(config: EncoderSettings) -> nn.Module:
    """The encoder of ``config.encoder_type``: ``"mlp"``, ``Linear(n_features, hidden) - ReLU -
    Linear(hidden, d)``; ``"convnet"``, :func:`convnet_encoder`."""
    with torch.random.fork_rng(devices=[]):
        if config.encoder_type == "convnet":
            module = convnet_encoder(config.n_features, config.hidden, config.embedding_dim)
        else:
            module = nn.Sequential(
                nn.Linear(config.n_features, config.hidden),
                nn.ReLU(),
                nn.Linear(config.hidden, config.embedding_dim),
            )
    return module.to(device=config.device, dtype=config.dtype)


def convnet_encoder(n_features: int, hidden: int, embedding_dim: int) -> nn.Module:
    """A small ConvNet on square one-channel images flattened to rows (n, side * side) ->
    (n, embedding_dim): ``Conv(1 -> 16, 5x5) - ReLU - MaxPool(2) - Conv(16 -> 32, 5x5) -
    ReLU - MaxPool(2) - Linear(32 p^2, hidden) - ReLU - Linear(hidden, embedding_dim)``,
    ``p = ((side - 4) // 2 - 4) // 2`` (4 for 28 x 28: 512 features into the dense layer).
    ``n_features`` is checked by :class:`EncoderSettings` (a square, side >= 16)."""
    side = image_side(n_features)
    if side is None:
        raise ValueError(f"the ConvNet encoder needs side * side features; got {n_features}.")
    pooled = ((side - 4) // 2 - 4) // 2
    return nn.Sequential(
        nn.Unflatten(1, (1, side, side)),
        nn.Conv2d(1, 16, 5),
        nn.ReLU(),
        nn.MaxPool2d(2),
        nn.Conv2d(16, 32, 5),
        nn.ReLU(),
        nn.MaxPool2d(2),
        nn.Flatten(),
        nn.Linear(32 * pooled * pooled, hidden),
        nn.ReLU(),
        nn.Linear(hidden, embedding_dim),
    )


def head_template(config: EncoderSettings) -> nn.Module:
    """The baselines' class head: ``Linear(d, n_classes)``."""
    with torch.random.fork_rng(devices=[]):
        module = nn.Linear(config.embedding_dim, config.n_classes)
    return module.to(device=config.device, dtype=config.dtype)


def embed(template: nn.Module, params: dict[str, Tensor], X: Tensor) -> Tensor:
    """The encoder's embeddings of rows ``X`` (n, n_features) -> (n, d)."""
    return logits(template, params, X)


def prefixed(prefix: str, params: dict[str, Tensor]) -> dict[str, Tensor]:
    """``params`` with every name behind ``prefix`` (``"encoder."``: a reply's names)."""
    return {f"{prefix}{k}": v for k, v in params.items()}


def unprefixed(prefix: str, tensors: dict[str, Tensor]) -> dict[str, Tensor]:
    """The tensors named ``prefix...`` with the prefix taken off (``{}``: none)."""
    return {k[len(prefix) :]: v for k, v in tensors.items() if k.startswith(prefix)}


def local_batches(n: int, config: EncoderSettings, generator: torch.Generator) -> Iterator[Tensor]:
    """Row indices of a client's local training: ``local_epochs`` random orders of ``n``
    rows cut into batches of ``batch_size`` (a last batch of one row is left out)."""
    size = config.batch_size
    for _ in range(config.local_epochs):
        order = torch.randperm(n, generator=generator)
        for begin in range(0, n, size):
            batch = order[begin : begin + size]
            if batch.numel() >= 2:
                yield batch


def train_classifier(
    templates: tuple[nn.Module, nn.Module],
    config: EncoderSettings,
    encoder: dict[str, Tensor],
    head: dict[str, Tensor],
    X: Tensor,
    y: Tensor,
    generator: torch.Generator,
    extra: Callable[[Tensor, Tensor], Tensor | None] | None = None,
) -> tuple[dict[str, Tensor], dict[str, Tensor], float]:
    """Cross-entropy of ``head(encoder(x))`` (``templates``: the encoder's and the head's)
    by Adam for ``local_epochs`` passes from ``encoder`` and ``head``, the encoder frozen
    unless ``train_encoder``; ``extra(Z, y_batch)`` adds a term to a batch's loss (``None``:
    nothing). Returns encoder, head and the mean loss."""
    encoder_t, head_t = templates
    enc = {k: v.detach().clone().requires_grad_(config.train_encoder) for k, v in encoder.items()}
    hd = {k: v.detach().clone().requires_grad_(True) for k, v in head.items()}
    trainable = list(hd.values()) + (list(enc.values()) if config.train_encoder else [])
    optimizer = torch.optim.Adam(trainable, lr=config.learning_rate)
    total, steps = 0.0, 0
    for batch in local_batches(X.shape[0], config, generator):
        batch = batch.to(X.device)
        Z = embed(encoder_t, enc, X[batch])
        loss = nn.functional.cross_entropy(logits(head_t, hd, Z), y[batch])
        term = None if extra is None else extra(Z, y[batch])
        if term is not None:
            loss = loss + term
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        total += float(loss.detach())
        steps += 1
    return (
        {k: v.detach() for k, v in enc.items()},
        {k: v.detach() for k, v in hd.items()},
        total / max(steps, 1),
    )


class Classifier(nn.Module):
    """DP-SGD's template of the FedAvg baseline's network: ``head(encoder(x))``; its
    parameters are named ``encoder.*`` and ``head.*`` as the reply's tensors."""

    def __init__(self, encoder: nn.Module, head: nn.Module):
        super().__init__()
        self.encoder, self.head = encoder, head

    def forward(self, x: Tensor) -> Tensor:
        return self.head(self.encoder(x))


def private_adam(
    model: nn.Module,
    start: dict[str, Tensor],
    inputs: Tensor,
    y: Tensor,
    config: EncoderSettings,
    settings: DPSGDSettings,
    source: NoiseSource,
    **options: Any,
) -> dict[str, Tensor]:
    """One network (``model`` from parameters ``start``) trained by the client's DP-SGD
    (``settings``, noise from ``source``) with Adam at ``config.learning_rate`` on rows
    ``inputs`` (n, ...) and labels ``y`` (n,), every row of weight 1; ``options`` go to
    :func:`~fednovelty.federated.trust.dp_sgd.private_sgd` (``row_loss``, ``pairs``).
    Returns the trained parameters."""
    (trained,) = private_sgd(
        model,
        [start],
        inputs,
        y,
        inputs.new_ones(inputs.shape[0], 1),
        settings,
        source,
        learning_rate=config.learning_rate,
        optimizer="adam",
        **options,
    )
    return trained
