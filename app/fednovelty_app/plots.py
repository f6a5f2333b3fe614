"""Plotly figures of the dashboard, each built from plain arrays or DataFrames.

Every function returns a ``plotly.graph_objects.Figure`` and draws nothing else, so tests can
check the traces. Colours are fixed by meaning across pages: normal rows teal, novel rows
red, permuted labels orange, unknown grey.
"""

from __future__ import annotations

import numpy as np
import pandas as pd
import plotly.express as px
import plotly.graph_objects as go

__all__ = [
    "COLORS",
    "adaptation_figure",
    "alarms_figure",
    "client_auroc_figure",
    "joint_scatter",
    "partition_dot_plot",
    "pr_figure",
    "roc_figure",
    "rounds_figure",
    "score_histogram",
    "shares_figure",
    "tracking_figure",
    "weights_heatmap",
]

COLORS = {
    "normal": "#17becf",
    "novel": "#d62728",
    "novel inputs": "#d62728",
    "permuted labels": "#ff7f0e",
    "unknown": "#7f7f7f",
    "adds distance": "#d62728",
    "lowers distance": "#17becf",
}
_LAYOUT = {"margin": {"l": 10, "r": 10, "t": 50, "b": 10}, "legend": {"title": None}}


def score_histogram(
    frame: pd.DataFrame, axis: str, threshold: float | None = None, title: str | None = None
) -> go.Figure:
    """Overlaid histograms of ``frame.value`` per ``frame.group`` (normal / novel / unknown),
    each normalised to a probability density, with the threshold as a dashed line; the axis
    starts at the 0.5th percentile (log p(x) of novel rows can have a very long tail)."""
    order = [g for g in ("normal", "novel", "unknown") if g in set(frame.group)]
    fig = px.histogram(
        frame,
        x="value",
        color="group",
        barmode="overlay",
        histnorm="probability density",
        nbins=60,
        opacity=0.6,
        category_orders={"group": order},
        color_discrete_map=COLORS,
        labels={"value": axis},
        title=title or f"{axis} of the test rows",
    )
    low, high = np.percentile(frame.value, [0.5, 100.0])
    if high > low:  # shared bins; a long tail would squash the rest into one bin
        size = (high - low) / 60
        fig.update_traces(xbins={"start": float(frame.value.min()), "end": high, "size": size})
        fig.update_xaxes(range=[low - size, high + size])
    if threshold is not None:
        fig.add_vline(
            x=threshold, line_dash="dash", line_color="black", annotation_text="threshold"
        )
    return fig.update_layout(**_LAYOUT)


def roc_figure(fpr: np.ndarray, tpr: np.ndarray, auroc: float) -> go.Figure:
    """ROC curve (novel = positive) with the chance diagonal."""
    fig = go.Figure(
        [
            go.Scatter(x=fpr, y=tpr, mode="lines", name=f"ROC (AUROC {auroc:.3f})"),
            go.Scatter(x=[0, 1], y=[0, 1], mode="lines", name="chance", line={"dash": "dot"}),
        ]
    )
    fig.update_layout(
        title="ROC curve", xaxis_title="false positive rate", yaxis_title="true positive rate"
    )
    return fig.update_layout(**_LAYOUT)


def pr_figure(recall: np.ndarray, precision: np.ndarray, aupr: float, base: float) -> go.Figure:
    """Precision-recall curve for the novel class, with the share of novel rows as baseline."""
    fig = go.Figure(
        [
            go.Scatter(x=recall, y=precision, mode="lines", name=f"PR (AUPR {aupr:.3f})"),
            go.Scatter(
                x=[0, 1], y=[base, base], mode="lines", name="novel share", line={"dash": "dot"}
            ),
        ]
    )
    fig.update_layout(
        title="Precision-recall (novel = positive)",
        xaxis_title="recall",
        yaxis_title="precision",
        yaxis_range=[0, 1.02],
    )
    return fig.update_layout(**_LAYOUT)


