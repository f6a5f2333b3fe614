"""Markdown summary of a benchmark results table (:func:`summarize`)."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd

from fednovelty.evaluation.results import METRICS, key_part, short_text

__all__ = ["summarize"]

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
        df: the output of :func:`~fednovelty.evaluation.benchmark.run_benchmark`.
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
        [tuple(key_part(v) for v in row) for row in ok[setting].itertuples(index=False)],
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
        errors["error"] = errors["error"].map(lambda e: short_text(e, 160).replace("|", "/"))
        lines += [_markdown(errors.set_index("dataset")), ""]
    return "\n".join(lines)
