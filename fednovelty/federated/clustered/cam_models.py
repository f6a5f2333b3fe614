"""The models of the Fed-CAM paper's methods: their layout and pure functions of them.

Every model of a run (global, cluster, ensemble member) is a parameter dict evaluated with
one template module (:func:`model_template`); :class:`ModelLayout` names its parameters,
FeSEM's coordinates (the ``nn.Linear`` layers) and the flat form the server's k-means works
on. Predictions are pure functions of a final
:class:`~fednovelty.federated.clustered.cam_settings.ClusteredState`
(:func:`cluster_log_proba`, :func:`ensemble_proba`) on rows as the models saw them
(:func:`model_rows`).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor, nn

from fednovelty.federated.clustered.cam_settings import ClusteredConfig, ClusteredState
from fednovelty.federated.core.learners import learner_template, logits
from fednovelty.federated.init.units import box_units
from fednovelty.federated.trust.dp_mechanism import clip_rows

__all__ = [
    "ModelLayout",
    "box_rows",
    "cluster_log_proba",
    "ensemble_proba",
    "linear_names",
    "linear_vector",
    "mean_losses",
    "model_rows",
    "model_template",
    "named",
    "nearest_cluster",
    "unnamed",
]


def model_template(config: ClusteredConfig) -> nn.Module:
    """The module every model of a run is evaluated with (its own initial weights are never
    used, and drawing them leaves torch's global generator as it was)."""
    with torch.random.fork_rng(devices=[]):
        return learner_template(
            config.learner_factory, config.n_features, config.n_classes, config.device, config.dtype
        )


def linear_names(template: nn.Module) -> list[str]:
    """Names of the parameters of ``template``'s ``nn.Linear`` layers (all parameters when
    it has none): the coordinates of FeSEM's distance."""
    names = [
        f"{prefix}.{name}" if prefix else name
        for prefix, module in template.named_modules()
        if isinstance(module, nn.Linear)
        for name, _ in module.named_parameters(recurse=False)
    ]
    return names or [name for name, _ in template.named_parameters()]


def linear_vector(params: dict[str, Tensor], names: Sequence[str]) -> Tensor:
    """The parameters ``names`` of one model flattened into one vector."""
    return torch.cat([params[name].reshape(-1) for name in names])


class ModelLayout:
    """How a run's models are laid out (from its config).

    Attributes:
        template: the module the models are evaluated with (:func:`model_template`).
        names: the parameter names, in the template's order.
        linear_names: FeSEM's coordinates (:func:`linear_names`).
        linear_columns: (P_linear,) int64, the columns of ``linear_names`` in a model
            flattened in ``names`` order (:func:`linear_vector`).
    """

    def __init__(self, config: ClusteredConfig) -> None:
        self.template = model_template(config)
        self.names = [name for name, _ in self.template.named_parameters()]
        self.linear_names = linear_names(self.template)
        self._shapes = {n: p.shape for n, p in self.template.named_parameters()}
        offsets, begin = {}, 0
        for name, shape in self._shapes.items():
            offsets[name] = (begin, begin + shape.numel())
            begin += shape.numel()
        self.linear_columns = torch.cat(
            [torch.arange(*offsets[name]) for name in self.linear_names]
        )
        self._offsets = offsets

    def unflatten(self, vector: Tensor) -> dict[str, Tensor]:
        """A model flattened in ``names`` order (P,) as its parameter dict."""
        return {
            name: vector[begin:end].reshape(self._shapes[name]).clone()
            for name, (begin, end) in self._offsets.items()
        }


def nearest_cluster(vectors: Tensor, centres: Tensor) -> Tensor:
    """Index of the nearest centre of each vector, (n_vectors,) from (n_vectors, P) and
    (K, P); ties go to the lowest index. The squared distances are taken centre by centre as
    sums of squared differences, so a client's own computation and the server's agree."""
    distances = torch.stack([(vectors - c).square().sum(1) for c in centres], dim=1)
    return distances.argmin(1)


def mean_losses(
    template: nn.Module,
    models: Sequence[dict[str, Tensor]],
    X: Tensor,
    y: Tensor,
    offset: Tensor | None = None,
) -> Tensor:
    """Mean cross-entropy of each model on ``(X, y)`` (logits plus ``offset``), (len(models),)."""
    with torch.no_grad():
        out = []
        for params in models:
            z = logits(template, params, X)
            z = z if offset is None else z + offset
            out.append(nn.functional.cross_entropy(z, y))
        return torch.stack(out)


def cluster_log_proba(
    template: nn.Module, state: ClusteredState, X: Tensor, cluster: int, additive: bool
) -> Tensor:
    """``log p(y | x)`` (n, n_classes) of cluster ``cluster``'s model (plus the global model's
    logits when ``additive``: Eq. 1)."""
    with torch.no_grad():
        z = logits(template, state.cluster_models[cluster], X)
        if additive:
            z = z + logits(template, state.global_model, X)
        return nn.functional.log_softmax(z, dim=1)


def ensemble_proba(template: nn.Module, state: ClusteredState, X: Tensor) -> Tensor:
    """FedAvg+'s soft vote: the members' mean class probabilities, (n, n_classes)."""
    with torch.no_grad():
        probs = [nn.functional.softmax(logits(template, p, X), dim=1) for p in state.cluster_models]
        return torch.stack(probs).mean(0)


def named(prefix: str, params: dict[str, Tensor]) -> dict[str, Tensor]:
    """A model's parameters as a message names them: ``prefix`` + name."""
    return {f"{prefix}{name}": value for name, value in params.items()}


def unnamed(prefix: str, tensors: dict[str, Tensor], names: Sequence[str]) -> dict[str, Tensor]:
    """The model ``prefix``.* of a message's ``tensors``, by its parameter ``names``."""
    return {name: tensors[f"{prefix}{name}"] for name in names}


def box_rows(X: Tensor, bounds: tuple) -> Tensor:
    """Rows (n, d) in the units of the public box ``bounds``: ``[-1, 1]`` per feature."""
    offset, scale = box_units(bounds, X)
    return (X - offset) / scale


def model_rows(X: Tensor, bounds: tuple | None = None, clip: float | None = None) -> Tensor:
    """Rows (n, d) as the models of a run see them: in the units of its public box
    ``bounds`` (``[-1, 1]`` per feature) and clipped to the L2 radius ``clip`` around the
    origin (a private run's ``dp_clip``), as its client halves saw theirs (``X`` itself
    with neither)."""
    if bounds is not None:
        X = box_rows(X, bounds)
    if clip is not None:
        X = clip_rows(X, X.new_zeros(X.shape[1]), float(clip))
    return X
