"""The benchmark's results file survives a run killed (or a disk filled) while a row is written:
a torn row is not a finished cell, the next resume drops it with a warning, runs that cell
again and leaves a well-formed file."""

from __future__ import annotations

import csv
import errno
import io
import warnings

import pandas as pd
import pytest

from fednovelty.evaluation import benchmark, results
from fednovelty.evaluation.benchmark import COLUMNS, METRICS, run_benchmark

METHODS = ["IForest", "HBOS", "COPOD"]
TINY = {"max_train": 150, "max_test": 150, "progress": False}


@pytest.fixture(scope="module")
def finished(tmp_path_factory):
    """A results file of three finished cells, and its text."""
    out = tmp_path_factory.mktemp("bench") / "results.csv"
    run_benchmark(["4_breastw"], METHODS, out_csv=out, **TINY)
    return out.read_text()


def _counting(monkeypatch) -> list[str]:
    """Record the method of every cell that runs."""
    real, ran = benchmark._run_cell, []

    def run(method, *args):
        ran.append(method.name)
        return real(method, *args)

    monkeypatch.setattr(benchmark, "_run_cell", run)
    return ran


def _assert_well_formed(path, n_rows: int) -> pd.DataFrame:
    text = path.read_text()
    assert text.endswith("\n")
    records = list(csv.reader(io.StringIO(text)))
    assert records[0] == list(COLUMNS)
    assert [len(r) for r in records] == [len(COLUMNS)] * (n_rows + 1)
    frame = pd.read_csv(path)
    assert len(frame) == n_rows and frame["error"].isna().all()
    assert frame[list(METRICS)].notna().all().all()
    return frame


def _resume(path, monkeypatch):
    """Resume the grid into ``path``: (results, methods run, warning messages)."""
    ran = _counting(monkeypatch)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        df = run_benchmark(["4_breastw"], METHODS, out_csv=path, **TINY)
    return df, ran, [str(w.message) for w in caught if w.category is RuntimeWarning]


@pytest.mark.parametrize("after_method", [True, False])
def test_a_torn_last_row_is_run_again(tmp_path, monkeypatch, finished, after_method):
    """A last line cut without its newline: after the method column (its metrics missing: the
    old reader counted it as finished) or before it (the old reader glued the next row on)."""
    lines = finished.splitlines(keepends=True)
    last = lines[-1]
    cut = last.index(",COPOD,") + (len(",COPOD,") + 3 if after_method else 0)
    torn = last[:cut]
    assert "\n" not in torn and ("COPOD" in torn) == after_method
    path = tmp_path / "results.csv"
    path.write_text("".join(lines[:-1]) + torn)
    df, ran, warned = _resume(path, monkeypatch)
    assert ran == ["COPOD"]
    assert df["method"].tolist() == METHODS and df[list(METRICS)].notna().all().all()
    frame = _assert_well_formed(path, 3)
    assert frame["method"].tolist() == METHODS
    assert len(warned) == 1 and "dropped 1 incomplete row(s) at line(s) [4]" in warned[0]
    _, ran, warned = _resume(path, monkeypatch)  # and the next resume is clean
    assert ran == [] and warned == []


def test_a_row_with_missing_columns_is_run_again(tmp_path, monkeypatch, finished):
    lines = finished.splitlines(keepends=True)
    fields = next(csv.reader([lines[2]]))
    short = ",".join(fields[: len(COLUMNS) - 5]) + "\n"  # whole line, too few fields
    path = tmp_path / "results.csv"
    path.write_text(lines[0] + lines[1] + short + lines[3])
    df, ran, warned = _resume(path, monkeypatch)
    assert ran == ["HBOS"]
    assert sorted(df["method"]) == sorted(METHODS)
    _assert_well_formed(path, 3)
    assert len(warned) == 1 and "line(s) [3]" in warned[0]


def test_a_torn_header_counts_nothing(tmp_path, monkeypatch):
    path = tmp_path / "results.csv"
    path.write_text(",".join(COLUMNS)[:20])
    _, ran, _ = _resume(path, monkeypatch)
    assert ran == METHODS
    _assert_well_formed(path, 3)


def test_a_write_that_fails_midway_leaves_a_row_the_next_run_redoes(tmp_path, monkeypatch):
    """The disk fills while the second cell's row is written: half of it reaches the file."""
    path = tmp_path / "results.csv"
    real_write, calls = results.os.write, []

    def full_disk(descriptor, data):
        calls.append(len(data))
        if len(calls) == 2:
            real_write(descriptor, bytes(data[: len(data) // 2]))
            raise OSError(errno.ENOSPC, "No space left on device")
        return real_write(descriptor, data)

    monkeypatch.setattr(results.os, "write", full_disk)
    with pytest.raises(OSError, match="No space left"):
        run_benchmark(["4_breastw"], METHODS, out_csv=path, **TINY)
    assert not path.read_text().endswith("\n")
    monkeypatch.setattr(results.os, "write", real_write)
    _, ran, warned = _resume(path, monkeypatch)
    assert ran == ["HBOS", "COPOD"]
    _assert_well_formed(path, 3)
    assert len(warned) == 1


def test_each_row_is_one_write(tmp_path, monkeypatch):
    """A whole row per ``os.write`` call: a crash can tear at most the row being written."""
    path = tmp_path / "results.csv"
    real_write, written = results.os.write, []

    def record(descriptor, data):
        written.append(bytes(data))
        return real_write(descriptor, data)

    monkeypatch.setattr(results.os, "write", record)
    run_benchmark(["4_breastw"], METHODS[:2], out_csv=path, **TINY)
    assert len(written) == 2 and all(chunk.endswith(b"\n") for chunk in written)
    assert written[0].count(b"\n") == 2  # the header and the first row together
