"""Plotly figures of the dashboard (app/fednovelty_app/plots.py)."""

import numpy as np
import pandas as pd
from fednovelty_app.plots import (
    COLORS,
    adaptation_figure,
    client_auroc_figure,
    joint_scatter,
    partition_dot_plot,
    pr_figure,
    roc_figure,
    rounds_figure,
    score_histogram,
    shares_figure,
    weights_heatmap,
)


def test_score_histogram_overlays_groups_with_the_threshold():
    frame = pd.DataFrame({"value": [1.0, 2.0, 3.0, -5.0], "group": ["normal"] * 3 + ["novel"]})
    fig = score_histogram(frame, "log p(x)", threshold=0.5)
    assert [t.name for t in fig.data] == ["normal", "novel"]
    assert fig.data[1].marker.color == COLORS["novel"]
    assert fig.layout.shapes[0].x0 == 0.5 and fig.layout.xaxis.title.text == "log p(x)"
    assert fig.data[0].xbins.size == fig.data[1].xbins.size > 0  # the same bins for both


def test_curves():
    roc = roc_figure(np.array([0, 0.5, 1]), np.array([0, 1, 1]), 0.75)
    assert roc.data[0].name == "ROC (AUROC 0.750)" and list(roc.data[1].x) == [0, 1]
    pr = pr_figure(np.array([1, 0.5, 0]), np.array([0.5, 1, 1]), 0.8, 0.25)
    assert pr.data[0].name == "PR (AUPR 0.800)" and list(pr.data[1].y) == [0.25, 0.25]


def test_joint_scatter_has_marginal_histograms():
    frame = pd.DataFrame(
        {
            "log_px": [1.0, 2.0, -3.0, 1.0],
            "log_py_given_x": [-0.1, -0.2, -0.5, -3.0],
            "group": ["normal", "normal", "novel inputs", "permuted labels"],
        }
    )
    fig = joint_scatter(frame)
    kinds = sorted({t.type for t in fig.data})
    assert kinds == ["histogram", "scatter"]
    assert {t.name for t in fig.data if t.type == "scatter"} == set(frame.group)


def test_partition_dot_plot_sizes_dots_by_rows_and_marks_unseen_clients():
    counts = np.array([[5, 0], [1, 2], [0, 3]])
    fig = partition_dot_plot(counts, [0, 1, 2], ["a", "b"], "class", unseen=[2])
    (trace,) = fig.data
    assert list(trace.x) == ["0", "1", "1", "2 (unseen)"]
    assert list(trace.marker.size) == [5, 1, 2, 3]


def test_heatmap_bars_rounds_and_trace():
    weights = np.array([[0.2, 0.8], [1.0, 0.0]])
    heat = weights_heatmap(weights, ["x", "y"])
    np.testing.assert_array_equal(heat.data[0].z, weights)
    table = pd.DataFrame(
        {"client": ["0", "1"], "auroc": [0.9, 0.7], "n_rows": [5, 6], "n_novel": [1, 2],
         "weights": ["own pi_c"] * 2}
    )  # fmt: skip
    bars = client_auroc_figure(table, pooled=0.8)
    assert list(bars.data[0].y) == [0.9, 0.7] and bars.layout.shapes[0].y0 == 0.8
    history = pd.DataFrame(
        {"round": [1, 2], "kind": ["kmeans", "em"], "bytes_up": [1000, 2000],
         "bytes_down": [500, 500]}
    )  # fmt: skip
    rounds = rounds_figure(history)
    up = [t for t in rounds.data if t.name.startswith("em") and "up" in t.name]
    assert list(up[0].y) == [2.0]  # kilobytes
    trace = adaptation_figure(np.array([[0.5, 0.5], [0.6, 0.4], [0.7, 0.3]]))
    assert [t.name for t in trace.data] == ["k=0", "k=1"]
    assert list(trace.data[0].y) == [0.5, 0.6, 0.7]


def test_shares_figure_puts_the_largest_share_on_top_and_colours_negative_ones():
    shares = pd.Series({"a": 0.1, "b": 1.3, "c": -0.4})
    fig = shares_figure(shares, title="row 3")
    bars = {t.name: dict(zip(t.y, t.x, strict=True)) for t in fig.data}
    assert bars == {"adds distance": {"a": 0.1, "b": 1.3}, "lowers distance": {"c": -0.4}}
    assert fig.data[0].marker.color == COLORS["adds distance"]
    assert list(fig.layout.yaxis.categoryarray) == ["a", "c", "b"]  # bottom to top
    assert fig.layout.title.text == "row 3"
    many = pd.Series(np.linspace(-1, 1, 40), index=[f"f{i}" for i in range(40)])
    assert sum(len(t.y) for t in shares_figure(many, top=10).data) == 10
