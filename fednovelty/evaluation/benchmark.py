"""Benchmark runner: a grid of tasks x methods -> one tidy pandas DataFrame, resumable.

:func:`run_benchmark` walks the grid dataset x protocol x alpha x n_clients x seed (one
:func:`~fednovelty.datasets.protocols.make_task` each, shared by every method) x
n_components x client_components x method, fits each method on the task's training rows,
scores the test rows with ``decision_function`` (higher = more anomalous, for PyOD and
fednovelty alike) and records one row per cell (see ``COLUMNS``). :func:`summarize` turns the
table into markdown.

Methods (``METHODS``, by the papers' names):

- federated, fitted with ``groups`` = the client of each row: ``FedGenGMM`` (one-shot),
  ``FedGenGMM-copula`` (the same round; the server also fits a Gaussian copula and scores with it),
  ``FedGMM`` (federated EM, personal mixture weights), ``DEM-kmeans``, ``DEM-separated``,
  ``DEM-subset`` (federated EM, global weights, each DEM initialisation), ``Local`` (each client's
  own mixture, their densities combined by client size);
- centralized, fitted on the pooled rows: ``CentralGMM`` (EM on the pooled rows, the papers'
  "ideal"; the same detector as DEM-kmeans with one client and no privacy floor) and PyOD's
  ``IForest``, ``ECOD``, ``COPOD``, ``KNN``, ``LOF``, ``HBOS``, ``PCA`` with their default
  settings (the baselines a user would otherwise pick). Their ``rounds`` and bytes are NaN:
  nothing is communicated.

Every mixture method runs with the detectors' defaults (federated standardisation and the
covariance prior, ``docs/robust.md``). Its ablations are methods too, by suffix (``VARIANTS``):
``-plain`` (neither: the papers' plain maximum-likelihood mixture, the behaviour before the
remedies), ``-std`` (standardisation only) and ``-prior`` (the prior on the raw features).

Choices, and why:

- Resumable by construction: with ``out_csv`` every finished cell is appended to the file at
  once, and a later call skips the cells found there (matched on every configuration column),
  so a killed run loses at most the cell in progress and a grid can be grown step by step.
  Each cell is one whole line written by one ``write`` and flushed to disk; a row torn by a
  kill or a full disk (a last line without its newline, too few fields) does not count as
  finished: it is dropped with a warning, the file rewritten atomically without it, and the
  cell runs again.
- A failure is a result: an exception in a task or a method is recorded in the ``error``
  column (metrics NaN) and the grid goes on; the cell counts as finished (``retry_errors=True``
  runs it again). Warnings (e.g. EM not converged) are caught and kept in ``warning``.
- The mixture methods share ``n_components`` (K), so FedGenGMM is compared with centralized
  EM of the same K and covariance type, as in the FedGenGMM paper; ``client_components``
  (K_c of FedGenGMM and Local; None = chosen per client by BIC in 1..10) is a grid axis only
  for the methods that use it.
- One torch thread by default while the grid runs (``threads``): the mixtures are small, and on
  a shared two-core machine two threads made the same fits 14-30x slower (oversubscription).
"""

from __future__ import annotations

import csv
import difflib
import io
import math
import os
import time
import traceback
import warnings
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from itertools import product
from pathlib import Path

import numpy as np
import pandas as pd
from tqdm.auto import tqdm

from fednovelty.evaluation.metrics import evaluate
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

METRICS = ("auroc", "aupr_in", "aupr_out", "fpr_at_95_tpr", "max_f1")
#: Columns that identify a cell; a resumed run skips a cell whose values all match.
CONFIG_COLUMNS = (
    "dataset",
    "protocol",
    "partition",
    "alpha",
    "n_clients",
    "seed",
    "n_components",
    "client_components",
    "covariance_type",
    "max_train",
    "max_test",
    "min_size",
    "method",
)
COLUMNS = (
    *CONFIG_COLUMNS,
    *METRICS,
    "rounds",
    "bytes_up",
    "bytes_down",
    "fit_seconds",
    "score_seconds",
    "n_train",
    "n_test",
    "n_features",
    "novel_share",
    "warning",
    "error",
)


