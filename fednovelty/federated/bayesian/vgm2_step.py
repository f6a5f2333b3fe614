"""The round shared by VGM2 and its baselines: one kind (``"vgm2"``), its reply declaration
and :class:`EncoderStep`, the server and client halves every method runs.

The server broadcasts what the method shares (:meth:`EncoderStep.round_tensors`) and a round
seed, drops a reply that :meth:`EncoderStep.reply_problem` finds bad (``n_invalid`` in the
metrics), records the row-weighted loss and folds the rest (:meth:`EncoderStep.fold`). A
client answers from its personal encoder and head (:meth:`EncoderStep.start_networks`),
trains (:meth:`EncoderStep.train`) and sends the method's tensors, its row count and its
loss. Under a client's differential-privacy policy the loss is withheld and the server
averages with equal weights; a method whose step sets ``private_training`` trains what it
sends by the client's DP-SGD (:meth:`EncoderStep.train_private`), and one with
``no_private_form`` answers skipped. A method's step subclass states only what differs.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, ClassVar

import torch
from torch import Tensor

from fednovelty.federated.bayesian.vgm2_settings import ENCODER, HEAD, EncoderSettings, VGM2State
from fednovelty.federated.core.base import (
    ClientContext,
    Message,
    client_generator,
    round_seed,
    skipped_reply,
)
from fednovelty.federated.core.declarations import InvalidReplyError, ReplySpec, declare
from fednovelty.federated.core.steps import Step
from fednovelty.federated.trust.backing import client_backing
from fednovelty.federated.trust.dp_sgd import DPSGDSettings
from fednovelty.federated.trust.reply_form import Shape
from fednovelty.federated.trust.value_checks import check_counts_within, check_positive_rows

__all__ = [
    "VGM2_KIND",
    "VGM2_PRIVATE_PARTS",
    "VGM2_REPLY",
    "EncoderStep",
    "LocalUpdate",
    "vgm2_shapes",
]

VGM2_KIND = "vgm2"


def vgm2_shapes(broadcast: Message, d: int) -> dict[str, Shape]:
    """A ``vgm2`` reply by what the round broadcast: the client's markers shaped as the
    ``prior`` (VGM2), or its class prototypes and counts shaped as the broadcast's
    (prototype baseline), or its encoder and head under the broadcast's names (FedAvg);
    always the row count, and the loss unless the round is private (``scalars["private"]``:
    the loss is withheld)."""
    shapes: dict[str, Shape] = {"n_samples": ()}
    if not broadcast.scalars.get("private"):
        shapes["loss"] = ()
    t = broadcast.tensors
    if "prior" in t:
        shapes["markers"] = tuple(t["prior"].shape)
    if "prototypes" in t:
        shapes.update(
            prototypes=tuple(t["prototypes"].shape),
            class_counts=tuple(t["prototype_counts"].shape),
        )
    return shapes


def check_vgm2(reply: Message, broadcast: Message) -> None:
    """Positive marker concentration, kappa, alpha and beta; class counts within the rows."""
    if "markers" in reply.tensors and not bool(
        (reply.tensors["markers"][:, [0, 2, 3, 4]] > 0).all()
    ):
        raise InvalidReplyError("marker concentration, kappa, alpha and beta must be > 0.")
    if "class_counts" in reply.tensors:
        check_counts_within(reply, "class_counts", "class counts")


def classes_limit(config: EncoderSettings, broadcast: Message) -> int:
    """The client's own bound on classes per reply: its configuration's ``n_classes``."""
    return int(config.n_classes)


#: the private form of a ``vgm2`` reply's tensors (its release is ``"parts"``: no summed
#: statistics, one noisy release of the client's budget): what trains on the rows leaves only by
#: DP-SGD (the markers, FedAvg's encoder and head), the row count as a one-bin histogram
#: (each row adds 1). The loss has none (withheld under DP); nor have the prototype
#: baseline's prototypes and class counts (refused).
VGM2_PRIVATE_PARTS: dict[str, str] = {
    "n_samples": "histogram",
    "markers": "dp_sgd",
    "encoder.": "dp_sgd",
    "head.": "dp_sgd",
}

#: a ``vgm2`` reply (:func:`vgm2_shapes`).
VGM2_REPLY = ReplySpec(
    VGM2_KIND,
    shapes=vgm2_shapes,
    checks=(check_positive_rows, check_vgm2),
    backing={
        "n_samples": "client",
        "loss": "client",
        "markers": "model",
        "prototypes": "classes",
        "class_counts": "classes",
        "encoder.": "model",
        "head.": "model",
    },
    limit=classes_limit,
    private="parts",
    private_parts=VGM2_PRIVATE_PARTS,
)


@dataclass
class LocalUpdate:
    """What a client's local training gives: its encoder and head (what it keeps, or the
    network it sends), the method's reply tensors and the mean loss (NaN: none)."""

    encoder: dict[str, Tensor]
    head: dict[str, Tensor]
    tensors: dict[str, Tensor] = field(default_factory=dict)
    loss: float = math.nan