def joint_scatter(frame: pd.DataFrame, title: str | None = None) -> go.Figure:
    """log p(x) against log p(y|x) per group with marginal histograms (FedGMM Figure 2)."""
    order = [g for g in ("normal", "novel inputs", "permuted labels") if g in set(frame.group)]
    fig = px.scatter(
        frame,
        x="log_px",
        y="log_py_given_x",
        color="group",
        opacity=0.5,
        marginal_x="histogram",
        marginal_y="histogram",
        category_orders={"group": order},
        color_discrete_map=COLORS,
        labels={"log_px": "log p(x)", "log_py_given_x": "log p(y | x)"},
        title=title or "log p(x) vs log p(y | x)",
    )
    fig.update_traces(marker={"size": 5}, selector={"type": "scatter"})
    return fig.update_layout(height=560, **_LAYOUT)


def partition_dot_plot(
    counts: np.ndarray, client_ids, group_values, group_name: str, unseen=()
) -> go.Figure:
    """Rows of each group per client as dots sized by count (FedGenGMM Figure 1); clients
    in ``unseen`` are marked."""
    clients = [str(c) + (" (unseen)" if c in set(unseen) else "") for c in client_ids]
    cells = [
        {"client": clients[i], "group": str(group_values[j]), "rows": int(counts[i, j])}
        for i in range(counts.shape[0])
        for j in range(counts.shape[1])
        if counts[i, j] > 0
    ]
    frame = pd.DataFrame(cells, columns=["client", "group", "rows"])
    fig = px.scatter(
        frame,
        x="client",
        y="group",
        size="rows",
        color="rows",
        size_max=28,
        color_continuous_scale="Blues",
        category_orders={"client": clients, "group": [str(g) for g in group_values]},
        labels={"group": group_name},
        title=f"Rows per client and {group_name}",
    )
    fig.update_xaxes(type="category")
    return fig.update_layout(**_LAYOUT)


def weights_heatmap(weights: np.ndarray, client_ids) -> go.Figure:
    """Clients x components heatmap of the mixture weights ``pi_c``."""
    fig = px.imshow(
        weights,
        x=[f"k={k}" for k in range(weights.shape[1])],
        y=[str(c) for c in client_ids],
        color_continuous_scale="Viridis",
        zmin=0,
        zmax=1,
        text_auto=".2f",
        aspect="auto",
        labels={"x": "component", "y": "client", "color": "pi_c"},
        title="Mixture weights pi_c per client",
    )
    fig.update_yaxes(type="category")
    return fig.update_layout(**_LAYOUT)


def client_auroc_figure(frame: pd.DataFrame, pooled: float | None = None) -> go.Figure:
    """Bar per client of its AUROC, with the pooled AUROC as a line."""
    fig = px.bar(
        frame,
        x="client",
        y="auroc",
        hover_data=["n_rows", "n_novel", "weights"],
        title="AUROC per client",
    )
    fig.update_xaxes(type="category")
    fig.update_yaxes(range=[0, 1.02])
    if pooled is not None and np.isfinite(pooled):
        fig.add_hline(y=pooled, line_dash="dash", annotation_text=f"pooled {pooled:.3f}")
    return fig.update_layout(**_LAYOUT)


def rounds_figure(history: pd.DataFrame) -> go.Figure:
    """Kilobytes up and down per communication round, coloured by message kind."""
    long = history.melt(
        id_vars=["round", "kind"], value_vars=["bytes_up", "bytes_down"], var_name="direction"
    )
    long["kB"] = long.pop("value") / 1e3
    long["direction"] = long.direction.map({"bytes_up": "up", "bytes_down": "down"})
    fig = px.bar(
        long,
        x="round",
        y="kB",
        color="kind",
        pattern_shape="direction",
        barmode="group",
        title=f"Bytes per round ({len(history)} rounds)",
    )
    return fig.update_layout(**_LAYOUT)


