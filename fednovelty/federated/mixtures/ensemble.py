"""Ensembles of one-round federated mixtures: FedGenGMM fitted on feature subsets.

Member ``m`` is FedGenGMM's one round (:mod:`fednovelty.federated.mixtures.fedgengmm`) on
the columns ``subsets[m]``: the same client step, reply (``local_fit``, one declaration for
both gates) and server step, on the client's rows projected onto the member's columns
(:meth:`MemberFits.rows`; the round's ``expect["n_features"]`` is the subset's width, so the
server gate checks shapes against it). The subsets are public plan, not privacy randomness:
member 0 sees every column, each later member a subset drawn from ``random_state``
(:func:`feature_subsets`; widths uniform between ``ceil(lo * d)`` and below ``hi * d`` for
``feature_fraction=(lo, hi)``; ``(1, 1)``: every column), held in the settings by client and
server alike. Member 0 runs with the ensemble's ``random_state``, member ``m > 0`` with
``derived_seed(random_state, MEMBER_SALT + m)``: one member is FedGenGMM exactly. (On 6
ADBench sets x 2 seeds x both protocols, ensembles with the full-column member scored
above those of subsets alone: ``docs/ensembles.md``.)

The members' rounds read nothing of each other (a deployment may run them at once); here
they run one after another, ``n_members`` rounds.

Combination (:func:`ensemble_scores`): each member's anomaly score is ``-log p_m(x_S_m)``.
With ``combine="zscore"`` one more round (:class:`ScoreMoments`, kind ``score_moments``)
makes them comparable: the server sends the members' mixtures, each client replies its row
count and, per member, the sum and sum of squares of its training rows' scores (2 numbers a
member and the count, each a whole-client value held to the client's floor by the gate);
the server sums them into the pooled training scores' mean and standard deviation, and the
ensemble's score is the mean over members of ``(score_m - mean_m) / std_m``.
``combine="mean"`` averages the raw scores (the sum of the members' log-densities up to a
factor) and runs no extra round.

Privacy: each member's round is FedGenGMM's (floor, components backed by their rows); the
moments round's reply is backed by all of the client's rows (a client below its floor
skips). The moments reply has no differentially private form: a client under a
differential-privacy policy refuses it.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
from torch import Tensor

from fednovelty.federated.core.base import (
    ClientContext,
    Message,
    Scalar,
    derived_seed,
    skipped_reply,
)
from fednovelty.federated.core.config import settings_dataclass
from fednovelty.federated.core.declarations import InvalidReplyError, ReplySpec, declare
from fednovelty.federated.core.steps import ChainedAlgorithm, Step
from fednovelty.federated.mixtures.fedgengmm import (
    LOCAL_FIT_REPLY,
    FedGenConfig,
    FedGenGMM,
    FedGenState,
)
from fednovelty.federated.trust.backing import client_backing
from fednovelty.federated.trust.reply_form import expectation
from fednovelty.federated.trust.value_checks import relative_tolerance
from fednovelty.mixture import MixtureParams, score_samples

#: salt of member ``m``'s seed (``m > 0``) and of the subsets' draw.
MEMBER_SALT = 0xE45E
SUBSET_SALT = 0x5B5E
#: how the members' scores are combined (module docstring).
COMBINE_CHOICES = ("zscore", "mean")
#: the message kind of the moments round.
MOMENTS_KIND = "score_moments"


def subset_sizes(n_features: int, feature_fraction: tuple[float, float]) -> tuple[int, int]:
    """Smallest and largest subset width for rows ``n_features`` wide: from
    ``ceil(lo * d)`` to the largest width below ``hi * d`` (at least the smallest;
    ``hi = 1``: ``d - 1``, or ``d`` where ``lo = 1``), within ``[1, d]``."""
    lo, hi = feature_fraction
    smallest = min(n_features, max(1, math.ceil(lo * n_features - 1e-9)))
    largest = max(smallest, math.ceil(hi * n_features - 1e-9) - 1)
    return smallest, min(largest, n_features)


def feature_subsets(
    n_features: int, n_members: int, feature_fraction: tuple[float, float], random_state: int
) -> list[list[int]]:
    """Each member's columns, sorted: every column for member 0; for the others widths
    uniform in :func:`subset_sizes`, columns drawn without replacement, from
    ``random_state`` alone (public plan). Returns ``n_members`` lists of column indices."""
    smallest, largest = subset_sizes(n_features, feature_fraction)
    rng = np.random.default_rng([int(random_state), SUBSET_SALT])
    subsets = [list(range(n_features))]
    for _ in range(n_members - 1):
        width = int(rng.integers(smallest, largest + 1))
        if width == n_features:
            subsets.append(list(range(n_features)))
        else:
            subsets.append(sorted(int(j) for j in rng.choice(n_features, width, replace=False)))
    return subsets


def member_seed(random_state: int, member: int) -> int:
    """The seed of member ``member``'s round: ``random_state`` for member 0 (so that one
    member is FedGenGMM), ``derived_seed(random_state, MEMBER_SALT + member)`` after."""
    return int(random_state) if member == 0 else derived_seed(random_state, MEMBER_SALT + member)


@settings_dataclass
class EnsembleConfig(FedGenConfig):
    """FedGenGMM's settings (:class:`FedGenConfig`, every member's) and

    Attributes:
        n_features: width of the federation's rows (the subsets are drawn for it; >= 1).
        n_members: members (>= 1), member 0 on every column.
        feature_fraction: ``(lo, hi)``, ``0 < lo <= hi <= 1``: later members' widths from
            ``ceil(lo * d)`` to below ``hi * d`` (:func:`subset_sizes`).
        combine: ``"zscore"`` (one moments round; module docstring) or ``"mean"``.
    """

    n_features: int = 1
    n_members: int = 4
    feature_fraction: tuple[float, float] = (0.5, 1.0)
    combine: str = "zscore"

    def __post_init__(self) -> None:
        super().__post_init__()
        for name in ("n_features", "n_members"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int | np.integer) or value < 1:
                raise ValueError(f"{name} must be an int >= 1; got {value!r}.")
            self._set(name, int(value))
        self._set("feature_fraction", check_fraction(self.feature_fraction))
        self._check_choice("combine", COMBINE_CHOICES)

    def subsets(self) -> list[list[int]]:
        """Every member's columns (:func:`feature_subsets`)."""
        return feature_subsets(
            self.n_features, self.n_members, self.feature_fraction, self.random_state
        )

    def member_config(self, member: int) -> FedGenConfig:
        """FedGenGMM's settings of member ``member``: these, with its seed."""
        names = {f.name for f in dataclasses.fields(FedGenConfig)}
        values = {name: getattr(self, name) for name in names}
        return FedGenConfig(**{**values, "random_state": member_seed(self.random_state, member)})


