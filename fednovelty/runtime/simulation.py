"""In-process engine: runs any ``FederatedAlgorithm``'s rounds on one machine.

:func:`run_simulation` is the shared round loop (:func:`fednovelty.runtime.loop.run_rounds`)
with an in-process transport: each round asks a sample of the clients it holds
(``fraction`` sampled without replacement, each then dropping out with probability
``dropout``, both drawn from ``np.random.default_rng(random_state)``) and runs their client
steps here, each on its own rows and its own persistent :class:`ClientContext`. Client rows
never leave their tensor; only ``Message`` objects pass between the halves, packed exactly as
they would be between Flower nodes (:mod:`fednovelty.federated.core.wire`; ``ClientContext.wire``),
so ``RoundRecord.bytes_up`` and ``bytes_down`` are the bytes that would cross.

The loop does the rest, as on Flower: every reply goes through a
:class:`~fednovelty.federated.trust.validation.ReplyValidator` (a reply that is malformed or
contradicts what its client declared before is dropped and recorded in
``RoundRecord.dropped``), a round with fewer than ``min_clients`` valid replies is recorded
as failed and asked again of a fresh sample (a ``skipped`` reply does not count), and
``max_failed_rounds`` failed rounds in a row stop the run with a
:class:`~fednovelty.exceptions.FederationError`.
"""

from __future__ import annotations

import copy
import gc
import math
import warnings
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from torch import Tensor

from fednovelty.federated.core.base import ClientContext, FederatedAlgorithm, Message
from fednovelty.federated.trust.gate import client_context, terms_of
from fednovelty.federated.trust.ledger import PrivacyLedger
from fednovelty.federated.trust.privacy import PrivacyPolicy
from fednovelty.federated.trust.validation import ReplyValidator
from fednovelty.runtime import loop
from fednovelty.runtime.clients import check_clients, client_rows
from fednovelty.runtime.loop import (
    Delivery,
    RoundRecord,
    Transport,
    failed_rounds_message,
    sample_clients,
)
from fednovelty.runtime.secure_rounds import SecureRounds, SecureSum, as_settings
from fednovelty.runtime.threads import run_client_step, run_client_steps

__all__ = [
    "InProcessTransport",
    "RoundRecord",
    "SimulationResult",
    "UnsummedDistributedWarning",
    "check_clients",
    "failed_rounds_message",
    "failure_budget",
    "run_simulation",
    "sample_clients",
]


@dataclass
class SimulationResult:
    """Final server state, per-round records, the clients' final states and their privacy
    ledgers (what each has released under differential privacy, restarts included)."""

    state: Any
    history: list[RoundRecord]
    client_states: dict[int, dict[str, Tensor]]
    ledgers: dict[int, PrivacyLedger] = field(default_factory=dict)

    @property
    def bytes_up(self) -> int:
        return sum(r.bytes_up for r in self.history)

    @property
    def bytes_down(self) -> int:
        return sum(r.bytes_down for r in self.history)


