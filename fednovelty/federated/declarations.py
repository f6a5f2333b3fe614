"""What a step declares about the replies it answers: the one thing both gates read.

A reply crosses two gates (``docs/trust.md``). The **client gate** runs on the client after
the step's client half, before anything leaves the client: it applies the client's own
:class:`~fednovelty.federated.privacy.PrivacyPolicy` to every released value, by what the
step says backs it. The **server gate** runs on the server before any server step: it checks
each reply against the schema the step declared (shapes from the broadcast, value checks,
the client's declared box) and drops what does not fit. Neither gate knows an algorithm;
each reads the :class:`ReplySpec` the step declares for the reply's kind, so a family never
applies trust by hand, and a step without declarations cannot be chained or registered.

The vocabulary:

- ``shapes(broadcast, d)``: the tensors a reply must carry and their shapes (a string
  dimension is free but equal wherever it appears in one reply); ``d`` is the width of the
  rows the round works on.
- ``checks``: value checks beyond shape, finiteness and non-negativity, each
  ``check(reply, broadcast)`` raising
  :class:`~fednovelty.federated.validation.InvalidReplyError` with a reason.
- ``backing``: tensor name -> what backs its entries, one of :data:`BACKINGS`. The client
  half states the effective rows behind each entry in the reply's ``backing`` (never sent);
  the gate releases an entry only when they reach the client's floor, and releases no tensor
  the declaration does not classify.
- ``limit(config, broadcast)``: the most entries along the leading dimension of the
  component-, cluster-, class- or bin-backed tensors that the client's *own* configuration
  allows (``None``: no bound beyond the broadcast's shapes).
- ``box``: how the client's declared moments bound the reply (``"none"``, ``"means"``: every
  mean-like tensor in the box, ``"stats"``: summed statistics whose means and spread lie in
  it).
- ``serial``: the client half runs on one torch thread at any size (learner SGD on small
  batches).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

#: what can back a released tensor's entries:
#:
#: - ``"client"``: the whole tensor is a statistic of all the client's rows (row count,
#:   feature moments, a log-likelihood sum); its backing is one number.
#: - ``"components"``: entry ``k`` along dim 0 is backed by the effective rows of component
#:   ``k``'s responsibilities (Kish's ``(sum r)^2 / sum r^2``).
#: - ``"clusters"``: entry ``c`` along dim 0 is one cluster row of the broadcast.
#: - ``"classes"``: entry ``y`` along dim 0 is one class's rows.
#: - ``"bins"``: entry ``b`` along dim 0 counts the rows falling in one bin.
#: - ``"model"``: parameters of a model trained on the client's rows (a local mixture, a
#:   learner); backed like ``"components"`` along dim 0 for local mixtures, like
#:   ``"client"`` for learners.
BACKINGS: tuple[str, ...] = ("client", "components", "clusters", "classes", "bins", "model")

#: the ways a reply can be bounded by the box of its client's declared moments.
BOXES: tuple[str, ...] = ("none", "means", "stats")

Shape = tuple[int | str, ...]
ShapeRule = Callable[[Any, int], dict[str, Shape]]
Check = Callable[[Any, Any], None]
Limit = Callable[[Any, Any], int | None]


@dataclass(frozen=True)
class ReplySpec:
    """One reply kind's declaration (module docstring).

    Attributes:
        kind: the message kind it answers.
        shapes: ``(broadcast, d) -> {tensor name: shape}``.
        checks: value checks, each ``(reply, broadcast) -> None`` or raises.
        backing: tensor name -> one of :data:`BACKINGS`.
        limit: ``(config, broadcast) -> most entries`` of the grouped tensors, or ``None``.
        box: one of :data:`BOXES`.
        serial: the client half runs on one thread.

    Raises:
        ValueError: an unknown backing or box, naming it.
    """

    kind: str
    shapes: ShapeRule
    checks: tuple[Check, ...] = ()
    backing: Mapping[str, str] = field(default_factory=dict)
    limit: Limit | None = None
    box: str = "none"
    serial: bool = False

    def __post_init__(self) -> None:
        unknown = {name: b for name, b in self.backing.items() if b not in BACKINGS}
        if unknown:
            raise ValueError(
                f"ReplySpec({self.kind!r}): unknown backing {unknown}; use one of {BACKINGS}."
            )
        if self.box not in BOXES:
            raise ValueError(f"ReplySpec({self.kind!r}): box must be one of {BOXES}.")


class UndeclaredReplyError(TypeError):
    """A step answers a message kind for which it declares no :class:`ReplySpec`."""


def check_declared(owner: str, kinds: tuple[str, ...], specs: Mapping[str, ReplySpec]) -> None:
    """Raise :class:`UndeclaredReplyError` unless every kind in ``kinds`` has a spec in
    ``specs`` whose ``kind`` is that kind (``owner`` names the step in the message)."""
    missing = [kind for kind in kinds if kind not in specs]
    if missing:
        raise UndeclaredReplyError(
            f"{owner} answers message kind(s) {missing} without declaring their replies; "
            "give the step a ReplySpec for each kind (fednovelty.federated.declarations)."
        )
    wrong = [kind for kind in kinds if specs[kind].kind != kind]
    if wrong:
        raise UndeclaredReplyError(f"{owner}: the ReplySpec for {wrong} names another kind.")


__all__ = [
    "BACKINGS",
    "BOXES",
    "ReplySpec",
    "UndeclaredReplyError",
    "check_declared",
]