@dataclass(frozen=True)
class Method:
    """A named detector configuration.

    Attributes:
        name: the name used in results (``"FedGenGMM"``, ``"IForest"``, ...).
        build: ``(n_components, client_components, covariance_type, seed) -> detector``; the
            detector has ``fit`` and ``decision_function`` (higher = more anomalous).
        federated: fit with ``groups=`` (client per row) and report communication; otherwise
            fit on the pooled rows.
        uses_client_components: whether ``client_components`` changes the detector.
    """

    name: str
    build: Callable[[int, int | None, str, int], object]
    federated: bool
    uses_client_components: bool = False


#: Ablation suffixes of the mixture methods -> detector settings.
VARIANTS: dict[str, dict] = {
    "": {},
    "-plain": {"standardize": False, "covariance_prior": None},
    "-std": {"covariance_prior": None},
    "-prior": {"standardize": False},
}


def _fedgengmm(**settings):
    def build(k, kc, cov, seed):
        from fednovelty.detectors import FedGenGMMDetector

        return FedGenGMMDetector(
            n_components=k, client_components=kc, covariance_type=cov, random_state=seed, **settings
        )

    return build


def _local(**settings):
    def build(k, kc, cov, seed):
        from fednovelty.detectors import LocalGMMDetector

        return LocalGMMDetector(
            client_components=kc, covariance_type=cov, random_state=seed, **settings
        )

    return build


def _em(mixture_weights: str, init_params: str = "kmeans", **settings):
    def build(k, kc, cov, seed):
        from fednovelty.detectors import FedGMMDetector

        return FedGMMDetector(
            k,
            covariance_type=cov,
            mixture_weights=mixture_weights,
            init_params=init_params,
            random_state=seed,
            **settings,
        )

    return build


def _pyod(class_name: str, module: str, seeded: bool = False):
    def build(k, kc, cov, seed):
        import importlib

        cls = getattr(importlib.import_module(f"pyod.models.{module}"), class_name)
        return cls(random_state=seed) if seeded else cls()

    return build


def _mixture_methods() -> list[Method]:
    out = []
    for suffix, settings in VARIANTS.items():
        out += [
            Method(f"FedGenGMM{suffix}", _fedgengmm(**settings), True, True),
            Method(f"FedGMM{suffix}", _em("personal", **settings), True),
            Method(f"DEM-kmeans{suffix}", _em("global", "kmeans", **settings), True),
            Method(f"DEM-separated{suffix}", _em("global", "separated", **settings), True),
            Method(f"DEM-subset{suffix}", _em("global", "subset", **settings), True),
            Method(f"Local{suffix}", _local(**settings), True, True),
            # pooled rows cross no wire: no privacy floor
            Method(
                f"CentralGMM{suffix}",
                _em("global", "kmeans", **{"privacy_min_rows": 1, **settings}),
                False,
            ),
        ]
    return out


METHODS: dict[str, Method] = {
    m.name: m
    for m in (
        *_mixture_methods(),
        Method("FedGenGMM-copula", _fedgengmm(copula=True), True, True),
        Method("IForest", _pyod("IForest", "iforest", seeded=True), False),
        Method("ECOD", _pyod("ECOD", "ecod"), False),
        Method("COPOD", _pyod("COPOD", "copod"), False),
        Method("KNN", _pyod("KNN", "knn"), False),
        Method("LOF", _pyod("LOF", "lof"), False),
        Method("HBOS", _pyod("HBOS", "hbos"), False),
        Method("PCA", _pyod("PCA", "pca", seeded=True), False),
    )
}

#: The methods a run uses when none are named: every method but the ablation variants.
DEFAULT_METHODS: tuple[str, ...] = tuple(
    name for name in METHODS if not any(name.endswith(v) for v in VARIANTS if v)
)


