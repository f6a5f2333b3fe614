"""The ``fednovelty`` command: fit and score on files, and the demo on a small real dataset."""

import sys

import numpy as np
import pandas as pd
import pytest
from _tolerance import assert_close_scaled

from fednovelty import load
from fednovelty._cli import bench as cli_bench
from fednovelty.cli import build_parser, main
from fednovelty.demo import format_table, run_demo


def _table(tmp_path, rng):
    X = np.vstack([rng.normal(0, 1, (300, 3)), rng.normal(5, 1, (300, 3))])
    frame = pd.DataFrame(X, columns=["a", "b", "c"])
    frame["site"] = rng.choice(["north", "south", "east"], len(frame))
    path = tmp_path / "train.csv"
    frame.to_csv(path, index=False)
    return path


def test_fit_then_score(tmp_path, capsys):
    rng = np.random.default_rng(0)
    data = _table(tmp_path, rng)
    model = tmp_path / "model.safetensors"
    assert main(["fit", str(data), "--client-column", "site", "--components", "2",
                 "--out", str(model)]) == 0  # fmt: skip
    detector = load(model)
    assert detector.n_clients_ == 3 and detector.n_components_ == 2
    scores = tmp_path / "scores.csv"
    assert main(["score", str(model), str(data), "--client-column", "site",
                 "--out", str(scores)]) == 0  # fmt: skip
    out = pd.read_csv(scores)
    assert list(out.columns) == ["row", "site", "log_px", "anomaly_score", "is_anomaly"]
    np.testing.assert_allclose(out.anomaly_score, -out.log_px)
    assert out.is_anomaly.sum() > 0


def test_bad_input_gives_a_message_not_a_traceback(tmp_path, capsys):
    rng = np.random.default_rng(1)
    data = _table(tmp_path, rng)
    code = main(["fit", str(data), "--client-column", "site", "--components", "5000",
                 "--out", str(tmp_path / "m.safetensors")])  # fmt: skip
    assert code == 2
    assert "--components 5000" in capsys.readouterr().err
    assert main(["score", str(tmp_path / "missing.safetensors"), str(data), "--out", "x"]) == 2


def test_demo_runs_on_a_small_real_dataset():
    table = run_demo("14_glass", n_clients=3, n_components=2, progress=False)
    assert list(table.method)[-2:] == ["CentralGMM (pooled data)", "IForest (pooled data, PyOD)"]
    assert table.AUROC.between(0, 1).all()
    assert (table.rounds[:4] >= 1).all() and (table.rounds[4:] == 0).all()
    # on glass, centralized EM detects the anomalies better than chance
    assert table.set_index("method").AUROC["CentralGMM (pooled data)"] > 0.6
    assert "AUROC" in format_table(table)


def test_demo_without_the_data_folder_runs_on_the_bundled_digits(monkeypatch, tmp_path, capsys):
    """An installed package has no ../shared: the default demo says so and runs on
    scikit-learn's bundled digits; a dataset named explicitly still needs its folder."""
    monkeypatch.setenv("FEDNOVELTY_DATA", str(tmp_path / "missing"))
    assert main(["demo", "--clients", "3", "--components", "2"]) == 0
    out = capsys.readouterr().out
    assert "data folder not found" in out and "bundled handwritten digits" in out
    assert "fednovelty demo: digits, 3 clients" in out and "CentralGMM" in out
    assert main(["demo", "--dataset", "14_glass"]) == 1
    assert "data folder not found" in capsys.readouterr().err


def test_demo_defaults_follow_the_dataset():
    from fednovelty.demo import demo_dataset, demo_settings

    assert demo_dataset(None) == ("10_cover", "")  # the shared folder is beside the checkout
    assert demo_dataset("digits") == ("digits", "")
    assert demo_settings("digits")["n_clients"] == 10
    assert demo_settings("10_cover")["n_components"] == 15


# ----------------------------------------------------------------------------- the registry
def test_fit_methods_are_the_registrys_savable_novelty_methods():
    from fednovelty.cli import fit_methods
    from fednovelty.methods import get_method, method_names

    names = fit_methods()
    assert set(names) == {
        name for name in method_names(variants=True) if get_method(name).kind != "pyod"
    }
    assert {"FedGMM", "FedGenGMM", "Local", "FedVB-oneshot-moment"} <= set(names)
    assert not set(names) & set(method_names(kind="pyod"))
    parsed = build_parser().parse_args(["fit", "x.csv", "--out", "m"])
    assert parsed.method == "FedGMM"


