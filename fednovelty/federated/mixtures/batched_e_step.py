"""Many clients' replies to an E-step round as one computation (the in-process engine's batch).

Where a step batches its clients (``Step.batched``) the in-process engine hands it a round's
clients together. :func:`e_step_replies` gives each client the reply its own
:meth:`~fednovelty.federated.mixtures.em.EMStep.client_step` gives, computed for groups of
clients of similar row counts at once:

* the E-step statistics of a group's rows, padded to one length, each client with its own
  log-weights (:func:`~fednovelty.mixture.batched_stats.e_step_stats_many`);
* what each client's floor needs, for the group at once: each component's effective rows
  and the winsorised log-likelihood with its effective rows
  (:func:`~fednovelty.federated.trust.contrast_many.winsorised_sums_many`); a tied second
  moment of the kept components (:func:`~fednovelty.federated.mixtures.e_step_reply.
  kept_tied_second`) client by client, where a client keeps some components only;
* each client's personal weights for its next round and its reply with the backing of every
  value, as :func:`~fednovelty.federated.mixtures.e_step_reply.floored_stats_message` forms it.

Each reply then passes its own client's gate (the floor, and under differential privacy the
client's own noise). The statistics are the same sums in another order: equal to the
one-client replies to round-off, with the same floor decisions and skipped replies. A client
without rows, one longer than a group may be, or one with rows of another dtype or device runs
its own ``client_step``.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch import Tensor

from fednovelty.federated.core.base import ClientContext, Message, skipped_reply
from fednovelty.federated.mixtures.e_step_reply import kept_tied_second
from fednovelty.federated.trust.backing import backed, effective_rows
from fednovelty.federated.trust.contrast_many import winsorised_sums_many
from fednovelty.mixture.batched_stats import StatsMany, budget_rows, e_step_stats_many, set_groups
from fednovelty.mixture.density import Workspace
from fednovelty.mixture.stats import SufficientStats

__all__ = ["e_step_replies", "personal_log_weights_many"]

#: the one-client step a client the batch does not take runs: ``(rows, message, context)``.
OneClient = Callable[[Any, Message, ClientContext], Message]


def personal_log_weights_many(counts: Tensor) -> Tensor:
    """:func:`~fednovelty.federated.mixtures.e_step_reply.personal_log_weights` of each row
    of ``counts`` (G, n_components): (G, n_components)."""
    counts = counts + 10 * torch.finfo(counts.dtype).eps
    return (counts / counts.sum(1, keepdim=True)).log()


def e_step_replies(
    items: Sequence[tuple[Any, ClientContext]],
    message: Message,
    config: Any,
    workspace: Workspace,
    one_client: OneClient,
) -> list[Message]:
    """Each client's reply to the E-step round ``message`` (module docstring), in the order
    of ``items``.

    Args:
        items: ``(rows, context)`` of each client: rows (n_c, n_features), the client's
            context (its kept log-weights in ``context.state``, its terms).
        message: the broadcast (``weights``, ``means``, ``precisions_cholesky``,
            ``shift``).
        config: the algorithm's settings (``covariance_type``, ``mixture_weights``,
            ``chunk_size``).
        workspace: the step's scratch buffers, shared with its one-client E-step.
        one_client: the step's ``client_step``, for clients the batch does not take (and
            for a batch of one client).

    Returns:
        One reply per item, as ``one_client`` gives it (statistics equal to round-off).
    """
    if len(items) < 2:
        return [one_client(data, message, context) for data, context in items]
    like = items[0][0]
    t = {name: value.to(like.device, like.dtype) for name, value in message.tensors.items()}
    k, d = t["means"].shape
    personal = config.mixture_weights == "personal"
    budget = budget_rows(k, d, config.chunk_size)
    replies: list[Message | None] = [None] * len(items)
    batch: list[int] = []
    for i, (X, context) in enumerate(items):
        if not _batchable(X, like, budget):
            replies[i] = one_client(X, message, context)
        elif not personal and not context.terms.releases(X.shape[0]):
            replies[i] = skipped_reply(message.kind, context.terms.below_floor)
        else:
            batch.append(i)
    groups, _ = set_groups([int(items[i][0].shape[0]) for i in batch], budget)
    for group in groups:
        members = [batch[j] for j in group]
        answers = _group_replies([items[i] for i in members], message.kind, t, config, workspace)
        for i, reply in zip(members, answers, strict=True):
            replies[i] = reply
    return replies  # type: ignore[return-value]


def _batchable(X: Any, like: Tensor, budget: int) -> bool:
    """Whether client rows ``X`` go into the batch: a 2-D tensor of ``like``'s dtype and
    device with rows, no more than ``budget``."""
    return (
        isinstance(X, Tensor)
        and X.ndim == 2
        and X.dtype == like.dtype
        and X.device == like.device
        and 0 < X.shape[0] <= budget
    )


def _log_weights(
    items: Sequence[tuple[Tensor, ClientContext]], t: dict[str, Tensor], personal: bool
) -> Tensor:
    """The log-weights of each client's E-step: (n_components,) the broadcast's, shared,
    where no client keeps its own, else (G, n_components) one per client (a client's kept
    personal weights outside differential privacy, else the broadcast's)."""
    default = t["weights"].log()
    own = [
        context.state.get("log_weights") if personal and context.terms.private is None else None
        for _, context in items
    ]
    if all(w is None for w in own):
        return default
    return torch.stack([default if w is None else w.to(default) for w in own])


def _group_replies(
    items: Sequence[tuple[Tensor, ClientContext]],
    kind: str,
    t: dict[str, Tensor],
    config: Any,
    workspace: Workspace,
) -> list[Message]:
    """The replies of one group of clients (module docstring)."""
    personal = config.mixture_weights == "personal"
    rows = [X for X, _ in items]
    terms = [context.terms for _, context in items]
    floors = [term.has_floor for term in terms]
    log_weights = _log_weights(items, t, personal)
    many = e_step_stats_many(
        rows,
        log_weights,
        t["means"],
        t["precisions_cholesky"],
        config.covariance_type,
        t["shift"],
        workspace,
        squared_counts=any(floors),
        row_log_likelihood=any(floors),
    )
    if personal:
        for (_, context), weights in zip(
            items, personal_log_weights_many(many.counts), strict=True
        ):
            context.state["log_weights"] = weights.clone()
    floor = _floor_values(many, terms) if any(floors) else None
    tied = config.covariance_type == "tied"
    # each client's tensors as views of the group's (unbind: one call, not one index each)
    counts, sums = many.counts.unbind(0), many.sums.unbind(0)
    second, n_samples = many.second.unbind(0), many.n_samples.unbind(0)
    log_likelihood = many.log_likelihood.unbind(0)
    if floor is not None:
        released, ll_rows, effective = (values.unbind(0) for values in floor)
    if not all(floors):
        everything = many.n_samples.unsqueeze(1).expand_as(many.counts).clone().unbind(0)
    out = []
    for j, term in enumerate(terms):
        n = int(rows[j].shape[0])
        if not term.releases(n):
            out.append(skipped_reply(kind, term.below_floor))
            continue
        tensors = {
            "counts": counts[j],
            "sums": sums[j],
            "second": second[j],
            "log_likelihood": log_likelihood[j],
            "n_samples": n_samples[j],
        }
        if not floors[j]:  # no floor: every component backed by the row count
            backing = _backing(everything[j], n_samples[j], None, tied)
            out.append(Message(kind, tensors, backing=backing))
            continue
        tensors["log_likelihood"] = released[j]
        tied_rows = None
        if tied and bool(_floor_mixed(effective[j], term.min_rows)):
            stats = SufficientStats(shift=t["shift"], covariance_type="tied", **tensors)
            lw = log_weights if log_weights.ndim == 1 else log_weights[j]
            stats, tied_rows = kept_tied_second(
                stats, rows[j], lw, t["means"], t["precisions_cholesky"], effective[j], term
            )
            tensors["second"] = stats.second
        backing = _backing(effective[j], n_samples[j], tied_rows, tied)
        backing["log_likelihood"] = ll_rows[j]
        out.append(Message(kind, tensors, backing=backing))
    return out


def _floor_mixed(rows: Tensor, min_rows: int) -> Tensor:
    """Whether some but not all components are backed by ``min_rows`` effective ``rows``
    (n_components,): a tied second moment is then recomputed from the kept ones."""
    keep = backed(rows, min_rows)
    return keep.any() & ~keep.all()


def _floor_values(many: StatsMany, terms: Sequence[Any]) -> tuple[Tensor, Tensor, Tensor]:
    """The group's released log-likelihoods (G,), the effective rows behind them (G,) and
    each component's effective rows (G, n_components), as each client's floor forms them."""
    assert many.squared is not None and many.row_log_likelihood is not None
    min_rows = torch.tensor([int(term.min_rows) for term in terms], dtype=torch.long)
    released, ll_rows = winsorised_sums_many(many.row_log_likelihood, many.lengths, min_rows)
    return released, ll_rows, effective_rows(many.counts, many.squared)


def _backing(
    rows: Tensor, n_samples: Tensor, tied_rows: Tensor | None, tied: bool
) -> dict[str, Tensor]:
    """What backs each tensor of a statistics reply
    (:func:`~fednovelty.federated.trust.backing.stats_backing`): ``rows`` (n_components,)
    the counts, sums and per-component second moments; a tied second moment (``tied``:
    statistics) ``tied_rows``, else the row count; the
    log-likelihood and row count ``n_samples`` (a () tensor)."""
    second = rows
    if tied:
        second = n_samples if tied_rows is None else torch.as_tensor(tied_rows).to(rows)
    return {
        "counts": rows,
        "sums": rows,
        "second": second,
        "log_likelihood": n_samples,
        "n_samples": n_samples,
    }
