"""FedEnsemble: each member is FedGenGMM's round on its columns, the moments round gives
the pooled training scores' mean and standard deviation, the reply is held to the floor."""

import numpy as np
import pytest
import torch

from fednovelty.federated.core.base import ClientContext, Message
from fednovelty.federated.core.declarations import InvalidReplyError
from fednovelty.federated.mixtures.ensemble import (
    MOMENTS_REPLY,
    EnsembleConfig,
    FedEnsemble,
    check_moments,
    feature_subsets,
    member_scores,
    member_seed,
    subset_sizes,
)
from fednovelty.federated.mixtures.fedgengmm import FedGenGMM
from fednovelty.federated.trust.privacy import PrivacyPolicy
from fednovelty.runtime import run_simulation

SETTINGS = {"n_components": 2, "max_iter": 20, "samples_per_component": 30}


def clients(seed: int = 0, sizes=(60, 50, 40)) -> list[torch.Tensor]:
    rng = np.random.default_rng(seed)
    out = []
    for c, n in enumerate(sizes):
        rows = rng.normal(size=(n, 5)) * [1.0, 2.0, 0.5, 1.0, 3.0] + c
        out.append(torch.as_tensor(rows))
    return out


def test_subsets_are_public_plan_of_the_declared_widths():
    assert subset_sizes(10, (0.5, 1.0)) == (5, 9)
    assert subset_sizes(3, (0.5, 1.0)) == (2, 2)
    assert subset_sizes(7, (1.0, 1.0)) == (7, 7)
    first = feature_subsets(10, 20, (0.5, 1.0), 3)
    assert first == feature_subsets(10, 20, (0.5, 1.0), 3)  # seed alone decides
    assert first != feature_subsets(10, 20, (0.5, 1.0), 4)
    assert first[0] == list(range(10))  # member 0: every column
    for columns in first[1:]:
        assert 5 <= len(columns) <= 9 and columns == sorted(set(columns))
    assert feature_subsets(4, 2, (1.0, 1.0), 0) == [[0, 1, 2, 3]] * 2


def test_each_member_is_fedgengmm_on_its_columns():
    parts = clients()
    algorithm = FedEnsemble(**SETTINGS, n_features=5, n_members=3, random_state=11)
    state = run_simulation(algorithm, parts, random_state=0).state
    assert state.rounds == 4 and len(state.members) == 3
    for m, columns in enumerate(algorithm.subsets()):
        alone = FedGenGMM(**SETTINGS, random_state=member_seed(11, m))
        sliced = [X[:, columns] for X in parts]
        reference = run_simulation(alone, sliced, random_state=0).state.params
        got = state.members[m].params
        for name, value in reference.tensors().items():
            torch.testing.assert_close(got.tensors()[name], value, rtol=1e-10, atol=0)


def test_the_moments_round_gives_the_pooled_training_scores_moments():
    parts = clients(1)
    algorithm = FedEnsemble(**SETTINGS, n_features=5, n_members=4, random_state=2)
    state = run_simulation(algorithm, parts, random_state=0).state
    params = [member.params for member in state.members]
    pooled = member_scores(params, algorithm.subsets(), torch.cat(parts)).numpy()
    np.testing.assert_allclose(state.score_mean.numpy(), pooled.mean(1), rtol=1e-10)
    np.testing.assert_allclose(state.score_std.numpy(), pooled.std(1), rtol=1e-8)
    assert state.n_rows == 150


def test_a_client_below_the_floor_sends_no_moments():
    parts = clients(2, sizes=(60, 50, 4))
    algorithm = FedEnsemble(**SETTINGS, n_features=5, n_members=2, random_state=0)
    result = run_simulation(algorithm, parts, random_state=0, privacy=PrivacyPolicy(min_rows=5))
    assert result.state.n_rows == 110
    moments = next(r for r in result.history if r.kind == "score_moments")
    assert "privacy floor" in dict(moments.skipped)[2]


def test_the_moments_reply_is_declared_and_checked():
    broadcast = Message("score_moments", expect={"n_members": 2})
    assert MOMENTS_REPLY.shapes(broadcast, 5) == {
        "n_samples": (),
        "score_sums": (2,),
        "score_squares": (2,),
    }
    good = Message(
        "score_moments",
        {
            "n_samples": torch.tensor(2.0),
            "score_sums": torch.tensor([2.0, -3.0]),
            "score_squares": torch.tensor([2.0, 5.0]),
        },
    )
    check_moments(good, broadcast)
    bad = Message("score_moments", {**good.tensors, "score_squares": torch.tensor([1.0, 5.0])})
    with pytest.raises(InvalidReplyError, match="score_squares"):
        check_moments(bad, broadcast)


def test_the_client_half_reads_its_columns_from_its_own_settings():
    algorithm = FedEnsemble(**SETTINGS, n_features=5, n_members=2, random_state=5)
    step = algorithm.steps[0]
    X = torch.arange(15.0, dtype=torch.float64).reshape(3, 5)
    message = Message("local_fit", scalars={"seed": 1, "member": 1})
    rows = step.rows(X, message, ClientContext(0))
    torch.testing.assert_close(rows, X[:, algorithm.subsets()[1]])


@pytest.mark.parametrize(
    ("settings", "named"),
    [
        ({"n_members": 0}, "n_members"),
        ({"n_features": 0}, "n_features"),
        ({"feature_fraction": (0.0, 1.0)}, "feature_fraction"),
        ({"feature_fraction": (0.8, 0.5)}, "feature_fraction"),
        ({"feature_fraction": (0.5, 1.5)}, "feature_fraction"),
        ({"feature_fraction": "half"}, "feature_fraction"),
        ({"combine": "max"}, "combine"),
    ],
)
def test_bad_settings_are_refused_by_name(settings, named):
    with pytest.raises(ValueError, match=named):
        EnsembleConfig(**{"n_features": 5, **settings})