# ----------------------------------------------------------------------------- validation
def _unknown(kind: str, names: Iterable[str], known: Sequence[str], extra: str = "") -> None:
    bad = [n for n in names if n not in known]
    if not bad:
        return
    hints = []
    for name in bad:
        close = difflib.get_close_matches(name, known, n=3, cutoff=0.5)
        close += [k for k in known if name.lower() in k.lower() and k not in close]
        hints.append(f"{name!r}" + (f" (did you mean {', '.join(close[:3])}?)" if close else ""))
    listed = f" Known: {', '.join(known)}." if len(known) <= 20 else ""
    raise ValueError(f"unknown {kind} {', '.join(hints)}.{listed}{extra}")


def check_methods(methods: Iterable[str]) -> list[str]:
    """Method names as a list; unknown names raise ValueError with the closest names."""
    methods = [methods] if isinstance(methods, str) else list(methods)
    if not methods:
        raise ValueError(f"methods is empty; choose from {', '.join(METHODS)}.")
    _unknown("method", methods, list(METHODS))
    return methods


def check_datasets(datasets: Iterable[str], data_dir=None) -> list[str]:
    """Dataset names as a list (``"all"`` = every ADBench tabular set); unknown names raise
    ValueError with the closest names. A name may carry an OOD suffix: ``"10_cover:noise"``."""
    from fednovelty.datasets import list_adbench
    from fednovelty.datasets.protocols import OOD_KINDS, parse_dataset

    datasets = [datasets] if isinstance(datasets, str) else list(datasets)
    if not datasets:
        raise ValueError("datasets is empty; name at least one, e.g. '4_breastw'.")
    tabular = list_adbench(data_dir)
    known = [*tabular, *list_adbench(data_dir, include_cv=True)[len(tabular) :], "mnist"]
    out: list[str] = []
    for name in datasets:
        out.extend(tabular if name == "all" else [name])
    parsed = [parse_dataset(name) for name in out]
    _unknown(
        "dataset",
        [base for base, _ in parsed],
        known,
        " 'all' = every ADBench tabular dataset; 'mnist' = MNIST; add ':noise' for the "
        "Gaussian-noise OOD set.",
    )
    _unknown("OOD suffix", [o for _, o in parsed if o is not None], list(OOD_KINDS))
    return list(dict.fromkeys(out))


def check_grid(
    datasets: Iterable[str],
    methods: Iterable[str],
    *,
    protocols: Iterable[str] = ("novelty",),
    alphas: Iterable[float | None] = (0.5,),
    partition: str = "dirichlet",
    data_dir: str | os.PathLike[str] | None = None,
) -> tuple[list[str], list[str], list[str], list]:
    """The grid's names and alphas checked as :func:`run_benchmark` checks them before it runs
    anything: ``(datasets, methods, protocols, alphas)`` as lists (``alphas`` is ``[None]``
    for ``partition="iid"``).

    Raises:
        ValueError: an unknown dataset, method, protocol or partition (with the closest
            names), or an alpha that is not a group count for ``partition="quantity"``.
    """
    from fednovelty.datasets.protocols import PARTITIONS, PROTOCOLS

    datasets = check_datasets(datasets, data_dir)
    methods = check_methods(methods)
    protocols = _as_list(protocols)
    _unknown("protocol", protocols, list(PROTOCOLS))
    _unknown("partition", [partition], list(PARTITIONS))
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


def _key_part(value) -> str:
    """Canonical text of a configuration value, equal for ``4``, ``4.0``, ``"4"`` (CSV)."""
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return ""
    if isinstance(value, str):
        try:
            return repr(float(value))
        except ValueError:
            return value
    if isinstance(value, int | float | np.integer | np.floating):
        return repr(float(value))
    return str(value)


def _key(row) -> tuple[str, ...]:
    return tuple(_key_part(row[c]) for c in CONFIG_COLUMNS)


