"""Private feature bounds: per-feature low and high quantiles of the pooled rows, from noisy
histograms, in two rounds (:class:`PrivateBoundsStep`).

A private fit maps rows to a box before it clips them (``init.MomentsSettings.bounds``); a
box taken from the rows would leak them. Each client counts its rows per feature in the bins
of a grid the server broadcasts and releases the counts as histogram parts that the client
gate noises and charges (``ReplySpec.private_parts``); the server sums them and reads each
feature's quantiles (:func:`quantile_bounds`). The first grid is public, symmetric and
log-scale (:func:`log_grid`: ``+-max_abs``, never the data); the second is linear between
the first round's bounds (:func:`linear_grid`, post-processing of a private result).
:class:`PrivateBounds` runs the step alone, before the family's own algorithm: its rows are
neither mapped nor clipped, which a chained step's would be.

The module sits beside ``init.py``, whose steps prepare a fit the same way: every family
that works in a public box (federated EM, variational Bayes, FedGenGMM, the joint model)
takes its bounds from here when the user has none.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, ClassVar

import torch
from scipy.special import ndtri
from torch import Tensor

from fednovelty.federated.core.base import (
    ClientContext,
    FederatedAlgorithm,
    Message,
    Scalar,
    skipped_reply,
)
from fednovelty.federated.core.config import Settings, at_least, settings_dataclass
from fednovelty.federated.core.declarations import ReplySpec, declare
from fednovelty.federated.core.steps import Step
from fednovelty.federated.trust.backing import client_backing
from fednovelty.federated.trust.dp import MODES, server_noise
from fednovelty.federated.trust.dp_sgd import HISTOGRAM_SHARE
from fednovelty.federated.trust.noise import add_gaussian

#: the message kind of the bounds round.
BOUNDS_KIND = "private_bounds"
#: the name of each released copy of the histogram (``histogram.0``, ``histogram.1``, ...).
COPY_PREFIX = "histogram."
#: the grid's default: magnitudes up to ``MAX_ABS`` over ``DECADES`` decades (down to
#: ``MAX_ABS * 10**-DECADES``) with ``PER_DECADE`` bins per decade on each sign.
MAX_ABS, DECADES, PER_DECADE = 1e6, 12, 4
#: the default quantiles: the bounds are the ``QUANTILE`` and ``1 - QUANTILE`` quantiles.
QUANTILE = 0.01
#: the chance that any bin of a noisy histogram holding no row passes the noise threshold
#: (:func:`noise_threshold`).
FALSE_BIN_RATE = 0.05
#: the second round's bins between the first round's bounds (0: no second round).
REFINE_BINS = 32


def log_grid(max_abs: float = MAX_ABS, decades: int = DECADES, per_decade: int = PER_DECADE):
    """The public grid's interior edges, (E,) float64 with ``E = 2 (decades * per_decade +
    1) + 1``: ``0``, ``+-max_abs * 10**(-k / per_decade)`` for ``k = 0 .. decades *
    per_decade``. Its ``E + 1`` bins: ``(-inf, -max_abs)``, ..., ``[-m, 0)``, ``[0, m)``,
    ..., ``[max_abs, inf)`` (``m = max_abs * 10**-decades``); a bin spans a factor
    ``10**(1 / per_decade)`` of magnitude.

    Raises:
        ValueError: ``max_abs`` not a positive finite number, or ``decades`` or
            ``per_decade`` below 1.
    """
    if not (isinstance(max_abs, int | float) and math.isfinite(max_abs) and max_abs > 0):
        raise ValueError(f"max_abs must be a positive finite number; got {max_abs!r}.")
    if int(decades) < 1 or int(per_decade) < 1:
        raise ValueError(
            f"decades and per_decade must be >= 1; got {decades!r} and {per_decade!r}."
        )
    steps = torch.arange(int(decades) * int(per_decade) + 1, dtype=torch.float64)
    positive = float(max_abs) * 10.0 ** (-(steps.flip(0)) / int(per_decade))
    return torch.cat([-positive.flip(0), positive.new_zeros(1), positive])


def bin_ends(edges: Tensor, below: Tensor, above: Tensor) -> tuple[Tensor, Tensor]:
    """The lower and upper end of each bin of per-feature grids ``edges`` (d, E): ``(d, E +
    1)`` each, the outer bins ending at ``below`` and ``above`` (d,) (a grid step beyond the
    outermost edges: :func:`log_ends`, :func:`linear_grid`)."""
    low = torch.cat([below.reshape(-1, 1).to(edges), edges], 1)
    high = torch.cat([edges, above.reshape(-1, 1).to(edges)], 1)
    return low, high


def log_ends(edges: Tensor, per_decade: int) -> tuple[Tensor, Tensor]:
    """The outer ends of log grids ``edges`` (..., E): ``-+max_abs * 10**(1 / per_decade)``,
    (...) each."""
    outer = edges[..., -1] * 10.0 ** (1.0 / int(per_decade))
    return -outer, outer


def linear_grid(low: Tensor, high: Tensor, bins: int) -> tuple[Tensor, Tensor, Tensor]:
    """``bins`` equal bins between ``low`` and ``high`` (d,) per feature: the edges (d, bins +
    1) and the outer ends one bin beyond (d,) each."""
    steps = torch.linspace(0.0, 1.0, int(bins) + 1, dtype=torch.float64)
    width = (high - low).to(torch.float64)
    edges = low.to(torch.float64).unsqueeze(1) + width.unsqueeze(1) * steps
    return edges, low - width / bins, high + width / bins


def feature_histogram(X: Tensor, edges: Tensor) -> Tensor:
    """Each feature's row counts in the bins of its grid: rows (n, d) and edges (d, E), or
    one grid (E,) for every feature, -> (d, E + 1) float64; bin ``j`` of feature ``f`` holds
    the rows with ``edges[f, j - 1] <= x_f < edges[f, j]``."""
    d, n = X.shape[1], X.shape[0]
    grid = edges.to(X.device, torch.float64)
    grid = grid.expand(d, -1) if grid.ndim == 1 else grid
    index = torch.searchsorted(grid.contiguous(), X.to(torch.float64).T.contiguous(), right=True)
    counts = torch.zeros(d, grid.shape[1] + 1, dtype=torch.float64, device=X.device)
    ones = torch.ones(d, n, dtype=torch.float64, device=X.device)
    return counts.scatter_add_(1, index, ones)


def histogram_noise(noise_multiplier: float, copies: int, mode: str, n_replies: int) -> float:
    """The standard deviation of the noise on each entry of the released histogram (weighted
    by ``1 / sqrt(d)`` per row and feature, so a row moves it by at most 1 in L2), averaged
    over ``copies`` copies and summed over ``n_replies`` clients: every copy carries the
    gate's histogram noise ``HISTOGRAM_SHARE * z`` (the client's all of it in ``"local"``
    mode, a ``1 / m`` share of the variance in ``"distributed"``, the server's in
    ``"central"``), so the average carries ``HISTOGRAM_SHARE * z / sqrt(copies)``, times
    ``sqrt(n_replies)`` in ``"local"`` mode.

    Raises:
        ValueError: an unknown ``mode``, ``copies`` or ``n_replies`` below 1.
    """
    if mode not in MODES:
        raise ValueError(f"mode must be one of {MODES}; got {mode!r}.")
    if int(copies) < 1 or int(n_replies) < 1:
        raise ValueError(f"copies and n_replies must be >= 1; got {copies!r}, {n_replies!r}.")
    spread = HISTOGRAM_SHARE * float(noise_multiplier) / math.sqrt(int(copies))
    return spread * math.sqrt(int(n_replies)) if mode == "local" else spread


def noise_threshold(n_bins: int) -> float:
    """How many noise standard deviations a bin's noisy count must exceed to be read as
    holding rows: ``Phi^-1(1 - FALSE_BIN_RATE / n_bins)`` (Bonferroni over the ``n_bins``
    bins of all features), so that with probability at least ``1 - FALSE_BIN_RATE`` no
    empty bin passes (4.1 standard deviations for 1,000 bins, 4.6 for 16,600)."""
    return float(-ndtri(FALSE_BIN_RATE / max(1, int(n_bins))))


def quantile_bounds(
    counts: Tensor,
    noise: float,
    ends: tuple[Tensor, Tensor],
    quantile: float = QUANTILE,
) -> tuple[Tensor, Tensor]:
    """Each feature's bounds from its noisy bin counts (post-processing, no privacy cost).

    The bins whose count exceeds :func:`noise_threshold` times ``noise`` are read as
    holding rows (where none does, the largest count's bin alone); of their counts, the
    bounds are the lower end of the bin holding the ``quantile`` quantile and the upper end
    of the bin holding the ``1 - quantile`` quantile. With many rows (every bin of the true
    quantiles' neighbourhood above the threshold) the bounds cover the true quantiles and
    are within one bin of them; with few rows, the bins of the bulk of the rows.

    Args:
        counts: (d, G) noisy row counts per feature and bin.
        noise: the standard deviation of the noise on each count (>= 0).
        ends: the bins' lower and upper ends, (d, G) each (:func:`bin_ends`).
        quantile: in (0, 0.5).

    Returns:
        ``(low, high)``, (d,) float64 each, ``low < high``, and ``kept`` (d,): the share of
        each feature's noisy row count in the bins read as holding rows.

    Raises:
        ValueError: ``quantile`` outside (0, 0.5), or ``ends`` not of ``counts``' bins.
    """
    if not 0 < float(quantile) < 0.5:
        raise ValueError(f"quantile must be in (0, 0.5); got {quantile!r}.")
    lower, upper = (e.to(torch.float64) for e in ends)
    if lower.shape != counts.shape or upper.shape != lower.shape:
        raise ValueError(
            f"ends must give the {tuple(counts.shape)} bins' lower and upper ends; got "
            f"{tuple(lower.shape)} and {tuple(upper.shape)}."
        )
    counts = counts.to(torch.float64)
    kept = torch.where(counts > noise_threshold(counts.numel()) * float(noise), counts, 0.0)
    share = kept.sum(1) / counts.sum(1).clamp_min(1.0)
    empty = kept.sum(1) <= 0
    if bool(empty.any()):  # no bin above the noise: the largest count's bin alone
        top = torch.nn.functional.one_hot(counts.argmax(1), counts.shape[1]).to(counts)
        kept = torch.where(empty.unsqueeze(1), top, kept)
    cumulative = kept.cumsum(1)
    total = cumulative[:, -1:]
    first = (cumulative > float(quantile) * total).to(torch.int64).argmax(1, keepdim=True)
    last = (cumulative >= (1 - float(quantile)) * total).to(torch.int64).argmax(1, keepdim=True)
    low, high = lower.gather(1, first).squeeze(1), upper.gather(1, last).squeeze(1)
    return low, high, share


@settings_dataclass
class PrivateBoundsConfig(Settings):
    """What the server of the bounds rounds knows (the clients' own policy holds the noise):
    ``dp_mode`` and ``dp_noise_multiplier`` (``z``) of the clients' policy, ``copies`` (how
    many times a round releases its histogram; each copy costs ``1 / HISTOGRAM_SHARE**2``
    Gaussian mechanisms of multiplier ``z``, charged by the client gate), the first grid
    (``max_abs``, ``decades``, ``per_decade``: :func:`log_grid`), ``refine_bins`` (the
    second round's linear bins; 0: one round), ``quantile``, and ``dp_insecure_seed`` (tests
    only: the central noise from a seed, no guarantee)."""

    dp_mode: str = "central"
    dp_noise_multiplier: float = 0.0
    copies: int = 1
    max_abs: float = MAX_ABS
    decades: int = DECADES
    per_decade: int = PER_DECADE
    refine_bins: int = REFINE_BINS
    quantile: float = QUANTILE
    dp_insecure_seed: int | None = None
    dtype: torch.dtype = torch.float64

    def __post_init__(self) -> None:
        super().__post_init__()
        self._check_choice("dp_mode", MODES)
        z = float(at_least("dp_noise_multiplier", self.dp_noise_multiplier, 0))
        self._set("dp_noise_multiplier", z)
        for name in ("copies", "decades", "per_decade"):
            self._set(name, int(at_least(name, getattr(self, name), 1)))
        self._set("refine_bins", int(at_least("refine_bins", self.refine_bins, 0)))
        log_grid(self.max_abs, self.decades, self.per_decade)  # names a bad grid
        if not 0 < float(self.quantile) < 0.5:
            raise ValueError(f"quantile must be in (0, 0.5); got {self.quantile!r}.")
        self._set("max_abs", float(self.max_abs))
        self._set("quantile", float(self.quantile))

    @property
    def rounds(self) -> int:
        """The bounds rounds: 2 with ``refine_bins``, else 1."""
        return 2 if self.refine_bins else 1


def bounds_shapes(broadcast: Message, d: int) -> dict[str, tuple]:
    """The copies of the histogram a reply carries, (d, E + 1) each, by the broadcast's
    ``copies`` and per-feature grid ``edges`` (d, E)."""
    bins = int(broadcast.tensors["edges"].shape[-1]) + 1
    return {f"{COPY_PREFIX}{j}": (d, bins) for j in range(int(broadcast.scalars["copies"]))}


#: a bounds reply: copies of one histogram, each a histogram part the gate noises
#: (sensitivity 1: :class:`PrivateBoundsStep`) and charges on its own.
BOUNDS_REPLY = ReplySpec(
    BOUNDS_KIND,
    shapes=bounds_shapes,
    backing={COPY_PREFIX: "client"},
    private="parts",
    private_parts={COPY_PREFIX: "histogram"},
)


@dataclass
class BoundsState:
    """The bounds rounds' server state: ``phase`` (``"private_bounds"``, then ``"done"``),
    ``rounds`` run, the grid of the next round (``edges``: the public log grid (E,) for
    every feature, then (d, E) per feature; its outer ends ``below``, ``above``), the last
    round's summed noisy histogram ``counts`` (d, G) in rows and its ``noise`` (standard
    deviation per count), and the ``bounds`` ``(low, high)`` (d,) each."""

    phase: str = BOUNDS_KIND
    rounds: int = 0
    edges: Tensor | None = None
    below: Tensor | None = None
    above: Tensor | None = None
    counts: Tensor | None = None
    noise: float = 0.0
    bounds: tuple[Tensor, Tensor] | None = None
    metrics: dict[str, Scalar] = field(default_factory=dict)


class PrivateBoundsStep(Step):
    """Two rounds: each client's per-feature histogram over the broadcast grid, released
    ``copies`` times as histogram parts; the server's per-feature quantile bounds, first on
    the public log grid, then on ``refine_bins`` linear bins between the first bounds. A
    feature whose second histogram shows less than half of its rows above the noise keeps
    its first bounds (few rows spread over many bins).

    **Sensitivity.** A row falls in exactly one bin of each of the ``d`` features, so adding
    or removing it changes the ``(d, G)`` counts by 1 in ``d`` entries: L2 sensitivity
    ``sqrt(d)``. The client weights each row by ``1 / sqrt(d)``, so a copy has sensitivity
    1, the histogram part's (:data:`~fednovelty.federated.core.declarations.PRIVATE_PARTS`),
    and the gate's noise ``HISTOGRAM_SHARE * z`` on it is a Gaussian mechanism of
    multiplier ``HISTOGRAM_SHARE * z``: ``1 / HISTOGRAM_SHARE**2`` of a block of
    multiplier ``z``. ``c`` copies with independent noise are ``c`` such mechanisms (the
    gate charges each), and their average is a sufficient statistic of them: one Gaussian
    mechanism of multiplier ``HISTOGRAM_SHARE * z / sqrt(c)`` on the histogram, i.e. noise
    ``HISTOGRAM_SHARE * z * sqrt(d / c)`` on each row count. The grid and the copies come
    from the broadcast; neither changes the sensitivity (any grid puts a row in one bin per
    feature), and the client's ledger refuses a release past its budget. No row is clipped
    or mapped: counts need no bound on values.
    """

    kinds = (BOUNDS_KIND,)
    replies: ClassVar = declare(BOUNDS_REPLY)

    def __init__(self, config: PrivateBoundsConfig) -> None:
        self.config = config
        self.max_rounds = config.rounds

    def configure(self, state: BoundsState) -> Message:
        return Message(
            BOUNDS_KIND, {"edges": state.edges}, scalars={"copies": int(self.config.copies)}
        )

    def client_step(self, X: Tensor, message: Message, context: ClientContext) -> Message:
        if context.terms.private is None:
            return skipped_reply(
                BOUNDS_KIND, "the bounds round releases only under a differential-privacy policy"
            )
        if X.shape[0] == 0:
            return skipped_reply(BOUNDS_KIND, "no rows")
        weighted = feature_histogram(X, message.tensors["edges"]) / math.sqrt(X.shape[1])
        copies = int(message.scalars["copies"])
        tensors = {f"{COPY_PREFIX}{j}": weighted.to(X.dtype) for j in range(copies)}
        return Message(BOUNDS_KIND, tensors, backing=client_backing(tensors, X.shape[0]))

    def server_step(
        self, state: BoundsState, replies: dict[int, Message]
    ) -> tuple[str | None, dict]:
        config = self.config
        copies = [
            torch.stack([r.tensors[f"{COPY_PREFIX}{j}"] for j in range(config.copies)]).mean(0)
            for r in replies.values()
        ]
        total = torch.stack(copies).sum(0).to(torch.float64)
        z, mode = config.dp_noise_multiplier, config.dp_mode
        if mode == "central":  # the trusted server's noise, as the average of the copies'
            std = histogram_noise(z, config.copies, mode, 1)
            total = add_gaussian(total, std, server_noise(config, state.rounds, 2))
        d = total.shape[0]
        scale = math.sqrt(d)  # back to rows: each row counted 1 / sqrt(d)
        state.counts = total * scale
        state.noise = histogram_noise(z, config.copies, mode, len(replies)) * scale
        grid = state.edges.expand(d, -1) if state.edges.ndim == 1 else state.edges
        ends = bin_ends(grid, state.below.expand(d), state.above.expand(d))
        low, high, kept = quantile_bounds(state.counts, state.noise, ends, config.quantile)
        first = state.bounds is None
        if not first:  # a feature whose fine histogram is mostly noise keeps its first bounds
            trusted = kept >= 0.5
            low = torch.where(trusted, low, state.bounds[0])
            high = torch.where(trusted, high, state.bounds[1])
        state.bounds = (low, high)
        metrics = {"phase": BOUNDS_KIND, "noise": state.noise, "kept": float(kept.mean())}
        if first and config.refine_bins:
            state.edges, state.below, state.above = linear_grid(low, high, config.refine_bins)
            return BOUNDS_KIND, metrics
        return None, metrics


class PrivateBounds(FederatedAlgorithm):
    """:class:`PrivateBoundsStep` run alone (one or two rounds), before a private fit; its
    ``state.bounds`` are the fit's public box. Settings: :class:`PrivateBoundsConfig`.
    Not registered by name (no ``config_class``): a detector builds it for its own fit."""

    replies: ClassVar = declare(BOUNDS_REPLY)

    def __init__(self, **settings: Any) -> None:
        config = PrivateBoundsConfig(**settings)
        self._setup(config)
        self._step = PrivateBoundsStep(config)
        self.max_rounds = config.rounds

    def start(self) -> BoundsState:
        config = self.config
        edges = log_grid(config.max_abs, config.decades, config.per_decade)
        below, above = log_ends(edges, config.per_decade)
        return BoundsState(edges=edges, below=below, above=above)

    def finished(self, state: BoundsState) -> bool:
        return state.phase == "done"

    def configure(self, state: BoundsState) -> Message:
        return self._step.configure(state)

    def client_step(self, X: Tensor, message: Message, context: ClientContext) -> Message:
        return self._step.client_step(X, message, context)

    def server_step(
        self, state: BoundsState, replies: dict[int, Message]
    ) -> tuple[BoundsState, dict[str, Scalar]]:
        replies = {c: r for c, r in replies.items() if not r.scalars.get("skipped")}
        if not replies:
            raise ValueError(
                "no client released a histogram in the bounds round; clients without a "
                "differential-privacy policy, or without rows, skip it."
            )
        following, metrics = self._step.server_step(state, replies)
        state.rounds += 1
        state.phase = "done" if following is None else following
        return state, metrics


__all__ = [
    "BOUNDS_KIND",
    "BOUNDS_REPLY",
    "BoundsState",
    "PrivateBounds",
    "PrivateBoundsConfig",
    "PrivateBoundsStep",
    "bin_ends",
    "feature_histogram",
    "histogram_noise",
    "linear_grid",
    "log_ends",
    "log_grid",
    "noise_threshold",
    "quantile_bounds",
]
