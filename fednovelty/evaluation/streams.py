"""Novelty under drift: detectors scored window by window on a two-domain stream.

:func:`run_stream_benchmark` builds a :func:`~fednovelty.datasets.streams.domain_stream` per
seed (domain A's share following a schedule, novel rows that belong to neither domain) and
runs the compared detectors through it, window by window:

- the registry's stream methods (``task="stream"``, :mod:`fednovelty.methods`; ``"streaming"``,
  a :class:`~fednovelty.detectors.StreamingFedGMMDetector`): fitted on the warm-up window
  (window 0), then one ``partial_fit`` per window (``rho``, ``rounds``).
- ``"static"``: the ``baseline`` method of the registry (:mod:`fednovelty.methods`) or an
  ablation of one (:mod:`fednovelty.evaluation.ablations`; ``"FedGMM-plain"`` by default)
  fitted on the warm-up window and never again.
- ``"refit"``: the ``baseline`` method fitted from scratch on every window.
- any other federated novelty method of the registry, or an ablation of one, by name (e.g.
  ``"FedGenGMM-plain"``, the default last): fitted from scratch on every window.

:func:`stream_methods` is the default list: every stream method of the registry, then
``"static"``, ``"refit"`` and ``"FedGenGMM-plain"``.

Every detector scores the window's test set (inliers in the window's mix plus novel rows;
novel = the positive class) with ``decision_function`` (higher = more anomalous) without a
client, so each uses its global weights (the streaming detector: the current window's mix).
The result is one tidy row per method x window x seed (:data:`STREAM_COLUMNS`), window 0
included (every method's first fit); :mod:`~.stream_summary`'s functions
turn it into the comparison (windows >= 1).

Choices, and why:

- The mixtures are plain maximum likelihood by default (``"FedGMM-plain"``,
  ``"FedGenGMM-plain"``: no standardisation, no covariance prior), as the streaming
  detector's M-steps are, so the comparison is between ways of following the stream, not
  between regularisations. Any registry method (or other ablation) can be named instead.
- ``bytes`` of a window is what crossed the wire for it (up + down): the streaming detector's
  window, a refit's whole fit; the static detector sends nothing after window 0.
- ``moved``: windows whose share is at least ``moved_at`` (0.3) away from the warm-up
  window's, where a detector that stayed behind should show it.
- ``tracking_error`` (stream methods' rows only): the mean over the window's clients of
  ``|weight on A's components - the client's share of A|``, where A's components are those
  whose responsibility on the warm-up rows is mostly A's.
- A method that fails on a window records the error in ``error`` (metrics NaN) and the run
  goes on; warnings (e.g. EM not converged) are kept in ``warning``.
- One torch thread by default (``threads``), as :func:`~fednovelty.evaluation.run_benchmark`.
"""

from __future__ import annotations

import os
import time
import warnings
from collections.abc import Iterable

import numpy as np
import pandas as pd

from fednovelty.datasets.domain_pools import (
    FEMNIST_OODS,
    STREAM_DATASETS,
    DomainPools,
    parse_stream_dataset,
    stream_pools,
)
from fednovelty.datasets.streams import SCHEDULES, domain_stream
from fednovelty.evaluation.ablations import ablation_names, resolve_method
from fednovelty.evaluation.metrics import evaluate
from fednovelty.evaluation.results import METRICS, error_text, warnings_text
from fednovelty.methods import METHODS, check_known, method_names
from fednovelty.runtime.progress import progress_bar
from fednovelty.runtime.threads import torch_threads

__all__ = [
    "STREAM_COLUMNS",
    "STREAM_ROLES",
    "check_stream_datasets",
    "check_stream_methods",
    "run_stream_benchmark",
    "stream_methods",
]

