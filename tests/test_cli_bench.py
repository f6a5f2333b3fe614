"""``fednovelty bench``: files written, exit code 0; bad names exit with 2 and a suggestion."""

from __future__ import annotations

import pandas as pd
import pytest

from fednovelty.cli import main

TINY = ["--components", "2", "--clients", "3", "--max-train", "150", "--no-progress"]


def test_bench_writes_results_summary_and_figures(tmp_path, capsys):
    out = tmp_path / "run"
    args = ["bench", "--datasets", "4_breastw", "--methods", "DEM-kmeans", "IForest",
            "--alphas", "0.5", "5", "--out", str(out), *TINY]  # fmt: skip
    assert main(args) == 0
    results = pd.read_csv(out / "results.csv")
    assert len(results) == 4 and results["error"].isna().all()
    assert "DEM-kmeans" in (out / "summary.md").read_text()
    pngs = sorted(p.name for p in out.glob("*.png"))
    assert pngs == ["aupr_out_vs_alpha_4_breastw_novelty.png", "auroc_by_dataset_novelty.png"]
    assert "4 cells (0 failed)" in capsys.readouterr().out
    assert main(args) == 0  # resumed: nothing new
    assert len(pd.read_csv(out / "results.csv")) == 4


def test_quick_fills_in_what_was_not_given(tmp_path):
    out = tmp_path / "quick"
    assert main(["bench", "--quick", "--methods", "IForest", "--out", str(out), *TINY]) == 0
    results = pd.read_csv(out / "results.csv")
    assert results["dataset"].tolist() == ["4_breastw", "29_Pima"]
    assert results["method"].tolist() == ["IForest", "IForest"]


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--datasets", "4_breast", "--methods", "IForest"], "did you mean 4_breastw"),
        (["--datasets", "4_breastw", "--methods", "IForrest"], "did you mean IForest"),
        (["--datasets", "4_breastw:nois", "--methods", "IForest"], "did you mean noise"),
        (["--methods", "IForest"], "name the datasets"),
    ],
)
def test_bad_names_exit_2_with_a_suggestion(tmp_path, capsys, argv, message):
    assert main(["bench", *argv, "--out", str(tmp_path / "x"), *TINY]) == 2
    err = capsys.readouterr().err
    assert err.startswith("fednovelty: error: ") and message in err
    assert not (tmp_path / "x").exists()


def test_ablations_run_beside_the_methods_under_their_own_names(tmp_path, capsys):
    out = tmp_path / "ablations"
    args = ["bench", "--datasets", "4_breastw", "--methods", "DEM-kmeans", "IForest",
            "--ablations", "plain,std", "prior", "--out", str(out), *TINY]  # fmt: skip
    assert main(args) == 0
    results = pd.read_csv(out / "results.csv")
    assert results["method"].tolist() == ["DEM-kmeans", "IForest", "DEM-kmeans-plain",
                                          "DEM-kmeans-std", "DEM-kmeans-prior"]  # fmt: skip
    assert results["error"].isna().all()
    assert "DEM-kmeans-prior" in (out / "summary.md").read_text()
    assert "5 cells (0 failed)" in capsys.readouterr().out
    alone = tmp_path / "alone"  # an ablation named among the methods runs alone
    assert main([*args[:4], "DEM-kmeans-plain", "--out", str(alone), *TINY]) == 0
    pd.testing.assert_series_equal(
        pd.read_csv(alone / "results.csv")["auroc"],
        results["auroc"].iloc[2:3].reset_index(drop=True),
    )


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--ablations", "plian"], "unknown ablation 'plian' (did you mean plain"),
        (["--methods", "IForest", "--ablations", "plain"], "none of the methods IForest takes"),
        (["--methods", "IForest-plain"], "IForest does not take the ablation 'plain'"),
    ],
)
def test_bad_ablations_exit_2(tmp_path, capsys, argv, message):
    args = ["bench", "--datasets", "4_breastw", "--methods", "DEM-kmeans", *argv]
    assert main([*args, "--out", str(tmp_path / "x"), *TINY]) == 2
    err = capsys.readouterr().err
    assert err.startswith("fednovelty: error: ") and message in err
    assert not (tmp_path / "x").exists()


