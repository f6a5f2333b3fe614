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
    "client_scores_figure",
    "cluster_assignment_figure",
    "cluster_color",
    "cluster_scatter",
    "cluster_sizes_figure",
    "joint_scatter",
    "p_value_histogram",
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


def p_value_histogram(
    frame: pd.DataFrame, edges: np.ndarray, alpha: float | None = None, title: str | None = None
) -> go.Figure:
    """Overlaid density histograms of conformal p-values (``frame``: ``p_value``, ``group``)
    per group over the right-closed bins ``(edges[i], edges[i + 1]]`` (the first also holds
    0), each bar as wide as its bin, with density 1 (uniform p-values) as a dotted line and
    ``alpha`` as a dashed one. A bar's height is the group's share of rows in the bin over
    the bin's width; values within 1e-9 of an edge count in the bin that edge closes."""
    edges = np.asarray(edges, dtype=np.float64)
    widths = np.diff(edges)
    fig = go.Figure()
    for group in [g for g in ("normal", "novel", "unknown") if g in set(frame.group)]:
        p = frame.p_value[frame.group == group].to_numpy(dtype=np.float64)
        index = np.clip(np.searchsorted(edges + 1e-9, p, side="left"), 1, widths.size) - 1
        counts = np.bincount(index, minlength=widths.size)
        fig.add_trace(
            go.Bar(
                x=edges[:-1] + widths / 2, y=counts / (p.size * widths), width=widths,
                name=group, opacity=0.6, marker={"color": COLORS[group]}, customdata=counts,
                hovertemplate="bin centre %{x:.3f}: %{customdata} rows, density %{y:.2f}",
            )
        )  # fmt: skip
    fig.add_hline(y=1.0, line_dash="dot", line_color="black", annotation_text="uniform")
    if alpha is not None:
        fig.add_vline(x=alpha, line_dash="dash", line_color="black", annotation_text="alpha")
    fig.update_layout(
        barmode="overlay",
        title=title or "Conformal p-values of the test rows",
        xaxis_title="conformal p-value",
        yaxis_title="density",
        xaxis_range=[0.0, 1.0],
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


def cluster_color(cluster) -> str:
    """The colour of found cluster ``cluster`` (an int or its text) on every Clusters chart;
    grey for -1 (a client that never replied)."""
    j = int(cluster)
    palette = px.colors.qualitative.Plotly
    return COLORS["unknown"] if j < 0 else palette[j % len(palette)]


def cluster_sizes_figure(sizes: pd.DataFrame, warmup: int | None = None) -> go.Figure:
    """Clients per found cluster in each clustered round, stacked (``sizes``: long rows of
    ``round``, ``cluster`` as text, ``clients``); ``warmup``: warm-up rounds, named in the
    title."""
    order = sorted(set(sizes.cluster), key=int)
    fig = px.area(
        sizes,
        x="round",
        y="clients",
        color="cluster",
        markers=True,
        category_orders={"cluster": order},
        color_discrete_map={c: cluster_color(c) for c in order},
        labels={"round": "communication round"},
        title="Clients per found cluster, clustered rounds",
    )
    fig.update_xaxes(dtick=1)
    if warmup:
        fig.update_xaxes(title_text=f"communication round (after {warmup} warm-up rounds)")
    return fig.update_layout(legend_title_text="found cluster", **_LAYOUT)


def cluster_assignment_figure(table: pd.DataFrame, ari: float | None = None) -> go.Figure:
    """Heatmap of clients per true cluster (rows) and found cluster (columns), counts
    written in the cells; the adjusted Rand index in the title."""
    fig = px.imshow(
        table.to_numpy(),
        x=[str(c) for c in table.columns],
        y=[str(r) for r in table.index],
        color_continuous_scale="Blues",
        zmin=0,
        text_auto=True,
        aspect="auto",
        labels={"x": "found cluster", "y": "true cluster", "color": "clients"},
        title="Clients per true and found cluster"
        + ("" if ari is None else f" (adjusted Rand index {ari:.3f})"),
    )
    fig.update_xaxes(type="category")
    fig.update_yaxes(type="category")
    return fig.update_layout(**_LAYOUT)


def client_scores_figure(clients: pd.DataFrame, threshold: float | None = 3.0) -> go.Figure:
    """Bar per client of its client-level anomaly score (``clients``: ``client``,
    ``score``, ``rogue``, ``true_cluster``, ``found_cluster``), rogue clients in red, with
    the threshold as a dashed line."""
    frame = clients.assign(
        client=clients.client.astype(str),
        kind=np.where(clients.rogue, "rogue", "normal"),
    )
    fig = px.bar(
        frame,
        x="client",
        y="score",
        color="kind",
        color_discrete_map={"normal": COLORS["normal"], "rogue": COLORS["novel"]},
        category_orders={"client": frame.client.tolist(), "kind": ["normal", "rogue"]},
        hover_data=["true_cluster", "found_cluster"],
        labels={"score": "client score (robust z)"},
        title="Client-level anomaly score (high: fits no cluster)",
    )
    fig.update_xaxes(type="category")
    if threshold is not None:
        fig.add_hline(
            y=threshold, line_dash="dash", line_color="black", annotation_text="threshold",
            annotation_position="top left",
        )  # fmt: skip
    return fig.update_layout(height=520, **_LAYOUT)


def _ellipse(mean: np.ndarray, cov: np.ndarray, scale: float = 2.0, n: int = 60) -> np.ndarray:
    """(n + 1, 2) points of the ``scale``-sigma ellipse of a 2-D Gaussian."""
    values, vectors = np.linalg.eigh(cov)
    t = np.linspace(0, 2 * np.pi, n + 1)
    circle = np.c_[np.cos(t), np.sin(t)] * (scale * np.sqrt(np.clip(values, 0, None)))
    return mean + circle @ vectors.T


def cluster_scatter(
    rows: pd.DataFrame, components: pd.DataFrame, covariances: np.ndarray | None = None
) -> go.Figure:
    """Rows (``x``, ``y``, ``found_cluster`` as text, ``rogue``) coloured by their client's
    found cluster, rogue clients' rows as crosses, and the component means: global ones as
    black diamonds, each cluster's as stars in its colour (``components``: ``x``, ``y``,
    ``owner``, ``kind``, ``weight``); with ``covariances`` (n_components, 2, 2), each
    component's 2-sigma ellipse (dashed: global)."""
    fig = go.Figure()
    for cluster in sorted(set(rows.found_cluster), key=int):
        for rogue in (False, True):
            part = rows[(rows.found_cluster == cluster) & (rows.rogue == rogue)]
            if part.empty:
                continue
            fig.add_trace(
                go.Scatter(
                    x=part.x, y=part.y, mode="markers", opacity=0.45,
                    name=f"cluster {cluster}" + (" (rogue clients)" if rogue else ""),
                    legendgroup=f"cluster {cluster}",
                    marker={"color": cluster_color(cluster), "size": 9 if rogue else 5,
                            "symbol": "x" if rogue else "circle"},
                )
            )  # fmt: skip
    for i, comp in components.iterrows():
        is_global = comp.owner < 0
        color = "black" if is_global else cluster_color(comp.owner)
        if covariances is not None:
            edge = _ellipse(np.array([comp.x, comp.y]), np.asarray(covariances[i])[:2, :2])
            fig.add_trace(
                go.Scatter(
                    x=edge[:, 0], y=edge[:, 1], mode="lines", hoverinfo="skip",
                    showlegend=False, legendgroup=comp.kind,
                    line={"color": color, "width": 1.5, "dash": "dash" if is_global else "solid"},
                )
            )  # fmt: skip
    for kind, part in components.groupby("kind", sort=False):
        is_global = kind == "global"
        fig.add_trace(
            go.Scatter(
                x=part.x, y=part.y, mode="markers", name=f"{kind} component",
                legendgroup=kind,
                text=[f"component {c}, weight {w:.3f}" for c, w in zip(part.component, part.weight,
                                                                        strict=True)],
                hovertemplate="%{text}<br>(%{x:.2f}, %{y:.2f})<extra></extra>",
                marker={"symbol": "diamond" if is_global else "star", "size": 18,
                        "color": "black" if is_global else cluster_color(part.owner.iloc[0]),
                        "line": {"color": "white" if is_global else "black", "width": 1.5}},
            )
        )  # fmt: skip
    fig.update_layout(
        title="Rows by found cluster; component means, 2-sigma ellipses",
        xaxis_title="x1",
        yaxis_title="x2",
        height=560,
        **_LAYOUT,
    )
    fig.update_layout(legend={"orientation": "h", "yanchor": "top", "y": -0.16, "title": None})
    fig.update_yaxes(scaleanchor="x", scaleratio=1)
    return fig
