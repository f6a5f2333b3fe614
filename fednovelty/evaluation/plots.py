"""Figures from a :func:`~fednovelty.evaluation.benchmark.run_benchmark` table.

- :func:`plot_metric_vs`: a metric against one grid axis, one line per method with a mean ± std
  band over the other rows (seeds): the FedGenGMM paper's AUC-PR vs alpha (Fig. 3), vs the
  number of clients (Fig. 4) and vs the client model size K_c (Fig. 5, ``x="client_components"``).
  Methods that do not vary along ``x`` (all NaN there, e.g. DEM for K_c) are drawn as dashed
  horizontal reference lines with their band.
- :func:`plot_method_bars`: a metric per dataset and method, mean with std error bars.
- :func:`plot_stream_metric`: a metric per window of a stream, one line per method with a
  mean ± std band over seeds, and domain A's share on a twin axis (a
  :func:`~fednovelty.evaluation.streams.run_stream_benchmark` table).

matplotlib is imported when a function is called, with the non-interactive ``Agg`` backend
unless pyplot is already in use or ``MPLBACKEND`` names a backend, so importing fednovelty never
needs a display. Failed cells (``error`` set) are left out.
"""

from __future__ import annotations

import os
import sys

import numpy as np
import pandas as pd

from fednovelty.evaluation.results import METRICS

__all__ = ["plot_method_bars", "plot_metric_vs", "plot_stream_metric"]

_LABELS = {
    "auroc": "AUROC",
    "aupr_in": "AUC-PR (in)",
    "aupr_out": "AUC-PR (novel = positive)",
    "fpr_at_95_tpr": "FPR at 95% TPR",
    "max_f1": "max F1",
    "alpha": "Dirichlet alpha",
    "n_clients": "number of clients",
    "n_components": "K (mixture components)",
    "client_components": "K_c (client model size)",
}


def _pyplot():
    import matplotlib

    # Agg unless pyplot is in use already or a backend was asked for (Jupyter sets
    # MPLBACKEND to its inline backend), so scripts and servers never need a display.
    if "matplotlib.pyplot" not in sys.modules and not os.environ.get("MPLBACKEND"):
        matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _axes(ax):
    if ax is not None:
        return ax
    _, ax = _pyplot().subplots(figsize=(6.0, 4.0), layout="constrained")
    return ax


def _ok(df: pd.DataFrame, columns: list[str]) -> pd.DataFrame:
    missing = [c for c in columns if c not in df]
    if missing:
        raise ValueError(f"df has no column(s) {missing}; pass a run_benchmark table.")
    return df[df["error"].isna()] if "error" in df else df


def _mean_band(ax, values: pd.Series, by: pd.Series, label: str, alpha: float, **style):
    """Draw the mean of ``values`` per value of ``by`` (aligned with it) as a line labelled
    ``label`` (matplotlib ``style``), and mean +- standard deviation (pandas', 0 for one row)
    as a band of the line's colour and opacity ``alpha``."""
    stats = values.groupby(by).agg(["mean", "std"]).sort_index()
    std = stats["std"].fillna(0.0)
    (line,) = ax.plot(stats.index, stats["mean"], label=label, **style)
    ax.fill_between(
        stats.index,
        stats["mean"] - std,
        stats["mean"] + std,
        color=line.get_color(),
        alpha=alpha,
    )


def plot_metric_vs(
    df: pd.DataFrame,
    x: str = "alpha",
    metric: str = "aupr_out",
    ax=None,
    *,
    logx: bool | None = None,
    title: str | None = None,
):
    """Mean ± std of ``metric`` against ``x``, one line and band per method.

    Args:
        df: a results table; filter it to one dataset (and protocol) first, as rows are pooled
            over every column but ``method`` and ``x``.
        x: the grid axis: ``"alpha"``, ``"n_clients"``, ``"n_components"`` or
            ``"client_components"`` (any numeric column works).
        metric: ``"aupr_out"`` (default, the papers' AUC-PR), ``"auroc"``, ...
        ax: matplotlib Axes to draw on; a new figure's if None.
        logx: log-scaled x; default when the positive x values span a factor of 10 or more.
        title: Axes title.

    Returns:
        The matplotlib ``Axes``.
    """
    ok = _ok(df, ["method", x, metric])
    ax = _axes(ax)
    xs = pd.to_numeric(ok[x], errors="coerce")
    values = np.sort(xs.dropna().unique())
    for method, rows in ok.groupby("method", sort=False):
        rows_x = xs.loc[rows.index]
        if rows_x.isna().all():  # does not vary along x: a reference line
            if not len(values):
                continue
            mean, std = rows[metric].mean(), rows[metric].std(ddof=0)
            (line,) = ax.plot(
                [values[0], values[-1]], [mean, mean], linestyle="--", label=str(method)
            )
            ax.fill_between(
                [values[0], values[-1]], mean - std, mean + std, color=line.get_color(), alpha=0.1
            )
            continue
        _mean_band(ax, rows[metric], rows_x, str(method), 0.2, marker="o")
    positive = values[values > 0]
    if logx is None:
        logx = positive.size > 1 and positive.max() / positive.min() >= 10
    if logx:
        ax.set_xscale("log")
    if 0 < values.size <= 12:
        ax.set_xticks(values, [f"{v:g}" for v in values])
        ax.minorticks_off()
    ax.set_xlabel(_LABELS.get(x, x))
    ax.set_ylabel(_LABELS.get(metric, metric))
    if title:
        ax.set_title(title)
    if ax.get_legend_handles_labels()[0]:
        ax.legend(fontsize="small", loc="upper left", bbox_to_anchor=(1.01, 1.0))
    ax.grid(alpha=0.3)
    return ax