class InProcessTransport(Transport):
    """Clients held in this process: each round samples them and runs their client steps.

    Args:
        algorithm: whose ``client_step`` the clients run.
        data: client id -> its rows (or labelled tuple).
        contexts: client id -> its :class:`ClientContext` (state kept across rounds).
        fraction, dropout: as :func:`run_simulation`'s; rng: the sampling stream.
        batch: hand a round's clients to the algorithm together where its step batches
            them (:meth:`~fednovelty.federated.core.base.FederatedAlgorithm.batches`).

    Lying clients: where the algorithm has a ``forge_reply(client_id, reply, message, data,
    context)`` method (a test's or benchmark's wrapper modelling clients that do not hold
    themselves to their gate), every reply leaves through it after the client gate; what it
    returns is what the server gate faces. No fednovelty algorithm has one.
    """

    def __init__(
        self,
        algorithm: FederatedAlgorithm,
        data: dict[int, Any],
        contexts: dict[int, ClientContext],
        fraction: float,
        dropout: float,
        rng: np.random.Generator,
        batch: bool = True,
    ) -> None:
        self.algorithm, self.data, self.contexts = algorithm, data, contexts
        self.batch = batch
        self.fraction, self.dropout, self.rng = fraction, dropout, rng
        self.excluded: set[int] = set()
        self._start = (
            copy.deepcopy(rng.bit_generator.state),
            {cid: {k: v.clone() for k, v in ctx.state.items()} for cid, ctx in contexts.items()},
        )

    def exchange(self, number: int, message: Message) -> Delivery:
        """Sample this round's clients (those not excluded) and run the client step of each
        that replies."""
        ids = [c for c in self.data if c not in self.excluded]
        if not ids:
            return Delivery({}, asked=(), n_asked=0, bytes_up=0)
        asked, replying = sample_clients(ids, self.fraction, self.dropout, self.rng)
        batches = getattr(self.algorithm, "batches", None)
        if self.batch and len(replying) > 1 and batches is not None and batches(message.kind):
            items = [(self.data[cid], self.contexts[cid]) for cid in replying]
            answers = run_client_steps(self.algorithm, items, message)
            replies = dict(zip(replying, answers, strict=True))
        else:
            replies = {
                cid: run_client_step(self.algorithm, self.data[cid], message, self.contexts[cid])
                for cid in replying
            }
        forge = getattr(self.algorithm, "forge_reply", None)
        if forge is not None:  # a wrapper modelling clients that lie past their own gate
            replies = {
                cid: forge(cid, reply, message, self.data[cid], self.contexts[cid])
                for cid, reply in replies.items()
            }
        bytes_up = sum(r.nbytes() for r in replies.values())  # packed: as they cross the wire
        return Delivery(replies, asked=tuple(asked), n_asked=len(asked), bytes_up=bytes_up)

    def exclude(self, client_ids: Iterable[int]) -> None:
        """Ask ``client_ids`` no more in this run."""
        self.excluded.update(client_ids)

    def restart(self) -> None:
        """The sampling stream and every client's kept state as they were when the run
        began: the restarted run is the run of a federation without the excluded clients."""
        rng_state, states = self._start
        self.rng.bit_generator.state = copy.deepcopy(rng_state)
        for cid, ctx in self.contexts.items():
            ctx.state = {k: v.clone() for k, v in states[cid].items()}


#: new container objects (net of those freed) after which Python's cyclic garbage collector
#: looks for cycles while a simulation runs (``gc.set_threshold``'s first argument; Python's
#: own default is 700).
ROUND_GC_THRESHOLD = 1_000_000


@contextmanager
def rare_collections(threshold: int = ROUND_GC_THRESHOLD) -> Iterator[None]:
    """Run the body with the cyclic garbage collector's first threshold at ``threshold``;
    the caller's thresholds are restored on exit (also when the body raises).

    A round of many in-process clients creates some 10^5 messages, dicts and tensor views
    that stay alive until the round's server step, and frees them by reference counting;
    under Python's default threshold the collector traverses them (and every older object,
    the clients' rows among them) a few times a round and finds nothing: 0.6 to 1.7 s of a
    10,000-client round of 100 rows each (``benchmarks/bench_mixture.py``), while a
    collection after such rounds finds the same ~20 unreachable objects after one round as
    after three. Cycles are still collected, after ``threshold`` new objects.
    """
    previous = gc.get_threshold()
    gc.set_threshold(max(int(threshold), previous[0]), *previous[1:])
    try:
        yield
    finally:
        gc.set_threshold(*previous)


class UnsummedDistributedWarning(UserWarning):
    """Distributed-DP replies read one by one: without a secure sum the server sees each
    client's reply, which carries ``z / sqrt(m)``, not the calibrated ``z``."""


