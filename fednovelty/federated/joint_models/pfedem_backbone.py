"""pFedEM's Gaussians on backbone features (``gaussian_features="backbone"``): the layers
of a sub-model before its class layer, ``z = f(x)``, and what that setting asks of the rest.

The pFedEM paper's Eq. 8-11 model ``z = f(x)``, the features of "the backbone network for
feature extraction" being trained. Here ``f`` is sub-model 0's layers up to its class layer.
With ``PFedEMConfig.gaussian_features="backbone"``:

- every EM round a client maps the rows its sub-models see (``Z``) through the broadcast
  sub-model 0's backbone before the E-step (``PFedEMStep.gaussian_rows``, the joint model's
  hook); the Gaussians' statistics and the paper's per-client means and variances are of
  these features;
- federated EM's initialisation (k-means by default), which runs before any broadcast
  sub-model, sees ``Z`` through the initial sub-model 0's backbone (``PFedEM.split_data``):
  ``learners_init``, or ``learner_factory`` under ``random_state``, which every client
  rebuilds as the server does;
- every broadcast declares the backbone's width as the rows' (``expect["n_features"]``),
  the ``d`` the server checks the replies' shapes against;
- a fitted model scores rows through the final sub-model 0's backbone
  (``PFedEMDetector``).

A learner has a backbone when it is an ``nn.Sequential`` whose last module is its class
layer (``nn.Linear``) after at least one other module: ``"mlp"`` (64 hidden units) and
``"cnn"`` (128); ``"linear"`` has none and is refused, as are differential privacy and a
public box (features have no public box), a PCA step and an unknown ``n_learner_features``
(:func:`check_backbone_settings`).
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor, nn
from torch.func import functional_call

__all__ = [
    "GAUSSIAN_FEATURES",
    "BackboneMap",
    "backbone_features",
    "backbone_of",
    "backbone_width",
    "check_backbone_settings",
]

#: What pFedEM's Gaussians model (``PFedEMConfig.gaussian_features``): the rows ``X`` the
#: chain hands them (``"input"``) or sub-model 0's backbone features of ``Z`` (``"backbone"``).
GAUSSIAN_FEATURES: tuple[str, ...] = ("input", "backbone")


def backbone_of(template: nn.Module) -> nn.Sequential:
    """The layers of ``template`` before its class layer (parameter names kept).

    Raises:
        ValueError: ``template`` is not an ``nn.Sequential`` of at least two modules ending
            in an ``nn.Linear`` (e.g. ``learner="linear"``, which has no hidden layer).
    """
    if (
        not isinstance(template, nn.Sequential)
        or len(template) < 2
        or not isinstance(template[-1], nn.Linear)
    ):
        raise ValueError(
            "gaussian_features='backbone' models the features of the sub-models' layers "
            f"before their class layer, and this learner ({type(template).__name__}) has none "
            "(learner='linear' is the class layer alone): pick learner='mlp' or 'cnn' (or a "
            "factory returning an nn.Sequential that ends in its nn.Linear class layer), or "
            "gaussian_features='input'."
        )
    return template[:-1]


def backbone_width(template: nn.Module) -> int:
    """Width of the backbone's features: the class layer's input (64 for ``"mlp"``, 128 for
    ``"cnn"``); ``ValueError`` as :func:`backbone_of`."""
    backbone_of(template)
    return int(template[-1].in_features)


def backbone_features(template: nn.Module, params: dict[str, Tensor], Z: Tensor) -> Tensor:
    """``f(z)``: rows ``Z`` (n, n_learner_features) through ``template``'s backbone with the
    sub-model's parameters ``params`` (the class layer's are ignored), (n, width), no
    gradient."""
    backbone = backbone_of(template)
    own = {name for name, _ in backbone.named_parameters()}
    weights = {name: value.to(Z) for name, value in params.items() if name in own}
    with torch.no_grad():
        return functional_call(backbone, weights, (Z,))


class BackboneMap:
    """A fitted model's map from rows to the Gaussians' features (the final sub-model 0's
    backbone), with the ``transform`` of a projection (``Components.project``)."""

    def __init__(self, template: nn.Module, params: dict[str, Tensor]) -> None:
        self.template, self.params = template, params
        self.n_components = backbone_width(template)

    def transform(self, Z: Tensor) -> Tensor:
        """Rows (n, n_features) -> their features (n, width)."""
        return backbone_features(self.template, self.params, Z)


def check_backbone_settings(config: Any) -> None:
    """What ``gaussian_features="backbone"`` refuses in ``config`` (a ``PFedEMConfig``), each
    with what to do: differential privacy and a public box ``bounds`` (backbone features
    have no public box: they move as the backbone trains), a PCA step (the Gaussians model
    the features themselves), an unknown learner width (``n_learner_features``: the
    sub-models' rows ``Z``), and a learner without a backbone (:func:`backbone_of`; the
    learner is built without touching torch's global generator)."""
    if config.dp_mode is not None or config.bounds is not None:
        raise ValueError(
            "gaussian_features='backbone': differential privacy clips rows into a public box "
            "(bounds), and backbone features have none (they move as the backbone trains); "
            "use gaussian_features='input' for a private fit."
        )
    if config.pca_components is not None:
        raise ValueError(
            "gaussian_features='backbone' models the backbone's features themselves; use "
            "pca_components=None."
        )
    if config.n_learner_features is None:
        raise ValueError(
            "gaussian_features='backbone' needs n_learner_features, the width of the rows Z "
            "the sub-models see (the backbone's input)."
        )
    with torch.random.fork_rng(devices=[]):
        backbone_of(config.learner_factory(config.n_learner_features, config.n_classes))
