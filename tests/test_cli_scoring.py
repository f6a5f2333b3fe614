"""``fednovelty score --client-column``: each row under its client's own model where the
detector has one, the id and client columns beside the scores, a warning for a client with
no model of its own (scored with the global model)."""

import numpy as np
import pandas as pd
import pytest

from fednovelty import load
from fednovelty.cli import main


@pytest.fixture(scope="module")
def fitted(tmp_path_factory):
    """A table of 3 clients with different mixing of two blobs, and FedGMM and DEM models."""
    folder = tmp_path_factory.mktemp("scoring")
    rng = np.random.default_rng(0)
    parts = []
    for site, share in (("north", 0.9), ("south", 0.5), ("east", 0.1)):
        near = rng.random(200) < share
        X = np.where(near[:, None], rng.normal(0, 1, (200, 3)), rng.normal(5, 1, (200, 3)))
        part = pd.DataFrame(X, columns=["a", "b", "c"])
        part["site"] = site
        parts.append(part)
    frame = pd.concat(parts, ignore_index=True)
    frame.insert(0, "key", [f"r{i}" for i in range(len(frame))])
    data = folder / "train.csv"
    frame.drop(columns="key").to_csv(data, index=False)
    models = {}
    for method in ("FedGMM", "DEM-kmeans"):
        models[method] = out = folder / f"{method}.safetensors"
        assert main(["fit", str(data), "--client-column", "site", "--method", method,
                     "--components", "2", "--no-progress", "--out", str(out)]) == 0  # fmt: skip
    return folder, frame, models


def _score(folder, frame, model, name, *options):
    data = folder / f"{name}.csv"
    frame.to_csv(data, index=False)
    out = folder / f"{name}-scores.csv"
    assert main(["score", str(model), str(data), "--out", str(out), "--overwrite",
                 *options]) == 0  # fmt: skip
    return pd.read_csv(out)


def test_rows_are_scored_with_their_clients_personal_weights(fitted, capsys):
    folder, frame, models = fitted
    scores = _score(folder, frame.drop(columns="key"), models["FedGMM"], "personal",
                    "--client-column", "site")  # fmt: skip
    assert list(scores.columns) == ["row", "site", "log_px", "anomaly_score", "is_anomaly"]
    assert scores.row.tolist() == list(range(len(frame)))
    assert scores.site.tolist() == frame.site.tolist()
    detector = load(models["FedGMM"])
    X = frame[["a", "b", "c"]]
    for site in ("north", "south", "east"):
        rows = (frame.site == site).to_numpy()
        expected = detector.score_samples_client(X[rows], site)
        np.testing.assert_allclose(scores.log_px[rows], expected, rtol=1e-6)
    assert not np.allclose(scores.log_px, detector.score_samples(X))  # not the global score
    np.testing.assert_allclose(scores.anomaly_score, -scores.log_px)
    labels = (scores.anomaly_score > detector.threshold_).astype(int)
    assert (scores.is_anomaly == labels).all()
    assert "warning" not in capsys.readouterr().err


def test_an_id_column_is_written_first_and_not_scored(fitted):
    folder, frame, models = fitted
    scores = _score(folder, frame, models["FedGMM"], "ids", "--client-column", "site",
                    "--id-column", "key")  # fmt: skip
    assert list(scores.columns[:2]) == ["key", "site"]
    assert scores.key.tolist() == frame.key.tolist()


def test_an_unseen_client_warns_once_and_gets_the_global_score(fitted, capsys):
    folder, frame, models = fitted
    renamed = frame.drop(columns="key").copy()
    renamed.loc[:9, "site"] = "west"
    scores = _score(folder, renamed, models["FedGMM"], "unseen", "--client-column", "site")
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "warning" in err[0] and "'west'" in err[0] and "global" in err[0]
    detector = load(models["FedGMM"])
    X = renamed[["a", "b", "c"]]
    np.testing.assert_allclose(scores.log_px[:10], detector.score_samples(X[:10]), rtol=1e-6)


def test_a_global_only_detector_says_every_row_gets_the_global_model(fitted, capsys):
    folder, frame, models = fitted
    scores = _score(folder, frame.drop(columns="key"), models["DEM-kmeans"], "global",
                    "--client-column", "site")  # fmt: skip
    err = capsys.readouterr().err
    assert "one global model" in err
    detector = load(models["DEM-kmeans"])
    np.testing.assert_allclose(scores.log_px, detector.score_samples(frame[["a", "b", "c"]]))
