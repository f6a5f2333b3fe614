"""The FedGMM paper's algorithm as written, one setting away from the exact M-step.

References, computed here in numpy from the paper's equations: Algorithm 2, line 8 (each
client's responsibilities, count ``gamma_ck``, mean ``mu_ck`` and covariance ``Sigma_ck``
about its own mean) and line 13 (the server's ``gamma``-weighted average of the client
covariances); footnote 3 (the global weights ``pi = sum_c gamma_c / N_c``, normalised: the
mean of the clients' weights). The E-step densities come from SciPy.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from _tolerance import assert_close_scaled
from scipy.stats import multivariate_normal

from fednovelty.detectors import FedGMMDetector, JointFedGMMDetector
from fednovelty.detectors.options import Privacy
from fednovelty.federated import EMConfig, FederatedEM, PrivacyPolicy
from fednovelty.federated.joint_models.joint import JointFedGMM, global_log_joint_weights
from fednovelty.runtime import run_simulation

NO_FLOOR = PrivacyPolicy(min_rows=1)
REG = 1e-6
MEANS = np.array([[0.0, 0.0, 0.0], [3.0, 1.0, -1.0]])
COVARIANCES = np.array(
    [[[1.0, 0.3, 0.0], [0.3, 1.5, 0.2], [0.0, 0.2, 0.8]], np.diag([0.7, 1.2, 2.0])]
)
WEIGHTS = np.array([0.6, 0.4])


def federation(sizes=(25, 40, 13), seed: int = 0) -> list[np.ndarray]:
    """Three clients of unequal sizes, each its own mixture of two shifted blobs, so that the
    client means of a component differ from one another (the paper's pooling then differs
    from the exact one)."""
    rng = np.random.default_rng(seed)
    clients = []
    for c, n in enumerate(sizes):
        near = rng.random(n) < (0.2 + 0.3 * c)
        rows = rng.normal(size=(n, 3)) + np.where(near[:, None], MEANS[1], MEANS[0])
        clients.append(rows + 0.5 * c)
    return clients


def start(covariance_type: str) -> tuple[dict, np.ndarray]:
    """The initial mixture as ``FederatedEM`` settings (scikit-learn's precision layout) and
    as full covariances (2, 3, 3) for SciPy."""
    if covariance_type == "full":
        covs = COVARIANCES
        precisions = np.linalg.inv(COVARIANCES)
    elif covariance_type == "tied":
        covs = np.stack([COVARIANCES[0]] * 2)
        precisions = np.linalg.inv(COVARIANCES[0])
    elif covariance_type == "diag":
        variances = np.stack([np.diag(c) for c in COVARIANCES])
        covs = np.stack([np.diag(v) for v in variances])
        precisions = 1.0 / variances
    else:
        variances = np.array([1.1, 0.9])
        covs = np.stack([v * np.eye(3) for v in variances])
        precisions = 1.0 / variances
    init = {"weights_init": WEIGHTS, "means_init": MEANS, "precisions_init": precisions}
    return init, covs


def responsibilities(X: np.ndarray, weights: np.ndarray, covs: np.ndarray) -> np.ndarray:
    """Algorithm 2, line 6: ``q(m) ∝ pi(m) N(x; mu_m, Sigma_m)``, (n, K)."""
    dens = np.stack(
        [
            w * multivariate_normal(m, c).pdf(X)
            for w, m, c in zip(weights, MEANS, covs, strict=True)
        ],
        axis=1,
    )
    return dens / dens.sum(1, keepdims=True)


def paper_round(clients: list[np.ndarray], covs: np.ndarray, covariance_type: str):
    """One round of Algorithm 2 by hand: per client ``gamma_ck``, ``mu_ck``, ``Sigma_ck``
    (line 8); the server's ``gamma``-weighted means and covariances (line 13), the latter
    reduced to the covariance type (``tied``: the within-client scatter of all components
    over all rows; ``diag``: the diagonal; ``spherical``: the mean diagonal)."""
    gammas, client_means, client_covs = [], [], []
    for X in clients:
        q = responsibilities(X, WEIGHTS, covs)
        gamma = q.sum(0)
        mu = (q.T @ X) / gamma[:, None]
        sigma = np.stack(
            [(q[:, k, None] * (X - mu[k])).T @ (X - mu[k]) / gamma[k] for k in range(2)]
        )
        gammas.append(gamma), client_means.append(mu), client_covs.append(sigma)
    gammas, client_means, client_covs = map(np.stack, (gammas, client_means, client_covs))
    total = gammas.sum(0)
    means = (gammas[:, :, None] * client_means).sum(0) / total[:, None]
    full = (gammas[:, :, None, None] * client_covs).sum(0) / total[:, None, None]
    eye = np.eye(3)
    if covariance_type == "full":
        expected = full + REG * eye
    elif covariance_type == "tied":
        expected = (total[:, None, None] * full).sum(0) / total.sum() + REG * eye
    elif covariance_type == "diag":
        expected = np.stack([np.diag(f) for f in full]) + REG
    else:
        expected = np.array([np.trace(f) / 3 for f in full]) + REG
    return gammas, client_means, means, expected


def run_one_round(clients, covariance_type: str, **settings):
    init, _ = start(covariance_type)
    algorithm = FederatedEM(2, covariance_type=covariance_type, max_iter=1, **init, **settings)
    tensors = [torch.as_tensor(X) for X in clients]
    return run_simulation(algorithm, tensors, privacy=NO_FLOOR).state


@pytest.mark.parametrize("covariance_type", ["full", "tied", "diag", "spherical"])
@pytest.mark.parametrize("mixture_weights", ["global", "personal"])
def test_paper_pooling_is_the_gamma_weighted_average_of_client_covariances(
    covariance_type, mixture_weights
):
    clients = federation()
    _, covs = start(covariance_type)
    gammas, _, means, expected = paper_round(clients, covs, covariance_type)
    state = run_one_round(
        clients, covariance_type, covariance_pooling="paper", mixture_weights=mixture_weights
    )
    assert_close_scaled(state.params.means, means, rtol=1e-10)
    assert_close_scaled(state.params.covariances, expected, rtol=1e-10)
    assert_close_scaled(state.params.weights, gammas.sum(0) / gammas.sum(), rtol=1e-10)


def test_paper_pooling_leaves_out_the_spread_of_client_means():
    """The exact M-step's covariance is the paper's plus the between-client scatter
    ``sum_c gamma_ck (mu_ck - mu_k)(mu_ck - mu_k)^T / gamma_k`` (law of total variance),
    which is not small on this federation."""
    clients = federation()
    _, covs = start("full")
    gammas, client_means, means, paper = paper_round(clients, covs, "full")
    offsets = client_means - means[None]
    between = np.einsum("ck,cki,ckj->kij", gammas, offsets, offsets) / gammas.sum(0)[:, None, None]
    exact = run_one_round(clients, "full").params.covariances
    assert_close_scaled(exact, paper + between, rtol=1e-10)
    assert np.abs(between).max() > 0.05


def test_client_average_weights_are_the_mean_of_the_clients_weights():
    clients = federation(sizes=(10, 60, 25))
    _, covs = start("full")
    client_weights = [responsibilities(X, WEIGHTS, covs).mean(0) for X in clients]
    state = run_one_round(
        clients, "full", mixture_weights="personal", global_weights="client_average"
    )
    for c, weights in enumerate(client_weights):
        assert_close_scaled(state.client_weights[c], weights, rtol=1e-10)
    expected = np.mean(client_weights, axis=0)
    assert_close_scaled(state.params.weights, expected, rtol=1e-10)
    pooled = run_one_round(clients, "full", mixture_weights="personal").params.weights
    rows = np.concatenate(clients)
    assert_close_scaled(pooled, responsibilities(rows, WEIGHTS, covs).mean(0), rtol=1e-10)
    assert np.abs(pooled.numpy() - expected).max() > 0.01  # unequal sizes: they differ


def test_joint_model_pools_and_averages_as_the_paper_with_one_learner():
    """With one learner ``P(y | x)`` cancels from the joint responsibilities, so one round
    of the joint model's Gaussians is Algorithm 2's; the global joint weights are the mean
    of the clients' ``pi_c`` (footnote 3)."""
    clients = federation(sizes=(20, 50, 30))
    init, covs = start("full")
    gammas, _, means, expected = paper_round(clients, covs, "full")
    data = [(torch.as_tensor(X), torch.as_tensor((X[:, 0] > 1).astype(np.int64))) for X in clients]
    algorithm = JointFedGMM(
        2,
        n_learners=1,
        n_classes=2,
        max_iter=1,
        covariance_pooling="paper",
        global_weights="client_average",
        **init,
    )
    state = run_simulation(algorithm, data, privacy=NO_FLOOR).state
    assert_close_scaled(state.params.means, means, rtol=1e-10)
    assert_close_scaled(state.params.covariances, expected, rtol=1e-10)
    client_pi = gammas / gammas.sum(1, keepdims=True)
    assert_close_scaled(state.params.weights, client_pi.mean(0), rtol=1e-10)
    log_pi = global_log_joint_weights(state)
    assert_close_scaled(log_pi.exp().reshape(-1), client_pi.mean(0), rtol=1e-10)


def test_defaults_are_the_exact_pooled_m_step():
    config = EMConfig(n_components=2)
    assert (config.covariance_pooling, config.global_weights) == ("exact", "pooled")
    clients = federation()
    _, covs = start("full")
    rows = np.concatenate(clients)
    q = responsibilities(rows, WEIGHTS, covs)
    n = q.sum(0)
    means = q.T @ rows / n[:, None]
    cov = np.stack([(q[:, k, None] * (rows - means[k])).T @ (rows - means[k]) for k in range(2)])
    state = run_one_round(clients, "full", mixture_weights="personal")
    assert_close_scaled(state.params.covariances, cov / n[:, None, None] + REG * np.eye(3), 1e-10)
    assert state.global_weights == "pooled"


@pytest.mark.parametrize(
    ("settings", "names"),
    [
        ({"covariance_pooling": "paper", "dp_mode": "distributed"}, "sensitivity bound"),
        ({"covariance_pooling": "paper", "dp_mode": "central"}, "secure sum"),
        ({"covariance_pooling": "paper", "aggregation": "trimmed"}, "aggregation='sum'"),
        ({"covariance_pooling": "paper", "acceleration": "squarem"}, "acceleration='none'"),
        ({"global_weights": "client_average", "mixture_weights": "global"}, "personal"),
        (
            {
                "global_weights": "client_average",
                "mixture_weights": "personal",
                "dp_mode": "central",
            },
            "central",
        ),
        ({"covariance_pooling": "papers"}, "covariance_pooling"),
        ({"global_weights": "mean"}, "global_weights"),
    ],
)
def test_unsound_combinations_are_refused(settings, names):
    with pytest.raises(ValueError, match=names):
        EMConfig(n_components=2, **settings)


def test_secure_sums_refuse_the_paper_pooling():
    init, _ = start("full")
    algorithm = FederatedEM(2, covariance_pooling="paper", max_iter=1, **init)
    clients = [torch.as_tensor(X) for X in federation()]
    with pytest.raises(ValueError, match="dp_mode"):
        run_simulation(algorithm, clients, privacy=NO_FLOOR, secure_sum=True)


def test_detectors_pass_both_settings_through():
    clients = federation(sizes=(30, 80, 40))
    X = np.concatenate(clients)
    groups = np.repeat([0, 1, 2], [30, 80, 40])
    det = FedGMMDetector(
        2,
        covariance_pooling="paper",
        global_weights="client_average",
        max_iter=200,
        tol=1e-4,
        random_state=0,
        privacy=Privacy(min_rows=1),
    ).fit(X, groups=groups)
    assert_close_scaled(det.weights_, det.client_weights_.mean(0), rtol=1e-10)
    default = FedGMMDetector(2).get_params()
    assert (default["covariance_pooling"], default["global_weights"]) == ("exact", "pooled")


def test_joint_detector_scores_with_the_client_average_after_a_reload(tmp_path):
    clients = federation(sizes=(30, 80, 40))
    X = np.concatenate(clients)
    y = (X[:, 0] > 1).astype(int)
    groups = np.repeat([0, 1, 2], [30, 80, 40])
    det = JointFedGMMDetector(
        2, n_learners=2, global_weights="client_average", max_iter=3, random_state=0
    ).fit(X, y, groups)
    pi = det.client_joint_weights_.mean(0).sum(1)
    dens = np.stack(
        [
            multivariate_normal(m, c).pdf(X[:5])
            for m, c in zip(det.means_, det.covariances_, strict=True)
        ],
        1,
    )
    assert_close_scaled(det.log_px(X[:5]), np.log(dens @ pi), rtol=1e-8)
    path = tmp_path / "joint.fnd"
    det.save(path)
    again = JointFedGMMDetector.load(path)
    assert_close_scaled(again.log_px(X[:5]), det.log_px(X[:5]), rtol=1e-12)
