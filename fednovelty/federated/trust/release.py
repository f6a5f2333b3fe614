"""The client gate's release: what of a client step's reply leaves the client.

:func:`release` is run by :func:`fednovelty.federated.trust.gate.answer`, which every engine
calls. A client step states the effective rows behind each tensor of its reply
(``Message.backing``, never sent; :mod:`~fednovelty.federated.trust.backing`) and its
``ReplySpec.backing`` says what kind of value it is. The gate refuses a reply with a whole
value below the client's floor (:class:`~fednovelty.federated.trust.privacy.PrivacyPolicy`),
with more grouped entries than the client's own configuration allows, or with a tensor nobody
classified or backed; it zeros or removes the entries below the floor.

Under a differential-privacy policy (``PrivacyPolicy.dp``) the floor gives way to the noise:
the reply leaves only in its declared private form, charged to the client's ledger by what it
costs (:func:`release_cost`), with the client's noise
(:func:`~fednovelty.federated.trust.dp_mechanism.private_reply`); a client with no rows
answers a round of a summed form with the noise alone, as any other client does.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace
from typing import Any

import torch
from torch import Tensor

from fednovelty.federated.core.declarations import RELEASE_TENSORS, ReplySpec
from fednovelty.federated.trust.backing import backed
from fednovelty.federated.trust.dp import charge, release_noise
from fednovelty.federated.trust.dp_mechanism import private_reply
from fednovelty.federated.trust.dp_sgd import HISTOGRAM_SHARE, DPSGDSettings, histogram_blocks
from fednovelty.federated.trust.dp_split import STAT_BLOCKS
from fednovelty.federated.trust.ledger import PrivacyLedger, gaussian_cost
from fednovelty.federated.trust.noise import add_gaussian
from fednovelty.federated.trust.privacy import PrivacyPolicy

#: the private forms a client with no rows answers with the noise alone.
SUMMED_FORMS = ("stats", "moments", "scatter")


def release(
    reply: Any,
    spec: ReplySpec,
    policy: PrivacyPolicy,
    config: Any,
    broadcast: Any,
    client: Any = None,
    rows_shape: tuple[int, ...] | None = None,
) -> Any:
    """The client gate: what of a client step's ``reply`` leaves the client.

    The one place every engine passes a reply through (``FederatedAlgorithm.answer``), and
    the one place a client adds differential-privacy noise. Pure: ``reply`` is not changed
    (the client's ledger records the noisy releases).

    ``reply.backing`` states, for every tensor of ``reply.tensors``, the effective rows
    behind it, and ``spec.backing`` what kind of value it is (:data:`BACKINGS`):

    - a backing of shape ``()`` backs the whole tensor (a ``"client"`` total, a learner, a
      statistic the step recomputed from the kept components such as a tied second
      moment); below ``policy.min_rows`` the reply is not released.
    - a backing of shape ``tensor.shape[:b]`` (``b >= 1``) backs each entry it indexes
      (component ``k``, class ``y``, bin ``b``, cell ``(m1, m2)``). Dimension 0 is the
      group; more entries than ``spec.limit(config, broadcast)`` allows refuse the reply
      (a limit may be a mapping from backing to limit where a reply has groups of two
      sizes, e.g. components and cluster rows).
      An entry below the floor is sent as zeros (``"components"``, ``"classes"``,
      ``"bins"``), removed (``"model"``: a local mixture's component, with the
      ``"weights"`` of the kept components renormalised), or refuses the reply
      (``"clusters"``: a cluster row's score of 0 would be read as a score, so a client
      never sends one it cannot back). When no entry of any grouped tensor is kept the
      reply is not released.
    - a tensor the declaration does not classify, or one without a stated backing, refuses
      the reply: what the gate cannot classify is not released.
    - under a differential-privacy policy (``policy.dp``) the floor gives way to the noise:
      the reply is released only in its declared private form (``spec.private``, else
      refused), within the client's budget of noisy releases (counted in ``ledger``, else
      refused), with the client's noise
      (:func:`~fednovelty.federated.trust.dp_mechanism.private_reply`); a tensor the release
      does not cover needs a declared private part (``spec.private_parts``): a histogram gets
      the counts' noise, learner weights leave only when the client's own ``dp_sgd`` trained
      them, for no more steps than it allows, and a withheld value leaves as zeros. A
      ``"parts"`` release covers no tensor itself: it is its parts, one noisy release of the
      client's budget.

    Args:
        reply: the client step's ``Message`` (``tensors`` with shapes per its kind,
            ``scalars``, ``backing``: name -> () or leading-shape tensor of effective rows).
        spec: the ``ReplySpec`` of the reply's kind.
        policy: the client's own ``PrivacyPolicy``.
        config: the client's own configuration (the algorithm's settings) for
            ``spec.limit``.
        broadcast: the message the reply answers.
        client: the client's :class:`~fednovelty.federated.trust.gate.ClientTerms` (its
            ``client_id`` and its ``ledger``, charged with every noisy release and replaced
            by the charged one), or ``None``:
            a one-off release from an empty ledger.
        rows_shape: the shape of the client's rows ``(n_samples, n_features)``; under a
            differential-privacy policy a client with no rows answers a ``"stats"``,
            ``"moments"`` or ``"scatter"`` round with the noise alone (zeros of the declared
            shapes through the private form), like any other client, instead of skipping:
            a skip would tell the server it has no rows.

    Returns:
        The released ``Message`` (same kind and scalars, tensors floored, no ``backing``),
        or a skipped reply whose reason names the tensor (or the limit) that stopped it.
        A skipped reply passes as it is (without ``backing``).
    """
    if reply.scalars.get("skipped"):
        empty = _empty_reply(reply, spec, policy, config, broadcast, rows_shape)
        if empty is None:
            return type(reply)(reply.kind, scalars=dict(reply.scalars))
        reply = empty
    where = f"the client's {reply.kind!r} reply"
    unclassified = sorted(name for name in reply.tensors if spec.backing_of(name) is None)
    if unclassified:
        return _refused(
            reply,
            f"{where} holds {unclassified}, which its declaration does not classify; not released",
        )
    unbacked = sorted(set(reply.tensors) - set(reply.backing))
    if unbacked:
        return _refused(reply, f"{where} states no backing for {unbacked}; not released")
    limits = None if spec.limit is None else spec.limit(config, broadcast)
    if policy.dp is not None:
        return _private(reply, spec, policy, config, broadcast, limits, client)
    floor = policy.min_rows
    tensors: dict[str, Tensor] = {}
    grouped_kept: list[bool] = []
    removed: dict[str, Tensor] = {}
    # (id of a backing, device) -> (kept entries, all kept, any kept): tensors that share a
    # backing (a component's counts, sums and second moment) share its verdict
    verdicts: dict[tuple[int, torch.device], tuple[Tensor, bool, bool]] = {}
    for name, value in reply.tensors.items():
        rows = torch.as_tensor(reply.backing[name], dtype=torch.float64)
        kind = spec.backing_of(name)
        if rows.ndim == 0:
            if not bool(backed(rows, floor)):
                return _refused(
                    reply,
                    f"{where}: {name!r} is backed by {float(rows):.3g} "
                    f"effective rows, below the client's floor min_rows={floor}",
                )
            tensors[name] = value
            continue
        if tuple(rows.shape) != tuple(value.shape[: rows.ndim]):
            return _refused(
                reply,
                f"{where}: the backing of {name!r} has shape "
                f"{tuple(rows.shape)}, which does not index its shape "
                f"{tuple(value.shape)}; not released",
            )
        limit = limits.get(kind) if isinstance(limits, Mapping) else limits
        if limit is not None and rows.shape[0] > limit:
            return _refused(
                reply,
                f"{where}: {name!r} has {rows.shape[0]} {kind} entries, more "
                f"than the client's own configuration allows ({limit})",
            )
        key = (id(reply.backing[name]), value.device)
        if key not in verdicts:
            keep = backed(rows, floor).to(value.device)
            verdicts[key] = (keep, bool(keep.all()), bool(keep.any()))
        keep, all_kept, any_kept = verdicts[key]
        if kind == "clusters" and not all_kept:
            return _refused(
                reply,
                f"{where}: an entry of {name!r} is backed by "
                f"{float(rows.min()):.3g} effective rows, below the client's floor "
                f"min_rows={floor}",
            )
        grouped_kept.append(any_kept)
        if kind == "model" and rows.ndim == 1:
            removed[name] = keep
            tensors[name] = value[keep]
        elif all_kept:  # every entry backed: the tensor as it is (value * 1)
            tensors[name] = value
        else:  # blanked entries are +0.0: a product with 0 keeps the sign (-0.0)
            mask = keep.reshape(*keep.shape, *[1] * (value.ndim - keep.ndim))
            tensors[name] = torch.where(mask, value, torch.zeros((), dtype=value.dtype))
    if grouped_kept and not any(grouped_kept):
        return _refused(
            reply, f"{where}: no entry is backed by the client's floor min_rows={floor}"
        )
    if "weights" in removed and tensors["weights"].numel():
        tensors["weights"] = tensors["weights"] / tensors["weights"].sum()
    return type(reply)(reply.kind, _unsigned_zeros(tensors), dict(reply.scalars))


def _private(
    reply: Any,
    spec: ReplySpec,
    policy: PrivacyPolicy,
    config: Any,
    broadcast: Any,
    limits: Any,
    client: Any,
) -> Any:
    """:func:`release` under a differential-privacy policy (its docstring)."""
    dp = policy.dp
    where = f"the client's {reply.kind!r} reply"
    if spec.private is None:
        return _refused(
            reply,
            f"{where} has no private form (its declaration states none); not released "
            "under the client's differential-privacy policy",
        )
    for name, value in reply.tensors.items():
        rows = reply.backing[name]
        kind = spec.backing_of(name)
        limit = limits.get(kind) if isinstance(limits, Mapping) else limits
        if torch.as_tensor(rows).ndim and limit is not None and value.shape[0] > limit:
            return _refused(
                reply,
                f"{where}: {name!r} has {value.shape[0]} {kind} entries, more "
                f"than the client's own configuration allows ({limit})",
            )
    covered = RELEASE_TENSORS.get(spec.private)
    if covered is not None:
        loose = sorted(n for n in reply.tensors if n not in covered and not spec.private_part(n))
        if loose:
            return _refused(
                reply,
                f"{where} holds {loose}, which its {spec.private!r} release does not cover "
                "and no private part declares; not released",
            )
    if any(spec.private_part(n) == "dp_sgd" for n in reply.tensors):
        refusal = _dp_sgd_refusal(reply, policy.dp_sgd)
        if refusal is not None:
            return _refused(reply, f"{where}: {refusal}; not released")
    blocks = release_cost(reply, spec)
    if blocks is None:
        return _refused(reply, f"{where} states no noisy releases (dp_releases); not released")
    sgd = None
    if any(spec.private_part(n) == "dp_sgd" for n in reply.tensors):
        settings = policy.dp_sgd
        sgd = (settings.noise_multiplier, settings.sample_rate, int(reply.scalars["dp_sgd_steps"]))
    ledger = PrivacyLedger() if client is None else client.ledger
    charged = charge(ledger, dp, blocks, sgd)
    if charged is None:
        return _refused(
            reply,
            f"{where}: the client's privacy budget is spent (epsilon={dp.epsilon:g} at "
            f"delta={dp.delta:g}; this release would take it to "
            f"{ledger.after(gaussian_cost(dp.noise_multiplier, blocks), sgd).epsilon(dp.delta):.4g}"
            "); not released",
        )
    source = release_noise(dp, 0 if client is None else client.client_id, ledger.releases)
    if client is not None:
        client.ledger = charged
    if spec.private == "parts":  # no statistics: every tensor is a declared part
        tensors = dict(reply.tensors)
    else:
        tensors = private_reply(
            spec.private,
            reply.tensors,
            broadcast,
            getattr(config, "covariance_type", None),
            dp.client_noise,
            dp.clip_norm,
            source,
        )
    for name in tensors:
        part = spec.private_part(name)
        if part == "histogram" and dp.client_noise > 0:
            spread = HISTOGRAM_SHARE * dp.client_noise
            tensors[name] = add_gaussian(tensors[name], spread, source)
        elif part == "withheld":
            tensors[name] = torch.zeros_like(tensors[name])
    return type(reply)(reply.kind, tensors, dict(reply.scalars))


def release_cost(reply: Any, spec: ReplySpec) -> float | None:
    """The Gaussian mechanisms of the policy's multiplier ``z`` one private release of
    ``reply`` amounts to: the blocks of summed statistics (:data:`~fednovelty.federated.trust.dp.
    STAT_BLOCKS`) once for a ``"stats"``, ``"moments"`` or ``"scatter"`` release, once per
    stated iteration (``dp_releases``) of a private ``"fit"``, none for ``"parts"``; plus a
    released histogram's share (:func:`~fednovelty.federated.trust.dp_sgd.histogram_blocks`) for
    each ``"histogram"`` part. ``None``: a ``"fit"`` that states no iterations."""
    releases = 0 if spec.private == "parts" else 1
    if spec.private == "fit":
        releases = reply.scalars.get("dp_releases")
        if isinstance(releases, bool) or not isinstance(releases, int) or releases < 1:
            return None
    histograms = sum(1 for n in reply.tensors if spec.private_part(n) == "histogram")
    return len(STAT_BLOCKS) * releases + histogram_blocks(histograms)


def _dp_sgd_refusal(reply: Any, sgd: DPSGDSettings | None) -> str | None:
    """Why learner weights may not leave under DP, or ``None``: the client's own policy
    must have DP-SGD (``PrivacyPolicy.dp_sgd``) and the reply must state the steps it ran,
    no more than that policy's round allows."""
    steps = reply.scalars.get("dp_sgd_steps")
    if sgd is None:
        return "its learners were not trained by DP-SGD (the client's policy has no dp_sgd)"
    allowed = sgd.steps
    if isinstance(steps, bool) or not isinstance(steps, int) or not 0 <= steps <= allowed:
        return f"it states {steps!r} DP-SGD steps; the client's settings allow 0..{allowed}"
    return None


