"""``fednovelty fit/score/bench`` and the user's files: no input is overwritten, an existing
output only with ``--overwrite``, a missing folder is a clear error; exit codes 2 (usage) and 1
(data or model), one ``fednovelty: error:`` line and no traceback."""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from fednovelty import load
from fednovelty._cli.files import UsageError, write_atomically
from fednovelty.cli import main
from fednovelty.evaluation.results import COLUMNS

FIT = ["--client-column", "site", "--components", "1"]


@pytest.fixture
def table(tmp_path):
    """A small training table with string client ids: ``tmp_path/t.csv``."""
    rng = np.random.default_rng(0)
    frame = pd.DataFrame(rng.normal(0, 1, (60, 2)), columns=["a", "b"])
    frame["site"] = np.repeat(["paris", "lyon", "nice"], 20)
    path = tmp_path / "t.csv"
    frame.to_csv(path, index=False)
    return path


@pytest.fixture
def model(tmp_path, table):
    path = tmp_path / "m.safetensors"
    assert main(["fit", str(table), *FIT, "--out", str(path)]) == 0
    return path


def _error_line(capsys) -> str:
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1, err
    assert err[0].startswith("fednovelty: error: "), err
    return err[0]


def test_fit_refuses_to_write_over_its_training_table(tmp_path, table, capsys, monkeypatch):
    before = table.read_bytes()
    for out in (str(table), "./t.csv", os.path.join("..", tmp_path.name, "t.csv")):
        monkeypatch.chdir(tmp_path)
        assert main(["fit", str(table), *FIT, "--out", out, "--overwrite"]) == 2
        assert "input" in _error_line(capsys)
    link = tmp_path / "link.csv"
    link.symlink_to(table)
    assert main(["fit", str(table), *FIT, "--out", str(link), "--overwrite"]) == 2
    assert "input" in _error_line(capsys)
    assert table.read_bytes() == before


def test_score_refuses_to_write_over_the_data_or_the_model(tmp_path, table, model, capsys):
    data, weights = table.read_bytes(), model.read_bytes()
    for out in (table, model):
        code = main(["score", str(model), str(table), "--out", str(out), "--overwrite"])
        assert code == 2
        assert f"{out}" in _error_line(capsys)
    assert table.read_bytes() == data and model.read_bytes() == weights


def test_an_existing_output_needs_overwrite(tmp_path, table, model, capsys):
    scores = tmp_path / "scores.csv"
    scores.write_text("mine\n")
    score = ["score", str(model), str(table), "--client-column", "site", "--out", str(scores)]
    assert main(score) == 2
    assert "--overwrite" in _error_line(capsys)
    assert scores.read_text() == "mine\n"
    assert main([*score, "--overwrite"]) == 0
    columns = ["row", "site", "log_px", "anomaly_score", "is_anomaly"]
    assert list(pd.read_csv(scores).columns) == columns

    weights = model.read_bytes()
    assert main(["fit", str(table), *FIT, "--out", str(model)]) == 2
    assert "--overwrite" in _error_line(capsys)
    assert model.read_bytes() == weights
    assert main(["fit", str(table), *FIT, "--out", str(model), "--overwrite", "--seed", "3"]) == 0
    assert load(model).n_components_ == 1
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "m.safetensors",
        "scores.csv",
        "t.csv",
    ]  # no temporary file left behind


def test_a_missing_output_folder_is_named(tmp_path, table, model, capsys):
    folder = tmp_path / "results" / "today"
    for argv in (
        ["fit", str(table), *FIT, "--out", str(folder / "m.safetensors")],
        ["score", str(model), str(table), "--out", str(folder / "s.csv")],
        ["bench", "--quick", "--out", str(folder / "run")],
    ):
        assert main(argv) == 2
        line = _error_line(capsys)
        assert "does not exist" in line and "create" in line
    assert not (tmp_path / "results").exists()
    assert main(["fit", str(table), *FIT, "--out", str(tmp_path)]) == 2
    assert "folder" in _error_line(capsys)


