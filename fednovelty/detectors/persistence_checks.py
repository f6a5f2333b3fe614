"""Meaning checks for loaded model files, beside those of :mod:`.persistence`.

A file's checksum stops damage and edits by anyone who does not recompute it; a forger
recomputes it. What stands between a forged file and a loaded model is each kind's
``_set_state``, which checks that the values mean a model that can have been fitted. These
small pure functions are the checks it shares with the helpers of
:mod:`~fednovelty.detectors.persistence` (``check_positive``, ``check_in_box``,
``check_reachable_scores``):

- :func:`check_at_least`: a value is at least the floor the fit guarantees (e.g. a noise
  variance is at least ``reg_covar`` in the units the fit ran in);
- :func:`check_scorable`: squaring ``(x - mean)`` times the model's largest inverse scale
  does not overflow at the means (else every score is ``inf`` or ``NaN``);
- :func:`noise_floor`: the lowest noise variance a mixture of factor analysers' fit can
  leave, from its own covariances (the fit's z-scores are not stored);
- :func:`network_bound` and :func:`check_network`: a feed-forward network's outputs stay
  finite, and so do their squares, for every row whose entries are at most
  ``finfo.max ** 0.25`` in magnitude.

Each raises ``ModelFormatError`` naming the tensor and what was expected.
"""

from __future__ import annotations

import math
from collections.abc import Iterable

import torch

from fednovelty.exceptions import ModelFormatError


def check_at_least(tensor: torch.Tensor, floor: torch.Tensor | float, name: str, why: str) -> None:
    """Every entry of ``tensor`` is ``>= floor`` (a number or a tensor broadcast against
    ``tensor``) to a relative ``1e-9``; ``why`` says where the floor comes from.

    Raises:
        ModelFormatError: naming ``name``, the count below and the lowest value.
    """
    floor = torch.as_tensor(floor, dtype=tensor.dtype, device=tensor.device)
    below = tensor < floor * (1 - 1e-9)
    if bool(below.any()):
        lowest = float(tensor[below].min())
        raise ModelFormatError(
            f"{name} holds {int(below.sum())} value(s) below the floor (as low as "
            f"{lowest:.3g}); {why}."
        )


def check_scorable(means: torch.Tensor, inverse_scale: float, name: str) -> None:
    """A model whose log-density squares ``(x - mean) * inverse_scale`` (``means``
    (n_components, n_features); ``inverse_scale`` the largest precision Cholesky entry, or
    ``1 / sqrt`` of the smallest variance) does not overflow ``means``' dtype at the means:
    ``inverse_scale * max(1, max |means|) <= sqrt(finfo.max)``.

    Raises:
        ModelFormatError: naming ``name`` (the tensors involved) and the product.
    """
    size = inverse_scale * max(1.0, float(means.abs().max()) if means.numel() else 0.0)
    if not size <= math.sqrt(torch.finfo(means.dtype).max):
        raise ModelFormatError(
            f"{name} are too large to score in {means.dtype} (inverse scale times mean: "
            f"{size:.3g}; at most {math.sqrt(torch.finfo(means.dtype).max):.3g})."
        )


def noise_floor(
    weights: torch.Tensor, variances: torch.Tensor, reg_covar: float, slack: float = 100.0
) -> torch.Tensor:
    """The lowest noise variance ``psi`` (n_components, n_features) a mixture of factor
    analysers' fit leaves, given its weights (n_components,) and the diagonal of its
    covariances ``W W^T + diag(psi)`` (n_components, n_features).

    The fit adds ``reg_covar`` to every noise variance in its own units (z-scores with
    ``standardize``, where every feature's pooled variance is 1, else the rows' units).
    In z-scores a component's variance of a feature is at most about ``n_features /
    weight`` (its rows' scatter is part of the pooled one), and both the noise variance and
    the variance scale alike back to the rows' units, so ``psi >= reg_covar * weight *
    variance / (slack * n_features)`` there; in the rows' units ``psi >= reg_covar``. The
    floor is the lower of the two, so it holds either way; ``slack`` covers EM stopped
    before its fixed point and the prior's pull.
    """
    d = variances.shape[-1]
    relative = reg_covar * weights[:, None] * variances / (slack * d)
    return torch.clamp(relative, max=reg_covar)


def network_bound(
    layers: Iterable[tuple[torch.Tensor, torch.Tensor | None]], bound: float
) -> float:
    """The largest ``|output|`` a feed-forward network gives rows with ``|x| <= bound``
    entry-wise: ``bound <- ||W||_inf * bound + max |b|`` per layer, ``||W||_inf`` the
    largest absolute row sum of the weight reshaped to (out_features, -1).

    ``layers``: (weight, bias or None) in the order the rows pass them; linear and
    convolution layers separated by activations that are 1-Lipschitz and keep 0 (ReLU),
    max pooling, flattening. ``inf`` when it overflows.
    """
    for weight, bias in layers:
        norm = float(weight.double().reshape(weight.shape[0], -1).abs().sum(1).max())
        shift = 0.0 if bias is None or bias.numel() == 0 else float(bias.double().abs().max())
        bound = norm * bound + shift
    return bound


def layers_of(params: dict[str, torch.Tensor]) -> list[tuple[torch.Tensor, torch.Tensor | None]]:
    """The (weight, bias) pairs of a network's parameters ``params`` (module name ->
    tensor, in the module's order: ``"0.weight"``, ``"0.bias"``, ...); parameters that are
    not a layer's weight (>= 2 dimensions) or bias are left out."""
    layers: dict[str, list] = {}
    for name, tensor in params.items():
        prefix, _, kind = name.rpartition(".")
        if kind == "weight" and tensor.ndim >= 2:
            layers.setdefault(prefix, [None, None])[0] = tensor
        elif kind == "bias":
            layers.setdefault(prefix, [None, None])[1] = tensor
    return [(weight, bias) for weight, bias in layers.values() if weight is not None]


def check_network(params: dict[str, torch.Tensor], name: str) -> None:
    """A network's parameters ``params`` (module name -> tensor, in the module's order)
    keep its outputs and their squares finite: rows with entries up to ``finfo.max **
    0.25`` (1.2e77 in float64, 4.3e9 in float32) give outputs of at most ``sqrt(finfo.max)``
    (:func:`network_bound`); a trained network's layer norms are many orders of magnitude
    below that.

    Raises:
        ModelFormatError: naming ``name`` and the bound.
    """
    layers = layers_of(params)
    if not layers:
        return
    dtype = layers[0][0].dtype
    largest = torch.finfo(dtype).max
    bound = network_bound(layers, largest**0.25)
    if not bound <= math.sqrt(largest):
        raise ModelFormatError(
            f"the weights of {name} are too large: rows of entries up to {largest**0.25:.3g} "
            f"could give outputs up to {bound:.3g}, beyond {math.sqrt(largest):.3g} (their "
            f"squares would overflow {dtype})."
        )
