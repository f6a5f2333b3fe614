"""The server gate: client replies checked on receipt against what their step declared.

The server does not trust its clients: a reply can be malformed (another fednovelty version,
a bug) or hostile (a client that claims more rows than it has, sends a second moment no rows
could produce, or a local mixture with more components than the broadcast allowed). One NaN
or one impossible statistic in a sum would poison the whole model, so every engine passes
each round's replies through one :class:`ReplyValidator` and hands the server step only the
replies that pass. A reply that fails is dropped with a reason; the round goes on.

The validator is the engine; it knows no message kind. What a reply of a kind must look like
is declared by the step that defines the message, as a
:class:`~fednovelty.federated.core.declarations.ReplySpec`, and the validator applies it: the
reply's form and values (:mod:`~fednovelty.federated.trust.reply_form`), the declared value
checks (:mod:`~fednovelty.federated.trust.value_checks`), a round's replies of one form at
once (:mod:`~fednovelty.federated.trust.batch_checks`), and what the client declared before
(its row count and the box of its moments, :mod:`~fednovelty.federated.trust.declared_box`).
A reply of a kind its algorithm declares nothing for is refused.

A client that lies consistently from its first reply on passes these checks: the robust
aggregation options bound it (``docs/robust.md``).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from fednovelty.federated.core.base import Message
from fednovelty.federated.core.declarations import InvalidReplyError, ReplySpec
from fednovelty.federated.core.packed_runs import PackedRun
from fednovelty.federated.trust.batch_checks import batch_passes
from fednovelty.federated.trust.declared_box import Declared, check_box
from fednovelty.federated.trust.reply_form import SpecLookup, check_reply, is_skipped, resolve_spec
from fednovelty.federated.trust.value_checks import RTOL


@dataclass
class ReplyValidator:
    """One run's server gate, used by every engine.

    Holds the federation's row width (given, or the most common width of the first round's
    replies), how to find the declaration of a kind, and what each client declared
    (:class:`Declared`). It checks:

    - **shapes** (``spec.shapes(broadcast, d)``): every declared tensor present, with its shape
      (a string dimension is free but equal wherever it appears in one reply); a reply tensor
      named as a broadcast tensor has the broadcast's shape (learners, models); any other tensor
      is refused.
    - **values**: floating tensors finite; counts, row counts, weights and variances
      (:data:`NON_NEGATIVE`) non-negative; then the declared ``spec.checks`` (e.g. the shared
      :func:`check_stats`: counts add up to at most the row count and ``n_k S_k - s_k s_k^T`` is
      positive semi-definite, the Cauchy-Schwarz inequality any weighted set of rows satisfies).
    - **what the client declared before** (:class:`ReplyValidator`): the row count is fixed by a
      client's first reply that carries one and may not change later; the row width is the
      federation's. A reply that declares the client's moments (``spec.moments``: a ``moments``
      round's mean ``m`` and sum of squared deviations ``M2``, or the prior moments of
      variational Bayes) fixes a box: every row the client holds lies within ``|x_j - m_j| <=
      sqrt(M2_j)``, so every mean it sends later (``box="means"``: centroids, ranges) lies in
      that box, and the squared deviations about ``m`` that its statistics imply
      (``box="stats"``, ``box="moments"``) may not add up to more than ``M2``.

    :meth:`accept` first checks the form and values of a round's replies of one form
    together (:func:`batch_passes`: one stacked pass and one batched Cholesky for the
    statistics of all clients); a reply that batch does not clear is checked alone, which
    gives the same verdict and names the reason.

    Attributes:
        n_features: the federation's ``d`` (``None`` until known).
        declared: client id -> :class:`Declared`.
        specs: kind -> :class:`~fednovelty.federated.core.declarations.ReplySpec` (the run's
            ``algorithm.reply_spec``, set by the round loop); ``None``: the package's own
            declarations.
        private: the clients release noisy statistics (the algorithm's ``dp_mode``, set by
            the round loop): a reply of a kind with a private form is checked for form and
            finiteness only, and neither its row count nor the box binds it.
    """

    n_features: int | None = None
    declared: dict[int, Declared] = field(default_factory=dict)
    specs: SpecLookup | None = None
    private: bool = False
    #: during :meth:`accept`, the replies :func:`batch_passes` established as well formed.
    _formed: dict[int, Message] = field(default_factory=dict, init=False, repr=False)

    def accept(
        self,
        broadcast: Message,
        replies: Mapping[int, Message],
        widths: Mapping[int, int] | None = None,
        runs: Sequence[PackedRun] = (),
    ) -> tuple[dict[int, Message], dict[int, str]]:
        """Split one round's replies into those the server step may use and those dropped.

        Args:
            broadcast: the round's message.
            replies: client id -> decoded reply.
            widths: client id -> the row width the client reports (Flower's reply
                header); default the federation's width for every client.
            runs: replies the wire unpacked together, with the triangles they travelled in
                (:func:`~fednovelty.federated.core.wire_many.unpack_runs`): the batch
                check reads those (:func:`batch_passes`); the verdicts are the same.

        Returns:
            ``(valid, dropped)``: valid replies by increasing client id, and client id ->
            reason for every dropped one.
        """
        widths = dict(widths or {})
        if self.n_features is None:
            width = self._federation_width(broadcast, widths)
            if width is None:
                raise ValueError("the federation's row width is not known; pass widths.")
            self.n_features = width
        valid, dropped = {}, {}
        self._formed = self._batch_formed(broadcast, replies, runs)
        try:
            for cid in sorted(replies):
                reply = replies[cid]
                try:
                    reported = widths.get(cid, self.n_features)
                    if reported != self.n_features:
                        raise InvalidReplyError(
                            f"rows of {reported} features; the federation's have {self.n_features}."
                        )
                    self.check(cid, reply, broadcast)
                except InvalidReplyError as error:
                    dropped[cid] = str(error)
                    continue
                self._record(cid, reply, broadcast)
                valid[cid] = reply
        finally:
            self._formed = {}
        return valid, dropped

    def _batch_formed(
        self, broadcast: Message, replies: Mapping[int, Message], runs: Sequence[PackedRun] = ()
    ) -> dict:
        """The replies :func:`batch_passes` establishes as well formed (not for noisy
        replies, whose checks differ), by client id."""
        try:
            spec = self.spec(broadcast.kind)
        except InvalidReplyError:
            return {}
        if self.private and spec.private is not None:
            return {}
        passed = batch_passes(broadcast, replies, self.n_features, spec, runs)
        return {c: replies[c] for c in passed}

    def _federation_width(self, broadcast: Message, widths: Mapping[int, int]) -> int | None:
        for name in ("means", "centers", "shift", "offset"):
            if name in broadcast.tensors:
                return int(broadcast.tensors[name].shape[-1])
        if not widths:
            return None
        counts = Counter(widths.values())
        top = max(counts.values())
        return min(w for w, c in counts.items() if c == top)

    def spec(self, kind: str) -> ReplySpec:
        """The declaration of ``kind`` this validator reads (:func:`resolve_spec`)."""
        return resolve_spec(kind, self.specs)

    def check(self, client_id: int, reply: Message, broadcast: Message) -> None:
        """Raise :class:`InvalidReplyError` if the reply is malformed, undeclared, or
        contradicts what ``client_id`` declared before."""
        spec = self.spec(broadcast.kind)
        noisy = self.private and spec.private is not None
        if self._formed.get(client_id) is not reply:  # else established in one batch
            check_reply(reply, broadcast, self.n_features, spec, noisy=noisy)
        if is_skipped(reply) or noisy:
            return
        before = self.declared.get(client_id, Declared())
        n = reply.tensors.get("n_samples", reply.tensors.get("n"))
        if n is not None and before.n_samples is not None:
            if abs(float(n) - before.n_samples) > RTOL * max(before.n_samples, 1.0):
                raise InvalidReplyError(
                    f"reply claims {float(n):g} rows; the client declared {before.n_samples:g}."
                )
        if before.mean is not None and spec.box != "none":
            check_box(reply, broadcast, spec, before)

    def _record(self, client_id: int, reply: Message, broadcast: Message | None = None) -> None:
        if is_skipped(reply):
            return
        declared = self.declared.setdefault(client_id, Declared())
        n = reply.tensors.get("n_samples", reply.tensors.get("n"))
        if n is not None and declared.n_samples is None:
            declared.n_samples = float(n)
        moments = self.spec(reply.kind).moments
        if moments is not None and declared.mean is None:
            _, mean, m2 = (v.double().cpu() for v in moments(reply))
            if broadcast is not None and "box_scale" in broadcast.tensors:  # box units -> x
                offset = broadcast.tensors["box_offset"].double().cpu()
                scale = broadcast.tensors["box_scale"].double().cpu()
                mean, m2 = offset + scale * mean, m2 * scale.square()
            declared.mean, declared.m2 = mean, m2


__all__ = [
    "ReplyValidator",
]