class EncoderStep(Step):
    """The ``vgm2`` round of every method of the family (module docstring); a method's
    subclass overrides the hooks that differ."""

    kinds = (VGM2_KIND,)
    replies = declare(VGM2_REPLY)
    labelled = True
    #: whether what the method sends trains by the client's DP-SGD under a private policy
    #: with DP-SGD settings (False: it trains as usual; nothing trained on the rows leaves).
    private_training: ClassVar[bool] = False
    #: why a private client answers skipped (``None``: it answers).
    no_private_form: ClassVar[str | None] = None
    #: whether a client keeps its trained encoder and head (its personal network).
    keeps_networks: ClassVar[bool] = True

    def __init__(self, algorithm: Any) -> None:
        """The round of ``algorithm`` (its
        :class:`~fednovelty.federated.bayesian.vgm2_algorithm.EncoderAlgorithm`: templates,
        initial weights and settings)."""
        self.algorithm = algorithm
        self.config: EncoderSettings = algorithm.config
        self.max_rounds = self.config.rounds

    # ------------------------------------------------------------------ server half
    def round_tensors(self, state: VGM2State) -> dict[str, Tensor]:
        """What the round broadcasts besides its seed (``{}``: nothing)."""
        return {}

    def configure(self, state: VGM2State) -> Message:
        scalars: dict[str, Any] = {"seed": round_seed(self.config, state)}
        if self.config.private:
            scalars["private"] = True
        return Message(VGM2_KIND, self.round_tensors(state), scalars)

    def reply_tensors(self, broadcast: Message) -> dict[str, tuple[int, ...]]:
        """The method's tensors a reply to ``broadcast`` holds, with their shapes."""
        return {}

    def tensor_problem(self, reply: Message, n: float) -> str | None:
        """Why the method's tensors of ``reply`` (from ``n`` rows) are bad (``None``: they
        are not), once their names, shapes and values are known good."""
        return None

    def reply_problem(self, reply: Message, broadcast: Message) -> str | None:
        """Why ``reply`` is not a valid answer to ``broadcast`` (``None``: it is): kind, the
        tensors of the method, shapes, finite values, a positive row count and the method's
        own test (:meth:`tensor_problem`). A private round's reply (``config.dp_mode``) has
        no loss and a noisy row count, which is not checked."""
        if reply.kind != broadcast.kind:
            return f"reply of kind {reply.kind!r} to a {broadcast.kind!r} round"
        expected: dict[str, tuple[int, ...]] = {"n_samples": ()}
        if not self.config.private:
            expected["loss"] = ()
        expected.update(self.reply_tensors(broadcast))
        if set(reply.tensors) != set(expected):
            return f"reply tensors {sorted(reply.tensors)}; expected {sorted(expected)}"
        for name, shape in expected.items():
            tensor = reply.tensors[name]
            if tuple(tensor.shape) != shape:
                return f"tensor {name!r} has shape {tuple(tensor.shape)}; expected {shape}"
            if tensor.is_floating_point() and not bool(torch.isfinite(tensor).all()):
                return f"tensor {name!r} has NaN or inf values"
        n = float(reply.tensors["n_samples"])
        if not (n > 0 or self.config.private):
            return "a reply must come from at least one row"
        return self.tensor_problem(reply, n)

    def server_step(self, state: VGM2State, replies: dict[int, Message]):
        config = self.config
        broadcast = self.configure(state)
        valid = {cid: r for cid, r in replies.items() if self.reply_problem(r, broadcast) is None}
        state.invalid.append(len(replies) - len(valid))
        if valid and config.private:  # equal weights: no row count is read
            state.losses.append(float("nan"))
            self.fold(state, valid, torch.ones(len(valid), dtype=torch.float64))
        elif valid:
            n = torch.stack([r.tensors["n_samples"].double() for r in valid.values()])
            loss = torch.stack([r.tensors["loss"].double() for r in valid.values()])
            state.losses.append(float((n * loss).sum() / n.sum()))
            self.fold(state, valid, n)
        else:
            state.losses.append(float("nan"))
        done = state.rounds + 1 >= config.rounds
        metrics = {"phase": VGM2_KIND, "loss": state.losses[-1], "n_invalid": state.invalid[-1]}
        return (None if done else VGM2_KIND), metrics

    def fold(self, state: VGM2State, replies: dict[int, Message], n: Tensor) -> None:
        """Fold the valid replies (weights ``n``: rows, or ones under DP) into the state
        (nothing: the server keeps nothing)."""

    # ------------------------------------------------------------------ client half
    def start_networks(
        self, X: Tensor, message: Message, kept: dict[str, Tensor]
    ) -> tuple[dict[str, Tensor], dict[str, Tensor]]:
        """The encoder and head a client's training starts from, on ``X``'s device and
        dtype: its personal ones (``kept``), or the initial weights (the algorithm's
        ``personal_networks``)."""
        encoder, head = self.algorithm.personal_networks(kept)
        return {k: v.to(X) for k, v in encoder.items()}, {k: v.to(X) for k, v in head.items()}

    def train(
        self,
        X: Tensor,
        y: Tensor,
        message: Message,
        kept: dict[str, Tensor],
        networks: tuple[dict[str, Tensor], dict[str, Tensor]],
        generator: torch.Generator,
    ) -> LocalUpdate:
        """The client's local training from ``networks`` (encoder, head) on rows ``X`` and
        labels ``y``; ``kept`` is what the client keeps (the method may add to it)."""
        raise NotImplementedError

    def train_private(
        self,
        X: Tensor,
        y: Tensor,
        message: Message,
        kept: dict[str, Tensor],
        networks: tuple[dict[str, Tensor], dict[str, Tensor]],
        settings: DPSGDSettings,
        generator: torch.Generator,
    ) -> LocalUpdate:
        """:meth:`train` by DP-SGD (``settings``, the client's own, noise from
        ``generator``); a step with ``private_training`` implements it."""
        raise NotImplementedError(f"{type(self).__name__} has no DP-SGD training.")

    def backing(self, tensors: dict[str, Tensor], n_rows: int) -> dict[str, Any]:
        """The rows behind each reply tensor: models trained on all the rows."""
        return client_backing(tensors, n_rows)

    def client_step(self, data: Any, message: Message, context: ClientContext) -> Message:
        X, y = data
        terms = context.terms
        if not terms.releases(X.shape[0]):
            return skipped_reply(VGM2_KIND, terms.below_floor)
        private = terms.private is not None
        if private and self.no_private_form is not None:
            return skipped_reply(VGM2_KIND, self.no_private_form)
        sgd = None
        if private and self.private_training and terms.private.dp_sgd is not None:
            # what leaves the client trains by its own DP-SGD, from its own generator
            sgd = (terms.private.dp_sgd, terms.private.noise())
        generator = client_generator(int(message.scalars["seed"]), context.client_id)
        kept = context.state
        networks = self.start_networks(X, message, kept)
        if sgd is None:
            update = self.train(X, y, message, kept, networks, generator)
        else:
            update = self.train_private(X, y, message, kept, networks, *sgd)
        if self.keeps_networks:
            kept.update({f"{ENCODER}{k}": v.clone() for k, v in update.encoder.items()})
            kept.update({f"{HEAD}{k}": v.clone() for k, v in update.head.items()})
        tensors = dict(update.tensors)
        tensors["n_samples"] = torch.tensor(float(X.shape[0]), dtype=X.dtype)
        scalars: dict[str, Any] = {}
        if not private:  # under DP the loss is withheld
            tensors["loss"] = torch.as_tensor(update.loss, dtype=X.dtype).reshape(())
        if sgd is not None:
            scalars["dp_sgd_steps"] = sgd[0].steps
        return Message(VGM2_KIND, tensors, scalars, backing=self.backing(tensors, X.shape[0]))
