"""A streaming client's own conformal drift test (``StreamConfig.conformal_drift``).

In the window's first round each client already scores its new rows under the model it had
before the window (:class:`~fednovelty.federated.streams.streaming.StreamStep`). With
``conformal_drift`` it also tests, alone, whether those scores ``s = -log p(x)`` are
exchangeable with the scores of its own latest rows (its *reference*, kept in its state):

- the window's p-value: :func:`~fednovelty.mixture.drift_conformal.window_p_value` of the
  window's mean score against ``drift_resamples`` pseudo-windows of the window's size drawn
  from the pooled window and reference scores; ``P(p <= alpha) = alpha`` exactly when the
  rows are exchangeable;
- a conformal test martingale: Vovk's simple jumper betting on small per-row conformal
  p-values (rows less likely than the reference; :func:`~fednovelty.mixture.drift_conformal.
  row_p_values`, :func:`~fednovelty.mixture.drift_conformal.jumper_martingale`), the rows
  taken in a random order. It alarms when it reaches ``1 / drift_alpha`` within the window
  (Ville's inequality: at most ``drift_alpha`` of stationary streams ever do), then starts
  again from 1.

Then the window's scores join the reference, which keeps the latest ``drift_reference``
rows. A client's first window only fills its reference. The randomness (pseudo-windows,
tie-breaking, row order) is the client's own, seeded by ``random_state``, its id and its
count of windows, so a run repeats. Nothing of this is released: the outputs stay in the
client's state (:data:`OUTPUT_KEYS`) for the client, or a simulation's owner, to read.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import torch
from torch import Tensor

from fednovelty.mixture.drift_conformal import jumper_martingale, row_p_values, window_p_value

__all__ = ["JUMPER_EPSILONS", "OUTPUT_KEYS", "STATE_KEYS", "check_drift_settings", "drift_window"]

#: the client's kept drift state: its reference scores (m,), the martingale's log capital
#: on each betting function (2,) and its count of windows ().
STATE_KEYS = ("drift_reference", "drift_log_capital", "drift_windows")
#: the window's results: p-value, the martingale at the window's end (after a restart: the
#: value that alarmed) and 1.0 if it alarmed.
OUTPUT_KEYS = ("drift_p_value", "drift_martingale", "drift_martingale_alarm")
#: the simple jumper's betting functions: on small p-values, and none.
JUMPER_EPSILONS = (-1.0, 0.0)
JUMP = 0.01


def check_drift_settings(config: Any) -> None:
    """A ``ValueError`` naming the setting unless ``drift_alpha`` is in (0, 1),
    ``drift_reference >= 1`` and ``drift_resamples >= 1 / drift_alpha - 1`` (fewer
    pseudo-windows cannot reach ``drift_alpha`` on the data)."""
    alpha = config.drift_alpha
    if isinstance(alpha, bool) or not 0.0 < float(alpha) < 1.0:
        raise ValueError(f"drift_alpha must be in (0, 1); got {alpha!r}.")
    for name in ("drift_reference", "drift_resamples"):
        value = getattr(config, name)
        if isinstance(value, bool) or not float(value) == int(value) or int(value) < 1:
            raise ValueError(f"{name} must be an integer >= 1; got {value!r}.")
    least = math.ceil(1.0 / float(alpha) - 1.0 - 1e-9)
    if int(config.drift_resamples) < least:
        raise ValueError(
            f"drift_resamples={config.drift_resamples} cannot resolve drift_alpha={alpha}: a "
            f"window's p-value needs >= 1 / drift_alpha - 1 = {least} pseudo-windows; raise "
            "drift_resamples or drift_alpha."
        )


def drift_window(log_p: Tensor, state: dict[str, Tensor], config: Any, client_id: int) -> None:
    """Client ``client_id``'s conformal test of one window (module docstring): ``log_p``
    (n,) the window's ``log p(x)`` under the client's model before the window. Updates
    ``state`` in place: :data:`STATE_KEYS`, and :data:`OUTPUT_KEYS` when the reference held
    rows."""
    scores = -log_p.detach().to("cpu", torch.float64).numpy()
    count = int(state["drift_windows"]) if "drift_windows" in state else 0
    rng = np.random.default_rng([int(config.random_state) % (1 << 63), int(client_id), count])
    reference = state.get("drift_reference")
    if reference is not None and reference.numel() > 0:
        kept = reference.numpy()
        p_value = window_p_value(scores, kept, n_resamples=config.drift_resamples, rng=rng)
        rows = row_p_values(scores[rng.permutation(scores.shape[0])], kept, rng=rng)
        capital = state.get("drift_log_capital")
        log_capital, path = jumper_martingale(
            rows,
            None if capital is None else capital.numpy(),
            epsilons=JUMPER_EPSILONS,
            jump=JUMP,
        )
        alarm = bool(path.size) and float(path.max()) >= -math.log(config.drift_alpha)
        value = float(np.exp(path.max() if alarm else np.logaddexp.reduce(log_capital)))
        if alarm:  # the martingale starts again from 1
            log_capital = np.full(len(JUMPER_EPSILONS), -math.log(len(JUMPER_EPSILONS)))
        state["drift_log_capital"] = torch.tensor(log_capital, dtype=torch.float64)
        state["drift_p_value"] = torch.tensor(p_value, dtype=torch.float64)
        state["drift_martingale"] = torch.tensor(value, dtype=torch.float64)
        state["drift_martingale_alarm"] = torch.tensor(float(alarm), dtype=torch.float64)
        scores = np.concatenate([kept, scores])
    state["drift_reference"] = torch.tensor(scores[-int(config.drift_reference) :])
    state["drift_windows"] = torch.tensor(float(count + 1), dtype=torch.float64)
