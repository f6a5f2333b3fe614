"""The form of a client reply: its kind, its tensors and their shapes, values in range.

What a reply of a kind must carry is declared by the step that defines the message, as a
:class:`~fednovelty.federated.core.declarations.ReplySpec` (:func:`resolve_spec`: the run's
algorithm's, or the package's own declaration of the kind; a kind nothing declares is
refused). :func:`check_reply` holds one reply to it: the broadcast's kind; every declared
tensor present with its shape (``spec.shapes(broadcast, d)``, :func:`expected_shapes`: a
string dimension is free but equal wherever it appears in one reply), a tensor named as a
broadcast tensor with the broadcast's shape, no other tensor (:func:`check_form`); floating
tensors finite; counts, row counts, weights and variances (:data:`NON_NEGATIVE`)
non-negative, row counts at most :data:`MAX_ROWS`; then the declared value checks
(``spec.checks``, :mod:`~fednovelty.federated.trust.value_checks`). A noisy reply is checked
for form and finiteness only; a skipped reply (``scalars["skipped"]``) carries no statistics
and passes as it is.

What the server expects beyond the broadcast's tensors (a covariance type, the most
centroids, the rows' width after a projection) is written into the broadcast's ``expect``
(:class:`~fednovelty.federated.core.base.Message`), which stays on the server
(:func:`expectation`, :func:`round_width`).
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from fednovelty.federated.core.base import Message, Scalar
from fednovelty.federated.core.declarations import (
    InvalidReplyError,
    ReplySpec,
    UndeclaredReplyError,
    declared_spec,
)

#: reply tensors that must be >= 0 wherever they appear.
NON_NEGATIVE: tuple[str, ...] = (
    "counts",
    "n_samples",
    "joint_counts",
    "weights",
    "n",
    "m2",
    "far_counts",
    "hard_counts",
    "client_vars",
    "loss",
    "class_counts",
)


#: reply tensors that are a client's row count.
ROW_COUNTS: tuple[str, ...] = ("n_samples", "n")


#: the most rows a reply may claim: 2**53, the largest count float64 holds exactly (a claim
#: above it cannot be a count of rows, and its products overflow the server's sums).
MAX_ROWS = float(2**53)


Dim = int | str  # a fixed size, or a symbol every use of which in one reply must agree on


Shape = tuple[Dim, ...]


#: how a validator finds the declaration of a kind (``algorithm.reply_spec``).
SpecLookup = Callable[[str], ReplySpec]


def covariance_shape(covariance_type: str, k: Dim, d: int) -> Shape:
    """Shape of per-component second moments / precision factors by covariance type."""
    shapes = {"full": (k, d, d), "tied": (d, d), "diag": (k, d), "spherical": (k,)}
    if covariance_type not in shapes:
        raise InvalidReplyError(f"unknown covariance_type {covariance_type!r}.")
    return shapes[covariance_type]


def learner_count(broadcast: Message) -> int:
    """How many learners (``learner.{m}.*`` tensors) a broadcast carries."""
    return len({name.split(".")[1] for name in broadcast.tensors if name.startswith("learner.")})


def expectation(broadcast: Message, name: str) -> Scalar:
    """``broadcast.expect[name]``, or a ``ValueError`` (a server-side error: the algorithm
    did not say what replies to its round may hold)."""
    if name not in broadcast.expect:
        raise ValueError(
            f"a {broadcast.kind!r} broadcast must state expect[{name!r}] for its replies to be "
            "checked; the algorithm's configure sets it."
        )
    return broadcast.expect[name]


def round_width(broadcast: Message, n_features: int) -> int:
    """Width ``d`` of the rows a round works on: the federation's ``n_features``, or the
    broadcast's ``expect["n_features"]`` (e.g. a PCA projection's components)."""
    return int(broadcast.expect.get("n_features", n_features))


def is_skipped(reply: Message) -> bool:
    """Whether ``reply`` says the client did not take part (below its floor, refused)."""
    return bool(reply.scalars.get("skipped", False))


def resolve_spec(kind: str, specs: SpecLookup | None = None) -> ReplySpec:
    """The declaration of replies of ``kind``: ``specs(kind)`` (the run's algorithm), or
    the package's own (:func:`~fednovelty.federated.core.declarations.declared_spec`).

    Raises:
        InvalidReplyError: nothing declares ``kind`` (the reply is refused).
    """
    try:
        return declared_spec(kind) if specs is None else specs(kind)
    except UndeclaredReplyError as error:
        raise InvalidReplyError(f"refused: {error}") from None


def stats_shapes(
    broadcast: Message, d: int, centers: str = "means", k: int | str | None = None
) -> dict[str, Shape]:
    """A statistics reply's tensors: ``counts`` (K,), ``sums`` (K, d), ``second`` by the
    expected covariance type, ``log_likelihood`` and ``n_samples`` (); K is ``k`` where given
    (a string: free, one value in the reply), else the number of rows of the broadcast's
    ``centers`` tensor."""
    k = int(broadcast.tensors[centers].shape[0]) if k is None else k
    return {
        "counts": (k,),
        "sums": (k, d),
        "second": covariance_shape(str(expectation(broadcast, "covariance_type")), k, d),
        "log_likelihood": (),
        "n_samples": (),
    }


def expected_shapes(
    broadcast: Message, reply: Message, n_features: int, spec: ReplySpec | None = None
) -> dict[str, Shape]:
    """Tensors a reply to ``broadcast`` must carry and their shapes: the declaration's
    ``spec.shapes(broadcast, d)`` (``spec`` default: the package's declaration of the
    broadcast's kind), ``{}`` for a skipped reply.

    Args:
        broadcast: the round's message to the clients.
        reply: the client's reply (a skipped reply carries at most ``n_samples``).
        n_features: the width of the federation's rows (the round's ``d`` unless the
            broadcast's ``expect`` names another, :func:`round_width`).
        spec: the declaration of the broadcast's kind.

    Returns:
        name -> shape; a string dimension (``"k"``) is free but equal wherever it appears.
    """
    if is_skipped(reply):
        return {}
    spec = resolve_spec(broadcast.kind) if spec is None else spec
    return dict(spec.shapes(broadcast, round_width(broadcast, n_features)))


def _match_shape(name: str, actual: tuple[int, ...], shape: Shape, bound: dict[str, int]) -> None:
    ok = len(actual) == len(shape)
    for size, want in zip(actual, shape, strict=False):
        if isinstance(want, str):
            ok = ok and bound.setdefault(want, size) == size
        else:
            ok = ok and size == want
    if not ok:
        pretty = tuple(bound.get(s, s) if isinstance(s, str) else s for s in shape)
        raise InvalidReplyError(f"tensor {name!r} has shape {actual}; expected {pretty}.")


def check_reply(
    reply: Message,
    broadcast: Message,
    n_features: int,
    spec: ReplySpec | None = None,
    noisy: bool = False,
) -> None:
    """Raise if ``reply`` is not a well-formed answer to ``broadcast`` by the declaration
    ``spec`` of its kind (form and values; :class:`ReplyValidator` adds what the client
    declared before).

    Args:
        reply: a decoded client reply.
        broadcast: the round's message.
        n_features: ``d`` of the federation's rows.
        spec: the declaration of the broadcast's kind; default the package's own
            (:func:`~fednovelty.federated.core.declarations.declared_spec`).
        noisy: the reply carries differential-privacy noise (a private kind under a
            ``dp_mode``): its form and finiteness are checked, not its values (noise makes
            counts negative and second moments indefinite; the server post-processes the
            sum instead).

    Raises:
        InvalidReplyError: wrong kind, a kind nothing declares, missing or unexpected
            tensor, wrong shape, NaN/inf, a negative count / weight, or values the
            declaration's checks refuse (statistics no rows could produce, ...).
    """
    if reply.kind != broadcast.kind:
        raise InvalidReplyError(f"reply of kind {reply.kind!r} to a {broadcast.kind!r} round.")
    spec = resolve_spec(broadcast.kind) if spec is None else spec
    if spec.kind != broadcast.kind:
        raise ValueError(
            f"the declaration of {spec.kind!r} replies checks a {broadcast.kind!r} one."
        )
    if is_skipped(reply):
        if set(reply.tensors) - {"n_samples"}:
            raise InvalidReplyError("a skipped reply carries statistics.")
        _check_values(reply)
        return
    check_form(reply, broadcast, n_features, spec)
    if noisy:
        _check_finite(reply)
        return
    _check_values(reply)
    for check in spec.checks:
        check(reply, broadcast)


def check_form(reply: Message, broadcast: Message, n_features: int, spec: ReplySpec) -> None:
    """The tensors of a reply that is not skipped: every declared one present with its
    shape, a tensor named as a broadcast tensor with the broadcast's shape, no other."""
    shapes = expected_shapes(broadcast, reply, n_features, spec)
    missing = sorted(set(shapes) - set(reply.tensors))
    if missing:
        raise InvalidReplyError(f"reply lacks tensor(s) {missing}.")
    bound: dict[str, int] = {}
    for name, tensor in reply.tensors.items():
        if name in shapes:
            _match_shape(name, tuple(tensor.shape), shapes[name], bound)
        elif name in broadcast.tensors:
            _match_shape(name, tuple(tensor.shape), tuple(broadcast.tensors[name].shape), bound)
        else:
            raise InvalidReplyError(f"reply has unexpected tensor {name!r}.")


def _check_finite(reply: Message) -> None:
    """Floating tensors finite."""
    for name, tensor in reply.tensors.items():
        if tensor.is_floating_point() and not bool(torch.isfinite(tensor).all()):
            raise InvalidReplyError(f"tensor {name!r} has NaN or inf values.")


def _check_values(reply: Message) -> None:
    """Floating tensors finite, :data:`NON_NEGATIVE` tensors >= 0, row counts at most
    :data:`MAX_ROWS`."""
    for name, tensor in reply.tensors.items():
        if tensor.is_floating_point() and not bool(torch.isfinite(tensor).all()):
            raise InvalidReplyError(f"tensor {name!r} has NaN or inf values.")
        if name in NON_NEGATIVE and tensor.numel() and bool((tensor < 0).any()):
            raise InvalidReplyError(f"tensor {name!r} has negative values.")
        if name in ROW_COUNTS and tensor.numel() and bool((tensor > MAX_ROWS).any()):
            raise InvalidReplyError(
                f"tensor {name!r} claims more than {MAX_ROWS:.3g} rows: no client holds that many."
            )