def warn_unsummed(policy: PrivacyPolicy, secure: SecureSum | None) -> None:
    """Warn (:class:`UnsummedDistributedWarning`) where the clients' ``policy`` adds
    distributed noise and no secure sum hides the replies."""
    dp = policy.dp
    if secure is None and dp is not None and dp.mode == "distributed":
        warnings.warn(
            UnsummedDistributedWarning(
                'DP mode "distributed" without a secure sum: the server reads each reply, '
                f"whose noise is z / sqrt(m) (m = {dp.n_clients}), so the guarantee against "
                "the server is that of z / sqrt(m), not the budget's epsilon (a detector's "
                "privacy_spent_ reports it as epsilon_against_server). Pass "
                'secure_sum=SecureSum(max_rows=...), or use mode "local".'
            ),
            stacklevel=3,
        )


#: failed rounds in a row that end a simulation without dropout.
MAX_FAILED_ROUNDS = 5
#: the chance, per round, that simulated dropout alone ends a run under the default budget.
SPURIOUS_END = 1e-6


def failure_budget(dropout: float) -> int:
    """Failed rounds in a row after which a simulation counts its federation as gone, by
    default: ``MAX_FAILED_ROUNDS``, or more where ``dropout`` makes runs of failed rounds
    likely. A round fails only when every client that could contribute drops out
    (probability at most ``dropout``), so ``m`` failures in a row have probability at most
    ``dropout ** m``; the budget is the least ``m`` that puts it below ``SPURIOUS_END``.
    """
    if dropout <= 0:
        return MAX_FAILED_ROUNDS
    return max(MAX_FAILED_ROUNDS, math.ceil(math.log(SPURIOUS_END) / math.log(dropout)))