#: Names that are not registry methods: the baseline's two uses.
STREAM_ROLES = ("static", "refit")
#: The refitted registry method compared by default.
DEFAULT_REFITTED = "FedGenGMM-plain"
#: Columns of :func:`run_stream_benchmark`'s table, in order.
STREAM_COLUMNS = (
    "dataset",
    "schedule",
    "cycles",
    "n_windows",
    "n_clients",
    "rows_per_window",
    "n_components",
    "covariance_type",
    "rho",
    "rounds",
    "baseline",
    "seed",
    "method",
    "window",
    "share",
    "moved",
    *METRICS,
    "bytes_up",
    "bytes_down",
    "bytes",
    "n_rounds",
    "fit_seconds",
    "score_seconds",
    "tracking_error",
    "alarms",
    "n_train",
    "n_test",
    "n_features",
    "warning",
    "error",
)


def stream_methods() -> list[str]:
    """The compared methods by default: every stream method of the registry
    (``task="stream"``), ``"static"``, ``"refit"`` and ``"FedGenGMM-plain"``."""
    return [*method_names(task="stream", variants=True), *STREAM_ROLES, DEFAULT_REFITTED]


def _learns_online(name: str) -> bool:
    """Whether ``name`` is a registry stream method (``fit`` once, then ``partial_fit``)."""
    return name in METHODS and METHODS[name].task == "stream"


def check_stream_methods(methods: Iterable[str], baseline: str = "FedGMM-plain") -> list[str]:
    """Method names as a list: a stream method of the registry (``"streaming"``), ``"static"``,
    ``"refit"`` or a federated novelty method of the registry or an ablation of one
    (:mod:`fednovelty.evaluation.ablations`), and the ``baseline``.

    Raises:
        ValueError: empty, repeated or unknown names (with the closest names), a baseline or
            method that does not fit clients (a stream's rows arrive at its clients).
    """
    methods = [methods] if isinstance(methods, str) else list(methods)
    if not methods:
        raise ValueError(f"methods is empty; choose from {', '.join(stream_methods())}.")
    repeated = sorted({m for m in methods if methods.count(m) > 1})
    if repeated:
        raise ValueError(f"methods named twice: {repeated}.")
    online = method_names(kind="federated", task="stream", variants=True)
    federated = method_names(kind="federated", variants=True)
    federated += ablation_names(federated)  # FedGenGMM-plain, ...
    check_known(
        "stream method",
        methods,
        [*online, *STREAM_ROLES, *federated],
        f" Stream methods: {', '.join([*online, *STREAM_ROLES])} or a federated method of "
        f"the registry ({', '.join(method_names(kind='federated'))}, their ablations such as "
        "FedGenGMM-plain).",
    )
    check_known("baseline", [baseline], federated, " The baseline is a federated method.")
    return methods


def check_stream_datasets(datasets: Iterable[str], data_dir=None) -> list[str]:
    """Stream dataset names as a list: ``"cifar10-svhn"``, ``"femnist"`` (``":<ood>"`` picks
    the OOD transform) or ``"A+B"`` of two ADBench names of one width.

    Raises:
        ValueError: an empty list, a name of no such form, an unknown ADBench name or OOD
            transform (with the closest names), two sets of different widths.
        FileNotFoundError: the data folder is missing.
    """
    from fednovelty.datasets import list_adbench, load_adbench

    datasets = [datasets] if isinstance(datasets, str) else list(datasets)
    if not datasets:
        raise ValueError(f"datasets is empty; name a stream: {', '.join(STREAM_DATASETS)}.")
    known = None
    for name in datasets:
        try:
            source, parts = parse_stream_dataset(name)
        except ValueError:
            check_known(
                "stream dataset",
                [name],
                list(STREAM_DATASETS),
                " Or two ADBench names of one width joined by '+' (CIFAR10_0+SVHN_0).",
            )
            raise
        if source == "femnist":
            check_known("FEMNIST OOD transform", parts, list(FEMNIST_OODS))
            continue
        known = known or list_adbench(data_dir, include_cv=True)
        check_known("ADBench dataset", parts, known)
        widths = [load_adbench(part, data_dir)[0].shape[1] for part in parts]
        if widths[0] != widths[1]:
            raise ValueError(
                f"{name}: {parts[0]} has {widths[0]} features and {parts[1]} {widths[1]}; a "
                "stream's two domains need one width (e.g. CIFAR10_0+SVHN_0)."
            )
    return list(dict.fromkeys(datasets))


