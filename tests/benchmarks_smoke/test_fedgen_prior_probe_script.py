"""``benchmarks/fedgen_prior_probe.py``: each variant changes what it says and nothing else."""

import numpy as np
import pandas as pd
import pytest

from fednovelty.detectors import FedGenGMMDetector
from fednovelty.federated.fedgengmm import FedGenState


@pytest.fixture
def probe(benchmark_script):
    return benchmark_script("fedgen_prior_probe")


@pytest.fixture
def clients():
    """Four clients of three well-separated clusters in 3-D (rows, groups)."""
    rng = np.random.default_rng(0)
    centres = np.array([[0.0, 0.0, 0.0], [6.0, 0.0, 0.0], [0.0, 6.0, 3.0]])
    X = np.concatenate([c + rng.normal(size=(120, 3)) for c in centres])
    return X, rng.integers(0, 4, size=len(X))


def test_default_is_the_library_detector(probe, clients):
    X, groups = clients
    variant = probe.detector(probe.VARIANTS["default"], copula=False, seed=3).fit(X, groups=groups)
    library = FedGenGMMDetector(n_components=10, random_state=3).fit(X, groups=groups)
    np.testing.assert_array_equal(variant.score_samples(X), library.score_samples(X))


def test_client_factor_scales_the_broadcast_prior(probe):
    algorithm = probe._Variant(prior_strength=12.0, prior_scale=4.0, client_factor=0.1)
    message = algorithm.configure(FedGenState())
    assert message.scalars["prior_strength"] == pytest.approx(1.2)
    assert algorithm.prior_strength == 12.0  # the server's own prior is left as it was


def test_ml_bic_clients_choose_the_k_of_maximum_likelihood(probe, clients):
    X, groups = clients
    ml = FedGenGMMDetector(n_components=3, covariance_prior=None, random_state=0)
    ml.fit(X, groups=groups)
    variant = probe.detector(probe.VARIANTS["client-ml-bic"], copula=False, seed=0)
    variant.set_params(n_components=3).fit(X, groups=groups)
    assert variant.client_n_components_ == ml.client_n_components_
    default = FedGenGMMDetector(n_components=3, random_state=0).fit(X, groups=groups)
    assert not np.allclose(variant.score_samples(X), default.score_samples(X))
    # what docs/robust.md says: under the default prior the clients' BIC picks fewer
    # components than the three clusters (maximum-likelihood BIC finds them)
    assert set(ml.client_n_components_.values()) == {3}
    assert max(default.client_n_components_.values()) < 3


def test_the_prior_target_not_the_client_k_merges_the_clusters(probe, clients):
    """docs/robust.md, Limits: clients that send K = 3 (maximum-likelihood BIC) still leave
    the server's BIC at 2 components under the default prior; without it, 3."""
    X, groups = clients
    variant = probe.detector(probe.VARIANTS["client-ml-bic"], copula=False, seed=0)
    variant.set_params(n_components=None).fit(X, groups=groups)
    assert set(variant.client_n_components_.values()) == {3}
    assert len(variant.weights_) == 2
    plain = FedGenGMMDetector(covariance_prior=None, random_state=0).fit(X, groups=groups)
    assert len(plain.weights_) == 3


def test_ml_bic_overfits_small_clients(probe):
    """One 8-D Gaussian, 40 rows per client: maximum-likelihood BIC rewards components that
    collapse onto a few rows (variance at ``reg_covar``) and picks K = 8-10; the MAP BIC
    (default) and the Fraley-Raftery prior pick K = 1 (docs/robust.md, Limits)."""
    rng = np.random.default_rng(1)
    X, groups = rng.normal(size=(160, 8)), np.repeat(np.arange(4), 40)
    chosen = {}
    for name in ["default", "client-ml-bic", "client-fr"]:
        detector = probe.detector(probe.VARIANTS[name], copula=False, seed=0)
        chosen[name] = set(
            detector.set_params(n_components=1).fit(X, groups=groups).client_n_components_.values()
        )
    assert min(chosen["client-ml-bic"]) >= 5
    assert chosen["default"] == chosen["client-fr"] == {1}


def test_fraley_raftery_variants(probe, clients):
    """Both variants choose K by the same criterion; only ``client-fr`` fits it with the
    K-scaled target, and the criterion differs from the default's on one client here."""
    X, groups = clients
    fitted = {}
    for name in ["default", "client-fr-select", "client-fr"]:
        detector = probe.detector(probe.VARIANTS[name], copula=False, seed=0)
        fitted[name] = detector.set_params(n_components=3).fit(X, groups=groups)
    select, shrunk = fitted["client-fr-select"], fitted["client-fr"]
    assert select.client_n_components_ == shrunk.client_n_components_
    assert select.client_n_components_ != fitted["default"].client_n_components_
    assert not np.allclose(shrunk.score_samples(X), select.score_samples(X))


@pytest.mark.parametrize("name", ["server-none", "server-evidence", "server-scale1"])
def test_server_variants_change_the_global_fit_only(probe, clients, name):
    X, groups = clients
    variant = probe.detector(probe.VARIANTS[name], copula=False, seed=0).fit(X, groups=groups)
    default = FedGenGMMDetector(n_components=10, random_state=0).fit(X, groups=groups)
    assert variant.client_n_components_ == default.client_n_components_
    assert not np.allclose(variant.score_samples(X), default.score_samples(X))


def test_one_real_run(probe, tmp_path, capsys):
    args = ["--datasets", "45_wine", "--seeds", "0", "--out", str(tmp_path)]
    probe.main([*args, "--variants", "default", "client-split", "--copula"])
    written = pd.read_csv(tmp_path / "fedgen_prior_probe_outlier_copula.csv")
    assert list(written["variant"]) == ["default", "client-split"]
    assert written["auroc"].between(0, 1).all()
    assert "mean AUROC over 1 datasets" in capsys.readouterr().out
