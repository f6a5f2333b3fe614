"""``fednovelty score`` reads, scores and writes its input chunk by chunk
(``fednovelty._cli.score_stream``): chunks that do not divide the rows write the file one
chunk writes (personal scores, unseen clients warned once, conformal p-values and
Benjamini-Hochberg discoveries over the whole file), and .parquet and .npy inputs score as
the CSV does."""

import numpy as np
import pandas as pd
import pytest

from fednovelty import load
from fednovelty.cli import main


@pytest.fixture(scope="module")
def fitted(tmp_path_factory):
    """Three clients' rows, a FedGMM model (personal weights) and a conformal DEM model, and
    a table to score with a client the models never saw."""
    folder = tmp_path_factory.mktemp("stream")
    rng = np.random.default_rng(0)
    parts = []
    for site, share in (("north", 0.9), ("south", 0.5), ("east", 0.1)):
        near = rng.random(150) < share
        X = np.where(near[:, None], rng.normal(0, 1, (150, 3)), rng.normal(5, 1, (150, 3)))
        part = pd.DataFrame(X, columns=["a", "b", "c"])
        part["site"] = site
        parts.append(part)
    train = folder / "train.csv"
    pd.concat(parts, ignore_index=True).to_csv(train, index=False)
    models = {}
    for method, extra in (("FedGMM", []), ("DEM-kmeans", ["--alpha", "0.1"])):
        models[method] = out = folder / f"{method}.safetensors"
        command = ["fit", str(train), "--client-column", "site", "--method", method]
        command += ["--components", "2", "--no-progress", "--out", str(out), *extra]
        assert main(command) == 0
    new = pd.DataFrame(rng.normal(2, 3, (503, 3)), columns=["a", "b", "c"])
    new["site"] = np.array(["north", "south", "west", "east"])[np.arange(503) % 4]
    return folder, new, models


def _score(folder, model, data, name, *options):
    out = folder / f"{name}.csv"
    assert main(["score", str(model), str(data), "--out", str(out), "--overwrite", *options]) == 0
    return out.read_text()


@pytest.mark.parametrize(
    ("method", "options"),
    [
        ("FedGMM", ["--client-column", "site"]),
        ("DEM-kmeans", ["--client-column", "site", "--fdr", "0.2"]),
    ],
)
def test_chunks_write_the_file_one_chunk_writes(fitted, capsys, method, options):
    folder, new, models = fitted
    data = folder / "new.csv"
    new.to_csv(data, index=False)
    whole = _score(folder, models[method], data, "whole", *options)
    warned = capsys.readouterr().err
    chunked = _score(folder, models[method], data, "chunked", "--chunk-rows", "97", *options)
    assert chunked == whole
    assert capsys.readouterr().err == warned
    if method == "FedGMM":  # 'west' was not in training: one warning for all its chunks
        assert warned.count("warning") == 1 and "'west'" in warned
    else:
        assert "discovery" in whole.splitlines()[0] and "p_value" in whole.splitlines()[0]


def test_parquet_and_npy_inputs_score_as_the_csv(fitted):
    folder, new, models = fitted
    features = new[["a", "b", "c"]]
    features.to_csv(folder / "f.csv", index=False)
    features.to_parquet(folder / "f.parquet", row_group_size=100)
    np.save(folder / "f.npy", features.to_numpy())
    expected = pd.read_csv(
        pd.io.common.StringIO(_score(folder, models["FedGMM"], folder / "f.csv", "c"))
    )
    for suffix in ("parquet", "npy"):
        text = _score(
            folder, models["FedGMM"], folder / f"f.{suffix}", suffix, "--chunk-rows", "61"
        )
        got = pd.read_csv(pd.io.common.StringIO(text))
        pd.testing.assert_frame_equal(got, expected)
    detector = load(models["FedGMM"])
    np.testing.assert_allclose(expected.log_px, detector.score_samples(features), rtol=1e-12)


def test_a_npy_file_has_no_named_columns(fitted, capsys):
    folder, new, models = fitted
    np.save(folder / "g.npy", new[["a", "b", "c"]].to_numpy())
    out = folder / "g-scores.csv"
    args = ["score", str(models["FedGMM"]), str(folder / "g.npy"), "--out", str(out)]
    assert main([*args, "--client-column", "site"]) == 2
    assert "a .npy file has no named columns" in capsys.readouterr().err
    assert not out.exists()