def _a_components(detector, X: np.ndarray, from_a: np.ndarray) -> np.ndarray:
    """(K,) bool: components most of whose responsibility on ``X`` is A's rows."""
    import torch

    from fednovelty.mixture import predict_proba

    with torch.no_grad():
        resp = predict_proba(detector.model_, torch.as_tensor(X)).numpy()
    share_a = (resp * from_a[:, None]).sum(0) / np.maximum(resp.sum(0), 1e-12)
    return share_a > 0.5


def _tracking_error(detector, a: np.ndarray, client_share: np.ndarray) -> float:
    """Mean over clients of |weight on A's components - the client's share of A|."""
    ids = np.asarray(detector.client_ids_)
    weights = detector.client_weights_[:, a].sum(1)
    present = ids < client_share.size
    return float(np.abs(weights[present] - client_share[ids[present]]).mean())


class _Runner:
    """The detectors of one seed's stream, fitted and scored window by window."""

    def __init__(self, settings: dict, seed: int):
        self.settings = settings
        self.seed = seed
        self.detectors: dict[str, object] = {}
        self.a_components = None

    def build(self, name: str):
        s = self.settings
        method = resolve_method(s["baseline"] if name in STREAM_ROLES else name)
        shared = method.shared_params(
            n_components=s["n_components"],
            covariance_type=s["covariance_type"],
            random_state=self.seed,
        )
        if method.task == "stream":
            return method.build(
                **shared, rho=s["rho"], window_rounds=s["rounds"], **s["streaming_params"]
            )
        return method.build(**shared)

    def step(self, name: str, window) -> dict:
        """Fit (or update) ``name`` on ``window`` and score its test set: one row's values."""
        out: dict = {"fit_seconds": 0.0, "bytes_up": 0.0, "bytes_down": 0.0, "n_rounds": 0}
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            started = time.perf_counter()
            fitted = True
            if _learns_online(name) and window.t > 0:
                detector = self.detectors[name]
                detector.partial_fit(window.X, groups=window.groups)
            elif name == "static" and window.t > 0:
                detector, fitted = self.detectors[name], False
            else:
                detector = self.build(name).fit(window.X, groups=window.groups)
                self.detectors[name] = detector
            if fitted:
                out.update(
                    fit_seconds=time.perf_counter() - started,
                    bytes_up=float(detector.bytes_up_),
                    bytes_down=float(detector.bytes_down_),
                    n_rounds=int(detector.n_rounds_),
                )
            started = time.perf_counter()
            scores = np.asarray(detector.decision_function(window.X_test), dtype=np.float64)
            out["score_seconds"] = time.perf_counter() - started
        out.update(evaluate(window.y_test, scores))
        out["bytes"] = out["bytes_up"] + out["bytes_down"]
        out["warning"] = warnings_text(caught)
        if _learns_online(name):
            if window.t == 0:
                self.a_components = _a_components(detector, window.X, window.from_a)
            out["tracking_error"] = _tracking_error(
                detector, self.a_components, window.client_share
            )
            if window.t > 0:
                out["alarms"] = int(
                    sum(r["alarm"] for r in detector.drift_history_ if r["window"] == window.t)
                )
        return out


