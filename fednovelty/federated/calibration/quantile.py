"""One-round federated calibration: the federation's histogram of calibration scores.

A client's data are its calibration scores as one column (n, 1) (the engines take 2-d rows):
a detector scores the client's held-out rows with the fitted model, on the client. The grid
``edges`` is a setting, fixed before any score is read (``conformal.calibration_edges``), so
the ``calibration`` broadcast carries nothing; each client replies its counts per bin
(``conformal.histogram_counts``) and its row count, the server sums the replies the gate
accepts (:class:`CalibrationStep`). The sum is the histogram of the pooled scores, from which
``conformal.histogram_threshold`` and ``histogram_p_values`` read a threshold and p-values.

Trust: the runtime's client gate holds the counts to the client's floor as one whole-client
value (a client with fewer than ``min_rows`` scores withholds); the bins themselves are not
floored, so without differential privacy the counts place each score within its bin. Under
a DP policy the counts are a histogram part (one score moves one count by 1) that the gate
noises and charges (a client without scores sends the noise alone), the row count is
withheld, and in ``"central"`` mode the server adds the noise to the sum. The server gate
checks that counts are whole, non-negative and add up to the row count; a
``client_weight_cap`` caps one client's weight.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np
import torch
from torch import Tensor

from fednovelty.federated.core.aggregate import released
from fednovelty.federated.core.base import (
    ClientContext,
    FederatedAlgorithm,
    Message,
    Scalar,
    skipped_reply,
)
from fednovelty.federated.core.config import RobustSettings, TorchSettings, settings_dataclass
from fednovelty.federated.core.conformal import histogram_counts
from fednovelty.federated.core.declarations import InvalidReplyError, ReplySpec, declare
from fednovelty.federated.core.steps import Step
from fednovelty.federated.init.settings import PrivateSettings
from fednovelty.federated.trust.backing import client_backing
from fednovelty.federated.trust.dp import server_noise
from fednovelty.federated.trust.noise import add_gaussian
from fednovelty.federated.trust.private_bounds import histogram_noise
from fednovelty.federated.trust.reply_form import expectation
from fednovelty.federated.trust.value_checks import relative_tolerance

#: the message kind of the calibration round.
CALIBRATION_KIND = "calibration"


def check_edges(edges: Any) -> Tensor:
    """``edges`` as a float64 CPU tensor (B + 1,), B >= 1, finite and strictly increasing.

    Raises:
        ValueError: anything else, naming ``edges`` (build them with
            ``conformal.calibration_edges(lowest)``).
    """
    if edges is None:
        raise ValueError(
            "edges is required: the public grid of score bin edges, e.g. "
            "fednovelty.federated.core.conformal.calibration_edges(lowest)."
        )
    if isinstance(edges, Tensor):
        grid = edges.detach().to("cpu", torch.float64).clone()
    else:
        grid = torch.as_tensor(np.asarray(edges, dtype=np.float64)).clone()
    if grid.ndim != 1 or grid.numel() < 2:
        raise ValueError(
            f"edges must be a 1-d sequence of at least 2 bin edges; got shape {tuple(grid.shape)}."
        )
    if not bool(torch.isfinite(grid).all()) or not bool((grid.diff() > 0).all()):
        raise ValueError("edges must be finite and strictly increasing.")
    return grid


@settings_dataclass
class CalibrationConfig(PrivateSettings, RobustSettings, TorchSettings):
    """Settings of :class:`FederatedCalibration`.

    Attributes:
        edges: the public grid (B + 1,) of score bin edges (float64, on the CPU; JSON: a
            list), fixed before any score is read.
        dp_mode, dp_noise_multiplier, dp_insecure_seed: what the server knows of its
            clients' differential-privacy policy (:class:`.init.settings.PrivateSettings`);
            ``dp_clip`` is not read (counts need no clipping).
        client_weight_cap: no client counts for more than this many times the median
            client's rows (``None``: no cap); ``aggregation`` is ``"sum"``.
        random_state, dtype, device, wire_dtype: :class:`TorchSettings` (the counts are
            summed in float64 on ``device``).
    """

    AGGREGATION_CHOICES: ClassVar[tuple[str, ...]] = ("sum",)

    edges: Tensor

    def __post_init__(self) -> None:
        super().__post_init__()
        self._set("edges", check_edges(self.edges))

    @property
    def n_bins(self) -> int:
        """B + 2: the interior bins and the underflow and overflow bins."""
        return int(self.edges.numel()) + 1


def calibration_shapes(broadcast: Message, d: int) -> dict[str, tuple[int, ...]]:
    """A calibration reply: ``counts`` (B + 2,) by the server's ``expect["n_bins"]``, and
    the row count ``n_samples`` ()."""
    return {"counts": (int(expectation(broadcast, "n_bins")),), "n_samples": ()}


def check_histogram(reply: Message, broadcast: Message) -> None:
    """A histogram some rows could have produced: whole counts that add up to the row count
    (non-negativity is the reply form's check).

    Raises:
        InvalidReplyError: naming ``'counts'``.
    """
    counts = reply.tensors["counts"].double()
    n = float(reply.tensors["n_samples"])
    if not bool((counts == counts.round()).all()):
        raise InvalidReplyError("tensor 'counts' holds fractions; a histogram counts rows.")
    total = float(counts.sum())
    if abs(total - n) > relative_tolerance(reply.tensors["counts"].dtype) * max(n, 1.0):
        raise InvalidReplyError(f"tensor 'counts' adds up to {total:g}, not the {n:g} rows sent.")


#: a calibration reply: the counts as a histogram part (noised and charged by the client gate
#: under DP), the row count withheld under DP; both whole-client values under the floor.
CALIBRATION_REPLY = ReplySpec(
    CALIBRATION_KIND,
    shapes=calibration_shapes,
    checks=(check_histogram,),
    backing={"counts": "client", "n_samples": "client"},
    private="parts",
    private_parts={"counts": "histogram", "n_samples": "withheld"},
)


@dataclass
class CalibrationState:
    """The calibration round's server state: ``phase`` (``"calibration"``, then
    ``"done"``), ``rounds`` run, the grid ``edges`` (B + 1,), the summed ``counts`` (B + 2,)
    float64 (under DP the noisy sum, not clipped: negative entries are noise), ``n_rows``
    (their total), ``noise`` (the standard deviation of the noise on each summed count, 0
    without DP) and ``n_clients`` (replies summed)."""

    phase: str = CALIBRATION_KIND
    rounds: int = 0
    edges: Tensor | None = None
    counts: Tensor | None = None
    n_rows: float = 0.0
    noise: float = 0.0
    n_clients: int = 0


def client_scores(X: Tensor) -> Tensor | None:
    """A client's scores (n,) from its rows: ``X`` (n, 1) or (n,); ``None`` for wider rows."""
    if X.ndim == 1:
        return X
    return X[:, 0] if X.ndim == 2 and X.shape[1] == 1 else None