def _empty_reply(
    reply: Any,
    spec: ReplySpec,
    policy: PrivacyPolicy,
    config: Any,
    broadcast: Any,
    rows_shape: tuple[int, ...] | None,
) -> Any:
    """Under a differential-privacy policy, the reply of a client with no rows to a round of
    a summed private form: zeros of the declared shapes, each backed by no row, for the gate
    to release with its noise; ``None`` otherwise (the skip stands)."""
    if policy.dp is None or rows_shape is None or rows_shape[0] != 0 or broadcast is None:
        return None
    if spec.private not in SUMMED_FORMS:
        return None
    # the broadcast's expectations are the server's (never sent): the client's own config
    known = {"covariance_type": getattr(config, "covariance_type", None)}
    expect = {k: v for k, v in known.items() if v is not None}
    probe = replace(broadcast, expect={**expect, **dict(broadcast.expect)})
    try:
        shapes = spec.shapes(probe, int(rows_shape[1]))
    except (KeyError, TypeError, ValueError):  # shapes the client cannot tell: skip stands
        return None
    if any(not isinstance(n, int) for shape in shapes.values() for n in shape):
        return None
    dtype = getattr(config, "dtype", torch.float64)
    device = getattr(config, "device", torch.device("cpu"))
    tensors = {
        name: torch.zeros(tuple(shape), dtype=dtype, device=device)
        for name, shape in shapes.items()
    }
    nothing = torch.tensor(0.0, dtype=torch.float64)
    return type(reply)(reply.kind, tensors, {}, backing=dict.fromkeys(tensors, nothing))


def _refused(reply: Any, reason: str) -> Any:
    """A skipped reply of ``reply``'s kind (and its message class) giving ``reason``."""
    return type(reply)(reply.kind, scalars={"skipped": True, "reason": reason})


def _unsigned_zeros(tensors: dict[str, Tensor]) -> dict[str, Tensor]:
    """``tensors`` with every ``-0.0`` made ``+0.0`` (``x + 0.0``; other values unchanged):
    a zero a step or the floor left behind tells nothing by its sign."""
    return {n: t + 0.0 if t.is_floating_point() else t for n, t in tensors.items()}