def plot_method_bars(df: pd.DataFrame, metric: str = "auroc", ax=None, *, title=None):
    """Grouped bars: ``metric`` per dataset (groups) and method (bars), mean ± std over rows.

    Args:
        df: a results table (rows are pooled over every column but dataset and method).
        metric: a metric column, e.g. ``"auroc"``.
        ax: matplotlib Axes to draw on; a new figure's if None.
        title: Axes title.

    Returns:
        The matplotlib ``Axes``.
    """
    ok = _ok(df, ["dataset", "method", metric])
    datasets = list(dict.fromkeys(ok["dataset"]))
    methods = list(dict.fromkeys(ok["method"]))
    if ax is None:
        width = max(6.0, 0.35 * len(datasets) * max(len(methods), 1) + 2.0)
        _, ax = _pyplot().subplots(figsize=(min(width, 24.0), 4.5), layout="constrained")
    stats = ok.groupby(["dataset", "method"])[metric].agg(["mean", "std"])
    bar = 0.8 / max(len(methods), 1)
    for j, method in enumerate(methods):
        means = [stats["mean"].get((d, method), np.nan) for d in datasets]
        stds = [stats["std"].get((d, method), np.nan) for d in datasets]
        spread = np.isfinite(stds).any()
        ax.bar(
            np.arange(len(datasets)) + (j - (len(methods) - 1) / 2) * bar,
            means,
            bar,
            yerr=np.nan_to_num(stds) if spread else None,
            label=method,
            capsize=2 if spread else 0,
        )
    ax.set_xticks(np.arange(len(datasets)), datasets, rotation=45, ha="right")
    ax.set_ylabel(_LABELS.get(metric, metric))
    if metric in METRICS:  # shares and areas, all in [0, 1]
        ax.set_ylim(0.0, 1.0)
    if title:
        ax.set_title(title)
    if methods:
        ax.legend(fontsize="small", loc="upper left", bbox_to_anchor=(1.01, 1.0))
    ax.grid(axis="y", alpha=0.3)
    return ax


def plot_stream_metric(
    df: pd.DataFrame,
    metric: str = "auroc",
    ax=None,
    *,
    share: bool = True,
    title: str | None = None,
):
    """``metric`` per window, one line per method (mean ± std over seeds), with domain A's
    share on a twin axis (dashed grey; the mean over seeds).

    Args:
        df: a :func:`~fednovelty.evaluation.streams.run_stream_benchmark` table; filter it to
            one dataset first (rows are pooled over every column but method and window).
        metric: ``"auroc"`` (default) or another metric column.
        ax: matplotlib Axes to draw on; a new figure's if None.
        share: draw A's share on a twin y axis (``ax.figure.axes[-1]``).
        title: Axes title.

    Returns:
        The matplotlib ``Axes`` of the metric.
    """
    ok = _ok(df, ["method", "window", "share", metric])
    if ax is None:
        _, ax = _pyplot().subplots(figsize=(8.0, 4.0), layout="constrained")
    for method, rows in ok.groupby("method", sort=False):
        _mean_band(ax, rows[metric], rows["window"], str(method), 0.15, linewidth=1.5)
    from matplotlib.ticker import MaxNLocator

    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.set_xlabel("window")
    ax.set_ylabel(_LABELS.get(metric, metric))
    ax.grid(alpha=0.3)
    handles, labels = ax.get_legend_handles_labels()
    if share:
        twin = ax.twinx()
        mix = ok.groupby("window")["share"].mean().sort_index()
        (line,) = twin.plot(mix.index, mix.to_numpy(), color="grey", linestyle="--", linewidth=1)
        twin.set_ylim(-0.05, 1.05)
        twin.set_ylabel("share of domain A")
        handles, labels = [*handles, line], [*labels, "share of A"]
    if title:
        ax.set_title(title)
    if handles:
        ax.legend(handles, labels, fontsize="small", loc="upper left", bbox_to_anchor=(1.12, 1.0))
    return ax
