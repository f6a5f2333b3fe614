"""Novelty under drift (``run_stream_benchmark``): detectors scored window by window on a
two-domain stream; the tidy table, its summary and figure, and named errors."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from fednovelty.datasets.domain_pools import DomainPools
from fednovelty.datasets.streams import schedule_share
from fednovelty.evaluation import (
    format_stream_summary,
    plot_stream_metric,
    run_stream_benchmark,
    stream_summary,
)
from fednovelty.evaluation.streams import STREAM_COLUMNS, check_stream_datasets

DOCS = Path(__file__).resolve().parents[2] / "docs"
N_WINDOWS = 6


def pools(seed: int = 0) -> DomainPools:
    """A around the origin, B around (8, 0), novel rows around (4, 6): neither domain."""
    rng = np.random.default_rng(seed)

    def a(n):
        return rng.normal(0, 1, (n, 2))

    def b(n):
        return rng.normal(0, 1, (n, 2)) + np.array([8.0, 0.0])

    return DomainPools("synthetic", a(400), b(400), a(200), b(200), rng.normal(4, 1, (100, 2)))


@pytest.fixture(scope="module")
def moved():
    """A warm-up on A alone (first_share 1), then B arrives with the linear cycle: a static
    detector never saw B, so B's inliers look novel to it."""
    return run_stream_benchmark(
        pools(),
        seeds=[0, 1],
        n_windows=N_WINDOWS,
        n_clients=3,
        rows_per_window=60,
        test_inliers=120,
        test_novel=20,
        first_share=1.0,
        n_components=2,
        progress=False,
    )


def test_the_table_is_tidy(moved):
    assert list(moved.columns) == list(STREAM_COLUMNS)
    methods = ["streaming", "static", "refit", "FedGenGMM-plain"]
    assert len(moved) == 2 * (N_WINDOWS + 1) * len(methods) and moved["error"].isna().all()
    assert moved["method"].unique().tolist() == methods
    one = moved[(moved["seed"] == 0) & (moved["method"] == "refit")].sort_values("window")
    expected = [1.0] + [schedule_share(t, N_WINDOWS, "linear") for t in range(1, N_WINDOWS + 1)]
    np.testing.assert_allclose(one["share"], expected)
    assert one["moved"].tolist() == [abs(s - 1.0) >= 0.3 for s in expected]
    assert (moved["n_test"] == 140).all() and (moved["n_train"] == 180).all()
    assert moved["auroc"].between(0, 1).all()
    static = moved[moved["method"] == "static"]
    assert (static.loc[static["window"] >= 1, "bytes"] == 0).all()
    assert (static.loc[static["window"] == 0, "bytes"] > 0).all()
    others = moved[moved["method"] != "streaming"]
    assert others["tracking_error"].isna().all() and others["alarms"].isna().all()
    stream = moved[(moved["method"] == "streaming") & (moved["window"] >= 1)]
    assert stream["alarms"].notna().all() and (stream["bytes"] > 0).all()


def test_streaming_beats_static_once_the_mix_moved_at_a_fraction_of_refits_bytes(moved):
    summary = stream_summary(moved)
    streaming, static = summary.loc["synthetic", "streaming"], summary.loc["synthetic", "static"]
    refit = summary.loc["synthetic", "refit"]
    print(summary[["auroc", "auroc_moved", "kb_per_window", "bytes_ratio"]])
    # the streaming detector re-bears a component where B arrives; the static one never moves
    assert streaming["auroc_moved"] >= 0.95 and static["auroc_moved"] <= 0.8
    assert streaming["auroc_moved"] - static["auroc_moved"] >= 0.15
    assert abs(streaming["auroc_minus_reference"]) <= 0.02  # as good as refitting
    assert refit["auroc_minus_reference"] == pytest.approx(0.0, abs=1e-12)
    assert refit["bytes_ratio"] == pytest.approx(1.0, rel=1e-12)
    windows = moved[moved["window"] >= 1]
    kb = windows.groupby("method")["bytes"].mean() / 1e3
    assert streaming["bytes_ratio"] == pytest.approx(kb["streaming"] / kb["refit"], rel=1e-9)
    assert streaming["bytes_ratio"] < 0.5 and static["bytes_ratio"] == 0.0


