"""The server gate of secure-sum rounds on the Flower engine: what the server checks of each
masked reply (its form: the encoded tensors' names, order and shapes for the round's
broadcast, ring values below ``2**bits``), since it cannot read one node's values
(:mod:`fednovelty.runtime.flower.secure` runs the rounds).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from fednovelty.federated.core.base import Message as FedMessage
from fednovelty.federated.core.declarations import InvalidReplyError
from fednovelty.federated.trust.reply_form import check_reply, is_skipped
from fednovelty.federated.trust.validation import ReplyValidator
from fednovelty.runtime.flower.codec import ring_width, unpack_ring
from fednovelty.runtime.secure_rounds import additive_release, decode, encode

__all__ = ["SecureValidator", "check_masked"]


def check_masked(
    reply: FedMessage,
    broadcast: FedMessage,
    n_features: int,
    release: str,
    bits: int,
    *,
    spec: Any = None,
    covariance_type: str | None = None,
) -> None:
    """Raise unless ``reply`` is a masked reply to ``broadcast``: one ``uint8`` tensor of
    shape (*encoded shape, ceil(bits / 8)) per tensor of the encoded form of a well-formed
    ``release`` reply (its names, order and shapes, :func:`~fednovelty.federated.trust.validation.
    check_reply` of the form), every ring value below ``2**bits``.

    Raises:
        InvalidReplyError: naming what is wrong.
    """
    if reply.kind != broadcast.kind:
        raise InvalidReplyError(f"reply of kind {reply.kind!r} to a {broadcast.kind!r} round.")
    width = ring_width(bits)
    zeros = {}
    for name, tensor in reply.tensors.items():
        if tensor.dtype != torch.uint8 or tensor.ndim < 1 or tensor.shape[-1] != width:
            raise InvalidReplyError(
                f"masked tensor {name!r} must be uint8 of shape (..., {width}); got "
                f"{tuple(tensor.shape)} {tensor.dtype}."
            )
        try:
            unpack_ring(tensor.numpy().reshape(-1, width), bits)
        except ValueError as error:
            raise InvalidReplyError(f"masked tensor {name!r}: {error}") from None
        zeros[name] = torch.zeros(tuple(tensor.shape[:-1]), dtype=torch.float64)
    try:
        plain = decode(release, zeros, broadcast, covariance_type)
        form = encode(release, plain, broadcast, covariance_type)
    except (KeyError, IndexError, RuntimeError, ValueError) as error:
        raise InvalidReplyError(
            f"the masked tensors {list(zeros)} are not the encoded form of a {release!r} "
            f"reply: {error}"
        ) from None
    layout = [(name, tuple(tensor.shape)) for name, tensor in zeros.items()]
    expected = [(name, tuple(tensor.shape)) for name, tensor in form.items()]
    if layout != expected:
        raise InvalidReplyError(
            f"masked tensors {layout}; the encoded form of a {release!r} reply is {expected}."
        )
    check_reply(FedMessage(broadcast.kind, plain), broadcast, n_features, spec, noisy=True)


@dataclass
class SecureValidator(ReplyValidator):
    """The server gate of a secure run: a non-skipped reply to a round with an additive
    private form is a masked reply, checked by :func:`check_masked` (and records nothing:
    the server cannot read one node's row count); anything else as
    :class:`~fednovelty.federated.trust.validation.ReplyValidator`.

    Attributes:
        algorithm: the run's algorithm (its reply declarations and covariance type).
        bits: the ring's width.
    """

    algorithm: Any = None
    bits: int = 48

    def _release(self, kind: str) -> str | None:
        try:
            return additive_release(self.algorithm, kind)
        except ValueError:
            return None

    def check(self, client_id: int, reply: FedMessage, broadcast: FedMessage) -> None:
        release = self._release(broadcast.kind)
        if release is None or is_skipped(reply):
            super().check(client_id, reply, broadcast)
            return
        check_masked(
            reply,
            broadcast,
            self.n_features,
            release,
            self.bits,
            spec=self.spec(broadcast.kind),
            covariance_type=getattr(self.algorithm.config, "covariance_type", None),
        )

    def _record(self, client_id: int, reply: FedMessage, broadcast=None) -> None:
        if self._release(reply.kind) is None or is_skipped(reply):
            super()._record(client_id, reply, broadcast)
