"""Figures from results tables: Axes come back, PNGs are written, failed cells are left out."""

from __future__ import annotations

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
import pytest

from fednovelty.evaluation import plot_method_bars, plot_metric_vs


@pytest.fixture
def sweep():
    rng = np.random.default_rng(0)
    rows = []
    for method in ("FedGenGMM", "DEM-kmeans", "IForest"):
        for alpha in (0.1, 0.5, 5.0):
            for seed in (0, 1, 2):
                rows.append({"dataset": "10_cover:noise", "method": method, "alpha": alpha,
                             "seed": seed, "client_components": np.nan,
                             "aupr_out": rng.uniform(0.6, 0.9), "auroc": rng.uniform(0.6, 0.9),
                             "error": None})  # fmt: skip
    for kc in (2, 4, 8):
        rows.append({"dataset": "10_cover:noise", "method": "FedGenGMM", "alpha": 0.5, "seed": 0,
                     "client_components": kc, "aupr_out": 0.7, "auroc": 0.8,
                     "error": None})  # fmt: skip
    rows.append({"dataset": "4_breastw", "method": "Local", "alpha": 0.5, "seed": 0,
                 "client_components": np.nan, "aupr_out": np.nan, "auroc": np.nan,
                 "error": "ValueError: boom"})  # fmt: skip
    return pd.DataFrame(rows)


def test_metric_vs_alpha_draws_a_line_and_band_per_method(sweep, tmp_path):
    ax = plot_metric_vs(sweep, x="alpha", metric="aupr_out")
    assert isinstance(ax, matplotlib.axes.Axes)
    labels = [line.get_label() for line in ax.get_lines()]
    assert labels == ["FedGenGMM", "DEM-kmeans", "IForest"]  # the failed Local cell is left out
    assert len(ax.collections) == 3  # one std band each
    assert ax.get_xscale() == "log"  # 0.1 .. 5 spans a factor of 50
    np.testing.assert_allclose(ax.get_lines()[1].get_xdata(), [0.1, 0.5, 5.0])
    mean = sweep[(sweep.method == "DEM-kmeans") & (sweep.alpha == 0.5)].aupr_out.mean()
    assert ax.get_lines()[1].get_ydata()[1] == pytest.approx(mean)
    path = tmp_path / "fig3.png"
    ax.figure.savefig(path)
    assert path.stat().st_size > 1000 and path.read_bytes()[:4] == b"\x89PNG"
    plt.close(ax.figure)


def test_methods_constant_along_x_become_reference_lines(sweep):
    _, ax = plt.subplots()
    assert plot_metric_vs(sweep, x="client_components", metric="aupr_out", ax=ax) is ax
    lines = {line.get_label(): line for line in ax.get_lines()}
    assert lines["IForest"].get_linestyle() == "--"
    np.testing.assert_allclose(lines["IForest"].get_xdata(), [2, 8])
    assert lines["FedGenGMM"].get_linestyle() == "-"
    plt.close(ax.figure)


def test_method_bars(sweep, tmp_path):
    ax = plot_method_bars(sweep, metric="auroc", title="AUROC")
    assert isinstance(ax, matplotlib.axes.Axes)
    assert [t.get_text() for t in ax.get_xticklabels()] == ["10_cover:noise"]
    ax.figure.savefig(tmp_path / "bars.png")
    assert (tmp_path / "bars.png").is_file()
    plt.close(ax.figure)


def test_missing_column_is_a_clear_error(sweep):
    with pytest.raises(ValueError, match="no column"):
        plot_metric_vs(sweep, x="n_clients")
