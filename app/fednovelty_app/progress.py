"""Progress of a fit, round by round, for the Train page (re-exported by ``training``).

- :class:`Progress`: one report (rounds done, the fit's maximum, phase, log-likelihood, time).
- :func:`max_rounds`: the most rounds a detector's ``fit`` can run (the progress bar's total).
- :func:`fit_with_progress`: fits in a worker thread and reports each round in the caller's.

Choices, and why:

- Per-round progress through the detectors' own hook: ``fit(..., callbacks=[hook])`` calls
  ``hook`` with each round's ``fednovelty.runtime.RoundRecord``. The fit runs in a worker
  thread whose hook only puts the record on a queue; the page's (script) thread takes them
  off and calls ``on_progress``, because Streamlit elements must be updated from the script
  thread. The PyOD baselines fit in one call, so they report only ``done``.
- One torch thread while fitting: the mixtures are small, and torch's default thread pool
  oversubscribes a shared machine's cores.
"""

from __future__ import annotations

import queue
import time
import warnings
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from fednovelty.runtime import RoundRecord

__all__ = ["Progress", "fit_with_progress", "max_rounds"]


@dataclass(frozen=True)
class Progress:
    """One progress report while a detector fits.

    Attributes:
        round: rounds done in the fit (``RoundRecord.round``); total: the fit's maximum
            rounds (None if unknown).
        phase: the last round's message kind (e.g. ``"centroids"``, ``"em"``), if known.
        loglik: the last round's mean log-likelihood, if it reported one.
        seconds: since the fit started.
        done: the fit has finished.
    """

    round: int
    total: int | None
    phase: str | None
    loglik: float | None
    seconds: float
    done: bool = False

    @property
    def fraction(self) -> float:
        """Share done in [0, 1] (1 when done)."""
        if self.done:
            return 1.0
        if not self.total:
            return 0.0
        return min(self.round / self.total, 1.0)

    def text(self) -> str:
        """A one-line status, e.g. ``"round 12 / 130 (em, log-lik -3.2104), 2.1 s"``."""
        if self.done:
            return f"done in {self.seconds:.1f} s"
        total = f" / {self.total}" if self.total else ""
        extra = [self.phase] if self.phase else []
        if self.loglik is not None:
            extra.append(f"log-lik {self.loglik:.4f}")
        detail = f" ({', '.join(extra)})" if extra else ""
        return f"round {self.round}{total}{detail}, {self.seconds:.1f} s"


def max_rounds(detector) -> int | None:
    """Most rounds ``detector.fit`` can run (the progress bar's total): the detector's own
    ``max_fit_rounds()``; None if unknown (a PyOD baseline, or a detector that learns it from
    the data)."""
    planned = getattr(detector, "max_fit_rounds", None)
    return None if planned is None else planned()


def fit_with_progress(
    fit: Callable[[Callable[[RoundRecord], None]], object],
    on_progress: Callable[[Progress], None] = lambda progress: None,
    *,
    total: int | None = None,
    threads: int = 1,
):
    """Run ``fit(hook)`` in a worker thread and report every round ``hook`` receives.

    Args:
        fit: the call that fits, given the per-round hook to pass on, e.g.
            ``lambda hook: detector.fit(X, groups=g, callbacks=[hook])`` (a fit with no
            rounds may ignore it); its warnings are recorded, not shown.
        on_progress: called in the caller's thread with a :class:`Progress` per round, in
            order, and once with ``done=True``.
        total: the fit's maximum rounds (:func:`max_rounds`), for ``Progress.total``.
        threads: torch threads in the worker (1: fastest for these small mixtures).

    Returns:
        ``(fit's return value, list of warning messages)``.

    Raises:
        whatever ``fit`` (or ``on_progress``) raises.
    """
    records: queue.Queue = queue.Queue()
    finished = object()
    caught: list[str] = []

    def work():
        from fednovelty.runtime.threads import torch_threads

        try:
            with torch_threads(threads), warnings.catch_warnings(record=True) as found:
                warnings.simplefilter("always")
                result = fit(records.put)  # the worker only queues; the caller reports
            caught.extend(dict.fromkeys(str(r.message) for r in found))
            return result
        finally:
            records.put(finished)

    started = time.perf_counter()
    with ThreadPoolExecutor(1, thread_name_prefix="fednovelty-fit") as pool:
        future = pool.submit(work)
        while (record := records.get()) is not finished:
            loglik = record.metrics.get("mean_log_likelihood")
            on_progress(
                Progress(
                    record.round,
                    total,
                    record.kind,
                    None if loglik is None else float(loglik),
                    time.perf_counter() - started,
                )
            )
        result = future.result()
    on_progress(Progress(0, total, None, None, time.perf_counter() - started, done=True))
    return result, caught