def test_summary_markdown_and_figure(moved):
    text = format_stream_summary(moved)
    assert "## synthetic: linear schedule x 1, 6 windows, 3 clients x 60 rows, K = 2" in text
    for name in ("streaming", "static", "refit", "FedGenGMM-plain"):
        assert re.search(rf"^\| {re.escape(name)} +\| \d+\.\d\d ± \d+\.\d\d", text, re.M)
    ax = plot_stream_metric(moved, "auroc", title="synthetic")
    lines = [line.get_label() for line in ax.get_lines()]
    assert lines == ["streaming", "static", "refit", "FedGenGMM-plain"]
    assert len(ax.figure.axes) == 2  # the share on its twin axis
    share = ax.figure.axes[1].get_lines()[0]
    np.testing.assert_allclose(share.get_ydata()[1:], moved.groupby("window")["share"].mean()[1:])
    import matplotlib.pyplot as plt

    plt.close(ax.figure)


def test_baseline_and_registry_methods_and_settings():
    df = run_stream_benchmark(
        pools(1),
        ["streaming", "refit", "DEM-kmeans-plain"],
        baseline="DEM-kmeans-plain",
        n_windows=2,
        n_clients=2,
        rows_per_window=50,
        n_components=2,
        rounds=2,
        rho=0.5,
        progress=False,
    )
    assert df["error"].isna().all()
    # refit is the baseline: the same detector, seed and rows as the method itself
    refit = df[df["method"] == "refit"]["auroc"].to_numpy()
    np.testing.assert_allclose(refit, df[df["method"] == "DEM-kmeans-plain"]["auroc"], rtol=1e-12)
    assert set(df["rho"]) == {0.5} and set(df["rounds"]) == {2}
    assert (df.loc[(df["method"] == "streaming") & (df["window"] > 0), "n_rounds"] == 2).all()


@pytest.mark.parametrize(
    ("kwargs", "error", "match"),
    [
        ({"methods": ["streamin"]}, ValueError, "did you mean streaming"),
        ({"methods": ["IForest"]}, ValueError, "unknown stream method 'IForest'"),
        ({"methods": ["refit", "refit"]}, ValueError, "named twice"),
        ({"methods": []}, ValueError, "methods is empty"),
        ({"baseline": "CentralGMM"}, ValueError, "baseline is a federated method"),
        ({"schedule": "sine"}, ValueError, "schedule must be one of"),
        ({"rho": 1.5}, ValueError, "rho must be"),
        ({"rounds": -1}, ValueError, "rounds must be"),
        ({"n_components": 0}, ValueError, "n_components must be"),
        ({"seeds": []}, ValueError, "seeds is empty"),
        ({"dataset": "cifar10-svhm"}, ValueError, "did you mean cifar10-svhn"),
        ({"dataset": "CIFAR10_0+4_breastw"}, ValueError, "one width"),
        ({"dataset": "CIFAR10_0+SVHN_1"}, ValueError, "did you mean SVHN_0"),
        ({"dataset": "femnist:blur"}, ValueError, "unknown FEMNIST OOD transform"),
    ],
)
def test_bad_arguments_are_named(kwargs, error, match):
    args = {"dataset": pools(), **kwargs}
    with pytest.raises(error, match=match):
        run_stream_benchmark(args.pop("dataset"), progress=False, n_windows=2, **args)


def test_stream_dataset_names_are_checked():
    assert check_stream_datasets(["cifar10-svhn", "femnist:rotate", "cifar10-svhn"]) == [
        "cifar10-svhn",
        "femnist:rotate",
    ]
    with pytest.raises(ValueError, match="datasets is empty"):
        check_stream_datasets([])


def test_docs_novelty_under_drift_example_runs(capsys):
    """The example of docs/streaming.md's "Novelty under drift" section."""
    text = (DOCS / "streaming.md").read_text()
    section = text.split("## Novelty under drift", 1)[1].split("\n## ", 1)[0]
    (block,) = re.findall(r"```python\n(.*?)```", section, flags=re.S)
    exec(compile(block, "docs/streaming.md Novelty under drift", "exec"), {})
    out = capsys.readouterr().out
    assert "| streaming" in out and "| refit" in out
    table = pd.read_csv(DOCS.parent / "benchmarks" / "results" / "stream_drift.csv", nrows=1)
    assert list(table.columns) == list(STREAM_COLUMNS)


def test_doctests():
    import doctest

    import fednovelty.evaluation.streams as streams

    result = doctest.testmod(streams, raise_on_error=False)
    assert result.attempted >= 3 and result.failed == 0