def test_bench_never_rewrites_a_foreign_results_file(tmp_path, capsys):
    out = tmp_path / "mine"
    out.mkdir()
    (out / "results.csv").write_text("x,y\n1,2\n")
    assert main(["bench", "--quick", "--out", str(out)]) == 2
    assert "not a fednovelty bench results file" in _error_line(capsys)
    assert (out / "results.csv").read_text() == "x,y\n1,2\n"
    plain = tmp_path / "file"
    plain.write_text("")
    assert main(["bench", "--quick", "--out", str(plain)]) == 2
    assert "is a file" in _error_line(capsys)


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["score", "{dir}/missing.safetensors", "{table}", "--out", "{dir}/s.csv"], "no such file"),
        (["fit", "{dir}/missing.csv", "--out", "{dir}/m.safetensors"], "no such file"),
        (["fit", "{dir}", "--out", "{dir}/m.safetensors"], "not a file"),
        (["fit", "{model}", "--out", "{dir}/m2.safetensors"], "expected a .csv or .parquet"),
        (["fit", "{table}", "--client-column", "city", "--out", "{dir}/x"], "'city'"),
        (["fit", "{table}", "--components", "500", "--out", "{dir}/x"], "--components 500"),
    ],
)
def test_usage_errors_exit_2_with_one_line(tmp_path, table, model, capsys, argv, message):
    names = {"dir": tmp_path, "table": table, "model": model}
    assert main([a.format(**names) for a in argv]) == 2
    assert message in _error_line(capsys)


def test_malformed_options_are_argparse_usage_errors(table, tmp_path):
    for argv in (
        ["fit", str(table), "--components", "0", "--out", str(tmp_path / "x")],
        ["fit", str(table), "--seed", "-1", "--out", str(tmp_path / "x")],
        ["bench", "--quick", "--clients", "0", "--out", str(tmp_path / "b")],
        ["bench", "--quick", "--alphas", "nan", "--out", str(tmp_path / "b")],
    ):
        with pytest.raises(SystemExit) as exit_info:
            main(argv)
        assert exit_info.value.code == 2


def test_data_and_model_problems_exit_1_with_one_line(tmp_path, table, model, capsys):
    damaged = tmp_path / "damaged.safetensors"
    damaged.write_bytes(model.read_bytes()[:100])
    assert main(["score", str(damaged), str(table), "--out", str(tmp_path / "s.csv")]) == 1
    assert "not a fednovelty model file" in _error_line(capsys)
    text = tmp_path / "words.csv"
    text.write_text("a,b\nx,y\nz,w\n")
    assert main(["score", str(model), str(text), "--out", str(tmp_path / "s.csv")]) == 1
    assert "numeric" in _error_line(capsys)
    empty = tmp_path / "empty.csv"
    empty.write_text("")
    assert main(["fit", str(empty), "--out", str(tmp_path / "m2.safetensors")]) == 1
    assert "empty.csv" in _error_line(capsys)
    assert not (tmp_path / "s.csv").exists() and not (tmp_path / "m2.safetensors").exists()


def test_the_process_exit_status_and_stderr(tmp_path, table):
    """The real command: status 2 for a refused overwrite, no traceback on stderr."""
    command = [sys.executable, "-m", "fednovelty.cli", "fit", str(table), "--out", str(table)]
    done = subprocess.run(command, capture_output=True, text=True, timeout=120)
    assert done.returncode == 2
    assert done.stderr.startswith("fednovelty: error: ") and "Traceback" not in done.stderr


# ------------------------------------------------------------------ bench --out: owned files
BENCH = ["bench", "--quick", "--methods", "IForest", "--components", "2", "--clients", "3",
         "--max-train", "150", "--no-progress"]  # fmt: skip
STREAM = ["bench", "--stream", "linear", "--datasets", "cifar10-svhn", "--methods", "static",
          "--windows", "2", "--clients", "3", "--rows", "40", "--no-progress"]  # fmt: skip


@pytest.fixture
def no_long_work(monkeypatch):
    """The grid and the stream runners fail the test if called: refusals come first."""
    from fednovelty.evaluation import benchmark, streams

    def started(*args, **kwargs):
        raise AssertionError("the benchmark started before the output folder was checked")

    monkeypatch.setattr(benchmark, "run_benchmark", started)
    monkeypatch.setattr(streams, "run_stream_benchmark", started)


def _special(path, kind):
    """A FIFO or a symbolic link to /dev/null at ``path``; returns a check that it is unchanged."""
    if kind == "fifo":
        os.mkfifo(path)
        return lambda: stat.S_ISFIFO(os.lstat(path).st_mode)
    path.symlink_to(os.devnull)
    return lambda: path.is_symlink() and os.readlink(path) == os.devnull