def test_malformed_option_is_an_argparse_error(tmp_path):
    with pytest.raises(SystemExit) as exit_info:
        main(["bench", "--quick", "--clients", "many", "--out", str(tmp_path)])
    assert exit_info.value.code == 2


# ----------------------------------------------------------------------------- --stream
STREAM = ["--stream", "linear", "--windows", "3", "--clients", "3", "--rows", "40",
          "--components", "2", "--no-progress"]  # fmt: skip


def test_stream_writes_results_summary_and_figure(tmp_path, capsys):
    out = tmp_path / "stream"
    args = ["bench", "--datasets", "cifar10-svhn", "--methods", "streaming", "static", "refit",
            "--seeds", "0", "1", "--out", str(out), *STREAM]  # fmt: skip
    assert main(args) == 0
    results = pd.read_csv(out / "results.csv")
    assert len(results) == 2 * 4 * 3 and results["error"].isna().all()  # seeds x windows x methods
    assert results["window"].tolist()[:6] == [0, 0, 0, 1, 1, 1]
    assert set(results["rows_per_window"]) == {40} and set(results["n_components"]) == {2}
    static = results[results["method"] == "static"]
    assert static.loc[static["window"] >= 1, "bytes"].eq(0).all()
    summary = (out / "summary.md").read_text()
    assert "## cifar10-svhn: linear schedule x 1, 3 windows, 3 clients x 40 rows, K = 2" in summary
    assert [p.name for p in out.glob("*.png")] == ["auroc_by_window_cifar10-svhn.png"]
    printed = capsys.readouterr().out
    assert "| streaming" in printed and "24 rows (0 failed)" in printed
    assert main(args) == 2  # a stream run does not resume
    assert "does not resume" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--datasets", "4_breastw", "--windows", "3"], "--windows: stream option(s)"),
        (["--datasets", "cifar10-svhn", "--methods", "IForest"], "stream dataset(s); add --stream"),
        (["--stream", "linear", "--datasets", "cifar10-svhn", "--alphas", "0.5"],
         "--alphas: grid option(s) that do not apply"),
        (["--stream", "linear", "--datasets", "cifar10-svhn", "--ablations", "plain"],
         "--ablations: grid option(s) that do not apply"),
        (["--stream", "linear", "--datasets", "cifar10-svhm"], "did you mean cifar10-svhn"),
        (["--stream", "linear", "--datasets", "CIFAR10_0+4_breastw"], "need one width"),
        (["--stream", "linear", "--datasets", "femnist:blur"], "unknown FEMNIST OOD transform"),
        (["--stream", "cosine", "--datasets", "femnist", "--clients", "3", "5"],
         "--clients takes one value with --stream"),
        (["--stream", "linear", "--datasets", "femnist", "--share", "0.2"], "--stream constant"),
        (["--stream", "constant", "--datasets", "femnist", "--share", "2"], "--share must be in"),
        (["--stream", "linear", "--datasets", "femnist", "--rho", "1.5"], "--rho must be in"),
        (["--stream", "linear", "--datasets", "femnist", "--methods", "IForest"],
         "unknown stream method 'IForest'"),
        (["--stream", "linear", "--datasets", "femnist", "--baseline", "IForest"],
         "unknown baseline"),
        (["--stream", "linear"], "name the streams"),
    ],
)  # fmt: skip
def test_stream_usage_errors_exit_2(tmp_path, capsys, argv, message):
    assert main(["bench", *argv, "--out", str(tmp_path / "x"), "--no-progress"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("fednovelty: error: ") and message in err
    assert not (tmp_path / "x").exists()