def test_fit_refuses_a_pyod_method(tmp_path, capsys):
    data = _table(tmp_path, np.random.default_rng(2))
    with pytest.raises(SystemExit) as stopped:  # argparse's usage error
        main(["fit", str(data), "--method", "IForest", "--out", str(tmp_path / "m")])
    assert stopped.value.code == 2
    assert "invalid choice: 'IForest'" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("name", "expected", "n_clients"),
    [
        ("DEM-kmeans", {"mixture_weights": "global", "init_params": "kmeans"}, 3),
        ("CentralGMM", {"mixture_weights": "global", "privacy__min_rows": 1}, 1),
    ],
)
def test_fit_builds_the_registrys_detector(tmp_path, name, expected, n_clients):
    from fednovelty.methods import get_method

    data = _table(tmp_path, np.random.default_rng(3))
    model = tmp_path / "model.safetensors"
    args = ["fit", str(data), "--client-column", "site", "--components", "2", "--seed", "4"]
    assert main([*args, "--method", name, "--out", str(model)]) == 0
    saved = load(model)
    params = saved.get_params()
    assert {key: params[key] for key in expected} == expected
    assert saved.n_clients_ == n_clients and saved.n_components_ == 2
    # the same detector as the registry builds, fitted as the method says (groups or pooled)
    frame = pd.read_csv(data)
    groups = frame.pop("site").to_numpy()
    method = get_method(name)
    direct = method.build(n_components=2, random_state=4)
    if method.fits_clients:
        direct.fit(frame, groups=groups)
    else:
        direct.fit(frame)
    assert_close_scaled(saved.score_samples(frame), direct.score_samples(frame))


def test_fit_local_ignores_components(tmp_path):
    data = _table(tmp_path, np.random.default_rng(5))
    model = tmp_path / "local.safetensors"
    assert main(["fit", str(data), "--client-column", "site", "--components", "2",
                 "--method", "Local", "--out", str(model)]) == 0  # fmt: skip
    assert load(model).n_clients_ == 3


def test_bench_defaults_to_the_registrys_methods(tmp_path, monkeypatch):
    from fednovelty.evaluation import benchmark
    from fednovelty.methods import METHODS, method_names

    seen = {}

    def stop(datasets, methods, **kwargs):
        seen["methods"] = list(methods)
        raise KeyboardInterrupt

    monkeypatch.setattr(benchmark, "check_grid", lambda *args, **kwargs: None)
    monkeypatch.setattr(benchmark, "run_benchmark", stop)
    assert main(["bench", "--datasets", "4_breastw", "--out", str(tmp_path / "b")]) == 130
    assert seen["methods"] == method_names()
    assert main(["bench", "--quick", "--out", str(tmp_path / "b")]) == 130
    assert seen["methods"] == cli_bench.QUICK["methods"]
    assert set(cli_bench.QUICK["methods"]) <= set(METHODS)


def test_bench_metrics_are_the_benchmarks():
    from fednovelty.evaluation.benchmark import METRICS

    assert cli_bench.METRICS == METRICS


def _fit_args(tmp_path, *extra: str) -> list[str]:
    data = _table(tmp_path, np.random.default_rng(0))
    model = tmp_path / "model.safetensors"
    return ["fit", str(data), "--client-column", "site", "--components", "2",
            "--out", str(model), "--overwrite", *extra]  # fmt: skip


def test_progress_bars_only_on_a_terminal_and_never_with_no_progress(tmp_path, capsys, monkeypatch):
    assert main(_fit_args(tmp_path)) == 0
    assert "round" not in capsys.readouterr().err  # stderr is captured: no terminal, no bar
    monkeypatch.setattr(sys.stderr, "isatty", lambda: True, raising=False)
    assert main(_fit_args(tmp_path)) == 0
    assert "round" in capsys.readouterr().err  # a terminal: the fit's bar over rounds
    assert main(_fit_args(tmp_path, "--no-progress")) == 0
    assert "round" not in capsys.readouterr().err


@pytest.mark.parametrize(
    "argv",
    [["demo"], ["fit", "x.csv", "--out", "m.safetensors"], ["bench", "--out", "b", "--quick"]],
)
def test_every_command_that_draws_bars_takes_no_progress(argv):
    assert build_parser().parse_args([*argv, "--no-progress"]).no_progress is True
