"""What a step declares about the replies it answers: the one thing both gates read.

A reply crosses two gates (``docs/trust.md``). The **client gate** runs on the client after
the step's client half, before anything leaves the client: it applies the client's own
:class:`~fednovelty.federated.trust.privacy.PrivacyPolicy` to every released value, by what the
step says backs it. The **server gate** runs on the server before any server step: it checks
each reply against the schema the step declared (shapes from the broadcast, value checks,
the client's declared box) and drops what does not fit. Neither gate knows an algorithm;
each reads the :class:`ReplySpec` the step declares for the reply's kind, so a family never
applies trust by hand, and a step without declarations cannot be chained or registered.
The vocabulary is stated on :class:`ReplySpec`.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
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

#: the private forms of a reply (``ReplySpec.private``; :mod:`fednovelty.federated.trust.dp`).
PRIVATE_RELEASES: tuple[str, ...] = ("stats", "moments", "scatter", "fit", "parts")

#: the private forms of a reply's tensors beside its release (``ReplySpec.private_parts``):
#: ``"histogram"``, responsibilities summed over rows (each row's sum to at most 1, so one
#: row moves the tensor by at most 1 in L2; the gate adds the counts' noise), and
#: ``"dp_sgd"``, learner weights the client half trained by DP-SGD under its own settings
#: (:mod:`fednovelty.federated.trust.dp_sgd`; the reply states ``scalars["dp_sgd_steps"]``), and
#: ``"withheld"``, a value with no bounded sensitivity (a mean loss) that a private release
#: sends as zeros.
PRIVATE_PARTS: tuple[str, ...] = ("histogram", "dp_sgd", "withheld")

#: the tensors each private release covers (``"parts"``: none); any other tensor of a
#: private reply needs a declared private part, or the gate refuses the reply.
RELEASE_TENSORS: Mapping[str, frozenset[str]] = MappingProxyType(
    {
        "stats": frozenset({"counts", "sums", "second", "n_samples", "log_likelihood"}),
        "moments": frozenset({"n_samples", "mean", "m2"}),
        "scatter": frozenset({"n_samples", "mean", "scatter"}),
        "parts": frozenset(),
    }
)

#: the ways a reply can be bounded by the box of its client's declared moments.
BOXES: tuple[str, ...] = ("none", "means", "stats", "moments")

Shape = tuple[int | str, ...]
ShapeRule = Callable[[Any, int], dict[str, Shape]]
Check = Callable[[Any, Any], None]
Limit = Callable[[Any, Any], int | Mapping[str, int] | None]
Moments = Callable[[Any], tuple[Any, Any, Any]]
Components = Callable[[Callable[[str], Any]], int]


@dataclass(frozen=True)
class ReplySpec:
    """One reply kind's declaration, read by both gates (module docstring):

    - ``shapes(broadcast, d)``: the tensors a reply must carry and their shapes (a string
      dimension is free but equal wherever it appears in one reply); ``d`` is the width of the
      rows the round works on.
    - ``checks``: value checks beyond shape, finiteness and non-negativity, each ``check(reply,
      broadcast)`` raising :class:`~fednovelty.federated.core.declarations.InvalidReplyError` with a
      reason.
    - ``backing``: tensor name -> what backs its entries, one of :data:`BACKINGS`; a name ending
      in ``"."`` (``"learner."``) covers every tensor whose name starts with it
      (:meth:`ReplySpec.backing_of`). The client half states the effective rows behind each
      entry in the reply's ``backing`` (never sent); the gate releases an entry only when they
      reach the client's floor, and releases no tensor the declaration does not classify.
    - ``limit(config, broadcast)``: the most entries along the leading dimension of the
      component-, cluster-, class- or bin-backed tensors that the client's *own* configuration
      allows (``None``: no bound beyond the broadcast's shapes).
    - ``box``: how the client's declared moments bound the reply (``"none"``; ``"means"``: every
      row of the ``points`` tensors (centroids, ranges) in the box; ``"stats"``: summed
      statistics about the broadcast's ``shift``, where the reply carries them, whose means and
      spread lie in it; ``"moments"``: the moments the reply itself declares, the same way).
    - ``moments(reply)``: for a reply that declares the client's moments (a ``moments`` or
      prior-moments round), its row count, per-feature mean and sum of squared deviations; the
      server keeps the first such declaration as the client's box for its later replies.
    - ``serial``: the client half runs on one torch thread at any size (learner SGD on small
      batches); ``components(setting)`` and ``covariance`` estimate the client half's work where
      the broadcast does not carry it: the K it works with from the algorithm's settings
      (``setting(name)``), and whether the algorithm's ``covariance_type`` (full or tied makes
      the work grow with the square of the width) applies.
    - ``private``: how the reply is released under differential privacy
      (:data:`PRIVATE_RELEASES`: ``"stats"``, summed mixture statistics about the broadcast's
      ``shift``; ``"moments"``, feature moments; ``"scatter"``, a row count, mean and scatter
      matrix; the gate adds the noise (:mod:`fednovelty.federated.trust.dp`). ``"fit"``: a model
      the client half fitted under the policy's own mechanism, e.g. DP-EM, stating its noisy
      releases in ``scalars["dp_releases"]``, which the gate charges. ``"parts"``: no
      statistics; every tensor is a declared private part (models trained by DP-SGD, withheld
      values), the reply is one noisy release of the client's budget and no statistics
      release in the accounting); ``None``: the kind has no private form and a client under
      a differential-privacy policy refuses it.
    - ``private_parts``: tensor name (or prefix ending in ``"."``) -> one of
      :data:`PRIVATE_PARTS`, the private form of a tensor the release does not cover
      (:data:`RELEASE_TENSORS`), e.g. a joint model's joint counts and learners.

    Attributes:
        kind: the message kind it answers.
        shapes: ``(broadcast, d) -> {tensor name: shape}``.
        checks: value checks, each ``(reply, broadcast) -> None`` or raises.
        backing: tensor name -> one of :data:`BACKINGS`.
        limit: ``(config, broadcast) -> most entries`` of the grouped tensors (a mapping
            from backing to most entries where a reply has groups of two sizes), or ``None``.
        box: one of :data:`BOXES`.
        serial: the client half runs on one thread.
        points: the tensors whose rows ``box="means"`` bounds.
        moments: ``reply -> (n_samples, mean (d,), m2 (d,))`` for a reply that declares
            the client's moments, else ``None``.
        components: ``setting -> K`` of the client half's work when the broadcast does
            not say, else ``None``.
        covariance: the algorithm's ``covariance_type`` sets the client half's work.
        private: one of :data:`PRIVATE_RELEASES`, or ``None``.
        private_parts: tensor name or prefix -> one of :data:`PRIVATE_PARTS`.

    Raises:
        ValueError: an unknown backing, box or private release, naming it.
    """

    kind: str
    shapes: ShapeRule
    checks: tuple[Check, ...] = ()
    backing: Mapping[str, str] = field(default_factory=dict)
    limit: Limit | None = None
    box: str = "none"
    serial: bool = False
    points: tuple[str, ...] = ()
    moments: Moments | None = None
    components: Components | None = None
    covariance: bool = False
    private: str | None = None
    private_parts: Mapping[str, str] = field(default_factory=dict)

    def backing_of(self, name: str) -> str | None:
        """What backs tensor ``name``: its own entry, else the entry of the longest prefix
        ending in ``"."`` that it starts with; ``None`` when the declaration does not
        classify it."""
        return _by_name(self.backing, name)

    def private_part(self, name: str) -> str | None:
        """The private form of tensor ``name`` beside the release (``private_parts``, by
        name or longest prefix), ``None`` when none is declared."""
        return _by_name(self.private_parts, name)

    def __post_init__(self) -> None:
        unknown = {name: b for name, b in self.backing.items() if b not in BACKINGS}
        if unknown:
            raise ValueError(
                f"ReplySpec({self.kind!r}): unknown backing {unknown}; use one of {BACKINGS}."
            )
        if self.box not in BOXES:
            raise ValueError(f"ReplySpec({self.kind!r}): box must be one of {BOXES}.")
        if self.private is not None and self.private not in PRIVATE_RELEASES:
            raise ValueError(
                f"ReplySpec({self.kind!r}): private must be one of {PRIVATE_RELEASES} or None."
            )
        parts = {name: p for name, p in self.private_parts.items() if p not in PRIVATE_PARTS}
        if parts or (self.private_parts and self.private not in RELEASE_TENSORS):
            raise ValueError(
                f"ReplySpec({self.kind!r}): private_parts must map tensors to one of "
                f"{PRIVATE_PARTS} beside a private release of {sorted(RELEASE_TENSORS)}; "
                f"got {dict(self.private_parts)} with private={self.private!r}."
            )
        if self.private == "parts" and not self.private_parts:
            raise ValueError(
                f"ReplySpec({self.kind!r}): private='parts' releases only declared parts; "
                "declare each tensor's private form in private_parts."
            )


def _by_name(table: Mapping[str, str], name: str) -> str | None:
    """``table``'s entry for ``name``, else that of the longest prefix ending in ``"."``
    that ``name`` starts with, else ``None``."""
    if name in table:
        return table[name]
    prefixes = [p for p in table if p.endswith(".") and name.startswith(p)]
    return table[max(prefixes, key=len)] if prefixes else None


#: the backing of a summed-statistics reply: counts, sums and second moments per component,
#: the log-likelihood sum and the row count of the whole client.
STATS_BACKING: Mapping[str, str] = {
    "counts": "components",
    "sums": "components",
    "second": "components",
    "log_likelihood": "client",
    "n_samples": "client",
}


def components_limit(config: Any, broadcast: Any) -> int | None:
    """The client's own bound on components or centroids per reply: its configuration's
    ``total_components`` where it has one (a clustered mixture's K over all clusters), else
    its ``n_components`` (``None`` where it has neither)."""
    k = getattr(config, "total_components", None) or getattr(config, "n_components", None)
    return None if k is None else int(k)


def stats_reply(
    kind: str,
    shapes: ShapeRule,
    checks: tuple[Check, ...],
    backing: Mapping[str, str] | None = None,
    *,
    limit: Limit = components_limit,
    **options: Any,
) -> ReplySpec:
    """The declaration of a reply of summed statistics per component: backed as
    :data:`STATS_BACKING` plus ``backing`` (its other tensors), bounded by the client's own
    K (``limit``, by default :func:`components_limit`) and by its declared box
    (``box="stats"``); ``options`` are :class:`ReplySpec`'s other fields."""
    merged = {**STATS_BACKING, **(backing or {})}
    return ReplySpec(
        kind, shapes=shapes, checks=checks, backing=merged, limit=limit, box="stats", **options
    )


def components_setting(setting: Callable[[str], Any]) -> int:
    """K of a client half's work from the algorithm's ``n_components`` setting (1 if none)."""
    return max(1, int(setting("n_components") or 1))


def declare(*specs: ReplySpec) -> Mapping[str, ReplySpec]:
    """A step's ``replies``: each spec under its kind, read-only."""
    return MappingProxyType({spec.kind: spec for spec in specs})


class InvalidReplyError(ValueError):
    """A client reply does not have the form the round asked for, or contradicts what the
    client declared before."""


class UndeclaredReplyError(TypeError):
    """A step answers a message kind for which it declares no :class:`ReplySpec`."""


def check_declared(owner: str, kinds: tuple[str, ...], specs: Mapping[str, ReplySpec]) -> None:
    """Raise :class:`UndeclaredReplyError` unless every kind in ``kinds`` has a spec in
    ``specs`` whose ``kind`` is that kind (``owner`` names the step in the message)."""
    missing = [kind for kind in kinds if kind not in specs]
    if missing:
        raise UndeclaredReplyError(
            f"{owner} answers message kind(s) {missing} without declaring their replies; "
            "give the step a ReplySpec for each kind (fednovelty.federated.core.declarations)."
        )
    wrong = [kind for kind in kinds if specs[kind].kind != kind]
    if wrong:
        raise UndeclaredReplyError(f"{owner}: the ReplySpec for {wrong} names another kind.")


#: kind -> the declaration of the fednovelty step or algorithm that answers it, filled when
#: such a class is defined (:func:`register_declarations`).
DECLARED: dict[str, ReplySpec] = {}


def register_declarations(cls: type) -> None:
    """Record the replies ``cls`` declares in its own body (``replies``) in
    :data:`DECLARED`, for a class of the package (``fednovelty.``); called when a step or
    algorithm class is defined.

    Raises:
        ValueError: another fednovelty class already declares one of its kinds.
    """
    if not cls.__module__.startswith("fednovelty."):
        return
    for kind, spec in dict(vars(cls).get("replies", {})).items():
        if DECLARED.setdefault(kind, spec) is not spec:
            raise ValueError(f"two fednovelty classes declare replies of kind {kind!r}.")


def declared_spec(kind: str) -> ReplySpec:
    """The package's own declaration of replies of ``kind``: the one the fednovelty step
    or algorithm that answers ``kind`` declares (a kind is answered by one protocol,
    whichever algorithm chains it). For checks made without the algorithm at hand (a
    reply checked on its own, a thread estimate from settings); a run reads its
    algorithm's declarations (``FederatedAlgorithm.reply_spec``). The table is complete
    once :mod:`fednovelty.federated` is imported (its registry imports every module).

    Raises:
        UndeclaredReplyError: no fednovelty step or algorithm declares ``kind``.
    """
    if kind not in DECLARED:
        raise UndeclaredReplyError(
            f"no fednovelty step declares replies of kind {kind!r}; known kinds: "
            f"{sorted(DECLARED)}."
        )
    return DECLARED[kind]


__all__ = [
    "BACKINGS",
    "BOXES",
    "DECLARED",
    "PRIVATE_PARTS",
    "PRIVATE_RELEASES",
    "RELEASE_TENSORS",
    "STATS_BACKING",
    "InvalidReplyError",
    "ReplySpec",
    "UndeclaredReplyError",
    "check_declared",
    "components_limit",
    "components_setting",
    "declare",
    "declared_spec",
    "register_declarations",
    "stats_reply",
]