class CalibrationStep(Step):
    """The calibration round (module docstring): the clients' histograms over the
    settings' grid, summed; under ``"central"`` DP with the trusted server's histogram noise
    ``HISTOGRAM_SHARE * dp_noise_multiplier`` (fresh OS entropy, never ``random_state``)."""

    kinds = (CALIBRATION_KIND,)
    replies: ClassVar = declare(CALIBRATION_REPLY)

    def configure(self, state: CalibrationState) -> Message:
        return Message(CALIBRATION_KIND, expect={"n_bins": self.config.n_bins})

    def client_step(self, X: Tensor, message: Message, context: ClientContext) -> Message:
        scores = client_scores(X)
        if scores is None:
            return skipped_reply(
                CALIBRATION_KIND,
                f"calibration rows are one column of scores; these have {X.shape[-1]} columns",
            )
        n = int(scores.shape[0])
        private = context.terms.private is not None  # then even no rows answer, with noise
        if not private and not context.terms.releases(n):
            return skipped_reply(CALIBRATION_KIND, context.terms.below_floor)
        values = scores.detach().to("cpu", torch.float64).numpy()
        counts = torch.as_tensor(histogram_counts(values, self.config.edges.numpy()))
        tensors = {"counts": counts, "n_samples": torch.tensor(float(n), dtype=torch.float64)}
        return Message(CALIBRATION_KIND, tensors, backing=client_backing(tensors, n))

    def server_step(
        self, state: CalibrationState, replies: dict[int, Message]
    ) -> tuple[str | None, dict[str, Scalar]]:
        config = self.config
        kept = released(replies.values())
        if not kept:
            raise ValueError(
                "no client released its calibration histogram; clients below their privacy "
                "floor skip the round."
            )
        total = torch.stack([r.tensors["counts"] for r in kept]).to(config.device, torch.float64)
        total = total.sum(0)
        noise = 0.0
        if config.private:
            z = config.dp_noise_multiplier
            if config.dp_mode == "central":
                spread = histogram_noise(z, 1, "central", 1)
                total = add_gaussian(total, spread, server_noise(config, state.rounds, 1))
            noise = histogram_noise(z, 1, config.dp_mode, len(kept))
        state.edges = config.edges.clone()
        state.counts = total
        state.n_rows = float(total.sum())
        state.noise = noise
        state.n_clients = len(kept)
        return None, {"n_rows": state.n_rows, "n_clients": len(kept), "noise": noise}


class FederatedCalibration(FederatedAlgorithm):
    """One round: the federation's histogram of its clients' calibration scores
    (:class:`CalibrationStep`; module docstring). Settings: :class:`CalibrationConfig`.

    Example::

        from fednovelty.federated.core.conformal import calibration_edges, histogram_threshold
        from fednovelty.runtime import run_simulation

        algorithm = FederatedCalibration(edges=calibration_edges(0.0))
        state = run_simulation(algorithm, [s.reshape(-1, 1) for s in scores]).state
        threshold = histogram_threshold(state.counts, state.edges, alpha=0.05)
    """

    max_rounds = 1
    config_class = CalibrationConfig
    gate_caps_weights = True
    replies: ClassVar = declare(CALIBRATION_REPLY)

    def __init__(self, **settings: Any) -> None:
        self._setup(CalibrationConfig(**settings))

    def _setup(self, config: CalibrationConfig) -> None:
        super()._setup(config)
        self._step = CalibrationStep(config)

    def start(self) -> CalibrationState:
        return CalibrationState(edges=self.config.edges.clone())

    def finished(self, state: CalibrationState) -> bool:
        return state.phase == "done"

    def configure(self, state: CalibrationState) -> Message:
        return self._step.configure(state)

    def client_step(self, X: Tensor, message: Message, context: ClientContext) -> Message:
        return self._step.client_step(X, message, context)

    def server_step(
        self, state: CalibrationState, replies: dict[int, Message]
    ) -> tuple[CalibrationState, dict[str, Scalar]]:
        following, metrics = self._step.server_step(state, replies)
        state.rounds += 1
        state.phase = "done" if following is None else following
        return state, metrics


__all__ = [
    "CALIBRATION_KIND",
    "CALIBRATION_REPLY",
    "CalibrationConfig",
    "CalibrationState",
    "CalibrationStep",
    "FederatedCalibration",
    "calibration_shapes",
    "check_edges",
    "check_histogram",
    "client_scores",
]
