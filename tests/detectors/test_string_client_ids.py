"""Client ids that are names ("paris", "lyon"), as a CSV's site column gives them, work for
every detector through fit, per-client scoring, save and load, and the README's CLI recipe."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from fednovelty import FedGenGMMDetector, FedGMMDetector, LocalGMMDetector, load
from fednovelty.cli import main

SITES = ["paris", "lyon", "nice"]
DETECTORS = {
    "FedGMM": lambda: FedGMMDetector(n_components=2, random_state=0),
    "FedGenGMM": lambda: FedGenGMMDetector(k_range=(1, 2), random_state=0),
    "FedGenGMM-copula": lambda: FedGenGMMDetector(k_range=(1, 2), copula=True, random_state=0),
    "Local": lambda: LocalGMMDetector(k_range=(1, 2), random_state=0),
}


def _frame(n_per_site: int = 40) -> pd.DataFrame:
    rng = np.random.default_rng(0)
    frame = pd.DataFrame(rng.normal(0, 1, (n_per_site * len(SITES), 2)), columns=["a", "b"])
    frame["site"] = np.repeat(SITES, n_per_site)  # pandas: an object column of str
    return frame


@pytest.mark.parametrize("name", list(DETECTORS))
def test_named_clients_fit_score_save_and_load(tmp_path, name):
    frame = _frame()
    groups = frame.pop("site").to_numpy()
    assert groups.dtype == object
    detector = DETECTORS[name]().fit(frame, groups=groups)
    assert detector.client_ids_.tolist() == sorted(SITES)
    if hasattr(detector, "client_n_components_"):
        assert sorted(detector.client_n_components_) == sorted(SITES)
    path = tmp_path / "model.safetensors"
    detector.save(path)
    loaded = load(path)
    assert loaded.client_ids_.tolist() == sorted(SITES)
    assert getattr(loaded, "client_n_components_", None) == getattr(
        detector, "client_n_components_", None
    )
    scores = detector.score_samples(frame)
    assert np.isfinite(scores).all()
    np.testing.assert_allclose(loaded.score_samples(frame), scores, rtol=1e-12)
    if hasattr(detector, "score_samples_client"):
        for site in SITES:
            own = detector.score_samples_client(frame, site)
            assert np.isfinite(own).all()
            np.testing.assert_allclose(loaded.score_samples_client(frame, site), own, rtol=1e-12)
        with pytest.raises(ValueError, match="'rome' was not seen in fit"):
            detector.score_samples_client(frame, "rome")


def test_local_scores_each_named_client_with_its_own_model():
    frame = _frame()
    groups = frame.pop("site").to_numpy()
    frame.loc[groups == "lyon", ["a", "b"]] += 8.0  # lyon lives elsewhere
    detector = LocalGMMDetector(k_range=(1, 2), random_state=0).fit(frame, groups=groups)
    lyon_rows = frame[groups == "lyon"]
    assert (
        detector.score_samples_client(lyon_rows, "lyon").mean()
        > detector.score_samples_client(lyon_rows, "paris").mean() + 10
    )


@pytest.mark.parametrize("cls", [FedGenGMMDetector, LocalGMMDetector])
def test_a_skipped_named_client_is_named(cls):
    frame = _frame()
    groups = frame.pop("site").to_numpy()
    frame.loc[len(frame)] = [0.5, 0.5]
    groups = np.append(groups, "tiny")
    with pytest.warns(UserWarning, match="'tiny'"):
        detector = cls(k_range=(1, 2), random_state=0).fit(frame, groups=groups)
    assert detector.skipped_clients_ == ["tiny"]
    assert sorted(detector.client_n_components_) == sorted(SITES)
    if cls is LocalGMMDetector:
        with pytest.raises(ValueError, match="'tiny' was skipped"):
            detector.score_samples_client(frame, "tiny")


@pytest.mark.parametrize("method", ["FedGMM", "FedGenGMM", "Local"])
def test_the_readme_cli_recipe_with_named_sites(tmp_path, method):
    data = tmp_path / "train.csv"
    _frame().to_csv(data, index=False)
    model, scores = tmp_path / "model.safetensors", tmp_path / "scores.csv"
    fit = ["fit", str(data), "--client-column", "site", "--method", method]
    assert main([*fit, "--components", "2", "--out", str(model)]) == 0
    assert load(model).client_ids_.tolist() == sorted(SITES)
    score = ["score", str(model), str(data), "--client-column", "site", "--out", str(scores)]
    assert main(score) == 0
    out = pd.read_csv(scores)
    assert len(out) == 3 * 40 and np.isfinite(out.log_px).all()