def adaptation_figure(trace: np.ndarray) -> go.Figure:
    """Each Gaussian's weight over the adaptation's EM iterations (iteration 0 = global)."""
    frame = pd.DataFrame(trace, columns=[f"k={k}" for k in range(trace.shape[1])])
    frame["iteration"] = np.arange(trace.shape[0])
    long = frame.melt(id_vars="iteration", var_name="component", value_name="weight")
    fig = px.line(
        long,
        x="iteration",
        y="weight",
        color="component",
        markers=trace.shape[0] <= 40,
        title="Mixture weights over adaptation iterations",
    )
    fig.update_yaxes(range=[0, 1.02])
    return fig.update_layout(**_LAYOUT)


def shares_figure(shares: pd.Series, title: str | None = None, top: int = 25) -> go.Figure:
    """Horizontal bars of each feature's share of a row's squared Mahalanobis distance
    (``shares``: feature name -> share), largest on top; the ``top`` features with the largest
    ``|share|`` are drawn. Negative shares (correlated features) are coloured apart."""
    shown = shares.reindex(shares.abs().sort_values(ascending=False).index[:top])
    frame = pd.DataFrame(
        {
            "feature": [str(f) for f in shown.index],
            "share": shown.to_numpy(dtype=np.float64),
        }
    )
    frame["effect"] = np.where(frame.share >= 0, "adds distance", "lowers distance")
    fig = px.bar(
        frame,
        x="share",
        y="feature",
        color="effect",
        orientation="h",
        color_discrete_map=COLORS,
        category_orders={"effect": ["adds distance", "lowers distance"]},
        labels={"share": "share of the squared Mahalanobis distance"},
        title=title or "Each feature's share of the distance",
    )
    bottom_to_top = frame.feature.tolist()[::-1]
    fig.update_yaxes(type="category", categoryorder="array", categoryarray=bottom_to_top)
    return fig.update_layout(height=max(260, 24 * len(frame) + 120), **_LAYOUT)


def tracking_figure(truth: np.ndarray, learned: np.ndarray, client_ids) -> go.Figure:
    """Each client's learned weight on population A's component (solid) against its true
    share (dotted), per window: (n_windows, n_clients) arrays."""
    fig = go.Figure()
    palette = px.colors.qualitative.Plotly
    windows = np.arange(truth.shape[0])
    for j, client in enumerate(client_ids):
        color = palette[j % len(palette)]
        fig.add_trace(
            go.Scatter(
                x=windows,
                y=learned[:, j],
                mode="lines",
                name=f"client {client}",
                line={"color": color},
            )
        )
        fig.add_trace(
            go.Scatter(x=windows, y=truth[:, j], mode="lines", name=f"client {client} (true)",
                       line={"color": color, "dash": "dot"}, showlegend=False)
        )  # fmt: skip
    fig.update_layout(
        title="Weight on population A's component (dotted: the true share)",
        xaxis_title="window",
        yaxis_title="pi",
        **_LAYOUT,
    )
    fig.update_yaxes(range=[-0.02, 1.02])
    return fig


def alarms_figure(drift: pd.DataFrame) -> go.Figure:
    """Surprise z-score per client and window, alarms marked (``drift_frame()`` rows)."""
    scored = drift[np.isfinite(drift["surprise"])]
    fig = px.line(
        scored, x="window", y="surprise", color=scored["client"].astype(str),
        title="Surprise per window (z-score; x = CUSUM alarm)",
    )  # fmt: skip
    alarms = scored[scored["alarm"]]
    fig.add_trace(
        go.Scatter(x=alarms["window"], y=alarms["surprise"], mode="markers", name="alarm",
                   marker={"symbol": "x", "size": 11, "color": COLORS["novel"]})
    )  # fmt: skip
    return fig.update_layout(legend_title_text="client", **_LAYOUT)
