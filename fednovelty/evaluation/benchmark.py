"""Benchmark runner: a grid of tasks x methods -> one tidy pandas DataFrame, resumable.

:func:`run_benchmark` walks the grid dataset x protocol x alpha x n_clients x seed (one
:func:`~fednovelty.datasets.protocols.make_task` each, shared by every method) x
n_components x client_components x method, fits each method on the task's training rows,
scores the test rows with ``decision_function`` (higher = more anomalous, for PyOD and
fednovelty alike) and records one row per cell (see
:data:`~fednovelty.evaluation.results.COLUMNS`). :func:`~fednovelty.evaluation.summary.summarize`
turns the table into markdown.

Methods are the novelty methods of the registry (:mod:`fednovelty.methods`);
``DEFAULT_METHODS`` is every one but the variants (FedVB's one-shot aggregations).
``ablations`` runs each method that takes them also as its ablations, the robust defaults
switched off (:mod:`fednovelty.evaluation.ablations`: ``"FedGenGMM-plain"``, ...), and an
ablation's name among the methods runs that ablation alone. A method that
fits clients (``Method.fits_clients``: the federated ones and ``Local``) is fitted with
``groups`` = the client of each row and reports its rounds and bytes; the others (the pooled
``CentralGMM`` and the PyOD baselines) are fitted on the pooled rows, and their ``rounds``
and bytes are NaN: nothing is communicated. Each method receives the grid's settings it
takes (``Method.shared``): the mixtures' ``n_components`` (K), FedGenGMM's and Local's
``client_components`` (K_c), ``covariance_type`` and the cell's seed as ``random_state``.

Choices, and why:

- Resumable by construction: with ``out_csv`` every finished cell is appended to the file at
  once (:mod:`fednovelty.evaluation.results`), and a later call skips the cells found there
  (matched on every configuration column), so a killed run loses at most the cell in progress
  and a grid can be grown step by step.
- A failure is a result: an exception in a task or a method is recorded in the ``error``
  column (metrics NaN) and the grid goes on; the cell counts as finished (``retry_errors=True``
  runs it again). Warnings (e.g. EM not converged) are caught and kept in ``warning``.
- The mixture methods share ``n_components`` (K), so FedGenGMM is compared with centralized
  EM of the same K and covariance type, as in the FedGenGMM paper; ``client_components``
  (None = chosen per client by BIC in 1..10) is a grid axis only for the methods that take it.
- One torch thread by default while the grid runs (``threads``): the mixtures are small, and
  more threads on a shared machine oversubscribe its cores (``benchmarks/README.md``,
  "Threads under load").
"""

from __future__ import annotations

import os
import time
import warnings
from collections.abc import Iterable
from itertools import product
from pathlib import Path

import numpy as np
import pandas as pd

from fednovelty.evaluation.ablations import ABLATIONS, resolve_method, with_ablations
from fednovelty.evaluation.metrics import evaluate
from fednovelty.evaluation.results import (
    COLUMNS,
    CONFIG_COLUMNS,
    METRICS,
    append_row,
    cell_key,
    check_results_file,
    error_text,
    read_finished,
    short_text,
    warnings_text,
)
from fednovelty.evaluation.summary import summarize
from fednovelty.methods import METHODS, Method, check_known, method_names
from fednovelty.runtime.progress import progress_bar
from fednovelty.runtime.threads import torch_threads

__all__ = [
    "COLUMNS",
    "CONFIG_COLUMNS",
    "DEFAULT_METHODS",
    "METHODS",
    "METRICS",
    "Method",
    "check_datasets",
    "check_grid",
    "check_methods",
    "check_results_file",
    "run_benchmark",
    "summarize",
]

#: The methods a run uses when none are named: every novelty method but the variants.
DEFAULT_METHODS: tuple[str, ...] = tuple(method_names())


