"""The benchmark runner end to end on a tiny grid of a small real dataset."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from fednovelty import methods
from fednovelty.evaluation import benchmark
from fednovelty.evaluation.benchmark import (
    COLUMNS,
    DEFAULT_METHODS,
    METHODS,
    METRICS,
    run_benchmark,
    summarize,
)

REQUIRED = ["dataset", "method", "protocol", "alpha", "n_clients", "seed", "auroc", "aupr_in",
            "aupr_out", "fpr_at_95_tpr", "max_f1", "rounds", "bytes_up", "bytes_down",
            "fit_seconds"]  # fmt: skip
TINY = {"n_components": 2, "max_train": 150, "progress": False}
GRID = {"protocols": ("novelty", "outlier"), "n_clients": (3,), "seeds": (0, 1), **TINY}
METHOD_NAMES = ["DEM-kmeans", "CentralGMM", "IForest"]


@pytest.fixture(scope="module")
def results(tmp_path_factory):
    out = tmp_path_factory.mktemp("bench") / "results.csv"
    df = run_benchmark(["4_breastw"], METHOD_NAMES, out_csv=out, **GRID)
    return df, out


def test_one_row_per_cell_with_the_required_columns(results):
    df, out = results
    assert set(REQUIRED) <= set(df.columns) and list(df.columns) == list(COLUMNS)
    assert len(df) == 1 * 3 * 2 * 1 * 1 * 2  # datasets x methods x protocols x alphas x ...
    assert not df.duplicated(["dataset", "method", "protocol", "alpha", "n_clients", "seed"]).any()
    assert df["error"].isna().all(), df["error"].dropna().tolist()
    assert df[list(METRICS)].apply(lambda c: c.between(0, 1)).all().all()
    assert (df["auroc"] > 0.8).all()  # breastw is easy for every method
    assert set(df["protocol"]) == {"novelty", "outlier"}
    dem = df[df["method"] == "DEM-kmeans"]
    assert (dem["rounds"] >= 1).all() and (dem["bytes_up"] > 0).all()
    central = df[df["method"] != "DEM-kmeans"]
    assert central[["rounds", "bytes_up", "bytes_down"]].isna().all().all()
    assert (df["n_train"] <= 150).all() and (df["fit_seconds"] >= 0).all()
    on_disk = pd.read_csv(out)
    assert len(on_disk) == len(df)


def test_resume_skips_finished_cells(results, monkeypatch):
    df, out = results

    def must_not_run(*args, **kwargs):
        raise AssertionError("a finished cell was run again")

    monkeypatch.setattr(benchmark, "_run_cell", must_not_run)
    again = run_benchmark(["4_breastw"], METHOD_NAMES, out_csv=out, **GRID)
    assert len(pd.read_csv(out)) == len(df)  # nothing appended
    pd.testing.assert_frame_equal(
        again[list(METRICS)].reset_index(drop=True), df[list(METRICS)].reset_index(drop=True)
    )


def test_a_killed_run_loses_at_most_the_cell_in_progress(tmp_path, monkeypatch):
    out = tmp_path / "results.csv"
    real = benchmark._run_cell
    calls = []

    def interrupted_on_second(*args):
        calls.append(args[0].name)
        if len(calls) == 2:
            raise KeyboardInterrupt
        return real(*args)

    monkeypatch.setattr(benchmark, "_run_cell", interrupted_on_second)
    with pytest.raises(KeyboardInterrupt):
        run_benchmark(["4_breastw"], ["IForest", "COPOD", "PCA"], out_csv=out, **TINY)
    assert pd.read_csv(out)["method"].tolist() == ["IForest"]
    monkeypatch.setattr(benchmark, "_run_cell", real)
    done = run_benchmark(["4_breastw"], ["IForest", "COPOD", "PCA"], out_csv=out, **TINY)
    assert done["method"].tolist() == ["IForest", "COPOD", "PCA"]
    assert len(pd.read_csv(out)) == 3


def test_a_failing_method_is_recorded_and_the_grid_goes_on(tmp_path):
    out = tmp_path / "results.csv"
    df = run_benchmark(["4_breastw"], ["DEM-kmeans", "IForest"], out_csv=out,
                       **(TINY | {"n_components": 5000}))  # fmt: skip
    failed = df.set_index("method").loc["DEM-kmeans"]
    assert "n_components=5000" in failed["error"]
    assert np.isnan(failed["auroc"])
    assert df.set_index("method").loc["IForest", "error"] is None
    assert "## Errors (1 cell(s))" in summarize(df)
    # a task that cannot be built fails each of its cells, with the reason
    bad = run_benchmark(["4_breastw"], ["IForest"], partition="iid", n_clients=(500,), **TINY)
    assert bad["error"].str.startswith("task: ValueError").all()


def test_min_size_reaches_the_partition_and_is_part_of_the_cell(tmp_path):
    out = tmp_path / "results.csv"
    too_many = run_benchmark(["4_breastw"], ["IForest"], n_clients=(3,), min_size=100,
                             out_csv=out, **TINY)  # fmt: skip
    assert "min_size=100" in too_many.loc[0, "error"]
    assert too_many.loc[0, "min_size"] == 100
    lowered = run_benchmark(
        ["4_breastw"], ["IForest"], n_clients=(3,), min_size=2, out_csv=out, **TINY
    )  # fmt: skip: a new cell, not a resumed one
    assert lowered.loc[0, "error"] is None and len(pd.read_csv(out)) == 2


def test_a_file_without_min_size_resumes(tmp_path):
    out = tmp_path / "results.csv"
    first = run_benchmark(["4_breastw"], ["IForest"], out_csv=out, **TINY)
    first.drop(columns="min_size").to_csv(out, index=False)  # as written before min_size
    again = run_benchmark(["4_breastw"], ["IForest"], out_csv=out, **TINY)
    assert again.loc[0, "fit_seconds"] == first.loc[0, "fit_seconds"]  # read back, not rerun


def test_retry_errors_runs_failed_cells_again(tmp_path, monkeypatch):
    out = tmp_path / "results.csv"
    real = benchmark._run_cell

    def broken(*args):
        raise RuntimeError("transient")

    monkeypatch.setattr(benchmark, "_run_cell", broken)
    assert run_benchmark(["4_breastw"], ["PCA"], out_csv=out, **TINY)["error"].notna().all()
    monkeypatch.setattr(benchmark, "_run_cell", real)
    assert run_benchmark(["4_breastw"], ["PCA"], out_csv=out, **TINY)["error"].notna().all()
    fixed = run_benchmark(["4_breastw"], ["PCA"], out_csv=out, retry_errors=True, **TINY)
    assert fixed["error"].isna().all() and len(fixed) == 1


def test_client_components_is_an_axis_only_for_methods_that_use_it():
    df = run_benchmark(["4_breastw"], ["Local", "IForest"], client_components=(1, 2), **TINY)
    assert sorted(df["method"].tolist()) == ["IForest", "Local", "Local"]
    assert df.loc[df["method"] == "IForest", "client_components"].isna().all()


def test_summary_has_every_method_and_the_ranks(results):
    df, _ = results
    text = summarize(df)
    for name in METHOD_NAMES:
        assert name in text
    assert "mean rank" in text and "4_breastw" in text and "protocol=outlier" in text
    assert "±" in text  # two seeds give a std


def test_unknown_names_suggest_the_closest():
    with pytest.raises(ValueError, match="did you mean IForest"):
        run_benchmark(["4_breastw"], ["IForrest"], progress=False)
    with pytest.raises(ValueError, match="did you mean 4_breastw"):
        run_benchmark(["4_breast"], ["IForest"], progress=False)
    with pytest.raises(ValueError, match="unknown protocol"):
        run_benchmark(["4_breastw"], ["IForest"], protocols=["transductive"], progress=False)


def test_methods_come_from_the_registry():
    known = iter(DEFAULT_METHODS)  # the package's, in this order (a new one may stand between)
    assert all(name in known for name in ["FedGenGMM", "FedGMM", "DEM-kmeans", "DEM-separated",
                                     "DEM-subset", "DEM-oneshot", "ClusteredGMM-IFCA",
                                     "ClusteredGMM-FeSEM",
                                     "Local", "CentralGMM", "FedGenGMM-copula", "FedMFA", "FedVB",
                                     "KNN-markers",
                                     "IForest", "ECOD", "COPOD", "KNN", "LOF", "HBOS",
                                     "PCA"])  # fmt: skip
    assert METHODS is methods.METHODS and list(DEFAULT_METHODS) == methods.method_names()
    assert benchmark.check_methods(["DEM-kmeans-plain", "IForest"]) == ["DEM-kmeans-plain",
                                                                        "IForest"]  # fmt: skip
    with pytest.raises(ValueError, match="PFL-FedAvg: personalised classification"):
        benchmark.check_methods(["IForest", "PFL-FedAvg"])


def test_each_method_gets_the_grid_settings_it_takes(monkeypatch):
    built = {}
    real = methods.Method.build

    def spy(self, **params):
        built[self.name] = params
        return real(self, **params)

    monkeypatch.setattr(methods.Method, "build", spy)
    df = run_benchmark(["4_breastw"], ["FedGenGMM", "Local", "DEM-subset", "PCA", "ECOD"],
                       covariance_type="diag", client_components=2, seeds=(3,),
                       **TINY)  # fmt: skip
    assert df["error"].isna().all(), df["error"].dropna().tolist()
    mixture = {"n_components": 2, "covariance_type": "diag", "random_state": 3}
    assert built == {
        "FedGenGMM": {**mixture, "client_components": 2},
        "Local": {"client_components": 2, "covariance_type": "diag", "random_state": 3},
        "DEM-subset": mixture,
        "PCA": {"random_state": 3},  # PyOD's own n_components is not the mixture's K
        "ECOD": {},
    }
    fitted_on_clients = df.set_index("method")["rounds"].notna().to_dict()
    assert fitted_on_clients == {"FedGenGMM": True, "Local": True, "DEM-subset": True,
                                 "PCA": False, "ECOD": False}  # fmt: skip


def test_torch_threads_are_set_for_the_run_and_restored():
    import torch

    seen = []
    real = benchmark._run_cell

    def spy(*args):
        seen.append(torch.get_num_threads())
        return real(*args)

    before = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        with pytest.MonkeyPatch.context() as patch:
            patch.setattr(benchmark, "_run_cell", spy)
            run_benchmark(["4_breastw"], ["PCA"], threads=1, **TINY)
        assert seen == [1] and torch.get_num_threads() == 2
    finally:
        torch.set_num_threads(before)


def test_the_bundled_digits_need_no_data_folder(tmp_path):
    from fednovelty.evaluation.benchmark import check_datasets

    missing = tmp_path / "missing"
    assert check_datasets(["digits", "digits:noise"], data_dir=missing) == [
        "digits",
        "digits:noise",
    ]
    with pytest.raises(FileNotFoundError, match="data folder not found"):
        check_datasets(["digits", "4_breastw"], data_dir=missing)
