"""The learners' machinery shared by the classification algorithms (algorithm layer).

A *learner* is a torch module from a factory ``(n_features, n_classes) -> nn.Module``
(:data:`LEARNERS` by their JSON names ``linear``, ``mlp`` and ``cnn``, or a custom one);
what crosses the wire and what the server keeps is a dict of its parameter tensors, and the
module itself is only a *template* evaluated with ``torch.func.functional_call``. FedGMM's
joint model (:mod:`fednovelty.federated.joint_models.joint`), pFedEM and the clustered
algorithms (:mod:`fednovelty.federated.clustered.cam`) all train their learners with
:func:`local_sgd` and start them with :func:`initial_parameters`.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable
from typing import Any

import torch
from torch import Tensor, nn
from torch.func import functional_call

#: the local optimisers by their settings name (a fresh state every round: optimiser state
#: never crosses the wire).
OPTIMIZERS = {"sgd": torch.optim.SGD, "adam": torch.optim.Adam}

LearnerFactory = Callable[[int, int], nn.Module]


def linear_learner(n_features: int, n_classes: int) -> nn.Module:
    """Multinomial logistic regression (the default learner)."""
    return nn.Linear(n_features, n_classes)


def mlp_learner(n_features: int, n_classes: int, hidden: int = 64) -> nn.Module:
    """A small two-layer perceptron."""
    return nn.Sequential(nn.Linear(n_features, hidden), nn.ReLU(), nn.Linear(hidden, n_classes))


def cnn_learner(n_features: int, n_classes: int) -> nn.Module:
    """The FedGMM paper's FEMNIST encoder for square one-channel images flattened to
    ``n_features = side * side`` (side >= 6): two 3x3 convolutions (32 and 64 channels,
    ReLU), 2x2 max pooling, a 128-unit dense layer (ReLU) and the class layer. The paper's
    dropout is left out: the learners' local training draws no randomness but its batches'.

    Raises:
        ValueError: ``n_features`` is not the square of a side of at least 6.
    """
    side = math.isqrt(max(int(n_features), 0))
    if side * side != n_features or side < 6:
        raise ValueError(
            f"learner='cnn' needs square images flattened to side * side features with side "
            f">= 6 (784 for 28 x 28); got n_features={n_features}. Use 'linear' or 'mlp' for "
            "other rows."
        )
    pooled = (side - 4) // 2
    return nn.Sequential(
        nn.Unflatten(1, (1, side, side)),
        nn.Conv2d(1, 32, 3),
        nn.ReLU(),
        nn.Conv2d(32, 64, 3),
        nn.ReLU(),
        nn.MaxPool2d(2),
        nn.Flatten(),
        nn.Linear(64 * pooled * pooled, 128),
        nn.ReLU(),
        nn.Linear(128, n_classes),
    )


#: learner factories by their JSON name.
LEARNERS: dict[str, LearnerFactory] = {
    "linear": linear_learner,
    "mlp": mlp_learner,
    "cnn": cnn_learner,
}


def as_learner(value: Any) -> LearnerFactory:
    """A learner factory from a callable or its JSON name, or a ``ValueError`` naming
    ``'learner'``."""
    if isinstance(value, str):
        if value not in LEARNERS:
            raise ValueError(
                f"'learner' must be one of {sorted(LEARNERS)} (a custom factory is code, which "
                f"a JSON setting cannot carry); got {value!r}."
            )
        return LEARNERS[value]
    if not callable(value):
        raise ValueError(
            f"'learner' must be a factory (n_features, n_classes) -> nn.Module or one of "
            f"{sorted(LEARNERS)}; got {value!r}."
        )
    return value


def learner_template(
    factory: Callable[[int, int], nn.Module],
    n_features: int,
    n_classes: int,
    device: torch.device,
    dtype: torch.dtype,
) -> nn.Module:
    """The module ``factory(n_features, n_classes)`` in ``dtype`` on ``device``."""
    return factory(n_features, n_classes).to(device=device, dtype=dtype)


def parameters_of(module: nn.Module) -> dict[str, Tensor]:
    """A detached copy of ``module``'s parameters by name."""
    return {k: v.detach().clone() for k, v in module.named_parameters()}