# ----------------------------------------------------------------------------- validation
def check_methods(methods: Iterable[str], ablations: Iterable[str] = ()) -> list[str]:
    """The methods a run compares, as a list: ``methods``, then the ``ablations`` of each
    that takes them (:func:`~fednovelty.evaluation.ablations.with_ablations`).

    Known: the registry's novelty methods and the ablations of those (``"FedGenGMM-plain"``);
    a method of another task (a personalised classifier, ``task="pfl"``; a detector that
    learns window by window, ``task="stream"``) is refused with the reason.

    Raises:
        ValueError: an unknown method or ablation (with the closest names), a method of
            another task, an ablation no method named takes.
    """
    methods = [methods] if isinstance(methods, str) else list(methods)
    known = method_names(variants=True)
    if not methods:
        raise ValueError(f"methods is empty; choose from {', '.join(method_names())}.")
    other = [m for m in methods if m in METHODS and METHODS[m].task != "novelty"]
    if other:
        why = {
            "pfl": "personalised classification (task='pfl') needs class labels",
            "stream": "learns window by window (task='stream'): run it with bench --stream",
        }
        reasons = "; ".join(f"{m}: {why[METHODS[m].task]}" for m in other)
        raise ValueError(
            f"{reasons}. bench runs novelty detectors: {', '.join(method_names())} (and "
            "their ablations)."
        )
    for name in methods:
        base, _, ablation = name.rpartition("-")
        if name not in known and base in known and ablation in ABLATIONS:
            resolve_method(name)  # raises if the method does not take the ablation
        else:
            check_known("method", [name], known, f" Ablations: METHOD-{'/'.join(ABLATIONS)}.")
    return with_ablations(methods, ablations)


def check_datasets(datasets: Iterable[str], data_dir=None) -> list[str]:
    """Dataset names as a list (``"all"`` = every ADBench tabular set); unknown names raise
    ValueError with the closest names. A name may carry an OOD suffix: ``"10_cover:noise"``."""
    from fednovelty.datasets import list_adbench
    from fednovelty.datasets.protocols import BUNDLED_DIGITS, OOD_KINDS, parse_dataset

    datasets = [datasets] if isinstance(datasets, str) else list(datasets)
    if not datasets:
        raise ValueError("datasets is empty; name at least one, e.g. '4_breastw'.")
    if all(parse_dataset(name)[0] == BUNDLED_DIGITS for name in datasets):
        tabular, embeddings = [], []  # scikit-learn's own digits: no data folder needed
    else:
        tabular = list_adbench(data_dir)
        embeddings = list_adbench(data_dir, include_cv=True)[len(tabular) :]
    known = [*tabular, *embeddings, "mnist", "femnist", BUNDLED_DIGITS]
    out: list[str] = []
    for name in datasets:
        out.extend(tabular if name == "all" else [name])
    parsed = [parse_dataset(name) for name in out]
    check_known(
        "dataset",
        [base for base, _ in parsed],
        known,
        " 'all' = every ADBench tabular dataset; 'mnist' = MNIST; 'femnist' = FEMNIST's "
        "writers as clients; 'digits' = scikit-learn's "
        "bundled digits; add ':noise' for the Gaussian-noise OOD set.",
    )
    check_known("OOD suffix", [o for _, o in parsed if o is not None], list(OOD_KINDS))
    return list(dict.fromkeys(out))


def check_grid(
    datasets: Iterable[str],
    methods: Iterable[str],
    *,
    ablations: Iterable[str] = (),
    protocols: Iterable[str] = ("novelty",),
    alphas: Iterable[float | None] = (0.5,),
    partition: str = "dirichlet",
    data_dir: str | os.PathLike[str] | None = None,
) -> tuple[list[str], list[str], list[str], list]:
    """The grid's names and alphas checked as :func:`run_benchmark` checks them before it runs
    anything: ``(datasets, methods, protocols, alphas)`` as lists (``methods`` with the
    ablations added, :func:`check_methods`; ``alphas`` is ``[None]`` for
    ``partition="iid"``).

    Raises:
        ValueError: an unknown dataset, method, ablation, protocol or partition (with the
            closest names), or an alpha that is not a group count for
            ``partition="quantity"``.
    """
    from fednovelty.datasets.protocols import PARTITIONS, PROTOCOLS

    datasets = check_datasets(datasets, data_dir)
    methods = check_methods(methods, ablations)
    protocols = _as_list(protocols)
    check_known("protocol", protocols, list(PROTOCOLS))
    check_known("partition", [partition], list(PARTITIONS))
    alphas = [None] if partition == "iid" else _as_list(alphas)
    if partition == "quantity" and any(a is None or float(a) != int(a) or a < 1 for a in alphas):
        raise ValueError(
            f"partition='quantity' reads each alpha as the number of groups per client, an "
            f"integer >= 1; got alphas={alphas}."
        )
    return datasets, methods, protocols, alphas


# ----------------------------------------------------------------------------- the grid
def _as_list(value) -> list:
    if value is None or isinstance(value, str | int | float | np.integer | np.floating):
        return [value]
    return list(value)


