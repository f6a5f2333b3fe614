"""``FedVBDetector(posterior_merge=...)``: the one-shot fits beside the exact one."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pytest
import torch
from _saved_files import rewrite, with_flat_options, with_keys_renamed
from _tolerance import assert_close_scaled
from sklearn.base import clone
from sklearn.metrics import roc_auc_score

import fednovelty
from fednovelty import FedVBDetector
from fednovelty.detectors.options import Initialisation, Robustness

torch.set_num_threads(1)

#: the current names -> the names files were saved under before (aggregation was the
#: posterior rule, robust_aggregation the robust option)
OLD_NAMES = {
    "posterior_merge": "aggregation",
    "aggregation": "robust_aggregation",
    "density": "score",
}
CENTERS = np.array([[0.0, 0.0], [8.0, 0.0], [0.0, 8.0]])


def blobs(n_per: int = 150, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    X = np.vstack([c + rng.normal(size=(n_per, 2)) for c in CENTERS])
    order = rng.permutation(len(X))
    return X[order], rng.integers(0, 4, size=len(X))


@pytest.fixture(scope="module")
def data():
    return blobs()


@pytest.fixture(scope="module")
def fitted(data):
    X, groups = data
    return {
        how: FedVBDetector(n_components=8, posterior_merge=how, random_state=0).fit(
            X, groups=groups
        )
        for how in ("exact", "natural", "moment")
    }


def test_exact_is_the_default_and_unchanged(data, fitted):
    X, groups = data
    default = FedVBDetector(n_components=8, random_state=0).fit(X, groups=groups)
    assert default.posterior_merge == "exact"
    assert_close_scaled(default.decision_scores_, fitted["exact"].decision_scores_, rtol=1e-12)
    assert default.history_[-1]["kind"] == "vb" and len(default.lower_bounds_) > 0


@pytest.mark.parametrize("how", ["natural", "moment"])
def test_one_shot_finds_the_blobs_in_three_rounds(fitted, how):
    det = fitted[how]
    assert det.effective_n_components_ == 3
    assert [r["kind"] for r in det.history_] == ["moments", "vb_prior", "vb_local"]
    assert det.n_rounds_ == 3 and det.lower_bounds_ == [] and det.n_iter_ >= 1
    assert bool(det.decision_function([[4.0, 20.0]])[0] > det.threshold_)
    order = np.argsort(-det.weights_)[:3]
    found = sorted(map(tuple, np.round(det.means_[order])))
    assert found == sorted(map(tuple, CENTERS))


@pytest.mark.parametrize("how", ["natural", "moment"])
def test_one_shot_auroc_is_close_to_exact(data, fitted, how):
    rng = np.random.default_rng(7)
    inliers, _ = blobs(100, seed=3)
    outliers = rng.uniform(-6, 14, size=(100, 2))
    far = np.min(np.linalg.norm(outliers[:, None] - CENTERS[None], axis=2), axis=1) > 3
    X_test = np.vstack([inliers, outliers[far]])
    y_test = np.r_[np.zeros(len(inliers)), np.ones(int(far.sum()))]
    exact = roc_auc_score(y_test, fitted["exact"].decision_function(X_test))
    one_shot = roc_auc_score(y_test, fitted[how].decision_function(X_test))
    assert one_shot >= exact - 0.01, (one_shot, exact)


@pytest.mark.parametrize("how", ["natural", "moment"])
def test_save_load_keeps_the_one_shot_posterior(tmp_path, data, fitted, how):
    X, _ = data
    det = fitted[how]
    path = tmp_path / f"{how}.safetensors"
    det.save(path)
    back = fednovelty.load(path)
    assert back.posterior_merge == how
    # scores are recomputed from the loaded (copied) posterior
    assert_close_scaled(back.score_samples(X), det.score_samples(X), rtol=1e-12)
    for name in ("weight_concentration", "means", "covariances"):
        assert torch.equal(getattr(back.posterior_, name), getattr(det.posterior_, name))


def test_files_saved_under_the_old_names_load(tmp_path, data):
    X, groups = data
    det = FedVBDetector(
        4,
        posterior_merge="natural",
        random_state=0,
        robustness=Robustness(aggregation="trimmed", trim=0.2),
    ).fit(X, groups=groups)
    new, old = tmp_path / "new.safetensors", tmp_path / "old.safetensors"
    det.save(new)
    det.save(old)
    # as files were written when aggregation named the posterior rule
    rewrite(old, lambda text: with_keys_renamed(with_flat_options(text), OLD_NAMES))
    for path in (new, old):  # a file with the current names is not renamed
        back = fednovelty.load(path)
        robust = back.robustness
        assert (back.posterior_merge, robust.aggregation, robust.trim) == (
            "natural",
            "trimmed",
            0.2,
        )
        assert_close_scaled(back.score_samples(X), det.score_samples(X), rtol=1e-12)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"posterior_merge": "mean"}, "posterior_merge"),
        ({"match_threshold": 0.0}, "match_threshold"),
        ({"posterior_merge": "moment", "covariance_type": "tied"}, "tied"),
        ({"posterior_merge": "natural", "init_params": "separated"}, "init_params='kmeans'"),
        (
            {
                "posterior_merge": "natural",
                "initialisation": Initialisation(means_init=[[0.0, 0.0], [8.0, 0.0]]),
            },
            "means_init",
        ),
    ],
)
def test_invalid_settings_are_named(data, kwargs, message):
    X, groups = data
    with pytest.raises(ValueError, match=message):
        FedVBDetector(n_components=2, **kwargs).fit(X, groups=groups)


def test_clone_keeps_the_posterior_merge():
    det = FedVBDetector(posterior_merge="natural", match_threshold=0.2)
    copy = clone(det)
    assert copy.posterior_merge == "natural" and copy.match_threshold == 0.2
    assert not hasattr(copy, "posterior_")


def test_one_shot_diag_and_spherical(data):
    X, groups = data
    for covariance_type in ("diag", "spherical"):
        det = FedVBDetector(
            n_components=6,
            covariance_type=covariance_type,
            posterior_merge="moment",
            random_state=0,
        ).fit(X, groups=groups)
        assert det.effective_n_components_ == 3
        assert np.isfinite(det.decision_scores_).all()


def test_docs_one_shot_example_runs(capsys):
    """docs/variational.md, section "One-shot aggregation": its example prints what the
    page shows."""
    text = (Path(__file__).resolve().parents[2] / "docs" / "variational.md").read_text()
    section = text[text.index("## One-shot aggregation") :]
    block, shown = re.findall(r"```(?:python)?\n(.*?)```", section, flags=re.S)[:2]
    exec(compile(block, "docs/variational.md", "exec"), {})
    assert capsys.readouterr().out.strip().splitlines() == shown.strip().splitlines()