def check_results_file(out_csv: str | os.PathLike[str]) -> None:
    """Check that ``out_csv`` is absent, empty or a results file of :func:`run_benchmark`
    (its header names ``dataset`` and ``method``), so that resuming into it never rewrites
    another file.

    Raises:
        ValueError: ``out_csv`` is a folder, or a file with another header.
    """
    path = Path(out_csv)
    if path.is_dir():
        raise ValueError(f"{path} is a folder; out_csv must name a .csv file.")
    if not path.is_file():
        return
    with open(path, "rb") as handle:
        first = handle.readline()
    if not first.endswith(b"\n"):  # empty, or a header torn while it was written
        return
    columns = next(csv.reader([first.decode("utf-8", errors="replace")]), [])
    missing = [c for c in ("dataset", "method") if c not in columns]
    if missing:
        raise ValueError(
            f"{path} exists and is not a fednovelty bench results file (its header lacks "
            f"{', '.join(missing)}); resuming would rewrite it. Choose another output."
        )


def _read_done(out_csv: Path) -> pd.DataFrame:
    """The finished cells stored in ``out_csv`` (columns as its header).

    A row is finished only if it is whole: a last line without its newline (a run killed or
    a disk filled while it was written) or a row with another number of fields than the
    header is dropped with a ``RuntimeWarning``, its cell runs again, and the file is
    rewritten (atomically) without it so the next appended row starts on a line of its own.
    A file of an older version (missing columns) is rewritten with the current columns.
    """
    if not out_csv.is_file() or out_csv.stat().st_size == 0:
        return pd.DataFrame(columns=list(COLUMNS))
    text = out_csv.read_bytes().decode("utf-8", errors="replace")
    header, rows, dropped = _whole_rows(text)
    if header is None:  # not even a whole header line: nothing was finished
        _replace_text(out_csv, "")
        return pd.DataFrame(columns=list(COLUMNS))
    if dropped:
        warnings.warn(
            f"{out_csv}: dropped {len(dropped)} incomplete row(s) at line(s) {dropped} (a run "
            "stopped while writing them); their cells run again.",
            RuntimeWarning,
            stacklevel=3,
        )
    clean = _csv_text([header, *rows])
    done = pd.read_csv(io.StringIO(clean), dtype={"dataset": str, "method": str, "error": str})
    missing = [c for c in COLUMNS if c not in done.columns]
    if missing:  # a file from an older version: rewrite it with the current columns
        done = done.reindex(columns=[*COLUMNS, *[c for c in done.columns if c not in COLUMNS]])
        _replace_text(out_csv, done.to_csv(index=False, lineterminator="\n"))
    elif dropped:
        _replace_text(out_csv, clean)
    return done


def _whole_rows(text: str) -> tuple[list[str] | None, list[list[str]], list[int]]:
    """``(header, rows, dropped)`` of CSV ``text``: the rows with as many fields as the header
    and a dataset and a method, and the 1-based line numbers of the rows left out (a last line
    without its newline is always left out)."""
    complete = text.endswith("\n")
    records = list(csv.reader(io.StringIO(text)))
    lines = _record_lines(text)
    dropped = []
    if not complete and records:
        dropped.append(lines[-1])
        records, lines = records[:-1], lines[:-1]
    if not records:
        return None, [], dropped
    header, keep = records[0], []
    named = [header.index(c) for c in ("dataset", "method") if c in header]
    for record, line in zip(records[1:], lines[1:], strict=True):
        if len(record) == len(header) and all(record[i] for i in named):
            keep.append(record)
        elif record:  # an empty record is a blank line, not a torn row
            dropped.append(line)
    return header, keep, sorted(dropped)


def _record_lines(text: str) -> list[int]:
    """1-based line on which each CSV record of ``text`` starts (quoted newlines included)."""
    starts, reader = [], csv.reader(io.StringIO(text))
    line = 1
    for _ in reader:
        starts.append(line)
        line = reader.line_num + 1
    return starts


def _csv_text(records: list[list[str]]) -> str:
    """CSV text of ``records`` (quoted where needed, ``\\n`` line ends)."""
    out = io.StringIO()
    csv.writer(out, lineterminator="\n").writerows(records)
    return out.getvalue()