def check_fraction(feature_fraction: Any) -> tuple[float, float]:
    """``feature_fraction`` as ``(lo, hi)`` floats with ``0 < lo <= hi <= 1``.

    Raises:
        ValueError: anything else, naming ``feature_fraction``.
    """
    try:
        lo, hi = (float(v) for v in feature_fraction)
    except (TypeError, ValueError):
        lo = hi = math.nan
    if not 0.0 < lo <= hi <= 1.0:
        raise ValueError(
            "feature_fraction must be (lo, hi) with 0 < lo <= hi <= 1 (shares of the "
            f"columns a member sees, e.g. (0.5, 1.0)); got {feature_fraction!r}."
        )
    return lo, hi


@dataclass
class EnsembleState:
    """Server state of :class:`FedEnsemble`.

    Attributes:
        phase: the next round's kind (``local_fit``, ``score_moments``) or ``done``.
        rounds: rounds run.
        members: each finished member's FedGenGMM state (its ``params`` on its columns).
        score_mean, score_std: (n_members,) the pooled training rows' mean and standard
            deviation of each member's score (``combine="zscore"``), else ``None``.
        n_rows: training rows behind them.
    """

    phase: str = "local_fit"
    rounds: int = 0
    members: list[FedGenState] = field(default_factory=list)
    score_mean: Tensor | None = None
    score_std: Tensor | None = None
    n_rows: float = 0.0