def run_stream_benchmark(
    dataset: str | DomainPools,
    methods: Iterable[str] | None = None,
    *,
    seeds: Iterable[int] = (0,),
    n_windows: int = 40,
    schedule: str = "linear",
    cycles: int = 1,
    constant: float = 0.5,
    n_clients: int | None = None,
    rows_per_window: int = 100,
    test_inliers: int = 300,
    test_novel: int = 30,
    first_share: float = 0.5,
    n_components: int = 4,
    covariance_type: str = "full",
    rho: float = 0.7,
    rounds: int = 1,
    baseline: str = "FedGMM-plain",
    streaming_params: dict | None = None,
    features: str | None = None,
    n_axes: int | None = None,
    moved_at: float = 0.3,
    n_writers: int = 40,
    data_dir: str | os.PathLike[str] | None = None,
    progress: bool | None = None,
    threads: int | None = 1,
) -> pd.DataFrame:
    """Run ``methods`` through a two-domain stream, window by window, for every seed.

    Args:
        dataset: a stream name (``"cifar10-svhn"``, ``"femnist"``, ``"femnist:rotate"``,
            ``"A+B"`` of two ADBench names of one width; the pools are split per seed), or a
            :class:`~fednovelty.datasets.domain_pools.DomainPools` (used for every seed).
        methods: stream methods of the registry (``"streaming"``), ``"static"``,
            ``"refit"`` and/or federated novelty methods of the registry (refitted every
            window); see the module doc. None: :func:`stream_methods`.
        seeds: each seed draws its own stream and seeds the detectors.
        n_windows, schedule, cycles, constant: the stream's windows after the warm-up and
            A's share (:func:`~fednovelty.datasets.streams.schedule_share`).
        n_clients, rows_per_window, test_inliers, test_novel, first_share, features, n_axes:
            the stream (:func:`~fednovelty.datasets.streams.domain_stream`; ``n_clients``
            None: 10, or every writer of FEMNIST's ``n_writers``; ``first_share``: A's share
            in the warm-up window, 1/2).
        n_components, covariance_type: every mixture's.
        rho, rounds: the streaming detector's forgetting factor and rounds per window.
        baseline: the registry method of ``"static"`` and ``"refit"``.
        streaming_params: more settings of the stream methods' detectors (e.g. the
            ``StreamingFedGMMDetector``'s ``far_quantile``).
        moved_at: a window is ``moved`` when its share is this far from the warm-up's.
        n_writers: FEMNIST writers loaded (at least ``n_clients``; the clients are the first
            ``n_clients`` of them).
        data_dir: data folder; see :func:`~fednovelty.datasets.data_dir`.
        progress: a progress bar over seeds x windows (None: only when stderr is a
            terminal).
        threads: torch threads while the run lasts (None: torch's setting).

    Returns:
        DataFrame with :data:`STREAM_COLUMNS`, one row per seed x window (0..n_windows) x
        method: the settings; ``share`` (A's share), ``moved``; the metrics ``auroc,
        aupr_in, aupr_out, fpr_at_95_tpr, max_f1`` (novel = positive class); ``bytes_up,
        bytes_down, bytes`` and ``n_rounds`` of the window's fitting (0 for the static
        detector after window 0); ``fit_seconds, score_seconds``; ``tracking_error`` and
        ``alarms`` (clients alarming in the window; stream methods' rows only, else NaN);
        ``n_train, n_test, n_features``; ``warning``, ``error``.

    Raises:
        ValueError: an unknown method, baseline, dataset or schedule, or a bad setting
            (before anything runs). FileNotFoundError: the data folder is missing.

    Example:
        >>> from fednovelty.datasets.domain_pools import DomainPools
        >>> rng = np.random.default_rng(0)
        >>> pools = DomainPools("toy", rng.normal(0, 1, (300, 2)), rng.normal(5, 1, (300, 2)),
        ...     rng.normal(0, 1, (100, 2)), rng.normal(5, 1, (100, 2)), rng.normal(10, 1, (50, 2)))
        >>> df = run_stream_benchmark(pools, n_windows=4, n_clients=3, rows_per_window=40,
        ...     n_components=2, progress=False)
        >>> df.groupby("method", sort=False)["auroc"].size().to_dict()
        {'streaming': 5, 'static': 5, 'refit': 5, 'FedGenGMM-plain': 5}
    """
    methods = check_stream_methods(stream_methods() if methods is None else methods, baseline)
    if not isinstance(dataset, DomainPools):
        check_stream_datasets([dataset], data_dir)
    if schedule not in SCHEDULES:
        raise ValueError(f"schedule must be one of {SCHEDULES}; got {schedule!r}.")
    for name, value, low in (("n_components", n_components, 1), ("rounds", rounds, 0)):
        if isinstance(value, bool) or not isinstance(value, int | np.integer) or value < low:
            raise ValueError(f"{name} must be an integer >= {low}; got {value!r}.")
    if isinstance(rho, bool) or not isinstance(rho, int | float) or not 0.0 <= rho <= 1.0:
        raise ValueError(f"rho must be a number in [0, 1]; got {rho!r}.")
    if not 0.0 <= moved_at <= 1.0:
        raise ValueError(f"moved_at must be in [0, 1]; got {moved_at!r}.")
    seeds = [int(s) for s in ([seeds] if isinstance(seeds, int) else seeds)]
    if not seeds:
        raise ValueError("seeds is empty; give at least one (e.g. seeds=[0]).")
    settings = {
        "n_components": int(n_components),
        "covariance_type": covariance_type,
        "rho": float(rho),
        "rounds": int(rounds),
        "baseline": baseline,
        "streaming_params": dict(streaming_params or {}),
    }

    def make_stream(seed: int):
        pools = dataset
        if not isinstance(pools, DomainPools):
            writers = max(n_writers, n_clients or 0)
            pools = stream_pools(dataset, n_writers=writers, random_state=seed, data_dir=data_dir)
        return domain_stream(
            pools,
            n_windows,
            kind=schedule,
            cycles=cycles,
            constant=constant,
            n_clients=n_clients,
            rows_per_window=rows_per_window,
            test_inliers=test_inliers,
            test_novel=test_novel,
            first_share=first_share,
            features=features,
            n_axes=n_axes,
            random_state=seed,
        )

    rows: list[dict] = []
    bar = progress_bar(
        total=len(seeds) * (n_windows + 1), desc="stream", unit="window", enabled=progress
    )
    with torch_threads(threads):
        for seed in seeds:
            stream = make_stream(seed)
            runner = _Runner(settings, seed)
            config = {
                "dataset": stream.name,
                "schedule": schedule,
                "cycles": stream.cycles,
                "n_windows": stream.n_windows,
                "n_clients": stream.n_clients,
                "rows_per_window": stream.rows_per_window,
                **{k: v for k, v in settings.items() if k != "streaming_params"},
                "seed": seed,
            }
            for window in stream.windows:
                bar.set_postfix_str(f"{stream.name} seed={seed} window={window.t}")
                for name in methods:
                    row = {
                        **config,
                        "method": name,
                        "window": window.t,
                        "share": window.share,
                        "moved": abs(window.share - stream.first_share) >= moved_at,
                        "n_train": int(window.X.shape[0]),
                        "n_test": int(window.X_test.shape[0]),
                        "n_features": int(window.X.shape[1]),
                    }
                    if (
                        (name == "static" or _learns_online(name))
                        and window.t > 0
                        and (name not in runner.detectors)
                    ):
                        row["error"] = "not fitted: its warm-up window failed"
                    else:
                        try:
                            row.update(runner.step(name, window))
                        except Exception as error:  # recorded; the stream goes on
                            row["error"] = error_text(error)
                    rows.append(row)
                bar.update(1)
    bar.close()
    frame = pd.DataFrame(rows).reindex(columns=list(STREAM_COLUMNS))
    for column in (*METRICS, "bytes_up", "bytes_down", "bytes", "tracking_error", "alarms"):
        frame[column] = pd.to_numeric(frame[column], errors="coerce")
    for column in ("warning", "error"):
        frame[column] = frame[column].astype(object).where(frame[column].notna(), None)
    return frame
