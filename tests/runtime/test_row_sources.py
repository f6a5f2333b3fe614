"""Row sources (fednovelty.runtime.rows): what they yield, what they refuse, the memory a
pass over a memory map holds, and federated EM on clients whose rows are sources against the
same clients' tensors."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch
from _tolerance import assert_close_scaled

from fednovelty.exceptions import ClientDataError
from fednovelty.federated import FederatedEM
from fednovelty.runtime import run_simulation
from fednovelty.runtime.rows import (
    ArrayRows,
    ChunkedRows,
    EmptyChunkWarning,
    ParquetRows,
    SelectedRows,
    row_source,
)


def rows(n: int = 1003, d: int = 3, seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    centres = rng.normal(0, 5, (3, d))
    return centres[rng.integers(0, 3, n)] + rng.normal(0, 1, (n, d))


def gathered(source, size=None) -> np.ndarray:
    parts = list(source.chunks(size))
    assert all(1 <= len(p) <= min(size or source.chunk_rows, source.chunk_rows) for p in parts)
    return torch.cat(parts).numpy()


def test_array_rows_yield_the_rows_in_chunks_of_at_most_chunk_rows(tmp_path):
    X = rows()
    np.save(tmp_path / "x.npy", X)
    source = row_source(tmp_path / "x.npy", chunk_rows=100)
    assert isinstance(source, ArrayRows) and isinstance(source.array, np.memmap)
    assert source.shape == (1003, 3) and len(source) == 1003 and source.ndim == 2
    np.testing.assert_array_equal(gathered(source), X)
    np.testing.assert_array_equal(gathered(source, 7), X)  # smaller than chunk_rows
    np.testing.assert_array_equal(gathered(source, 10_000), X)  # never above chunk_rows
    assert [len(c) for c in source.chunks()][-1] == 3  # 1003 = 10 x 100 + 3
    np.testing.assert_array_equal(
        source.rows_at(torch.tensor([5, 0, 1002])).numpy(), X[[5, 0, 1002]]
    )
    single = source.astype(torch.float32)
    assert next(single.chunks()).dtype == torch.float32 and source.dtype == torch.float64


def _rss_file_kib() -> int:
    status = Path("/proc/self/status").read_text()
    return int(re.search(r"RssFile:\s+(\d+) kB", status).group(1))


def test_a_pass_over_a_memory_map_hands_its_pages_back(tmp_path):
    """Reading a 48 MiB memory map by slices maps every page into the process (the
    control); ArrayRows' pass leaves at most a few chunks' pages resident."""
    path = tmp_path / "big.npy"
    big = np.lib.format.open_memmap(path, mode="w+", dtype=np.float64, shape=(1_500_000, 4))
    big[:] = 1.0
    big.flush()
    del big
    control = np.load(path, mmap_mode="r")
    before = _rss_file_kib()
    total = sum(float(np.array(control[s : s + 65_536]).sum()) for s in range(0, 1_500_000, 65_536))
    grown = _rss_file_kib() - before
    assert total == 6_000_000 and grown > 40_000  # the control: ~48 MiB resident
    del control
    source = ArrayRows(np.load(path, mmap_mode="r"), chunk_rows=65_536)
    before = _rss_file_kib()
    total = sum(float(chunk.sum()) for chunk in source.chunks())
    assert total == 6_000_000 and _rss_file_kib() - before < 8_000


def test_parquet_rows_read_numeric_columns_by_batches(tmp_path):
    X = rows(1003)
    frame = pd.DataFrame(X, columns=["a", "b", "c"])
    frame["site"] = "x"
    frame.loc[4, "b"] = None
    path = tmp_path / "x.parquet"
    frame.to_parquet(path, row_group_size=250)
    with pytest.raises(ValueError, match=r"column 'site' holds .*string, not numbers"):
        ParquetRows(path)
    with pytest.raises(ValueError, match="no column 'z'"):
        ParquetRows(path, columns=["a", "z"])
    source = row_source(path, columns=["a", "b", "c"], chunk_rows=97)
    assert source.columns == ["a", "b", "c"] and source.shape == (1003, 3)
    got = gathered(source)
    expected = X.copy()
    expected[4, 1] = np.nan  # a missing value reads as NaN
    np.testing.assert_array_equal(got, expected)


def test_chunked_rows_count_split_and_skip_empty_chunks():
    X = rows(50)
    parts = [X[:1], X[1:1], X[1:40], torch.as_tensor(X[40:])]
    with pytest.warns(EmptyChunkWarning, match=r"1 chunk\(s\) .* \[1\]"):
        source = ChunkedRows(lambda: iter(parts), chunk_rows=16)
    assert source.shape == (50, 3)
    sizes = [len(c) for c in source.chunks()]
    assert sizes == [1, 16, 16, 7, 10]  # the 39-row chunk split at 16 rows
    np.testing.assert_array_equal(gathered(source), X)


def test_chunked_rows_refuse_what_cannot_be_read_again_or_is_inconsistent():
    X = rows(20)
    with pytest.raises(TypeError, match="read once"):
        ChunkedRows(iter([X]))
    with pytest.raises(TypeError, match="function returning"):
        ChunkedRows(3)
    with pytest.raises(ValueError, match="chunk 1 has 2 columns"):
        ChunkedRows([X, X[:, :2]])
    with pytest.raises(ValueError, match="chunk 0 has shape"):
        ChunkedRows([X[0]])
    with pytest.raises(ValueError, match="no chunk with rows"):
        ChunkedRows([X[:0]])
    calls = []

    def shrinking():
        calls.append(1)
        return [X] if len(calls) == 1 else [X[:10]]

    source = ChunkedRows(shrinking)
    with pytest.raises(ValueError, match="20 rows on the first pass and 10"):
        list(source.chunks())


def test_selected_rows_are_one_clients_rows_in_order():
    X = rows(100)
    codes = np.arange(100) % 3
    source = SelectedRows(ArrayRows(X, chunk_rows=7), codes, 1)
    assert source.shape == (33, 3)
    np.testing.assert_array_equal(gathered(source), X[codes == 1])
    np.testing.assert_array_equal(
        source.rows_at(torch.tensor([0, 32])).numpy(), X[codes == 1][[0, 32]]
    )


def test_row_source_says_what_it_reads(tmp_path):
    (tmp_path / "x.csv").write_text("a\n1\n")
    with pytest.raises(ValueError, match=r"\.npy or \.parquet"):
        row_source(tmp_path / "x.csv")
    with pytest.raises(ValueError, match="no such file"):
        row_source(tmp_path / "none.npy")
    with pytest.raises(TypeError, match="cannot read rows from int"):
        row_source(3)
    assert isinstance(row_source([rows(5), rows(4)]), ChunkedRows)
    assert isinstance(row_source(rows(5)), ArrayRows)


def _fit(clients, **settings):
    algorithm = FederatedEM(3, standardize=True, max_iter=8, random_state=0, **settings)
    return run_simulation(algorithm, clients, random_state=0).state


@pytest.mark.parametrize("covariance_type", ["full", "tied", "diag", "spherical"])
@pytest.mark.parametrize("weights", ["global", "personal"])
def test_federated_em_on_row_sources_matches_tensors(covariance_type, weights):
    """Moments, k-FED centroids, Lloyd and EM rounds (the detectors' default chain) with
    the privacy floor's per-row log-likelihoods: the same mixture from sources whose chunks
    do not divide the rows as from tensors."""
    X = rows(1003)
    parts = [X[:600], X[600:]]
    settings = {"covariance_type": covariance_type, "mixture_weights": weights}
    expected = _fit([torch.as_tensor(p) for p in parts], **settings)
    clients = [
        ArrayRows(parts[0], chunk_rows=97),
        ChunkedRows([parts[1][:5], parts[1][5:]], chunk_rows=64),
    ]
    got = _fit(clients, **settings)
    assert got.n_iter == expected.n_iter
    for name in ("weights", "means", "precisions_cholesky"):
        assert_close_scaled(getattr(got.params, name), getattr(expected.params, name), 1e-10)
    assert_close_scaled(got.lower_bounds, expected.lower_bounds, rtol=1e-10)


def test_a_step_that_reads_rows_in_memory_refuses_a_source_by_name():
    source = ArrayRows(rows(100))
    with pytest.raises(TypeError, match=r"RangeStep \('range' rounds\).*Steps that stream: "):
        _fit([source], init_params="separated")


def test_the_engine_checks_a_source_chunk_by_chunk():
    X = rows(100)
    X[57, 2] = np.inf
    with pytest.raises(ClientDataError, match="client 0: row 57 of its row source"):
        _fit([ArrayRows(X, chunk_rows=10)])