class MemberFits(Step):
    """The members' rounds: member ``m``'s is FedGenGMM's round on ``subsets[m]``."""

    kinds = ("local_fit",)
    replies = declare(LOCAL_FIT_REPLY)

    def __init__(self, config: EnsembleConfig) -> None:
        super().__init__(config)
        self.subsets = config.subsets()
        self.members = [
            FedGenGMM.from_config(config.member_config(m)) for m in range(config.n_members)
        ]
        self.max_rounds = config.n_members

    def configure(self, state: EnsembleState) -> Message:
        member = len(state.members)
        message = self.members[member].configure(FedGenState())
        return Message(
            message.kind,
            dict(message.tensors),
            {**message.scalars, "member": member},
            expect={**message.expect, "n_features": len(self.subsets[member])},
        )

    def rows(self, X: Tensor, message: Message, context: ClientContext) -> Tensor:
        """The client's rows on member ``message.scalars["member"]``'s columns."""
        columns = self.subsets[int(message.scalars["member"])]
        if len(columns) == X.shape[1]:
            return X
        return X[:, torch.as_tensor(columns, device=X.device)]

    def client_step(self, X: Tensor, message: Message, context: ClientContext) -> Message:
        return self.members[int(message.scalars["member"])].client_step(X, message, context)

    def server_step(
        self, state: EnsembleState, replies: dict[int, Message]
    ) -> tuple[str | None, dict[str, Scalar]]:
        member = len(state.members)
        fitted, metrics = self.members[member].server_step(FedGenState(), replies)
        state.members.append(fitted)
        following = "local_fit" if len(state.members) < self.config.n_members else None
        return following, {**metrics, "member": member}

    def broadcast(self, state: EnsembleState) -> tuple[dict[str, Tensor], dict[str, Scalar]]:
        """The members' mixtures (``member.{m}.weights``, ...) for the moments round."""
        tensors = {}
        for m, fitted in enumerate(state.members):
            for name, value in fitted.params.tensors().items():
                tensors[f"member.{m}.{name}"] = value
        return tensors, {}


def member_params(message: Message, member: int, covariance_type: str) -> MixtureParams:
    """Member ``member``'s mixture from a moments round's ``message``."""
    t = message.tensors
    prefix = f"member.{member}."
    return MixtureParams(
        t[prefix + "weights"],
        t[prefix + "means"],
        t[prefix + "precisions_cholesky"],
        covariance_type,
    )


def member_scores(params: list[MixtureParams], subsets: list[list[int]], X: Tensor) -> Tensor:
    """Each member's anomaly score ``-log p_m(x_S_m)`` of rows ``X`` (n_samples, n_features):
    shape (n_members, n_samples)."""
    out = []
    for mixture, columns in zip(params, subsets, strict=True):
        rows = X if len(columns) == X.shape[1] else X[:, torch.as_tensor(columns, device=X.device)]
        out.append(-score_samples(mixture.to(device=X.device, dtype=X.dtype), rows))
    return torch.stack(out)


def ensemble_scores(
    scores: Tensor, combine: str, mean: Tensor | None = None, std: Tensor | None = None
) -> Tensor:
    """The ensemble's anomaly score (n_samples,) from the members' ``scores`` (n_members,
    n_samples): their mean after ``(score - mean) / std`` per member (``"zscore"``; ``mean``
    and ``std`` (n_members,)), or their plain mean (``"mean"``)."""
    if combine == "zscore":
        scores = (scores - mean[:, None].to(scores)) / std[:, None].to(scores)
    return scores.mean(0)


def moments_shapes(broadcast: Message, d: int) -> dict[str, tuple]:
    """A moments reply: the row count and, per member, the sum and the sum of squares of
    the training rows' scores (``expect["n_members"]``)."""
    members = int(expectation(broadcast, "n_members"))
    return {"n_samples": (), "score_sums": (members,), "score_squares": (members,)}


