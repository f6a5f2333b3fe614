"""Drift alarms of ``benchmarks/stream_drift.py`` (its sections 3 and 4): the streaming
detector's two drift tests side by side, ``drift_test="cusum"`` and ``"conformal"``.

3. **False alarms on a stationary stream**: A's share 1/2 in every window (``--alarm-windows``
   windows, 100 on cifar10-svhn and 60 on femnist), ``rho=0.7``, one round per window. The
   rate is alarms per client-window over the windows both tests can alarm in (3 on: the
   CUSUM's reference needs three windows, ``fit``'s included; the conformal test starts at a
   client's second streamed window), pooled over seeds, with its exact (Clopper-Pearson)
   95 % interval; for the conformal test also the share of p-values <= 0.05 and the clients
   whose martingale ever reached ``1 / false_alarm_rate`` (its guarantee: at most
   ``false_alarm_rate`` of the clients on an exchangeable stream).
4. **Detection delay on a documented shift**: 30 windows, the first 20 stationary as above,
   then from window 21 on either

   - ``mix``: A's share jumps from 1/2 to 1 (CIFAR-10 only; FEMNIST: digits only), or
   - ``novel``: 20 % of every client's rows are novel rows (the stream's novel pool: the
     ADBench sets' own anomalies; FEMNIST images scaled, rotated or mirrored).

   Per test: false alarms in windows 3-20, the share of clients alarmed in window 21 (delay
   0), within 5 windows (delay <= 4), and the median delay of the clients that alarmed by
   window 30.

Both tests see the same windows (same seed); the model does not depend on the test.
"""

from __future__ import annotations

import warnings

import numpy as np
import pandas as pd
from scipy.stats import binomtest

from benchmarks.common import check, markdown_table
from fednovelty import StreamingFedGMMDetector
from fednovelty.datasets.domain_pools import stream_pools
from fednovelty.datasets.streams import domain_stream

TESTS = ("cusum", "conformal")
#: windows of the stationary stream per dataset (``--alarm-windows`` overrides).
ALARM_WINDOWS = {"cifar10-svhn": 100, "femnist": 60}
#: the shift stream: windows, the last stationary window, the novel rows' share.
SHIFT_WINDOWS, SHIFT_AT, NOVEL_SHARE = 30, 20, 0.2
SHIFTS = {
    "mix": "A's share jumps from 1/2 to 1",
    "novel": f"{NOVEL_SHARE:.0%} of every client's rows are novel rows",
}
#: the first window both tests can alarm in.
FIRST_TESTED = 3
#: the documented false-alarm rate and the calibration band the conformal test must meet.
RATE, BAND = 0.01, 0.3
WITHIN = 5


def stream_windows(dataset, settings, seed, n_windows, shift=None, shift_at=SHIFT_AT):
    """``(X, groups)`` of the warm-up and ``n_windows`` windows of a stationary stream (A's
    share 1/2), shifted after window ``shift_at`` by ``shift`` (module docstring)."""
    pools = stream_pools(dataset, n_writers=max(40, settings.n_clients), random_state=seed)
    k = round(NOVEL_SHARE * settings.rows)

    def build(share):
        return domain_stream(
            pools,
            n_windows,
            kind="constant",
            constant=share,
            n_clients=settings.n_clients,
            rows_per_window=settings.rows,
            test_inliers=30,
            test_novel=max(k * settings.n_clients, 1),
            random_state=seed + 1000,
        ).windows

    base = build(0.5)
    if shift == "mix":  # the same warm-up, features and draws; windows after shift_at at 1
        moved = build(1.0)
        if not np.array_equal(moved[0].X, base[0].X):
            raise RuntimeError("the two streams' warm-ups differ; the splice needs the same")
        return [(w.X, w.groups) for w in base[: shift_at + 1] + moved[shift_at + 1 :]]
    out = []
    for w in base:
        X = w.X
        if shift == "novel" and w.t > shift_at:
            X, novel = X.copy(), w.X_test[w.y_test == 1]
            for c in range(settings.n_clients):
                X[np.flatnonzero(w.groups == c)[:k]] = novel[c * k : (c + 1) * k]
        out.append((X, w.groups))
    return out


def drift_records(windows, settings, seed, test) -> pd.DataFrame:
    """The streaming detector's drift records on ``windows`` with ``drift_test=test``."""
    det = StreamingFedGMMDetector(
        settings.n_components, rho=0.7, random_state=seed, drift_test=test
    )
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        det.fit(windows[0][0], groups=windows[0][1])
        for X, groups in windows[1:]:
            det.partial_fit(X, groups=groups)
    return det.drift_frame().assign(seed=seed, test=test)


def run_alarms(dataset, settings, n_windows, shift_windows, shift_at, progress=print):
    """Both tests on the stationary stream and the two shifts, every seed: one frame of
    drift records with ``stream`` (``stationary`` or the shift), ``seed`` and ``test``."""
    frames = []
    for seed in settings.seeds:
        streams = {"stationary": stream_windows(dataset, settings, seed, n_windows)}
        for shift in SHIFTS:
            streams[shift] = stream_windows(dataset, settings, seed, shift_windows, shift, shift_at)
        rates = []
        for name, windows in streams.items():
            for test in TESTS:
                frames.append(drift_records(windows, settings, seed, test).assign(stream=name))
                if name == "stationary":
                    rates.append(f"{test} {100 * _tested(frames[-1]).alarm.mean():.2f} %")
        progress(f"  {dataset} seed {seed}: stationary false alarms " + ", ".join(rates))
    return pd.concat(frames, ignore_index=True)