def _replace_text(path: Path, text: str) -> None:
    """Write ``text`` to ``path`` atomically: a temporary file in the same folder, flushed to
    disk, renamed over ``path``."""
    temporary = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        with open(temporary, "w", encoding="utf-8", newline="") as handle:
            handle.write(text)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(temporary, path)
    finally:
        if temporary.exists():
            temporary.unlink()


def _append(out_csv: Path, row: dict, header: list[str]) -> None:
    """Append ``row`` (and the header, to an empty file) as whole lines in one ``write``
    on a file opened for appending, then flush it to disk: a row is on disk whole or, if the
    process dies or the disk fills mid-write, torn at the end, which ``_read_done`` drops."""
    new = not out_csv.is_file() or out_csv.stat().st_size == 0
    frame = pd.DataFrame([row]).reindex(columns=header)
    data = frame.to_csv(index=False, header=new, lineterminator="\n").encode("utf-8")
    descriptor = os.open(out_csv, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o666)
    try:
        view = memoryview(data)
        while view:
            view = view[os.write(descriptor, view) :]
        os.fsync(descriptor)
    finally:
        os.close(descriptor)


def _short(message: str, limit: int = 300) -> str:
    message = " ".join(str(message).split())
    return message if len(message) <= limit else message[: limit - 3] + "..."