def _run_cell(method: Method, task, settings: dict) -> dict:
    """Fit and score one method on one task; metrics, communication and timings.

    ``settings`` are the cell's shared settings (``SHARED_SETTINGS`` of
    :mod:`fednovelty.methods`); the method receives those it takes.
    """
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        detector = method.build(**method.shared_params(**settings))
        started = time.perf_counter()
        if method.fits_clients:
            detector.fit(task.X_train, groups=task.groups_train)
        else:
            detector.fit(task.X_train)
        fit_seconds = time.perf_counter() - started
        started = time.perf_counter()
        scores = np.asarray(detector.decision_function(task.X_test), dtype=np.float64)
        score_seconds = time.perf_counter() - started
    out = dict(evaluate(task.y_test, scores))
    if method.fits_clients:
        out.update(
            rounds=detector.n_rounds_, bytes_up=detector.bytes_up_, bytes_down=detector.bytes_down_
        )
    out.update(fit_seconds=fit_seconds, score_seconds=score_seconds, warning=warnings_text(caught))
    return out


def _cell_row(config: dict, task, task_error: str | None) -> dict:
    """One results row: the configuration, the task's sizes, and metrics or the error."""
    row = {**config}
    if task is None:
        return row | {"error": task_error}
    row.update(
        n_train=task.X_train.shape[0],
        n_test=task.X_test.shape[0],
        n_features=task.n_features,
        novel_share=float(task.y_test.mean()),
    )
    try:
        row.update(
            _run_cell(
                resolve_method(config["method"]),
                task,
                {
                    "n_components": config["n_components"],
                    "client_components": config["client_components"],
                    "covariance_type": config["covariance_type"],
                    "random_state": config["seed"],
                },
            )
        )
    except Exception as error:
        row["error"] = error_text(error)
    return row