def check_moments(reply: Message, broadcast: Message) -> None:
    """Sums of squares some scores could have: ``n * squares >= sums**2`` (Cauchy-Schwarz),
    to the dtype's tolerance.

    Raises:
        InvalidReplyError: naming ``'score_squares'``.
    """
    n = float(reply.tensors["n_samples"])
    sums = reply.tensors["score_sums"].double()
    squares = reply.tensors["score_squares"].double()
    tol = relative_tolerance(reply.tensors["score_squares"].dtype)
    if bool((squares < 0).any()) or bool((n * squares < sums**2 * (1 - tol) - tol).any()):
        raise InvalidReplyError(
            "tensor 'score_squares' is below what the score sums allow (n * squares < "
            "sums**2): no scores have these moments."
        )


#: a moments reply: whole-client values (all of the client's rows back them).
MOMENTS_REPLY = ReplySpec(
    MOMENTS_KIND,
    shapes=moments_shapes,
    checks=(check_moments,),
    backing={"n_samples": "client", "score_sums": "client", "score_squares": "client"},
)


class ScoreMoments(Step):
    """The moments round of ``combine="zscore"`` (module docstring)."""

    kinds = (MOMENTS_KIND,)
    replies = declare(MOMENTS_REPLY)

    def __init__(self, config: EnsembleConfig) -> None:
        super().__init__(config)
        self.subsets = config.subsets()

    def begin(self, state: EnsembleState) -> str | None:
        return MOMENTS_KIND if self.config.combine == "zscore" else None

    def configure(self, state: EnsembleState) -> Message:
        return Message(MOMENTS_KIND, expect={"n_members": self.config.n_members})

    def client_step(self, X: Tensor, message: Message, context: ClientContext) -> Message:
        n = X.shape[0]
        if not context.terms.releases(n):
            return skipped_reply(MOMENTS_KIND, context.terms.below_floor)
        ct = self.config.covariance_type
        params = [member_params(message, m, ct) for m in range(self.config.n_members)]
        scores = member_scores(params, self.subsets, X).double()
        tensors = {
            "n_samples": torch.tensor(float(n), dtype=X.dtype),
            "score_sums": scores.sum(1).to(X.dtype),
            "score_squares": (scores**2).sum(1).to(X.dtype),
        }
        return Message(
            MOMENTS_KIND, tensors, {"skipped": False}, backing=client_backing(tensors, n)
        )

    def server_step(
        self, state: EnsembleState, replies: dict[int, Message]
    ) -> tuple[None, dict[str, Scalar]]:
        n = sum(float(r.tensors["n_samples"]) for r in replies.values())
        sums = sum(r.tensors["score_sums"].double().cpu() for r in replies.values())
        squares = sum(r.tensors["score_squares"].double().cpu() for r in replies.values())
        mean = sums / n
        variance = (squares / n - mean**2).clamp_min(0.0)
        state.score_mean, state.score_std, state.n_rows = mean, pooled_std(variance, mean), n
        return None, {"phase": MOMENTS_KIND, "n_rows": n}


def pooled_std(variance: Tensor, mean: Tensor) -> Tensor:
    """Standard deviations (n_members,) from ``variance``, a member whose training scores
    are all equal (variance 0, or below float64 round-off of ``mean**2``) taking 1."""
    floor = 1e-12 * mean.abs().clamp_min(1.0) ** 2
    return torch.where(variance > floor, variance.sqrt(), torch.ones_like(variance))


class FedEnsemble(ChainedAlgorithm):
    """An ensemble of FedGenGMM fits on feature subsets (module docstring):
    ``FedEnsemble(**settings)`` with the settings of :class:`EnsembleConfig`."""

    config_class = EnsembleConfig

    def __init__(self, **settings: Any) -> None:
        self._setup(EnsembleConfig(**settings))

    def _setup(self, config: EnsembleConfig) -> None:
        super()._setup(config)
        self._chain([MemberFits(config), ScoreMoments(config)])

    def new_state(self) -> EnsembleState:
        return EnsembleState()

    def subsets(self) -> list[list[int]]:
        """Every member's columns."""
        return self.steps[0].subsets
