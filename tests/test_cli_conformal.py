"""``fednovelty fit --alpha`` and ``fednovelty score`` on a conformal model: a p-value per row,
alarms by each row's client's threshold, Benjamini-Hochberg discoveries with ``--fdr``."""

import numpy as np
import pandas as pd
import pytest

from fednovelty import load
from fednovelty.cli import main


@pytest.fixture(scope="module")
def fitted(tmp_path_factory):
    """3 sites of 400 rows mixing two blobs differently; FedGMM fitted with --alpha 0.05."""
    folder = tmp_path_factory.mktemp("conformal")
    rng = np.random.default_rng(1)
    parts = []
    for site, share in (("north", 0.9), ("south", 0.5), ("east", 0.1)):
        near = rng.random(400) < share
        X = np.where(near[:, None], rng.normal(0, 1, (400, 2)), rng.normal(4, 1, (400, 2)))
        part = pd.DataFrame(X, columns=["a", "b"])
        part["site"] = site
        parts.append(part)
    frame = pd.concat(parts, ignore_index=True)
    data = folder / "train.csv"
    frame.to_csv(data, index=False)
    model = folder / "model.safetensors"
    assert main(["fit", str(data), "--client-column", "site", "--method", "FedGMM",
                 "--components", "2", "--alpha", "0.05", "--no-progress",
                 "--out", str(model)]) == 0  # fmt: skip
    return folder, frame, model


def _score(folder, frame, model, *options):
    data = folder / "new.csv"
    frame.to_csv(data, index=False)
    out = folder / "scores.csv"
    assert main(["score", str(model), str(data), "--out", str(out), "--overwrite",
                 *options]) == 0  # fmt: skip
    return pd.read_csv(out)


def _bh(p: np.ndarray, q: float) -> np.ndarray:
    """Benjamini-Hochberg by its definition: reject the k smallest, k the largest rank with
    p_(k) <= k q / m."""
    order = np.argsort(p)
    m = p.size
    below = np.flatnonzero(p[order] <= q * np.arange(1, m + 1) / m)
    out = np.zeros(m, dtype=int)
    if below.size:
        out[order[: below[-1] + 1]] = 1
    return out


def test_fit_with_alpha_gives_a_conformal_model(fitted):
    _, _, model = fitted
    detector = load(model)
    assert detector.calibration == "conformal" and detector.alpha == 0.05
    assert set(detector.client_thresholds_) == {"north", "south", "east"}


def test_score_writes_p_values_alarms_by_client_and_discoveries(fitted):
    folder, _, model = fitted
    rng = np.random.default_rng(7)
    new = pd.DataFrame(rng.normal(2, 3, (150, 2)), columns=["a", "b"])
    new["site"] = np.repeat(["north", "south", "east"], 50)
    new.loc[::10, ["a", "b"]] = 12.0  # planted novelties, far from both blobs
    scores = _score(folder, new, model, "--client-column", "site", "--fdr", "0.1")
    assert {"p_value", "is_anomaly", "discovery"} <= set(scores.columns)
    detector = load(model)
    X = new[["a", "b"]]
    for site in ("north", "south", "east"):
        rows = (new.site == site).to_numpy()
        threshold = detector.client_thresholds_[site]
        own = -detector.score_samples_client(X[rows], site)  # the site's own scores
        assert (scores.is_anomaly[rows] == (own > threshold).astype(int)).all()
        assert ((scores.p_value[rows] > 0) & (scores.p_value[rows] <= 1)).all()
    assert (scores.discovery == _bh(scores.p_value.to_numpy(), 0.1)).all()
    assert scores.discovery[::10].all()  # every planted novelty is a discovery
    assert scores.p_value[::10].max() < 0.05


def test_a_row_of_an_unknown_client_takes_the_federation_threshold(fitted):
    folder, frame, model = fitted
    new = frame[["a", "b"]].iloc[:40].copy()
    new["site"] = "west"
    scores = _score(folder, new, model, "--client-column", "site")
    detector = load(model)
    expected = (detector.decision_function(new[["a", "b"]]) > detector.threshold_).astype(int)
    assert (scores.is_anomaly == expected).all()


def test_fdr_needs_a_conformal_model(tmp_path, fitted, capsys):
    _, frame, _ = fitted
    data = tmp_path / "train.csv"
    frame.drop(columns="site").to_csv(data, index=False)
    plain = tmp_path / "plain.safetensors"
    assert main(["fit", str(data), "--method", "DEM-kmeans", "--components", "2",
                 "--no-progress", "--out", str(plain)]) == 0  # fmt: skip
    assert main(["score", str(plain), str(data), "--out", str(tmp_path / "s.csv"),
                 "--fdr", "0.1"]) == 2  # fmt: skip
    assert "--fdr needs conformal p-values" in capsys.readouterr().err
    assert not (tmp_path / "s.csv").exists()