def _run_cell(method: Method, task, k, kc, cov, seed) -> dict:
    """Fit and score one method on one task; metrics, communication and timings."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        detector = method.build(k, kc, cov, seed)
        started = time.perf_counter()
        if method.federated:
            detector.fit(task.X_train, groups=task.groups_train)
        else:
            detector.fit(task.X_train)
        fit_seconds = time.perf_counter() - started
        started = time.perf_counter()
        scores = np.asarray(detector.decision_function(task.X_test), dtype=np.float64)
        score_seconds = time.perf_counter() - started
    out = dict(evaluate(task.y_test, scores))
    if method.federated:
        out.update(
            rounds=detector.n_rounds_, bytes_up=detector.bytes_up_, bytes_down=detector.bytes_down_
        )
    messages = list(dict.fromkeys(f"{w.category.__name__}: {w.message}" for w in caught))
    out.update(
        fit_seconds=fit_seconds,
        score_seconds=score_seconds,
        warning=_short(" | ".join(messages)) if messages else None,
    )
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
                METHODS[config["method"]],
                task,
                config["n_components"],
                config["client_components"],
                config["covariance_type"],
                config["seed"],
            )
        )
    except Exception as error:
        where = traceback.extract_tb(error.__traceback__)[-1]
        row["error"] = _short(
            f"{type(error).__name__}: {error} ({Path(where.filename).name}:{where.lineno})"
        )
    return row


def run_benchmark(
    datasets: Iterable[str],
    methods: Iterable[str],
    *,
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
    progress: bool = True,
    data_dir: str | os.PathLike[str] | None = None,
    threads: int | None = 1,
) -> pd.DataFrame:
    """Run every cell of the grid and return the results, one row per cell.

    Args:
        datasets: ADBench names, ``"all"`` (every tabular set), ``"mnist"``; a ``":noise"`` (or
            MNIST ``":rotate"``, ...) suffix picks the OOD set (see ``make_task``).
        methods: names from ``METHODS``.
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
        progress: show a progress bar over the cells.
        data_dir: data folder; see :func:`~fednovelty.datasets.data_dir`.
        threads: torch intra-op threads while the grid runs (restored afterwards); None keeps
            torch's setting. One is the default because the mixtures here are small: on two
            shared cores, two threads made DEM-kmeans on 50 000 rows of 10_cover 30x slower
            (63 s against 2 s) and FedGenGMM 14x slower.

    Returns:
        DataFrame with the columns ``COLUMNS`` and one row per cell of this grid (those read
        from ``out_csv`` included), in grid order: ``dataset, protocol, partition, alpha,
        n_clients, seed, n_components, client_components (NaN: BIC or not applicable),
        covariance_type, max_train, max_test, method``; the metrics ``auroc, aupr_in,
        aupr_out, fpr_at_95_tpr, max_f1`` (novel = positive class); ``rounds, bytes_up,
        bytes_down`` (NaN for centralized methods); ``fit_seconds, score_seconds, n_train,
        n_test, n_features, novel_share, warning, error`` (None when the cell succeeded).

    Raises:
        ValueError: an unknown dataset, method, protocol or partition, or an ``out_csv`` that
            is not a results file (before anything runs).

    Example:
        >>> df = run_benchmark(["4_breastw"], ["IForest"], progress=False)  # doctest: +SKIP
        >>> df[["dataset", "method", "auroc"]]  # doctest: +SKIP
    """
    from fednovelty.datasets.protocols import make_task

    datasets, methods, protocols, alphas = check_grid(
        datasets,
        methods,
        protocols=protocols,
        alphas=alphas,
        partition=partition,
        data_dir=data_dir,
    )
    sizes = [(k, kc) for k in _as_list(n_components) for kc in _as_list(client_components)]

    out_path = Path(out_csv) if out_csv is not None else None
    stored: dict[tuple[str, ...], dict] = {}
    header = list(COLUMNS)
    if out_path is not None:
        check_results_file(out_path)
        out_path.parent.mkdir(parents=True, exist_ok=True)
        done = _read_done(out_path)
        header = list(done.columns) if len(done.columns) else header
        for row in done.to_dict("records"):
            stored[_key(row)] = row  # the last row of a cell wins (retries append)

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
            if not METHODS[name].uses_client_components:
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
    bar = tqdm(total=n_cells, desc="bench", unit="cell", disable=not progress)
    with torch_threads(threads):
        for (dataset, protocol, alpha, clients, seed), cells in plan:
            todo = [c for c in cells if not is_done(_key(c))]
            results.extend(stored[_key(c)] for c in cells if is_done(_key(c)))
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
                task_error = f"task: {type(error).__name__}: {_short(error)}"
            for config in todo:
                bar.set_postfix_str(f"{dataset} {config['method']}")
                row = _cell_row(config, task, task_error)
                row = {c: row.get(c) for c in header} | {c: row.get(c) for c in COLUMNS}
                if out_path is not None:
                    _append(out_path, row, header)
                results.append(row)
                bar.update(1)
    bar.close()
    frame = pd.DataFrame(results).reindex(columns=list(COLUMNS))
    for column in ("alpha", *METRICS, "rounds", "bytes_up", "bytes_down", "client_components"):
        frame[column] = pd.to_numeric(frame[column], errors="coerce")
    for column in ("warning", "error"):  # text or None
        frame[column] = frame[column].astype(object).where(frame[column].notna(), None)
    return frame


# ----------------------------------------------------------------------------- summary
_SETTING = (
    "protocol",
    "partition",
    "alpha",
    "n_clients",
    "n_components",
    "client_components",
)


def _markdown(frame: pd.DataFrame) -> str:
    """A pipe table from a DataFrame of strings (index becomes the first column)."""
    frame = frame.reset_index()
    cells = [[str(c) for c in frame.columns]] + [
        ["" if v is None or (isinstance(v, float) and math.isnan(v)) else str(v) for v in row]
        for row in frame.itertuples(index=False)
    ]
    widths = [max(len(r[i]) for r in cells) for i in range(len(cells[0]))]
    lines = [
        "| " + " | ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)) + " |" for r in cells
    ]
    lines.insert(1, "|" + "|".join("-" * (w + 2) for w in widths) + "|")
    return "\n".join(lines)


def _setting_label(values: dict) -> str:
    parts = []
    for column, value in values.items():
        if value is None or (isinstance(value, float) and math.isnan(value)):
            continue
        if isinstance(value, float) and value.is_integer():
            value = int(value)
        parts.append(f"{column}={value}")
    return ", ".join(parts)


def summarize(df: pd.DataFrame, metric: str = "auroc") -> str:
    """Markdown summary of a results table.

    For each setting (protocol, partition, alpha, n_clients, n_components, client_components)
    a table of ``metric`` mean ± std over seeds per dataset (rows) and method (columns), then
    per method: the mean of ``metric`` across datasets, its mean rank (1 = best; ranks taken
    per dataset among the methods that ran there), and the datasets it ran on. Then the
    communication and time per method (the FedGenGMM paper's Table 4: rounds to convergence)
    and the errors, if any.

    Args:
        df: the output of :func:`run_benchmark`.
        metric: one of ``METRICS``; ``fpr_at_95_tpr`` ranks lower as better.

    Returns:
        Markdown text.
    """
    if metric not in METRICS:
        raise ValueError(f"metric must be one of {METRICS}; got {metric!r}.")
    lower_is_better = metric == "fpr_at_95_tpr"
    ok = df[df["error"].isna()] if "error" in df else df
    lines = [f"# Benchmark summary: {metric} (novel = positive class)", ""]
    methods = list(dict.fromkeys(df["method"]))
    setting = [c for c in _SETTING if c in df]
    key = pd.Series(
        [tuple(_key_part(v) for v in row) for row in ok[setting].itertuples(index=False)],
        index=ok.index,
        dtype=object,
    )
    for label in dict.fromkeys(key):
        part = ok[key == label]
        values = part.iloc[0][setting].to_dict()
        n_seeds = part["seed"].nunique()
        lines += [f"## {_setting_label(values)} ({n_seeds} seed(s))", ""]
        stats = part.groupby(["dataset", "method"], sort=False)[metric].agg(["mean", "std"])
        mean = stats["mean"].unstack("method").reindex(columns=methods).dropna(axis=1, how="all")
        std = stats["std"].unstack("method").reindex(columns=mean.columns)
        cells = mean.map(lambda v: f"{v:.3f}") + std.map(
            lambda v: f" ± {v:.3f}" if np.isfinite(v) else ""
        )
        cells = cells.where(mean.notna(), "")
        lines += [_markdown(cells.rename_axis(index="dataset", columns=None)), ""]
        ranks = mean.rank(axis=1, ascending=lower_is_better)
        table = pd.DataFrame(
            {
                f"mean {metric}": mean.mean().map("{:.3f}".format),
                "mean rank": ranks.mean().map("{:.2f}".format),
                "datasets": mean.notna().sum().astype(int),
            }
        )
        order = ranks.mean().sort_values().index
        lines += [_markdown(table.loc[order].rename_axis("method")), ""]

    if len(ok):
        lines += ["## Communication and time per method (means over all cells)", ""]
        comm = ok.groupby("method", sort=False)[
            ["rounds", "bytes_up", "bytes_down", "fit_seconds", "score_seconds"]
        ].mean()
        comm = pd.DataFrame(
            {
                "rounds": comm["rounds"].map(lambda v: f"{v:.1f}" if np.isfinite(v) else "-"),
                "MB up": (comm["bytes_up"] / 1e6).map(
                    lambda v: f"{v:.3f}" if np.isfinite(v) else "-"
                ),
                "MB down": (comm["bytes_down"] / 1e6).map(
                    lambda v: f"{v:.3f}" if np.isfinite(v) else "-"
                ),
                "fit s": comm["fit_seconds"].map("{:.2f}".format),
                "score s": comm["score_seconds"].map("{:.2f}".format),
                "total fit s": ok.groupby("method", sort=False)["fit_seconds"]
                .sum()
                .map("{:.1f}".format),
            }
        )
        lines += [_markdown(comm.rename_axis("method")), ""]
    failed = df[df["error"].notna()] if "error" in df else df.iloc[:0]
    if len(failed):
        lines += [f"## Errors ({len(failed)} cell(s))", ""]
        errors = failed[["dataset", "method", "protocol", "seed", "error"]].copy()
        errors["error"] = errors["error"].map(lambda e: _short(e, 160).replace("|", "/"))
        lines += [_markdown(errors.set_index("dataset")), ""]
    return "\n".join(lines)
