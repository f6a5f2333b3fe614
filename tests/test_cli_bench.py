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


def test_malformed_option_is_an_argparse_error(tmp_path):
    with pytest.raises(SystemExit) as exit_info:
        main(["bench", "--quick", "--clients", "many", "--out", str(tmp_path)])
    assert exit_info.value.code == 2
