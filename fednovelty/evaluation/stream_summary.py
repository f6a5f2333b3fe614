"""The stream benchmark's summary: per dataset and method, AUROC over seeds (all windows and
once the mix moved), bytes and seconds per window, differences against a reference method,
the stream methods' tracking error and alarm rate, and their markdown tables."""

from __future__ import annotations

import numpy as np
import pandas as pd

from fednovelty.evaluation.summary import _markdown


def _seed_means(df: pd.DataFrame, column: str, mask=None) -> pd.Series:
    """Per (dataset, method): ``column``'s mean over windows per seed, as a list per key."""
    rows = df if mask is None else df[mask]
    per_seed = rows.groupby(["dataset", "method", "seed"], sort=False)[column].mean()
    return per_seed.groupby(level=["dataset", "method"], sort=False)


def stream_summary(df: pd.DataFrame, reference: str = "refit") -> pd.DataFrame:
    """Per dataset and method, over windows >= 1 (the warm-up fit left out): AUROC mean and
    sample std over seeds (NaN for one seed) of each seed's mean over windows, all windows
    and the ``moved`` ones; KB per window (up + down) and fit seconds per window; the AUROC
    difference (points) and bytes ratio against ``reference`` (NaN where it did not run);
    the stream methods' tracking error and alarms per client-window.

    Args:
        df: a :func:`~.streams.run_stream_benchmark` table (failed rows are left out).
        reference: the method the differences and ratios are taken against.

    Returns:
        DataFrame indexed by (dataset, method) with the columns ``auroc, auroc_std,
        auroc_moved, auroc_moved_std, kb_per_window, seconds_per_window,
        auroc_minus_reference, auroc_moved_minus_reference, bytes_ratio, tracking_error,
        alarm_rate`` (AUROC in [0, 1]; differences in AUROC units).
    """
    missing = [c for c in ("dataset", "method", "seed", "window", "auroc") if c not in df]
    if missing:
        raise ValueError(f"df has no column(s) {missing}; pass a run_stream_benchmark table.")
    ok = df[(df["window"] >= 1) & df["error"].isna()] if "error" in df else df[df["window"] >= 1]
    moved = ok["moved"].astype(bool)
    auroc = _seed_means(ok, "auroc")
    auroc_moved = _seed_means(ok, "auroc", moved)
    out = pd.DataFrame(
        {
            "auroc": auroc.mean(),
            "auroc_std": auroc.std(ddof=1),
            "auroc_moved": auroc_moved.mean(),
            "auroc_moved_std": auroc_moved.std(ddof=1),
            "kb_per_window": ok.groupby(["dataset", "method"], sort=False)["bytes"].mean() / 1e3,
            "seconds_per_window": ok.groupby(["dataset", "method"], sort=False)[
                "fit_seconds"
            ].mean(),
        }
    )
    for column in ("auroc_minus_reference", "auroc_moved_minus_reference", "bytes_ratio"):
        out[column] = np.nan
    for dataset in out.index.get_level_values("dataset").unique():
        if (dataset, reference) not in out.index:
            continue
        ref = out.loc[(dataset, reference)]
        part = out.loc[dataset]
        keys = [(dataset, m) for m in part.index]
        out.loc[keys, "auroc_minus_reference"] = (part["auroc"] - ref["auroc"]).to_numpy()
        out.loc[keys, "auroc_moved_minus_reference"] = (
            part["auroc_moved"] - ref["auroc_moved"]
        ).to_numpy()
        ratio = part["kb_per_window"] / ref["kb_per_window"] if ref["kb_per_window"] else np.nan
        out.loc[keys, "bytes_ratio"] = np.asarray(ratio, dtype=float)
    online = ok[ok["tracking_error"].notna()] if "tracking_error" in ok else ok.iloc[:0]
    out["tracking_error"] = np.nan
    out["alarm_rate"] = np.nan
    if len(online):  # the stream methods' rows
        grouped = online.groupby(["dataset", "method"], sort=False)
        tracking = grouped["tracking_error"].mean()
        alarms = grouped["alarms"].sum() / grouped["n_clients"].sum()
        out.loc[tracking.index, "tracking_error"] = tracking.to_numpy()
        out.loc[tracking.index, "alarm_rate"] = alarms.to_numpy()
    return out


def _pm(mean: float, std: float, scale: float = 100.0, digits: int = 2) -> str:
    if not np.isfinite(mean):
        return ""
    if not np.isfinite(std):  # one seed
        return f"{scale * mean:.{digits}f}"
    return f"{scale * mean:.{digits}f} ± {scale * std:.{digits}f}"


def format_stream_summary(df: pd.DataFrame, reference: str = "refit") -> str:
    """Markdown of :func:`stream_summary`: one table per dataset (AUROC %, all windows and
    once the mix moved, mean ± std over seeds; KB and seconds per window; AUROC points and
    bytes ratio against ``reference``), with its stream settings."""
    summary = stream_summary(df, reference)
    lines = ["# Novelty under drift: per-window AUROC (novel = positive class)", ""]
    for dataset, part in summary.groupby(level="dataset", sort=False):
        first = df[df["dataset"] == dataset].iloc[0]
        seeds = sorted(df.loc[df["dataset"] == dataset, "seed"].unique().tolist())
        lines += [
            f"## {dataset}: {first['schedule']} schedule x {first['cycles']}, "
            f"{first['n_windows']} windows, {first['n_clients']} clients x "
            f"{first['rows_per_window']} rows, K = {first['n_components']}, rho "
            f"{first['rho']}, {first['rounds']} round(s) per window, baseline "
            f"{first['baseline']}, seeds {seeds}",
            "",
        ]
        table = pd.DataFrame(
            {
                "AUROC %": [_pm(r.auroc, r.auroc_std) for r in part.itertuples()],
                "AUROC % (mix moved)": [
                    _pm(r.auroc_moved, r.auroc_moved_std) for r in part.itertuples()
                ],
                "KB / window": [f"{v:,.1f}" for v in part["kb_per_window"]],
                "s / window": [f"{v:.3f}" for v in part["seconds_per_window"]],
                f"AUROC - {reference} (points)": [
                    "" if not np.isfinite(v) else f"{100 * v:+.2f}"
                    for v in part["auroc_minus_reference"]
                ],
                f"bytes / {reference}": [
                    "" if not np.isfinite(v) else f"{v:.3f}" for v in part["bytes_ratio"]
                ],
            },
            index=pd.Index(part.index.get_level_values("method"), name="method"),
        )
        lines += [_markdown(table), ""]
        for (_, method), row in part[np.isfinite(part["tracking_error"])].iterrows():
            lines += [
                f"{method.capitalize()}: weight tracking error {row['tracking_error']:.3f} "
                f"(mean |weight on A's components - share of A| over clients and windows); "
                f"alarms in {100 * row['alarm_rate']:.2f} % of client-windows.",
                "",
            ]
    errors = df[df["error"].notna()] if "error" in df else df.iloc[:0]
    if len(errors):
        lines += [f"{len(errors)} failed row(s), e.g. {errors['error'].iloc[0]}", ""]
    return "\n".join(lines).rstrip() + "\n"