def run_simulation(
    algorithm: FederatedAlgorithm,
    clients: Sequence[Tensor] | dict[int, Tensor],
    *,
    fraction: float = 1.0,
    dropout: float = 0.0,
    min_clients: int = 1,
    max_failed_rounds: int | None = None,
    random_state: int = 0,
    progress: bool | None = None,
    callbacks: Sequence[Callable[[RoundRecord], None]] = (),
    description: str | None = None,
    privacy: PrivacyPolicy | None = None,
    client_states: Mapping[int, Mapping[str, Tensor]] | None = None,
    ledgers: Mapping[int, PrivacyLedger] | None = None,
    secure_sum: SecureSum | bool | None = None,
    batch_clients: bool = True,
) -> SimulationResult:
    """Run ``algorithm`` to completion over in-process clients.

    Args:
        algorithm: a ``FederatedAlgorithm``.
        clients: each client's rows (n_c, n_features), as a list (ids 0..n-1) or a dict by
            id; tuples ``(X, y, ...)`` for an algorithm whose ``labelled`` is true.
        fraction: share of clients asked each round (at least one).
        dropout: probability that an asked client does not reply.
        min_clients: fewest valid replies a round may go on with; a round with fewer is
            recorded as failed and asked again of a fresh sample.
        max_failed_rounds: failed rounds in a row after which the federation counts as
            gone (a ``FederationError``); default :func:`failure_budget` of ``dropout``
            (5 without dropout), so that simulated dropout alone stops a run with
            probability below ``1e-6`` per round.
        random_state: seed of client sampling and dropout.
        progress: show a tqdm bar over rounds (labelled ``description``); None: only when
            stderr is a terminal.
        callbacks: called with each ``RoundRecord`` as it completes.
        privacy: the privacy policy every client enforces (its ``ClientContext.policy``);
            default ``PrivacyPolicy()`` (at least 5 rows behind every released statistic,
            no raw rows). ``PrivacyPolicy(min_rows=1)`` is the unprotected protocol.
        client_states: what each client kept from an earlier run (``SimulationResult.
            client_states``; e.g. a stream's personal weights from window to window), by
            client id; copied, never modified. Clients not in it start empty.
        ledgers: each client's privacy ledger before this run (``SimulationResult.ledgers``
            of an earlier run on the same rows), by client id; a client not in it starts from
            an empty one. A ledger is the client's, not the run's: a restart after a liar is
            caught keeps it, and the result returns it.
        secure_sum: run every round through a secure sum
            (:mod:`fednovelty.runtime.secure_rounds`): the server step gets one combined
            reply, the SecAgg sum of the clients' replies, never one client's. A
            :class:`~fednovelty.runtime.secure_rounds.SecureSum` with its public
            ``max_rows`` (required: the bound on any client's rows, never taken from the
            data). Needs the algorithm's ``dp_mode`` (``"distributed"``: only the sum
            carries the calibrated noise; without a secure sum a distributed policy warns,
            :class:`UnsummedDistributedWarning`) and at least 2 contributing replies a round
            (``min_clients`` is raised to 2); a round of a kind without an additive private
            form raises. The round records' metrics carry the protocol's time, bytes and
            error bounds (``secure_*``).
        batch_clients: run a round's clients as one batched computation where the
            algorithm's step batches them (learner SGD of the joint models: stacked copies
            under ``torch.func.vmap``); each client's reply depends only on its own rows and
            state, as one at a time (equal to rounding). ``False``: one client after
            another, as a Flower node runs its own.

    Returns:
        ``SimulationResult``.

    Raises:
        ValueError: bad arguments. ClientDataError: unusable client data (names the
            client). FederationError: ``max_failed_rounds`` failed rounds in a row.
    """
    if not 0.0 < fraction <= 1.0:
        raise ValueError(f"fraction must be in (0, 1], got {fraction}.")
    if not 0.0 <= dropout < 1.0:
        raise ValueError(f"dropout must be in [0, 1), got {dropout}.")
    if max_failed_rounds is None:
        max_failed_rounds = failure_budget(dropout)
    if int(max_failed_rounds) < 1:
        raise ValueError(f"max_failed_rounds must be >= 1, got {max_failed_rounds}.")
    data = dict(enumerate(clients)) if not isinstance(clients, dict) else dict(clients)
    if not data:
        raise ValueError("clients is empty; give at least one client's rows.")
    check_clients(data, labelled=bool(getattr(algorithm, "labelled", False)))
    asked_per_round = len(data) if fraction >= 1.0 else max(1, math.ceil(fraction * len(data)))
    if min_clients > asked_per_round:
        raise ValueError(
            f"min_clients={min_clients} but only {asked_per_round} of {len(data)} client(s) are "
            "asked each round; lower min_clients or raise fraction."
        )
    policy = PrivacyPolicy() if privacy is None else privacy
    if not isinstance(policy, PrivacyPolicy):
        raise TypeError(f"privacy must be a PrivacyPolicy or None, got {type(privacy).__name__}.")
    kept = client_states or {}
    spent = ledgers or {}
    contexts = {
        cid: client_context(
            cid,
            {k: v.clone() for k, v in kept.get(cid, {}).items()},
            policy,
            wire=True,
            ledger=spent.get(cid, PrivacyLedger()),
        )
        for cid in data
    }
    secure = as_settings(secure_sum)
    combine = None
    if secure is not None:
        if len(data) < 2:
            raise ValueError("secure_sum needs at least 2 clients; the sum of one is its reply.")
        combine = SecureRounds(algorithm, secure, random_state)
    warn_unsummed(policy, secure)
    rng = np.random.default_rng(random_state)
    transport = InProcessTransport(algorithm, data, contexts, fraction, dropout, rng, batch_clients)
    width = int(client_rows(next(iter(data.values()))).shape[1])
    with rare_collections():
        state, history = loop.run_rounds(
            algorithm,
            transport,
            validator=ReplyValidator(n_features=width),
            min_clients=min_clients if combine is None else max(min_clients, 2),
            max_failed_rounds=max_failed_rounds,
            callbacks=callbacks,
            progress=progress,
            description=description,
            combine=combine,
        )
    return SimulationResult(
        state,
        history,
        {cid: ctx.state for cid, ctx in contexts.items()},
        {cid: terms_of(ctx).ledger for cid, ctx in contexts.items()},
    )