def _tested(frame: pd.DataFrame) -> pd.DataFrame:
    return frame[(frame.window >= FIRST_TESTED) & (frame.status == "ok")]


def _percent(count: int, n: int) -> str:
    return f"{100 * count / n:.2f}" if n else "-"


def stationary_report(dataset, frame, n_windows, seeds) -> str:
    rows, rates = [], {}
    for test in TESTS:
        runs = frame[(frame.stream == "stationary") & (frame.test == test)]
        tested = _tested(runs)
        k, n = int(tested.alarm.sum()), len(tested)
        ci = binomtest(k, n).proportion_ci(0.95, method="exact") if n else None
        rates[test] = k / n if n else float("nan")
        per_seed = " / ".join(f"{100 * v:.2f}" for v in tested.groupby("seed").alarm.mean())
        p05 = mart = "-"
        if test == "conformal":
            p05 = _percent(int((tested.p_value <= 0.05).sum()), n)
            ever = runs.groupby(["seed", "client"]).martingale_alarm.any()
            mart = f"{int(ever.sum())} of {len(ever)}"
        interval = f"{100 * ci.low:.2f}-{100 * ci.high:.2f}" if ci else "-"
        rows.append([test, _percent(k, n), interval, per_seed, str(n), p05, mart])
    low, high = RATE * (1 - BAND), RATE * (1 + BAND)
    conformal, cusum = rates["conformal"], rates["cusum"]
    return "\n".join(
        [
            f"## 3. False alarms on a stationary stream (share 1/2 throughout, {n_windows} "
            f"windows, seeds {list(seeds)}): {dataset}",
            "",
            f"Alarms per client-window in windows {FIRST_TESTED}..{n_windows}, "
            "false_alarm_rate = 1 %; the martingale's column counts the (seed, client) "
            "streams whose martingale ever reached 100.",
            "",
            markdown_table(
                [
                    "test",
                    "alarms %",
                    "exact 95 % interval",
                    "per seed %",
                    "client-windows",
                    "p <= 0.05 %",
                    "martingale alarmed",
                ],
                rows,
            ),
            "",
            check(
                f"conformal: false alarms within +-30 % of the documented 1 % "
                f"({100 * conformal:.2f} %)",
                low <= conformal <= high,
            ),
            check(
                f"cusum: false alarms <= the documented 1 % ({100 * cusum:.2f} %)", cusum <= RATE
            ),
            f"- cusum within +-30 % of 1 %: {'yes' if low <= cusum <= high else 'no'} "
            f"({100 * cusum:.2f} %)",
        ]
    )


def _delays(runs: pd.DataFrame, column: str, shift_at: int) -> np.ndarray:
    """Per (seed, client): windows from the first shifted window to its first alarm there
    (NaN: none)."""
    after = runs[runs.window > shift_at]
    keys = runs[["seed", "client"]].drop_duplicates().itertuples(index=False, name=None)
    first = after[after[column]].groupby(["seed", "client"]).window.min() - (shift_at + 1)
    return first.reindex(pd.MultiIndex.from_tuples(list(keys))).to_numpy(dtype=float)


def shift_report(dataset, frame, shift_windows, shift_at, seeds) -> str:
    sections = []
    for shift, what in SHIFTS.items():
        rows = []
        for test, column in (*((t, "alarm") for t in TESTS), ("conformal", "martingale_alarm")):
            runs = frame[(frame.stream == shift) & (frame.test == test)]
            before = _tested(runs[runs.window <= shift_at])
            delays = _delays(runs, column, shift_at)
            found = delays[np.isfinite(delays)]
            label = test if column == "alarm" else "conformal martingale"
            rows.append(
                [
                    label,
                    _percent(int(before[column].sum()), len(before)),
                    _percent(int((delays == 0).sum()), delays.size),
                    _percent(int((delays < WITHIN).sum()), delays.size),
                    f"{np.median(found):.0f}" if found.size else "-",
                    f"{found.size} of {delays.size}",
                ]
            )
        sections += [
            f"### {shift}: {what} from window {shift_at + 1} on",
            "",
            markdown_table(
                [
                    "test",
                    f"false alarms % (windows {FIRST_TESTED}-{shift_at})",
                    f"alarmed in window {shift_at + 1} %",
                    f"alarmed by window {shift_at + WITHIN} %",
                    "median delay (windows)",
                    "clients alarmed",
                ],
                rows,
            ),
            "",
        ]
    return "\n".join(
        [
            f"## 4. Detection delay on a documented shift ({shift_windows} windows, shift "
            f"after window {shift_at}, seeds {list(seeds)}): {dataset}",
            "",
            "Delay: windows from the first shifted window to a client's first alarm at or "
            "after it (0 = in that window); clients of every seed.",
            "",
            *sections,
        ]
    ).rstrip()
