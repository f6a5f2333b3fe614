"""pFedEM with ``gaussian_features="backbone"``: the Gaussians model sub-model 0's hidden
features, one round against Eq. 8-14 on features computed by hand, the declared width, the
initialisation's rows, and what the setting refuses."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from _tolerance import assert_close_scaled

from fednovelty.federated import PFedEM, PrivacyPolicy
from fednovelty.federated.core.aggregate import learner_name
from fednovelty.federated.core.base import Message
from fednovelty.federated.core.learners import cnn_learner, mlp_learner
from fednovelty.federated.joint_models.pfedem import PFEDEM_KIND, paper_gaussians
from fednovelty.federated.joint_models.pfedem_backbone import backbone_width
from fednovelty.mixture import log_gaussian_prob
from fednovelty.runtime import run_simulation

NO_FLOOR = PrivacyPolicy(min_rows=1)
BACKBONE = {
    "learner_factory": "mlp",
    "n_learner_features": 2,
    "gaussian_features": "backbone",
    "random_state": 0,
}


def clients(seed: int = 0, n_clients: int = 3, n: int = 120):
    """Two 2-D populations with opposite labelling rules, mixed in each client's share."""
    rng = np.random.default_rng(seed)
    out = []
    for share in np.linspace(0.2, 0.8, n_clients):
        a = rng.random(n) < share
        X = np.where(a[:, None], [-4.0, 0.0], [4.0, 0.0]) + rng.normal(size=(n, 2))
        y = np.where(a, X[:, 1] > 0, X[:, 1] < 0).astype(np.int64)
        out.append((torch.tensor(X), torch.tensor(y)))
    return out


def hidden(params: dict[str, torch.Tensor], X: torch.Tensor) -> torch.Tensor:
    """The mlp's hidden layer by hand: relu(X W^T + b), (n, 64)."""
    return torch.relu(X @ params["0.weight"].T + params["0.bias"])


def test_one_round_is_eq_8_to_14_on_the_broadcast_backbones_features():
    data = clients(0)
    probe = PFedEM(2, 2, **BACKBONE)
    start = probe._initial_learners(2)  # what the server broadcasts in round 1
    features = [hidden(start[0], X) for X, _ in data]
    pooled = torch.cat(features)
    means0 = torch.stack([pooled[:60].mean(0), pooled[-60:].mean(0)])
    variances0 = pooled.var(0).expand(2, -1) + 0.1
    algorithm = PFedEM(
        2,
        2,
        max_iter=1,
        tol=0.0,
        weights_init=[0.5, 0.5],
        means_init=means0,
        precisions_init=1 / variances0,
        **BACKBONE,
    )
    result = run_simulation(algorithm, data, privacy=NO_FLOOR)
    hard, mus, variances = [], [], []
    for Z in features:
        log_n = log_gaussian_prob(Z, means0, variances0.rsqrt(), "diag") + np.log(0.5)
        gamma = torch.softmax(log_n, dim=1)  # Eq. 8 on z = f(x)
        mu = gamma.T @ Z / gamma.sum(0).unsqueeze(1)
        hard.append(torch.bincount(gamma.argmax(1), minlength=2).double())
        mus.append(mu)
        variances.append(gamma.T @ Z.square() / gamma.sum(0).unsqueeze(1) - mu.square())
    assert 0 < float(torch.stack(hard)[:, 0].sum()) < pooled.shape[0]  # both partitions used
    expected = paper_gaussians(torch.stack(hard), torch.stack(mus), torch.stack(variances), 1e-6)
    got = result.state.params
    assert got.means.shape == (2, 64)
    for name, tensor in expected.tensors().items():
        assert_close_scaled(got.tensors()[name], tensor, rtol=1e-9, err_msg=name)


def test_the_broadcast_declares_the_backbones_width_and_init_sees_its_features():
    algorithm = PFedEM(2, 2, max_iter=2, tol=0.0, **BACKBONE)
    state = algorithm.start()  # federated k-means' first round
    assert algorithm.configure(state).expect["n_features"] == 64
    X, y = clients(1)[0]
    start = algorithm._initial_learners(2)[0]
    rows, (labels, Z) = algorithm.split_data((X, y))
    assert_close_scaled(rows, hidden(start, X), rtol=1e-12)
    assert Z is X and labels is y
    # the EM rounds' rows: Z through the broadcast sub-model 0 (here another draw than the start)
    moved = PFedEM(2, 2, **{**BACKBONE, "random_state": 5})._initial_learners(2)
    tensors = {learner_name(m, k): v for m, p in enumerate(moved) for k, v in p.items()}
    step = algorithm.steps[-1]
    rows = step.gaussian_rows(X, X, Message(PFEDEM_KIND, tensors))
    assert_close_scaled(rows, hidden(moved[0], X), rtol=1e-12)
    assert not torch.allclose(rows, hidden(start, X))
    # a whole run (k-means on the features, then EM) passes the reply validator at that width
    result = run_simulation(algorithm, clients(1))
    assert result.state.params.means.shape == (2, 64)
    inputs = PFedEM(2, 2, max_iter=2, tol=0.0, learner_factory="mlp", random_state=0)
    assert "n_features" not in inputs.configure(inputs.start()).expect
    assert inputs.split_data((X, y))[0] is X


def test_backbone_widths():
    assert backbone_width(mlp_learner(5, 3)) == 64
    assert backbone_width(cnn_learner(64, 3)) == 128


@pytest.mark.parametrize(
    ("settings", "match"),
    [
        ({"learner_factory": "linear"}, "pick learner='mlp' or 'cnn'"),
        ({"n_learner_features": None}, "needs n_learner_features"),
        ({"pca_components": 1}, "pca_components=None"),
        ({"bounds": ([-8.0, -4.0], [8.0, 4.0])}, "no public box|have none"),
        (
            {
                "bounds": ([-8.0, -4.0], [8.0, 4.0]),
                "dp_mode": "local",
                "gaussian_aggregation": "exact",
            },
            "backbone features have none",
        ),
    ],
)
def test_what_backbone_features_refuse(settings, match):
    with pytest.raises(ValueError, match=match):
        PFedEM(2, 2, **{**BACKBONE, **settings})