def initial_parameters(
    make: Callable[[], nn.Module], count: int, random_state: int
) -> list[dict[str, Tensor]]:
    """``count`` parameter dicts of fresh modules ``make()``, drawn one after the other from
    torch's global generator seeded with ``random_state`` (restored afterwards): distinct
    random initialisations, the same on every machine."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(random_state)
        return [parameters_of(make()) for _ in range(count)]


def logits(module: nn.Module, params: dict[str, Tensor], X: Tensor) -> Tensor:
    """``module``'s output with parameters ``params`` on rows ``X``, (n_samples, n_classes)."""
    return functional_call(module, params, (X,))


def local_sgd(
    template: nn.Module,
    start: dict[str, Tensor],
    X: Tensor,
    y: Tensor,
    weight: Tensor | None,
    generator: torch.Generator,
    *,
    epochs: int = 1,
    steps: int | None = None,
    learning_rate: float,
    batch_size: int,
    optimizer: str = "sgd",
    momentum: float = 0.0,
    mu_prox: float = 0.0,
    offset: Tensor | None = None,
) -> dict[str, Tensor]:
    """Mini-batch training of the learner from ``start`` on ``mean_i w_i CE(y_i, z_i)``,
    where ``z_i`` are the learner's logits plus ``offset_i``.

    Each epoch visits the rows once in the order of ``torch.randperm(n, generator)``, in
    batches of ``batch_size``.

    Args:
        template: the learner's module; start: its parameters, not modified.
        X: rows (n_samples, n_features); y: labels (n_samples,).
        weight: per-row weights (n_samples,); ``None``: every row 1.
        generator: the batches' randomness.
        epochs: passes over the rows (used when ``steps`` is None).
        steps: exactly this many mini-batch steps, the rows reshuffled whenever a pass
            ends (``None``: ``epochs`` passes).
        learning_rate, batch_size: the steps'.
        optimizer: ``"sgd"`` or ``"adam"`` (:data:`OPTIMIZERS`).
        momentum: SGD's heavy-ball momentum (0: plain SGD; not used by Adam).
        mu_prox: proximal coefficient: ``mu / 2 ||theta - start||^2`` is added to the loss
            (FedProx; FeSEM's pull towards the cluster centre).
        offset: logits (n_samples, n_classes) added to the learner's, held fixed (the
            other half of an additive model, e.g. Fed-CAM's global or cluster model).

    Returns:
        The trained parameters (detached).
    """
    params = {k: v.detach().clone().requires_grad_(True) for k, v in start.items()}
    options = {"lr": learning_rate}
    if optimizer == "sgd" and momentum > 0:
        options["momentum"] = momentum
    step = OPTIMIZERS[optimizer](params.values(), **options)
    n = X.shape[0]
    if n == 0 or (steps is not None and steps <= 0):
        return {k: v.detach() for k, v in params.items()}
    done = 0
    for _ in range(epochs) if steps is None else itertools.count():
        order = torch.randperm(n, generator=generator).to(X.device)
        for begin in range(0, n, batch_size):
            batch = order[begin : begin + batch_size]
            out = functional_call(template, params, (X[batch],))
            if offset is not None:
                out = out + offset[batch]
            losses = nn.functional.cross_entropy(out, y[batch], reduction="none")
            loss = (losses if weight is None else weight[batch] * losses).mean()
            if mu_prox > 0:
                loss = loss + 0.5 * mu_prox * sum(
                    (params[k] - start[k]).square().sum() for k in params
                )
            step.zero_grad()
            loss.backward()
            step.step()
            done += 1
            if steps is not None and done >= steps:
                return {k: v.detach() for k, v in params.items()}
    return {k: v.detach() for k, v in params.items()}
