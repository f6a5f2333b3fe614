"""The Drift page's stream: synthetic clients whose mix of two populations follows a
schedule (``fednovelty.datasets.streams.schedule_share``), fitted window by window with
``StreamingFedGMMDetector``; pure functions the page and the tests call."""

from __future__ import annotations

import warnings
from dataclasses import dataclass

import numpy as np
import pandas as pd

from fednovelty import StreamingFedGMMDetector
from fednovelty.datasets.streams import schedule_share

__all__ = ["StreamRun", "StreamSpec", "run_stream", "synthetic_window"]

#: centres of population A and of B, and where B moves when it jumps (2-D).
CENTER_A, CENTER_B, CENTER_JUMP = (0.0, 0.0), (5.0, 0.0), (0.0, 9.0)


@dataclass(frozen=True)
class StreamSpec:
    """What the page streams.

    Attributes:
        kind, cycles: the schedule of A's share (``"linear"``, ``"cosine"``, ``"constant"``).
        n_windows: windows after the first (>= 1); n_clients: clients (>= 1).
        rows: rows per client and window; offset: client ``c`` follows the schedule
            ``offset * c / (n_clients - 1)`` of a cycle ahead (the last client ``offset``).
        rho, rounds, false_alarm_rate: the detector's.
        jump_at: window from which population B sits at another place (None: never).
        seed: of the draws and the detector.
    """

    kind: str = "cosine"
    cycles: int = 1
    n_windows: int = 30
    n_clients: int = 6
    rows: int = 150
    offset: float = 0.5
    rho: float = 0.8
    rounds: int = 1
    false_alarm_rate: float = 0.01
    jump_at: int | None = None
    seed: int = 0


@dataclass(frozen=True)
class StreamRun:
    """A fitted stream.

    Attributes:
        detector: the ``StreamingFedGMMDetector`` after the last window.
        truth: (n_windows + 1, n_clients) each client's share of A per window (window 0,
            the fit's, has one half for every client).
        learned: (n_windows + 1, n_clients) its weight on A's component per window.
        drift: ``detector.drift_frame()``.
    """

    detector: StreamingFedGMMDetector
    truth: np.ndarray
    learned: np.ndarray
    drift: pd.DataFrame


def client_share(spec: StreamSpec, t: int, client: int) -> float:
    """Client ``client``'s share of A in window ``t`` (its phase-shifted schedule)."""
    lag = spec.offset * client / max(spec.n_clients - 1, 1)  # in cycles
    period = spec.n_windows / max(spec.cycles, 1)
    return schedule_share(t + lag * period, spec.n_windows, spec.kind, spec.cycles)


def synthetic_window(
    spec: StreamSpec, t: int, rng: np.random.Generator, share: float | None = None
):
    """Window ``t``'s rows (n, 2), client ids (n,) and each client's share of A (``share``:
    the same for every client instead of the schedule's)."""
    b = CENTER_JUMP if spec.jump_at is not None and t >= spec.jump_at else CENTER_B
    rows, groups, shares = [], [], []
    for c in range(spec.n_clients):
        share_c = client_share(spec, t, c) if share is None else share
        from_a = rng.random(spec.rows) < share_c
        centers = np.where(from_a[:, None], np.asarray(CENTER_A), np.asarray(b))
        rows.append(centers + rng.normal(size=(spec.rows, 2)))
        groups.append(np.full(spec.rows, c))
        shares.append(share_c)
    return np.concatenate(rows), np.concatenate(groups), np.asarray(shares)


def run_stream(spec: StreamSpec, progress=None) -> StreamRun:
    """Fit ``spec``'s stream window by window; ``progress(done, total)`` after each."""
    rng = np.random.default_rng(spec.seed)
    det = StreamingFedGMMDetector(
        2,
        rho=spec.rho,
        window_rounds=spec.rounds,
        false_alarm_rate=spec.false_alarm_rate,
        random_state=spec.seed,
    )
    X, groups, shares = synthetic_window(spec, 0, rng, share=0.5)  # fit sees both populations
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # a first window that stops at max_iter is fine here
        det.fit(X, groups=groups)
    a = int(np.argmin(np.linalg.norm(det.means_ - np.asarray(CENTER_A), axis=1)))
    truth, learned = [shares], [det.client_weights_[:, a].copy()]
    for t in range(1, spec.n_windows + 1):
        X, groups, shares = synthetic_window(spec, t, rng)
        det.partial_fit(X, groups=groups)
        a = int(np.argmin(np.linalg.norm(det.means_ - np.asarray(CENTER_A), axis=1)))
        truth.append(shares)
        learned.append(det.client_weights_[:, a].copy())
        if progress is not None:
            progress(t, spec.n_windows)
    return StreamRun(det, np.asarray(truth), np.asarray(learned), det.drift_frame())