def run_benchmark(
    datasets: Iterable[str],
    methods: Iterable[str],
    *,
    ablations: Iterable[str] = (),
    protocols: Iterable[str] = ("novelty",),
    alphas: Iterable[float | None] = (0.5,),
    n_clients: Iterable[int] = (10,),
    seeds: Iterable[int] = (0,),
    n_components: int | Iterable[int] = 10,
    client_components: int | Iterable[int | None] | None = None,
    partition: str = "dirichlet",
    covariance_type: str = "full",
    max_train: int | None = None,
    max_test: int | None = None,
    min_size: int | None = None,
    out_csv: str | os.PathLike[str] | None = None,
    retry_errors: bool = False,
    progress: bool | None = None,
    data_dir: str | os.PathLike[str] | None = None,
    threads: int | None = 1,
) -> pd.DataFrame:
    """Run every cell of the grid and return the results, one row per cell.

    Args:
        datasets: ADBench names, ``"all"`` (every tabular set), ``"mnist"``, ``"digits"``; a
            ``":noise"`` (or MNIST ``":rotate"``, ...) suffix picks the OOD set (see
            ``make_task``).
        methods: names of novelty methods of :mod:`fednovelty.methods`, or of an ablation
            of one (``"FedGenGMM-plain"``: that ablation alone).
        ablations: names of :data:`~fednovelty.evaluation.ablations.ABLATIONS` (``"plain"``,
            ``"std"``, ``"prior"``; ``"plain,std"`` is split at commas): each method that
            takes them runs also as ``<method>-<ablation>`` (a method of its own in the
            results, after ``methods``); the others run as themselves only.
        protocols: ``"novelty"`` and/or ``"outlier"``.
        alphas: Dirichlet concentrations (groups per client for ``partition="quantity"``;
            ignored and recorded as NaN for ``"iid"``).
        n_clients: client counts.
        seeds: seeds; each drives the split, the partition and the methods.
        n_components: K of the mixture methods (FedGenGMM's global K), one or a sequence.
        client_components: K_c of FedGenGMM's and Local's client mixtures (None: BIC in
            1..10), one or a sequence; a grid axis for those two methods only.
        partition: ``"dirichlet"``, ``"quantity"`` or ``"iid"``.
        covariance_type: of every mixture method.
        max_train, max_test: caps on training and test rows per task (for speed).
        min_size: rows every Dirichlet client must hold (``make_task``'s; None: its default,
            at most 10). Many clients with a small alpha need it lower: 320 clients sharing
            20,000 rows by Dirichlet(0.2) almost never all get 10 rows.
        out_csv: results file. Existing cells in it are skipped and returned; new rows are
            appended as each cell finishes.
        retry_errors: run again the cells whose stored row has an error.
        progress: show a progress bar over the cells (None: only when stderr is a
            terminal).
        data_dir: data folder; see :func:`~fednovelty.datasets.data_dir`.
        threads: torch intra-op threads while the grid runs (restored afterwards); None keeps
            torch's setting. One is the default because the mixtures here are small (see the
            module doc).

    Returns:
        DataFrame with the columns ``COLUMNS`` and one row per cell of this grid (those read
        from ``out_csv`` included), in grid order: ``dataset, protocol, partition, alpha,
        n_clients, seed, n_components, client_components (NaN: BIC or not applicable),
        covariance_type, max_train, max_test, method``; the metrics ``auroc, aupr_in,
        aupr_out, fpr_at_95_tpr, max_f1`` (novel = positive class); ``rounds, bytes_up,
        bytes_down`` (NaN for centralized methods); ``fit_seconds, score_seconds, n_train,
        n_test, n_features, novel_share, warning, error`` (None when the cell succeeded).

    Raises:
        ValueError: an unknown dataset, method, ablation, protocol or partition, or an
            ``out_csv`` that is not a results file (before anything runs).

    Example:
        >>> df = run_benchmark(["4_breastw"], ["IForest"], progress=False)  # doctest: +SKIP
        >>> df[["dataset", "method", "auroc"]]  # doctest: +SKIP
    """
    from fednovelty.datasets.protocols import make_task

    datasets, methods, protocols, alphas = check_grid(
        datasets,
        methods,
        ablations=ablations,
        protocols=protocols,
        alphas=alphas,
        partition=partition,
        data_dir=data_dir,
    )
    sizes = [(k, kc) for k in _as_list(n_components) for kc in _as_list(client_components)]
    resolved = {name: resolve_method(name) for name in methods}

    out_path = Path(out_csv) if out_csv is not None else None
    stored: dict[tuple[str, ...], dict] = {}
    header = list(COLUMNS)
    if out_path is not None:
        check_results_file(out_path)
        out_path.parent.mkdir(parents=True, exist_ok=True)
        done = read_finished(out_path)
        header = list(done.columns) if len(done.columns) else header
        for row in done.to_dict("records"):
            stored[cell_key(row)] = row  # the last row of a cell wins (retries append)

    def is_done(key) -> bool:
        row = stored.get(key)
        return row is not None and not (retry_errors and isinstance(row.get("error"), str))

    # Cells, grouped by task so a task is built once and only when a cell needs it.
    plan = []
    for dataset, protocol, alpha, clients, seed in product(
        datasets, protocols, alphas, _as_list(n_clients), _as_list(seeds)
    ):
        cells = []
        for (k, kc), name in product(sizes, methods):
            if "client_components" not in resolved[name].shared:
                kc = None  # K_c does not change this method: one cell per K (deduplicated)
            config = {
                "dataset": dataset,
                "protocol": protocol,
                "partition": partition,
                "alpha": alpha,
                "n_clients": clients,
                "seed": seed,
                "n_components": k,
                "client_components": kc,
                "covariance_type": covariance_type,
                "max_train": max_train,
                "max_test": max_test,
                "min_size": min_size,
                "method": name,
            }
            if config not in cells:
                cells.append(config)
        plan.append(((dataset, protocol, alpha, clients, seed), cells))

    n_cells = sum(len(cells) for _, cells in plan)
    results: list[dict] = []
    bar = progress_bar(total=n_cells, desc="bench", unit="cell", enabled=progress)
    with torch_threads(threads):
        for (dataset, protocol, alpha, clients, seed), cells in plan:
            todo = [c for c in cells if not is_done(cell_key(c))]
            results.extend(stored[cell_key(c)] for c in cells if is_done(cell_key(c)))
            bar.update(len(cells) - len(todo))
            if not todo:
                continue
            bar.set_postfix_str(f"{dataset} {protocol} alpha={alpha} clients={clients} seed={seed}")
            task, task_error = None, None
            try:
                task = make_task(
                    dataset,
                    protocol,
                    n_clients=clients,
                    alpha=alpha,
                    partition=partition,
                    seed=seed,
                    data_dir=data_dir,
                    max_train=max_train,
                    max_test=max_test,
                    min_size=min_size,
                )
            except Exception as error:  # recorded for every cell of the task
                task_error = f"task: {type(error).__name__}: {short_text(error)}"
            for config in todo:
                bar.set_postfix_str(f"{dataset} {config['method']}")
                row = _cell_row(config, task, task_error)
                row = {c: row.get(c) for c in header} | {c: row.get(c) for c in COLUMNS}
                if out_path is not None:
                    append_row(out_path, row, header)
                results.append(row)
                bar.update(1)
    bar.close()
    frame = pd.DataFrame(results).reindex(columns=list(COLUMNS))
    for column in ("alpha", *METRICS, "rounds", "bytes_up", "bytes_down", "client_components"):
        frame[column] = pd.to_numeric(frame[column], errors="coerce")
    for column in ("warning", "error"):  # text or None
        frame[column] = frame[column].astype(object).where(frame[column].notna(), None)
    return frame