def test_bench_keeps_a_foreign_summary_and_names_it(tmp_path, capsys):
    out = tmp_path / "notes"
    out.mkdir()
    (out / "summary.md").write_text("my notes\n")
    assert main([*BENCH, "--out", str(out)]) == 2
    line = _error_line(capsys)
    assert str(out / "summary.md") in line and "another --out" in line
    assert (out / "summary.md").read_text() == "my notes\n"
    assert sorted(p.name for p in out.iterdir()) == ["summary.md"]  # refused before the run
    # beside a bench results file (a folder of an older bench, no manifest) it is still foreign
    (out / "results.csv").write_text(",".join(COLUMNS) + "\n")
    assert main([*BENCH, "--out", str(out)]) == 2
    assert str(out / "summary.md") in _error_line(capsys)
    assert (out / "summary.md").read_text() == "my notes\n"


def test_bench_stream_keeps_a_foreign_figure(tmp_path, capsys, no_long_work):
    out = tmp_path / "notes"
    out.mkdir()
    (out / "auroc_by_window_cifar10-svhn.png").write_bytes(b"mine")
    assert main([*STREAM, "--out", str(out)]) == 2
    assert "auroc_by_window_cifar10-svhn.png" in _error_line(capsys)
    assert (out / "auroc_by_window_cifar10-svhn.png").read_bytes() == b"mine"


@pytest.mark.parametrize("kind", ["fifo", "symlink"])
@pytest.mark.parametrize("name", ["results.csv", "summary.md"])
@pytest.mark.parametrize("stream", [False, True], ids=["grid", "stream"])
def test_bench_never_replaces_a_special_file(tmp_path, capsys, no_long_work, kind, name, stream):
    out = tmp_path / "run"
    out.mkdir()
    unchanged = _special(out / name, kind)
    assert main([*(STREAM if stream else BENCH), "--out", str(out)]) == 2
    line = _error_line(capsys)
    assert str(out / name) in line and ("FIFO" if kind == "fifo" else "symbolic link") in line
    assert unchanged()


@pytest.mark.parametrize("kind", ["fifo", "symlink"])
def test_overwrite_replaces_only_a_regular_file(tmp_path, table, model, capsys, kind):
    out = tmp_path / "scores.csv"
    unchanged = _special(out, kind)
    score = ["score", str(model), str(table), "--client-column", "site", "--out", str(out)]
    assert main([*score, "--overwrite"]) == 2
    line = _error_line(capsys)
    assert str(out) in line and ("FIFO" if kind == "fifo" else "symbolic link") in line
    assert unchanged()
    weights = tmp_path / "w.safetensors"
    weights.symlink_to(model)  # a link to a regular file is not replaced either
    assert main(["fit", str(table), *FIT, "--out", str(weights), "--overwrite"]) == 2
    assert "symbolic link" in _error_line(capsys)
    assert weights.is_symlink() and load(model).n_components_ == 1


def test_overwrite_refuses_a_special_file_that_appears_while_writing(tmp_path):
    path = tmp_path / "scores.csv"

    def write(temporary):
        Path(temporary).write_text("new\n")
        os.mkfifo(path)  # appears while the command runs

    with pytest.raises(UsageError, match="FIFO"):
        write_atomically(path, write, overwrite=True)
    assert stat.S_ISFIFO(os.lstat(path).st_mode)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["scores.csv"]


def test_bench_reruns_into_its_own_folder(tmp_path, capsys):
    out = tmp_path / "run"
    assert main([*BENCH, "--out", str(out)]) == 0
    first = pd.read_csv(out / "results.csv")
    manifest = json.loads((out / ".fednovelty-bench.json").read_text())
    assert sorted(manifest["files"]) == [
        "auroc_by_dataset_novelty.png",
        "results.csv",
        "summary.md",
    ]
    assert main([*BENCH, "--metric", "aupr_out", "--out", str(out)]) == 0  # resumed
    pd.testing.assert_frame_equal(pd.read_csv(out / "results.csv"), first)
    assert (out / "summary.md").read_text().startswith("# Benchmark summary: aupr_out")
    assert (out / "aupr_out_by_dataset_novelty.png").is_file()
    # a folder of an older bench (no manifest): its summary and figures are recognised
    (out / ".fednovelty-bench.json").unlink()
    assert main([*BENCH, "--out", str(out)]) == 0
    assert (out / "summary.md").read_text().startswith("# Benchmark summary: auroc")
    assert "summary.md" in json.loads((out / ".fednovelty-bench.json").read_text())["files"]
    capsys.readouterr()
